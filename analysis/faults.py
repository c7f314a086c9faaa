"""Faults in a sweep (`faults:` in a config): which runs survived them, what each cost in iteration time,
and how long a fault that ended a run took to be named.

Each run's faults are in its row (`faults`, the config's list as JSON) and, as they
happened, in its `faults.parquet` (emu/run/faults.py: planned and actual start and end,
`cost_s`, `stall_max_s`, `reason_after_s`). A run's fault *scenario* is a short name for
its list ("stop worker0 5 s", "link_down w1-s1 2 s x3"), so runs of one scenario compare
across schedulers, and the runs without a fault are its baseline.
"""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd

NONE = "no fault"


def scenario(faults_json) -> str:
    """A short name for a run's list of faults; NONE for none (or a row from before faults)."""
    try:
        faults = json.loads(faults_json) if isinstance(faults_json, str) and faults_json else []
    except ValueError:
        faults = []
    if not faults:
        return NONE
    counts = Counter()
    for f in faults:
        target = "-".join(f["target"]) if isinstance(f["target"], list) else f["target"]
        cpu = f" to {f['cpu']:g} CPU" if f.get("cpu") is not None else ""
        dur = f" {f['for_s']:g} s" if f.get("for_s") is not None else ""
        counts[f"{f['kind']} {target}{cpu}{dur}"] += 1
    return ", ".join(k + (f" x{n}" if n > 1 else "") for k, n in counts.items())


def with_scenarios(runs: pd.DataFrame) -> pd.DataFrame:
    col = runs["faults"] if "faults" in runs else pd.Series([None] * len(runs), index=runs.index)
    return runs.assign(scenario=col.map(scenario))


def has_faults(runs: pd.DataFrame) -> bool:
    return bool((with_scenarios(runs)["scenario"] != NONE).any())


def load_faults(sweep_dir: Path, runs: pd.DataFrame) -> pd.DataFrame:
    """Every run's faults.parquet, with its scheduler, scenario and status."""
    frames = []
    for _, run in with_scenarios(runs).iterrows():
        path = Path(sweep_dir) / run["run_id"] / "faults.parquet"
        if path.exists():
            frames.append(pd.read_parquet(path).assign(run_id=run["run_id"], scheduler=run["scheduler"],
                                                       scenario=run["scenario"],
                                                       status=run["status"]))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def job_iterations(iters: pd.DataFrame) -> pd.DataFrame:
    """A run's iterations as the job makes them: iteration k ends when its last worker ends
    it, and takes that end less iteration k-1's (as emu/run/faults.py counts a fault's cost)."""
    ends = iters.groupby("iteration")["end"].max().sort_index()
    return pd.DataFrame({"iteration": ends.index[1:], "end": ends.values[1:], "duration_s": np.diff(ends.values)})


def summary(runs: pd.DataFrame, faults: pd.DataFrame) -> pd.DataFrame:
    """Per scenario and scheduler: runs that survived, median and mean iteration (the median
    hides a pause, the mean shows it), what the faults cost per run (median over runs of the
    sum of `cost_s`), the longest time a role went without progress around a fault, and,
    for runs a fault ended, the time from the fault to the run's reason."""
    runs = with_scenarios(runs)
    rows = []
    for (scen, sched), g in runs.groupby(["scenario", "scheduler"], sort=False):
        ok = g[g["status"] == "ok"]
        f = faults[(faults["scenario"] == scen) & (faults["scheduler"] == sched)] if len(faults) else faults
        per_run = f.groupby("run_id")["cost_s"].sum(min_count=1) if len(f) else pd.Series(dtype=float)
        survived = f[f["status"] == "ok"] if len(f) else f
        named = f["reason_after_s"].dropna() if len(f) else pd.Series(dtype=float)
        rows.append({"scenario": scen, "scheduler": sched, "runs": len(g), "survived": len(ok),
                     "median iteration (ms)": ok["iter_time_median_s"].median() * 1e3 if len(ok) else np.nan,
                     "mean iteration (ms)": ok["iter_time_mean_s"].median() * 1e3 if len(ok) else np.nan,
                     "fault cost (s)": per_run.median() if len(per_run.dropna()) else np.nan,
                     "longest stall (s)": survived["stall_max_s"].max() if len(survived) else np.nan,
                     "named after (s)": named.max() if len(named) else np.nan})
    out = pd.DataFrame(rows)
    order = [NONE] + [s for s in dict.fromkeys(out["scenario"]) if s != NONE]
    out["_o"] = out["scenario"].map(order.index)
    return out.sort_values(["_o"], kind="stable").drop(columns="_o").reset_index(drop=True)
