"""Topology generators that vary heterogeneity as one number: racks (uneven sizes, uplink and
host spreads, tenant hosts), sites (WAN links per site or spread) and the star's `spread`.
Resolved NetSpecs, the documented ratios, clean config errors, capacity graph and forest plan."""
from __future__ import annotations

import copy
import math
import re

import pandas as pd
import pytest

from analysis.tables import key_label
from emu.config.capacity import capacity_graph, graph_to_json
from emu.config.experiment import ConfigError
from emu.config.plan import load_plan
from emu.config.topospec import IFNAMSIZ, NetSpec, RacksTopology, SitesTopology, StarTopology
from schedulers.collective.forest_plan import plan_forest
from tasks import _sections
from tests.conftest import REPO
from tests.factories import GOOD, write

NODE_NAME = re.compile(r"^[a-z][a-z0-9]{0,9}$")


def racks(**kw) -> NetSpec:
    return RacksTopology.model_validate({"kind": "racks", **kw}).resolve()


def sites(**kw) -> NetSpec:
    return SitesTopology.model_validate({"kind": "sites", **kw}).resolve()


def rates(net: NetSpec, links: list[tuple[str, str]]) -> list[float]:
    """Both directions of each link must have the same rate; the list of those rates."""
    out = []
    for a, b in links:
        assert net.rate(a, b) == net.rate(b, a)
        out.append(net.rate(a, b))
    return out


# ---------------------------------------------------------------------------- racks

def test_racks_one_size_is_unchanged():
    """The old form resolves as before: host links at the configured rate, uplinks by the rule."""
    net = racks(racks=2, hosts_per_rack=2, host_bw_mbps=10.12345, oversubscription=3)
    assert net.hosts == ["r0h0", "r0h1", "r1h0", "r1h1"] and net.switches == ["s1", "s2", "s0"]
    assert [(ln.a, ln.b) for ln in net.links] == [("r0h0", "s1"), ("r0h1", "s1"), ("s1", "s0"),
                                                  ("r1h0", "s2"), ("r1h1", "s2"), ("s2", "s0")]
    assert rates(net, [("r0h0", "s1"), ("r1h1", "s2")]) == [10.12345, 10.12345]
    assert rates(net, [("s1", "s0"), ("s2", "s0")]) == [6.749, 6.749]
    # run ids leave out None: a racks config without the new fields hashes as before
    old = {"kind": "racks", "racks": 2, "hosts_per_rack": 2, "host_bw_mbps": 10}
    dumped = RacksTopology.model_validate(old).model_dump(mode="json", exclude_none=True)
    assert set(dumped) == set(old) | {"oversubscription", "queue_ms"}


def test_racks_uneven_sizes():
    net = racks(racks=3, hosts_per_rack=[1, 3, 2], host_bw_mbps=10, oversubscription=2)
    assert net.hosts == ["r0h0", "r1h0", "r1h1", "r1h2", "r2h0", "r2h1"]
    assert net.switches == ["s1", "s2", "s3", "s0"]
    assert {net.rate(h, f"s{int(h[1]) + 1}") for h in net.hosts} == {10}
    # each rack's uplink: its own host count x 10 / 2
    assert rates(net, [("s1", "s0"), ("s2", "s0"), ("s3", "s0")]) == [5, 15, 10]


def test_racks_single_rack_has_no_core():
    net = racks(racks=1, hosts_per_rack=[3], host_bw_mbps=10, uplink_spread=5)
    assert net.switches == ["s1"] and len(net.links) == 3


def test_uplink_spread_is_geometric_from_full_to_one_over_spread():
    net = racks(racks=3, hosts_per_rack=2, host_bw_mbps=100, uplink_spread=4)
    assert rates(net, [("s1", "s0"), ("s2", "s0"), ("s3", "s0")]) == [200, 100, 50]
    five = racks(racks=5, hosts_per_rack=1, host_bw_mbps=100, uplink_spread=10, oversubscription=2)
    up = rates(five, [(f"s{r + 1}", "s0") for r in range(5)])
    assert up == [round(50 * 10 ** (-r / 4), 3) for r in range(5)]
    assert up[0] == 50 and up[-1] == 5


def test_host_spread_over_all_workers_first_fastest():
    net = racks(racks=2, hosts_per_rack=3, host_bw_mbps=100, host_spread=10)
    tors = {h: f"s{int(h[1]) + 1}" for h in net.hosts}
    got = [net.rate(h, tors[h]) for h in net.hosts]
    assert got == [round(100 * 10 ** (-k / 5), 3) for k in range(6)]
    assert got[0] == 100 and got[-1] == 10
    assert all(math.isclose(a / b, 10 ** 0.2, rel_tol=1e-3) for a, b in zip(got, got[1:]))
    # the uplink rule counts host_bw_mbps, not the spread rates
    assert rates(net, [("s1", "s0"), ("s2", "s0")]) == [300, 300]


def test_tenants_hang_off_the_tor_and_do_not_count_for_uplinks():
    net = racks(racks=2, hosts_per_rack=2, host_bw_mbps=10, tenants_per_rack=2, host_spread=4)
    assert net.hosts == ["r0h0", "r0h1", "r1h0", "r1h1", "r0t0", "r0t1", "r1t0", "r1t1"]
    assert rates(net, [("r0t0", "s1"), ("r0t1", "s1"), ("r1t0", "s2"), ("r1t1", "s2")]) == [10] * 4
    assert net.rate("r1h1", "s2") == 2.5   # host_spread over the workers only
    assert rates(net, [("s1", "s0"), ("s2", "s0")]) == [20, 20]


# ---------------------------------------------------------------------------- sites

def test_sites_with_a_wan_rate_per_site():
    net = sites(sites=3, hosts_per_site=[2, 3, 1], host_bw_mbps=100, wan_mbps=[100, 50, 10], tenants_per_site=1)
    assert net.hosts == ["d0h0", "d0h1", "d1h0", "d1h1", "d1h2", "d2h0", "d0t0", "d1t0", "d2t0"]
    assert net.switches == ["s1", "s2", "s3", "s0"]
    assert rates(net, [("s1", "s0"), ("s2", "s0"), ("s3", "s0")]) == [100, 50, 10]
    assert rates(net, [("d1h2", "s2"), ("d2t0", "s3")]) == [100, 100]
    assert net.needs_netem() == []


def test_wan_spread_and_wan_delay():
    net = sites(sites=3, hosts_per_site=2, host_bw_mbps=100, wan_mbps=100, wan_spread=10, wan_delay_ms=25,
                loss_pct=0.5)
    assert rates(net, [("s1", "s0"), ("s2", "s0"), ("s3", "s0")]) == [100, round(100 / math.sqrt(10), 3), 10]
    wan = [ln for ln in net.links if ln.b == "s0"]
    lan = [ln for ln in net.links if ln.b != "s0"]
    assert {ln.delay_ms for ln in wan} == {25} and {ln.delay_ms for ln in lan} == {None}
    assert {ln.loss_pct for ln in net.links} == {0.5}   # LinkOptions apply to every link
    assert len(net.needs_netem()) == len(net.links)
    # without wan_delay_ms, WAN links take delay_ms like every other link
    plain = sites(sites=2, hosts_per_site=1, host_bw_mbps=10, wan_mbps=5, delay_ms=3)
    assert {ln.delay_ms for ln in plain.links} == {3}


def test_largest_names_fit_node_names_and_interfaces():
    for net in (sites(sites=16, hosts_per_site=32, tenants_per_site=32, host_bw_mbps=10, wan_mbps=10),
                racks(racks=16, hosts_per_rack=32, tenants_per_rack=32, host_bw_mbps=10)):
        assert len(net.hosts) == 1024
        assert all(NODE_NAME.match(n) for n in net.hosts + net.switches)
        ports: dict[str, int] = {}
        for ln in net.links:
            for end in (ln.a, ln.b):
                ports[end] = ports.get(end, 0) + 1
        assert max(len(f"{n}-eth{p}") for n, p in ports.items()) <= IFNAMSIZ


# ---------------------------------------------------------------------------- star

def test_star_spread_ratio_and_mean_not_preserved():
    net = StarTopology.model_validate({"kind": "star", "count": 5, "bw_mbps": 100, "keep": ["h0"],
                                       "heterogeneity": {"kind": "spread", "ratio": 8}}).resolve()
    got = [net.rate(h, "s1") for h in net.hosts]
    assert got == [100, 100, 50, 25, 12.5] == [net.rate("s1", h) for h in net.hosts]
    assert sum(got[1:]) / 4 < 100
    flat = StarTopology.model_validate({"kind": "star", "count": 3, "bw_mbps": 7,
                                        "heterogeneity": {"kind": "spread", "ratio": 1}}).resolve()
    assert {flat.rate(h, "s1") for h in flat.hosts} == {7}


def test_star_spread_scales_listed_up_and_down_rates():
    net = StarTopology.model_validate({"kind": "star", "hosts": [
        {"name": "a", "up_mbps": 40, "down_mbps": 80}, {"name": "b", "up_mbps": 40, "down_mbps": 80}],
        "heterogeneity": {"kind": "spread", "ratio": 4}}).resolve()
    assert (net.rate("b", "s1"), net.rate("s1", "b")) == (10, 20)
    assert (net.rate("a", "s1"), net.rate("s1", "a")) == (40, 80)


def test_extreme_spreads_clip_to_the_minimum_rate():
    net = racks(racks=2, hosts_per_rack=2, host_bw_mbps=1, host_spread=1e300, uplink_spread=1e300)
    assert net.rate("r1h1", "s2") == 0.01 and net.rate("s2", "s0") == 0.01


# ---------------------------------------------------------------------------- config errors

RACKS = {"kind": "racks", "racks": 3, "hosts_per_rack": 2, "host_bw_mbps": 10}
SITES = {"kind": "sites", "sites": 3, "hosts_per_site": 2, "host_bw_mbps": 10, "wan_mbps": 5}
STAR = {"kind": "star", "count": 4, "bw_mbps": 10}
SERVER = {"racks": "r0h0", "sites": "d0h0", "star": "h0"}

BAD = [
    ({**RACKS, "hosts_per_rack": [2, 2]},
     "topology.hosts_per_rack: a list of 2 for 3 racks; give one per rack, or one value for all"),
    ({**RACKS, "hosts_per_rack": [2, 0, 1]}, "topology.hosts_per_rack[1]: must be >= 1"),
    ({**RACKS, "hosts_per_rack": [2, 2, 65]}, "topology.hosts_per_rack[2]: must be <= 64"),
    ({**RACKS, "hosts_per_rack": "many"}, "topology.hosts_per_rack: must be an integer, got 'many'"),
    ({**RACKS, "hosts_per_rack": []}, "topology.hosts_per_rack: must have at least 1 item(s)"),
    ({**RACKS, "hosts_per_rack": [1, "x", 1]}, "topology.hosts_per_rack[1]: must be an integer, got 'x'"),
    ({**RACKS, "uplink_spread": 0.5}, "topology.uplink_spread: must be >= 1"),
    ({**RACKS, "host_spread": 0}, "topology.host_spread: must be >= 1"),
    ({**RACKS, "tenants_per_rack": -1}, "topology.tenants_per_rack: must be >= 0"),
    ({**RACKS, "racks": 16, "hosts_per_rack": 64, "tenants_per_rack": 1},
     "topology.tenants_per_rack: 1024 hosts and 16 tenant hosts are 1040; at most 1024"),
    ({**SITES, "sites": 1}, "topology.sites: must be >= 2"),
    ({**SITES, "sites": 17}, "topology.sites: must be <= 16"),
    ({**SITES, "hosts_per_site": [1, 2, 3, 4]},
     "topology.hosts_per_site: a list of 4 for 3 sites; give one per site, or one value for all"),
    ({**SITES, "wan_mbps": [10, 20]},
     "topology.wan_mbps: a list of 2 for 3 sites; give one per site, or one value for all"),
    ({**SITES, "wan_mbps": [10, -1, 5]}, "topology.wan_mbps[1]: must be > 0"),
    ({**SITES, "wan_mbps": 0}, "topology.wan_mbps: must be > 0"),
    ({**SITES, "wan_mbps": [10, 20, 30], "wan_spread": 2},
     "topology.wan_spread: applies to one wan_mbps; a list already gives each site's rate"),
    ({**SITES, "wan_spread": 0.9}, "topology.wan_spread: must be >= 1"),
    ({**SITES, "wan_delay_ms": -1}, "topology.wan_delay_ms: must be >= 0"),
    ({**SITES, "tenants_per_site": 65}, "topology.tenants_per_site: must be <= 64"),
    ({**SITES, "wan_mbps": 10, "wan_spred": 2}, "topology.wan_spred: unknown key"),
    ({**STAR, "heterogeneity": {"kind": "spread", "ratio": 0.5}}, "topology.heterogeneity.ratio: must be >= 1"),
    ({**STAR, "heterogeneity": {"kind": "spread"}}, "topology.heterogeneity.ratio: required field is missing"),
    ({**STAR, "heterogeneity": {"kind": "wide"}},
     "topology.heterogeneity.kind: unknown kind 'wide' (known: slow, lognormal, spread)"),
    ({"kind": "ring"}, "topology.kind: unknown kind 'ring' (known: star, racks, graph, sites)"),
]


@pytest.mark.parametrize("topology,message", BAD, ids=[m.split(":")[0] + f"-{i}" for i, (_, m) in enumerate(BAD)])
def test_bad_topology_is_one_clean_error(tmp_path, topology, message):
    cfg = copy.deepcopy(GOOD)
    cfg["topology"] = topology
    cfg["roles"] = {"servers": [SERVER.get(topology["kind"], "h0")], "workers": "rest"}
    with pytest.raises(ConfigError) as e:
        load_plan(write(tmp_path, cfg), _sections())
    assert str(e.value) == message


def test_sweeping_the_spread_is_one_grid_key(tmp_path):
    cfg = {**copy.deepcopy(GOOD), "topology": SITES, "roles": {"servers": ["d0h0"], "workers": "rest"},
           "grid": {"topology.wan_spread": [1, 10, 100]}}
    plan = load_plan(write(tmp_path, cfg), _sections())
    slowest = [e.topology.resolve().rate("s3", "s0") for e in plan.experiments]
    assert slowest == [5, 0.5, 0.05]
    assert key_label("topology.wan_spread", pd.DataFrame()) == "WAN rate spread (fastest/slowest)"


# ---------------------------------------------------------------------------- capacity graph and forest

THREE_RACKS = dict(racks=3, hosts_per_rack=[2, 3, 2], host_bw_mbps=100, oversubscription=2, uplink_spread=4,
                   host_spread=2, tenants_per_rack=1)
THREE_SITES = dict(sites=3, hosts_per_site=3, host_bw_mbps=100, wan_mbps=100, wan_spread=10, wan_delay_ms=10,
                   tenants_per_site=1)


@pytest.mark.parametrize("net", [racks(**THREE_RACKS), sites(**THREE_SITES)], ids=["racks", "sites"])
def test_capacity_graph_and_forest_plan(net):
    g = capacity_graph(net)
    assert g.number_of_nodes() == len(net.hosts) + len(net.switches)
    assert g.number_of_edges() == 2 * len(net.links)
    for ln in net.links:
        assert g[ln.a][ln.b]["capacity"] == ln.ab_mbps * 1e6 and g[ln.b][ln.a]["capacity"] == ln.ba_mbps * 1e6
    workers = [h for h in net.hosts if "t" not in h]
    plan = plan_forest(graph_to_json(g), workers)
    assert plan.hosts == tuple(workers) and plan.trees and not plan.assumed_topology
    assert plan.rate > 0
    assert math.isclose(sum(t.fraction for t in plan.trees), 1)


def test_sites_example_config():
    plan = load_plan(REPO / "configs" / "examples" / "sites.yaml", _sections())
    e = plan.experiments[0]
    net = e.topology.resolve()
    assert e.scheduler == "forest" and e.roles.workers == [f"d{d}h{j}" for d in range(3) for j in range(3)]
    assert rates(net, [("s1", "s0"), ("s2", "s0"), ("s3", "s0")]) == [100, 31.623, 10]
