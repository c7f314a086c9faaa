"""The collective family (`ring`, `gloo`): bucketing, ring geometry, edge cases, and what
happens when a worker dies or leaves early. Averages in general: test_schedulers_loopback."""
from __future__ import annotations

import re
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from schedulers import registry
from schedulers.collective.buckets import MiB, assign_buckets
from schedulers.collective.ring import Ring, RingParams, ring_chunks
from schedulers.core.base import CommError, Endpoint, RoleContext, TensorSpec
from schedulers.transport.connection import Connection
from tests.conftest import REPO
from tests.factories import star_links
from tests.loopback_jobs import POOL, drive, gradient, run_job, spawn_job, tensor_set
from workloads.local import free_ports

DEATH_BOUND_S = 10  # every survivor must have failed this long after a death


def specs(*numels: int) -> list[TensorSpec]:
    return [TensorSpec(key=k, name=f"t{k}", numel=n, priority=k) for k, n in enumerate(numels)]


def endpoints(n: int) -> list[Endpoint]:
    return [Endpoint(f"w{r}", "127.0.0.1", p) for r, p in enumerate(free_ports(n))]


# ---------------------------------------------------------------------------- pure parts
def test_registry_import_does_not_load_torch():
    code = ("import sys, schedulers.registry as r; assert {'ring', 'gloo'} <= set(r.SCHEDULERS); "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("name", ["ring", "gloo"])
def test_collectives_need_no_servers(name):
    params = registry.SCHEDULERS[name].Params
    assert params.requires_servers is False
    assert params().bucket_mb == 25.0  # DDP's default bucket


def test_buckets_follow_ddp_rule():
    """Backward order (highest key first); first bucket capped lower; an oversized tensor
    closes its bucket; every key exactly once, at contiguous offsets."""
    floats = MiB // 4
    tensors = specs(10, floats, 3 * floats, 20, floats // 2, floats // 2, 7)
    buckets = assign_buckets(tensors, cap_bytes=2 * MiB, first_cap_bytes=MiB // 2)
    assert [b.keys for b in buckets] == [[6, 5], [4, 3, 2], [1, 0]]
    for b in buckets:
        off = 0
        for k in b.keys:
            assert b.offsets[k] == off
            assert b.span(k) == slice(off, off + tensors[k].numel)
            off += tensors[k].numel
        assert b.numel == off
    assert sorted(k for b in buckets for k in b.keys) == list(range(len(tensors)))


@pytest.mark.parametrize("numel,n,chunk", [(0, 3, 4), (2, 5, 4), (101, 3, 7), (4096, 8, 512), (10, 1, 3)])
def test_ring_chunks_tile_the_bucket(numel, n, chunk):
    chunks = ring_chunks(numel, n, chunk)
    covered = np.zeros(numel, int)
    for ch in chunks:
        assert 0 < ch.hi - ch.lo <= chunk
        assert ch.segment * numel // n <= ch.lo and ch.hi <= (ch.segment + 1) * numel // n
        covered[ch.lo:ch.hi] += 1
    assert (covered == 1).all()


# ---------------------------------------------------------------------------- edge cases
def test_ring_buckets_smaller_than_the_ring():
    """One tiny tensor per bucket, fewer elements than workers: empty segments."""
    run_job("ring", {"bucket_mb": 1e-6, "first_bucket_mb": 1e-6}, 5, 0, iterations=2, sizes=[1, 2, 3, 6])


def test_ring_one_chunk_per_float_pipeline():
    """The smallest chunks possible, many buckets in flight at once."""
    run_job("ring", {"bucket_mb": 1e-4, "first_bucket_mb": 1e-5, "chunk_kb": 1}, 3, 0, iterations=3,
            sizes=[300, 1, 777, 256, 1025])


def test_ring_traces_buckets():
    eps = endpoints(2)
    out = {}

    def work(r):
        ctx = RoleContext(r, 2, [], eps, connect_timeout_s=10, trace=True)
        s = Ring(ctx, RingParams(bucket_mb=1e-5, first_bucket_mb=1e-5))
        s.start(specs(3, 5))
        for it in range(2):
            s.push(1, np.ones(5, np.float32), it)
            s.push(0, np.ones(3, np.float32), it)
            s.wait(0, it), s.wait(1, it)
        s.close()
        out[r] = s.events

    ts = [threading.Thread(target=work, args=(r,)) for r in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(20)
    for r in range(2):
        kinds = {(what, key, it) for what, key, _, it, _ in out[r]}
        assert kinds == {(w, k, it) for w in ("send", "recv") for k in (0, 1) for it in (0, 1)}


def test_ring_rejects_misuse():
    """Waiting before pushing, pushing twice, or mixing iterations in a bucket is an error,
    not a hang or a wrong average."""
    s = Ring(RoleContext(0, 1, [], endpoints(1)), RingParams())
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


# ---------------------------------------------------------------------------- link rate
@pytest.mark.slow
def test_ring_keeps_emulated_links_busy(monkeypatch):
    """Every connection is made a link of RATE bytes/s (a sender is busy for a frame's
    serialisation time after writing it). A pipelined ring then all-reduces in about
    2(n-1)/n * bytes / RATE; a ring that let links idle between steps would not."""
    rate, n, numel = 40e6, 4, 2_000_000
    write = Connection._send_frame

    def shaped(self, head, body):
        write(self, head, body)
        now = time.monotonic()
        self.free_at = max(getattr(self, "free_at", now), now) + (len(head) + len(body)) / rate
        time.sleep(max(0.0, self.free_at - now))

    monkeypatch.setattr(Connection, "_send_frame", shaped)
    eps = endpoints(n)
    times: dict[int, list[float]] = {}

    def work(r):
        s = Ring(RoleContext(r, n, [], eps, connect_timeout_s=10), RingParams())
        s.start(specs(numel))
        g = np.ones(numel, np.float32)
        times[r] = []
        for it in range(3):
            t0 = time.monotonic()
            s.push(0, g, it)
            s.wait(0, it)
            times[r].append(time.monotonic() - t0)
        s.close()

    threads = [threading.Thread(target=work, args=(r,), daemon=True) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
        assert not t.is_alive()
    ideal = 2 * (n - 1) / n * 4 * numel / rate
    best = min(max(times[r][it] for r in range(n)) for it in (1, 2))  # iteration 0 warms up
    assert 0.9 * ideal <= best < 1.25 * ideal, (best, ideal)


# ---------------------------------------------------------------------------- failures
def _survivors(name, params, eps, ranks, sizes, iterations, results, connect_timeout_s=20):
    """Run `ranks` as threads; results[rank] = (error text or None, seconds until it came)."""
    def work(r):
        t0 = time.monotonic()
        ctx = RoleContext(r, len(eps), [], eps, topology=star_links({e.host: 1000 for e in eps}),
                          connect_timeout_s=connect_timeout_s)
        try:
            drive(name, params, ctx, sizes, iterations, seed=0)
            results[r] = (None, time.monotonic() - t0)
        except CommError as e:
            results[r] = (str(e), time.monotonic() - t0)

    threads = [threading.Thread(target=work, args=(r,), daemon=True) for r in ranks]
    for t in threads:
        t.start()
    return threads


def _spec(name, params, eps, rank, sizes, iterations, **kw):
    return {"name": name, "params": params, "rank": rank, "servers": [], "workers": [vars(e) for e in eps],
            "topology": star_links({e.host: 1000 for e in eps}), "sizes": sizes, "iterations": iterations, "seed": 0,
            **kw}


@pytest.mark.slow
@pytest.mark.parametrize("stop_after", [0, 3], ids=["dies-idle", "dies-mid-backward"])
def test_ring_worker_death_names_it_everywhere(stop_after, procs):
    """Worker 2 of 5 dies (its process exits without a word) during iteration 1, either
    before pushing anything (its neighbours are idle, waiting) or halfway through. Every
    other worker fails promptly with an error naming worker 2."""
    eps = endpoints(5)
    sizes = [1000, 50_000, 7, 200_001, 30]
    params = {"bucket_mb": 0.1, "first_bucket_mb": 0.01, "chunk_kb": 16}
    dead = procs.add(spawn_job(_spec("ring", params, eps, 2, sizes, 2, stop_after=stop_after)))
    results: dict = {}
    threads = _survivors("ring", params, eps, [0, 1, 3, 4], sizes, 2, results)
    dead.wait(20)
    died_at = time.monotonic()
    for t in threads:
        t.join(DEATH_BOUND_S)
        assert not t.is_alive(), "a survivor hung"
    assert time.monotonic() - died_at < DEATH_BOUND_S
    for r in (0, 1, 3, 4):
        err, _ = results[r]
        assert err is not None and "worker 2 (w2 127.0.0.1" in err, (r, err)


def test_ring_early_close_is_a_failure_named_after_the_leaver():
    """A worker that closes with an iteration half pushed tells the others (ABORT)."""
    eps = endpoints(4)
    results: dict = {}
    threads = _survivors("ring", {}, eps, [0, 1, 3], [10, 20, 30], 2, results)
    s = Ring(RoleContext(2, 4, [], eps, connect_timeout_s=20), RingParams())
    s.start(specs(10, 20, 30))
    s.push(2, np.ones(30, np.float32), 0)
    s.close()
    for t in threads:
        t.join(DEATH_BOUND_S)
        assert not t.is_alive(), "a survivor hung"
    for r in (0, 1, 3):
        assert results[r][0] and "worker 2 (w2" in results[r][0] and "unfinished" in results[r][0], results[r]


@pytest.mark.slow
def test_ring_missing_worker_fails_rendezvous_in_time():
    """Worker 2 of 5 never starts: its neighbours find out, and tell the others."""
    eps = endpoints(5)
    results: dict = {}
    threads = _survivors("ring", {}, eps, [0, 1, 3, 4], [10], 1, results, connect_timeout_s=1.5)
    for t in threads:
        t.join(DEATH_BOUND_S)
        assert not t.is_alive()
    for r in (0, 1, 3, 4):
        err, took = results[r]
        assert err and "worker 2 (w2" in err and took < 5, (r, err, took)


@pytest.mark.slow
def test_gloo_missing_worker_fails_rendezvous_in_time(tmp_path):
    eps = endpoints(3)
    t0 = time.monotonic()
    errors = POOL.run([_spec("gloo", {}, eps, r, [10], 1, out=str(tmp_path / f"{r}.npz"), connect_timeout_s=2)
                       for r in (0, 1)], timeout_s=30)
    assert time.monotonic() - t0 < 15
    for err in errors:
        assert err and err.startswith("CommError") and "worker 2 (w2" in err, err


@pytest.mark.parametrize("dead_rank", [0, 3], ids=["store-host-dies", "worker-dies"])
@pytest.mark.slow
def test_gloo_worker_death_ends_everyone(dead_rank, tmp_path, procs):
    """gloo: the survivors fail soon after the death (from the broken connections, not
    gloo's timeout), with a CommError (no hang, no SIGABRT) that names the dead worker,
    found by probing its port, and nobody else: not worker 0, whose store with the verdict
    in it outlives its own failure until the others have read it. Worker 3 dying made
    worker 0 blamed too in most tries before that."""
    eps = endpoints(4)
    sizes = [1000, 300_001, 7]
    timeout_s = 60
    dead = procs.add(spawn_job(_spec("gloo", {"timeout_s": timeout_s}, eps, dead_rank, sizes, 3, stop_after=1)))
    died: list[float] = []
    watcher = threading.Thread(target=lambda: (dead.wait(), died.append(time.monotonic())), daemon=True)
    watcher.start()
    survivors = [r for r in range(4) if r != dead_rank]
    errors = POOL.run([_spec("gloo", {"timeout_s": timeout_s}, eps, r, sizes, 3, out=str(tmp_path / f"{r}.npz"))
                       for r in survivors], timeout_s=2 * timeout_s)
    answered = time.monotonic()
    watcher.join(10)
    assert dead.returncode == 0  # it left through os._exit, as a crash would
    assert died and answered - died[0] < DEATH_BOUND_S, ("survivors waited for gloo's timeout", errors)
    for r, err in zip(survivors, errors, strict=False):  # errors stops at a hung worker
        assert err and err.startswith("CommError") and "Timed out" not in err, (r, err)
        assert set(re.findall(r"worker (\d+) \(w", err)) == {str(dead_rank)}, (r, err)


# ---------------------------------------------------------------------------- training
@pytest.mark.slow
def test_training_end_to_end_matches_parameter_server(tmp_path):
    """Real worker processes (workloads.worker) train the tiny CNN with each collective;
    every replica ends bit-identical, and, with two workers (where every scheme adds the
    same two numbers), identical to training through a FIFO parameter server. gloo's
    workers exit normally (no SIGABRT)."""
    from workloads.local import run_job as run_training

    workload = {"model": "cnn", "preset": "tiny", "iterations": 4, "batch_size": 8}
    checksums = {}
    for name in ("fifo", "ring", "gloo"):
        records = run_training(workload, tmp_path / name, workers=2, scheduler=name, timeout_s=120)
        sums = {r["summary"]["checksum"] for r in records}
        assert len(sums) == 1, (name, sums)
        checksums[name] = sums.pop()
    assert checksums["ring"] == checksums["gloo"] == checksums["fifo"], checksums


def test_ring_chunks_stream_each_segment():
    """A segment is cut into segment_chunks chunks (none under 16 KiB, none over chunk_kb), so a
    hop forwards a stream; large buckets keep chunk_kb."""
    from schedulers.collective.ring import MIN_CHUNK_NUMEL, RingParams, chunk_numel

    p = RingParams()
    small = chunk_numel(137_000, 4, p)  # the small CNN: 0.55 MB over 4 workers
    assert small == 4282  # ceil(ceil(137000 / 4) / 8)
    assert chunk_numel(25 * 2**18, 4, p) == 256 * 256  # a 25 MiB bucket: chunk_kb
    assert chunk_numel(1000, 4, p) == MIN_CHUNK_NUMEL  # tiny buckets: one 16 KiB chunk per segment
    assert chunk_numel(10**6, 2, RingParams(segment_chunks=1, chunk_kb=4096)) == 500_000


def two_racks(hosts: list[str], uplink_mbps: float = 100.0) -> dict:
    """Even hosts in rack s1, odd ones in s2, 1 Gb/s host links, racks joined by one uplink."""
    nodes = [{"id": h, "kind": "host"} for h in hosts] + [{"id": s, "kind": "switch"} for s in ("s1", "s2")]
    links = []
    for i, h in enumerate(hosts):
        sw = "s1" if i % 2 == 0 else "s2"
        links += [{"source": h, "target": sw, "capacity": 1e9}, {"source": sw, "target": h, "capacity": 1e9}]
    links += [{"source": "s1", "target": "s2", "capacity": uplink_mbps * 1e6},
              {"source": "s2", "target": "s1", "capacity": uplink_mbps * 1e6}]
    return {"directed": True, "multigraph": False, "graph": {}, "nodes": nodes, "links": links}


def test_topology_ring_order_crosses_the_uplink_once_each_way():
    """Ranks alternate between two racks: each of rank order's 6 hops crosses the uplink (3 each
    way), the searched order crosses it once each way, so its bottleneck rate is 3 times
    higher; on a star every order is alike and rank order is kept."""
    from schedulers.collective.ring import ring_order
    from schedulers.core.linkmodel import LinkModel

    hosts = [f"w{r}" for r in range(6)]
    order = ring_order(two_racks(hosts), hosts, "topology")
    model = LinkModel.from_graph(two_racks(hosts), hosts)
    assert sorted(order) == list(range(6)) and order[0] == 0
    assert model.ring_rate_of(order) == pytest.approx(3 * model.ring_rate_of(list(range(6))))
    assert ring_order(two_racks(hosts), hosts, "given") == list(range(6))
    assert ring_order(star_links({h: 1000 for h in hosts}), hosts, "topology") == list(range(6))


def test_topology_ordered_ring_averages_exactly():
    """The searched order changes who talks to whom; the averages stay the reference's."""

    eps = endpoints(6)
    topology = two_racks([e.host for e in eps])
    sizes = tensor_set(3, big=50_000)
    results, errors = {}, []

    def work(rank):
        try:
            ctx = RoleContext(rank, 6, [], eps, topology=topology, connect_timeout_s=20)
            results[rank] = drive("ring", {"order": "topology", "chunk_kb": 16}, ctx, sizes, 2, seed=3)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=work, args=(r,), daemon=True) for r in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    for it in range(2):
        for key, numel in enumerate(sizes):
            ref = np.mean([gradient(3, it, r, key, numel).astype(np.float64) for r in range(6)], axis=0)
            np.testing.assert_allclose(results[0][it][key], ref, rtol=1e-5, atol=1e-6)
            for r in range(1, 6):
                assert np.array_equal(results[r][it][key], results[0][it][key])
