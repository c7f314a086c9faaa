"""Invoke tasks: a thin layer over emu/, workloads/, schedulers/ and analysis/.

    ./inv --list            what there is
    sudo ./inv demo         the demo experiment, then its plot
    sudo ./inv test         the test suite
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

from invoke import Exit, task

REPO = Path(__file__).resolve().parent
RESULTS = REPO / "results"


def _sections():
    """What config validation needs from the upper layers: the workload's model, the registry's
    schedulers (installed packages' entry points included) and how to load a config's plugins."""
    from emu.config.experiment import ConfigError, Sections
    from schedulers.registry import infos, params_models, plugins
    from workloads.config import WorkloadConfig

    try:
        installed = plugins.load_entry_points()
    except plugins.PluginError as e:
        raise ConfigError(str(e)) from None
    return Sections(workload=WorkloadConfig, schedulers=params_models(), infos=infos(), with_plugins=_with_plugins,
                    plugins={p.spec: _identity(p) for p in installed})


def _identity(p) -> dict:
    """A loaded plugin as emu/config's PluginRef: its identity, and how the runner finds it (not hashed)."""
    return {**p.identity(), "path": p.path if p.kind == "file" else None, "module": p.module}


def _with_plugins(specs: list[str], base_dir: Path):
    """Sections.with_plugins: the config's plugins loaded into the registry, then the sections again."""
    from dataclasses import replace

    from emu.config.experiment import ConfigError
    from schedulers.registry import plugins

    try:
        loaded = plugins.load_plugins(specs, base_dir)
    except plugins.PluginError as e:
        raise ConfigError(str(e)) from None
    sections = _sections()
    return replace(sections, plugins={**sections.plugins, **{p.spec: _identity(p) for p in loaded}})


def _hand_over_infos() -> None:
    """Analysis reads what it knows of a scheduler from the run's row; rows written before runs
    recorded it get the registry's description (analysis/catalog.py), so old results read the same."""
    from analysis import catalog
    from schedulers.registry import infos

    catalog.install(infos())


def _need_root(what: str) -> None:
    if os.geteuid() != 0:
        raise Exit(f"error: {what} needs root for Mininet; run it as: sudo ./inv {what}", code=2)


def _parse_shard(text: str | None) -> tuple[int, int] | None:
    from emu.config.experiment import ConfigError

    if text is None:
        return None
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise ConfigError(f"--shard {text!r}: expected i/n, e.g. 0/4") from None
    if not 0 <= i < n:
        raise ConfigError(f"--shard {text!r}: need 0 <= i < n")
    return i, n


def _add_bounds(sweep_dir: Path) -> None:
    """Analytic lower bounds and efficiency into each completed run's row."""
    from analysis.bounds import annotate
    from emu.run.results import update_runs

    _hand_over_infos()
    if (sweep_dir / "runs.parquet").exists():
        update_runs(sweep_dir, lambda runs: annotate(runs, sweep_dir))


def _ensure_ray() -> None:
    """Ray is an optional dependency group (pyproject.toml: ray): the first --ray installs its
    lock, requirements-ray.txt, into this environment (scripts/setup.sh ray, one line on stderr)."""
    import importlib
    import importlib.util
    import subprocess

    if importlib.util.find_spec("ray") is not None:
        return
    rc = subprocess.run([str(REPO / "scripts" / "setup.sh"), "ray"], env={**os.environ, "SCHEDLAB_VENV": sys.prefix}
                        ).returncode
    importlib.invalidate_caches()
    if rc or importlib.util.find_spec("ray") is None:
        raise Exit(f"error: --ray: installing Ray (requirements-ray.txt) into {sys.prefix} failed (output above)",
                   code=1)


def _iteration_bound(exp) -> float | None:
    """An iteration's analytic lower bound before the run (the dry run's estimate): the larger of
    the profile's compute and the scheduler's bound model on the configured network (analysis/bounds.py)."""
    import json

    from analysis import bounds
    from emu.config.capacity import capacity_graph
    from schedulers.registry import infos
    from workloads.config import WorkloadConfig

    try:
        profile = json.loads(WorkloadConfig.model_validate(exp.workload).profile_path.read_text())
    except (OSError, ValueError):
        return None  # no profile for this model and preset: no estimate
    info = infos().get(exp.scheduler)
    workers, servers = list(exp.roles.workers), list(exp.roles.servers)
    model = bounds.bound_model(info.bound_model if info else None, workers, servers)
    g = bounds.payload_graph(capacity_graph(exp.net))
    grad = float(profile["grad_bytes"])
    comm = bounds.cut_bound_s(g, workers, grad) if model in (bounds.CUT, bounds.NO_BOUND) else \
        bounds.model_bound_s(model, g, workers, servers, grad)
    return max(float(profile["iteration_s"]) / float(exp.workload.get("speedup", 1.0)), comm)


def _startup_s(exp) -> float:
    """What the scheduler spends before its first iteration, in emulated seconds (the dry run's
    estimate): the registry's `startup_s` on the experiment's tunables."""
    from schedulers import registry

    cls = registry.SCHEDULERS.get(exp.scheduler)
    if cls is None:
        return 0.0
    return cls.startup_s(cls.Params.model_validate(exp.scheduler_params), len(exp.roles.workers))


def _workload_facts(exp):
    """What the results-size model needs of the workload (emu/config/footprint.py), from its profile;
    None where it has none."""
    import json

    from emu.config.footprint import WorkloadFacts
    from workloads.config import WorkloadConfig

    try:
        profile = json.loads(WorkloadConfig.model_validate(exp.workload).profile_path.read_text())
        return WorkloadFacts(layers=len(profile["layers"]), grad_bytes=int(profile["grad_bytes"]),
                             keys=sum(len(layer["keys"]) for layer in profile["layers"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _space(plan, results: str, force: bool, shard):
    """The runs left and the free space where they go (emu/sweeps/space.py)."""
    from emu.sweeps import dryrun, space

    pts = dryrun.points(plan, Path(results), _iteration_bound, force=force, shard=shard, own_load=lambda: 0.0)
    return space.estimate(plan, Path(results), pts, _workload_facts, force=force)


def _dry_run(plan, results: str, force: bool, shard) -> None:
    from emu.run.results import unwritable
    from emu.sweeps import dryrun, space

    pts = dryrun.points(plan, Path(results), _iteration_bound, force=force, shard=shard, startup=_startup_s)
    need = space.estimate(plan, Path(results), pts, _workload_facts, force=force)
    text = dryrun.render(plan, pts, Path(results)) + f"\nresults size: {need.figures()}"
    why = unwritable(Path(results) / plan.name)
    if why is not None:
        text += f"\nwarning: the results cannot be written: {why}"
    if not need.fits:
        text += f"\nwarning: this sweep cannot fit: {need.refusal()}"
    try:
        print(text, flush=True)
    except BrokenPipeError:  # `--dry-run | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def _results_error(e, sweep_dir: Path) -> str:
    """A ResultsError's line: the path and cause, then what is kept and what became of the run in flight."""
    from emu.run.results import read_runs

    try:
        kept = f"{int((read_runs(sweep_dir)['status'] == 'ok').sum())} completed run(s) kept in runs.parquet" \
            if (sweep_dir / "runs.parquet").exists() else "no runs.parquet"
    except Exception:  # noqa: BLE001 - the line is what matters; an unreadable file says so
        kept = "runs.parquet unreadable"
    flight = "" if e.run_id is None else f", the run in flight ({e.run_id}) " + (
        "recorded as failed" if e.recorded else "not recorded (no room for its row)")
    return f"error: results: {e} ({kept}{flight}; no network left up)"


def _run_config(config: str, overrides: list[str], results: str, force: bool, shard: str | None = None,
                ray: str | None = None, dry_run: bool = False):
    """Validate, check against this machine, run and report a config; returns its plan."""
    from emu.config.experiment import ConfigError
    from emu.config.plan import load_plan
    from emu.run.results import ResultsError
    from emu.testbed import preflight

    try:
        plan = load_plan(config, _sections(), overrides)
        shard_ = _parse_shard(shard)
        if ray is not None:
            from emu.sweeps.raysweep import parse_address, refuse_plugins

            ray = parse_address(ray)
            refuse_plugins(plan)
        remote = ray not in (None, "local")  # the cluster's nodes check and run the networks, not this machine
        if not remote:
            preflight.check(plan)
    except ConfigError as e:
        raise Exit(f"error: {e}", code=2) from None
    if dry_run:
        _dry_run(plan, results, force, shard_)
        return plan
    from emu.run.results import unwritable

    why = unwritable(Path(results) / plan.name)
    if why is not None:
        raise Exit(f"error: results: {why}", code=2)
    need = _space(plan, results, force, shard_)
    if not need.fits:
        raise Exit(f"error: {need.refusal()}", code=2)
    if not remote:
        _need_root("run")
    if ray is not None:
        _ensure_ray()
    from emu.sweeps.sweep import run_plan

    sweep_dir = Path(results) / plan.name
    try:
        try:
            if ray is None:
                rows = run_plan(plan, Path(results), force=force, shard=shard_)
            else:
                from emu.sweeps.raysweep import run_plan_on_ray

                rows = run_plan_on_ray(plan, Path(results), ray, force=force, shard=shard_)
        finally:
            try:
                _add_bounds(sweep_dir)
            except ResultsError:
                if sys.exc_info()[0] is None:   # nothing else went wrong: this is the error
                    raise
    except ConfigError as e:
        raise Exit(f"error: {e}", code=2) from None
    except ResultsError as e:
        raise Exit(_results_error(e, sweep_dir), code=2) from None
    except KeyboardInterrupt:
        raise Exit("interrupted: network torn down, finished runs kept, this run recorded as interrupted"
                   if ray is None else "interrupted: runs left cancelled (their networks torn down), finished runs "
                   "kept; the same command resumes the sweep", code=130) from None
    failed = [r for r in rows if r["status"] != "ok"]
    if failed:
        raise Exit(f"error: {len(failed)} of {len(rows)} run(s) failed; see 'reason' in "
                   f"{Path(results) / plan.name / 'runs.parquet'}", code=1)
    return plan


_RUN_HELP = {
    "config": "experiment or sweep YAML (see docs/tutorial.md: Sweeps)",
    "set": "override a config key, e.g. --set workload.iterations=10 (repeatable)",
    "results": "results root (default: results/)",
    "force": "re-run runs that already completed",
    "shard": "run only shard i of n, e.g. 0/4 (merge the shards' results with `merge`)",
    "ray": "run the runs as Ray tasks: 'local' (a one-node cluster here), or a head node's HOST:PORT "
           "(docs/scaling.md: From one machine to N); Ray is installed the first time",
    "dry-run": "print the points, the run count, how many are done and an estimated wall time; create nothing",
}


@task(iterable=["set"], help=_RUN_HELP)
def run(c, config, set=None, results=str(RESULTS), force=False, shard=None, ray=None,  # noqa: A002 - --set
        dry_run=False):
    """Run every experiment of a config; completed runs are skipped (resume after a crash)."""
    plan = _run_config(config, set or [], results, force, shard, ray, dry_run=dry_run)
    if not dry_run:
        print(f"results: {Path(results) / plan.name / 'runs.parquet'}")


@task(iterable=["set"], help=_RUN_HELP)
def sweep(c, config, set=None, results=str(RESULTS), force=False, shard=None, ray=None,  # noqa: A002
          dry_run=False):
    """Run a sweep file (base config x grid x zip x seeds x repeats); resumable, shardable, on Ray with --ray."""
    run(c, config, set=set, results=results, force=force, shard=shard, ray=ray, dry_run=dry_run)


_TUNE_HELP = {
    "config": "experiment config or sweep file giving the network setting and workload (its iterations)",
    "scheduler": "the scheduler to tune: one whose class declares a search space (bytescheduler: partition_numel, "
                 "credit_numel; p3: slice_numel)",
    "budget": "number of trials, each one run (trials of an earlier call of the same tune count)",
    "set": "override a config key, e.g. --set workload.iterations=10 (repeatable)",
    "results": "results root (default: results/); the tune goes to <results>/<name>/",
    "point": "which network setting of a config with a grid (0-based; required when it has several)",
    "name": "the tune's name and results directory (default: <config name>-tune-<scheduler>[-<point>])",
    "seed": "the sampler's seed (default 0)",
    "sampler": "tpe (default) or gp: optuna's TPE or Gaussian-process sampler",
    "max-minutes": "start no trial that would end past this many minutes of this call",
    "dry-run": "print the setting, the budget, the trials done and an estimated wall time; create nothing",
}


@task(iterable=["set"], help=_TUNE_HELP)
def tune(c, config, scheduler=None, budget=None, set=None, results=str(RESULTS), point=None,  # noqa: A002
         name=None, seed="0", sampler="tpe", max_minutes=None, dry_run=False):
    """Tune a scheduler's tunables on one network setting by Bayesian optimisation (optuna); resumable."""
    from emu.config.experiment import ConfigError
    from emu.sweeps.tune import prepare
    from emu.sweeps.tune import tune as do_tune
    from emu.testbed import preflight

    command = "./inv tune " + " ".join(sys.argv[sys.argv.index("tune") + 1:]) if "tune" in sys.argv else ""
    try:
        spec = prepare(config, scheduler, budget, _sections(), set or [], point=point, name=name, seed=seed,
                       sampler=sampler, max_minutes=max_minutes, results_root=Path(results), command=command)
        preflight.check([spec.base])
        if dry_run:
            from emu.sweeps.dryrun import render_tune

            print(render_tune(spec, Path(results), _iteration_bound))
            return
    except ConfigError as e:
        raise Exit(f"error: {e}", code=2) from None
    _need_root("tune")
    tune_dir = Path(results) / spec.name
    from emu.run.results import ResultsError

    try:
        rec = do_tune(spec, Path(results))
    except ResultsError as e:
        raise Exit(_results_error(e, tune_dir), code=2) from None
    except KeyboardInterrupt:
        raise Exit(f"interrupted: finished trials kept in {tune_dir}; the same command resumes the tune",
                   code=130) from None
    finally:
        _add_bounds(tune_dir)
    best = rec["best"]
    if best is None:
        raise Exit(f"error: no trial completed; see 'reason' in {tune_dir / 'runs.parquet'}", code=1)
    print(f"best of {rec['cost']['trials']} trials: " + ", ".join(f"{k}={v}" for k, v in best["params"].items())
          + f", median iteration {best['objective'] * 1e3:.0f} ms")
    print(f"tuned: {tune_dir / 'tuned.json'} (every trial, cost), {tune_dir / 'tuned.yaml'} (for a sweep)")


@task(iterable=["source"], help={"source": "a sweep's results directory (repeatable)",
                                 "into": "the merged results directory"})
def merge(c, source, into):
    """Merge results of several machines or shards of one sweep (concatenation by run_id)."""
    from emu.run.results import merge as do_merge

    try:
        n = do_merge([Path(s) for s in source], Path(into))
    except FileNotFoundError as e:
        raise Exit(f"error: {e}", code=2) from None
    print(f"{Path(into) / 'runs.parquet'}: {n} runs")


@task(iterable=["run_id"], help={"sweep": "results directory of a sweep, e.g. results/demo",
                                 "run-id": "only these runs (repeatable; default: all)"})
def analyze(c, sweep, run_id=None):
    """Plot iteration time per scheduler and print the runs' summary table, with the runs that
    break physics (analysis/physics.py) named, since the table's verdict includes them."""
    from analysis import physics
    from analysis.plots import iteration_time_plot, summary_table
    from analysis.tables import NoResults, load_runs

    _hand_over_infos()
    try:
        png = iteration_time_plot(Path(sweep), run_ids=run_id or None)
        table = summary_table(Path(sweep), run_ids=run_id or None)
    except NoResults as e:
        raise Exit(f"error: {e}", code=2) from None
    import pandas as pd

    judged = physics.ensure(load_runs(Path(sweep), run_ids=run_id or None), Path(sweep)).set_index("run_id")
    table = table.assign(fidelity_ok=table["run_id"].map(judged["fidelity_ok"]))  # stored rows may predate it
    with pd.option_context("display.width", 200, "display.max_columns", 20, "display.max_colwidth", 60,
                           "display.float_format", "{:.4g}".format):
        print(table.to_string(index=False))
    broken = physics.broken(judged.reset_index())
    if len(broken):
        print(f"{len(broken)} run(s) break physics (the report lists them and leaves them out of its means):")
        for _, r in broken.iterrows():
            print(f"  {r['run_id']} {r['scheduler']}: {r['physics_reasons']}")
    print(f"plot: {png}")


@task(help={"sweep": "results directory of a sweep, e.g. results/mini",
            "baseline": "the scheduler speedups are measured against (default: the one its class declares the "
                        "baseline, fifo)",
            "out": "where to write report.md and its figures (default: <sweep>/report)",
            "style": "screen (default: titles) or paper (no titles, fonts embedded, --width inches wide)",
            "width": "the figures' width in inches (default: 3.5 with --style paper, per panel otherwise)"})
def report(c, sweep, baseline=None, out=None, style="screen", width=None):
    """Write a sweep's report: figures (PNG, PDF), tables (also CSV, LaTeX), summary with 95% CIs, fidelity, claims."""
    from analysis.report import write_report
    from analysis.tables import NoResults

    if style not in ("screen", "paper"):
        raise Exit(f"error: --style {style!r}: screen or paper", code=2)
    _hand_over_infos()
    try:
        path = write_report(Path(sweep), Path(out) if out else None, baseline=baseline, style=style,
                            width=_width(width), commit=_commit())
    except NoResults as e:
        raise Exit(f"error: {e}", code=2) from None
    print(f"report: {path}")


def _width(text) -> float | None:
    if text is None:
        return None
    try:
        width = float(text)
    except ValueError:
        width = 0.0
    if not width > 0:
        raise Exit(f"error: --width {text!r}: a width in inches, e.g. 3.5", code=2)
    return width


def _commit() -> str:
    """The code drawing a figure: git's short SHA, "+dirty" where tracked files changed (a tree
    without git: SCHEDLAB_GIT_SHA, as on a Ray node, else "unknown")."""
    import subprocess

    def git(*args: str) -> str:
        try:
            r = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True)
        except OSError:
            return ""
        return r.stdout.strip() if r.returncode == 0 else ""

    sha = git("rev-parse", "--short", "HEAD") or os.environ.get("SCHEDLAB_GIT_SHA", "")[:7]
    if not sha:
        return "unknown"
    return sha + ("+dirty" if git("status", "--porcelain", "--untracked-files=no") else "")


@task(iterable=["only"], help={"out": "where to write the figures (default: docs/)",
                               "results": "where the long sweeps' results are (default: results/)",
                               "only": "only this figure file or sweep name (repeatable)",
                               "keep": "first copy these sweeps' results (a results root, e.g. /tmp/figsets) into "
                                       "the committed small sets, examples/results/<sweep> (what the figures read)"})
def figures(c, out=str(REPO / "docs"), results=str(RESULTS), only=None, keep=None):
    """Draw every figure of docs/ again: from a long sweep's results where present, else its committed small set."""
    from analysis import figures as figs

    _hand_over_infos()
    if keep:
        for f in figs.FIGURES:
            if (Path(keep) / f.sweep / "runs.parquet").exists() and (not only or f.sweep in only or f.file in only):
                size = figs.keep_set(Path(keep) / f.sweep, REPO / figs.COMMITTED / f.sweep, tables=f.tables)
                print(f"kept {Path(keep) / f.sweep} as {figs.COMMITTED / f.sweep} ({size / 1e3:.0f} kB)")
    outcomes = figs.regenerate(Path(out), REPO, Path(results), commit=_commit(), only=only or None)
    print(figs.table(outcomes))
    if not any(o.path for o in outcomes):
        raise Exit("error: no figure drawn (table above: what is missing)", code=1)


@task(help={"results": "results root (default: results/)", "force": "re-run completed runs"})
def demo(c, results=str(RESULTS), force=False):
    """The demo: 2 workers and a parameter server on a 3-host star, FIFO vs ByteScheduler, then a plot."""
    plan = _run_config(str(REPO / "configs" / "demo.yaml"), [], results, force)
    # Only this config's runs: results/demo may also hold runs of earlier demo versions.
    analyze(c, str(Path(results) / plan.name), run_id=[e.run_id(r) for e in plan.experiments
                                                        for r in range(plan.repeats)])


@task(help={"k": "only tests matching this pytest -k expression", "x": "stop at the first failure",
            "fast": "the fast tier: no Mininet, nothing that needs root, nothing slow (markers: pyproject.toml)"})
def test(c, k=None, x=False, fast=False):
    """Run the test suite (end-to-end Mininet tests need root and are skipped without it); --fast: the fast tier."""
    args = [sys.executable, "-m", "pytest", "-q", "-rs", str(REPO / "tests")]
    if fast:
        args += ["-m", "not mininet and not root and not slow"]
    if k:
        args += ["-k", k]
    if x:
        args.append("-x")
    os.chdir(REPO)
    os.execv(sys.executable, args)


BENCHES = {
    "testbed": (["-m", "bench.bench_testbed"], True),
    "schedulers": (["-m", "bench.bench_schedulers"], True),
    "workloads": (["bench/bench_workloads.py"], False),
    "transport-loopback": (["bench/bench_transport_loopback.py"], False),
    "ring-gloo-loopback": (["bench/bench_ring_vs_gloo.py"], False),
    "dilation": (["-m", "bench.bench_dilation"], True),
    "datapath": (["-m", "bench.bench_datapath"], True),
}


@task(iterable=["only"], help={"only": f"one of {', '.join(BENCHES)} (repeatable; default: all)",
                               "quick": "shorter runs where a benchmark supports it"})
def bench(c, only=None, quick=False):
    """Benchmarks that print figures (not pass/fail): testbed, schedulers on emulated links, workloads."""
    import subprocess

    names = only or list(BENCHES)
    unknown = [n for n in names if n not in BENCHES]
    if unknown:
        raise Exit(f"error: --only {unknown[0]!r}: unknown benchmark (known: {', '.join(BENCHES)})", code=2)
    if any(BENCHES[n][1] for n in names):
        _need_root("bench")
    for name in names:
        args, _ = BENCHES[name]
        extra = ["--quick"] if quick and name in ("testbed", "transport-loopback", "datapath") else []
        print(f"\n# {name}", flush=True)
        rc = subprocess.run([sys.executable, *args, *extra], cwd=REPO,
                            env={**os.environ, "PYTHONPATH": str(REPO)}).returncode
        if rc:
            raise Exit(f"error: benchmark {name} exited with {rc}", code=rc)


@task
def doctor(c):
    """Check every machine requirement (docs/testbed.md: Machine requirements): what is here, what a run changes."""
    from emu.testbed.capabilities import checks, report

    print(report())
    missing = [f"{ch.area} {ch.name}" for ch in checks() if not ch.ok]
    if missing:
        raise Exit(f"doctor: {len(missing)} requirement(s) missing: {'; '.join(missing)} (the line below each says "
                   f"how to fix it)", code=1)
    print("doctor: every requirement is met")


@task(help={"force": "also tear down runs whose orchestrator is still alive (a hung run)"})
def clean(c, force=False):
    """Remove leftover Mininet interfaces and role processes that this harness started."""
    _need_root("clean")
    from emu.testbed.cleanup import clean as do_clean

    removed = do_clean(force=force)
    for line in removed:
        print(f"removed {line}")
    print(f"clean: {len(removed)} leftover(s) removed")


@task(help={"model": "a zoo model (cnn, alexnet, vgg, resnet, bert, lstm) or 'all'",
            "preset": "tiny | small | paper (default: small)",
            "batch-size": "samples per step (default 32); replay runs must use the same",
            "iterations": "measured iterations (default: 3 for paper, 20 otherwise)",
            "threads": "torch threads (default 1)"})
def profile(c, model, preset="small", batch_size=32, iterations=None, threads=1):
    """Measure a model's per-layer forward/backward times into profiles/<model>-<preset>.json (for replay)."""
    import subprocess

    from workloads.config import MODELS

    models = [m for m, (_, presets) in MODELS.items() if preset in presets] if model == "all" else [model]
    for m in models:  # one process per model: never two paper-scale models in memory at once
        args = [sys.executable, "-m", "workloads.profile", m, preset, "--batch-size", str(batch_size),
                "--threads", str(threads)] + (["--iterations", str(iterations)] if iterations else [])
        rc = subprocess.run(args, cwd=REPO).returncode
        if rc:
            raise Exit(code=rc)


@task(help={"run-dir": "a run's directory, RESULTS/SWEEP/RUN_ID (e.g. results/demo/<run_id>)",
            "out": "where to write the trace (default: <run_dir>/trace.json)"})
def trace(c, run_dir, out=None):
    """Write a traced run's timeline as Trace Event Format JSON (open it in Perfetto or chrome://tracing):
    per worker its iterations, compute, per-layer waits and per-tensor pushes; per link its utilisation
    and queue; faults and forest plans (analysis/trace.py)."""
    from analysis.tables import NoResults
    from analysis.trace import build_trace, counts, span_us, write_trace

    try:
        built = build_trace(Path(run_dir))
    except NoResults as e:
        raise Exit(f"error: {e}", code=2) from None
    path = write_trace(built, Path(out) if out else Path(run_dir) / "trace.json")
    first, last = span_us(built)
    print(f"trace: {path} ({len(built['traceEvents'])} events, {path.stat().st_size} bytes, "
          f"{(last - first) / 1e6:.3f} s from {first / 1e6:.3f} s)")
    for kind, by_cat in counts(built).items():
        print(f"  {kind}: " + (", ".join(f"{cat} {n}" for cat, n in by_cat.items()) or "none"))


CONFIG_REFERENCE = REPO / "docs" / "config-reference.md"


def _config_reference(installed: bool = False):
    """The config reference (emu/config/reference.py) of the experiment, the workload and the registry's
    schedulers: the built-in ones (what docs/config-reference.md holds, the same on every machine), or
    with `installed` those of installed packages' entry points too."""
    from emu.config import reference
    from emu.config.experiment import Experiment
    from schedulers.registry import PLUGIN_SPECS, params_models
    from workloads.config import WorkloadConfig

    schedulers = _sections().schedulers if installed else {
        n: m for n, m in params_models().items() if n not in PLUGIN_SPECS}
    return reference.collect(Experiment, workload=WorkloadConfig, schedulers=schedulers)


def _config_reference_markdown() -> str:
    from emu.config.reference import render_markdown

    return render_markdown(_config_reference(), command="./inv explain --write")


def _may_be_left_out():
    """invoke's Task for `explain`, whose positional KEY may be left out (invoke requires every
    positional argument): the argument reads as unset, so the parser hands it the next word,
    except to the parser's check that every positional argument got one."""
    from invoke import Argument, Task

    class LeftOut(Argument):
        @property
        def value(self):
            if self._value is None and self.default is None:
                frame = sys._getframe(1)
                for _ in range(6):
                    if frame is None:
                        break
                    if frame.f_code.co_name == "complete_context":
                        return ""
                    frame = frame.f_back
            return self._value if self._value is not None else self.default

        @value.setter
        def value(self, arg):
            self.set_value(arg, cast=True)

    class OptionalPositional(Task):
        def get_arguments(self, ignore_unknown_help=None):
            return [LeftOut(names=a.names, kind=a.kind, default=a.default, help=a.help, positional=True,
                            attr_name=a.attr_name) if a.positional else a
                    for a in super().get_arguments(ignore_unknown_help)]

    return OptionalPositional


@task(klass=_may_be_left_out(), positional=["key"],
      help={"key": "a dotted key (fidelity.window_s, topology.hosts.0.name) or a section (topology); "
                   "left out: the top-level keys",
            "write": f"write {CONFIG_REFERENCE.relative_to(REPO)} from the models"})
def explain(c, key=None, write=False):
    """What a config key means: its type, default, unit, range, meaning and an example (the models' own
    descriptions; docs/config-reference.md lists every key)."""
    from emu.config.experiment import ConfigError
    from emu.config.reference import SWEEP, UnknownKey, find, render_key

    if write:
        text = _config_reference_markdown()
        CONFIG_REFERENCE.write_text(text)
        print(f"wrote {CONFIG_REFERENCE.relative_to(REPO)} ({len(_config_reference().keys())} keys)")
        if not key:
            return
    try:
        ref = _config_reference(installed=True)
    except ConfigError as e:
        raise Exit(f"error: {e}", code=2) from None
    if not key:
        tops = ref.top_level()
        width = max(len(k.path) for k in tops) + 2
        print("config keys (./inv explain KEY: one key, or a section's keys; all: docs/config-reference.md):")
        for k in tops:
            if k.when != SWEEP:
                print(f"  {k.path:<{width}}{k.meaning}")
        print("sweep and plan files (emu/config/plan.py):")
        for k in tops:
            if k.when == SWEEP:
                print(f"  {k.path:<{width}}{k.meaning}")
        return
    try:
        keys = find(ref, key)
    except UnknownKey as e:
        raise Exit(f"error: {e}", code=2) from None
    print("\n\n".join(render_key(k) for k in keys))


@task(help={"port": "the port JupyterLab listens on, on 127.0.0.1 only (default 8888)"})
def notebook(c, port=8888):
    """JupyterLab on notebooks/ (127.0.0.1 only). JupyterLab is an optional group (pyproject.toml:
    jupyter): the first run installs its lock, requirements-jupyter.txt, into this environment
    (scripts/setup.sh jupyter, one line on stderr)."""
    import importlib.util
    import secrets
    import subprocess

    if importlib.util.find_spec("jupyterlab") is None:
        rc = subprocess.run([str(REPO / "scripts" / "setup.sh"), "jupyter"],
                            env={**os.environ, "SCHEDLAB_VENV": sys.prefix}).returncode
        importlib.invalidate_caches()
        if rc or importlib.util.find_spec("jupyterlab") is None:
            raise Exit(f"error: notebook: installing JupyterLab (requirements-jupyter.txt) into {sys.prefix} "
                       "failed (output above)", code=1)
    token = secrets.token_hex(16)
    print(f"JupyterLab on http://127.0.0.1:{int(port)}/lab?token={token} (Ctrl-C twice stops it)", flush=True)
    jupyter = Path(sys.prefix) / "bin" / "jupyter"
    os.chdir(REPO)
    # Nothing leaves the machine: no extension manager on PyPI, no update check, no news feed.
    quiet = ["--LabApp.extension_manager=readonly", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
             "--LabApp.news_url=None"]
    os.execv(jupyter, [str(jupyter), "lab", "--no-browser", "--ip", "127.0.0.1", "--port", str(int(port)),
                       "--port-retries", "0", f"--IdentityProvider.token={token}", *quiet,
                       *(["--allow-root"] if os.geteuid() == 0 else []), "notebooks/"])


@task(name="fresh-os", help={"full": "run the README's test command (./inv test) instead of the fast tier",
                             "keep": "keep the unpacked root file system (its path is printed)",
                             "rebuild": "build the root file system again instead of using the cached one"})
def fresh_os(c, full=False, keep=False, rebuild=False):
    """Run the README's commands (./inv demo, then ./inv test --fast) on a fresh Debian 12 in a directory."""
    _need_root("fresh-os")
    from emu.testbed.freshos import FreshOSError
    from emu.testbed.freshos import run as run_fresh_os

    try:
        done = run_fresh_os(full=full, keep=keep, rebuild=rebuild)
    except FreshOSError as e:
        raise Exit(f"error: fresh-os: {e}", code=1) from None
    except KeyboardInterrupt:
        raise Exit("interrupted: fresh-os: the step's networks torn down, its root file system removed", code=130
                   ) from None
    print("fresh-os wall times: " + ", ".join(f"{s.name} {s.wall_s:.1f} s" + (
        f" (set-up {s.setup_s:.1f} s)" if s.setup_s is not None else "") for s in done))
    failed = [s.name for s in done if not s.ok]
    if failed:
        raise Exit(f"error: fresh-os: {', '.join(failed)} failed (output above)", code=1)


@task(name="check-scheduler",
      help={"name": "the scheduler's name (./inv check-scheduler fifo)",
            "plugin": "a Python file defining it (a plugin, as a config's plugins: names one)",
            "loopback_only": "skip the run on the demo network (which needs root)",
            "results": "results root for the demo run (default: a temporary directory, removed after)"})
def check_scheduler(c, name, plugin=None, loopback_only=False, results=None):
    """Is a scheduler correct? Averages against a reference at 1-8 workers, a dead peer named,
    nothing left by close(), then one run on the demo network (docs/writing-a-scheduler.md)."""
    from conformance.command import BadInput, main
    from emu.config.experiment import ConfigError

    try:
        code = main(name, _sections, plugin=plugin, loopback_only=loopback_only, results=results)
    except (BadInput, ConfigError) as e:
        raise Exit(f"error: {e}", code=2) from None
    if code:
        raise Exit(code=code)
