"""One place per scheduler: what the harness knows about a scheduler is declared on its class
(contracts/scheduler_info.py, `registry.infos()`), and emu/ and analysis/ read it from there or
from what each run recorded, never from names of their own. Checked here: no scheduler's name
is a string constant in emu/ or analysis/ outside the modules its report sections name; every
scheduler declares all of it; the bound dispatch covers every model; the tuning spaces are the
classes'; runs record it and old rows get it; and a report's figures colour every scheduler apart
and alike."""
from __future__ import annotations

import ast
import colorsys
import json
import shutil
from pathlib import Path

import matplotlib.colors
import matplotlib.container
import numpy as np
import pandas as pd
import pytest
import yaml

from analysis import bounds, catalog, claims, forest_compare, forest_trees, plots, startup
from analysis.report import write_report
from analysis.tables import load_runs
from contracts.scheduler_info import BOUND_MODELS, COLUMN, SchedulerInfo
from emu.config.experiment import Sections, validate_experiment
from emu.sweeps import tune
from schedulers.registry import SCHEDULERS, infos
from tasks import _sections
from tests.conftest import REPO
from tests.factories import no_network

MINI = REPO / "tests" / "data" / "results" / "mini"
SECTION_MODULES = {forest_compare.SECTION: "analysis/forest_compare.py", startup.SECTION: "analysis/startup.py",
                   forest_trees.SECTION: "analysis/forest_trees.py"}
SECTIONS = {*SECTION_MODULES, plots.REPLAN}  # every report section analysis draws for particular schedulers


# ---------------------------------------------------------------------------- no names of their own
def _allowed(name: str) -> set[str]:
    """The modules that may name a scheduler: those of the report sections it declares."""
    return {SECTION_MODULES[s] for s in infos()[name].report_sections if s in SECTION_MODULES}


def test_no_scheduler_name_is_a_string_constant_in_emu_or_analysis_outside_its_own_modules():
    names = set(SCHEDULERS)
    found = []
    for path in sorted([*REPO.glob("emu/**/*.py"), *REPO.glob("analysis/**/*.py")]):
        rel = path.relative_to(REPO).as_posix()
        for node in ast.walk(ast.parse(path.read_text(), rel)):
            if isinstance(node, ast.Constant) and node.value in names and rel not in _allowed(node.value):
                found.append(f"{rel}:{node.lineno}: {node.value!r}")
    assert not found, "scheduler names outside their modules (declare on the class, read registry.infos()):\n" + \
        "\n".join(found)


def test_the_walk_would_see_a_name():
    tree = ast.parse('SCHEDULERS = {"fifo": 1}\nx = f"{y} fifo"')
    assert [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and n.value in SCHEDULERS] == ["fifo"]


# ---------------------------------------------------------------------------- complete declarations
@pytest.mark.parametrize("name", list(SCHEDULERS))
def test_every_scheduler_declares_complete_metadata(name):
    cls = SCHEDULERS[name]
    info = cls.describe()  # AttributeError where a class leaves out what has no default
    assert info == infos()[name] and info.name == name
    assert SchedulerInfo.model_validate_json(info.model_dump_json()) == info  # what a run records reads back
    assert info.requires_servers == cls.Params.requires_servers
    assert (info.family == "parameter_server") == info.requires_servers == hasattr(cls, "server_mode")
    assert info.bound_model in BOUND_MODELS
    assert set(info.report_sections) <= SECTIONS, info.report_sections
    assert set(info.claims) <= {c.id for c in claims.CLAIMS}, info.claims
    assert "display_order" in vars(cls), "its own place, not one inherited"


def test_orders_and_display_names_are_unique_and_one_scheduler_is_the_baseline():
    all_ = list(infos().values())
    assert len({i.display_order for i in all_}) == len({i.display_name for i in all_}) == len(all_)
    assert [i.name for i in all_ if i.baseline] == ["fifo"]
    assert [i.name for i in sorted(all_, key=lambda i: i.display_order)][:7] == \
        ["fifo", "bytescheduler", "p3", "mercury", "ring", "gloo", "forest"]  # the figures' order so far


def test_every_claim_has_a_claimed_scheduler_and_a_baseline():
    for claim in claims.CLAIMS:
        assert claim.schedulers and claim.baselines, claim.id
    forest = next(c for c in claims.CLAIMS if c.id == "forest-heterogeneous")
    assert forest.schedulers == ["forest"] and forest.baselines == ["fifo", "bytescheduler", "p3", "ring", "gloo"]


# ---------------------------------------------------------------------------- bounds by model
def _star(n: int, mbps: float = 100.0):
    import networkx as nx

    g = nx.DiGraph()
    g.add_node("s", kind="switch")
    for i in range(n):
        g.add_node(f"h{i}", kind="host")
        g.add_edge(f"h{i}", "s", capacity=mbps * 1e6)
        g.add_edge("s", f"h{i}", capacity=mbps * 1e6)
    return g


def test_the_bound_dispatch_covers_every_declared_model():
    assert set(bounds.MODELS) == set(BOUND_MODELS) and bounds.CUT in bounds.MODELS
    assert {i.bound_model for i in infos().values()} <= set(bounds.MODELS)
    g, workers, servers, grad = _star(4), ["h1", "h2", "h3"], ["h0"], 4e6
    for model in BOUND_MODELS:
        assert bounds.bound_model(model, workers, servers) == model
        assert np.isfinite(bounds.model_bound_s(model, g, workers, servers, grad)) and \
            bounds.model_bound_s(model, g, workers, servers, grad) > 0
    # where a model does not apply, and for a scheduler that declares none: the cut bound
    assert bounds.bound_model("parameter_server", workers, []) == bounds.CUT
    assert bounds.bound_model("tree_packing", [f"h{i}" for i in range(bounds.MAX_LP_HOSTS + 1)], []) == bounds.CUT
    assert bounds.bound_model(None, workers, servers) == bounds.bound_model("unknown", workers, servers) == bounds.CUT


def test_a_run_is_judged_by_the_model_it_recorded_without_its_scheduler_in_the_registry(monkeypatch):
    """A scheduler analysis has never heard of, whose row records its description."""
    monkeypatch.setattr(catalog, "_RECORDED", {})
    catalog.install({})
    mine = SchedulerInfo(name="newring", family="collective", requires_servers=False, bound_model="ring_allreduce",
                         display_name="newring", display_order=20)
    row = pd.Series({"scheduler": "newring", COLUMN: mine.model_dump_json()})
    assert catalog.of_run(row) == mine
    assert bounds.bound_model(catalog.of_run(row).bound_model, ["h1", "h2"], []) == "ring_allreduce"
    assert catalog.of_run(pd.Series({"scheduler": "fifo"})) is None  # nothing handed over, nothing recorded


# ---------------------------------------------------------------------------- tuning spaces
def test_the_tuning_spaces_are_the_classes():
    sections = _sections()
    assert not hasattr(tune, "SPACES") and not hasattr(tune, "TUNED")
    assert tune.tunable(sections) == [n for n, cls in SCHEDULERS.items() if cls.tuning] == ["bytescheduler", "p3"]
    for name in tune.tunable(sections):
        space = SCHEDULERS[name].tuning
        assert sections.infos[name].tuning == space
        assert set(tune.tunables(space)) <= set(SCHEDULERS[name].Params.model_fields)
        mid = {d.name: (int(np.sqrt(d.low * d.high)) if d.integer else float(np.sqrt(d.low * d.high))) for d in space}
        assert tune.to_coords(space, tune.to_params(space, mid)) is not None


def test_a_tune_searches_its_schedulers_space(tmp_path):
    cfg = yaml.safe_load((MINI / "05868d9c075f" / "config.yaml").read_text())
    cfg.update(scheduler="p3", schedulers={})
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    spec = tune.prepare(path, "p3", 3, _sections(), name="t")
    assert spec.dims == SCHEDULERS["p3"].tuning


# ---------------------------------------------------------------------------- recorded with the run
def test_an_experiment_carries_its_schedulers_info_outside_its_run_id():
    raw = yaml.safe_load((MINI / "05868d9c075f" / "config.yaml").read_text())
    with_info = validate_experiment(raw, _sections())
    without = validate_experiment(raw, Sections(workload=_sections().workload, schedulers=_sections().schedulers))
    assert with_info.scheduler_info == infos()[raw["scheduler"]] and without.scheduler_info is None
    assert with_info.run_id(0) == without.run_id(0) and with_info.resolved() == without.resolved()


def test_the_runner_records_the_info_in_the_row_and_meta_json(tmp_path, monkeypatch):
    """Up to the network (a stand-in that fails to come up): the row starts with the info, so
    even a failed run's row has it."""
    from emu.run import runner

    no_network(monkeypatch, runner)
    exp = validate_experiment(yaml.safe_load((MINI / "05868d9c075f" / "config.yaml").read_text()), _sections())
    row = runner.run_one(exp, 0, tmp_path, state=None)
    assert row["status"] == "failed" and "no network" in row["reason"]
    assert SchedulerInfo.model_validate_json(row[COLUMN]) == infos()[exp.scheduler]
    stored = pd.read_parquet(tmp_path / exp.name / "runs.parquet").iloc[0]
    assert SchedulerInfo.model_validate_json(stored[COLUMN]) == infos()[exp.scheduler]
    meta = json.loads((tmp_path / exp.name / exp.run_id(0) / "meta.json").read_text())
    assert SchedulerInfo.model_validate(meta[COLUMN]) == infos()[exp.scheduler]
    assert COLUMN not in (tmp_path / exp.name / exp.run_id(0) / "config.yaml").read_text()


def test_old_rows_get_the_handed_over_description_and_read_as_before():
    runs = load_runs(MINI)  # committed before runs recorded theirs
    assert COLUMN not in pd.read_parquet(MINI / "runs.parquet")
    for _, run in runs.iterrows():
        assert SchedulerInfo.model_validate_json(run[COLUMN]) == infos()[run["scheduler_name"]]


# ---------------------------------------------------------------------------- colours
SCHEDS = ["fifo", "bytescheduler", "p3", "mercury", "ring", "gloo", "forest", "hierarchical"]


def _rgb(handle) -> tuple[float, ...]:
    """The colour a legend entry shows: an error bar's line, a line, or a scatter's face."""
    if isinstance(handle, matplotlib.container.ErrorbarContainer):
        handle = handle.lines[0]
    colour = handle.get_color() if hasattr(handle, "get_color") and not hasattr(handle, "get_facecolor") \
        else handle.get_facecolor()[0]
    return tuple(round(float(x), 4) for x in matplotlib.colors.to_rgb(colour))


def _sweep(root: Path) -> Path:
    """A made-up sweep with every scheduler and a labelled ring, two bandwidths, one run each,
    laid out as `./inv sweep` does (config.yaml, iterations.parquet, the mini run's roles and links)."""
    sweep, donor = root / "all", MINI / "05868d9c075f"
    spec, donor_row = yaml.safe_load((donor / "config.yaml").read_text()), load_runs(MINI).iloc[0]
    rows = []
    for bw in (10.0, 50.0):
        for k, (sched, label) in enumerate([(s, None) for s in SCHEDS] + [("ring", "topology")]):
            rid = f"{sched}{'-' + label if label else ''}-{bw:g}"
            d = sweep / rid
            shutil.copytree(donor / "roles", d / "roles")
            shutil.copy(donor / "links.parquet", d / "links.parquet")
            t = 2.0 * (1 + 0.1 * k) * 10 / bw
            pd.DataFrame([{"run_id": rid, "rank": r, "iteration": i, "start": i * t, "end": (i + 1) * t,
                           "compute_s": 0.02, "wait_s": t - 0.02} for i in range(12) for r in range(2)]
                         ).to_parquet(d / "iterations.parquet")
            cfg = {**spec, "name": "all", "scheduler": sched, "schedulers": {sched: {}}, "label": label,
                   "topology": {**spec["topology"], "bw_mbps": bw}}
            (d / "config.yaml").write_text(yaml.safe_dump(cfg))
            rows.append({"run_id": rid, "sweep": "all", "scheduler": sched, "repeat": 0, "seed": 0, "status": "ok",
                         "label": label, "point.topology.bw_mbps": bw, "iter_time_median_s": t,
                         "wait_median_s": t - 0.02, "compute_median_s": 0.02, "fidelity_ok": True,
                         "fidelity_reasons": "", "reason": "", "shaping": "[]"})
    runs = pd.DataFrame(rows)
    for col in ("roles.workers", "roles.servers", "workload.model", "workload.preset", "workload.warmup",
                "workload.iterations", "workload.batch_size", "num_params", "num_tensors", "topology.kind",
                "topology.hosts", "compute_mode"):
        runs[col] = donor_row[col]
    runs.to_parquet(sweep / "runs.parquet")
    return sweep


def test_every_scheduler_has_its_own_colour_and_a_variant_a_shade_of_its_schedulers():
    names = [*SCHEDS, "ring (topology)", "bytescheduler credit 64k", "bytescheduler credit 256k"]
    colours = {n: plots._colour(n, names) for n in names}
    assert len(set(colours.values())) == len(names)
    for name in SCHEDS:  # by its declared order, whoever it is drawn with
        assert colours[name] == plots.PALETTE[infos()[name].display_order] == plots._colour(name)
    for variant, base in (("ring (topology)", "ring"), ("bytescheduler credit 64k", "bytescheduler")):
        hue = colorsys.rgb_to_hls(*colours[variant])[0]
        assert hue == pytest.approx(colorsys.rgb_to_hls(*colours[base])[0], abs=1e-6)
    assert plots.scheduler_order(reversed(names)) == ["fifo", "bytescheduler", "bytescheduler credit 64k",
                                                     "bytescheduler credit 256k", "p3", "mercury", "ring",
                                                     "ring (topology)", "gloo", "forest", "hierarchical"]


@pytest.mark.slow
def test_a_reports_figures_colour_every_scheduler_apart_and_the_same_in_each(tmp_path, monkeypatch):
    drawn: dict[str, dict[str, tuple]] = {}
    save = plots._save

    def spy(fig, out, formats, *args, **kw):  # every scheduler's colour in the figure's legends
        seen: dict[str, set] = {}
        for ax in fig.axes:
            for handle, label in zip(*ax.get_legend_handles_labels()):
                if label in names:
                    seen.setdefault(label, set()).add(_rgb(handle))
        assert all(len(c) == 1 for c in seen.values()), (out, seen)  # one colour per scheduler in a figure
        drawn[Path(out).stem] = {k: c.pop() for k, c in seen.items()}
        return save(fig, out, formats, *args, **kw)

    sweep = _sweep(tmp_path)
    names = set(load_runs(sweep)["scheduler"])
    assert {"hierarchical", "ring", "ring (topology)"} <= names and len(names) == len(SCHEDS) + 1
    monkeypatch.setattr(plots, "_save", spy)
    write_report(sweep, tmp_path / "report")
    figures = {k: v for k, v in drawn.items() if len(v) > 1}
    assert {"iteration_time", "speedup", "efficiency"} <= set(figures), drawn.keys()
    assert set(figures["iteration_time"]) == names  # every scheduler and the variant drawn
    for stem, colours in figures.items():
        assert len(set(colours.values())) == len(colours), (stem, colours)  # each its own colour
    every = {}
    for colours in figures.values():
        for name, colour in colours.items():
            assert every.setdefault(name, colour) == colour, name  # the same in every figure
    assert every["ring"] == tuple(round(float(x), 4) for x in plots._colour("ring"))  # the scheduler's own
    assert len({every["ring"], every["ring (topology)"], every["hierarchical"]}) == 3
