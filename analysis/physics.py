"""Physics checks of each run's verdict: a run that reports an iteration faster than its
links allow, or that moved fewer bytes than its scheme must, measured a bug, not a network.

The monitors' verdict (emu/testbed/fidelity.py: CPU idle, rate excess, saturation) says whether the
emulation behaved like the configured network; it cannot see a wrong clock or a scheme that
skipped work. These two checks can, and they need the bounds, which are computed here in
analysis (emu may not import it), so they are applied when the bounds are
(`analysis/bounds.py` `annotate` calls `apply`):

- below_bound: the measured iteration (on `efficiency_basis`: median, or mean where the
  capacity varied) below the model's bound (`efficiency`) or the model-free cut bound
  (`cut_efficiency`), which every scheme must respect, by more than the tolerance:
  efficiency > 1 + tolerance.
- too_few_bytes: the cut bound's own argument on single hosts. For every worker host h with
  a worker elsewhere, the others need h's G = 4 bytes x parameters and h needs G of theirs,
  so each iteration (warm-up included) carries at least G out of h and G into h over its
  links. The link counters (`links.parquet`) count frames, which are more than the payload,
  so the bytes a direction carried over the whole run must be at least
  iterations x G x (1 - tolerance).

The tolerance is the run's `fidelity.rate_tolerance` (0.05): the slack the monitors' verdict
already allows a link above its configured rate, so a run is not failed here for what the
same measurement is trusted to within there.

The verdict a user reads stays in the row's `fidelity_ok`, `fidelity_reasons` and
`fidelity_codes` (contracts/fidelity.py; sentences and codes aligned), with the physics
findings appended; `fidelity_monitor_ok` keeps the monitors' own verdict, so that applying
the checks again (a sweep re-annotated after more runs) replaces the physics findings
instead of adding them twice. `physics_ok`, `physics_reasons` say what these checks found,
`physics_unjudged` what they could not judge and why (a run without `links.parquet`), and
`physics_bytes_min` the fewest bytes a worker host direction carried per iteration, over G.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import networkx as nx
import numpy as np
import pandas as pd

from analysis.fidelity import findings
from contracts.fidelity import COLUMN as CODES_COLUMN
from contracts.fidelity import Reason

DEFAULT_TOLERANCE = 0.05  # emu/config/experiment.py FidelityConfig.rate_tolerance's default
CODES = {Reason.BELOW_BOUND.value, Reason.TOO_FEW_BYTES.value}
COLUMNS = ["physics_ok", "physics_reasons", "physics_unjudged", "physics_bytes_min", "fidelity_monitor_ok"]


def tolerance(run) -> float:
    tol = run.get("fidelity.rate_tolerance")
    return float(tol) if tol is not None and pd.notna(tol) else DEFAULT_TOLERANCE


# ---------------------------------------------------------------------------- below_bound
def below_bound(run) -> tuple[list[str], str | None]:
    """(sentences, why not judged): the measured iteration against the model's and the cut
    bound. The cut check is left out where the model is the cut (the same bound)."""
    if pd.isna(run.get("efficiency")) or pd.isna(run.get("bound_s")):
        return [], "below_bound: no bound"
    tol = tolerance(run)
    basis = run.get("efficiency_basis") or "median"
    measured_s = float(run["bound_s"]) / float(run["efficiency"])
    model = run.get("bound_model") or "model"
    checks = [(float(run["efficiency"]), float(run["bound_s"]), f"{model} bound", "efficiency")]
    if model != "cut" and pd.notna(run.get("cut_efficiency")):
        cut_s = max(float(run.get("compute_median_s") or 0.0), float(run["cut_bound_s"]))
        checks.append((float(run["cut_efficiency"]), cut_s, "cut bound", "cut efficiency"))
    return [f"{basis} iteration {measured_s * 1e3:.1f} ms is below its {what} {bound * 1e3:.1f} ms "
            f"({name} {eff:.3g} > {1 + tol:.2f})"
            for eff, bound, what, name in checks if eff > 1 + tol], None


# ---------------------------------------------------------------------------- too_few_bytes
def bytes_carried(links: pd.DataFrame) -> dict[str, float]:
    """Bytes each link direction ('a->b') carried over the monitored run: each sample's rate
    (bytes/s since that direction's sample before, emu/testbed/monitor.py; the first since t = 0)
    times its interval."""
    out = {}
    for label, df in links.groupby("link"):
        t = np.sort(df["t"].to_numpy(float))
        rate = df.sort_values("t")["tx_bytes_per_s"].to_numpy(float)
        out[str(label)] = float(rate @ np.diff(t, prepend=0.0))
    return out


def _directions(run_dir: Path, labels: set[str]) -> list[tuple[str, str]]:
    """(src, dst) of every link direction: the capacity graph's edges (the roles' topology),
    or where the run has none, the link names of links.parquet."""
    from analysis.bounds import load_graph  # bounds calls this module from annotate

    try:
        return list(load_graph(run_dir).edges)
    except (OSError, StopIteration, ValueError, nx.NetworkXException):
        return [tuple(label.partition("->")[::2]) for label in sorted(labels)]


def too_few_bytes(run, run_dir: Path) -> tuple[list[str], str | None, float]:
    """(sentences, why not judged, fewest bytes per iteration of a worker host direction / G).
    One sentence per run (no "; " in it: that separates the row's sentences): the direction
    that carried least, and how many others fell short."""
    path = run_dir / "links.parquet"
    if not path.exists():
        return [], "too_few_bytes: no links.parquet", math.nan
    try:
        hosts = list(dict.fromkeys(json.loads(run["roles.workers"])))
        grad, iterations = 4 * float(run["num_params"]), int(run["workload.iterations"])
    except (KeyError, TypeError, ValueError) as e:
        return [], f"too_few_bytes: the row cannot say ({type(e).__name__}: {e})", math.nan
    if len(hosts) < 2:
        return [], "too_few_bytes: one worker host, nothing must cross a link", math.nan
    carried = bytes_carried(pd.read_parquet(path, columns=["link", "t", "tx_bytes_per_s"]))
    tol = tolerance(run)
    edges = _directions(run_dir, set(carried))
    short, judged, missing = [], [], []
    for h in hosts:
        for verb, labels in (("sent", [f"{a}->{b}" for a, b in edges if a == h]),
                             ("received", [f"{a}->{b}" for a, b in edges if b == h])):
            have = [label for label in labels if label in carried]
            missing += [label for label in labels if label not in carried]
            if not have:
                continue
            per_iter = sum(carried[label] for label in have) / iterations
            judged.append(per_iter / grad)
            if per_iter < grad * (1 - tol):
                short.append((per_iter, h, verb, ", ".join(have)))
    note = f"too_few_bytes: no counters of {', '.join(missing)}" if missing else None
    if not judged:
        return [], note or "too_few_bytes: no worker host link in links.parquet", math.nan
    if not short:
        return [], note, min(judged)
    per_iter, h, verb, where = min(short)
    others = f", and {len(short) - 1} other worker host direction(s) short too" if len(short) > 1 else ""
    return [f"{h} {verb} {per_iter / 1e3:.1f} kB per iteration over {where}, below G = {grad / 1e3:.1f} kB "
            f"(4 bytes x {int(run['num_params']):,} parameters, at least {1 - tol:.2f} G counting frames, "
            f"over {iterations} iterations){others}"], note, min(judged)


# ---------------------------------------------------------------------------- the verdict
def _without_physics(run) -> list[tuple[str | None, str]]:
    """The row's (code, sentence) pairs of every other check: the monitors' findings."""
    return [(c, s) for c, s in findings(run) if c not in CODES]


def apply(runs: pd.DataFrame, sweep_dir: Path) -> pd.DataFrame:
    """The annotated runs (after the bound columns) with the physics checks in their verdict:
    `fidelity_ok` False where one fails, its sentences and codes appended; COLUMNS added.
    Idempotent: earlier physics findings are replaced, the monitors' verdict kept."""
    runs = runs.copy()
    prior = runs["physics_ok"] if "physics_ok" in runs else pd.Series(None, index=runs.index, dtype=object)
    monitor = runs["fidelity_monitor_ok"] if "fidelity_monitor_ok" in runs else prior
    emu = runs["fidelity_ok"] if "fidelity_ok" in runs else pd.Series(None, index=runs.index, dtype=object)
    for col in ("fidelity_ok", "fidelity_reasons", CODES_COLUMN, *COLUMNS):
        runs[col] = (runs[col] if col in runs else None)
        runs[col] = runs[col].astype(float if col == "physics_bytes_min" else object)
    for i, run in runs.iterrows():
        if run.get("status") != "ok":
            continue
        # a row the checks judged before keeps the monitors' verdict beside it; a fresh row's is its own
        verdict = monitor[i] if pd.notna(prior[i]) else emu[i]
        verdict = None if verdict is None or (isinstance(verdict, float) and math.isnan(verdict)) else bool(verdict)
        bound, bound_why = below_bound(run)
        few, few_why, ratio = too_few_bytes(run, Path(sweep_dir) / run["run_id"])
        found = [(Reason.BELOW_BOUND.value, s) for s in bound] + [(Reason.TOO_FEW_BYTES.value, s) for s in few]
        pairs = _without_physics(run) + found
        runs.at[i, "fidelity_monitor_ok"] = verdict
        runs.at[i, "fidelity_ok"] = False if found else verdict
        runs.at[i, "fidelity_reasons"] = "; ".join(s for _, s in pairs)
        runs.at[i, CODES_COLUMN] = json.dumps([c for c, _ in pairs])  # other checks' codes as they were read
        runs.at[i, "physics_ok"] = not found
        runs.at[i, "physics_reasons"] = "; ".join(s for _, s in found)
        runs.at[i, "physics_unjudged"] = "; ".join(w for w in (bound_why, few_why) if w)
        runs.at[i, "physics_bytes_min"] = ratio
    return runs


def ensure(runs: pd.DataFrame, sweep_dir: Path) -> pd.DataFrame:
    """Runs with their bounds and physics checks: `annotate` (which applies them) where a
    completed row has no bound yet, else the checks alone, on the stored bounds."""
    from analysis.bounds import annotate

    ok = runs["status"] == "ok" if "status" in runs else pd.Series(False, index=runs.index)
    if "bound_model" not in runs or runs.loc[ok, "bound_model"].isna().any():
        return annotate(runs, sweep_dir)
    return apply(runs, sweep_dir)


def broken(runs: pd.DataFrame) -> pd.DataFrame:
    """The rows that failed a physics check."""
    if "physics_ok" not in runs:
        return runs.iloc[0:0]
    return runs[runs["physics_ok"] == False]  # noqa: E712 - object column of bools and None


def carry(into: pd.DataFrame, judged: pd.DataFrame) -> pd.DataFrame:
    """`into` (e.g. every row of a sweep) with the verdict columns of the rows `judged` has."""
    cols = ["fidelity_ok", "fidelity_reasons", CODES_COLUMN, *COLUMNS]
    src = judged.set_index("run_id")
    into = into.copy()
    for col in cols:
        if col not in src:
            continue
        into[col] = (into[col] if col in into else None)
        into[col] = into[col].astype(float if col == "physics_bytes_min" else object)
        hit = into["run_id"].isin(src.index)
        into.loc[hit, col] = into.loc[hit, "run_id"].map(src[col])
    return into
