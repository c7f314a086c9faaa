"""The forest's per-tree record (contracts/forest_trees.py) on loopback: filled and consistent.
Worker 0's record holds every worker's rows (the gather at close); the planned fractions sum
to 1; every tree edge carried, in each direction and iteration, exactly the tree's slice."""
from __future__ import annotations

import numpy as np
import pytest

from contracts.forest_trees import KEY, ForestTrees
from schedulers import registry
from schedulers.collective.forest import layout
from schedulers.core.base import TensorSpec
from tests.factories import racks_node_link, star_links
from tests.loopback_jobs import ctx, endpoints, run_threads

SIZES = [3, 5000, 70_000]


def _job(hosts, topology, iterations, params):
    eps = endpoints(hosts)
    n = len(hosts)
    tensors = [TensorSpec(k, f"t{k}", s, k) for k, s in enumerate(SIZES)]
    rng = np.random.default_rng(3)

    def work(r):
        sched = registry.create("forest", ctx(r, eps, topology), params)
        sched.start(tensors)
        for it in range(iterations):
            for t in reversed(tensors):
                sched.push(t.key, rng.standard_normal(t.numel).astype(np.float32), it)
            for t in tensors:
                sched.wait(t.key, it)
        sched.close()
        return sched.info()

    out, _ = run_threads(work, n, join_s=90)
    for r in range(n):
        assert not isinstance(out[r], BaseException), out[r]
    return tensors, [out[r] for r in range(n)]


def _check(tensors, info, n, iterations):
    rec = ForestTrees.model_validate(info[KEY])
    assert rec.ranks == list(range(n)), "worker 0 holds every worker's record"
    plan = rec.plans[-1]
    assert sum(t.fraction for t in plan.trees) == pytest.approx(1.0)
    assert plan.rate_bps == pytest.approx(sum(t.rate_bps for t in plan.trees))
    for t in plan.trees:
        assert len(t.edges) == n - 1 and all(e.up and e.down for e in t.edges)
    chunks = layout(tensors, [t.fraction for t in plan.trees], 16_384, 8)
    slice_bytes = [0] * len(plan.trees)
    for cs in chunks.values():
        for ch in cs:
            slice_bytes[ch.tree] += 4 * (ch.hi - ch.lo)
    e = rec.edges
    rows = {(it, k, s, d): (ph, b, f, la) for it, k, s, d, ph, b, f, la in
            zip(e.iteration, e.tree, e.src, e.dst, e.phase, e.bytes, e.first_t, e.last_t, strict=True)}
    for it in range(iterations):
        for t in plan.trees:
            for edge in t.edges:
                up = rows[(it, t.tree, edge.child, edge.parent)]
                down = rows[(it, t.tree, edge.parent, edge.child)]
                assert (up[0], down[0]) == (0, 1)
                assert up[1] == down[1] == slice_bytes[t.tree], "each edge carries the tree's slice, each way"
                assert up[2] <= up[3] and down[2] <= down[3]
    total = sum(b for (it, *_), (_, b, _, _) in rows.items() if it < iterations)
    assert total == iterations * 2 * (n - 1) * 4 * sum(t.numel for t in tensors), "what the scheme must move"
    assert len(rows) == iterations * len(plan.trees) * 2 * (n - 1)
    done = set(zip(rec.done.iteration, rec.done.tree, rec.done.rank, strict=True))
    assert done == {(it, t.tree, r) for it in range(iterations) for t in plan.trees for r in range(n)}
    pushes = dict(zip(zip(rec.pushes.iteration, rec.pushes.rank, strict=True),
                      zip(rec.pushes.first_t, rec.pushes.last_t, strict=True), strict=True))
    assert set(pushes) == {(it, r) for it in range(iterations) for r in range(n)}
    start = {it: min(pushes[(it, r)][0] for r in range(n)) for it in range(iterations)}
    assert all(t >= start[it] for it, t in zip(rec.done.iteration, rec.done.t, strict=True))


def test_configured_plan_record_is_complete_and_consistent():
    topo, hosts = racks_node_link(2, 20)
    tensors, infos = _job(hosts, topo, 3, {"bandwidth": "configured"})
    _check(tensors, infos[0], len(hosts), 3)
    rec = ForestTrees.model_validate(infos[0][KEY])
    assert rec.plans[0].configured_bps == rec.plans[0].capacity_bps
    up = rec.plans[0].links.index("s1>s0")
    assert rec.plans[0].planned_bps[up] <= rec.plans[0].capacity_bps[up] * (1 + 1e-6), "the plan fits the links"


@pytest.mark.slow
def test_measured_plan_record_is_complete_and_consistent():
    n = 3
    tensors, infos = _job([f"h{i}" for i in range(n)], star_links([100] * n), 2, {"probe_s": 0.1})
    _check(tensors, infos[0], n, 2)
    rec = ForestTrees.model_validate(infos[0][KEY])
    assert rec.pushes.epoch and set(rec.pushes.epoch) == {0}
    assert all(c is not None and c > 100e6 for c in rec.plans[0].capacity_bps), "the probe's rates on loopback"
