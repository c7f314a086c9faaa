"""Forest on measured bandwidth: the probe's capacity estimate (pure), and on loopback the
start-up plan, a re-plan that every worker makes at the same iteration, and averages that
stay exact across the switch. On loopback every "host" is 127.0.0.1, so the rates measured
are loopback's; the Mininet tests and the forest sweep measure real links."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from schedulers import registry
from schedulers.collective.bandwidth import estimate, probe_rounds, skeleton, structure, with_capacities
from schedulers.collective.forest import Forest
from schedulers.collective.forest_plan import plan_forest
from schedulers.core.base import CommError, TensorSpec
from schedulers.core.linkmodel import LinkModel
from tests.conftest import REPO
from tests.factories import racks_node_link, star_links
from tests.loopback_jobs import assert_averages, ctx, endpoints, run_threads

MBPS = 1e6


def test_rounds_all_to_all_a_ring_then_a_fan_per_worker():
    rounds = probe_rounds(3)
    assert len(rounds) == 5
    assert sorted(rounds[0]) == [(i, j) for i in range(3) for j in range(3) if i != j]
    assert rounds[1] == [(0, 1), (1, 2), (2, 0)]
    assert sorted(rounds[2]) == [(0, 1), (0, 2), (1, 0), (2, 0)]
    assert probe_rounds(2)[1] == [(0, 1), (1, 0)]
    assert probe_rounds(1) == []
    twice = probe_rounds(3, fan_rounds=2)       # the fans again: a second reading of each worker's link
    assert len(twice) == 8 and twice[:5] == rounds and twice[5:] == rounds[2:]


def test_estimate_sums_flows_per_link_and_the_fan_finds_a_fast_host():
    """Star: h0 at 100 Mb/s, h1..h3 at 10. All-to-all gives each flow into a slow host a third
    of its 10 Mb/s, so h0's uplink carries 10 there; h0's fan round sends 10 to each: 30."""
    topo = star_links([100, 10, 10, 10])
    hosts = [f"h{i}" for i in range(4)]
    model = LinkModel.from_graph(topo, hosts)
    all_to_all = {(i, j): 10 / 3 * MBPS for i in range(4) for j in range(4) if i != j}
    fan0 = {**{(0, j): 10 * MBPS for j in (1, 2, 3)}, **{(j, 0): 10 * MBPS for j in (1, 2, 3)}}
    est = dict(zip(model.links, estimate(model, [all_to_all]), strict=True))
    assert est[("h0", "s1")] == pytest.approx(10 * MBPS)
    est = dict(zip(model.links, estimate(model, [all_to_all, fan0]), strict=True))
    assert est[("h0", "s1")] == pytest.approx(30 * MBPS) and est[("s1", "h0")] == pytest.approx(30 * MBPS)
    assert est[("h1", "s1")] == pytest.approx(10 * MBPS)
    graph = with_capacities(topo, model, np.array([est[link] for link in model.links]))
    assert plan_forest(graph, hosts).rate == pytest.approx(plan_forest(topo, hosts).rate, rel=1e-6)


def test_estimate_takes_the_upper_quartile_of_the_rounds_that_saturate_a_link():
    """What 11 real rounds read: h0's uplink at 15 Mb/s (14.35 of payload) read 12.2-16.2 (queues
    elsewhere hold bytes at a window's ends), h1's, where a tenant's UDP left 23.9, 12.8-25.4
    (TCP against UDP). The estimate is the upper quartile of the readings within 25% of the
    largest, not the largest (16.2, 25.4) nor the median; a round at half the rate does not pull
    it down, and h1's downlink, saturated in one round only, gets that round's reading."""
    topo = star_links([15, 100])
    model = LinkModel.from_graph(topo, ["h0", "h1"])
    uplink = [14.59, 14.8, 16.2, 13.55, 14.66, 14.65, 16.18, 12.3, 12.43, 15.29, 12.15]
    tenant = [20.21, 23.46, 24.11, 16.96, 20.59, 23.15, 12.93, 20.19, 25.43, 12.16, 19.59]
    rounds = [{(0, 1): u * MBPS, (1, 0): t * MBPS} for u, t in zip(uplink, tenant, strict=True)]
    rounds += [{(0, 1): 7.0 * MBPS}, {(0, 1): 0.5 * MBPS, (1, 0): 0.5 * MBPS}]
    est = dict(zip(model.links, estimate(model, rounds), strict=True))
    assert est[("h0", "s1")] == pytest.approx(15.045 * MBPS)    # (14.8 + 15.29) / 2; the largest: 16.2
    assert est[("h1", "s1")] == pytest.approx(23.6225 * MBPS)   # between 23.46 and 24.11; the largest: 25.43
    one = estimate(model, [{(0, 1): 9 * MBPS}, {(0, 1): 3 * MBPS}])
    assert dict(zip(model.links, one, strict=True))[("s1", "h1")] == pytest.approx(9 * MBPS)


def test_structure_keeps_non_worker_hosts_as_hosts():
    """A tenant's host in the graph must not become a relay when capacities are replaced."""
    topo = star_links([100, 100, 100])
    graph, nodes, model = structure(topo, ["h0", "h1"])
    kinds = {n["id"]: n["kind"] for n in with_capacities(graph, model, np.ones(len(model.links)))["nodes"]}
    assert kinds == {"s1": "switch", "h0": "host", "h1": "host", "h2": "host"} and nodes == ["h0", "h1"]
    _, nodes, model = structure(None, ["lo"] * 3)
    assert nodes == ["worker0", "worker1", "worker2"] and len(model.links) == 6
    assert skeleton(star_links([1, 2])) == skeleton(star_links([3, 4])) != skeleton(star_links([1, 2, 3]))


def _job(n, iterations, delay_at=None, params=None, racks=False, gap_s=0.0):
    """n workers on a star (or two racks of n / 2 under a core switch), measured bandwidth;
    worker n-1 pauses 0.3 s before each iteration in `delay_at` (a slowdown worker 0 sees in
    that iteration's all-reduce). gap_s between a worker's pushes: a backward pass, which the
    plan's prediction takes as the least an all-reduce can take (loopback's rates predict
    under 1 ms, so two iterations that Python's scheduling slowed by 20 ms re-plan without one)."""
    topo, hosts = racks_node_link(n // 2, 50) if racks else (star_links([100] * n), [f"h{i}" for i in range(n)])
    eps = endpoints(hosts)
    sizes = [3000, 70_000, 5]
    tensors = [TensorSpec(k, f"t{k}", s, k) for k, s in enumerate(sizes)]
    rng = np.random.default_rng(1)
    grads = [[[rng.standard_normal(s, dtype=np.float32) for s in sizes] for _ in range(n)]
             for _ in range(iterations)]

    def work(r):
        sched = registry.create("forest", ctx(r, eps, topo), {"probe_s": 0.1, **(params or {})})
        sched.start(tensors)
        got = []
        for it in range(iterations):
            if it in (delay_at or ()) and r == n - 1:
                time.sleep(0.3)
            for k, t in enumerate(reversed(tensors)):
                if k:
                    time.sleep(gap_s)
                sched.push(t.key, grads[it][r][t.key].copy(), it)
            got.append([sched.wait(t.key, it).copy() for t in tensors])
        sched.close()
        return got, sched.info()

    out, _ = run_threads(work, n, join_s=90)
    assert_averages(out, grads)
    return [out[r][1] for r in range(n)]


@pytest.mark.slow
def test_start_up_probe_plans_on_measured_rates_identically_everywhere():
    infos = _job(3, 3)
    assert all((i["plan"], i["plans"]) == (infos[0]["plan"], infos[0]["plans"]) for i in infos)
    (record,) = infos[0]["plans"]
    assert record["iteration"] == 0 and record["reason"].startswith("start-up")
    assert set(record["capacity_bps"]) == {f"h{i}>s1" for i in range(3)} | {f"s1>h{i}" for i in range(3)}
    assert all(c > 100 * MBPS for c in record["capacity_bps"].values()), "loopback is faster than 100 Mb/s"
    assert infos[0]["plan"]["rate_bps"] == pytest.approx(record["rate_bps"])


@pytest.mark.slow
def test_two_slow_iterations_re_plan_two_iterations_later_on_every_worker():
    infos = _job(3, 10, delay_at=(4, 5, 8), params={"replan_threshold": 1.0})
    plans = infos[0]["plans"]
    assert [p["iteration"] for p in plans] == [0, 7], plans        # one slow iteration (8) is not enough
    assert "iterations 4 and 5" in plans[1]["reason"] and plans[1]["epoch"] == 1
    assert (plans[1]["probe"], plans[1]["rounds"]) == ("all", 5)   # a star: every link is a worker's own
    assert [it for it, _, _ in infos[0]["allreduce_s"]] == [1, 2, 3, 4, 5, 7, 8, 9]
    assert all((i["plan"], i["plans"]) == (infos[0]["plan"], infos[0]["plans"]) for i in infos)


@pytest.mark.slow
def test_a_re_plan_re_reads_the_shared_links_then_every_link_if_its_plan_did_not_hold():
    """Two racks of 2: a re-plan runs all-to-all and the ring (2 rounds, not n + 2), re-reads the
    uplinks and keeps each worker's own links at start-up's estimate. Two more slow iterations
    before that plan ran three steady ones: the next re-plan probes every link."""
    infos = _job(4, 13, delay_at=(4, 5, 8, 9), params={"replan_threshold": 1.0}, racks=True, gap_s=0.03)
    plans = infos[0]["plans"]
    assert [(p["iteration"], p["probe"], p["rounds"]) for p in plans] == [(0, "all", 6), (7, "shared", 2),
                                                                          (11, "all", 6)], plans
    start, shared = plans[0]["capacity_bps"], plans[1]["capacity_bps"]
    uplinks = {"s1>s0", "s0>s1", "s2>s0", "s0>s2"}
    assert {k: v for k, v in shared.items() if k not in uplinks} == {k: v for k, v in start.items() if k not in uplinks}
    assert all(shared[k] != start[k] for k in uplinks)      # read again (loopback's rates: never the same float)
    assert all((i["plan"], i["plans"]) == (infos[0]["plan"], infos[0]["plans"]) for i in infos)
    every = _job(4, 10, delay_at=(4, 5), params={"replan_threshold": 1.0, "replan_rounds": "all"}, racks=True,
                 gap_s=0.03)
    assert [(p["iteration"], p["probe"], p["rounds"]) for p in every[0]["plans"]] == [(0, "all", 6), (7, "all", 6)]


DIES_IN_PROBE = r"""
import json, os, sys, threading
from schedulers import registry
from schedulers.core.base import Endpoint, RoleContext, TensorSpec
a = json.loads(sys.argv[1])
eps = [Endpoint(*e) for e in a["eps"]]
s = registry.create("forest", RoleContext(a["rank"], len(eps), [], eps, topology=a["topo"], connect_timeout_s=20),
                    {"probe_s": 1.0})
threading.Timer(2.5, os._exit, [1]).start()   # the probe's third round of six: mid-probe
s.start([TensorSpec(0, "w", 10, 0)])
"""


@pytest.mark.slow
def test_a_worker_that_dies_during_the_probe_is_named(procs):
    """Its connections close under the probe's rounds, which read them: every other worker
    ends with a CommError naming it, never the closed socket's EBADF."""
    hosts = [f"h{i}" for i in range(4)]
    eps, topo, victim = endpoints(hosts), star_links([100] * 4), 3
    arg = json.dumps({"rank": victim, "eps": [[e.host, e.ip, e.port] for e in eps], "topo": topo})
    procs.start([sys.executable, "-c", DIES_IN_PROBE, arg], cwd=REPO, stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(REPO)})

    def work(r):
        s = Forest(ctx(r, eps, topo), Forest.Params(probe_s=1.0))
        try:
            s.start([TensorSpec(0, "w", 10, 0)])
            s.push(0, np.ones(10, np.float32), 0)
            s.wait(0, 0)
        finally:
            s.close()
        return "no error"

    out, took = run_threads(work, 3, join_s=40)
    for r in range(3):
        assert isinstance(out[r], CommError) and f"worker {victim} (h{victim}" in str(out[r]), (r, out[r])
    assert took < 20


@pytest.mark.slow
def test_workers_that_know_different_networks_refuse_to_connect():
    """Measured bandwidth ignores the rates, but not which links exist."""
    hosts = ["h0", "h1", "h2"]
    eps = endpoints(hosts)
    topos = [star_links([100, 100, 100]), star_links([100, 100, 100]), star_links([100, 100, 100, 100])]

    def work(r):
        s = Forest(ctx(r, eps, topos[r], timeout=5), Forest.Params())
        s.start([TensorSpec(0, "w", 10, 0)])
        return "started"

    out, _ = run_threads(work, 3, join_s=20)
    assert all(isinstance(e, CommError) and "different forest plan" in str(e) for e in out.values()), out


def test_trigger_band_reference_and_plan_prediction():
    """Worker 0's rule (forest_replan.Replanner._outside): outside [ref / 1.25, 1.25 ref] of
    the median of the plan's recent iterations, by 20 ms and 3 MADs; or under half the plan's
    own prediction, which counts the backward pass when that is the longer."""
    from types import SimpleNamespace

    from schedulers.collective.forest_replan import Replanner
    forest = SimpleNamespace(_plan=SimpleNamespace(rate=1e7), rank=0, n=2)
    r = Replanner(forest, {}, [], None, probe_s=(0.1, 0.1), threshold=0.25, epsilon=0.03, assumed=False)
    r.gradient_bits = 1e6                                   # predicted: 0.1 s at 10 Mb/s
    assert r._outside(0.25, 0.0)[0] == 1 and "prediction" in r._outside(0.25, 0.0)[1]
    assert r._outside(0.15, 0.0) == (0, "")                 # no reference yet, within 2x
    assert r._outside(0.25, 0.2) == (0, "")                 # the backward pass took 0.2 s
    r.windows, r.gradient_bits = [0.20, 0.21, 0.20, 0.19, 0.20], 2e6   # predicted 0.2 s
    assert r._outside(0.26, 0.0)[0] == 1                    # 1.3x the reference
    assert r._outside(0.24, 0.0) == (0, "")                 # 1.2x: inside the band
    assert r._outside(0.15, 0.0)[0] == -1                   # faster by 1.33x
    r.windows = [0.10, 0.30, 0.20, 0.10, 0.30]              # noisy reference: 3 MADs = 0.3 s
    assert r._outside(0.45, 0.4) == (0, "")
