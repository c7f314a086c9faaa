"""`--dry-run` (emu/sweeps/dryrun.py): the plan's points, runs, those done and an estimated wall
time, printed with nothing created."""
from __future__ import annotations

import pandas as pd
import pytest

from emu.config.plan import load_plan
from emu.sweeps import dryrun
from schedulers.collective.forest import Forest, ForestParams
from tasks import _iteration_bound, _sections, _startup_s
from tests.conftest import REPO, inv
from tests.factories import GOOD, dump


def _plan(tmp_path, repeats=2):
    dump(tmp_path / "base.yaml", {**GOOD, "workload": {**GOOD["workload"], "preset": "small", "iterations": 10}})
    return load_plan(dump(tmp_path / "s.yaml", {"base": "base.yaml", "name": "s", "repeats": repeats,
                                                "grid": {"scheduler": ["fifo", "bytescheduler"],
                                                         "topology.hosts.1.bw_mbps": [5, 50]}}), _sections())


def test_counts_points_runs_and_those_done(tmp_path):
    plan = _plan(tmp_path)
    first = plan.experiments[0]
    (tmp_path / "results" / "s").mkdir(parents=True)
    pd.DataFrame([{"run_id": first.run_id(0), "status": "ok", "wall_s": 30.0},
                  {"run_id": plan.experiments[1].run_id(0), "status": "failed", "wall_s": 2.0}]
                 ).to_parquet(tmp_path / "results" / "s" / "runs.parquet")
    pts = dryrun.points(plan, tmp_path / "results", lambda exp: 0.5)
    assert [(p.runs, p.done) for p in pts] == [(2, 1), (2, 0), (2, 0), (2, 0)]  # a failed run is not done
    assert pts[0].basis == "earlier runs" and pts[0].run_s == 30.0
    assert pts[1].basis == "bound" and pts[1].run_s == pytest.approx(dryrun.SETUP_S + 0.5 * 10)
    text = dryrun.render(plan, pts, tmp_path / "results")
    assert "8 run(s) in 4 point(s) x 2 repeat(s); 1 done, 7 to run" in text
    assert "w0 5 Mb/s" in text and "w0 50 Mb/s" in text
    # 7 runs left: one at the earlier run's 30 s, six at the bound's 19 s
    assert f"estimated wall time: {dryrun._duration(30 + 6 * (dryrun.SETUP_S + 5))}" in text


def test_force_counts_nothing_done_and_a_shard_only_its_runs(tmp_path):
    plan = _plan(tmp_path)
    (tmp_path / "results" / "s").mkdir(parents=True)
    pd.DataFrame([{"run_id": plan.experiments[0].run_id(0), "status": "ok", "wall_s": 30.0}]
                 ).to_parquet(tmp_path / "results" / "s" / "runs.parquet")
    assert sum(p.done for p in dryrun.points(plan, tmp_path / "results", lambda e: 1.0, force=True)) == 0
    shards = [sum(p.runs for p in dryrun.points(plan, tmp_path / "results", lambda e: 1.0, shard=(i, 3)))
              for i in range(3)]
    assert sum(shards) == 8 and max(shards) - min(shards) <= 1


def test_no_bound_means_no_estimate_and_the_timeout_caps_one(tmp_path):
    plan = _plan(tmp_path, repeats=1)
    text = dryrun.render(plan, dryrun.points(plan, tmp_path, lambda e: None), tmp_path)
    assert "(+ 4 run(s) without an estimate)" in text
    slow = dryrun.points(plan, tmp_path, lambda e: 1e6)
    assert all(p.run_s == pytest.approx(dryrun.SETUP_S + plan.experiments[0].timeout_s) for p in slow)


def test_the_bound_is_the_larger_of_compute_and_communication(tmp_path):
    plan = _plan(tmp_path, repeats=1)
    slow, fast = plan.experiments[0], plan.experiments[1]  # fifo at 5 and 50 Mb/s
    assert _iteration_bound(slow) > _iteration_bound(fast) > 0
    tiny = load_plan(dump(tmp_path / "t.yaml", GOOD), _sections()).experiments[0]
    assert _iteration_bound(tiny) is None  # no profile of the tiny preset: no estimate


@pytest.mark.slow
def test_dry_run_of_the_priority8_sweep_creates_nothing(tmp_path):
    results = tmp_path / "results"
    r = inv("sweep", str(REPO / "configs" / "sweeps" / "priority8.yaml"), "--dry-run", "--results", str(results))
    assert r.returncode == 0, r.stderr
    assert "60 run(s) in 20 point(s) x 3 repeat(s); 0 done, 60 to run" in r.stdout
    assert "estimated wall time: " in r.stdout
    assert not results.exists() and not list(tmp_path.iterdir())
    t = inv("tune", str(REPO / "configs" / "sweeps" / "priority8.yaml"), "--scheduler", "bytescheduler",
            "--budget", "4", "--point", "1", "--dry-run", "--results", str(results))
    assert t.returncode == 0, t.stderr
    assert "budget 4 trial(s): 0 done, 4 to run" in t.stdout and not results.exists()


def test_a_fault_holds_the_job_for_its_duration(tmp_path):
    dump(tmp_path / "base.yaml", {**GOOD, "workload": {**GOOD["workload"], "preset": "small", "iterations": 10},
                                  "faults": [{"at_s": 1, "kind": "stop", "target": "worker0", "for_s": 5}]})
    plan = load_plan(dump(tmp_path / "s.yaml", {"base": "base.yaml", "name": "s"}), _sections())
    (p,) = dryrun.points(plan, tmp_path, lambda exp: 0.5)
    assert p.run_s == pytest.approx(dryrun.SETUP_S + 0.5 * 10 + 5)


def test_the_forest_s_start_up_probe_is_in_the_estimate(tmp_path):
    """On measured bandwidth the forest probes n + 2 rounds of probe_s before its first iteration
    (20 workers: 22 x 0.25 s, 176 s of wall clock at dilation 32, more than its iterations take);
    on configured rates, and for every other scheduler, nothing."""
    base = {**GOOD, "scheduler": "forest", "roles": {"servers": [], "workers": ["w0", "w1", "ps"]},
            "workload": {**GOOD["workload"], "preset": "small", "iterations": 10, "compute": "replay"},
            "time_dilation": 4}
    dump(tmp_path / "base.yaml", base)
    plan = load_plan(dump(tmp_path / "s.yaml", {"base": "base.yaml", "name": "s",
                                                "grid": {"schedulers.forest.bandwidth": ["measured", "configured"]}}),
                     _sections())
    measured, configured = plan.experiments
    assert (_startup_s(measured), _startup_s(configured)) == (5 * 0.25, 0.0)
    assert _startup_s(plan.experiments[0].model_copy(update={"scheduler": "ring"})) == 0.0
    got = [p.run_s for p in dryrun.points(plan, tmp_path, lambda exp: 0.5, startup=_startup_s)]
    assert got == pytest.approx([dryrun.SETUP_S + (0.5 * 10 + 1.25) * 4, dryrun.SETUP_S + 0.5 * 10 * 4])
    assert Forest.startup_s(ForestParams(), 20) == 22 * 0.25
    assert Forest.startup_s(ForestParams(fan_rounds=2, probe_s=0.5), 4) == (2 + 2 * 4) * 0.5
