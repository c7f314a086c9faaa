"""The faults analysis (analysis/faults.py, plots.faults_plot, the report's section) on a
made-up sweep whose answer is known, and the sweep file that feeds it."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest

from analysis import faults, plots
from analysis.report import _faults, write_report
from analysis.tables import load_runs
from emu.config.plan import load_plan
from tasks import _sections
from tests.conftest import REPO
from tests.factories import MINI, is_png

PAUSE = [{"at_s": 10, "kind": "stop", "target": "worker0", "for_s": 5}]
FLAP = [{"at_s": t, "kind": "link_down", "target": ["w1", "s1"], "for_s": 2} for t in (8, 12, 16)]
T0 = 1000.0      # roles launched (wall clock)


def made_up(root: Path) -> Path:
    """fifo and ring, each without a fault, with a 5 s pause and with a flapping link; ring's
    flap run failed (named 12 s after the first flap), every other run survived."""
    sweep = root / "made-up"
    runs = []
    for sched, dt in (("fifo", 0.2), ("ring", 0.05)):
        for name, flist in (("none", []), ("pause", PAUSE), ("flap", FLAP)):
            rid = f"{sched}-{name}"
            failed = sched == "ring" and name == "flap"
            (sweep / rid).mkdir(parents=True)
            rows, t = [], T0 + 2.0
            for it in range(200):
                d = dt + (5.0 if name == "pause" and t - T0 <= 10 < t - T0 + dt else 0.0)
                rows += [{"rank": r, "iteration": it, "start": t, "end": t + d, "compute_s": 0.01, "wait_s": d}
                         for r in (0, 1)]
                t += d
            iters = pd.DataFrame(rows)
            iters.to_parquet(sweep / rid / "iterations.parquet")
            if flist:
                fp = pd.DataFrame([{"fault": i, "kind": f["kind"],
                                    "target": f["target"] if isinstance(f["target"], str) else "-".join(f["target"]),
                                    "planned_start_s": f["at_s"], "planned_end_s": f["at_s"] + f["for_s"],
                                    "actual_start_s": f["at_s"] + 0.01, "actual_end_s": f["at_s"] + f["for_s"] + 0.01,
                                    "stall_max_s": f["for_s"], "cost_s": math.nan if failed else f["for_s"] + 0.1,
                                    "reason_after_s": 12.0 if failed and i == 0 else math.nan}
                                   for i, f in enumerate(flist)])
                fp.to_parquet(sweep / rid / "faults.parquet")
            d = (iters.groupby("iteration")["end"].max().diff()).dropna()
            runs.append({"run_id": rid, "sweep": "made-up", "repeat": 0, "seed": 0,
                         "status": "failed" if failed else "ok",
                         "reason": "stalled: link w1-s1 is down; ..." if failed else "", "scheduler": sched,
                         "faults": json.dumps(flist), "roles.workers": '["w0", "w1"]',
                         "roles.servers": '["ps"]' if sched == "fifo" else "[]", "workload.model": "cnn",
                         "workload.preset": "small", "workload.warmup": 2, "workload.iterations": 200,
                         "num_params": 137_000, "topology.kind": "star", "network": "star", "roles_t0_wall": T0,
                         "iter_time_median_s": float(d.median()), "iter_time_mean_s": float(d.mean())})
    pd.DataFrame(runs).to_parquet(sweep / "runs.parquet")
    return sweep


def test_scenarios_name_each_list_of_faults():
    assert faults.scenario("[]") == faults.NONE and faults.scenario(None) == faults.NONE
    assert faults.scenario(json.dumps(PAUSE)) == "stop worker0 5 s"
    assert faults.scenario(json.dumps(FLAP)) == "link_down w1-s1 2 s x3"
    slow = [{"at_s": 1, "kind": "slow", "target": "worker1", "cpu": 0.1, "for_s": 4},
            {"at_s": 9, "kind": "kill", "target": "server0"}]
    assert faults.scenario(json.dumps(slow)) == "slow worker1 to 0.1 CPU 4 s, kill server0"


def test_summary_has_costs_survivors_and_the_time_to_the_reason(tmp_path):
    sweep = made_up(tmp_path)
    runs = load_runs(sweep)
    table = faults.summary(runs, faults.load_faults(sweep, runs)).set_index(["scenario", "scheduler"])
    assert list(dict.fromkeys(table.index.get_level_values(0))) == [faults.NONE, "stop worker0 5 s",
                                                                    "link_down w1-s1 2 s x3"]
    pause = table.loc[("stop worker0 5 s", "fifo")]
    assert pause["survived"] == 1 and pause["fault cost (s)"] == pytest.approx(5.1)
    assert pause["median iteration (ms)"] == pytest.approx(200) and pause["mean iteration (ms)"] > 220
    assert table.loc[("link_down w1-s1 2 s x3", "fifo"), "fault cost (s)"] == pytest.approx(3 * 2.1)
    flap = table.loc[("link_down w1-s1 2 s x3", "ring")]
    assert flap["survived"] == 0 and math.isnan(flap["fault cost (s)"]) and flap["named after (s)"] == 12.0
    assert math.isnan(table.loc[(faults.NONE, "ring"), "fault cost (s)"])


@pytest.mark.slow
def test_figure_and_report_section(tmp_path):
    sweep = made_up(tmp_path)
    png = plots.faults_plot(sweep, out=tmp_path / "f.png")
    assert is_png(png)
    md = "\n".join(_faults(load_runs(sweep), sweep, tmp_path / "report"))
    assert md.startswith("## Faults") and "| stop worker0 5 s | fifo | 1/1 |" in md
    assert "- ring, link_down w1-s1 2 s x3: stalled: link w1-s1 is down" in md
    assert "![Faults](faults.png)" in md and (tmp_path / "report" / "faults.pdf").exists()


@pytest.mark.slow
def test_a_sweep_without_faults_has_no_faults_section(tmp_path):
    assert not faults.has_faults(load_runs(MINI))
    with pytest.raises(plots.Skipped):
        plots.faults_plot(MINI, out=tmp_path / "f.png")
    assert "## Faults" not in write_report(MINI, tmp_path / "report").read_text()


def test_the_sweep_file_pairs_every_scheduler_with_each_scenario():
    plan = load_plan(REPO / "configs" / "sweeps" / "faults.yaml", _sections())
    assert len(plan.experiments) == 24
    seen = {(e.scheduler, faults.scenario(json.dumps([f.model_dump(mode="json") for f in e.faults])))
            for e in plan.experiments}
    assert len(seen) == 24 and {s for _, s in seen} == {faults.NONE, "stop worker0 5 s", "link_down w1-s1 2 s x3"}
    for e in plan.experiments:
        assert bool(e.roles.servers) == (e.scheduler in ("fifo", "bytescheduler", "p3", "mercury"))
