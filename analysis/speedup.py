"""How much faster each scheduler trains than a baseline on the same configuration (by
default the scheduler declared the baseline, analysis/catalog.py), with 95% confidence
intervals from scipy, and the iteration times behind those ratios.

A single median on a shared machine says little, so every estimate carries an interval.
What it is computed over depends on how many runs there are; the `unit` column says which:

- ``repeats``: every scheduler of the configuration has at least `MIN_REPEATS` runs (repeats
  or seeds). One observation per run: its median iteration time (over workers and measured
  iterations, as `iter_time_median_s`). Runs are independent (fresh network and processes),
  so the interval covers run-to-run variation. Estimate: ratio of the geometric means of the
  run medians; interval: Welch's t interval on their logarithms (`scipy.stats.ttest_ind`,
  unequal variances), exponentiated. Not a bootstrap: with 3-5 runs a bootstrap of the
  mean covers the true ratio only ~83% of the time at a nominal 95% (it has 10 distinct
  resamples of 3 values), while this interval keeps ~95% (tests/unit/test_analysis.py checks it).
- ``iterations``: fewer runs. One observation per measured iteration of each run (the
  workers' mean time for it), pooled over the runs. Estimate: ratio of medians; interval:
  `scipy.stats.bootstrap` (BCa, percentile where BCa degenerates), the two samples
  resampled independently. Successive iterations are correlated and share their run's
  conditions, so this interval only reflects the noise within these runs and is narrower
  than a repeat-level one would be.
"""
from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

from analysis import catalog
from analysis.tables import add_configurations, load_iterations, load_runs, swept_keys

MIN_REPEATS = 3
CONFIDENCE = 0.95
METHOD = {  # how each unit's interval is computed, for figure titles and reports
    "repeats": "Welch t interval over the runs' log median iteration times",
    "iterations": "BCa bootstrap over pooled measured iterations",
}


def _median(*xs, axis=-1):
    return np.median(xs[0], axis=axis) if len(xs) == 1 else np.median(xs[0], axis=axis) / np.median(xs[1], axis=axis)


def bootstrap_ci(samples: tuple[np.ndarray, ...], statistic, confidence: float = CONFIDENCE,
                 n_resamples: int = 9999, seed: int = 0) -> tuple[float, float, float]:
    """(estimate, low, high) of `statistic(*samples)`, each sample resampled on its own.
    NaN bounds when a sample has fewer than 2 observations; a zero-width interval when
    every sample is constant (nothing to resample)."""
    samples = tuple(np.asarray(s, dtype=float) for s in samples)
    est = float(statistic(*samples))
    if any(len(s) < 2 for s in samples):
        return est, float("nan"), float("nan")
    if all(np.ptp(s) == 0 for s in samples):
        return est, est, est
    lo = hi = float("nan")
    for method in ("BCa", "percentile"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # DegenerateDataWarning: handled by the fallback
            res = stats.bootstrap(samples, statistic, n_resamples=n_resamples, confidence_level=confidence,
                                  method=method, vectorized=True, rng=np.random.default_rng(seed))
        lo, hi = (float(x) for x in res.confidence_interval)
        if np.isfinite(lo) and np.isfinite(hi):
            break
    return est, lo, hi


def log_t_ci(samples: tuple[np.ndarray, ...], confidence: float = CONFIDENCE) -> tuple[float, float, float]:
    """(estimate, low, high) of the geometric mean of one sample, or of the ratio of the
    geometric means of two (first / second), from a t interval on the logarithms (Welch's
    for two samples). NaN bounds with fewer than 2 observations in a sample."""
    logs = [np.log(np.asarray(s, dtype=float)) for s in samples]
    est = float(np.exp(logs[0].mean() - (logs[1].mean() if len(logs) > 1 else 0.0)))
    if any(len(x) < 2 for x in logs):
        return est, float("nan"), float("nan")
    if all(np.ptp(x) == 0 for x in logs):
        return est, est, est
    res = stats.ttest_1samp(logs[0], 0.0) if len(logs) == 1 else stats.ttest_ind(logs[0], logs[1], equal_var=False)
    ci = res.confidence_interval(confidence)
    return est, float(np.exp(ci.low)), float(np.exp(ci.high))


def interval(samples: tuple[np.ndarray, ...], unit: str, confidence: float = CONFIDENCE, n_resamples: int = 9999,
             seed: int = 0) -> tuple[float, float, float]:
    """The estimate and interval of one sample's level or two samples' ratio, by `unit`."""
    if unit == "repeats":
        return log_t_ci(samples, confidence)
    return bootstrap_ci(samples, _median, confidence, n_resamples, seed)


def job_iterations(iters: pd.DataFrame) -> pd.DataFrame:
    """One row per (run, iteration): the workers' mean iteration time (they run in lock-step)."""
    t = iters.assign(time_s=iters["end"] - iters["start"])
    return t.groupby(["run_id", "iteration"], as_index=False)["time_s"].mean()


def _observations(runs: pd.DataFrame, iters: pd.DataFrame, unit: str) -> dict[str, np.ndarray]:
    """scheduler -> its observations on one configuration (see the module docstring)."""
    ids = set(runs["run_id"])
    mine = iters[iters["run_id"].isin(ids)]
    sched = runs.set_index("run_id")["scheduler"]
    if unit == "repeats":
        per_run = (mine["end"] - mine["start"]).groupby(mine["run_id"]).median()
        return {s: per_run[per_run.index.map(sched) == s].to_numpy() for s in runs["scheduler"].unique()}
    job = job_iterations(mine)
    return {s: job.loc[job["run_id"].map(sched) == s, "time_s"].to_numpy() for s in runs["scheduler"].unique()}


def _unit(grp: pd.DataFrame) -> str:
    return "repeats" if grp.groupby("scheduler")["run_id"].nunique().min() >= MIN_REPEATS else "iterations"


def _point_cols(runs: pd.DataFrame) -> list[str]:
    return [f"point.{k}" for k in swept_keys(runs)]


def baseline_variant(grp: pd.DataFrame, baseline: str) -> str | None:
    """The variant (a `scheduler` value) that is `baseline` on one configuration's runs, None
    where it did not run there.

    The variant named exactly `baseline` if there is one (fifo keeps its plain name wherever
    it has one treatment per label). Otherwise, where `baseline` is a scheduler that ran here
    as variants (`tables.variant_names`), its unlabelled ones are preferred to labelled ones,
    and a single candidate is the baseline. Several are not guessed between (which of fifo on
    one server and on two is "the" fifo?): ValueError names them, so that one gets a `label:`
    or is passed as `baseline` by its name."""
    if baseline in set(grp["scheduler"]):
        return baseline
    if "scheduler_name" not in grp:
        return None
    mine = grp[grp["scheduler_name"] == baseline]
    if mine.empty:
        return None
    if "label" in mine:
        plain = mine[~mine["label"].map(lambda v: isinstance(v, str) and v != "")]
        mine = plain if len(plain) else mine
    candidates = list(dict.fromkeys(mine["scheduler"]))
    if len(candidates) == 1:
        return candidates[0]
    raise ValueError(f"baseline {baseline!r} is ambiguous on configuration {grp['config'].iloc[0]!r}: it ran as "
                     + ", ".join(repr(c) for c in sorted(candidates)) + "; label all but one of them (`label:`) "
                     "or pass one of these names as the baseline")


def speedups(runs: pd.DataFrame, iters: pd.DataFrame, baseline: str | None = None, confidence: float = CONFIDENCE,
             n_resamples: int = 9999, seed: int = 0) -> pd.DataFrame:
    """One row per (configuration, scheduler variant other than the baseline): speedup =
    baseline's iteration time / the variant's, with its interval (ci_low, ci_high), the number
    of observations of each side (n, n_baseline) and what they are (unit). Variants are
    treatments (`tables.variant_names`): a swept tunable gives a row per value. The baseline
    is the configuration's `baseline` variant (`baseline_variant`; its name in `baseline`).
    Configurations without a baseline run get no rows. `runs` needs completed runs only;
    `iters` their measured (post-warm-up) iterations. `baseline` None: the declared one."""
    baseline = catalog.baseline() if baseline is None else baseline
    if "config_id" not in runs:
        runs = add_configurations(runs)
    points = _point_cols(runs)
    rows = []
    for cid, grp in runs.groupby("config_id", sort=False):
        base = baseline_variant(grp, baseline)
        if base is None:
            continue
        unit = _unit(grp)
        obs = _observations(grp, iters, unit)
        for sched in grp["scheduler"].unique():
            if sched == base:
                continue
            est, lo, hi = interval((obs[base], obs[sched]), unit, confidence, n_resamples, seed)
            first = grp.iloc[0]
            rows.append({"config_id": cid, "config": first["config"], **{p: first[p] for p in points},
                         "scheduler": sched, "baseline": base, "speedup": est, "ci_low": lo, "ci_high": hi,
                         "confidence": confidence, "n": len(obs[sched]), "n_baseline": len(obs[base]),
                         "unit": unit, "runs": int((grp["scheduler"] == sched).sum()),
                         "runs_baseline": int((grp["scheduler"] == base).sum())})
    cols = ["config_id", "config", *points, "scheduler", "baseline", "speedup", "ci_low", "ci_high", "confidence",
            "n", "n_baseline", "unit", "runs", "runs_baseline"]
    return pd.DataFrame(rows, columns=cols)


def iteration_times(runs: pd.DataFrame, iters: pd.DataFrame, confidence: float = CONFIDENCE,
                    n_resamples: int = 9999, seed: int = 0) -> pd.DataFrame:
    """One row per (configuration, scheduler): its iteration time (same statistic and unit as
    `speedups`: geometric mean of run medians, or median of pooled iterations) with its interval."""
    if "config_id" not in runs:
        runs = add_configurations(runs)
    points = _point_cols(runs)
    rows = []
    for cid, grp in runs.groupby("config_id", sort=False):
        unit = _unit(grp)
        obs = _observations(grp, iters, unit)
        first = grp.iloc[0]
        for sched, x in obs.items():
            est, lo, hi = interval((x,), unit, confidence, n_resamples, seed)
            rows.append({"config_id": cid, "config": first["config"], **{p: first[p] for p in points},
                         "scheduler": sched, "iter_time_s": est, "ci_low": lo, "ci_high": hi,
                         "confidence": confidence, "n": len(x), "unit": unit,
                         "runs": int((grp["scheduler"] == sched).sum())})
    cols = ["config_id", "config", *points, "scheduler", "iter_time_s", "ci_low", "ci_high", "confidence", "n",
            "unit", "runs"]
    return pd.DataFrame(rows, columns=cols)


def load_comparison(sweep_dir: Path, run_ids: list[str] | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(completed runs with their configurations, their measured iterations) of a sweep."""
    runs = add_configurations(load_runs(sweep_dir, status="ok", run_ids=run_ids), sweep_dir)
    return runs, load_iterations(sweep_dir, runs)


def load_speedups(sweep_dir: Path, baseline: str | None = None, run_ids: list[str] | None = None, **kw) -> pd.DataFrame:
    runs, iters = load_comparison(sweep_dir, run_ids)
    return speedups(runs, iters, baseline=baseline, **kw)
