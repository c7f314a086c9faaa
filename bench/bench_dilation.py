"""Time dilation's invariance (emu/config/dilation.py): one config at k = 1, 2, 4 through the
normal run path, and the emulated iteration times side by side (figures, not pass/fail).

A dilated run is the same experiment k times slower: links at 1/k of their rates, replayed
compute, queues in time, schedules and timeouts k times longer, results recorded in emulated
time. Wherever k = 1 passes the fidelity verdict, k = 2 and 4 should give emulated iteration
times within about 5% of it; where k = 1 fails for want of CPU, the dilated runs should pass
with CPU to spare. Run as root (Mininet):

    sudo .venv/bin/python -m bench.bench_dilation                      # reference8: fifo and mercury
    sudo .venv/bin/python -m bench.bench_dilation --config configs/examples/dilated32.yaml \\
        --dilations 2,4,8 --schedulers mercury
    sudo ./inv bench --only dilation

Every run goes through emu.sweeps.sweep.run_plan into a temporary results directory (removed unless
--keep or --results), the bounds are added as `./inv run` adds them, and the table prints per
k and scheduler: the median of the runs' emulated median iterations, its ratio to k = 1, the
fidelity verdicts, the lowest CPU idle, the bound and efficiency, and the runs' wall-clock time.
"""
from __future__ import annotations

import argparse
import math
import shutil
import sys
import tempfile
from pathlib import Path

import pandas as pd

from analysis.bounds import annotate
from emu.config.experiment import ConfigError, Sections
from emu.config.plan import Plan, load_plan
from emu.run.results import read_runs, update_runs
from emu.sweeps.sweep import run_plan
from schedulers.registry import params_models
from workloads.config import WorkloadConfig

REPO = Path(__file__).resolve().parents[1]

NAME = "bench-dilation"


def plan_for(config: str, dilations: list[float], schedulers: list[str], sets: list[str], repeats: int) -> Plan:
    """The config's experiments of `schedulers` at every k, as one plan (k by k, in order)."""
    sections = Sections(workload=WorkloadConfig, schedulers=params_models())
    experiments, points, first = [], [], None
    for k in dilations:
        plan = load_plan(config, sections, [*sets, f"time_dilation={k:g}", f"name={NAME}", f"repeats={repeats}"])
        first = first or plan
        for exp, point in zip(plan.experiments, plan.points, strict=True):
            if exp.scheduler in schedulers:
                experiments.append(exp)
                points.append({**point, "time_dilation": k})
    if not experiments:
        raise ConfigError(f"--schedulers {','.join(schedulers)}: {config} runs none of them")
    return Plan(name=NAME, experiments=experiments, repeats=repeats, source=first.source, points=points,
                base_dir=first.base_dir)


def table(runs: pd.DataFrame) -> pd.DataFrame:
    """Per (k, scheduler): the runs' figures, and the median iteration against k = 1's."""
    ok = runs[runs["status"] == "ok"]
    rows = []
    for (k, sched), g in runs.groupby(["time_dilation", "scheduler"], sort=True):
        good = ok[(ok["time_dilation"] == k) & (ok["scheduler"] == sched)]
        rows.append({
            "k": k, "scheduler": sched, "runs": f"{len(good)}/{len(g)}",
            "median_iter_ms": good["iter_time_median_s"].median() * 1e3 if len(good) else math.nan,
            "fidelity_ok": f"{int(good['fidelity_ok'].sum())}/{len(good)}" if len(good) else "-",
            "cpu_idle_min": good["fidelity_cpu_idle_min"].min() if len(good) else math.nan,
            "bound_ms": good["bound_s"].median() * 1e3 if "bound_s" in good and len(good) else math.nan,
            "efficiency": good["efficiency"].median() if "efficiency" in good and len(good) else math.nan,
            "wall_s": g["wall_s"].sum(),
        })
    out = pd.DataFrame(rows)
    base = out[out["k"] == out["k"].min()].set_index("scheduler")["median_iter_ms"]
    out.insert(4, "ratio_to_k1", out["median_iter_ms"] / out["scheduler"].map(base))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default=str(REPO / "configs" / "sweeps" / "reference8.yaml"),
                    help="experiment or sweep file (default: reference8)")
    ap.add_argument("--schedulers", default="fifo,mercury", help="comma-separated (default fifo,mercury)")
    ap.add_argument("--dilations", default="1,2,4", help="values of k, comma-separated; the smallest is the reference")
    ap.add_argument("--repeats", type=int, default=1, help="runs per k and scheduler")
    ap.add_argument("--set", action="append", default=[], dest="sets", metavar="KEY=VALUE",
                    help="override a config key (repeatable), e.g. --set workload.iterations=20")
    ap.add_argument("--results", help="results root to keep (default: a temporary directory, removed)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary results directory")
    args = ap.parse_args()
    try:
        dilations = [float(x) for x in args.dilations.split(",")]
        plan = plan_for(args.config, dilations, args.schedulers.split(","), args.sets, args.repeats)
    except (ConfigError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    root = Path(args.results) if args.results else Path(tempfile.mkdtemp(prefix="bench-dilation-"))
    sweep_dir = root / NAME
    try:
        run_plan(plan, root)
        update_runs(sweep_dir, lambda runs: annotate(runs, sweep_dir))
        ids = {e.run_id(r) for e in plan.experiments for r in range(plan.repeats)}
        runs = read_runs(sweep_dir)
        runs = runs[runs["run_id"].isin(ids)]
        runs = runs.assign(time_dilation=runs["time_dilation"].fillna(1.0) if "time_dilation" in runs else 1.0)
        print(f"\n{Path(args.config).name}: emulated median iteration per time dilation k "
              f"(ratio: to k = {min(dilations):g}, same scheduler)")
        with pd.option_context("display.width", 200, "display.max_columns", 20):
            print(table(runs).to_string(index=False, float_format=lambda v: f"{v:.3f}" if abs(v) < 10 else f"{v:.0f}"))
        failed = runs[runs["status"] != "ok"]
        for _, r in failed.iterrows():
            print(f"k={r['time_dilation']:g} {r['scheduler']}: {r['status']}: {r['reason']}")
    finally:
        if not args.results and not args.keep:
            shutil.rmtree(root, ignore_errors=True)
        else:
            print(f"results: {sweep_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
