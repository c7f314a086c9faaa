"""Sweeps on Mininet, as root: kill -9 mid-sweep, then resume runs each point once (the killed
sweep's claim on its run in flight taken over)."""
from __future__ import annotations

import os
import signal
import time

import pandas as pd

from tests.conftest import invoke, invoke_popen
from tests.factories import GOOD, dump


def test_kill_9_mid_sweep_then_resume_runs_each_once(tmp_path, no_leftovers, procs):
    cfg = {**GOOD, "name": "k9", "timeout_s": 120, "seeds": [0, 1, 2],
           "workload": {"model": "cnn", "preset": "tiny", "iterations": 25, "batch_size": 8}}
    path = dump(tmp_path / "k9.yaml", cfg)
    results = tmp_path / "results"
    proc = procs.add(invoke_popen("sweep", str(path), "--results", str(results)))
    runs = results / "k9" / "runs.parquet"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and not (runs.exists() and len(pd.read_parquet(runs)) >= 1):
        time.sleep(0.2)
    time.sleep(1.5)  # somewhere inside the second run
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(10)
    before = pd.read_parquet(runs)
    assert 1 <= len(before) < 3
    r = invoke("sweep", str(path), "--results", str(results), timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    after = pd.read_parquet(runs)
    assert len(after) == 3 and after["run_id"].is_unique and (after["status"] == "ok").all()
    assert "skipped" in r.stderr and "cleaned up" in r.stderr
    # the killed sweep's claim on its run in flight, which no dead process holds
    assert f"taking over the claim of pid {proc.pid}" in r.stderr and "which is no longer running" in r.stderr
    # rows written before the kill are untouched
    first = before.iloc[0]
    assert after.set_index("run_id").loc[first["run_id"], "started_at"] == first["started_at"]
