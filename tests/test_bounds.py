"""Analytic bounds on small graphs whose answers are known by hand."""
from __future__ import annotations

import pytest

from analysis.bounds import cut_bound_s, ps_bound_s, ring_bound_s
from emu.topology import capacity_graph
from emu.topospec import RacksTopology, StarTopology

G = 1e6  # gradient bytes


def star(rates):
    return capacity_graph(StarTopology.model_validate({"kind": "star", "hosts": [
        {"name": n, "bw_mbps": r} for n, r in rates.items()]}).resolve())


def test_ps_bound_is_the_busiest_link():
    g = star({"ps": 100, "w0": 50, "w1": 10})
    # w1's link carries G each way at 10 Mb/s; the server's carries 2G at 100 Mb/s.
    assert ps_bound_s(g, ["w0", "w1"], ["ps"], G) == pytest.approx(G * 8 / 10e6)
    g = star({"ps": 10, "w0": 100, "w1": 100})
    assert ps_bound_s(g, ["w0", "w1"], ["ps"], G) == pytest.approx(2 * G * 8 / 10e6)
    # two servers split the load
    g = star({"p0": 10, "p1": 10, "w0": 100, "w1": 100})
    assert ps_bound_s(g, ["w0", "w1"], ["p0", "p1"], G) == pytest.approx(G * 8 / 10e6)


def test_ring_and_cut_bounds_on_a_heterogeneous_star():
    g = star({"w0": 100, "w1": 100, "w2": 100, "w3": 10})
    n = 4
    assert ring_bound_s(g, ["w0", "w1", "w2", "w3"], G) == pytest.approx(2 * (n - 1) / n * G * 8 / 10e6)
    # The slow worker alone must send and receive G: the tightest cut.
    assert cut_bound_s(g, ["w0", "w1", "w2", "w3"], G) == pytest.approx(G * 8 / 10e6)


def test_cut_bound_sees_an_oversubscribed_rack_uplink():
    g = capacity_graph(RacksTopology.model_validate({"kind": "racks", "racks": 2, "hosts_per_rack": 2,
                                                     "host_bw_mbps": 100, "oversubscription": 4}).resolve())
    # The 50 Mb/s uplink separates the racks: G crosses it each way.
    assert cut_bound_s(g, ["r0h0", "r0h1", "r1h0", "r1h1"], G) == pytest.approx(G * 8 / 50e6)
