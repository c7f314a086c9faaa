"""End to end on a real Mininet network: runs, failures, Ctrl-C, kill -9 and clean.

Each test runs `invoke run` as a user would, in a subprocess, and checks both the results
on disk and that nothing of ours is left on the machine afterwards.
"""
from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pandas as pd
import pytest
import yaml

from tests.conftest import REPO, interfaces, invoke, invoke_popen, wait_for, worker_progress
from tests.factories import experiment, star_topology

TINY = experiment(name="e2e", timeout_s=120, topology=star_topology(ps=100, w0=40, w1=20),
                  workload={"model": "cnn", "preset": "tiny", "iterations": 6, "batch_size": 8, "warmup": 1})


def config(tmp_path: Path, **changes) -> Path:
    cfg = json.loads(json.dumps(TINY))
    for k, v in changes.items():
        node = cfg
        *parents, last = k.split("__")
        for p in parents:
            node = node[p]
        node[last] = v
    path = tmp_path / "e2e.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path



def progress(results: Path, worker: str = "worker1") -> int:
    return worker_progress(results, "e2e", worker)


def test_run_end_to_end_and_resume(tmp_path, no_leftovers):
    results = tmp_path / "results"
    r = invoke("run", str(config(tmp_path)), "--results", str(results))
    assert r.returncode == 0, r.stderr[-2000:]
    runs = pd.read_parquet(results / "e2e" / "runs.parquet")
    assert len(runs) == 1
    row = runs.iloc[0]
    assert row["status"] == "ok", row["reason"]
    assert row["params_consistent"] and row["compute_mode"] == "real"
    assert row["iter_time_median_s"] > 0 and row["iterations_measured"] == 5
    run_dir = results / "e2e" / row["run_id"]
    iters = pd.read_parquet(run_dir / "iterations.parquet")
    assert sorted(iters["rank"].unique()) == [0, 1] and len(iters) == 12
    assert (iters["end"] > iters["start"]).all()
    meta = json.loads((run_dir / "meta.json").read_text())
    assert meta["versions"]["torch"] and meta["kernel"]
    assert (run_dir / "logs" / "worker0.err").exists() and (run_dir / "config.yaml").exists()

    # The monitor saw the gradients cross the links, never faster than configured on average.
    links = pd.read_parquet(run_dir / "links.parquet")
    assert set(links["link"]) == {"ps->s1", "s1->ps", "w0->s1", "s1->w0", "w1->s1", "s1->w1"}
    w1_up = links[links["link"] == "w1->s1"]
    sent = (w1_up["tx_bytes_per_s"] * 0.1).sum()
    assert sent > 6 * 4 * 1000  # at least one tiny model's gradients per iteration
    busy = w1_up[w1_up["tx_bytes_per_s"] > 0]
    assert busy["tx_bytes_per_s"].mean() * 8 <= 20e6 * 1.05

    # Same command again: the completed run is skipped, not duplicated.
    again = invoke("run", str(config(tmp_path)), "--results", str(results))
    assert again.returncode == 0 and "skipped" in again.stderr
    assert len(pd.read_parquet(results / "e2e" / "runs.parquet")) == 1


def test_crashed_worker_fails_the_run_cleanly(tmp_path, no_leftovers, procs):
    results = tmp_path / "results"
    proc = procs.add(invoke_popen("run", str(config(tmp_path, workload__iterations=10_000)), "--results", str(results)))
    wait_for(lambda: progress(results) >= 2, 120, "worker1 to train")
    state = Path("/run/schedlab") / str(proc.pid)
    rec = wait_for(lambda: list(state.glob("proc-role-worker1-*.json")), 10, "worker1's record")
    os.killpg(json.loads(rec[0].read_text())["pid"], signal.SIGKILL)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1, err[-2000:]
    row = pd.read_parquet(results / "e2e" / "runs.parquet").iloc[0]
    assert row["status"] == "failed"
    assert row["reason"].startswith("worker1 on w1 was killed by SIGKILL"), row["reason"]
    assert (results / "e2e" / row["run_id"] / "logs" / "server0.err").exists()


def test_ctrl_c_tears_down_and_records(tmp_path, no_leftovers, procs):
    results = tmp_path / "results"
    proc = procs.add(invoke_popen("run", str(config(tmp_path, workload__iterations=10_000)), "--results", str(results)))
    wait_for(lambda: progress(results) >= 2, 120, "training to start")
    os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C sends to the foreground group
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err[-2000:]
    assert "Traceback" not in err
    row = pd.read_parquet(results / "e2e" / "runs.parquet").iloc[0]
    assert row["status"] == "interrupted" and "SIGINT" in row["reason"]


def test_timeout_is_recorded(tmp_path, no_leftovers):
    results = tmp_path / "results"
    r = invoke("run", str(config(tmp_path, timeout_s=6, workload__iterations=10_000)), "--results", str(results))
    assert r.returncode == 1
    row = pd.read_parquet(results / "e2e" / "runs.parquet").iloc[0]
    assert row["status"] == "failed" and row["reason"].startswith("timed out after 6 s (timeout_s)"), row["reason"]


def test_kill_9_then_clean_removes_everything(tmp_path, no_leftovers, procs):
    results = tmp_path / "results"
    before = interfaces()
    proc = procs.add(invoke_popen("run", str(config(tmp_path, workload__iterations=10_000)), "--results", str(results)))
    wait_for(lambda: progress(results) >= 1, 120, "training to start")
    os.killpg(proc.pid, signal.SIGKILL)  # the orchestrator dies without any teardown
    proc.wait(10)
    assert interfaces() - before, "expected the killed run to leave its network behind"
    r = invoke("clean", timeout=60)
    assert r.returncode == 0, r.stderr
    # The bridge always outlives its orchestrator; which processes do depends on timing
    # (host shells exit when their pipe to the orchestrator closes). The fixture checks
    # that nothing at all is left.
    assert "removed link s1" in r.stdout, r.stdout
    assert not (Path("/run/schedlab") / str(proc.pid)).exists()


def test_time_varying_shaping_and_cross_traffic_run(tmp_path, no_leftovers):
    """The shipped time-varying example, shortened, plus a cross flow: every table and verdict is there."""
    results = tmp_path / "results"
    r = invoke("run", str(REPO / "configs" / "examples" / "time_varying.yaml"),
               "--results", str(results), "--set", "workload.iterations=12", "--set", "workload.preset=tiny",
               "--set", "cross_traffic=[{src: ps, dst: w0, start_s: 0.5, stop_s: 3}]")
    assert r.returncode == 0, r.stderr[-2000:]
    row = pd.read_parquet(results / "time-varying" / "runs.parquet").iloc[0]
    run_dir = results / "time-varying" / row["run_id"]
    shaping = pd.read_parquet(run_dir / "shaping.parquet")
    assert "s1->w1" in set(shaping["link"])  # the Mahimahi trace changes every 100 ms
    assert row["shaping_lag_max_s"] < 0.1
    assert {"fidelity_ok", "fidelity_cpu_idle_min", "fidelity_rate_excess_max", "fidelity_saturation_judged_s"} \
        <= set(row.index)
    assert row["fidelity_rate_excess_max"] <= 0.05 or not row["fidelity_ok"]
    # As root with pyroute2 installed (the lock has it), the netlink backend ran: queues at 100 Hz.
    assert row["monitor_backend"] == "netlink" and row["monitor_qdisc_interval_s"] == 0.01
    assert json.loads(row["cross_traffic"])[0]["mbps"] > 0
    for table in ("links", "qdiscs", "cpu"):
        assert len(pd.read_parquet(run_dir / f"{table}.parquet")) > 10


# ---------------------------------------------------------------- a fresh machine's settings

FRESH_ALLOWED = "reno bbr"  # what a fresh machine of the project's kind allows in namespaces


@pytest.fixture
def fresh_machine():
    """The machine as a newcomer has it: only reno and bbr allowed in namespaces. Every
    setting a run may change is compared afterwards; the machine's own values are put back."""
    from emu.testbed.machine import ALLOWED_CC, RUN_LIMITS, read_sysctl, write_sysctl

    keys = [ALLOWED_CC, *(limit.key for limit in RUN_LIMITS)]
    own = {k: read_sysctl(k) for k in keys}
    write_sysctl(ALLOWED_CC, FRESH_ALLOWED)
    fresh = {k: read_sysctl(k) for k in keys}
    try:
        yield fresh
    finally:
        for k, v in own.items():
            if read_sysctl(k) != v:
                write_sysctl(k, v)


def machine_now(fresh: dict) -> dict:
    from emu.testbed.machine import read_sysctl

    return {k: read_sysctl(k) for k in fresh}


def test_fresh_machine_runs_cubic_and_is_left_as_found(tmp_path, fresh_machine, no_leftovers):
    results = tmp_path / "results"
    r = invoke("run", str(config(tmp_path)), "--results", str(results), "--set", "tcp.congestion_control=cubic")
    assert r.returncode == 0, r.stderr[-2000:]
    row = pd.read_parquet(results / "e2e" / "runs.parquet").iloc[0]
    assert row["status"] == "ok" and row["tcp.congestion_control"] == "cubic", row["reason"]
    assert machine_now(fresh_machine) == fresh_machine
    meta = json.loads((results / "e2e" / row["run_id"] / "meta.json").read_text())
    assert meta["machine_settings_changed"]["net.ipv4.tcp_allowed_congestion_control"] == [
        FRESH_ALLOWED, FRESH_ALLOWED + " cubic"]


def test_fresh_machine_kill_9_then_clean_restores_settings(tmp_path, fresh_machine, no_leftovers, procs):
    results = tmp_path / "results"
    proc = procs.add(invoke_popen("run", str(config(tmp_path, workload__iterations=10_000)), "--results", str(results)))
    wait_for(lambda: progress(results) >= 1, 120, "training to start")
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(10)
    changed = machine_now(fresh_machine)
    assert changed["net.ipv4.tcp_allowed_congestion_control"] == FRESH_ALLOWED + " cubic"
    r = invoke("clean", timeout=60)
    assert r.returncode == 0, r.stderr
    assert "sysctl net.ipv4.tcp_allowed_congestion_control (restored to 'reno bbr')" in r.stdout, r.stdout
    assert machine_now(fresh_machine) == fresh_machine


def test_short_runs_are_never_faster_than_their_bounds(tmp_path, no_leftovers):
    """Two or three iterations, warm-up or none: every iteration waits for its own aggregates,
    so no scheduler's run beats its model's bound or the cut bound, and every run measures
    iterations - warmup iterations (the demo's network and model)."""
    from analysis import bounds

    cfg = json.loads(json.dumps(TINY))
    cfg["topology"]["hosts"] = [{"name": "ps", "bw_mbps": 100}, {"name": "w0", "bw_mbps": 50},
                                {"name": "w1", "bw_mbps": 25}]
    cfg["workload"].update(preset="small", batch_size=32, iterations=2, warmup=0)
    cfg["grid"] = {"workload.warmup": [0, 1]}
    cfg["zip"] = {"scheduler": ["fifo", "mercury", "ring"], "roles.servers": [["ps"], ["ps"], []]}
    path = tmp_path / "short.yaml"
    path.write_text(yaml.safe_dump(cfg))
    results = tmp_path / "results"
    r = invoke("run", str(path), "--results", str(results))
    assert r.returncode == 0, r.stderr[-2000:]
    runs = pd.read_parquet(results / "e2e" / "runs.parquet")
    assert len(runs) == 6 and (runs["status"] == "ok").all(), runs[["scheduler", "reason"]]
    assert (runs["iterations_measured"] == 2 - runs["workload.warmup"]).all()
    judged = bounds.annotate(runs, results / "e2e")
    tol = 1 + judged["fidelity.rate_tolerance"]
    shown = judged[["scheduler", "workload.warmup", "iter_time_median_s", "bound_s", "efficiency", "cut_efficiency"]]
    assert (judged["efficiency"] <= tol).all() and (judged["cut_efficiency"] <= tol).all(), shown
    assert judged["physics_ok"].all(), judged[["scheduler", "physics_reasons"]]
