"""One run of a `time_dilation: auto` experiment: the k chosen, the run, and one more try at a
larger k where the CPU check failed anyway.

The k: the smallest whole k the calibration of this machine (emu/sweeps/calibrate.py, measured
the first time) predicts keeps the CPU idle at cpu_idle_min + MARGIN (emu/config/autodilation.py).
The run id stays that of `auto`, so a config has the same run ids on every machine and a resumed
sweep skips a completed run whatever k it ran at. The row records the k used (`time_dilation`),
`time_dilation_auto`, `time_dilation_reason` (the prediction at k and at k - 1) and
`time_dilation_tries` (JSON: per try its k, the predicted idle, and the measured CPU idle min,
fidelity and status). A try that passed everything but the CPU check is run again once, at the k
its measured idle asks for (at least one more); its files are kept under the run directory's
`tries/1/` (with its row, `row.json`), and the second try's row replaces the first's.
"""
from __future__ import annotations

import datetime as dt
import json
import math
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from contracts.fidelity import COLUMN as CODES_COLUMN
from contracts.fidelity import Reason, decode
from emu.config.autodilation import Choice, NoDilation, SchedulerCost, choose, link_directions, retry_k, role_rates
from emu.config.experiment import Experiment
from emu.run.results import flatten, record_run, write_text
from emu.run.runner import run_one
from emu.sweeps import calibrate
from emu.testbed.cleanup import StateDir

TRIES_DIR = "tries"


def _stderr(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def choice_for(exp: Experiment, cost: SchedulerCost, base: float) -> Choice:
    """The k for `exp` from its scheduler's calibration and the machine's own load `base` (CPUs;
    NoDilation where none fits)."""
    rates = role_rates(exp.net, list(exp.roles.servers), list(exp.roles.workers))
    return choose(cost, rates, link_directions(exp.net), exp.fidelity.cpu_idle_min, exp.dilation_k_max, cost.cpus,
                  base)


NOT_CALIBRATED = "auto: not calibrated"


def planned(exp: Experiment, base: Callable[[], float] = lambda: calibrate.own_load(None)
            ) -> tuple[float | None, str]:
    """The k a run of `exp` would have here (None where `auto` cannot say yet) and how a dry run
    shows it: its number, the choice `auto` makes from this machine's calibration and its own
    load now (`base()`, CPUs) ("auto: 3 (idle ...)"), or that the first run calibrates."""
    if not exp.auto_dilation:
        return float(exp.time_dilation), f"{exp.time_dilation:g}"
    cost, _ = calibrate.cached(exp)
    if cost is None:
        return None, NOT_CALIBRATED
    try:
        choice = choice_for(exp, cost, base())
    except NoDilation:
        return None, "auto: none fits"
    below = f", {choice.idle_below:.2f} at {choice.k - 1}" if choice.idle_below is not None else ""
    return float(choice.k), f"auto: {choice.k} (idle {choice.idle:.2f}{below})"


def _cpu_failed(row: dict[str, Any]) -> bool:
    try:
        codes = decode(row.get(CODES_COLUMN) or "[]")
    except (TypeError, ValueError):
        return False
    return row.get("status") == "ok" and Reason.CPU_IDLE.value in codes


def _try(row: dict[str, Any], k: float, predicted: float | None) -> dict[str, Any]:
    idle = row.get("fidelity_cpu_idle_min")
    return {"k": k, "predicted_idle": None if predicted is None else round(predicted, 3),
            "cpu_idle_min": None if idle is None or (isinstance(idle, float) and math.isnan(idle)) else round(idle, 3),
            "fidelity_ok": row.get("fidelity_ok"), "status": row.get("status")}


def _unrun(exp: Experiment, repeat: int, results_root: Path, reason: str, extra: dict[str, Any] | None
           ) -> dict[str, Any]:
    """The failed row of an auto run that never started (no calibration, no k that fits)."""
    row = {"run_id": exp.run_id(repeat), "sweep": exp.name, "repeat": repeat, "status": "failed", "reason": reason,
           "started_at": dt.datetime.now(dt.UTC).isoformat(), "network": exp.net.describe(),
           **flatten(exp.resolved()), "time_dilation": math.nan, "time_dilation_auto": True,
           "time_dilation_reason": reason, "time_dilation_tries": "[]", "wall_s": 0.0, **(extra or {})}
    record_run(results_root / exp.name, row)
    return row


def run_auto(exp: Experiment, repeat: int, results_root: Path, state: StateDir,
             progress: Callable[[int], None] = lambda n: None, extra: dict[str, Any] | None = None,
             say: Callable[[str], None] = _stderr) -> dict[str, Any]:
    """Run a `time_dilation: auto` experiment once (twice where the first try fails the CPU check
    only); return (and record) the row of the last try."""
    try:
        cost = calibrate.cost_for(exp, state, say)
        base = calibrate.own_load(state)
        choice = choice_for(exp, cost, base)
    except (calibrate.CalibrationError, NoDilation) as e:
        return _unrun(exp, repeat, results_root, f"time_dilation auto: {e}", extra)
    reason = choice.reason(exp.scheduler)
    say(f"time_dilation auto: k={choice.k} ({reason})")
    cols = {**(extra or {}), "time_dilation_auto": True, "time_dilation_reason": reason}
    sweep_dir = results_root / exp.name
    row = run_one(exp, repeat, results_root, state, progress, extra=cols, time_dilation=choice.k)
    tries = [_try(row, choice.k, choice.idle)]
    _record_tries(sweep_dir, row, tries)
    k2 = retry_k(choice.k, row.get("fidelity_cpu_idle_min", math.nan), base, cost.cpus,
                 exp.fidelity.cpu_idle_min, exp.dilation_k_max) if _cpu_failed(row) else None
    if k2 is None:
        return row
    say(f"time_dilation auto: CPU idle fell to {row['fidelity_cpu_idle_min']:.2f} at k={choice.k}; "
        f"once more at k={k2}")
    run_dir = sweep_dir / exp.run_id(repeat)
    first = sweep_dir / f".{run_dir.name}.try1"
    if first.exists():
        shutil.rmtree(first)
    run_dir.rename(first)
    write_text(first / "row.json", json.dumps(row, indent=1, default=str))
    progress(0)
    try:
        row = run_one(exp, repeat, results_root, state, progress, time_dilation=k2,
                      extra={**cols, "time_dilation_reason": f"{reason}; k={k2} after CPU idle "
                             f"{tries[0]['cpu_idle_min']} at k={choice.k}"})
    finally:
        (run_dir / TRIES_DIR).mkdir(parents=True, exist_ok=True)
        first.rename(run_dir / TRIES_DIR / "1")
    tries.append(_try(row, k2, None))
    _record_tries(sweep_dir, row, tries)
    return row


def _record_tries(sweep_dir: Path, row: dict[str, Any], tries: list[dict[str, Any]]) -> None:
    row["time_dilation_tries"] = json.dumps(tries)
    record_run(sweep_dir, row)
