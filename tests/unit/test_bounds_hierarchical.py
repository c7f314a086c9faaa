"""The hierarchical model of analysis/bounds.py on graphs whose answers are known by hand,
and its grouping against the scheduler's (analysis may not import schedulers).

Loads in units of G per link direction: a member's path to its leader and back carry 1
each way; each hop of the leaders' ring (rank order) carries 2(L-1)/L; every stage runs at
once, so a link's loads add up and the rate is min over links of capacity / load.
"""
from __future__ import annotations

import random

import networkx as nx
import pytest

from analysis.bounds import (
    MODELS,
    bound_model,
    cut_bound_s,
    hierarchical_bound_s,
    model_bound_s,
    worker_groups,
)
from schedulers.collective.hierarchical import groups
from schedulers.registry import infos
from tests.factories import MBPS, G, racks_graph, secs, star_graph


def test_two_uneven_racks_by_hand():
    """Racks of 3 and 2 at 100 Mb/s. Leader r0h0's link carries its 2 members' gradients in
    and averages out plus one ring hop each way (L = 2: 2(L-1)/L = 1): 3 G, 100/3 Mb/s.
    Leader r1h0's: 1 + 1 = 2 G (50 Mb/s); each uplink one hop each way: G."""
    g, hosts = racks_graph([3, 2], 100, [60, 50])
    assert worker_groups(g, hosts) == [[0, 1, 2], [3, 4]]
    assert hierarchical_bound_s(g, hosts, G) == pytest.approx(secs(100 / 3), rel=1e-12)
    g, hosts = racks_graph([3, 2], 100, [60, 30])  # now rack 1's uplink (G at 30 Mb/s) decides
    assert hierarchical_bound_s(g, hosts, G) == pytest.approx(secs(30), rel=1e-12)


def test_three_racks_ring_hops_and_interleaved_ranks():
    """Racks of 2 at 100 Mb/s, uplinks 40: L = 3, each ring hop 4/3 G and each uplink
    direction one hop: 40 * 3/4 = 30 Mb/s; a leader's link 1 + 4/3 = 7/3 G (42.9 Mb/s). Ranks
    interleaved across racks give the same groups, leaders and loads."""
    g, hosts = racks_graph([2, 2, 2], 100, 40)
    assert hierarchical_bound_s(g, hosts, G) == pytest.approx(secs(30), rel=1e-12)
    interleaved = [f"r{r}h{j}" for j in range(2) for r in range(3)]
    assert worker_groups(g, interleaved) == [[0, 3], [1, 4], [2, 5]]
    assert hierarchical_bound_s(g, interleaved, G) == pytest.approx(secs(30), rel=1e-12)
    g, hosts = racks_graph([2, 2, 2], 100, 1000)  # fast uplinks: the leaders' links decide
    assert hierarchical_bound_s(g, hosts, G) == pytest.approx(secs(100 * 3 / 7), rel=1e-12)


def test_a_group_of_one_and_a_single_group():
    """[1, 2] racks: r0h0 leads alone (one ring hop each way, G); r1h0 carries its member
    and a hop: 2 G, 50 Mb/s. One switch: a star around worker 0, whose link carries the
    n-1 others' gradients in and the average out n-1 times."""
    g, hosts = racks_graph([1, 2], 100, 100)
    assert worker_groups(g, hosts) == [[0], [1, 2]]
    assert hierarchical_bound_s(g, hosts, G) == pytest.approx(secs(50), rel=1e-12)
    g, hosts = star_graph([100] * 4)
    assert hierarchical_bound_s(g, hosts, G) == pytest.approx(secs(100 / 3), rel=1e-12)
    g, hosts = star_graph([100, 10, 100])  # a slow member: G each way over its 10 Mb/s
    assert hierarchical_bound_s(g, hosts, G) == pytest.approx(secs(10), rel=1e-12)


def test_co_located_workers_and_one_worker():
    g, _ = star_graph([100, 100])
    assert worker_groups(g, ["h0", "h0", "h1"]) == [[0, 1, 2]]
    # worker 1 shares the leader's host: no link; worker 2 moves G each way over 100 Mb/s
    assert hierarchical_bound_s(g, ["h0", "h0", "h1"], G) == pytest.approx(secs(100), rel=1e-12)
    assert hierarchical_bound_s(g, ["h0"], G) == 0.0 and hierarchical_bound_s(g, ["h0", "h0"], G) == 0.0


def test_model_of_the_scheduler():
    g, hosts = racks_graph([3, 2], 100, [60, 50])
    declared = infos()["hierarchical"].bound_model
    assert bound_model(declared, hosts, []) == declared == "hierarchical_allreduce" and declared in MODELS
    assert model_bound_s(declared, g, hosts, [], G) == hierarchical_bound_s(g, hosts, G)


def test_never_below_the_cut():
    rnd = random.Random(3)
    for _ in range(5):
        g, hosts = racks_graph([2, 3, 1], 100, [rnd.choice([10, 40, 90]) for _ in range(3)])
        for e in g.edges:
            g.edges[e]["capacity"] *= rnd.choice([0.2, 1, 3])
        assert hierarchical_bound_s(g, hosts, G) >= cut_bound_s(g, hosts, G) * (1 - 1e-12)


def test_grouping_agrees_with_the_scheduler():
    """One graph, both implementations: racks of uneven size, ranks interleaved, two workers
    on one host, a host hanging off the core switch, and a host off no switch."""
    g, hosts = racks_graph([3, 2, 1], 100, 50, extra=[("x0", 0, 100)])
    g.add_node("c0", kind="host")
    g.add_edge("c0", "s0", capacity=MBPS)
    g.add_edge("s0", "c0", capacity=MBPS)
    g.add_node("lone", kind="host")
    g.add_edge("lone", "r2h0", capacity=MBPS)
    workers = ["r1h0", "r0h2", "c0", "r2h0", "r0h0", "r1h1", "x0", "r0h2", "lone", "r0h1"]
    ours = worker_groups(g, workers)
    assert ours == [[0, 5], [1, 4, 6, 7, 9], [2], [3], [8]]
    assert groups(nx.node_link_data(g, edges="links"), workers) == ours
