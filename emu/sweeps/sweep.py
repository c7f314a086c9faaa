"""Running a plan (every experiment of a config's grid, each repeated): skip what is done,
show progress, and stop cleanly on Ctrl-C or SIGTERM."""
from __future__ import annotations

import datetime as dt
import json
import signal
import sys
from pathlib import Path

from tqdm import tqdm

from emu.config.plan import Plan
from emu.run.claims import Claim, Holder, try_claim
from emu.run.results import check_dir, completed, make_dir, read_runs
from emu.run.runner import run_one, terminate_as_interrupt
from emu.sweeps import space
from emu.sweeps.autodilate import run_auto
from emu.testbed import preflight
from emu.testbed.cleanup import StateDir, clean


def shard_of(todo: list, shard: tuple[int, int] | None) -> list:
    """Every n-th (experiment, repeat) of the plan, starting at i: shards of one plan are
    disjoint and together complete, so their results merge by concatenation."""
    if shard is None:
        return todo
    i, n = shard
    return [t for k, t in enumerate(todo) if k % n == i]


def _where(point: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in point.items())


def unique_runs(todo: list) -> list:
    """Drop grid points that resolve to an experiment already in the plan (a grid over a
    scheduler's tunable also crosses the schedulers that ignore it): each runs once."""
    seen: dict[str, dict] = {}
    out = []
    for exp, repeat, point in todo:
        rid = exp.run_id(repeat)
        if rid in seen:
            print(f"sweep: {_where(point)} is the same experiment as {_where(seen[rid])} ({rid}): run once",
                  file=sys.stderr)
            continue
        seen[rid] = point
        out.append((exp, repeat, point))
    return out


def plan_runs(plan: Plan, shard: tuple[int, int] | None = None) -> list:
    """The plan's (experiment, repeat, grid point)s to run, each run_id once, this shard's:
    the same list wherever it is computed (one machine, a shard, a Ray driver)."""
    return shard_of(unique_runs([(e, r, p) for e, p in zip(plan.experiments, plan.points, strict=True)
                                 for r in range(plan.repeats)]), shard)


def point_columns(point: dict) -> dict:
    """A grid point as row columns (point.<key>); lists and dicts as JSON text."""
    return {f"point.{k}": json.dumps(v) if isinstance(v, (list, dict)) else v for k, v in point.items()}


# A progress bar's description: with tqdm's counters (about 45 characters at most: percentage,
# a bar of at least a few cells, n/total, elapsed<remaining, rate) it fits an 80-column terminal.
BAR_DESC = 34


def run_label(i: int, n: int, exp, repeat: int, label: str) -> str:
    """A run as its progress lines name it: position, scheduler (or variant), point label, repeat, run id."""
    what = " ".join(x for x in (exp.scheduler + (f" ({exp.label})" if exp.label else ""), label) if x)
    return f"[{i}/{n}] {what} repeat {repeat} ({exp.run_id(repeat)})"


def bar_desc(i: int, n: int, exp, repeat: int, label: str, repeats: int) -> str:
    """The progress bar's short description of a run (the full one is printed when it ends)."""
    text = " ".join(x for x in (f"[{i}/{n}]", exp.scheduler, label, f"r{repeat}" if repeats > 1 else "") if x)
    return text if len(text) <= BAR_DESC else text[: BAR_DESC - 1] + "…"


def outcome(exp, row: dict, sweep_dir: Path) -> str:
    """How a run ended, for its progress line."""
    if row["status"] == "ok":
        k = row.get("time_dilation", 1)
        dilated = f", time dilation {k:g}" + (" (auto)" if exp.auto_dilation else "") if k != 1 else ""
        return (f"ok, median iteration {row['iter_time_median_s'] * 1e3:.0f} ms, "
                f"wall {row['wall_s']:.1f} s{dilated}")
    logs = sweep_dir / row["run_id"] / "logs"
    return f"{row['status']}: {row['reason']}" + (f" (logs: {logs})" if logs.exists() else "")


def recorded(sweep_dir: Path) -> dict[str, str]:
    """run_id -> started_at of every row runs.parquet holds now (to tell the rows another sweep adds)."""
    runs = read_runs(sweep_dir)
    if runs.empty:
        return {}
    started = runs["started_at"] if "started_at" in runs else [""] * len(runs)
    return {r: str(t) for r, t in zip(runs["run_id"], started, strict=True)}


def recorded_since(sweep_dir: Path, run_id: str, before: dict[str, str]) -> dict | None:
    """The run's row if another executor recorded it since `before` (ok or failed: it ran; an
    interrupted row did not finish, so the run is still to do), else None."""
    runs = read_runs(sweep_dir)
    if runs.empty:
        return None
    mine = runs[runs["run_id"] == run_id]
    if not len(mine):
        return None
    row = mine.iloc[-1].to_dict()
    if str(row.get("started_at", "")) == before.get(run_id) or row.get("status") not in ("ok", "failed"):
        return None
    return row


def _with_bar(exp, repeat: int, point: dict, results_root: Path, state: StateDir, desc: str) -> dict:
    """One run with its progress bar; its row."""
    bar = tqdm(total=exp.workload["iterations"], unit="it", file=sys.stderr, desc=desc, leave=True,
               dynamic_ncols=True, mininterval=0.2 if sys.stderr.isatty() else 5.0)

    def progress(n: int) -> None:
        bar.update(n - bar.n)

    try:
        if exp.auto_dilation:   # the k chosen for this machine (calibrated the first time)
            return run_auto(exp, repeat, results_root, state, progress, extra=point_columns(point),
                            say=lambda text: tqdm.write(text, file=sys.stderr))
        return run_one(exp, repeat, results_root, state, progress, extra=point_columns(point))
    finally:
        bar.close()


def run_plan(plan: Plan, results_root: Path, force: bool = False,
             shard: tuple[int, int] | None = None) -> list[dict]:
    """Run the plan's experiments (this shard's), each repeat once; a ConfigError if this
    machine cannot emulate the plan (emu/testbed/preflight.py), before anything is created.

    Each run is claimed before it executes (emu/run/claims.py): a run another sweep into the same
    directory holds is left to it and awaited after this sweep's other runs, its row taken as it
    recorded it; a run whose holder died (kill -9) is taken over. A results directory that cannot
    take a write (full, read-only, removed) is a ResultsError, the run in flight recorded as
    failed where there is room."""
    preflight.check(plan)
    sweep_dir = results_root / plan.name
    make_dir(sweep_dir)
    before = recorded(sweep_dir)
    done = set() if force else completed(sweep_dir)
    todo = plan_runs(plan, shard)
    pending = sum(1 for e, r, _ in todo if e.run_id(r) not in done)
    rows: list[dict] = []
    old_term = signal.signal(signal.SIGTERM, terminate_as_interrupt)
    for line in clean():  # what a killed earlier orchestrator left (never a live one's)
        print(f"cleaned up {line}", file=sys.stderr)
    walls: list[float] = []
    labels = {id(e): t for e, t in zip(plan.experiments, plan.labels())}
    deferred: list[tuple[int, object, int, dict, str]] = []

    def execute(got: Claim, i: int, exp, repeat: int, point: dict, label: str) -> None:
        other = recorded_since(sweep_dir, exp.run_id(repeat), before)
        if other is not None:
            print(f"{label}: run by another sweep meanwhile, not again: {outcome(exp, other, sweep_dir)}",
                  file=sys.stderr)
            rows.append(other)
            return
        if got.left is not None:
            print(f"{label}: taking over the claim of {got.left.describe()}, which is no longer running",
                  file=sys.stderr)
        if walls:
            left = pending - len(walls)
            eta = dt.timedelta(seconds=round(sum(walls) / len(walls) * left))
            print(f"sweep: {len(walls)}/{pending} runs done, ETA {eta} for the {left} left", file=sys.stderr)
        row = _with_bar(exp, repeat, point, results_root, state,
                        bar_desc(i, len(todo), exp, repeat, labels[id(exp)], plan.repeats))
        rows.append(row)
        walls.append(row["wall_s"])
        print(f"{label}: {outcome(exp, row, sweep_dir)}", file=sys.stderr)
        if row["status"] != "ok":   # a run that failed for want of room: the next would too
            space.after_failure(sweep_dir, sweep_dir / row["run_id"], row)

    try:
        with StateDir() as state:
            for i, (exp, repeat, point) in enumerate(todo, 1):
                rid = exp.run_id(repeat)
                label = run_label(i, len(todo), exp, repeat, labels[id(exp)])
                if rid in done:
                    print(f"{label}: already in {sweep_dir}/runs.parquet, skipped", file=sys.stderr)
                    continue
                check_dir(sweep_dir)
                got = try_claim(sweep_dir, rid)
                if isinstance(got, Holder):
                    print(f"{label}: claimed by another sweep ({got.describe()}): left to it, its row awaited "
                          f"after this sweep's other runs", file=sys.stderr)
                    deferred.append((i, exp, repeat, point, label))
                    continue
                with got:
                    execute(got, i, exp, repeat, point, label)
            for i, exp, repeat, point, label in deferred:
                check_dir(sweep_dir)
                print(f"{label}: waiting for the other sweep to finish it", file=sys.stderr)
                with try_claim(sweep_dir, exp.run_id(repeat), wait=True) as got:
                    execute(got, i, exp, repeat, point, label)
    finally:
        signal.signal(signal.SIGTERM, old_term)
    return rows
