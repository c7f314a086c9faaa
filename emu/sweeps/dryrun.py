"""A dry run: what a run, sweep or tune would do, printed before anything is created.

A sweep of hours should say so before it starts. So the plan is listed point by point, with
its short label, how many runs it asks for and how many the results directory holds already,
and an estimate of the wall time left. Each run's estimate comes from an earlier run of the
same point where the results have one (its wall time), otherwise from the analytic bound of an
iteration (`iteration_bound`, given by the layer above: it needs the workload's profile and the
bound models) times the iterations, plus the time its faults hold the job (their `for_s`) and
the scheduler's own start-up (`startup`, the forest's probe), times the time dilation, plus the
set-up and teardown a run costs. The estimate is near a floor, and says so: schedulers run
slower than their bounds. A plan with time dilation shows each point's k; with
`time_dilation: auto` the k this machine's calibration picks (emu/sweeps/autodilate.py), or
that the first run calibrates (and how long that takes). Nothing
here writes: results (and the calibration) are only read.
"""
from __future__ import annotations

import datetime as dt
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from emu.config.autodilation import MARGIN
from emu.config.experiment import Experiment
from emu.config.plan import Plan
from emu.sweeps import autodilate, calibrate
from emu.sweeps.sweep import plan_runs

# Set-up and teardown of one run where the results hold no earlier run to learn it from: building
# the network, starting the roles, connecting, the monitors' first and last samples. Measured on the
# reference machine (2 cores) as wall time less iterations x median iteration: medians of 2.1-5.4 s
# over the shortened demo, priority8, priority_startup and topology sweeps (23 s at most).
SETUP_S = 4.0

IterationBound = Callable[[Experiment], "float | None"]
StartupTime = Callable[[Experiment], float]   # emulated seconds before the first iteration (a probe)


@dataclass(frozen=True)
class Point:
    """One experiment of the plan as the dry run shows it."""

    label: str
    scheduler: str
    runs: int
    done: int
    run_s: float | None   # estimated wall time of one run
    basis: str            # "earlier runs", "bound" or "unknown"
    k: str = "1"          # time dilation: the number, or "auto: 3" (the choice here), "auto: not calibrated"
    ids: tuple[str, ...] = ()   # its runs' ids (this shard's)


def _earlier(sweep_dir: Path) -> pd.DataFrame:
    path = sweep_dir / "runs.parquet"
    if not path.exists():
        return pd.DataFrame(columns=["run_id", "status", "wall_s"])
    return pd.read_parquet(path, columns=None)


def _setup_s(earlier: pd.DataFrame) -> float:
    """A run's set-up and teardown, from this sweep's earlier runs where it has some."""
    ok = earlier[earlier["status"] == "ok"] if "status" in earlier else earlier.iloc[:0]
    need = {"wall_s", "iter_time_median_s", "workload.iterations"}
    if not len(ok) or not need <= set(ok.columns):
        return SETUP_S
    dilation = ok["time_dilation"].fillna(1.0) if "time_dilation" in ok else 1.0
    rest = ok["wall_s"] - ok["iter_time_median_s"] * ok["workload.iterations"] * dilation
    rest = rest[rest > 0]
    return float(rest.median()) if len(rest) else SETUP_S


def _run_estimate(exp: Experiment, ids: list[str], walls: dict[str, float], setup_s: float,
                  iteration_bound: IterationBound, k: float | None = None,
                  startup: StartupTime | None = None) -> tuple[float | None, str]:
    """`k`: the time dilation it runs at (default: the experiment's; None for `auto` without a choice)."""
    known = [walls[r] for r in ids if r in walls]
    if known:
        return float(pd.Series(known).median()), "earlier runs"
    k = k if k is not None or exp.auto_dilation else float(exp.time_dilation)
    bound = iteration_bound(exp)
    if bound is None or not math.isfinite(bound) or k is None:
        return None, "unknown"
    stalled = sum(f.for_s or 0.0 for f in exp.faults)  # a stopped worker or a cut link stalls the job that long
    first = startup(exp) if startup is not None else 0.0
    return min(setup_s + (bound * exp.workload["iterations"] + stalled + first) * k,
               setup_s + exp.timeout_s * k), "bound"


def points(plan: Plan, results_root: Path, iteration_bound: IterationBound, force: bool = False,
           shard: tuple[int, int] | None = None, own_load: Callable[[], float] | None = None,
           startup: StartupTime | None = None) -> list[Point]:
    """The plan's experiments (this shard's), each with its runs, those done and an estimate.
    `own_load`: the machine's own load in CPUs for `time_dilation: auto` (default: measured now, once);
    `startup`: the time a scheduler takes before its first iteration (given by the layer above)."""
    earlier = _earlier(results_root / plan.name)
    ok = earlier[earlier["status"] == "ok"] if len(earlier) else earlier
    walls = dict(zip(ok["run_id"], ok["wall_s"])) if len(ok) else {}
    done = set() if force else set(walls)
    setup_s = _setup_s(earlier)
    labels = {id(e): t for e, t in zip(plan.experiments, plan.labels())}
    by_exp: dict[int, list] = {}
    for exp, repeat, point in plan_runs(plan, shard):
        by_exp.setdefault(id(exp), [exp, point, []])[2].append(exp.run_id(repeat))
    out = []
    base = _once(own_load or (lambda: calibrate.own_load(None)))   # measured once, where needed
    for exp, point, ids in by_exp.values():
        k, k_text = autodilate.planned(exp, base)
        run_s, basis = _run_estimate(exp, ids, walls, setup_s, iteration_bound, k, startup)
        out.append(Point(labels[id(exp)], treatment(exp, point), len(ids), sum(r in done for r in ids), run_s, basis,
                         k_text, tuple(ids)))
    return out


def _once(fn: Callable[[], float]) -> Callable[[], float]:
    got: list[float] = []
    return lambda: got[0] if got else got.append(fn()) or got[0]


def treatment(exp: Experiment, point: dict) -> str:
    """The scheduler as the point sets it: its variant label, and the tunables the point sets one by one."""
    own = f"schedulers.{exp.scheduler}."
    params = [f"{k[len(own):]}={v}" for k, v in point.items() if k.startswith(own) and not isinstance(v, (dict, list))]
    return " ".join([exp.scheduler + (f" ({exp.label})" if exp.label else ""), *params])


def _duration(seconds: float) -> str:
    return str(dt.timedelta(seconds=round(seconds)))


def render(plan: Plan, pts: list[Point], results_root: Path) -> str:
    """The dry run's text: a table of the points, then the counts and the estimate."""
    width = max([len(p.label) for p in pts] + [5])
    sw = max([len(p.scheduler) for p in pts] + [9])
    dilated = any(p.k != "1" for p in pts)
    kw = max([len(p.k) for p in pts] + [1]) if dilated else 0
    k_head = f"{'k':<{kw}}  " if dilated else ""
    lines = [f"dry run of {plan.source} into {results_root / plan.name} (nothing is created)",
             f"{'#':>3}  {'point':<{width}}  {'scheduler':<{sw}} {k_head}{'runs':>4} {'done':>4} {'per run':>8}  basis"]
    for i, p in enumerate(pts, 1):
        est = _duration(p.run_s) if p.run_s is not None else "?"
        k_cell = f"{p.k:<{kw}}  " if dilated else ""
        lines.append(f"{i:>3}  {p.label or '-':<{width}}  {p.scheduler:<{sw}} {k_cell}{p.runs:>4} {p.done:>4} "
                     f"{est:>8}  {p.basis}")
    runs = sum(p.runs for p in pts)
    done = sum(p.done for p in pts)
    left = [(p.runs - p.done, p.run_s) for p in pts if p.runs > p.done]
    unknown = sum(n for n, s in left if s is None)
    total = sum(n * s for n, s in left if s is not None)
    lines.append(f"{runs} run(s) in {len(pts)} point(s) x {plan.repeats} repeat(s); {done} done, "
                 f"{runs - done} to run")
    lines.append(f"estimated wall time: {_duration(total)}" + (f" (+ {unknown} run(s) without an estimate)"
                 if unknown else "") + " (earlier runs of the same point where the results have them, else "
                 "each iteration at its analytic bound, plus its faults' duration, the scheduler's start-up and the "
                 "set-up a run costs: "
                 "schedulers are slower than their bounds)")
    lines += auto_notes(plan)
    return "\n".join(lines)


def auto_notes(plan: Plan) -> list[str]:
    """What a plan with `time_dilation: auto` needs from this machine's calibration."""
    auto = [e for e in plan.experiments if e.auto_dilation]
    if not auto:
        return []
    missing = {e.scheduler: calibrate.CAL_EST_S[calibrate.family(e)] for e in auto if calibrate.cached(e)[0] is None}
    path = calibrate.cache_path(calibrate.describe_machine())
    if not missing:
        return [f"time_dilation auto: k is the smallest whole k this machine's calibration ({path}) and its own "
                f"load now predict keep the CPU idle at cpu_idle_min + {MARGIN:g} (idle shown at k and k - 1); a run "
                f"measures that load again when it starts"]
    return [f"time_dilation auto: this machine is not calibrated yet for {', '.join(sorted(missing))}: the first "
            f"run of each calibrates it (a few short runs, as root: about {_duration(sum(missing.values()))} in all, "
            f"not in the estimate), then picks k; its runs have no estimate until then (cache: {path})"]


def render_tune(spec, results_root: Path, iteration_bound: IterationBound) -> str:
    """A tune's dry run (`spec`: emu.sweeps.tune.TuneSpec): its setting, budget, trials done and the time left."""
    from emu.sweeps import tune

    tune_dir = results_root / spec.name
    study = tune.existing_study(spec, tune_dir)
    done = len(tune.counted(study)) if study is not None else 0
    earlier = _earlier(tune_dir)
    ok = earlier[earlier["status"] == "ok"] if len(earlier) else earlier
    if len(ok):
        trial_s, basis = float(ok["wall_s"].median()), "earlier trials"
    else:
        trial_s, basis = _run_estimate(spec.base, [], {}, _setup_s(earlier), iteration_bound,
                                       autodilate.planned(spec.base, lambda: calibrate.own_load(None))[0])
    left = max(spec.budget - done, 0)
    labels = spec.plan.labels()
    where = next((labels[i] for i, p in enumerate(spec.plan.points)
                  if labels[i] and all(p.get(k) == v for k, v in spec.setting.items())), "the config's setting")
    est = f"{_duration(left * trial_s)} ({_duration(trial_s)} per trial, from {basis})" if trial_s is not None \
        else "unknown (no profile for this workload)"
    return "\n".join([
        f"dry run of tune {spec.name} into {tune_dir} (nothing is created)",
        f"scheduler {spec.scheduler}, tunables {', '.join(tune.tunables(spec.dims))}, sampler {spec.sampler} "
        f"(seed {spec.seed}), on {where}",
        f"budget {spec.budget} trial(s): {done} done, {left} to run",
        f"estimated wall time: {est}" + (f"; --max-minutes {spec.max_minutes:g} stops it earlier"
                                         if spec.max_minutes is not None and trial_s is not None
                                         and left * trial_s > spec.max_minutes * 60 else "")])
