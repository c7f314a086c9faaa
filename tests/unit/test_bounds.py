"""Analytic bounds on small graphs whose answers are known by hand, and the forest LP of
analysis/bounds.py (an independent formulation) against the planner's optimum.

Closed forms (c_i: host i's link rate, the smaller of its two directions; n workers; G
gradient bytes; a rate R means G * 8 / R seconds):
- forest on a star: a tree loads host i's link with its degree d_i >= 1, degrees sum to
  2(n-1), and every such degree sequence is a tree's, so R = min(min c_i, sum c_i / (2(n-1)));
- best ring on a star: every host link carries 2(n-1)/n G each way, R = n min c_i / (2(n-1));
- cut: the cheapest split; on a star, a single host: R = min c_i (or a set of hosts whose
  links sum to less than the rest's, which never binds below).
"""
from __future__ import annotations

import itertools
import math
import random

import networkx as nx
import pytest

from analysis.bounds import (
    EXHAUSTIVE_CUT_HOSTS,
    MAX_LP_HOSTS,
    best_ring_bound_s,
    bound_model,
    cut_bound_s,
    cut_splits,
    forest_bound_s,
    forest_rate_bps,
    ps_bound_s,
    ring_bound_s,
    ring_order,
)
from emu.config.capacity import capacity_graph
from emu.config.topospec import RacksTopology
from schedulers.collective.forest_plan import lp_optimum
from schedulers.collective.ring import SEARCH_MAX_WORKERS, depth_first_order
from schedulers.collective.ring import ring_order as scheduler_ring_order
from schedulers.core.linkmodel import LinkModel
from schedulers.registry import infos
from tests.factories import MBPS, G, racks_graph, secs, star_capacity, star_graph


# --------------------------------------------------------------------------- the fixed patterns
def test_ps_bound_is_the_busiest_link():
    g = star_capacity({"ps": 100, "w0": 50, "w1": 10})
    # w1's link carries G each way at 10 Mb/s; the server's carries 2G at 100 Mb/s.
    assert ps_bound_s(g, ["w0", "w1"], ["ps"], G) == pytest.approx(G * 8 / 10e6)
    g = star_capacity({"ps": 10, "w0": 100, "w1": 100})
    assert ps_bound_s(g, ["w0", "w1"], ["ps"], G) == pytest.approx(2 * G * 8 / 10e6)
    # two servers split the load
    g = star_capacity({"p0": 10, "p1": 10, "w0": 100, "w1": 100})
    assert ps_bound_s(g, ["w0", "w1"], ["p0", "p1"], G) == pytest.approx(G * 8 / 10e6)


def test_ring_and_cut_bounds_on_a_heterogeneous_star():
    g = star_capacity({"w0": 100, "w1": 100, "w2": 100, "w3": 10})
    n = 4
    assert ring_bound_s(g, ["w0", "w1", "w2", "w3"], G) == pytest.approx(2 * (n - 1) / n * G * 8 / 10e6)
    # The slow worker alone must send and receive G: the tightest cut.
    assert cut_bound_s(g, ["w0", "w1", "w2", "w3"], G) == pytest.approx(G * 8 / 10e6)


def test_cut_bound_sees_an_oversubscribed_rack_uplink():
    g = capacity_graph(RacksTopology.model_validate({"kind": "racks", "racks": 2, "hosts_per_rack": 2,
                                                     "host_bw_mbps": 100, "oversubscription": 4}).resolve())
    # The 50 Mb/s uplink separates the racks: G crosses it each way.
    assert cut_bound_s(g, ["r0h0", "r0h1", "r1h0", "r1h1"], G) == pytest.approx(G * 8 / 50e6)


def switch_tree(seed: int, num_switches: int, num_hosts: int) -> tuple[nx.DiGraph, list[str]]:
    """Switches on a random tree, hosts on random switches, every link direction its own rate."""
    rnd = random.Random(seed)
    g = nx.DiGraph()
    tree = nx.random_labeled_tree(num_switches, seed=seed)
    g.add_nodes_from((f"s{s}" for s in tree), kind="switch")
    links = [(f"s{a}", f"s{b}") for a, b in tree.edges]
    hosts = [f"h{i}" for i in range(num_hosts)]
    g.add_nodes_from(hosts, kind="host")
    links += [(h, f"s{rnd.randrange(num_switches)}") for h in hosts]
    for a, b in links:
        g.add_edge(a, b, capacity=rnd.choice([10, 25, 40, 100, 400]) * MBPS)
        g.add_edge(b, a, capacity=rnd.choice([10, 25, 40, 100, 400]) * MBPS)
    return g, hosts


@pytest.mark.parametrize("seed", range(6))
def test_link_splits_give_the_exhaustive_cut_bound_on_a_tree(seed):
    """On a tree the tightest split is one a single link makes (a minimal cut's every link
    direction, alone, separates a split at most as wide), so the host and link splits give
    the bound all 2^H - 2 splits give."""
    g, hosts = switch_tree(seed, num_switches=4 + seed % 3, num_hosts=8 + seed % 3)
    assert len(hosts) <= EXHAUSTIVE_CUT_HOSTS
    workers = hosts + hosts[:2]  # co-located workers count once
    assert len(cut_splits(g, hosts, exhaustive=False)) < len(cut_splits(g, hosts, exhaustive=True))
    assert cut_bound_s(g, workers, G, exhaustive=False) == pytest.approx(cut_bound_s(g, workers, G, exhaustive=True),
                                                                        rel=1e-12)


def test_cut_bound_sees_rack_uplinks_beyond_the_exhaustive_size():
    """64 hosts on 4 racks of 16 at 100 Mb/s, 20:1 (80 Mb/s uplinks): a rack against the rest,
    G over an uplink, is tighter than any single host (100 Mb/s)."""
    net = RacksTopology(kind="racks", racks=4, hosts_per_rack=16, host_bw_mbps=100, oversubscription=20).resolve()
    g, hosts = capacity_graph(net), list(net.hosts)
    assert cut_bound_s(g, hosts, G) == pytest.approx(secs(80), rel=1e-12)
    g.add_edge("s1", "s2", capacity=1e12)  # not a tree: the host splits alone, still a valid bound
    g.add_edge("s2", "s1", capacity=1e12)
    assert cut_bound_s(g, hosts, G) == pytest.approx(secs(100), rel=1e-12)


# --------------------------------------------------------------------------- models, by hand
def test_homogeneous_star_forest_optimum_is_two_thirds_of_the_cut_rate():
    """4 workers at 100 Mb/s: forest R = 4 * 100 / 6 = 66.7 Mb/s, the same as the ring's; the
    cut needs only G over one 100 Mb/s link. So a forest at its optimum has efficiency 1
    against its own model and 2(n-1)/n = 0.67 against the cut: what the forest sweep measured."""
    g, hosts = star_graph([100] * 4)
    assert forest_rate_bps(g, hosts) == pytest.approx(400 / 6 * MBPS, rel=1e-9)
    assert forest_bound_s(g, hosts, G) == pytest.approx(secs(400 / 6), rel=1e-9)
    assert best_ring_bound_s(g, hosts, G) == pytest.approx(secs(400 / 6), rel=1e-12)
    assert ring_bound_s(g, hosts, G) == pytest.approx(secs(400 / 6), rel=1e-12)
    assert cut_bound_s(g, hosts, G) == pytest.approx(secs(100), rel=1e-12)
    assert cut_bound_s(g, hosts, G) / forest_bound_s(g, hosts, G) == pytest.approx(2 / 3)


def test_star_with_two_slow_workers_forest_meets_the_cut_ring_does_not():
    """[100, 100, 10, 10]: forest R = min(10, 220/6) = 10 = the cut's; ring R = 4*10/6 = 6.7."""
    g, hosts = star_graph([100, 100, 10, 10])
    assert forest_bound_s(g, hosts, G) == pytest.approx(secs(10), rel=1e-9)
    assert cut_bound_s(g, hosts, G) == pytest.approx(secs(10), rel=1e-12)
    assert best_ring_bound_s(g, hosts, G) == pytest.approx(secs(40 / 6), rel=1e-12)


def test_three_racks_with_oversubscribed_uplinks():
    """3 racks of 3 at 100 Mb/s, 4:1 uplinks (75 Mb/s). Forest: host links give
    16 R <= 9 * 100 (degrees sum to 16), and every tree has >= 2 edges between racks, each
    using two uplinks upward: 4 R <= 3 * 75; both say 56.25 Mb/s, and the LP reaches it.
    Best ring (rack by rack): each uplink direction carries one hop of 16/9 G: 75 * 9/16.
    Interleaved ranks (r0h0, r1h0, r2h0, r0h1, ...): every hop changes rack, three hops up
    each uplink: 75 * 9/48. Cut: one rack against the rest, G over its 75 Mb/s uplink."""
    g, hosts = racks_graph([3, 3, 3], 100, 75)
    assert forest_rate_bps(g, hosts) == pytest.approx(56.25 * MBPS, rel=1e-9)
    assert best_ring_bound_s(g, hosts, G) == pytest.approx(secs(75 * 9 / 16), rel=1e-12)
    interleaved = [f"r{r}h{j}" for j in range(3) for r in range(3)]
    assert ring_bound_s(g, interleaved, G) == pytest.approx(secs(75 * 9 / 48), rel=1e-12)
    assert ring_order(g, interleaved) == sorted(interleaved)  # rack by rack again, from r0h0
    assert best_ring_bound_s(g, interleaved, G) == pytest.approx(secs(75 * 9 / 16), rel=1e-12)
    assert cut_bound_s(g, hosts, G) == pytest.approx(secs(75), rel=1e-12)


@pytest.mark.parametrize("sizes,uplinks", [([2, 3], [40, 25]), ([1, 2, 3], [30, 60, 20]), ([3, 2, 1, 1], 35)])
def test_depth_first_ring_is_the_best_of_every_order(sizes, uplinks):
    """On a tree the depth-first order is optimal: checked against all (n-1)! orders."""
    g, hosts = racks_graph(sizes, 100, uplinks)
    brute = min(ring_bound_s(g, [hosts[0], *rest], G) for rest in itertools.permutations(hosts[1:]))
    assert best_ring_bound_s(g, list(reversed(hosts)), G) == pytest.approx(brute, rel=1e-12)


def test_depth_first_order_is_as_good_as_the_schedulers_search():
    """ring's `order: topology`: up to SEARCH_MAX_WORKERS it tries every order; its depth-first
    order, used beyond, reaches the same rate on trees (co-located workers included)."""
    for seed in range(8):
        g, hosts = switch_tree(seed, num_switches=3 + seed % 3, num_hosts=SEARCH_MAX_WORKERS - 1 - seed % 4)
        workers = [hosts[i] for i in random.Random(seed).sample(range(len(hosts)), len(hosts))]
        if seed % 2:
            workers[-1] = workers[1]
        topology = nx.node_link_data(g, edges="links")
        model = LinkModel.from_graph(topology, workers)
        dfs = depth_first_order(topology, workers)
        assert sorted(dfs) == list(range(len(workers))) and dfs[0] == 0
        searched = scheduler_ring_order(topology, workers, "topology")
        assert model.ring_rate_of(dfs) == pytest.approx(model.ring_rate_of(searched), rel=1e-12), seed


@pytest.mark.parametrize("racks,per_rack,over", [(2, 8, 4), (4, 5, 1), (4, 16, 20)])
def test_topology_ring_beyond_the_search_meets_the_best_ring_bound(racks, per_rack, over):
    """Beyond SEARCH_MAX_WORKERS ring's `order: topology` is the depth-first order: its ring
    bound is analysis's best_ring_bound_s, far better than the interleaved rank order where
    uplinks are oversubscribed."""
    g, workers = spread_racks(racks, per_rack, over)
    order = scheduler_ring_order(nx.node_link_data(g, edges="links"), workers, "topology")
    assert len(workers) > SEARCH_MAX_WORKERS and sorted(order) == list(range(len(workers)))
    ring = ring_bound_s(g, [workers[i] for i in order], G)
    assert ring == pytest.approx(best_ring_bound_s(g, workers, G), rel=1e-12)
    if over == 1:  # full bisection: host links bind in every order, and rank order is kept
        assert order == list(range(len(workers)))
    else:
        assert ring < ring_bound_s(g, workers, G) / 2


def test_every_ring_and_forest_bound_is_at_least_the_cut():
    rnd = random.Random(7)
    for _ in range(5):
        g, hosts = racks_graph([2, 3, 2], 100, [rnd.choice([10, 40, 90]) for _ in range(3)])
        for e in g.edges:
            g.edges[e]["capacity"] *= rnd.choice([0.2, 1, 3])
        cut = cut_bound_s(g, hosts, G)
        assert best_ring_bound_s(g, hosts, G) >= cut * (1 - 1e-12)
        assert forest_bound_s(g, hosts, G) >= cut * (1 - 1e-9)
        assert ring_bound_s(g, hosts, G) >= best_ring_bound_s(g, hosts, G) * (1 - 1e-12)


def test_models_of_the_schedulers():
    hosts, declared = [f"h{i}" for i in range(4)], {n: i.bound_model for n, i in infos().items()}
    assert [bound_model(declared.get(s), hosts, ["ps"]) for s in ("fifo", "mercury", "ring", "gloo", "forest", "new")
            ] == ["parameter_server", "parameter_server", "ring_allreduce", "ring_allreduce", "tree_packing", "cut"]
    assert bound_model("tree_packing", [f"h{i}" for i in range(MAX_LP_HOSTS + 1)], []) == "cut"
    assert bound_model("tree_packing", ["h0"] * (MAX_LP_HOSTS + 1), []) == "tree_packing"  # hosts count, not workers


def test_forest_edge_cases():
    g, _ = star_graph([100, 10])
    assert math.isinf(forest_rate_bps(g, ["h0"])) and forest_bound_s(g, ["h0", "h0"], G) == 0.0
    # two workers per host: only the host links constrain, one tree edge between the hosts
    assert forest_rate_bps(g, ["h0", "h0", "h1", "h1"]) == pytest.approx(10 * MBPS, rel=1e-9)
    with pytest.raises(ValueError, match="more than"):
        forest_rate_bps(*star_graph([100] * (MAX_LP_HOSTS + 1)))


# --------------------------------------------------------------------------- against the planner
def planner_optimum(g: nx.DiGraph, hosts: list[str]) -> float:
    return lp_optimum(LinkModel.from_graph(nx.node_link_data(g, edges="links"), hosts))[0]


def agreement_graphs():
    """(name, graph, workers): stars, racks, asymmetric and contended graphs."""
    for n in (2, 3, 5, 8):
        yield f"uniform star {n}", *star_graph([100] * n)
    for rates in ([100, 100, 10, 10], [100, 100, 100, 10], [1000, 100, 100, 10, 1000, 100, 10, 100],
                  [100, 40, 100, 10, 60]):
        yield f"star {rates}", *star_graph(rates)
    yield "asymmetric star", *star_graph([100, 50, 80, 20], up=[10, 60, 30, 90])
    yield "3x3 racks 4:1", *racks_graph([3, 3, 3], 100, 75)
    yield "2x4 racks 16:1", *racks_graph([4, 4], 100, 25)
    yield "uneven racks", *racks_graph([1, 2, 4], 100, [30, 70, 45])
    g, hosts = racks_graph([3, 3, 3], 100, 75)
    g.edges[("s1", "s0")]["capacity"] = g.edges[("s0", "s2")]["capacity"] = 25 * MBPS
    yield "3x3 racks, 50 Mb/s tenant across two", g, hosts
    for seed in range(1, 9):  # seeds 4-8: continuous rates, so the optimum is mostly below every cut
        rnd = random.Random(seed)
        g, hosts = racks_graph([2, 3, 2] if seed > 3 else [2, 2, 2], 100, 100)
        for e in g.edges:
            g.edges[e]["capacity"] *= rnd.choice([0.1, 0.5, 1, 2]) if seed <= 3 else rnd.uniform(0.5, 2)
        yield f"random racks seed {seed}", g, hosts
    yield "co-located workers", star_graph([100, 10, 40])[0], ["h0", "h0", "h1", "h2", "h2"]


def spread_racks(racks: int, per_rack: int, over: int) -> tuple[nx.DiGraph, list[str]]:
    """Racks of 100 Mb/s hosts, ranks dealt round-robin across the racks (the worst given order)."""
    net = RacksTopology(kind="racks", racks=racks, hosts_per_rack=per_rack, host_bw_mbps=100,
                        oversubscription=over).resolve()
    return capacity_graph(net), [f"r{r}h{j}" for j in range(per_rack) for r in range(racks)]


@pytest.mark.slow
def test_forest_lp_at_64_hosts():
    """4 racks of 16 hosts, ranks dealt round-robin, 4:1 and 20:1 uplinks: the LP solves in
    about a second and meets the planner's optimum."""
    for over in (4, 20):
        g, hosts = spread_racks(4, 16, over)
        assert len(hosts) <= MAX_LP_HOSTS
        assert forest_rate_bps(g, hosts) == pytest.approx(planner_optimum(g, hosts), rel=1e-7)


def test_forest_lp_agrees_with_the_planners_optimum():
    """Two formulations of one LP: analysis/bounds.py's arborescence cuts and the planner's
    column generation with an MST oracle. Max relative difference over these graphs < 1e-7."""
    worst = 0.0
    for name, g, hosts in agreement_graphs():
        ours, theirs = forest_rate_bps(g, hosts), planner_optimum(g, hosts)
        worst = max(worst, abs(ours - theirs) / theirs)
        assert ours == pytest.approx(theirs, rel=1e-7), name
    assert worst < 1e-7
