"""Bounds on the bandwidth a run actually had (analysis/capacity.py), each run's bound
columns (analysis/bounds.py annotate) on run directories written here by hand, the
committed mini set, and the report's Bounds section.

Hand-computed cases (4 workers h0..h3 on a star at 100 Mb/s, G gradient bytes):
- a 50 Mb/s flow t0 -> h0 over the whole window leaves s1->h0 50 Mb/s: forest
  R = min(50, (50 + 300)/6) = 50, best ring 4 * 50/6 = 33.3, cut 50 (was 66.7, 66.7, 100);
- the same flow over half the window: s1->h0 averages 75: forest min(75, 375/6) = 62.5;
- h0's link stepping 100 -> 20 Mb/s both ways at the middle of the window (5.05 s, between
  two samples, in 2.55..7.55 s) averages 60:
  forest min(60, 360/6) = 60, and on that one link B bits take B / 60 Mb/s (∫ rate dt = B);
- 3 racks of 3, 75 Mb/s uplinks, a 50 Mb/s tenant flow between racks 0 and 1: s1->s0 and
  s0->s2 keep 25; forest 56.25 -> 25 (rack 0 reaches the others only through 25 Mb/s up),
  cut 75 -> 25, best ring 75 * 9/16 -> 25 * 9/16.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import networkx as nx
import numpy as np
import pandas as pd
import pytest
import yaml

from analysis import replan, report
from analysis.bounds import (
    COLUMNS,
    PAYLOAD_FRACTION,
    annotate,
    best_ring_bound_s,
    cut_bound_s,
    forest_bound_s,
    forest_rate_bps,
)
from analysis.capacity import Flow, available_capacity, route, run_capacity
from analysis.speedup import load_comparison
from analysis.tables import load_runs
from contracts.role_spec import Address, RoleSpec, SchedulerChoice
from tests.factories import MBPS, MINI, G, racks_graph, secs, star_graph

T0_WALL = 1000.0  # the monitor's t = 0, as wall-clock time


def psecs(mbps: float) -> float:
    """secs() on the TCP payload the links carry: the bounds annotate computes."""
    return secs(mbps) / PAYLOAD_FRACTION


def samples(g: nx.DiGraph, until: float = 10.0, steps: dict | None = None) -> pd.DataFrame:
    """links.parquet at 10 Hz from t = 0.1: every direction at its graph rate, except
    `steps[(a, b)] = [(t, mbps), ...]`: the rate from t on, shown by the samples at t or later."""
    ts = np.arange(1, int(round(until * 10)) + 1) / 10
    rows = []
    for a, b in g.edges:
        rate = np.full(len(ts), g.edges[a, b]["capacity"])
        for t, mbps in (steps or {}).get((a, b), []):
            rate[ts >= t] = mbps * MBPS
        rows += [{"link": f"{a}->{b}", "t": t, "tx_bytes_per_s": 0.0, "configured_bps": r}
                 for t, r in zip(ts, rate, strict=True)]
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------- capacity alone
def test_a_cross_flow_takes_its_rate_off_every_direction_of_its_path():
    g, hosts = star_graph([100] * 4, extra=[("t0", 100)])
    assert route(g, "t0", "h0") == [("t0", "s1"), ("s1", "h0")]
    cap = available_capacity(g, (2.0, 8.0), samples(g), [Flow("t0", "h0", 50 * MBPS, 0.3, 10.0)])
    assert cap.graph.edges["s1", "h0"]["capacity"] == pytest.approx(50 * MBPS)
    assert cap.graph.edges["t0", "s1"]["capacity"] == pytest.approx(50 * MBPS)
    assert cap.graph.edges["h0", "s1"]["capacity"] == pytest.approx(100 * MBPS)  # acks not charged
    assert not cap.varies  # the flow covers the window
    h = cap.graph
    assert forest_rate_bps(g, hosts) == pytest.approx(400 / 6 * MBPS, rel=1e-9)
    assert forest_bound_s(h, hosts, G) == pytest.approx(secs(50), rel=1e-9)
    assert best_ring_bound_s(h, hosts, G) == pytest.approx(secs(200 / 6), rel=1e-12)
    assert cut_bound_s(h, hosts, G) == pytest.approx(secs(50), rel=1e-12)


def test_a_flow_over_half_the_window_counts_half():
    g, hosts = star_graph([100] * 4, extra=[("t0", 100)])
    cap = available_capacity(g, (2.0, 8.0), None, [Flow("t0", "h0", 50 * MBPS, 5.0, 12.0)])
    assert cap.graph.edges["s1", "h0"]["capacity"] == pytest.approx(75 * MBPS)
    assert cap.varies
    assert forest_rate_bps(cap.graph, hosts) == pytest.approx(62.5 * MBPS, rel=1e-9)


def test_a_rate_step_is_integrated_over_the_window():
    g, hosts = star_graph([100] * 4)
    links = samples(g, steps={("h0", "s1"): [(5.05, 20)], ("s1", "h0"): [(5.05, 20)]})
    cap = available_capacity(g, (2.55, 7.55), links)
    assert cap.graph.edges["s1", "h0"]["capacity"] == pytest.approx(60 * MBPS)
    assert cap.graph.edges["s1", "h1"]["capacity"] == pytest.approx(100 * MBPS)
    assert cap.varies
    assert forest_rate_bps(cap.graph, hosts) == pytest.approx(60 * MBPS, rel=1e-9)
    # one link: the B bits that ∫ rate dt moves in the window take the window at its mean rate
    moved = 2.5 * 100 * MBPS + 2.5 * 20 * MBPS
    assert moved / cap.graph.edges["s1", "h0"]["capacity"] == pytest.approx(5.0)
    # only the window counts: the slow half alone averages 20, the fast half 100
    assert available_capacity(g, (5.05, 7.5), links).graph.edges["s1", "h0"]["capacity"] == pytest.approx(20 * MBPS)
    assert available_capacity(g, (1.0, 5.05), links).graph.edges["s1", "h0"]["capacity"] == pytest.approx(100 * MBPS)
    assert not available_capacity(g, (1.0, 5.0), links).varies
    # a step that the sample at 5.0 s already shows is placed at 4.95 s: 2.4 s at 100, 2.6 s
    # at 20 (a step at exactly 5.0 s would be 59.2; at 5.05 s, 60: within half a sample)
    early = samples(g, steps={("s1", "h0"): [(5.0, 20)]})
    assert available_capacity(g, (2.55, 7.55), early).graph.edges["s1", "h0"]["capacity"] == \
        pytest.approx(58.4 * MBPS)


def test_contention_across_oversubscribed_racks():
    g, hosts = racks_graph([3, 3, 3], 100, 75, extra=[("t0", 0, 100), ("t1", 1, 100)])
    cap = available_capacity(g, (0.5, 9.5), None, [Flow("t0", "t1", 50 * MBPS, 0.3, 10.0)])
    h = cap.graph
    assert h.edges["s1", "s0"]["capacity"] == pytest.approx(25 * MBPS)
    assert h.edges["s0", "s2"]["capacity"] == pytest.approx(25 * MBPS)
    assert forest_rate_bps(g, hosts) == pytest.approx(56.25 * MBPS, rel=1e-9)
    assert forest_rate_bps(h, hosts) == pytest.approx(25 * MBPS, rel=1e-9)
    assert cut_bound_s(h, hosts, G) == pytest.approx(secs(25), rel=1e-12)
    assert best_ring_bound_s(h, hosts, G) == pytest.approx(secs(25 * 9 / 16), rel=1e-12)


def test_cross_traffic_above_the_rate_leaves_a_sliver_not_nothing():
    g, _ = star_graph([10, 10], extra=[("t0", 10)])
    cap = available_capacity(g, (0.0, 1.0), None, [Flow("t0", "h0", 12 * MBPS, 0.0, 1.0)])
    assert 0 < cap.graph.edges["s1", "h0"]["capacity"] <= 0.01 * 10 * MBPS


# --------------------------------------------------------------------------- run directories
def write_run(sweep: Path, run_id: str, g: nx.DiGraph, workers: list[str], scheduler: str, measured_s: float,
              servers=(), cross=None, shaping=None, links: pd.DataFrame | None = None, clock=True,
              first: float = 2.5) -> dict:
    """A completed run as the runner leaves it (the parts the bounds read): roles, config,
    iterations (1 warm-up from t = 0.5, then 5 measured from t = `first`, each measured_s
    long) and links; returns its row."""
    d = sweep / run_id
    (d / "roles").mkdir(parents=True)
    addr = [Address(host=w, ip="10.0.0.1", port=1) for w in workers]
    spec = RoleSpec(seed=0, servers=[Address(host=s, ip="10.0.0.2", port=1) for s in servers], workers=addr,
                    scheduler=SchedulerChoice(name=scheduler), workload={}, out_dir=str(d),
                    topology=nx.node_link_data(g, edges="links"), role="worker", rank=0)
    (d / "roles" / "worker0.json").write_text(spec.model_dump_json())
    flows = [{k: v for k, v in f.items() if k != "mbps"} for f in cross or []]
    (d / "config.yaml").write_text(yaml.safe_dump({"cross_traffic": flows, "shaping": shaping or []}))
    starts = [0.5] + [first + i * measured_s for i in range(5)]
    ends = [first] + [first + (i + 1) * measured_s for i in range(5)]
    pd.DataFrame({"rank": 0, "iteration": range(6), "start": np.add(starts, T0_WALL),
                  "end": np.add(ends, T0_WALL)}).to_parquet(d / "iterations.parquet")
    if links is not None:
        links.to_parquet(d / "links.parquet")
    summary = [{"flow": i, "src": f["src"], "dst": f["dst"], "protocol": "udp", "started": True,
                "mbps": f.get("mbps")} for i, f in enumerate(cross or [])]
    return {"run_id": run_id, "status": "ok", "scheduler": scheduler, "roles.workers": json.dumps(workers),
            "roles.servers": json.dumps(list(servers)), "num_params": G / 4, "compute_median_s": 0.01,
            "iter_time_median_s": measured_s, "iter_time_mean_s": measured_s * 1.1,
            "workload.warmup": 1, "workload.iterations": 6, "timeout_s": 60.0,
            "shaping": json.dumps(shaping or []), "cross_traffic": json.dumps(summary) if cross else "",
            "monitor_t0_wall": T0_WALL if clock else None}


def test_annotate_judges_each_scheduler_by_its_model_and_the_cut(tmp_path):
    g, hosts = star_graph([100] * 4, extra=[("ps", 400)])
    rows = [write_run(tmp_path, s, g, hosts, s, psecs(400 / 6), servers=["ps"] if s == "fifo" else ())
            for s in ("forest", "ring", "gloo", "fifo", "hierarchical", "unknown")]
    runs = annotate(pd.DataFrame(rows + [{"run_id": "x", "status": "failed"}]), tmp_path).set_index("run_id")
    assert set(COLUMNS) <= set(runs.columns) and runs.loc["x", COLUMNS[:4]].isna().all()
    assert runs.loc[["forest", "ring", "gloo", "fifo", "hierarchical", "unknown"], "bound_model"].tolist() == \
        ["tree_packing", "ring_allreduce", "ring_allreduce", "parameter_server", "hierarchical_allreduce", "cut"]
    forest = runs.loc["forest"]
    assert forest["efficiency"] == pytest.approx(1.0, rel=1e-9)  # at its optimum
    assert forest["efficiency_line_rate"] == pytest.approx(PAYLOAD_FRACTION, rel=1e-9)
    assert forest["bound_line_rate_s"] == pytest.approx(secs(400 / 6), rel=1e-9)
    assert forest["cut_efficiency"] == pytest.approx(2 / 3, rel=1e-9)  # what the forest sweep measured
    assert forest["bound_capacity"] == "configured" and forest["efficiency_basis"] == "median"
    assert forest["bound_configured_s"] == pytest.approx(forest["bound_s"])
    assert runs.loc["ring", "efficiency"] == pytest.approx(1.0, rel=1e-9)
    assert runs.loc["ring", "ring_rank_order_bound_s"] == pytest.approx(psecs(400 / 6))
    # fifo: G each way over every worker's 100 Mb/s link, 4G over the server's 400
    assert runs.loc["fifo", "comm_bound_s"] == pytest.approx(psecs(100))
    assert runs.loc["unknown", "bound_s"] == pytest.approx(psecs(100))
    # one group around h0: its link carries the 3 others' gradients in and the average out 3 times
    assert runs.loc["hierarchical", "bound_s"] == pytest.approx(psecs(100 / 3))


def test_annotate_uses_the_bandwidth_the_run_had(tmp_path):
    g, hosts = star_graph([100] * 4, extra=[("t0", 100)])
    flow = {"src": "t0", "dst": "h0", "protocol": "udp", "rate_mbps": 50, "start_s": 0, "mbps": 50.0}
    steps = {("h0", "s1"): [(5.05, 20)], ("s1", "h0"): [(5.05, 20)]}
    rows = [write_run(tmp_path, "cross", g, hosts, "forest", 0.2, cross=[flow], links=samples(g, 20)),
            write_run(tmp_path, "late", g, hosts, "forest", 0.2, cross=[{**flow, "start_s": 5.0}],
                      links=samples(g, 20)),
            write_run(tmp_path, "step", g, hosts, "forest", 1.0,  # window 2.55..7.55 s, step at 5.05 s
                      shaping=[{"link": ["h0", "s1"]}], links=samples(g, 10, steps), first=2.55),
            write_run(tmp_path, "old", g, hosts, "forest", 0.2, cross=[flow], clock=False),
            write_run(tmp_path, "silent", g, hosts, "forest", 0.2, cross=[{**flow, "mbps": None}],
                      links=samples(g, 20))]
    runs = annotate(pd.DataFrame(rows), tmp_path).set_index("run_id")
    cross, late, step, old, silent = (runs.loc[r] for r in ("cross", "late", "step", "old", "silent"))
    assert cross["comm_bound_s"] == pytest.approx(psecs(50), rel=1e-9)
    assert cross["bound_configured_s"] == pytest.approx(psecs(400 / 6), rel=1e-9)
    assert cross["cut_bound_s"] == pytest.approx(psecs(50))
    assert cross["bound_capacity"] == "available" and cross["efficiency_basis"] == "median"
    assert cross["efficiency"] == pytest.approx(psecs(50) / 0.2, rel=1e-9)
    # window 2.5..3.5 s (5 x 0.2 s from 2.5): the flow that starts at 5 s is outside it
    assert late["comm_bound_s"] == pytest.approx(psecs(400 / 6), rel=1e-9)
    assert step["comm_bound_s"] == pytest.approx(psecs(60), rel=1e-9) and step["efficiency_basis"] == "mean"
    assert step["efficiency"] == pytest.approx(psecs(60) / 1.1, rel=1e-9)  # against the mean iteration
    assert old["bound_capacity"].startswith("configured (no monitor clock")
    assert old["comm_bound_s"] == pytest.approx(psecs(400 / 6), rel=1e-9)
    assert "reported no rate" in silent["bound_capacity"]
    assert silent["comm_bound_s"] == pytest.approx(psecs(400 / 6), rel=1e-9)


def test_the_optimum_averaged_over_a_run_takes_each_iteration_on_its_own_bandwidth(tmp_path):
    """analysis/replan.py: h0's link steps 100 -> 20 Mb/s at 5.05 s, inside the third of five
    1 s iterations (2.55..7.55 s). Each iteration's optimum is on what it had: forest
    R = min(c, (c + 300)/6) at c = 100, 100, 60, 20, 20. Their sum is what a forest that
    re-planned at once, with no probe, would take, which the bound on the window's average
    (60 Mb/s, every iteration) understates. A re-plan at iteration 3 whose probe took 0.4 s:
    its probe's share, the figure without it, and the iterations after it."""
    g, hosts = star_graph([100] * 4)
    steps = {("h0", "s1"): [(5.05, 20)], ("s1", "h0"): [(5.05, 20)]}
    row = write_run(tmp_path, "step", g, hosts, "forest", 1.0, shaping=[{"link": ["h0", "s1"]}],
                    links=samples(g, 10, steps), first=2.55)
    run = pd.Series(row)
    plans = [{"iteration": 0, "probe_s": 2.8, "reason": "start-up"},
             {"iteration": 3, "probe_s": 0.4, "reason": "iterations 1 and 2: slower"}]
    (tmp_path / "step" / "scheduler_info.json").write_text(json.dumps({"plans": plans}))
    expected = [psecs(400 / 6), psecs(400 / 6), psecs(60), psecs(20), psecs(20)]
    win = replan.iteration_windows(run, tmp_path / "step")
    assert replan.instant_bounds(run, tmp_path / "step", win).tolist() == pytest.approx(expected, rel=1e-6)
    s = replan.summary(run, tmp_path / "step")
    assert s["of_instant_optimum"] == pytest.approx(sum(expected) / 5, rel=1e-6)
    averaged = annotate(pd.DataFrame([row]), tmp_path).iloc[0]["bound_s"]   # 60 Mb/s on h0's link
    assert s["optimum_s"] > 5 * averaged   # the averaged capacity's bound is looser
    assert s["probe_s"] == 0.4 and s["probe_share"] == pytest.approx(0.4 / 5)
    assert s["without_probes"] == pytest.approx(sum(expected) / 4.6, rel=1e-6)
    assert s["after_last"] == pytest.approx(psecs(20), rel=1e-6)   # iterations 4 and 5
    assert s["replans"] == [(3, "iterations 1 and 2: slower", 0.4)]
    (tmp_path / "step" / "config.yaml").write_text("time_dilation: 2\n")   # the record is the workers' clock
    s = replan.summary(run, tmp_path / "step")
    assert s["probe_s"] == 0.2 and s["replans"] == [(3, "iterations 1 and 2: slower", 0.2)]
    shutil.rmtree(tmp_path / "step" / "roles")
    assert replan.summary(run, tmp_path / "step") is None   # as in the committed example sets


def test_run_capacity_of_a_static_run_is_the_configured_graph(tmp_path):
    g, hosts = star_graph([100, 10])
    row = write_run(tmp_path, "r", g, hosts, "ring", 1.0)
    assert run_capacity(g, row, tmp_path / "r").graph is g


# --------------------------------------------------------------------------- mini set, report
def test_mini_set_keeps_its_bounds_and_gains_the_new_columns():
    stored = load_runs(MINI)
    assert "bound_model" not in stored  # the committed set predates the model bounds
    runs = annotate(stored, MINI)
    assert set(runs["bound_model"]) == {"parameter_server"} and set(runs["bound_capacity"]) == {"configured"}
    assert set(runs["efficiency_basis"]) == {"median"}
    # the PS bound is as it was at line rate; on the payload it is 1/PAYLOAD_FRACTION longer
    assert np.allclose(runs["efficiency_line_rate"], stored["efficiency"], rtol=1e-12)
    assert np.allclose(runs["efficiency"], stored["efficiency"] / PAYLOAD_FRACTION, rtol=1e-12)
    assert np.allclose(runs["bound_s"], runs["bound_configured_s"])
    assert (runs["cut_efficiency"] <= runs["efficiency"] + 1e-12).all()


def test_report_says_which_bound_each_scheduler_uses(tmp_path):
    g, hosts = star_graph([100] * 4, extra=[("ps", 400)])
    rows = [write_run(tmp_path, s, g, hosts, s, psecs(400 / 6), servers=["ps"] if s == "fifo" else ())
            for s in ("fifo", "ring", "forest")]
    runs = annotate(pd.DataFrame(rows), tmp_path).assign(config="star")
    text = "\n".join(report._bounds(runs))
    assert "- `parameter_server` (`fifo`): parameter server" in text
    assert "- `ring_allreduce` (`ring`): ring all-reduce in the best order" in text
    assert "- `tree_packing` (`forest`): the optimal forest" in text
    assert "3 run(s) configured" in text
    # capacity and "of" are the same in every row: said once above the table, not per row
    assert "| star | forest | tree_packing | 125 | 1.00 | 84 | 0.67 | 125 | 0.96 |" in text
    assert "Every row: capacity configured; of median." in text


def test_report_of_the_mini_set_has_a_bounds_section():
    runs, _ = load_comparison(MINI)
    text = "\n".join(report._bounds(annotate(runs, MINI)))
    assert "- `parameter_server` (`fifo`, `bytescheduler`)" in text and "8 run(s) configured" in text
