"""The testbed on real Mininet links: rates per topology kind, schedules, cross traffic.

Rates are judged against iperf3's goodput ceiling through htb on the reference machine
(0.95 of the configured rate, docs/testbed.md: Testbed figures): within 10% of it.
"""
from __future__ import annotations

import json
import threading
import time

import pytest

from contracts.fidelity import Reason
from emu.config.crosstraffic import Flow
from emu.config.experiment import FidelityConfig
from emu.config.shaping import LinkShaping
from emu.config.topospec import GraphTopology, RacksTopology, StarTopology
from emu.testbed import capabilities, tc
from emu.testbed.cleanup import StateDir
from emu.testbed.crosstraffic import CrossTraffic
from emu.testbed.fidelity import verdict
from emu.testbed.monitor import Monitor
from emu.testbed.network import Testbed
from emu.testbed.probe import iperf
from emu.testbed.shaping import Shaper

CEILING = 0.95  # iperf3 goodput / configured rate through htb here


@pytest.fixture
def state(tmp_path):
    with StateDir(root=tmp_path / "state") as s:
        yield s


def within(measured: float, configured: float) -> bool:
    return abs(measured - CEILING * configured) <= 0.10 * CEILING * configured


def test_star_up_and_down_rates(tmp_path, state, no_leftovers):
    spec = StarTopology.model_validate({"kind": "star", "hosts": [
        {"name": "a", "up_mbps": 40, "down_mbps": 80}, {"name": "b", "bw_mbps": 100}]}).resolve()
    with Testbed(spec, state) as tb:
        up = iperf(tb, "a", "b", tmp_path, seconds=2)
        down = iperf(tb, "b", "a", tmp_path, seconds=2)
    assert within(up, 40), up
    assert within(down, 80), down


def test_hosts_run_the_configured_congestion_control(state, no_leftovers):
    """Each host is its own namespace: the run's choice holds in every one of them, and the
    machine's own default is left as it was."""
    machine = capabilities.tcp_default_congestion_control()
    spec = StarTopology.model_validate({"kind": "star", "hosts": [
        {"name": "a", "bw_mbps": 10}, {"name": "b", "bw_mbps": 10}, {"name": "c", "bw_mbps": 10}]}).resolve()
    for cc in ("reno", "cubic"):
        with Testbed(spec, state, tcp_congestion_control=cc) as tb:
            assert {h: tb.tcp_setting(h) for h in spec.hosts} == {h: cc for h in spec.hosts}
        assert capabilities.tcp_default_congestion_control() == machine


def test_queues_are_bounded_in_bytes(tmp_path, state, no_leftovers):
    """A bulk TCP flow's standing queue in the switch stays within queue_ms of the rate
    (plus one GSO packet); with the kernel's 1000-packet default it grew to megabytes."""
    spec = StarTopology.model_validate({"kind": "star", "queue_ms": 40, "hosts": [
        {"name": "a", "bw_mbps": 100}, {"name": "b", "bw_mbps": 40}]}).resolve()
    limit = tc.queue_bytes(40e6, 40)
    with Testbed(spec, state) as tb:
        dev, ns = tb.egress("s1", "b")  # the bottleneck, where the queue builds
        assert f"bfifo 10: parent 5:1 limit {limit}b" in tc.run(["tc", "qdisc", "show", "dev", dev], ns)
        flow = threading.Thread(target=iperf, args=(tb, "a", "b", tmp_path), kwargs={"seconds": 2})
        flow.start()
        backlog = []
        while flow.is_alive():
            stats = json.loads(tc.run(["tc", "-s", "-j", "qdisc", "show", "dev", dev], ns))
            backlog += [q["backlog"] for q in stats if q.get("root")]
            time.sleep(0.05)
        flow.join()
    assert max(backlog) > 0.25 * limit, max(backlog)  # the flow did queue
    assert max(backlog) <= limit + 64 * 1024, max(backlog)


def test_racks_oversubscribed_uplink(tmp_path, state, no_leftovers):
    # 2 racks x 2 hosts at 50 Mb/s, oversubscription 2: uplinks at 50 Mb/s.
    spec = RacksTopology.model_validate({"kind": "racks", "racks": 2, "hosts_per_rack": 2, "host_bw_mbps": 50,
                                         "oversubscription": 4}).resolve()
    assert spec.rate("s1", "s0") == 25
    with Testbed(spec, state) as tb:
        in_rack = iperf(tb, "r0h0", "r0h1", tmp_path, seconds=2)
        across = iperf(tb, "r0h0", "r1h0", tmp_path, seconds=2)
    assert within(in_rack, 50), in_rack
    assert within(across, 25), across


def test_graph_per_direction_rates(tmp_path, state, no_leftovers):
    spec = GraphTopology.model_validate({"kind": "graph", "nodes": [
        {"name": "a", "kind": "host"}, {"name": "b", "kind": "host"},
        {"name": "s1", "kind": "switch"}, {"name": "s2", "kind": "switch"}], "links": [
        {"a": "a", "b": "s1", "bw_mbps": 100}, {"a": "s1", "b": "s2", "ab_mbps": 30, "ba_mbps": 60},
        {"a": "s2", "b": "b", "bw_mbps": 100}]}).resolve()
    with Testbed(spec, state) as tb:
        ab = iperf(tb, "a", "b", tmp_path, seconds=2)
        ba = iperf(tb, "b", "a", tmp_path, seconds=2)
    assert within(ab, 30), ab
    assert within(ba, 60), ba


def test_rates_above_1000_mbps_are_configured(state, no_leftovers):
    spec = StarTopology.model_validate({"kind": "star", "hosts": [
        {"name": "a", "bw_mbps": 2500}, {"name": "b", "bw_mbps": 10000}]}).resolve()
    with Testbed(spec, state) as tb:
        for src, dst, mbps in (("a", "s1", 2500), ("s1", "b", 10000)):
            dev, ns = tb.egress(src, dst)
            assert tc.class_rate(dev, ns) == mbps * 1e6


def test_step_schedule_on_time_and_effective(tmp_path, state, no_leftovers):
    spec = StarTopology.model_validate({"kind": "star", "hosts": [
        {"name": "a", "bw_mbps": 100}, {"name": "b", "bw_mbps": 100}]}).resolve()
    sched = [LinkShaping.model_validate({"link": ["a", "s1"], "schedule": {
        "kind": "steps", "steps": [[0, 100], [1.5, 20], [3.0, 60]]}})]
    with Testbed(spec, state) as tb:
        rates = {(a, b): 100e6 for a, b in (("a", "s1"), ("s1", "a"), ("b", "s1"), ("s1", "b"))}
        mon = Monitor({"a->s1": tb.counter("a", "s1")}, {}, rates).start()
        shaper = Shaper(sched, 10, tb.set_rate, rates).start()
        iperf(tb, "a", "b", tmp_path, seconds=4.5)
        shaper.stop()
        links, _, _ = mon.stop()
        assert tc.class_rate(*tb.egress("a", "s1")) == 60e6
    assert shaper.error is None
    assert [e["rate_bps"] for e in shaper.log] == [20e6, 60e6]
    for e in shaper.log:
        assert 0 <= e["actual_t"] - e["planned_t"] < 0.1, e
    # What went through follows the steps (counters at 10 Hz; skip 0.3 s after each step).
    mid = links[(links["t"] > 1.8) & (links["t"] < 2.9)]["tx_bytes_per_s"].mean() * 8
    late = links[(links["t"] > 3.3) & (links["t"] < 4.3)]["tx_bytes_per_s"].mean() * 8
    assert 0.85 * 20e6 < mid < 1.05 * 20e6, mid
    assert 0.85 * 60e6 < late < 1.05 * 60e6, late


def test_netlink_backend_samples_at_100_hz_and_changes_rates_on_time(tmp_path, state, no_leftovers):
    """The netlink monitor and rate changes in real hosts' namespaces: every direction's queue
    at about 100 Hz, a bulk flow's queue seen and its intervals judged busy, a step applied
    within 10 ms of plan and read back by tc, and every socket closed before teardown."""
    spec = StarTopology.model_validate({"kind": "star", "hosts": [
        {"name": "a", "bw_mbps": 100}, {"name": "b", "bw_mbps": 100}]}).resolve()
    sched = [LinkShaping.model_validate({"link": ["a", "s1"], "schedule": {
        "kind": "steps", "steps": [[0, 100], [1.5, 40]]}})]
    dirs = [("a", "s1"), ("s1", "a"), ("b", "s1"), ("s1", "b")]
    with Testbed(spec, state, netlink=True) as tb:
        rates = {d: 100e6 for d in dirs}
        tb.prepare_rate(("a", "s1"))
        mon = Monitor({f"{x}->{y}": tb.counter(x, y) for x, y in dirs}, {f"{x}->{y}": tb.egress(x, y) for x, y in dirs},
                      rates, interval_s=0.1, qdisc_interval_s=0.01, backend="netlink").start()
        shaper = Shaper(sched, 10, tb.set_rate, rates).start()
        iperf(tb, "a", "b", tmp_path, seconds=3)
        shaper.stop()
        links, qdiscs, cpu = mon.stop()
        assert tc.class_rate(*tb.egress("a", "s1")) == 40e6
    assert shaper.error is None and [e["rate_bps"] for e in shaper.log] == [40e6]
    assert 0 <= shaper.log[0]["actual_t"] - shaper.log[0]["planned_t"] < 0.010, shaper.log
    span = qdiscs["t"].max() - qdiscs["t"].min()
    for d, g in qdiscs.groupby("link"):
        assert len(g) / span > 70, (d, len(g) / span)  # about 100 Hz
    assert qdiscs[qdiscs["link"] == "a->s1"]["backlog_bytes"].max() > 0
    assert qdiscs["read_s"].median() < 0.002
    busy = links[(links["t"] > 0.5) & (links["t"] < 2.9)]
    v = verdict(busy, qdiscs[(qdiscs["t"] > 0.5) & (qdiscs["t"] < 2.9)], cpu, FidelityConfig())
    assert v.saturation_judged_s > 1 and Reason.SATURATION not in v.codes, v


def test_cross_traffic_takes_its_share(tmp_path, state, no_leftovers):
    spec = StarTopology.model_validate({"kind": "star", "hosts": [
        {"name": "w", "bw_mbps": 40}, {"name": "ps", "bw_mbps": 100}, {"name": "x", "bw_mbps": 100}]}).resolve()
    with Testbed(spec, state) as tb:
        cross = CrossTraffic([Flow(src="x", dst="w", start_s=0, stop_s=4)], 10, tb.ip,
                             lambda h, n, argv: tb.launch(h, n, argv, tmp_path, aux=True), tmp_path).start()
        time.sleep(0.6)
        ours = iperf(tb, "ps", "w", tmp_path, seconds=3)
        for p in tb.aux.values():
            p.wait(10)
        cross.stop()
    theirs = cross.summary()[0]["mbps"]
    # Two TCP flows into one 40 Mb/s downlink: together near the ceiling, and the cross flow
    # takes a visible share. Not an even split: cubic over 3 s behind a deep htb queue
    # converges slowly, and 30/15 Mb/s splits were seen.
    assert 0.1 * 40 < ours < 0.85 * CEILING * 40, (ours, theirs)
    assert theirs is not None and theirs > 0.1 * 40, (ours, theirs)
    assert ours + theirs > 0.8 * CEILING * 40, (ours, theirs)


def test_host_cpu_share_limits_a_busy_loop(tmp_path, state, no_leftovers):
    """host_cpu puts a host in a CFS bandwidth cgroup: a busy loop gets its share, no more."""
    import os
    from pathlib import Path

    from emu.testbed.cleanup import CGROUP_ROOT

    spec = StarTopology.model_validate({"kind": "star", "hosts": [
        {"name": "a", "bw_mbps": 10}, {"name": "b", "bw_mbps": 10}]}).resolve()
    share = 0.1  # of the whole machine
    with Testbed(spec, state, host_cpu={"a": share}) as tb:
        assert Path(CGROUP_ROOT, "cpu", "a").is_dir()
        loop = "import time\nt=time.time()\nwhile time.time()-t<2: pass\nimport os\nprint(sum(os.times()[:2]))"
        p = tb.launch("a", "busy", ["python3", "-c", loop], tmp_path, aux=True)
        p.wait(30)
        cpu_s = float((tmp_path / "busy.out").read_text())
    # 2 s of wall time at `share` of os.cpu_count() cores (plus start-up slack)
    assert cpu_s < 2 * share * os.cpu_count() * 1.5 + 0.1, cpu_s
    assert cpu_s > 2 * share * os.cpu_count() * 0.5, cpu_s
    assert not Path(CGROUP_ROOT, "cpu", "a").exists(), "the host's cgroup must go with the network"
