"""Partitioning against a per-message start-up cost (the Mercury paper's argument,
`configs/sweeps/priority_startup.yaml`).

The Mercury paper (TPDS 2023) argues that "a startup time slot inserted before every tensor
partition" takes away what tensor partitioning (ByteScheduler) gains, while Mercury, whose
packets are segments of one stream per tensor, pays it once per tensor and is indifferent.
Here that is read off as bytescheduler's iteration time against its partition size, one
curve per start-up cost, beside fifo, p3 and mercury at the same cost.

A run's start-up cost is its scheduler's resolved `startup_us` (0 where the resolved config
leaves it out, as it does a zero cost: `schedulers/ps/client.py`), and its partition size is
bytescheduler's resolved `partition_numel` (none for the other schedulers). Runs are grouped
by (configuration, scheduler, start-up cost, partition), whatever their `label`; everything
else about them (repeats, seeds, other tunables) is pooled, and each group's iteration time
and interval are computed as `analysis.speedup.iteration_times` computes a scheduler's.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from analysis.speedup import CONFIDENCE, iteration_times, speedups
from analysis.tables import add_configurations

# The report section of the schedulers it names (their `report_sections`, contracts/scheduler_info.py),
# so the one module of analysis that names them.
SECTION = "startup"
PARTITIONED = "bytescheduler"  # whose partition is swept
STREAMED = "mercury"  # pays the cost once per tensor: compared with the best partition
REFERENCES = ("fifo", "p3", STREAMED)  # drawn as one level per start-up cost
REFERENCE_STYLES = dict(zip(REFERENCES, ("--", ":", "-.")))  # their line styles in plots.startup_plot


def annotate(runs: pd.DataFrame) -> pd.DataFrame:
    """`runs` with `scheduler_name` (the registry name), `startup_us` and `partition_numel`."""
    names = runs["scheduler_name"] if "scheduler_name" in runs else runs["scheduler"]

    def own(name: str, i, param: str) -> float:
        col = f"schedulers.{name}.{param}"
        v = runs.at[i, col] if col in runs else None
        return float(v) if v is not None and not pd.isna(v) else math.nan

    startup = [own(n, i, "startup_us") for i, n in names.items()]
    part = [own(n, i, "partition_numel") if n == PARTITIONED else math.nan for i, n in names.items()]
    return runs.assign(scheduler_name=names, startup_us=np.nan_to_num(startup, nan=0.0), partition_numel=part)


def varies(runs: pd.DataFrame) -> bool:
    """The runs vary both the start-up cost and bytescheduler's partition (at one cost)."""
    r = annotate(runs)
    bs = r[r["scheduler_name"] == PARTITIONED]
    return r["startup_us"].nunique() > 1 and bool((bs.groupby("startup_us")["partition_numel"].nunique() > 1).any())


def _key(name: str, startup: float, part: float) -> str:
    return f"{name} | {startup:g} | {part:g}"


def times(runs: pd.DataFrame, iters: pd.DataFrame, confidence: float = CONFIDENCE, n_resamples: int = 9999,
          seed: int = 0) -> pd.DataFrame:
    """One row per (configuration, scheduler, start-up cost, partition): its iteration time
    (s) with its interval, as `iteration_times` computes it (`unit`: repeats or iterations)."""
    r = annotate(runs if "config_id" in runs else add_configurations(runs))
    keys = [_key(*k) for k in zip(r["scheduler_name"], r["startup_us"], r["partition_numel"])]
    setting = dict(zip(keys, zip(r["scheduler_name"], r["startup_us"], r["partition_numel"])))
    t = iteration_times(r.assign(scheduler=keys), iters, confidence, n_resamples, seed)
    parts = pd.DataFrame([setting[k] for k in t["scheduler"]], columns=["scheduler", "startup_us", "partition_numel"],
                         index=t.index)
    t = pd.concat([t.drop(columns=["scheduler"]), parts], axis=1)
    cols = ["config_id", "config", "scheduler", "startup_us", "partition_numel", "iter_time_s", "ci_low", "ci_high",
            "confidence", "n", "unit", "runs"]
    return t[cols].sort_values(["config_id", "startup_us", "scheduler", "partition_numel"],
                               kind="stable").reset_index(drop=True)


def summary(runs: pd.DataFrame, iters: pd.DataFrame, confidence: float = CONFIDENCE, n_resamples: int = 9999,
            seed: int = 0) -> pd.DataFrame:
    """Per (configuration, start-up cost): bytescheduler's best partition and its iteration
    time (s), its time at its largest partition and the gain of the best over it, mercury's,
    fifo's and p3's times, and mercury's speed-up over the best bytescheduler (its time /
    mercury's) with its interval. NaN where a scheduler has no run at that cost."""
    runs = runs if "config_id" in runs else add_configurations(runs)
    t = times(runs, iters, confidence, n_resamples, seed)
    r = annotate(runs)
    rows = []
    for (cid, cost), grp in t.groupby(["config_id", "startup_us"], sort=False):
        bs = grp[grp["scheduler"] == PARTITIONED]
        level = {s: grp.loc[grp["scheduler"] == s, "iter_time_s"] for s in REFERENCES}
        row = {"config_id": cid, "config": grp["config"].iloc[0], "startup_us": cost,
               **{f"{s}_s": (v.iloc[0] if len(v) == 1 else math.nan) for s, v in level.items()},
               "best_partition": math.nan, "bytescheduler_best_s": math.nan, "largest_partition": math.nan,
               "bytescheduler_largest_s": math.nan, "partitioning_gain": math.nan,
               "mercury_over_best": math.nan, "ci_low": math.nan, "ci_high": math.nan, "unit": ""}
        if len(bs):
            best, largest = bs.loc[bs["iter_time_s"].idxmin()], bs.loc[bs["partition_numel"].idxmax()]
            row.update(best_partition=best["partition_numel"], bytescheduler_best_s=best["iter_time_s"],
                       largest_partition=largest["partition_numel"], bytescheduler_largest_s=largest["iter_time_s"],
                       partitioning_gain=largest["iter_time_s"] / best["iter_time_s"])
            if len(level[STREAMED]) == 1:
                row.update(_over(r, iters, cid, cost, best["partition_numel"], confidence, n_resamples, seed))
        rows.append(row)
    return pd.DataFrame(rows)


def _over(r: pd.DataFrame, iters: pd.DataFrame, cid: str, cost: float, part: float, confidence: float,
          n_resamples: int, seed: int) -> dict:
    """Mercury's speed-up over bytescheduler at partition `part`, both at start-up `cost` on
    configuration `cid`, with its interval (`analysis.speedup.speedups`)."""
    here = r[(r["config_id"] == cid) & (r["startup_us"] == cost)]
    bs = (here["scheduler_name"] == PARTITIONED) & (here["partition_numel"] == part)
    pair = here[bs | (here["scheduler_name"] == STREAMED)]
    pair = pair.assign(scheduler=np.where(bs[pair.index], "best", STREAMED))
    s = speedups(pair, iters, baseline="best", confidence=confidence, n_resamples=n_resamples, seed=seed).iloc[0]
    return {"mercury_over_best": s["speedup"], "ci_low": s["ci_low"], "ci_high": s["ci_high"], "unit": s["unit"]}
