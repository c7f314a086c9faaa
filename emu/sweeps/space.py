"""Room for a sweep: its runs' estimated size against the free space where its results go.

A results directory that fills up mid-sweep ends the sweep on the run that filled it (emu/run/
results.py: one error line), after hours perhaps; so before a sweep starts, the runs left are
estimated and compared with the free space of the directory's file system, and a sweep that
cannot fit is refused with the figures (a dry run shows them, and warns). Each run's estimate is,
best first: the median size of earlier runs of the same point in the results directory; the model
(emu/config/footprint.py) at the dry run's duration, scaled by how earlier runs of the sweep's
other points compared with it; the model alone. A run without a duration estimate (no profile
for its workload) counts at its timeout_s, an upper bound, and the figures say so.
"""
from __future__ import annotations

import os
import shutil
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from emu.config.experiment import Experiment
from emu.config.footprint import ROW, RUNS_BASE, WorkloadFacts, mb, run_bytes
from emu.config.plan import Plan
from emu.run.results import RUNS, ResultsError, read_runs

if TYPE_CHECKING:   # dryrun imports sweep, which imports this module
    from emu.sweeps.dryrun import Point

Facts = Callable[[Experiment], "WorkloadFacts | None"]
NOT_WRITTEN_BY_RUNS = {"trace.json", "report"}   # what later commands add to a run's directory


@dataclass(frozen=True)
class Need:
    """The runs left of a plan, their estimated bytes (with the runs.parquet rewrite) and the free space."""

    sweep_dir: Path
    runs: int
    bytes: int
    per_run: int            # the median run's estimate
    basis: str              # where the estimates come from
    parts: str              # the model's largest parts, where the model was used
    at_timeout: int         # runs counted at their timeout_s (no duration estimate)
    free: int
    device: Path            # the existing directory whose file system was asked

    @property
    def fits(self) -> bool:
        return self.bytes <= self.free

    def figures(self) -> str:
        why = f"; {self.parts}" if self.parts else ""
        upper = f"; {self.at_timeout} of them at their timeout_s (no estimate of their duration)" \
            if self.at_timeout else ""
        return (f"{self.runs} run(s) need about {mb(self.bytes)} ({mb(self.per_run)} per run, from {self.basis}"
                f"{why}{upper}), {mb(self.free)} free on {self.device}")

    def refusal(self) -> str:
        return (f"{self.sweep_dir}: not enough free space for this sweep: {self.figures()}; free some space or "
                f"choose another --results")


def du(path: Path) -> int:
    """Bytes a run's directory holds on disk (what later commands added left out)."""
    total = 0
    for root, dirs, files in os.walk(path):
        dirs[:] = [d for d in dirs if d not in NOT_WRITTEN_BY_RUNS]
        for f in files:
            if f in NOT_WRITTEN_BY_RUNS:
                continue
            try:
                st = os.lstat(os.path.join(root, f))
            except OSError:
                continue
            total += max(st.st_size, st.st_blocks * 512)
    return total


def existing(path: Path) -> Path:
    """The nearest directory of `path` (itself or an ancestor) that exists: where it will be made."""
    path = Path(os.path.abspath(path))
    while not path.is_dir() and path != path.parent:
        path = path.parent
    return path


def free_bytes(path: Path) -> int:
    """Free bytes for this user on the file system `path` will be on."""
    return shutil.disk_usage(existing(path)).free


def estimate(plan: Plan, results_root: Path, pts: list[Point], facts: Facts, force: bool = False,
             netlink: bool = True) -> Need:
    """The runs left of the dry run's points `pts` (with their run ids and durations), estimated."""
    from emu.sweeps.dryrun import SETUP_S

    sweep_dir = results_root / plan.name
    earlier = read_runs(sweep_dir) if (sweep_dir / RUNS).exists() else None
    ok = earlier[earlier["status"] == "ok"] if earlier is not None and "status" in earlier else None
    done = set() if force or ok is None else set(ok["run_id"])
    walls = dict(zip(ok["run_id"], ok["wall_s"])) if ok is not None and "wall_s" in ok else {}
    sizes = {rid: du(sweep_dir / rid) for rid in walls if (sweep_dir / rid).is_dir()}
    exps = {p.ids: e for p, e in zip(pts, _experiments(plan, pts), strict=True)}
    # how this sweep's earlier runs compared with the model at their own durations
    ratios = [sizes[rid] / run_bytes(exp, walls[rid], facts(exp), netlink).total
              for ids, exp in exps.items() for rid in ids if rid in sizes and walls[rid] > 0]
    scale = statistics.median(ratios) if ratios else 1.0
    estimates: list[int] = []
    bases: set[str] = set()
    parts, at_timeout = "", 0
    for p in pts:
        exp = exps[p.ids]
        left = [rid for rid in p.ids if rid not in done]
        if not left:
            continue
        same = [sizes[rid] for rid in p.ids if rid in sizes]
        if same:
            each, basis = int(statistics.median(same)), "earlier runs of the same point"
        else:
            wall_s = p.run_s
            if wall_s is None:
                k = 1.0 if exp.auto_dilation else float(exp.time_dilation)
                wall_s, at_timeout = SETUP_S + exp.timeout_s * k, at_timeout + len(left)
            fp = run_bytes(exp, wall_s, facts(exp), netlink)
            each = int(fp.total * scale)
            basis = "the model scaled by this sweep's earlier runs" if ratios else "the model"
            parts = parts or f"largest: {fp.largest()}"
        estimates += [each] * len(left)
        bases.add(basis)
    # runs.parquet grows by a row per run, and each write holds the old file and the new one at once
    runs_file = sweep_dir / RUNS
    now = runs_file.stat().st_size if runs_file.exists() else 0
    final = (now or RUNS_BASE) + ROW * len(estimates)
    total = int(sum(estimates) + (final - now) + final) if estimates else 0
    return Need(sweep_dir=sweep_dir, runs=len(estimates), bytes=total,
                per_run=int(statistics.median(estimates)) if estimates else 0,
                basis=" and ".join(sorted(bases)) or "nothing left to run", parts=parts, at_timeout=at_timeout,
                free=free_bytes(sweep_dir), device=existing(sweep_dir))


def _experiments(plan: Plan, pts: list[Point]) -> list[Experiment]:
    by_id = {e.run_id(r): e for e in plan.experiments for r in range(plan.repeats)}
    return [by_id[p.ids[0]] for p in pts]


def after_failure(sweep_dir: Path, run_dir: Path, row: dict) -> None:
    """After a run that failed: a ResultsError where the file system has less room left than
    that run took, since the next run would fail as it did (out of space in a role, say, with
    room enough for its row)."""
    took = du(run_dir) if run_dir.is_dir() else 0
    try:
        free = free_bytes(sweep_dir)
    except OSError:
        return
    if took and free < took:
        raise ResultsError(f"{sweep_dir}: {mb(free)} free, less than the {mb(took)} its last run wrote (it "
                           f"failed: {str(row.get('reason', ''))[:200]}); free some space or choose another "
                           f"--results")
