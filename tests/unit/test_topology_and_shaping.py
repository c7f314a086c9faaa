"""Topology kinds, heterogeneity generators, schedules and traces: logic and bad input."""
from __future__ import annotations

import copy

import pytest
import yaml

from emu.config.capacity import capacity_graph
from emu.config.experiment import ConfigError
from emu.config.plan import load_plan
from emu.config.shaping import LinkShaping
from emu.config.topospec import GraphTopology, RacksTopology
from emu.testbed import capabilities, preflight
from tasks import _sections
from tests.factories import GOOD, star_spec


def test_star_generated_with_slow_hosts():
    net = star_spec(count=5, bw_mbps=100, heterogeneity={"kind": "slow", "count": 2, "factor": 0.1}, keep=["h0"])
    assert net.hosts == ["h0", "h1", "h2", "h3", "h4"]
    assert [net.rate(h, "s1") for h in net.hosts] == [100, 100, 100, 10, 10]
    assert [net.rate("s1", h) for h in net.hosts] == [100, 100, 100, 10, 10]


def test_lognormal_heterogeneity_is_seeded_and_mean_preserving():
    a = star_spec(count=200, bw_mbps=100, heterogeneity={"kind": "lognormal", "sigma": 0.5, "seed": 7})
    b = star_spec(count=200, bw_mbps=100, heterogeneity={"kind": "lognormal", "sigma": 0.5, "seed": 7})
    flat = star_spec(count=4, bw_mbps=100, heterogeneity={"kind": "lognormal", "sigma": 0, "seed": 7})
    rates = [a.rate(h, "s1") for h in a.hosts]
    assert rates == [b.rate(h, "s1") for h in b.hosts]
    assert {flat.rate(h, "s1") for h in flat.hosts} == {100}
    assert len(set(rates)) > 150
    assert abs(sum(rates) / len(rates) - 100) < 10  # E[exp(sZ - s^2/2)] = 1


def test_racks_and_capacity_graph():
    net = RacksTopology.model_validate({"kind": "racks", "racks": 3, "hosts_per_rack": 4, "host_bw_mbps": 10,
                                        "oversubscription": 2}).resolve()
    assert len(net.hosts) == 12 and net.switches == ["s1", "s2", "s3", "s0"]
    g = capacity_graph(net)
    assert g["s2"]["s0"]["capacity"] == 20e6 and g["r2h3"]["s3"]["capacity"] == 10e6
    assert g.nodes["s0"]["kind"] == "switch" and g.nodes["r0h0"]["kind"] == "host"


def test_graph_per_direction():
    net = GraphTopology.model_validate({"kind": "graph", "nodes": [
        {"name": "a", "kind": "host"}, {"name": "b", "kind": "host"}, {"name": "s1", "kind": "switch"}],
        "links": [{"a": "a", "b": "s1", "ab_mbps": 5, "ba_mbps": 50}, {"a": "b", "b": "s1", "bw_mbps": 20}]}).resolve()
    assert net.rate("a", "s1") == 5 and net.rate("s1", "a") == 50 and net.rate("b", "a") is None


def cfg(**changes):
    c = copy.deepcopy(GOOD)
    c.update(changes)
    return c


GRAPH = {"kind": "graph", "nodes": [{"name": "ps", "kind": "host"}, {"name": "w0", "kind": "host"},
                                    {"name": "w1", "kind": "host"}, {"name": "s1", "kind": "switch"},
                                    {"name": "s2", "kind": "switch"}, {"name": "s3", "kind": "switch"}],
         "links": [{"a": "ps", "b": "s1", "bw_mbps": 10}, {"a": "w0", "b": "s1", "bw_mbps": 10},
                   {"a": "w1", "b": "s2", "bw_mbps": 10}, {"a": "s1", "b": "s2", "bw_mbps": 10}]}


def graph(**edit):
    g = copy.deepcopy(GRAPH)
    for k, v in edit.items():
        g[k] = v(g[k])
    return g


BAD = [
    (cfg(topology=graph(links=lambda ls: ls + [{"a": "s2", "b": "s9", "bw_mbps": 1}])),
     "topology.links[4].b: unknown node 's9'"),
    (cfg(topology=graph(links=lambda ls: ls[:3])), "topology.links: the graph is disconnected: s3 cannot reach"),
    (cfg(topology=graph(links=lambda ls: ls + [{"a": "s2", "b": "s3", "bw_mbps": 1},
                                               {"a": "s3", "b": "s1", "bw_mbps": 1}])),
     "topology.links: switches form a loop"),
    (cfg(topology=graph(links=lambda ls: ls + [{"a": "w0", "b": "s2", "bw_mbps": 1},
                                               {"a": "s3", "b": "s1", "bw_mbps": 1}])),
     "topology.nodes: host 'w0' has 2 links"),
    (cfg(topology={"kind": "star", "count": 3, "bw_mbps": 10, "heterogeneity": {"kind": "slow", "count": 5}}),
     "topology.heterogeneity.count: 5 slow hosts, but only 3 hosts to slow down"),
    (cfg(topology={"kind": "star", "hosts": [{"name": "ps", "up_mbps": 5}, {"name": "w0", "bw_mbps": 5}]}),
     "topology.hosts[0]: give bw_mbps, or both up_mbps and down_mbps"),
    (cfg(shaping=[{"link": ["w0", "w1"], "schedule": {"kind": "steps", "steps": [[0, 5]]}}]),
     "shaping[0].link: no link w0 -> w1 in the topology"),
    (cfg(shaping=[{"link": ["w0", "s1"], "schedule": {"kind": "steps", "steps": [[0, 5], [3, 0]]}}]),
     "shaping[0].schedule.steps[1]: a final rate of 0 would stall the run until its timeout"),
    (cfg(shaping=[{"link": ["w0", "s1"], "schedule": {"kind": "steps", "steps": [[2, 5], [1, 6]]}}]),
     "shaping[0].schedule.steps[1]: times must increase (1 after 2)"),
    (cfg(shaping=[{"link": ["w0", "s1"], "schedule": {"kind": "sine"}}]),
     "shaping[0].schedule.kind: unknown kind 'sine' (known: steps, square, onoff, mahimahi, csv)"),
    (cfg(cross_traffic=[{"src": "x9", "dst": "w0"}]), "cross_traffic[0].src: 'x9' is not a host of the topology"),
    (cfg(cross_traffic=[{"src": "w1", "dst": "w0", "protocol": "udp"}]),
     "cross_traffic[0].rate_mbps: a UDP flow needs a rate (iperf3 would send 1 Mb/s)"),
]


@pytest.mark.parametrize("raw,message", BAD, ids=[m.split(":")[0] + str(i) for i, (_, m) in enumerate(BAD)])
def test_bad_topology_shaping_and_traffic(tmp_path, raw, message):
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError) as e:
        load_plan(p, _sections())
    assert str(e.value).startswith(message), str(e.value)


def trace_cfg(tmp_path, kind, text, **extra):
    (tmp_path / "t.trace").write_text(text)
    return cfg(shaping=[{"link": ["w0", "s1"], "schedule": {"kind": kind, "file": "t.trace", **extra}}])


@pytest.mark.parametrize("kind,text,message", [
    ("mahimahi", "", "the trace is empty"),
    ("mahimahi", "5\n3\n", "line 2: timestamps must not decrease (3 after 5)"),
    ("mahimahi", "5\nfast\n", "line 2: 'fast' is not an integer millisecond"),
    ("csv", "t,mbps\n", "the trace is empty"),
    ("csv", "0,10\n1,oops\n", "line 2: expected t_s,mbps"),
    ("csv", "0,10\n2,5\n1,5\n", "line 3: times must increase (1 after 2)"),
    ("csv", "0,10\n5,0\n", "a final rate of 0 would stall the run"),
])
def test_bad_trace_files(tmp_path, kind, text, message):
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(trace_cfg(tmp_path, kind, text)))
    with pytest.raises(ConfigError) as e:
        load_plan(p, _sections())
    assert str(e.value).startswith(f"shaping[0].schedule.file: {message}"), str(e.value)


def test_unreadable_trace(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(cfg(shaping=[{"link": ["w0", "s1"], "schedule": {"kind": "csv", "file": "nope.csv"}}])))
    with pytest.raises(ConfigError, match=r"^shaping\[0\]\.schedule\.file: cannot read .*nope\.csv"):
        load_plan(p, _sections())


def test_mahimahi_trace_to_rates_and_loop(tmp_path):
    # 20 delivery opportunities, one every 10 ms, over a 200 ms trace.
    stamps = [i * 10 for i in range(1, 21)]
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(trace_cfg(tmp_path, "mahimahi", "\n".join(map(str, stamps)) + "\n")))
    exp = load_plan(p, _sections()).experiments[0]
    pts = exp.shaping[0].schedule.points(0.45)
    assert [t for t, _ in pts] == pytest.approx([0, 0.1, 0.2, 0.3, 0.4])
    # 10..90 ms fall in the first window (9 opportunities), 100..200 ms in the second (11);
    # each is 1500 B per 100 ms = 0.12 Mb/s. The 200 ms period then repeats.
    assert [r for _, r in pts] == pytest.approx([1.08, 1.32, 1.08, 1.32, 1.08])
    total_mbit = sum(r * 0.1 for _, r in pts[:2])  # one period of 200 ms
    assert total_mbit == pytest.approx(20 * 1500 * 8 / 1e6)
    assert exp.shaping[0].schedule.sha256


def test_periodic_and_random_schedules():
    sq = LinkShaping.model_validate({"link": ["a", "b"], "schedule": {
        "kind": "square", "period_s": 2, "high_mbps": 50, "low_mbps": 0, "duty": 0.25}}).schedule
    assert sq.points(4) == [(0, 50), (0.5, 0), (2, 50), (2.5, 0), (4, 50)]
    onoff = {"kind": "onoff", "on_mbps": 10, "off_mbps": 1, "mean_on_s": 1, "mean_off_s": 1}
    a = LinkShaping.model_validate({"link": ["a", "b"], "schedule": {**onoff, "seed": 1}}).schedule.points(100)
    b = LinkShaping.model_validate({"link": ["a", "b"], "schedule": {**onoff, "seed": 1}}).schedule.points(100)
    assert a == b and [r for _, r in a[:4]] == [10, 1, 10, 1]
    durations = [t2 - t1 for (t1, _), (t2, _) in zip(a, a[1:], strict=False)]
    assert 0.6 < sum(durations) / len(durations) < 1.5  # mean 1 s


def test_netem_refused_without_netem(tmp_path, monkeypatch):
    """delay_ms parses on any machine; preflight refuses it where the kernel has no netem."""
    p = tmp_path / "c.yaml"
    raw = cfg(topology={**GOOD["topology"], "delay_ms": 5})
    p.write_text(yaml.safe_dump(raw))
    plan = load_plan(p, _sections())
    monkeypatch.setattr(capabilities, "has_qdisc", lambda name: False)
    with pytest.raises(ConfigError, match=r"^topology: link ps-s1 asks for delay_ms/loss_pct, which needs the netem"):
        preflight.check(plan)
    monkeypatch.setattr(capabilities, "has_qdisc", lambda name: True)
    preflight.check(plan)
