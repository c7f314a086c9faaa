"""A re-planning run against the optimum averaged over the run, and what its probes cost.

A run's `efficiency` (analysis/bounds.py) sets its mean iteration against the bound on the
capacity averaged over its window: a lower bound, but a loose one when the bandwidth steps
inside the window, since the average lends the slow part the fast part's capacity (a
scheduler that adapted at once, with no probe, still stays under 1). What a re-planning
scheduler should be held to is the optimum of each iteration's own bandwidth: per measured
iteration, the same model's bound on the capacity averaged over that iteration's interval
(`instant_bounds`), summed, over the iterations' summed times (`of_instant_optimum`). Where
one link limits, the two agree; with links in series that are fast in turn, buffering could
beat it (capacity.py's docstring), so it is a yardstick, not a bound.

The probes' cost is their own time: each re-plan's record (scheduler_info.json `plans`)
says how long its probe held the job (`probe_s`, READY to estimate), and the iteration it
ran in is the one that pays it. The record is the workers' clock, k times the emulated one in
a time-dilated run, so it is divided by k here, as the iterations already are.
"""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from analysis.bounds import comm_bound_s, payload_graph, run_pattern
from analysis.capacity import run_capacities, time_dilation
from contracts.iterations import measured

DIGITS = 4  # capacities equal to this many significant digits share one LP


def plan_records(run_dir: Path) -> list[dict]:
    """The forest's plan records of a run (scheduler_info.json `plans`), [] without any."""
    info = run_dir / "scheduler_info.json"
    return json.loads(info.read_text()).get("plans", []) if info.exists() else []


def iteration_windows(run, run_dir: Path) -> pd.DataFrame:
    """Per measured iteration: its time (the workers' mean), and its interval in the monitor's
    clock (the workers' earliest start to latest end)."""
    its = pd.read_parquet(run_dir / "iterations.parquet", columns=["iteration", "start", "end"])
    its = its[measured(its["iteration"], run["workload.warmup"], run["workload.iterations"])]
    t0 = float(run["monitor_t0_wall"])
    g = its.assign(t=its["end"] - its["start"]).groupby("iteration")
    return pd.DataFrame({"t": g["t"].mean(), "w0": g["start"].min() - t0, "w1": g["end"].max() - t0})


def instant_bounds(run, run_dir: Path, windows: pd.DataFrame) -> pd.Series:
    """Per iteration of `windows`: the run's bound model on the capacity it had during it."""
    p = run_pattern(run, run_dir)
    caps = run_capacities(p.line_graph, run, run_dir, list(zip(windows["w0"], windows["w1"], strict=True)))
    cache: dict[tuple, float] = {}
    out = {}
    for it, cap in zip(windows.index, caps, strict=True):
        avail = payload_graph(cap.graph)
        key = tuple(float(f"{c:.{DIGITS}g}") for _, _, c in sorted(avail.edges(data="capacity")))
        if key not in cache:
            cache[key] = max(p.compute_s, comm_bound_s(p, avail))
        out[it] = cache[key]
    return pd.Series(out, name="bound_s")


def summary(run, run_dir: Path) -> dict | None:
    """One re-planning run: its iterations against the optimum averaged over them, the
    re-plans' probes and what they took; None where the run cannot be placed in time."""
    if pd.isna(run.get("monitor_t0_wall")) or not (run_dir / "iterations.parquet").exists() \
            or not any((run_dir / "roles").glob("worker*.json")):
        return None   # older rows, and the committed example sets, which keep no roles
    win = iteration_windows(run, run_dir)
    if win.empty:
        return None
    win["bound_s"] = instant_bounds(run, run_dir, win)
    k = time_dilation(run_dir)
    replans = [{**p, "probe_s": float(p.get("probe_s") or 0) / k}
               for p in plan_records(run_dir) if p.get("iteration", 0) > 0]
    probe_s = sum(p["probe_s"] for p in replans if p["iteration"] in win.index)
    after = win[win.index > replans[-1]["iteration"]] if replans else win.iloc[0:0]
    return {"of_instant_optimum": win["bound_s"].sum() / win["t"].sum(),
            "replans": [(p["iteration"], p.get("reason", ""), p["probe_s"]) for p in replans],
            "probe_s": probe_s, "probe_share": probe_s / win["t"].sum(),
            "without_probes": win["bound_s"].sum() / (win["t"].sum() - probe_s),
            "after_last": after["bound_s"].sum() / after["t"].sum() if len(after) else float("nan"),
            "iterations": len(win), "time_s": win["t"].sum(), "optimum_s": win["bound_s"].sum()}
