"""The forest planner against rates derived by hand, and its plans checked independently.

Closed forms used below (c_i: host i's link rate, each direction; n workers):
- Star, tree packing: a tree loads host i's link with its degree d_i >= 1, and the degrees
  sum to 2(n-1); every degree sequence with d_i >= 1 is a tree's, so the optimum is
      OPT = min(min_i c_i, sum_i c_i / (2(n-1))).
- Ring all-reduce sends 2(n-1)/n of the gradient over every host's link each way:
      RING = n min_i c_i / (2(n-1)).
  With a host at 1/10 the rate the first term of OPT binds, so OPT / RING = 2(n-1)/n.
- Uniform star: OPT = n c / (2(n-1)) = RING, while a single tree has a host of degree >= 2,
  so its best is c/2 (a path): OPT / best tree = n / (n-1).
- Two racks joined through an uplink of rate U <= c/2: every tree crosses the uplink once
  each way per crossing edge, so OPT <= U, and a path through each rack joined by one edge
  reaches it (host degree <= 2, 2U <= c): OPT = U. A ring over the ranks rack by rack
  crosses it once each way: RING = U n / (2(n-1)).
Feasibility is re-checked here with networkx's own shortest paths, not the planner's.
"""
from __future__ import annotations

import itertools
import json
import math
import random

import networkx as nx
import pytest

from schedulers.forest_plan import ForestPlan, LinkModel, garg_konemann, lp_optimum, plan_forest

MBPS = 1e6


def star(rates, up=None):
    """A capacity graph as emu/topology.py builds it: one switch, one link per host."""
    g = nx.DiGraph()
    g.add_node("s1", kind="switch")
    hosts = []
    for i, c in enumerate(rates):
        h = f"h{i}"
        hosts.append(h)
        g.add_node(h, kind="host")
        g.add_edge(h, "s1", capacity=(up[i] if up else c) * MBPS)
        g.add_edge("s1", h, capacity=c * MBPS)
    return g, hosts


def racks(num_racks, per_rack, host_mbps, oversubscription):
    """emu/topospec.py's racks: hosts r{i}h{j}, ToR switches s1..sR, core switch s0."""
    g = nx.DiGraph()
    g.add_node("s0", kind="switch")
    uplink = per_rack * host_mbps / oversubscription
    hosts = []
    for r in range(num_racks):
        tor = f"s{r + 1}"
        g.add_node(tor, kind="switch")
        g.add_edge(tor, "s0", capacity=uplink * MBPS)
        g.add_edge("s0", tor, capacity=uplink * MBPS)
        for j in range(per_rack):
            h = f"r{r}h{j}"
            hosts.append(h)
            g.add_node(h, kind="host")
            g.add_edge(h, tor, capacity=host_mbps * MBPS)
            g.add_edge(tor, h, capacity=host_mbps * MBPS)
    return g, hosts, uplink


def plan_of(g, hosts, **kw) -> ForestPlan:
    return plan_forest(nx.node_link_data(g, edges="links"), hosts, **kw)


def check_plan(plan: ForestPlan, g: nx.DiGraph, hosts: list[str]) -> None:
    """Trees span the workers, slices sum to 1, and the rates fit every link, computed with
    networkx's shortest paths; the plan's rate is the sum of its trees' rates."""
    n = len(hosts)
    assert math.isclose(sum(t.fraction for t in plan.trees), 1.0, rel_tol=1e-9)
    assert math.isclose(sum(t.rate for t in plan.trees), plan.rate, rel_tol=1e-9)
    use = {e: 0.0 for e in g.edges}
    for t in plan.trees:
        assert t.parent[t.root] == -1 and sum(p == -1 for p in t.parent) == 1
        tree = nx.Graph([(v, p) for v, p in enumerate(t.parent) if p >= 0])
        tree.add_nodes_from(range(n))
        assert nx.is_tree(tree), t
        assert math.isclose(t.fraction, t.rate / plan.rate, rel_tol=1e-9)
        for u, v in tree.edges:
            for a, b in ((u, v), (v, u)):
                path = nx.shortest_path(g, hosts[a], hosts[b])
                for e in zip(path, path[1:]):
                    use[e] += t.rate
    for e, load in use.items():
        assert load <= g.edges[e]["capacity"] * (1 + 1e-6), (e, load)


def star_opt(rates):
    n = len(rates)
    return min(min(rates), sum(rates) / (2 * (n - 1))) * MBPS


def star_ring(rates):
    n = len(rates)
    return n * min(rates) / (2 * (n - 1)) * MBPS


HETEROGENEOUS = [
    [100, 100, 100, 10],
    [100, 100, 100, 100, 10, 10],
    [100] * 6 + [10] * 2,
    [100] * 4 + [10] * 4,
    [1000, 100, 100, 10, 1000, 100, 10, 100],
]


@pytest.mark.parametrize("rates", HETEROGENEOUS, ids=lambda r: f"{len(r)}w")
def test_heterogeneous_star_reaches_optimum_and_beats_ring(rates):
    g, hosts = star(rates)
    plan = plan_of(g, hosts)
    check_plan(plan, g, hosts)
    n = len(rates)
    assert plan.optimum == pytest.approx(star_opt(rates), rel=1e-6)
    assert plan.upper_bound == pytest.approx(star_opt(rates), rel=1e-6)
    assert plan.ring_rate == pytest.approx(star_ring(rates), rel=1e-9)
    assert plan.rate >= 0.9 * plan.optimum
    # A host at 1/10 binds, so the forest beats the ring by the ring's 2(n-1)/n overhead.
    assert min(rates) <= sum(rates) / (2 * (n - 1))
    assert plan.rate / plan.ring_rate >= 0.9 * 2 * (n - 1) / n


def prufer_trees(n):
    """Every labelled tree on n nodes, as degree sequences (Prüfer: degree = 1 + count)."""
    for seq in itertools.product(range(n), repeat=n - 2):
        yield [1 + seq.count(i) for i in range(n)]


@pytest.mark.parametrize("n", [4, 5])
def test_uniform_star_forest_beats_every_single_tree(n):
    c = 100
    g, hosts = star([c] * n)
    plan = plan_of(g, hosts)
    check_plan(plan, g, hosts)
    best_tree = max(min(c / d for d in degrees) for degrees in prufer_trees(n)) * MBPS
    assert best_tree == pytest.approx(c / 2 * MBPS)
    assert plan.optimum == pytest.approx(n * c / (2 * (n - 1)) * MBPS, rel=1e-6)
    assert plan.optimum / best_tree == pytest.approx(n / (n - 1))
    assert plan.rate >= 0.9 * plan.optimum
    assert plan.rate > best_tree
    assert len({t.root for t in plan.trees}) > 1, "trees should be rooted at different workers"


def test_two_racks_oversubscribed_uplink():
    g, hosts, uplink = racks(2, 4, 100, oversubscription=16)   # 25 Mb/s between the racks
    n = len(hosts)
    assert uplink <= 100 / 2
    plan = plan_of(g, hosts)
    check_plan(plan, g, hosts)
    assert plan.optimum == pytest.approx(uplink * MBPS, rel=1e-6)
    assert plan.ring_rate == pytest.approx(uplink * n / (2 * (n - 1)) * MBPS, rel=1e-9)
    assert plan.rate >= 0.9 * plan.optimum
    assert plan.rate / plan.ring_rate >= 0.9 * 2 * (n - 1) / n


def test_two_racks_full_bisection_is_host_bound():
    g, hosts, _ = racks(2, 4, 100, oversubscription=1)
    plan = plan_of(g, hosts)
    check_plan(plan, g, hosts)
    n = len(hosts)
    assert plan.optimum == pytest.approx(n * 100 / (2 * (n - 1)) * MBPS, rel=1e-6)
    assert plan.rate >= 0.9 * plan.optimum


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_asymmetric_graphs_near_certified_optimum(seed):
    """No closed form: the LP optimum must meet its own dual certificate, and the plan reach
    0.9 of it. Three racks, random per-direction rates, an extra host on the core."""
    rnd = random.Random(seed)
    g, hosts, _ = racks(3, 2, 100, oversubscription=2)
    for e in g.edges:
        g.edges[e]["capacity"] *= rnd.choice([0.1, 0.5, 1, 2])
    g.add_node("x", kind="host")
    g.add_edge("x", "s0", capacity=50 * MBPS)
    g.add_edge("s0", "x", capacity=30 * MBPS)
    hosts.append("x")
    plan = plan_of(g, hosts)
    check_plan(plan, g, hosts)
    assert plan.upper_bound == pytest.approx(plan.optimum, rel=1e-6)
    assert plan.rate >= 0.9 * plan.optimum


@pytest.mark.parametrize("eps", [0.1, 0.05])
def test_garg_konemann_alone_meets_its_guarantee(eps):
    """Before the LP re-weighting, the packing is feasible and >= (1-eps)^3 of the optimum."""
    for g, hosts in (star([100, 100, 100, 100, 10, 10]), racks(2, 3, 100, 6)[:2]):
        model = LinkModel.from_graph(nx.node_link_data(g, edges="links"), hosts)
        flow = garg_konemann(model, eps)
        load = sum(y * model.tree_load(t) for t, y in flow.items())
        assert (load <= model.capacity * (1 + 1e-9)).all()
        opt, _ = lp_optimum(model)
        assert sum(flow.values()) >= (1 - eps) ** 3 * opt


def test_plan_is_deterministic_and_json_round_trips():
    g, hosts = star([100, 40, 100, 10, 60])
    data = nx.node_link_data(g, edges="links")
    shuffled = json.loads(json.dumps(data))
    random.Random(0).shuffle(shuffled["nodes"])
    random.Random(1).shuffle(shuffled["links"])
    a, b = plan_forest(data, hosts), plan_forest(shuffled, hosts)
    assert a == b and a.digest() == b.digest()
    d = json.loads(json.dumps(a.to_dict(), allow_nan=False))
    assert ForestPlan.from_dict(d) == a
    assert d["of_optimum"] >= 0.9


def test_asymmetric_star_uses_the_direction_that_binds():
    """Uplinks at 1/10 of downlinks: every direction counts on its own."""
    g, hosts = star([100] * 4, up=[10] * 4)
    plan = plan_of(g, hosts)
    check_plan(plan, g, hosts)
    assert plan.optimum == pytest.approx(star_opt([10] * 4), rel=1e-6)


def test_edge_cases():
    one = plan_forest(None, ["h0"])
    assert len(one.trees) == 1 and one.trees[0].parent == (-1,) and math.isinf(one.rate)
    json.dumps(one.to_dict(), allow_nan=False)
    none = plan_forest(None, ["a", "b", "c"])                    # no topology: uniform star
    assert none.assumed_topology and none.optimum == pytest.approx(3 / 4)
    g, _ = star([100])
    shared = plan_of(g, ["h0", "h0", "h0"])                       # all on one host: no link binds
    assert shared.assumed_topology
    g, hosts = star([100, 100])
    with pytest.raises(ValueError, match="'nowhere' is not in the capacity graph"):
        plan_of(g, ["h0", "nowhere"])
    # Two workers per host: their tree edge crosses no link; each host carries one edge.
    g, _ = star([100, 10])
    plan = plan_of(g, ["h0", "h0", "h1", "h1"])
    check_plan(plan, g, ["h0", "h0", "h1", "h1"])
    assert plan.optimum == pytest.approx(10 * MBPS, rel=1e-6)
