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
import time

import networkx as nx
import numpy as np
import pytest

from analysis.bounds import forest_rate_bps
from emu.config.capacity import capacity_graph
from emu.config.topospec import RacksTopology, StarTopology
from schedulers.collective.forest_plan import (
    MIN_FRACTION,
    ForestPlan,
    _few_trees,
    _restricted_lp,
    _shallowest,
    plan_forest,
)
from schedulers.core.linkmodel import LinkModel
from tests.factories import star_graph

MBPS = 1e6


def racks(num_racks, per_rack, host_mbps, oversubscription):
    """emu/config/topospec.py's racks: hosts r{i}h{j}, ToR switches s1..sR, core switch s0."""
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
    g, hosts = star_graph(rates)
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
    g, hosts = star_graph([c] * n)
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


def racks_with_core_host(seed):
    """Three racks, random per-direction rates, an extra host on the core."""
    rnd = random.Random(seed)
    g, hosts, _ = racks(3, 2, 100, oversubscription=2)
    for e in g.edges:
        g.edges[e]["capacity"] *= rnd.choice([0.1, 0.5, 1, 2])
    g.add_node("x", kind="host")
    g.add_edge("x", "s0", capacity=50 * MBPS)
    g.add_edge("s0", "x", capacity=30 * MBPS)
    return g, hosts + ["x"]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_asymmetric_graphs_near_certified_optimum(seed):
    """No closed form: the LP optimum must meet its own dual certificate, and the plan reach
    0.9 of it. Three racks, random per-direction rates, an extra host on the core."""
    g, hosts = racks_with_core_host(seed)
    plan = plan_of(g, hosts)
    check_plan(plan, g, hosts)
    assert plan.upper_bound == pytest.approx(plan.optimum, rel=1e-6)
    assert plan.rate >= 0.9 * plan.optimum


def lognormal_star(n, seed=0):
    net = StarTopology(kind="star", count=n, bw_mbps=100,
                       heterogeneity={"kind": "lognormal", "sigma": 1, "seed": seed}).resolve()
    return capacity_graph(net), list(net.hosts)


def uneven_racks():
    """Racks of 1, 3, 5 and 2 hosts, each uplink its own rate, host rates from 10 to 1000 Mb/s."""
    g = nx.DiGraph()
    g.add_node("s0", kind="switch")
    hosts = []
    for r, (up, rates) in enumerate([(50, [100]), (20, [100, 10, 1000]), (200, [100, 100, 40, 10, 100]),
                                     (100, [1000, 100])]):
        tor = f"t{r}"
        g.add_node(tor, kind="switch")
        g.add_edge(tor, "s0", capacity=up * MBPS)
        g.add_edge("s0", tor, capacity=up * MBPS)
        for j, c in enumerate(rates):
            h = f"r{r}h{j}"
            hosts.append(h)
            g.add_node(h, kind="host")
            g.add_edge(h, tor, capacity=c * MBPS)
            g.add_edge(tor, h, capacity=c * MBPS)
    return g, hosts


def random_switch_tree(seed, num_switches=5, num_hosts=12):
    """Switches on a random tree, hosts on random switches, every direction its own rate:
    shortest paths are unique, so both formulations route alike."""
    rnd = random.Random(seed)
    g = nx.DiGraph()
    for s in range(num_switches):
        g.add_node(f"s{s}", kind="switch")
        if s:
            p, c = rnd.randrange(s), rnd.choice([10, 25, 50, 100, 400]) * MBPS
            g.add_edge(f"s{s}", f"s{p}", capacity=c * rnd.choice([0.5, 1, 2]))
            g.add_edge(f"s{p}", f"s{s}", capacity=c)
    for h in range(num_hosts):
        s, c = rnd.randrange(num_switches), rnd.choice([10, 40, 100, 1000]) * MBPS
        g.add_node(f"h{h}", kind="host")
        g.add_edge(f"h{h}", f"s{s}", capacity=c)
        g.add_edge(f"s{s}", f"h{h}", capacity=c * rnd.choice([0.5, 1, 2]))
    return g, [f"h{h}" for h in range(num_hosts)]


def racks_spec(r, h):
    net = RacksTopology(kind="racks", racks=r, hosts_per_rack=h, host_bw_mbps=100, oversubscription=4).resolve()
    return capacity_graph(net), list(net.hosts)


EXACT = {
    "lognormal star 9": lambda: lognormal_star(9),
    "lognormal star 16": lambda: lognormal_star(16),
    "lognormal star 16 seed 12": lambda: lognormal_star(16, seed=12),   # kept a tree under MIN_FRACTION (HiGHS 1.17)
    "uneven racks": uneven_racks,
    "racks 4x4": lambda: racks_spec(4, 4),
    "switch tree 1": lambda: random_switch_tree(1),
    "switch tree 2": lambda: random_switch_tree(2, num_switches=3, num_hosts=9),
    "racks with a core host": lambda: racks_with_core_host(3),
}


@pytest.mark.parametrize("name", EXACT)
def test_plan_rate_is_the_independent_lp_optimum(name):
    """The plan's rate and optimum equal analysis/bounds.py's arborescence-cut LP (another
    formulation, another solve) within 1e-6; it fits the links; and a tree under
    MIN_FRACTION is kept only where the other trees cannot reach the rate without it."""
    g, hosts = EXACT[name]()
    plan = plan_of(g, hosts)
    check_plan(plan, g, hosts)
    reference = forest_rate_bps(g, hosts)
    assert plan.optimum == pytest.approx(reference, rel=1e-6)
    assert plan.upper_bound == pytest.approx(reference, rel=1e-6)
    assert plan.rate == pytest.approx(reference, rel=1e-6)
    model = LinkModel.from_graph(nx.node_link_data(g, edges="links"), hosts)
    loads = [model.tree_load(tuple(sorted((min(v, p), max(v, p)) for v, p in enumerate(t.parent) if p >= 0)))
             for t in plan.trees]
    for k, t in enumerate(plan.trees):
        if t.fraction < MIN_FRACTION:
            others = np.stack(loads[:k] + loads[k + 1:], axis=1)
            assert _restricted_lp(model, others)[0].sum() < plan.rate * (1 - 1e-7), (name, t)


@pytest.mark.slow
@pytest.mark.parametrize("over", [4, 20])
def test_64_workers_on_4_racks_of_16_plan_the_optimum(over):
    """Ranks dealt round-robin across 4 racks of 16: dropping a small tree there left the others
    short of the rate by about the solver's tolerance, and the depth LP, asked whether they
    reach it, ended with HiGHS's model status Unknown. The plan now takes about a second and
    its rate is the independent LP's optimum."""
    net = RacksTopology(kind="racks", racks=4, hosts_per_rack=16, host_bw_mbps=100, oversubscription=over).resolve()
    g, hosts = capacity_graph(net), [f"r{r}h{j}" for j in range(16) for r in range(4)]
    t0 = time.perf_counter()
    plan = plan_of(g, hosts)
    assert time.perf_counter() - t0 < 30
    check_plan(plan, g, hosts)
    reference = forest_rate_bps(g, hosts)
    assert plan.optimum == pytest.approx(reference, rel=1e-7)
    assert plan.rate == pytest.approx(reference, rel=1e-6)


def test_a_forest_short_of_the_rate_by_the_tolerance_is_told_apart():
    """Two trees, each on its own link, the second link at 1 - 1e-6: together they reach
    2 - 1e-6, short of 2 by more than RATE_SLACK (None, from their own optimum: the depth LP
    is asked only about rates they reach), and at 2 - 1e-6 the depth LP gives up at most that."""
    a = np.array([[1.0, 0.0], [0.0, 1.0]])
    model = LinkModel((("x", "s"), ("s", "x")), np.array([1.0, 1.0 - 1e-6]), np.zeros((1, 1, 2)))
    assert _shallowest(model, a, np.array([1.0, 1.0]), 2.0) is None
    y = _shallowest(model, a, np.array([1.0, 1.0]), 2.0 - 1e-6)
    assert y.sum() == pytest.approx(2.0 - 1e-6, rel=2e-7)


def test_small_trees_go_unless_the_rate_needs_them():
    """Two links of capacity 1: trees A and B each load one, C (depth 0) both. At rate 2 the
    depth LP takes the 2e-7 of C the tolerance allows; A and B reach 2 alone, so C goes. With
    the second link at 5e-4, B's share is under MIN_FRACTION but the rate needs it: it stays."""
    a = np.array([[1.0, 0.0, 1.0], [0.0, 1.0, 1.0]])
    model = LinkModel((("x", "s"), ("s", "x")), np.array([1.0, 1.0]), np.zeros((1, 1, 2)))
    y = _few_trees(model, a, np.array([1.0, 1.0, 0.0]), 2.0)
    assert y[2] == 0 and y[:2] == pytest.approx([1, 1])
    model = LinkModel((("x", "s"), ("s", "x")), np.array([1.0, 5e-4]), np.zeros((1, 1, 2)))
    y = _few_trees(model, a[:, :2], np.array([1.0, 1.0]), 1 + 5e-4)
    assert y == pytest.approx([1, 5e-4]) and y[1] / y.sum() < MIN_FRACTION


@pytest.mark.parametrize("name", ["lognormal star 16", "racks 4x4", "uneven racks"])
def test_plan_is_deterministic(name):
    g, hosts = EXACT[name]()
    data = nx.node_link_data(g, edges="links")
    a, b = plan_forest(data, hosts), plan_forest(json.loads(json.dumps(data)), hosts)
    assert a == b and a.digest() == b.digest()


def test_plan_is_deterministic_and_json_round_trips():
    g, hosts = star_graph([100, 40, 100, 10, 60])
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
    g, hosts = star_graph([100] * 4, up=[10] * 4)
    plan = plan_of(g, hosts)
    check_plan(plan, g, hosts)
    assert plan.optimum == pytest.approx(star_opt([10] * 4), rel=1e-6)


def test_edge_cases():
    one = plan_forest(None, ["h0"])
    assert len(one.trees) == 1 and one.trees[0].parent == (-1,) and math.isinf(one.rate)
    json.dumps(one.to_dict(), allow_nan=False)
    none = plan_forest(None, ["a", "b", "c"])                    # no topology: uniform star
    assert none.assumed_topology and none.optimum == pytest.approx(3 / 4)
    g, _ = star_graph([100])
    shared = plan_of(g, ["h0", "h0", "h0"])                       # all on one host: no link binds
    assert shared.assumed_topology
    g, hosts = star_graph([100, 100])
    with pytest.raises(ValueError, match="'nowhere' is not in the capacity graph"):
        plan_of(g, ["h0", "nowhere"])
    # Two workers per host: their tree edge crosses no link; each host carries one edge.
    g, _ = star_graph([100, 10])
    plan = plan_of(g, ["h0", "h0", "h1", "h1"])
    check_plan(plan, g, ["h0", "h0", "h1", "h1"])
    assert plan.optimum == pytest.approx(10 * MBPS, rel=1e-6)
