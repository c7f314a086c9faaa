"""`time_dilation: auto` end to end on Mininet (emu/sweeps/autodilate.py): the k chosen from this
machine's calibration, the run at it, a second try where the CPU check failed, and the row,
run directory and resume that follow. The calibration is given (a cache file for this machine
written first, in a directory of the test's own), so the test does not spend a minute calibrating;
the calibration runs themselves are the same run path as any run."""
from __future__ import annotations

import json

import pandas as pd
import pytest
import yaml

from emu.config.autodilation import SchedulerCost
from emu.config.plan import load_plan
from emu.sweeps import calibrate
from tasks import _sections
from tests.conftest import invoke
from tests.factories import experiment, star_topology

AUTO = experiment(name="auto", timeout_s=120, time_dilation="auto", topology=star_topology(ps=100, w0=50, w1=50),
                  workload={"model": "cnn", "preset": "small", "compute": "replay", "speedup": 2.0,
                            "iterations": 6, "warmup": 2})


@pytest.mark.slow
def test_an_auto_run_picks_its_k_runs_and_resumes(tmp_path, no_leftovers, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("SCHEDLAB_CACHE_DIR", str(cache))   # the subprocess's cache: only this test's
    path = tmp_path / "auto.yaml"
    path.write_text(yaml.safe_dump(AUTO))
    exp = load_plan(path, _sections()).experiments[0]
    # 1.6 CPUs at k = 1 (a server at 0.2 Gbit/s, two workers at 0.1 each): k = 1 never fits 0.45 idle
    # on 2 CPUs; k = 2 does while the machine's own load stays under 0.3 CPUs
    desc = calibrate.describe_machine()
    calibrate.store(calibrate.cache_path(desc, cache), desc, "fifo",
                    SchedulerCost("fifo", {"server": [(0.2, 4.0)], "worker": [(0.1, 4.0)]}, 0.0, 2))
    results = tmp_path / "results"
    r = invoke("run", str(path), "--results", str(results), timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "time_dilation auto: k=" in r.stderr and "calibrating" not in r.stderr
    runs = pd.read_parquet(results / "auto" / "runs.parquet")
    assert len(runs) == 1
    row = runs.iloc[0]
    assert row["run_id"] == exp.run_id(0) and row["status"] == "ok", row["reason"]
    tries = json.loads(row["time_dilation_tries"])
    first_k = tries[0]["k"]
    assert first_k >= 2 and f"at k={first_k}" in row["time_dilation_reason"] and row["time_dilation_auto"]
    assert row["time_dilation"] == tries[-1]["k"] and tries[-1]["fidelity_ok"] == row["fidelity_ok"]
    run_dir = results / "auto" / row["run_id"]
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["time_dilation"] == "auto"
    assert json.loads((run_dir / "meta.json").read_text())["time_dilation"] == row["time_dilation"]
    # a second try exactly where the first failed the CPU check; its files kept under tries/1/
    assert len(tries) == (2 if tries[0]["cpu_idle_min"] < 0.35 else 1)
    if len(tries) == 2:
        assert tries[1]["k"] > first_k
        first = run_dir / "tries" / "1"
        assert json.loads((first / "meta.json").read_text())["time_dilation"] == first_k
        assert (first / "iterations.parquet").exists() and json.loads((first / "row.json").read_text())[
            "time_dilation"] == first_k
    # emulated time: a 6-iteration run of 100 and 50 Mb/s links, whatever k it ran at
    assert 0.05 < row["iter_time_median_s"] < 1.0
    again = invoke("run", str(path), "--results", str(results), timeout=120)
    assert again.returncode == 0 and "skipped" in again.stderr
    assert len(pd.read_parquet(results / "auto" / "runs.parquet")) == 1
