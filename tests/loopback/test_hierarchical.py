"""The hierarchical all-reduce on loopback TCP: the grouping, averages against a numpy
reference for uneven groups, one group and a group of one, stages that overlap, and
failures that end every worker with an error naming the culprit. Workers run as threads,
except a worker that dies, which is a real process (tests/loopback_jobs.py's spawn_job)."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from schedulers import registry
from schedulers.collective.hierarchical import Hierarchical, HierarchicalParams, groups
from schedulers.core.base import CommError, Endpoint, RoleContext, TensorSpec
from schedulers.transport.connection import Connection
from tests.loopback_jobs import drive, gradient, spawn_job, tensor_set
from workloads.local import free_ports

SMALL = {"bucket_mb": 0.05, "first_bucket_mb": 0.01, "chunk_kb": 16}  # many buckets and chunks
DEATH_BOUND_S = 10  # every survivor must have failed this long after a death


def switches(hosts: list[str], switch_of: list[str], uplink_mbps: float = 100.0) -> dict:
    """Capacity graph (node-link data): host i on switch switch_of[i] at 1 Gb/s, every such
    switch on a core switch. Hosts may repeat (workers sharing a host)."""
    tors = sorted(set(switch_of))
    nodes = [{"id": h, "kind": "host"} for h in dict.fromkeys(hosts)]
    nodes += [{"id": s, "kind": "switch"} for s in [*tors, "core"]]
    links = []
    for h, s in dict(zip(hosts, switch_of)).items():
        links += [{"source": h, "target": s, "capacity": 1e9}, {"source": s, "target": h, "capacity": 1e9}]
    for s in tors:
        links += [{"source": s, "target": "core", "capacity": uplink_mbps * 1e6},
                  {"source": "core", "target": s, "capacity": uplink_mbps * 1e6}]
    return {"directed": True, "multigraph": False, "graph": {}, "nodes": nodes, "links": links}


def endpoints(n: int, hosts: list[str] | None = None) -> list[Endpoint]:
    hosts = hosts or [f"w{r}" for r in range(n)]
    return [Endpoint(h, "127.0.0.1", p) for h, p in zip(hosts, free_ports(n))]


def specs(*numels: int) -> list[TensorSpec]:
    return [TensorSpec(key=k, name=f"t{k}", numel=n, priority=k) for k, n in enumerate(numels)]


def run_threads(work, ranks, join_s: float = 60.0) -> None:
    threads = [threading.Thread(target=work, args=(r,), daemon=True) for r in ranks]
    for t in threads:
        t.start()
    for t in threads:
        t.join(join_s)
        assert not t.is_alive(), "a worker hung"


def allreduce(switch_of: list[str] | None, params: dict, sizes: list[int], iterations: int = 3, seed: int = 0,
              hosts: list[str] | None = None) -> None:
    """A job of one worker per host in `hosts` (default: one host per entry of switch_of, the
    switch each hangs off; switch_of None: no capacity graph). Every worker's averages must
    equal the float64 reference and be bit-identical."""
    n = len(hosts or switch_of)
    eps = endpoints(n, hosts)
    topology = None if switch_of is None else switches([e.host for e in eps], switch_of)
    results, errors = {}, []

    def work(rank):
        try:
            ctx = RoleContext(rank, n, [], eps, topology=topology, connect_timeout_s=20)
            results[rank] = drive("hierarchical", params, ctx, sizes, iterations, seed)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    run_threads(work, range(n))
    assert not errors, errors
    for it in range(iterations):
        for key, numel in enumerate(sizes):
            ref = np.mean([gradient(seed, it, r, key, numel).astype(np.float64) for r in range(n)], axis=0)
            np.testing.assert_allclose(results[0][it][key], ref, rtol=1e-5, atol=1e-6,
                                       err_msg=f"iteration {it}, key {key} ({numel} elements)")
            for r in range(1, n):  # replicas must stay bit-identical
                assert np.array_equal(results[r][it][key], results[0][it][key]), (r, it, key)


# ---------------------------------------------------------------------------- grouping
def test_groups_by_switch_leader_first_in_rank_order():
    hosts = [f"w{r}" for r in range(5)]
    assert groups(switches(hosts, ["s1", "s2", "s1", "s1", "s2"]), hosts) == [[0, 2, 3], [1, 4]]
    assert groups(switches(hosts, ["s2", "s1", "s1", "s3", "s3"]), hosts) == [[0], [1, 2], [3, 4]]
    assert groups(switches(hosts, ["s1"] * 5), hosts) == [[0, 1, 2, 3, 4]]
    assert groups(None, hosts) == [[0, 1, 2, 3, 4]]
    assert groups(None, ["lo"]) == [[0]]


def test_groups_keep_workers_of_one_host_together():
    hosts = ["a", "b", "a", "c", "b"]
    assert groups(switches(hosts, ["s1", "s2", "s1", "s1", "s2"]), hosts) == [[0, 2, 3], [1, 4]]
    assert groups(switches(hosts, ["s1", "s1", "s1", "s2", "s1"]), hosts) == [[0, 1, 2, 4], [3]]


def test_groups_of_hosts_off_no_switch_and_unknown_hosts():
    topo = switches(["a", "b"], ["s1", "s1"])
    topo["nodes"].append({"id": "x", "kind": "host"})  # linked to a host only: a group of its own
    topo["links"] += [{"source": "x", "target": "a", "capacity": 1e9}, {"source": "a", "target": "x", "capacity": 1e9}]
    assert groups(topo, ["x", "a", "b", "x"]) == [[0, 3], [1, 2]]
    with pytest.raises(ValueError, match="worker 1's host 'nope' is not in the capacity graph"):
        groups(topo, ["a", "nope"])


def test_registered_and_needs_no_servers():
    cls = registry.SCHEDULERS["hierarchical"]
    assert cls is Hierarchical and cls.Params.requires_servers is False
    p = cls.Params()
    assert (p.bucket_mb, p.first_bucket_mb, p.chunk_kb, p.segment_chunks) == (25.0, 1.0, 256, 8)


# ---------------------------------------------------------------------------- averages
@pytest.mark.parametrize("switch_of", [
    ["s1", "s2", "s1", "s1", "s2"],           # groups [0, 2, 3] and [1, 4]: uneven, interleaved ranks
    ["s1", "s1", "s1", "s1"],                 # one group: reduce to worker 0, broadcast
    ["s1", "s2", "s2", "s2"],                 # a leader alone in its group
    ["s2", "s1", "s1", "s3", "s3", "s1"],     # three leaders' ring, groups of 1, 3 and 2
    ["s1", "s2"],                             # two groups of one: a ring of two
], ids=["3+2", "one-group", "group-of-one", "1+3+2", "1+1"])
def test_average_equals_reference(switch_of):
    allreduce(switch_of, SMALL, tensor_set(len(switch_of), big=50_000), seed=len(switch_of))


@pytest.mark.slow
def test_default_params_and_a_tensor_larger_than_a_bucket():
    allreduce(["s1", "s2", "s1", "s1", "s2"], {}, [3, 7_000_003, 999_999, 1], iterations=2, seed=1)


def test_workers_sharing_hosts_and_no_graph():
    allreduce(["s1", "s2", "s1", "s2"], SMALL, tensor_set(4), hosts=["a", "b", "a", "b"], seed=2)
    allreduce(None, SMALL, tensor_set(5), hosts=["lo"] * 3, seed=3)


def test_buckets_smaller_than_the_ring_and_one_float_chunks():
    """Fewer elements than leaders (empty segments), and the smallest chunks possible."""
    allreduce(["s1", "s2", "s3", "s1"], {"bucket_mb": 1e-6, "first_bucket_mb": 1e-6}, [1, 2, 3, 6], iterations=2)
    allreduce(["s1", "s2", "s1"], {"bucket_mb": 1e-4, "first_bucket_mb": 1e-5, "chunk_kb": 1},
              [300, 1, 777, 256, 1025], iterations=3)


def test_one_worker_and_misuse():
    """Waiting before pushing, pushing twice, or mixing iterations in a bucket is an error,
    not a hang or a wrong average."""
    s = Hierarchical(RoleContext(0, 1, [], endpoints(1)), HierarchicalParams())
    s.start(specs(4, 2))  # one bucket
    with pytest.raises(ValueError):
        s.wait(0, 0)
    s.push(0, np.arange(4, dtype=np.float32), 0)
    with pytest.raises(ValueError):
        s.push(0, np.zeros(4, np.float32), 0)
    with pytest.raises(ValueError):
        s.push(0, np.zeros(4, np.float32), 1)  # key 1 of iteration 0 is still missing
    s.push(1, np.ones(2, np.float32), 0)
    assert s.wait(0, 0).tolist() == [0, 1, 2, 3]
    s.close()


def test_traces_buckets_and_reports_its_groups():
    eps = endpoints(3)
    topology = switches([e.host for e in eps], ["s1", "s2", "s1"])
    out = {}

    def work(r):
        s = Hierarchical(RoleContext(r, 3, [], eps, topology=topology, connect_timeout_s=10, trace=True),
                         HierarchicalParams(bucket_mb=1e-5, first_bucket_mb=1e-5))
        s.start(specs(3, 5))
        for it in range(2):
            s.push(1, np.ones(5, np.float32), it)
            s.push(0, np.ones(3, np.float32), it)
            s.wait(0, it), s.wait(1, it)
        s.close()
        out[r] = (s.events, s.info())

    run_threads(work, range(3), join_s=20)
    for r in range(3):
        events, info = out[r]
        assert {(what, key, it) for what, key, _, it, _ in events} == \
            {(w, k, it) for w in ("send", "recv") for k in (0, 1) for it in (0, 1)}
        assert info["groups"] == [[0, 2], [1]] and info["bucket_numel"] == [5, 3]


# ---------------------------------------------------------------------------- overlap
@pytest.mark.parametrize("switch_of", [["s1", "s2", "s1", "s2"], ["s1", "s2", "s3", "s1", "s2", "s3"]],
                         ids=["2x2", "3x2"])
@pytest.mark.slow
def test_stages_overlap_on_emulated_links(monkeypatch, switch_of):
    """Every connection is made a link of RATE bytes/s (a sender is busy for a frame's
    serialisation time after writing it). Each member connection carries G each way and
    each hop of the leaders' ring 2(L-1)/L G, all on separate connections, so with the
    three stages pipelined an iteration takes about max(1, 2(L-1)/L) G / RATE; stages one
    after another would take (2 + 2(L-1)/L) G / RATE, and a member that sent the segments
    one after another (1 + (L-1)/L) G / RATE."""
    rate, n, numel = 40e6, len(switch_of), 2_000_000
    leaders = len(set(switch_of))
    write = Connection._send_frame

    def shaped(self, head, body):
        write(self, head, body)
        now = time.monotonic()
        self.free_at = max(getattr(self, "free_at", now), now) + (len(head) + len(body)) / rate
        time.sleep(max(0.0, self.free_at - now))

    monkeypatch.setattr(Connection, "_send_frame", shaped)
    eps = endpoints(n)
    topology = switches([e.host for e in eps], switch_of)
    times: dict[int, list[float]] = {}

    def work(r):
        s = Hierarchical(RoleContext(r, n, [], eps, topology=topology, connect_timeout_s=10), HierarchicalParams())
        s.start(specs(numel))
        g = np.ones(numel, np.float32)
        times[r] = []
        for it in range(3):
            t0 = time.monotonic()
            s.push(0, g, it)
            s.wait(0, it)
            times[r].append(time.monotonic() - t0)
        s.close()

    run_threads(work, range(n), join_s=30)
    ideal = max(1, 2 * (leaders - 1) / leaders) * 4 * numel / rate
    best = min(max(times[r][it] for r in range(n)) for it in (1, 2))  # iteration 0 warms up
    assert 0.9 * ideal <= best < 1.25 * ideal, (best, ideal)


# ---------------------------------------------------------------------------- failures
TWO_GROUPS = ["s1", "s2", "s1", "s2", "s1"]  # groups [0, 2, 4] and [1, 3]


def _survivors(params, eps, topology, ranks, sizes, iterations, results, connect_timeout_s=20):
    """Run `ranks` as threads; results[rank] = (error text or None, seconds until it came)."""
    def work(r):
        t0 = time.monotonic()
        ctx = RoleContext(r, len(eps), [], eps, topology=topology, connect_timeout_s=connect_timeout_s)
        try:
            drive("hierarchical", params, ctx, sizes, iterations, seed=0)
            results[r] = (None, time.monotonic() - t0)
        except CommError as e:
            results[r] = (str(e), time.monotonic() - t0)

    threads = [threading.Thread(target=work, args=(r,), daemon=True) for r in ranks]
    for t in threads:
        t.start()
    return threads


@pytest.mark.slow
@pytest.mark.parametrize("dead,stop_after", [(3, 0), (3, 3), (1, 3), (0, 0)],
                         ids=["member-dies-idle", "member-dies-mid-backward", "leader-dies", "worker0-dies"])
def test_worker_death_names_it_everywhere(dead, stop_after, procs):
    """A worker (a member, a leader, or the first leader) dies during iteration 1, before
    pushing anything or halfway through: its process exits without a word. Every other
    worker, in both groups, fails promptly with an error naming it."""
    eps = endpoints(5)
    topology = switches([e.host for e in eps], TWO_GROUPS)
    sizes = [1000, 50_000, 7, 200_001, 30]
    params = {"bucket_mb": 0.1, "first_bucket_mb": 0.01, "chunk_kb": 16}
    spec = {"name": "hierarchical", "params": params, "rank": dead, "servers": [],
            "workers": [vars(e) for e in eps], "topology": topology, "sizes": sizes, "iterations": 2, "seed": 0,
            "stop_after": stop_after}
    proc = procs.add(spawn_job(spec))
    results: dict = {}
    survivors = [r for r in range(5) if r != dead]
    threads = _survivors(params, eps, topology, survivors, sizes, 2, results)
    proc.wait(20)
    died_at = time.monotonic()
    for t in threads:
        t.join(DEATH_BOUND_S)
        assert not t.is_alive(), "a survivor hung"
    assert time.monotonic() - died_at < DEATH_BOUND_S
    for r in survivors:
        err, _ = results[r]
        assert err is not None and f"worker {dead} (w{dead} 127.0.0.1" in err, (r, err)


def test_the_error_reaches_the_caller_once_the_aborts_are_out(monkeypatch):
    """Worker 2 of one group vanishes without a word. Each survivor's error must come only
    after it has sent its ABORTs: a process that exits on the error would otherwise close its
    connections unannounced, and a peer would see a reset or a bare close and name it, not
    worker 2. The telling is slowed here, as a starved CPU slows a receive thread."""
    aborted: dict[int, float] = {}
    real = Hierarchical._abort

    def slow_abort(self, reason):
        time.sleep(0.3)
        real(self, reason)
        aborted[self.rank] = time.monotonic()

    monkeypatch.setattr(Hierarchical, "_abort", slow_abort)
    eps = endpoints(3)
    tensors = specs(10, 20)
    failed: dict[int, tuple[float, str]] = {}

    def work(r):
        s = Hierarchical(RoleContext(r, 3, [], eps, connect_timeout_s=20), HierarchicalParams())
        s.start(tensors)
        if r == 2:
            for conn in s._conns:   # a crash: no BYE, no ABORT
                conn.close()
            return
        try:
            for t in tensors:
                s.push(t.key, np.ones(t.numel, np.float32), 0)
            s.wait(0, 0)
        except CommError as e:
            failed[r] = (time.monotonic(), str(e))

    run_threads(work, range(3), join_s=DEATH_BOUND_S)
    for r in (0, 1):
        at, err = failed[r]
        assert "worker 2 (w2 127.0.0.1" in err, (r, err)
        assert r in aborted and at >= aborted[r], (r, "the error came before the ABORTs were out")


@pytest.mark.parametrize("leaver", [3, 1], ids=["member", "leader"])
def test_early_close_is_a_failure_named_after_the_leaver(leaver):
    """A worker that closes with an iteration half pushed tells the others (ABORT)."""
    eps = endpoints(5)
    topology = switches([e.host for e in eps], TWO_GROUPS)
    results: dict = {}
    survivors = [r for r in range(5) if r != leaver]
    threads = _survivors({}, eps, topology, survivors, [10, 20, 30], 2, results)
    s = Hierarchical(RoleContext(leaver, 5, [], eps, topology=topology, connect_timeout_s=20), HierarchicalParams())
    s.start(specs(10, 20, 30))
    s.push(2, np.ones(30, np.float32), 0)
    s.close()
    for t in threads:
        t.join(DEATH_BOUND_S)
        assert not t.is_alive(), "a survivor hung"
    for r in survivors:
        err = results[r][0]
        assert err and f"worker {leaver} (w{leaver}" in err and "unfinished" in err, (r, err)


@pytest.mark.parametrize("missing", [4, 1], ids=["member", "leader"])
@pytest.mark.slow
def test_missing_worker_fails_rendezvous_in_time(missing):
    """A worker never starts: whoever waits for it finds out, and tells the others."""
    eps = endpoints(5)
    topology = switches([e.host for e in eps], TWO_GROUPS)
    results: dict = {}
    survivors = [r for r in range(5) if r != missing]
    threads = _survivors({}, eps, topology, survivors, [10], 1, results, connect_timeout_s=1.5)
    for t in threads:
        t.join(DEATH_BOUND_S)
        assert not t.is_alive()
    for r in survivors:
        err, took = results[r]
        assert err and f"worker {missing} (w{missing}" in err and took < 5, (r, err, took)
