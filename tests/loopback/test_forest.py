"""The forest scheduler on loopback TCP: averages equal a reference, failures end every
worker with an error naming the culprit, nothing hangs. Workers run as threads, except the
one killed with SIGKILL, which is a real process."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from schedulers import registry
from schedulers.collective.forest import (
    CHUNK_MS,
    PACE_MARGIN,
    Forest,
    ForestParams,
    layout,
    pace_bytes_per_s,
    pair_rates,
    tree_chunk_numel,
)
from schedulers.collective.forest_plan import Tree, plan_forest
from schedulers.core.base import CommError, TensorSpec
from schedulers.transport.connection import SO_MAX_PACING_RATE
from tests.conftest import REPO as REPO_PATH
from tests.factories import racks_node_link, star_links
from tests.loopback_jobs import assert_averages, ctx, endpoints, run_threads

REPO = str(REPO_PATH)


def allreduce_job(hosts, topology, sizes, iterations, params, seed=0):
    """The data path on the plan of the configured rates (measured bandwidth:
    tests/loopback/test_forest_replan.py)."""
    params = {"bandwidth": "configured", **params}
    eps = endpoints(hosts)
    n = len(hosts)
    tensors = [TensorSpec(k, f"t{k}", s, k) for k, s in enumerate(sizes)]
    rng = np.random.default_rng(seed)
    grads = [[[rng.standard_normal(s, dtype=np.float32) for s in sizes] for _ in range(n)]
             for _ in range(iterations)]

    def work(r):
        sched = registry.create("forest", ctx(r, eps, topology), params)
        sched.start(tensors)
        got = []
        for it in range(iterations):
            for t in reversed(tensors):     # backward order, as training pushes them
                sched.push(t.key, grads[it][r][t.key].copy(), it)
            got.append([sched.wait(t.key, it).copy() for t in tensors])
        sched.close()
        return got, sched.plan

    out, _ = run_threads(work, n)
    assert_averages(out, grads, identical=True)
    plans = [out[r][1] for r in range(n)]
    assert all(p == plans[0] for p in plans)
    return plans[0]


SIZES = [1, 7, 1000, 4099, 30_001]


@pytest.mark.parametrize("n", [1, 2, 3, 5, pytest.param(8, marks=pytest.mark.slow)])
def test_heterogeneous_star_average(n):
    rates = [100] * max(n - 2, 1) + [10] * min(n - 1, 2)
    hosts = [f"h{i}" for i in range(n)]
    plan = allreduce_job(hosts, star_links(rates), SIZES, 3, {"chunk_numel": 1024}, seed=n)
    json.dumps(plan, allow_nan=False)


@pytest.mark.slow
def test_many_trees_random_tensor_sets():
    """Uniform star: one tree per worker, so every tensor is cut across several trees."""
    rng = np.random.default_rng(7)
    sizes = [int(s) for s in rng.integers(1, 5000, size=12)] + [2, 3, 65_537]
    plan = allreduce_job([f"h{i}" for i in range(4)], star_links([100] * 4), sizes, 2, {"chunk_numel": 512})
    assert len(plan["trees"]) == 4 and len({t["root"] for t in plan["trees"]}) == 4


@pytest.mark.slow
def test_two_racks_deep_trees_and_huge_tensor():
    topo, hosts = racks_node_link(3, 20)
    plan = allreduce_job(hosts, topo, [3, 1_000_003], 2, {})
    assert max(t["depth"] for t in plan["trees"]) >= 2


def test_no_topology_assumes_uniform_star():
    """What the generic loopback test passes: all workers on host 'lo', topology None."""
    plan = allreduce_job(["lo"] * 3, None, SIZES, 2, {"chunk_numel": 2048})
    assert plan["assumed_topology"]


def test_layout_covers_every_element_once_and_follows_fractions():
    tensors = [TensorSpec(k, f"t{k}", s, k) for k, s in enumerate([5, 100, 3000, 100_000, 1])]
    fractions = [0.5, 0.3, 0.2]
    chunks = layout(tensors, fractions, chunk_numel=1000)
    per_tree = [0] * 3
    for t in tensors:
        covered = np.zeros(t.numel, int)
        for ch in chunks[t.key]:
            assert 0 < ch.hi - ch.lo <= 1000
            covered[ch.lo:ch.hi] += 1
            per_tree[ch.tree] += ch.hi - ch.lo
        assert (covered == 1).all()
    total = sum(t.numel for t in tensors)
    assert np.allclose(np.array(per_tree) / total, fractions, atol=0.01)


def test_layout_brings_every_tree_to_its_share_despite_whole_small_tensors():
    """Small tensors go whole to one tree each; the large ones' cuts make up for it, so every
    tree carries its share of the whole gradient to within rounding. Cut by the fractions
    alone, one tree was 10% over its share here and another 24% under."""
    tensors = [TensorSpec(k, f"s{k}", 900, k) for k in range(7)] + [TensorSpec(7, "big", 20_000, 7)]
    fractions = [0.55, 0.3, 0.1, 0.05]
    per_tree = [0] * 4
    for chunks in layout(tensors, fractions, chunk_numel=1000).values():
        for ch in chunks:
            per_tree[ch.tree] += ch.hi - ch.lo
    total = sum(t.numel for t in tensors)
    assert sum(per_tree) == total
    assert all(abs(got - f * total) <= 2 for got, f in zip(per_tree, fractions, strict=True)), per_tree


def test_pacing_never_holds_a_chunk_longer_than_chunk_ms():
    """A pair is paced at its planned rate times the margin, but a slow tree's chunk (its whole
    slice, here) still crosses in chunk_ms: each tree level waits for a whole chunk."""
    assert pace_bytes_per_s(50e6, 16_384, 8.0) == 50e6 / 8 * PACE_MARGIN
    assert pace_bytes_per_s(50e6, 16_384, 8.0, margin=1.3) == 50e6 / 8 * 1.3
    assert pace_bytes_per_s(1e6, 9_436, 8.0) == 9_436 / 0.008


def test_tunables_added_later_stay_out_of_the_run_id_at_their_defaults():
    """A config that does not set them keeps its run id (a sweep resumes); set, they count."""
    later = {"chunk_ms", "min_chunk_kb", "pace", "replan_probe_s", "pace_margin", "fan_rounds", "replan_rounds"}
    assert not later & set(ForestParams().model_dump())
    changed = ForestParams(chunk_ms=4, min_chunk_kb=4, pace=False, replan_probe_s=0.2, pace_margin=1.3, fan_rounds=2,
                           replan_rounds="all")
    assert later <= set(changed.model_dump())


def test_layout_streams_each_slice_in_slice_chunks():
    """A slice is cut into slice_chunks chunks, none under 4096 floats and none over chunk_numel."""
    def sizes(numel, fractions):
        return [ch.hi - ch.lo for ch in layout([TensorSpec(0, "t", numel, 0)], fractions, 16_384, 8)[0]]

    assert sizes(100_000, [1.0]) == [12_500] * 8                     # 8 chunks of the slice
    assert sizes(20_000, [1.0]) == [4096] * 4 + [3616]               # none under 16 KiB
    assert sizes(400_000, [0.5, 0.5]) == ([16_384] * 12 + [3392]) * 2  # none over chunk_numel


def test_a_slow_tree_gets_chunks_of_chunk_ms_at_its_planned_rate():
    """A chunk waits one hop per tree level, so a tree's chunks take at most chunk_ms at its
    planned rate: 40 Mb/s and 8 ms give 10,000 floats (40 kB); never under 16 KiB nor over chunk_numel."""
    assert tree_chunk_numel(40e6, 8.0, 16_384) == 10_000
    assert tree_chunk_numel(1e9, 8.0, 16_384) == 16_384          # a fast tree: chunk_numel
    assert tree_chunk_numel(14e6, 8.0, 16_384) == 4096           # a slow one: 16 KiB
    assert tree_chunk_numel(float("inf"), 8.0, 16_384) == 16_384  # no rate planned (no topology)
    assert tree_chunk_numel(14e6, 8.0, 16_384, 1024) == 3500      # min_chunk_kb: 4
    assert tree_chunk_numel(1e6, 8.0, 16_384, 1024) == 1024
    chunks = layout([TensorSpec(0, "t", 100_000, 0)], [0.5, 0.5], 16_384, 1, [10_000, 16_384])[0]
    slow = [ch.hi - ch.lo for ch in chunks if ch.tree == 0]
    fast = [ch.hi - ch.lo for ch in chunks if ch.tree == 1]
    assert max(slow) == 10_000 and sum(slow) == 50_000 and max(fast) == 16_384 and sum(fast) == 50_000


def test_a_pair_is_planned_at_the_sum_of_the_trees_that_join_it():
    """A tree edge carries its tree's rate both ways, so worker 0's connection to 1 is paced at
    the rates of both trees that join them, and to 2 at the one tree that does."""
    trees = (Tree(root=0, parent=(-1, 0, 0), fraction=0.6, rate=30e6),
             Tree(root=1, parent=(1, -1, 0), fraction=0.4, rate=20e6))
    assert pair_rates(trees, 0) == {1: 50e6, 2: 50e6}
    assert pair_rates(trees, 2) == {0: 50e6}
    assert pair_rates(trees, 1) == {0: 50e6}


@pytest.mark.parametrize(("mbps", "margin"), [(100, PACE_MARGIN), (100, 1.5), (1, PACE_MARGIN)])
def test_pace_caps_each_connection_at_its_pairs_planned_rate(mbps, margin):
    """With `pace`, worker r's connection to p is capped at the plan's rate for the pair times
    pace_margin, in bytes/s; without it, not at all (the kernel's ~0). On 1 Mb/s links the cap
    is the floor instead: a tree's 16 KiB chunk in chunk_ms (2 MB/s)."""
    hosts = ["h0", "h1", "h2"]
    eps = endpoints(hosts)
    tensors = [TensorSpec(0, "t", 50_000, 0)]
    floor = 16_384 / (CHUNK_MS / 1000)

    def work(r, paced):
        sched = registry.create("forest", ctx(r, eps, star_links([mbps] * 3)),
                                {"bandwidth": "configured", "pace": paced, "pace_margin": margin})
        sched.start(tensors)
        sched.push(0, np.ones(50_000, np.float32), 0)
        sched.wait(0, 0)
        caps = {p: c.sock.getsockopt(socket.SOL_SOCKET, SO_MAX_PACING_RATE) for p, c in sched.conns.items()}
        want = {p: int(max(bps / 8 * margin, floor)) for p, bps in pair_rates(sched.trees, r).items()}
        sched.close()
        return caps, want

    for paced in (True, False):
        out, _ = run_threads(lambda r, paced=paced: work(r, paced), 3)
        for r in range(3):
            assert not isinstance(out[r], BaseException), out[r]
            caps, want = out[r]
            assert caps and set(caps) == set(want)
            if paced:
                assert all(abs(caps[p] - want[p]) <= 1 for p in caps), (caps, want)
                if mbps == 1:     # every pair under its floor
                    assert set(want.values()) == {int(floor)}, want
                else:
                    assert all(0 < w < 100e6 / 8 * 1.1 for w in want.values()), want
            else:
                assert all(c in (-1, 0xFFFFFFFF) for c in caps.values()), caps


@pytest.mark.slow
def test_trace_records_sends_and_results():
    eps = endpoints(["h0", "h1"])
    tensors = [TensorSpec(0, "w", 3000, 0)]

    def work(r):
        s = Forest(ctx(r, eps, star_links([100, 100]), trace=True), Forest.Params(chunk_numel=1000))
        s.start(tensors)
        s.push(0, np.ones(3000, np.float32), 0)
        s.wait(0, 0)
        s.close()
        return s.events

    out, _ = run_threads(work, 2)
    for events in out.values():
        kinds = [e[0] for e in events]
        assert "recv" in kinds and "send" in kinds


def test_registry_entry_needs_no_servers():
    cls = registry.SCHEDULERS["forest"]
    assert cls is Forest and cls.Params.requires_servers is False


# ---------------------------------------------------------------------------- failures
VICTIM = r"""
import json, sys, time
import numpy as np
from schedulers import registry
from schedulers.core.base import Endpoint, RoleContext, TensorSpec
a = json.loads(sys.argv[1])
eps = [Endpoint(*e) for e in a["eps"]]
s = registry.create("forest", RoleContext(a["rank"], len(eps), [], eps, topology=a["topo"],
                    connect_timeout_s=20), {})
s.start([TensorSpec(0, "w", 5000, 0)])
s.push(0, np.ones(5000, np.float32), 0)
s.wait(0, 0)
print("ready", flush=True)
time.sleep(60)
"""


@pytest.mark.slow
def test_killed_worker_named_by_every_worker_within_bounded_time(procs):
    """Kill -9 a leaf of a single-tree plan: only its parent sees the connection break; the
    others learn it from the ABORT passed along the tree and still name the dead worker."""
    rates = [100, 100, 100, 10, 10]
    topo = star_links(rates)
    hosts = [f"h{i}" for i in range(5)]
    eps = endpoints(hosts)
    plan = plan_forest(topo, hosts)
    victim = 4
    neighbours = {t.parent[victim] for t in plan.trees} | {c for t in plan.trees for c in t.children(victim)}
    assert len(neighbours - {-1}) < 4, "precondition: some workers are not the victim's neighbours"
    arg = json.dumps({"rank": victim, "eps": [[e.host, e.ip, e.port] for e in eps], "topo": topo})
    proc = procs.start([sys.executable, "-c", VICTIM, arg], cwd=REPO, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": REPO})
    ready = threading.Event()

    def work(r):
        if r == victim:
            line = proc.stdout.readline()
            assert line.strip() == "ready", proc.stderr.read()
            ready.set()
            return None
        s = Forest(ctx(r, eps, topo), Forest.Params())
        s.start([TensorSpec(0, "w", 5000, 0)])
        s.push(0, np.ones(5000, np.float32), 0)
        s.wait(0, 0)
        ready.wait(30)
        s.push(0, np.ones(5000, np.float32), 1)   # the victim never pushes iteration 1
        t0 = time.monotonic()
        try:
            s.wait(0, 1)
        except CommError as e:
            return str(e), time.monotonic() - t0
        finally:
            s.close()
        return "no error", 0.0

    def killer():
        ready.wait(30)
        time.sleep(0.5)                          # let the others block in wait()
        os.kill(proc.pid, signal.SIGKILL)
    threading.Thread(target=killer, daemon=True).start()
    out, _ = run_threads(work, 5, join_s=45)
    for r in range(5):
        if r == victim:
            continue
        msg, waited = out[r]
        assert f"worker {victim} (h{victim}" in msg, (r, msg)
        assert waited < 10, (r, waited)


@pytest.mark.slow
def test_worker_that_never_starts_is_named():
    hosts = [f"h{i}" for i in range(3)]
    eps = endpoints(hosts)

    def work(r):
        if r == 0:
            return None                               # worker 0 never shows up
        s = Forest(ctx(r, eps, star_links([100] * 3), timeout=2), Forest.Params())
        s.start([TensorSpec(0, "w", 10, 0)])
        return "started"

    out, took = run_threads(work, 3, join_s=20)
    for r in (1, 2):
        assert isinstance(out[r], CommError) and "worker 0 (h0" in str(out[r]), out[r]
    assert took < 10


@pytest.mark.slow
def test_different_plans_refuse_to_connect():
    """Worker 2 was given another capacity graph: its trees differ, so nobody may start."""
    hosts = ["h0", "h1", "h2"]
    eps = endpoints(hosts)
    topos = [star_links([100, 100, 100])] * 2 + [star_links([100, 100, 10])]
    assert plan_forest(topos[0], hosts).digest() != plan_forest(topos[2], hosts).digest()

    def work(r):
        s = Forest(ctx(r, eps, topos[r], timeout=5), Forest.Params(bandwidth="configured"))
        s.start([TensorSpec(0, "w", 10, 0)])
        return "started"

    out, took = run_threads(work, 3, join_s=20)
    assert all(isinstance(e, CommError) and "different forest plan" in str(e) for e in out.values()), out
    assert took < 4, "the refusal should travel as ABORT, not wait for the 5 s connect timeout"


@pytest.mark.parametrize("who", ["leaf", "root"])
def test_worker_that_leaves_early_is_named(who):
    """One worker runs one iteration fewer and closes (BYE): the others, whether it is their
    child or their parent in the tree, must not wait forever."""
    hosts = [f"h{i}" for i in range(4)]
    eps = endpoints(hosts)
    topo = star_links([100, 100, 10, 10])
    (tree,) = plan_forest(topo, hosts).trees          # one star tree: slow hosts are leaves
    early = tree.root if who == "root" else 2
    assert (tree.parent[early] == -1) == (who == "root")

    def work(r):
        s = Forest(ctx(r, eps, topo), Forest.Params(bandwidth="configured"))
        s.start([TensorSpec(0, "w", 100, 0)])
        for it in range(1 if r == early else 3):
            s.push(0, np.ones(100, np.float32), it)
            s.wait(0, it)
        s.close()
        return "done"

    out, took = run_threads(work, 4, join_s=30)
    assert out[early] == "done"
    for r in set(range(4)) - {early}:
        assert isinstance(out[r], CommError) and f"worker {early} (h{early}" in str(out[r]), out[r]
    assert took < 10


def test_without_priority_the_averages_are_the_same():
    """priority: false only reorders frames on each link (first come, first sent)."""
    hosts = [f"h{i}" for i in range(4)]
    allreduce_job(hosts, star_links([100, 100, 10, 10]), SIZES, 2, {"priority": False, "chunk_numel": 2048})
