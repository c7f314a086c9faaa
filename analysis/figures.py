"""The figures of docs/, as data (examples/results/figures.yaml): which sweep, which plot
function and which committed result set makes each, so that `./inv figures` can draw every
one of them again.

Each figure is drawn from the long sweep's results where they are present
(`results/<sweep>/runs.parquet`), else from the small result set committed for it
(`examples/results/<sweep>/`, made by the short run its `how` names), and its metadata and
caption say which (plots.figure_context `source`). The commit that draws them is the caller's
to hand down (tasks.py): analysis reads stored files only.

`keep_set` copies a sweep's results into a committed set with only what the figures read:
runs.parquet (whose rows hold the bounds computed after the sweep) and, per run, config.yaml,
meta.json, iterations.parquet, scheduler_info.json and faults.parquet. The link samples, role
specs, logs, the per-layer, queue and CPU tables and the forest's per-tree record (scheduler_info's
`trees`: 1.3 MB in a 160-iteration run) are left out: no figure of docs/ reads them (the report
of such a set leaves the physics check's byte count unjudged). The demo's set (`tables: all` in
figures.yaml) keeps the per-layer, link and CPU tables, the role specs and the per-tree record
too: the notebook reads it.
"""
from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml

from analysis import forest_compare, physics, plots
from analysis.speedup import load_comparison
from analysis.tables import NoResults
from contracts.forest_trees import KEY as TREES

COMMITTED = Path("examples") / "results"  # relative to the repository: the committed small sets
LONG = Path("results")                      # where the long sweeps write theirs


def _forest_plot(sweep_dir: Path, out: Path, formats: tuple[str, ...]) -> Path:
    """The report's forest figure (analysis/report.py _forest): predicted against measured ratios."""
    runs, _ = load_comparison(sweep_dir)
    runs = physics.ensure(runs, sweep_dir)
    runs = runs[~runs["run_id"].isin(physics.broken(runs)["run_id"])]
    table = forest_compare.compare(runs, sweep_dir)
    return plots.predicted_measured_plot(table, out=out, formats=formats, sweep_dir=sweep_dir, run_ids=runs["run_id"])


PLOTS: dict[str, Callable[..., Path]] = {
    "iteration_time_plot": plots.iteration_time_plot,
    "speedup_plot": plots.speedup_plot,
    "iteration_time_sweep_plot": plots.iteration_time_sweep_plot,
    "startup_plot": plots.startup_plot,
    "faults_plot": plots.faults_plot,
    "replan_plot": plots.replan_plot,
    "predicted_measured_plot": _forest_plot,
}


@dataclass(frozen=True)
class Figure:
    file: str     # in docs/
    sweep: str    # the sweep's name: results/<sweep>, examples/results/<sweep>
    plot: str     # a key of PLOTS
    how: str      # the short run that made the committed set (root: `./inv` builds networks)
    tables: str = "figures"  # what its committed set keeps: "figures" (KEEP) or "all" (TABLES_ALL: the notebook's)


MAPPING = COMMITTED / "figures.yaml"  # the mapping, as data


def load_figures(path: Path | None = None) -> list[Figure]:
    """The figures of docs/ and what draws each (examples/results/figures.yaml)."""
    path = Path(path) if path is not None else Path(__file__).resolve().parents[1] / MAPPING
    return [Figure(**entry) for entry in yaml.safe_load(path.read_text())]


FIGURES = load_figures()


@dataclass
class Outcome:
    figure: Figure
    source: str            # what it was drawn from, as its metadata says; "" where it was not drawn
    missing: str           # what was not there (the long sweep's results, the committed set)
    path: Path | None = None


def choose(fig: Figure, repo: Path, results: Path | None = None) -> tuple[Path | None, str, str]:
    """(the results directory to draw from, how to name it, what is missing) for one figure."""
    long_dir = (results or repo / LONG) / fig.sweep
    small = repo / COMMITTED / fig.sweep
    if (long_dir / "runs.parquet").exists():
        return long_dir, f"{_rel(long_dir, repo)} (long sweep)", "–"
    missing = f"{_rel(long_dir / 'runs.parquet', repo)} (the long sweep)"
    if (small / "runs.parquet").exists():
        return small, f"{_rel(small, repo)} (committed small set)", missing
    return None, "", f"{missing}; {_rel(small, repo)} (the committed set)"


def regenerate(out_dir: Path, repo: Path, results: Path | None = None, commit: str | None = None,
               only: list[str] | None = None, formats: tuple[str, ...] = ("png",), style: str = "screen",
               width: float | None = None) -> list[Outcome]:
    """Draw every figure of FIGURES (or those named in `only`) into `out_dir`."""
    done = []
    for fig in FIGURES:
        if only and fig.file not in only and fig.sweep not in only:
            continue
        sweep_dir, source, missing = choose(fig, Path(repo), results)
        if sweep_dir is None:
            done.append(Outcome(fig, "", missing))
            continue
        try:
            long = source if "committed" not in source else source[:-1] + f": {fig.how})"
            with plots.figure_context(commit=commit, source=long, style=style, width=width):
                path = PLOTS[fig.plot](sweep_dir, out=Path(out_dir) / fig.file, formats=formats)
        except NoResults as e:  # plots.Skipped included
            done.append(Outcome(fig, "", f"{missing}; not drawn from {source}: {e}"))
            continue
        done.append(Outcome(fig, source, missing, path))
    return done


def table(outcomes: list[Outcome]) -> str:
    """figure | source used | missing, as text for a terminal."""
    rows = [("figure", "source used", "missing")] + [
        (o.figure.file, o.source or "not drawn", o.missing) for o in outcomes]
    widths = [max(len(r[i]) for r in rows) for i in range(2)]
    return "\n".join(f"{r[0]:<{widths[0]}}  {r[1]:<{widths[1]}}  {r[2]}" for r in rows)


INFO = "scheduler_info.json"
KEEP = ("config.yaml", "meta.json", "iterations.parquet", INFO, "faults.parquet")


# A set the notebook reads (notebooks/results_with_pandas.ipynb) keeps a run's tables too: the
# per-layer waits, the link samples, the CPU samples, the role specs (the capacity graph); not the
# queue samples (a few hundred KB a run, which the notebook does not read).
TABLES_ALL = KEEP + ("layers.parquet", "links.parquet", "cpu.parquet", "roles")


def keep_set(src: Path, dst: Path, tables: str = "figures") -> int:
    """Copy a sweep's results (`src`) into `dst` with only what the figures read (see the
    module's docstring), or with `tables="all"` every table of a run (not its logs), replacing
    what `dst` held; returns the bytes written."""
    src, dst = Path(src), Path(dst)
    if not (src / "runs.parquet").exists():
        raise NoResults(f"{src}: no runs.parquet")
    if dst.exists():
        shutil.rmtree(dst)
    dst.mkdir(parents=True)
    shutil.copy2(src / "runs.parquet", dst / "runs.parquet")
    for run_dir in sorted(p for p in src.iterdir() if p.is_dir() and (p / "config.yaml").exists()):
        out = dst / run_dir.name
        out.mkdir()
        for name in TABLES_ALL if tables == "all" else KEEP:
            if (run_dir / name).is_dir():
                shutil.copytree(run_dir / name, out / name)
            elif name == INFO and tables != "all" and (run_dir / name).exists():
                info = json.loads((run_dir / name).read_text())
                if isinstance(info, dict):
                    info.pop(TREES, None)
                (out / name).write_text(json.dumps(info))
            elif (run_dir / name).exists():
                shutil.copy2(run_dir / name, out / name)
    return sum(p.stat().st_size for p in dst.rglob("*") if p.is_file())


def _rel(path: Path, repo: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(Path(repo).resolve()))
    except ValueError:
        return str(path)
