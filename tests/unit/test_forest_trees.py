"""The forest's per-tree record: the recorder and the gather tree (schedulers/collective/forest_record.py),
the contract (contracts/forest_trees.py) and its reading in analysis/forest_trees.py."""
from __future__ import annotations

import json

import pytest

from analysis import forest_trees
from contracts.forest_trees import KEY, EpochPlan, ForestTrees, PlannedTree, TreeEdge
from schedulers.collective.forest_plan import plan_forest
from schedulers.collective.forest_record import BROADCAST, REDUCE, TreeRecorder, epoch_plan, gather_tree
from schedulers.core.linkmodel import LinkModel
from tests.factories import star_links


def test_gather_tree_is_a_bfs_tree_from_worker_zero():
    full = [set(range(4)) - {u} for u in range(4)]
    assert gather_tree(4, full) == ([-1, 0, 0, 0], [[1, 2, 3], [], [], []])
    path = [{2}, {3, 2}, {0, 1}, {1}]         # 0 - 2 - 1 - 3
    assert gather_tree(4, path) == ([-1, 2, 0, 1], [[2], [3], [1], []])


def test_recorder_sums_frames_per_iteration_tree_and_sender_and_merges():
    a, b = TreeRecorder(0), TreeRecorder(1)
    a.pushed(0, 0)
    assert a.is_new(0, 1, 2)
    a.frame(0, 1, 2, REDUCE, 100, 1.0, 1.5, early=30)
    assert not a.is_new(0, 1, 2)
    a.frame(0, 1, 2, REDUCE, 50, 1.6, 2.0)
    a.frame(0, 0, 2, BROADCAST, 10, 1.1, 1.2)
    a.delivered(0, 1)
    b.pushed(0, 0)
    b.delivered(0, 0)
    a.merge(b.record())
    rec = ForestTrees.model_validate(json.loads(json.dumps(a.record().model_dump(mode="json"))))
    assert rec.ranks == [0, 1]
    rows = list(zip(rec.edges.tree, rec.edges.src, rec.edges.dst, rec.edges.phase, rec.edges.bytes,
                    rec.edges.first_t, rec.edges.last_t, rec.edges.frames, rec.edges.early, strict=True))
    assert rows == [(0, 2, 0, BROADCAST, 10, 1.1, 1.2, 1, 0), (1, 2, 0, REDUCE, 150, 1.0, 2.0, 2, 30)]
    assert sorted(zip(rec.done.tree, rec.done.rank, strict=True)) == [(0, 1), (1, 0)]
    assert rec.pushes.rank == [0, 1]


def test_columns_of_one_table_must_have_equal_lengths():
    with pytest.raises(ValueError, match="different lengths"):
        ForestTrees.model_validate({"done": {"iteration": [0], "tree": [], "rank": [0], "t": [1.0]}})


def test_epoch_plan_loads_links_as_the_planner_does():
    topo = star_links([100, 100, 10])
    plan = plan_forest(topo, ["h0", "h1", "h2"])
    model = LinkModel.from_graph(topo, ["h0", "h1", "h2"])
    ep = epoch_plan(0, plan, model, None, {})
    assert sum(t.fraction for t in ep.trees) == pytest.approx(1.0)
    for k, t in enumerate(plan.trees):   # the planned load is the planner's tree_load x rate
        edges = tuple((v, p) for v, p in enumerate(t.parent) if p >= 0)
        assert ep.trees[k].edges and len(ep.trees[k].edges) == 2
        load = model.tree_load(edges) * t.rate
        assert sum(load) == pytest.approx(sum(len(e.up) + len(e.down) for e in ep.trees[k].edges) * t.rate)
    assert all(p <= c * (1 + 1e-6) for p, c in zip(ep.planned_bps, ep.capacity_bps, strict=True))
    assert ep.configured_bps == [None] * len(ep.links)


def _two_trees() -> ForestTrees:
    """Workers 0 and 1 on a star; tree 0 (root 0) planned at 75 Mb/s with 3/4 of a 1 MB
    gradient, tree 1 (root 1) at 25 Mb/s with 1/4. Iteration 0 is warm-up; in iteration 1
    tree 0 finishes on plan (80 ms) and tree 1 at 100 ms: 20 Mb/s, 0.8 of its plan."""
    links = ["h0>s", "h1>s", "s>h0", "s>h1"]
    e0 = TreeEdge(child=1, parent=0, up=[1, 2], down=[0, 3])
    e1 = TreeEdge(child=0, parent=1, up=[0, 3], down=[1, 2])
    plan = EpochPlan(epoch=0, rate_bps=100e6, links=links, capacity_bps=[100e6] * 4, configured_bps=[100e6] * 4,
                     planned_bps=[100e6] * 4,
                     trees=[PlannedTree(tree=0, root=0, depth=1, fraction=0.75, rate_bps=75e6, edges=[e0]),
                            PlannedTree(tree=1, root=1, depth=1, fraction=0.25, rate_bps=25e6, edges=[e1])])
    t = 100.0
    edges = {"iteration": [], "tree": [], "src": [], "dst": [], "phase": [], "bytes": [], "first_t": [],
             "last_t": [], "frames": [], "early": []}
    for it, shift in ((0, 0.0), (1, 1.0)):
        for row in ((0, 1, 0, REDUCE, 750_000, 0.0, 0.07), (0, 0, 1, BROADCAST, 750_000, 0.01, 0.08),
                    (1, 0, 1, REDUCE, 250_000, 0.0, 0.09), (1, 1, 0, BROADCAST, 250_000, 0.02, 0.1)):
            for col, v in zip(edges, (it, *row[:5], t + shift + row[5], t + shift + row[6], 8, 0), strict=True):
                edges[col].append(v)
    done = {"iteration": [0, 0, 1, 1], "tree": [0, 1, 0, 1], "rank": [1, 0, 1, 0],
            "t": [t + 0.08, t + 0.1, t + 1.08, t + 1.1]}
    pushes = {"iteration": [0, 0, 1, 1], "rank": [0, 1, 0, 1], "epoch": [0] * 4,
              "first_t": [t, t, t + 1.0, t + 1.0], "last_t": [t + 0.01] * 2 + [t + 1.01] * 2}
    return ForestTrees(ranks=[0, 1], plans=[plan], edges=edges, done=done, pushes=pushes)


def test_tree_table_names_the_tree_that_set_the_iteration_and_its_slowest_edge():
    trees = forest_trees.tree_table(_two_trees(), warmup=1).set_index("tree")
    assert trees.loc[0, "achieved_bps"] == pytest.approx(75e6)
    assert trees.loc[1, "achieved_bps"] == pytest.approx(20e6)
    assert trees.loc[1, "of_planned"] == pytest.approx(0.8)
    assert (trees["set_iterations"].tolist(), trees["iterations"].tolist()) == ([0, 1], [1, 1])
    assert trees.loc[1, "slowest_edge"] == "0->1"      # 250 kB in 90 ms against 80 ms for 1->0
    assert trees.loc[1, "slowest_bps"] == pytest.approx(2e6 / 0.09)
    assert set(trees.loc[1, "slowest_links"].split()) == {"h0>s", "s>h1"}


def test_pipeline_share_counts_the_chunks_a_tree_pipeline_fills():
    """Each slice crosses in 8 frames: over 2 hops (depth 1) a pipeline of whole chunks takes
    8 + 1 chunk times, over 4 (depth 2) 8 + 3."""
    rec = _two_trees()
    trees = forest_trees.tree_table(rec, warmup=1).set_index("tree")
    assert trees["pipeline_share"].tolist() == pytest.approx([8 / 9, 8 / 9])
    deeper = rec.plans[0].trees[1].model_copy(update={"depth": 2})
    rec.plans[0] = rec.plans[0].model_copy(update={"trees": [rec.plans[0].trees[0], deeper]})
    trees = forest_trees.tree_table(rec, warmup=1).set_index("tree")
    assert trees.loc[1, "pipeline_share"] == pytest.approx(8 / 11)
    assert forest_trees.iteration_table(rec, warmup=1).set_index("tree").loc[1, "chunk_bytes"] == 250_000 / 8


def test_dilated_rates_are_emulated_and_the_link_load_is_checked_against_physics():
    rec = _two_trees()
    trees = forest_trees.tree_table(rec, warmup=1, k=2.0).set_index("tree")
    assert trees.loc[1, "planned_bps"] == pytest.approx(50e6) and trees.loc[1, "achieved_bps"] == pytest.approx(40e6)
    links = forest_trees.link_table(rec, warmup=1).set_index("link")
    # h1>s carries tree 0 up (750 kB, 0-70 ms) and tree 1 down (250 kB, 20-100 ms): 8 Mb in 100 ms
    assert links.loc["h1>s", "achieved_bps"] == pytest.approx(80e6)
    assert links["physics_violations"].sum() == 0
    rec.plans[0] = rec.plans[0].model_copy(update={"configured_bps": [50e6] * 4})
    links = forest_trees.link_table(rec, warmup=1).set_index("link")
    assert links["last_hop"].to_dict() == {"h0>s": False, "h1>s": False, "s>h0": True, "s>h1": True}
    assert links["physics_violations"].to_dict() == {"h0>s": 0, "h1>s": 0, "s>h0": 1, "s>h1": 1}, \
        "judged on the links into a receiver only"


def test_bytes_in_the_socket_before_the_first_header_are_left_out_of_the_rate():
    rec = _two_trees()
    e = rec.edges
    i = next(i for i in range(len(e.tree)) if (e.iteration[i], e.tree[i], e.src[i]) == (1, 1, 0))
    e.early[i] = 25_000                      # 225 kB in 90 ms: 20 Mb/s
    trees = forest_trees.tree_table(rec, warmup=1).set_index("tree")
    assert trees.loc[1, "slowest_bps"] == pytest.approx(20e6)


def test_run_summary_reads_scheduler_info(tmp_path):
    (tmp_path / "scheduler_info.json").write_text(json.dumps({"plan": {}, KEY: _two_trees().model_dump(mode="json")}))
    s = forest_trees.run_summary(tmp_path, warmup=1)
    assert (s["setter_tree"], s["setter_share"], s["setter_edge"]) == (1, "1/1", "0->1")
    assert s["setter_pipeline_share"] == pytest.approx(8 / 9)
    assert forest_trees.run_summary(tmp_path / "none", warmup=1) is None
