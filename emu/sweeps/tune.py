"""Tuning a scheduler's tunables by Bayesian optimisation, one network setting at a time
(`./inv tune`), as ByteScheduler tunes its partition and credit sizes.

A tune takes one experiment of a config (its network setting and workload), sets the
scheduler, and runs a trial per point the sampler proposes: one real run of the experiment with
the trial's tunables, through the same path as `./inv run` (`run_plan`), so each trial is a
normal row of `results/<tune>/runs.parquet`. The objective is the run's median iteration
(`iter_time_median_s`), minimised. The first trial runs the config's own values (when they lie
in the search space), so the tune measures what it improves on.

The sampler is optuna's (TPE, or its Gaussian-process sampler), seeded. Its state is the study
in `results/<tune>/study.db` (SQLite), so a tune resumes: trials that finished are not run
again, a trial that was interrupted runs again first, and the sampler is re-seeded per trial
from (seed, trial number), so a resumed tune proposes what an uninterrupted one would, given
the same measurements. A proposal whose experiment already completed (the same tunables
twice) reuses that run's row instead of running it again.

`tuned.json` holds the best trial, every trial, the search space, the library, sampler and
seed, and the cost; `tuned.yaml` the best tunables as a `set:` fragment (docs/tutorial.md:
Tuning a scheduler).
"""
from __future__ import annotations

import datetime as dt
import hashlib
import json
import math
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from contracts.scheduler_info import TuneDim
from emu.config.errors import quote
from emu.config.experiment import ConfigError, Experiment, Sections, validate_experiment
from emu.config.plan import MAX_RUNS, Plan, at_point, load_plan
from emu.run.results import completed, read_runs, write_text

OBJECTIVE = "iter_time_median_s"
SAMPLERS = ("tpe", "gp")
MAX_BUDGET = 1_000  # trials of one tune; each is a real run of seconds to minutes
# Random trials before the sampler's model takes over (a fixed number, so that a tune extended with
# a larger budget proposes what one run with that budget from the start would).
STARTUP_TRIALS = 5
STUDY_FILE, TUNED_JSON, TUNED_YAML = "study.db", "tuned.json", "tuned.yaml"


# A scheduler's search space is its class's `tuning` (contracts/scheduler_info.py TuneDim), handed
# over in Sections.infos: a box of log-uniform coordinates, each setting one tunable, directly or
# as a ratio of another (bytescheduler's credit as a multiple of its partition).
Space = tuple[TuneDim, ...]


def describe(d: TuneDim) -> dict[str, Any]:
    """A coordinate as tuned.json and the study's fingerprint record it."""
    return {"low": d.low, "high": d.high, "log": True, "type": "int" if d.integer else "float", "about": d.about}


def tunables(space: Space) -> tuple[str, ...]:
    """The config keys a point of the space sets."""
    return tuple(d.param for d in space)


def to_params(space: Space, coords: dict[str, Any]) -> dict[str, Any]:
    """Search coordinates -> the scheduler's config values (a ratio's base first)."""
    out: dict[str, Any] = {d.param: int(coords[d.name]) if d.integer else float(coords[d.name])
                           for d in space if d.ratio_of is None}
    for d in space:
        if d.ratio_of is not None:
            base = out[d.ratio_of]
            out[d.param] = max(base, round(base * float(coords[d.name])))
    return {k: out[k] for k in tunables(space)}


def to_coords(space: Space, params: dict[str, Any]) -> dict[str, Any] | None:
    """Config values -> search coordinates; None when they lie outside the space."""
    coords: dict[str, Any] = {}
    for d in space:
        if d.ratio_of is not None:
            coords[d.name] = params[d.param] / int(params[d.ratio_of])
        else:
            coords[d.name] = int(params[d.param]) if d.integer else float(params[d.param])
    if not all(d.low <= coords[d.name] <= d.high for d in space):
        return None
    if to_params(space, coords) != {k: params[k] for k in tunables(space)}:
        return None
    return coords


def tunable(sections: Sections) -> list[str]:
    """The schedulers that declare a search space, in registry order."""
    return [name for name, info in sections.infos.items() if info.tuning]


@dataclass(frozen=True)
class TuneSpec:
    """A validated tune request: everything checked before anything is created."""

    name: str
    scheduler: str
    budget: int
    seed: int
    sampler: str
    max_minutes: float | None
    base: Experiment            # the setting, with the scheduler set and the config's tunables
    setting: dict[str, Any]     # the grid point the setting came from (empty without a grid)
    plan: Plan
    sections: Sections
    command: str = ""
    source: dict[str, Any] = field(default_factory=dict)   # config, point, overrides

    @property
    def dims(self) -> Space:
        return self.sections.infos[self.scheduler].tuning

    def fingerprint(self) -> str:
        """What a study may be resumed with: the setting, the scheduler and its tunables that are
        not searched (e.g. startup_us), the search space, the sampler and its seed (not the
        budget: it may grow)."""
        setting = {k: v for k, v in self.base.resolved().items() if k not in ("schedulers", "name")}
        fixed = {k: v for k, v in self.base.scheduler_params.items() if k not in tunables(self.dims)}
        blob = json.dumps({"setting": setting, "scheduler": self.scheduler, "fixed": fixed, "sampler": self.sampler,
                           "seed": self.seed, "space": [describe(d) for d in self.dims]}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def experiment(self, params: dict[str, Any]) -> Experiment:
        """The setting with these tunables, validated as any experiment."""
        raw = self.base.model_dump(mode="json")
        raw["schedulers"] = {**raw["schedulers"], self.scheduler: {**raw["schedulers"][self.scheduler], **params}}
        return validate_experiment(raw, self.sections, self.plan.paths_from)


def _integer(text: Any, what: str, low: int, high: int) -> int:
    try:
        value = int(str(text).strip())
    except ValueError:
        raise ConfigError(f"{what} {quote(text)}: must be an integer") from None
    if not low <= value <= high:
        raise ConfigError(f"{what} {value}: must be from {low} to {high}")
    return value


def _check_request(scheduler: str | None, budget: Any, sampler: str, max_minutes: Any, seed: Any,
                   sections: Sections) -> tuple[int, float | None, int]:
    known, spaces = sorted(sections.schedulers), tunable(sections)
    if not scheduler:
        raise ConfigError(f"--scheduler: required (tunable: {', '.join(spaces)})")
    if known and scheduler not in known:
        raise ConfigError(f"--scheduler {quote(scheduler)}: unknown scheduler (known: {', '.join(known)})")
    if scheduler not in spaces:
        raise ConfigError(f"--scheduler {scheduler}: has no tunables to tune (tunable: {', '.join(spaces)})")
    if budget is None:
        raise ConfigError("--budget: required (the number of trials, each one run)")
    n = _integer(budget, "--budget", 1, MAX_BUDGET)
    if sampler not in SAMPLERS:
        raise ConfigError(f"--sampler {quote(sampler)}: unknown sampler (known: {', '.join(SAMPLERS)})")
    cap = None
    if max_minutes is not None:
        try:
            cap = float(max_minutes)
        except ValueError:
            raise ConfigError(f"--max-minutes {quote(max_minutes)}: must be a number") from None
        if not math.isfinite(cap) or cap <= 0:
            raise ConfigError(f"--max-minutes {quote(max_minutes)}: must be > 0")
    return n, cap, _integer(seed, "--seed", 0, 2 ** 32 - 1)


def _settings(plan: Plan, scheduler: str, name: str | None, sections: Sections
              ) -> list[tuple[Experiment, dict[str, Any]]]:
    """The plan's distinct network settings (experiments once the scheduler is set), in plan order."""
    out: dict[str, tuple[Experiment, dict[str, Any]]] = {}
    for exp, point in zip(plan.experiments, plan.points):
        raw = exp.model_dump(mode="json")
        raw.update(scheduler=scheduler, label=None)
        raw["schedulers"] = {scheduler: raw["schedulers"].get(scheduler, {})}
        if name is not None:
            raw["name"] = name
        try:
            variant = validate_experiment(raw, sections, plan.paths_from)
        except ConfigError as e:
            raise at_point(e, point) from None
        setting = {k: v for k, v in point.items() if k not in ("scheduler", "label") and not k.startswith("schedulers")}
        out.setdefault(variant.run_id(0), (variant, setting))
    return list(out.values())


def _with_plan_plugins(plan: Plan, sections: Sections) -> Sections:
    """The sections with the schedulers of the plan's plugins (its config's `plugins:`), so that a
    plugin's scheduler is tuned like a built-in one."""
    specs = list(dict.fromkeys(p.spec for e in plan.experiments for p in e.plugins if p.kind != "entry_point"))
    return sections.with_plugins(specs, plan.paths_from) if specs and sections.with_plugins else sections


def prepare(config: str | Path, scheduler: str | None, budget: Any, sections: Sections, overrides: list[str] = (),
            point: Any = None, name: str | None = None, seed: Any = 0, sampler: str = "tpe",
            max_minutes: Any = None, results_root: Path | None = None, command: str = "") -> TuneSpec:
    """A tune request checked in full (a ConfigError names what is wrong); creates nothing.
    A config whose grid holds several network settings needs `point`: which one (0-based, in
    the plan's order, settings that differ only in the scheduler counted once). With
    `results_root`, a study already there must be of this request (it is then resumed)."""
    plan = None
    if scheduler and sections.schedulers and scheduler not in sections.schedulers:  # a plugin's? the config says
        plan = load_plan(config, sections, list(overrides))
        sections = _with_plan_plugins(plan, sections)
    n, cap, seed_ = _check_request(scheduler, budget, sampler, max_minutes, seed, sections)
    i = None if point is None else _integer(point, "--point", 0, MAX_RUNS - 1)
    plan = plan or load_plan(config, sections, list(overrides))
    default_name = f"{plan.name}-tune-{scheduler}" + (f"-{i}" if i is not None else "")
    settings = _settings(plan, scheduler, name or default_name[:64], sections)
    if i is None and len(settings) > 1:
        first = ", ".join(f"{key}={v}" for key, v in settings[0][1].items())
        raise ConfigError(f"{config}: {len(settings)} network settings; tune one at a time with --point 0 to "
                          f"{len(settings) - 1}, in the order of its grid and zip (0: {first}; ...)")
    if i is not None and i >= len(settings):
        raise ConfigError(f"--point {i}: {config} has {len(settings)} network setting(s), 0 to {len(settings) - 1}")
    base, setting = settings[i or 0]
    spec = TuneSpec(name=base.name, scheduler=scheduler, budget=n, seed=seed_, sampler=sampler, max_minutes=cap,
                    base=base, setting=setting, plan=plan, sections=sections, command=command,
                    source={"config": str(config), "point": i, "overrides": list(overrides)})
    if results_root is not None:
        _check_resumable(spec, Path(results_root) / spec.name)
    return spec


# ---------------------------------------------------------------------------- the study

def _optuna():
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)   # a line per trial is ours (stderr)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    return optuna


def _sampler(spec: TuneSpec, trial_index: int):
    """A sampler seeded from (seed, trial index): a resumed tune proposes what an uninterrupted one would."""
    optuna = _optuna()
    seed = (spec.seed * 1_000_003 + trial_index) % 2 ** 32
    startup = STARTUP_TRIALS
    if spec.sampler == "gp":
        return optuna.samplers.GPSampler(seed=seed, n_startup_trials=startup)
    return optuna.samplers.TPESampler(seed=seed, n_startup_trials=startup)


def _check_resumable(spec: TuneSpec, tune_dir: Path):
    """The study in `tune_dir` if there is one, refused if it is not of this request; None if there is none."""
    path = tune_dir / STUDY_FILE
    if not path.exists():
        return None
    optuna = _optuna()
    try:
        study = optuna.load_study(study_name="tune", storage=f"sqlite:///{path}")
    except (KeyError, ValueError, RuntimeError) as e:   # not a study of ours
        raise ConfigError(f"{path}: not a tune's study ({type(e).__name__}); remove it or tune under another "
                          f"--name") from None
    if study.user_attrs.get("fingerprint") != spec.fingerprint():
        raise ConfigError(f"{path}: holds a tune of another setting, scheduler, search space, sampler or seed; "
                          f"tune under another --name, or remove {tune_dir}")
    return study


def existing_study(spec: TuneSpec, tune_dir: Path):
    """The tune's study if one is there (read, not created); None otherwise; one of another request refused."""
    return _check_resumable(spec, tune_dir)


def open_study(spec: TuneSpec, tune_dir: Path):
    """The tune's study, created (the config's values queued first) or loaded; a study of
    another setting or search is refused. Interrupted trials are closed and queued again."""
    optuna = _optuna()
    path = tune_dir / STUDY_FILE
    study = _check_resumable(spec, tune_dir)
    if study is None:
        tune_dir.mkdir(parents=True, exist_ok=True)
        study = optuna.create_study(study_name="tune", storage=f"sqlite:///{path}", direction="minimize")
        study.set_user_attr("fingerprint", spec.fingerprint())
        study.set_user_attr("wall_s", 0.0)
        coords = to_coords(spec.dims, spec.base.scheduler_params)
        if coords is not None:
            study.enqueue_trial(coords, user_attrs={"origin": "config"})
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        study.tell(t.number, state=optuna.trial.TrialState.FAIL)   # killed mid-run: run it again first
        study.enqueue_trial(t.params, user_attrs={"origin": f"rerun of trial {t.number}"})
    return study


def counted(study) -> list:
    """The trials that ran (or reused) an experiment to its end: what the budget counts."""
    return [t for t in study.get_trials(deepcopy=False) if t.user_attrs.get("status") in ("ok", "failed")]


def _suggest(trial, dims: Space) -> dict[str, Any]:
    return {d.name: trial.suggest_int(d.name, int(d.low), int(d.high), log=True) if d.integer
            else trial.suggest_float(d.name, d.low, d.high, log=True) for d in dims}


RunFn = Callable[[Experiment, Path, dict[str, Any]], dict[str, Any]]


def run_experiment(exp: Experiment, results_root: Path, point: dict[str, Any]) -> dict[str, Any]:
    """One trial's run through `run_plan` (the path of `./inv run`); its row."""
    from emu.sweeps.sweep import run_plan  # imports Mininet

    rows = run_plan(Plan(name=exp.name, experiments=[exp], repeats=1, source=Path(TUNED_JSON), points=[point]),
                    results_root)
    if rows:
        return rows[0]
    runs = read_runs(results_root / exp.name)
    return runs[runs["run_id"] == exp.run_id(0)].iloc[-1].to_dict()


def _one_trial(study, spec: TuneSpec, results_root: Path, run: RunFn) -> Any:
    """Ask, run (or reuse a completed run of the same tunables), tell. A KeyboardInterrupt
    leaves the trial running in the study, to be closed and run again on resume."""
    optuna = _optuna()
    trial = study.ask()
    params = to_params(spec.dims, _suggest(trial, spec.dims))
    exp = spec.experiment(params)
    rid = exp.run_id(0)
    trial.set_user_attr("params", params)
    trial.set_user_attr("run_id", rid)
    tune_dir = results_root / spec.name
    reused = rid in completed(tune_dir)
    if reused:
        runs = read_runs(tune_dir)
        row = runs[runs["run_id"] == rid].iloc[-1].to_dict()
    else:
        row = run(exp, results_root, {f"schedulers.{spec.scheduler}.{k}": v for k, v in params.items()})
    ok = row.get("status") == "ok" and _finite(row.get(OBJECTIVE))
    fidelity = row.get("fidelity_ok")   # a bool, numpy's from a stored row, or missing (NaN, None)
    attrs = {"status": "ok" if ok else "failed", "reused": reused, "wall_s": _num(row.get("wall_s")),
             "reason": str(row.get("reason") or ("" if ok else f"no {OBJECTIVE}")),
             "fidelity_ok": bool(fidelity) if type(fidelity).__name__ in ("bool", "bool_") else None}
    for k, v in attrs.items():
        trial.set_user_attr(k, v)
    if ok:
        return study.tell(trial, float(row[OBJECTIVE]))
    return study.tell(trial, state=optuna.trial.TrialState.FAIL)


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _num(v: Any) -> float | None:
    return float(v) if _finite(v) else None


def _log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def tune(spec: TuneSpec, results_root: Path, run: RunFn = run_experiment,
         log: Callable[[str], None] = _log) -> dict[str, Any]:
    """Run trials until `spec.budget` have finished (those of earlier calls count) or the
    wall-clock cap would be passed; write tuned.json (and tuned.yaml once a trial succeeded)
    after every trial. Returns the tuned.json record."""
    tune_dir = results_root / spec.name
    study = open_study(spec, tune_dir)
    wall0, t0 = float(study.user_attrs.get("wall_s", 0.0)), time.monotonic()
    walls: list[float] = []
    try:
        while len(counted(study)) < spec.budget:
            elapsed = time.monotonic() - t0
            if spec.max_minutes is not None and walls and \
                    elapsed + sum(walls) / len(walls) > spec.max_minutes * 60:
                log(f"tune: stopping at the wall-clock cap ({spec.max_minutes:g} min): {len(counted(study))} of "
                    f"{spec.budget} trials done; the same command resumes")
                break
            study.sampler = _sampler(spec, len(study.get_trials(deepcopy=False)))
            start = time.monotonic()
            frozen = _one_trial(study, spec, results_root, run)
            walls.append(time.monotonic() - start)
            study.set_user_attr("wall_s", wall0 + time.monotonic() - t0)
            log(_progress_line(study, frozen, spec, walls))
            write_outputs(study, spec, tune_dir)
    finally:
        study.set_user_attr("wall_s", wall0 + time.monotonic() - t0)
        record = write_outputs(study, spec, tune_dir)
    return record


def _progress_line(study, frozen, spec: TuneSpec, walls: list[float]) -> str:
    done = len(counted(study))
    params = ", ".join(f"{k}={v}" for k, v in frozen.user_attrs["params"].items())
    what = f"{frozen.value * 1e3:.0f} ms" if frozen.value is not None else \
        f"failed ({frozen.user_attrs.get('reason', '')[:120]})"
    line = f"tune: trial {done}/{spec.budget} ({params}): {what}"
    if frozen.user_attrs.get("reused"):
        line += " (measured before: run reused)"
    best = _best(study)
    if best is not None:
        line += f"; best {best.value * 1e3:.0f} ms (trial {best.number})"
    left = spec.budget - done
    if left:
        line += f"; ETA {dt.timedelta(seconds=round(sum(walls) / len(walls) * left))} for {left} more"
    return line


def _best(study):
    ok = [t for t in study.get_trials(deepcopy=False) if t.value is not None]
    return min(ok, key=lambda t: (t.value, t.number)) if ok else None


# ---------------------------------------------------------------------------- records

def _trial_record(t) -> dict[str, Any]:
    # A trial without a status was stopped: killed (closed on resume) or running when this is written after Ctrl-C.
    status = t.user_attrs.get("status") or "interrupted"
    return {"trial": t.number, "params": t.user_attrs.get("params"), "search": dict(t.params),
            "objective": t.value, "run_id": t.user_attrs.get("run_id"), "status": status,
            "reason": t.user_attrs.get("reason", ""), "reused": t.user_attrs.get("reused"),
            "wall_s": t.user_attrs.get("wall_s"), "fidelity_ok": t.user_attrs.get("fidelity_ok"),
            "origin": t.user_attrs.get("origin", "sampler")}


def record(study, spec: TuneSpec) -> dict[str, Any]:
    """What tuned.json holds (docs/tutorial.md: Tuning a scheduler)."""
    import optuna

    trials = [_trial_record(t) for t in study.get_trials(deepcopy=False) if t.state.name != "WAITING"]
    best = _best(study)
    config_trial = next((t for t in trials if t["origin"] == "config" and t["status"] == "ok"), None)
    ran = [t for t in trials if not t["reused"]]
    return {
        "tune": spec.name, "scheduler": spec.scheduler, "command": spec.command, **spec.source,
        "setting": {"point": spec.setting, "network": spec.base.net.describe(),
                    "workload": spec.base.workload, "seed": spec.base.seed},
        "objective": f"{OBJECTIVE}: the run's median iteration time in seconds, minimised",
        "search_space": {d.name: describe(d) for d in spec.dims},
        "library": {"name": "optuna", "version": optuna.__version__,
                    "sampler": {"tpe": "TPESampler", "gp": "GPSampler"}[spec.sampler], "seed": spec.seed,
                    "storage": STUDY_FILE, "reseeded": "per trial, from (seed, trial number)"},
        "budget": spec.budget,
        "best": None if best is None else {"trial": best.number, "params": best.user_attrs["params"],
                                           "objective": best.value, "run_id": best.user_attrs["run_id"]},
        "config_values": {"params": {k: spec.base.scheduler_params[k] for k in tunables(spec.dims)},
                          "objective": config_trial["objective"] if config_trial else None,
                          "run_id": config_trial["run_id"] if config_trial else None},
        "cost": {"trials": len(counted(study)), "runs": len(ran),
                 "run_wall_s": sum(t["wall_s"] or 0.0 for t in ran),
                 "wall_s": float(study.user_attrs.get("wall_s", 0.0))},
        "trials": trials,
        "updated_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }


def fragment(rec: dict[str, Any]) -> str:
    """tuned.yaml: the best tunables as one dotted key, for a sweep's `set:` or `zip:` or `--set`."""
    best, key = rec["best"], f"schedulers.{rec['scheduler']}"
    flow = yaml.safe_dump(best["params"], default_flow_style=True, sort_keys=False).strip()
    was = rec["config_values"]
    before = f"; the config's values: {was['objective'] * 1e3:.0f} ms" if was["objective"] is not None else ""
    return (f"# ./inv tune of {rec['scheduler']} on {rec['setting']['network']} ({rec['tune']}):\n"
            f"# best of {rec['cost']['trials']} trials, trial {best['trial']}, median iteration "
            f"{best['objective'] * 1e3:.0f} ms{before} (tuned.json has every trial).\n"
            f"# Use: a sweep file's set: or zip: (docs/tutorial.md: Tuning a scheduler), or --set \"{key}={flow}\"\n"
            f"{key}: {flow}\n")


def write_outputs(study, spec: TuneSpec, tune_dir: Path) -> dict[str, Any]:
    rec = record(study, spec)
    write_text(tune_dir / TUNED_JSON, json.dumps(rec, indent=1, default=str) + "\n")
    if rec["best"] is not None:
        write_text(tune_dir / TUNED_YAML, fragment(rec))
    return rec
