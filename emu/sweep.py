"""Running a plan (every experiment of a config's grid, each repeated): skip what is done,
show progress, and stop cleanly on Ctrl-C or SIGTERM."""
from __future__ import annotations

import signal
import sys
from pathlib import Path

from tqdm import tqdm

from emu.cleanup import StateDir
from emu.config import Plan
from emu.results import completed
from emu.runner import run_one, terminate_as_interrupt


def run_plan(plan: Plan, results_root: Path, force: bool = False) -> list[dict]:
    sweep_dir = results_root / plan.name
    done = set() if force else completed(sweep_dir)
    todo = [(e, r) for e in plan.experiments for r in range(plan.repeats)]
    rows = []
    old_term = signal.signal(signal.SIGTERM, terminate_as_interrupt)
    state = StateDir().open()
    try:
        for i, (exp, repeat) in enumerate(todo, 1):
            rid = exp.run_id(repeat)
            label = f"[{i}/{len(todo)}] {exp.scheduler} repeat {repeat} ({rid})"
            if rid in done:
                print(f"{label}: already in {sweep_dir}/runs.parquet, skipped", file=sys.stderr)
                continue
            bar = tqdm(total=exp.workload["iterations"], desc=label, unit="it", file=sys.stderr,
                       leave=True, dynamic_ncols=True,
                       mininterval=0.2 if sys.stderr.isatty() else 5.0)

            def progress(n: int, bar=bar) -> None:
                bar.update(n - bar.n)

            try:
                row = run_one(exp, repeat, results_root, state, progress)
            finally:
                bar.close()
            rows.append(row)
            if row["status"] == "ok":
                print(f"{label}: ok, median iteration {row['iter_time_median_s'] * 1e3:.0f} ms, "
                      f"wall {row['wall_s']:.1f} s", file=sys.stderr)
            else:
                print(f"{label}: {row['status']}: {row['reason']} (logs: {sweep_dir / rid / 'logs'})",
                      file=sys.stderr)
    finally:
        state.teardown()  # normally nothing is left: each Testbed cleans up after itself
        state.remove()
        signal.signal(signal.SIGTERM, old_term)
    return rows
