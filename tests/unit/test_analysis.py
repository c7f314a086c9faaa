"""Analysis: speedup intervals on synthetic data whose answer is known, configurations,
claims and fidelity summaries, every figure and the report on the committed mini result
set (tests/data/results/mini, read-only here), and the notebook executed end to end."""
from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from analysis import claims, fidelity, plots
from analysis.report import FIGURES, write_report
from analysis.speedup import interval, iteration_times, load_speedups, speedups
from analysis.tables import add_configurations, load_iterations, load_runs
from contracts.iterations import NoMeasuredIteration
from tests.conftest import REPO, invoke
from tests.factories import MINI, is_png


# --------------------------------------------------------------------------- synthetic data
def synthetic(true: dict[tuple[float, str], float], repeats: int, iterations: int = 30, workers: int = 2,
              noise: float = 0.05, run_noise: float = 0.0, seed: int = 0) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Runs and iterations of a made-up sweep. `true[(bw, scheduler)]` is the scheduler's
    typical iteration time (s) at bandwidth `bw`; each run scales it by a lognormal run
    effect (`run_noise`) and each iteration by lognormal noise (`noise`)."""
    rng = np.random.default_rng(seed)
    runs, iters = [], []
    for (bw, sched), t in true.items():
        for rep in range(repeats):
            rid = f"{sched}-{bw:g}-{rep}"
            runs.append({"run_id": rid, "sweep": "synthetic", "scheduler": sched, "repeat": rep,
                         "seed": 100 + rep, "status": "ok", "point.scheduler": sched, "point.bw_mbps": bw,
                         "point.seed": 100 + rep})
            level = t * rng.lognormal(0, run_noise) if run_noise else t
            clock = 0.0
            for it in range(iterations):
                d = level * rng.lognormal(0, noise)
                for rank in range(workers):
                    iters.append({"run_id": rid, "rank": rank, "iteration": it, "start": clock,
                                  "end": clock + d * (1 + 0.001 * rank)})
                clock += d
    return pd.DataFrame(runs), pd.DataFrame(iters)


def test_speedup_recovers_a_known_ratio_per_configuration():
    runs, iters = synthetic({(10, "fifo"): 1.0, (10, "mercury"): 0.5, (50, "fifo"): 0.4, (50, "mercury"): 0.4},
                            repeats=2)
    table = speedups(runs, iters).set_index("point.bw_mbps")
    assert list(table["scheduler"]) == ["mercury", "mercury"]  # no row for the baseline itself
    slow, fast = table.loc[10], table.loc[50]
    # 2x at 10 Mb/s: the interval holds 2 and is far from 1
    assert slow["ci_low"] <= 2.0 <= slow["ci_high"] and slow["ci_low"] > 1.8 and slow["ci_high"] < 2.2
    assert slow["speedup"] == pytest.approx(2.0, rel=0.05)
    # no difference at 50 Mb/s: a tight interval around 1 (whether it holds 1 exactly is a
    # 95% matter, tested for coverage below)
    assert 0.95 < fast["ci_low"] < fast["speedup"] < fast["ci_high"] < 1.05
    # 2 repeats < 3: the observations are iterations (30 per run, workers averaged)
    assert set(table["unit"]) == {"iterations"} and set(table["n"]) == {60} and set(table["n_baseline"]) == {60}


def test_speedup_uses_runs_as_observations_from_three_repeats():
    """With a run-to-run effect much larger than the noise within a run, only an interval
    over runs is honest: it must be wider than the one over pooled iterations and still
    hold the true ratio."""
    true = {(10, "fifo"): 1.0, (10, "p3"): 0.8}
    runs, iters = synthetic(true, repeats=5, noise=0.01, run_noise=0.08, seed=3)
    by_runs = speedups(runs, iters).iloc[0]
    assert by_runs["unit"] == "repeats" and by_runs["n"] == 5 and by_runs["runs"] == 5
    assert by_runs["ci_low"] <= 1.25 <= by_runs["ci_high"]
    timed = iters.assign(t=iters["end"] - iters["start"]).merge(runs[["run_id", "scheduler"]])
    it_obs = [timed[timed["scheduler"] == s].groupby(["run_id", "iteration"])["t"].mean().to_numpy()
              for s in ("fifo", "p3")]
    _, lo, hi = interval(tuple(it_obs), "iterations", n_resamples=2000)
    assert by_runs["ci_high"] - by_runs["ci_low"] > 2 * (hi - lo)


@pytest.mark.parametrize("unit,n", [("repeats", 3), ("iterations", 20)])
def test_intervals_cover_the_true_ratio_about_95_percent_of_the_time(unit, n):
    true, hits, sims = 1.5, 0, 150
    for i in range(sims):
        rng = np.random.default_rng(1000 + i)
        base, other = rng.lognormal(0, 0.1, n), rng.lognormal(np.log(1 / true), 0.1, n)
        _, lo, hi = interval((base, other), unit, n_resamples=1000, seed=i)
        hits += lo <= true <= hi
    assert 0.90 <= hits / sims <= 0.995, hits / sims


def test_interval_edge_cases():
    est, lo, hi = interval((np.array([2.0, 2.0, 2.0]), np.array([1.0, 1.0, 1.0])), "repeats")
    assert (est, lo, hi) == (2.0, 2.0, 2.0)
    est, lo, hi = interval((np.array([2.0]), np.array([1.0, 1.1])), "iterations")
    assert est == pytest.approx(2 / 1.05) and np.isnan(lo) and np.isnan(hi)


def test_configurations_group_seeds_and_repeats_but_not_other_keys():
    runs, iters = synthetic({(10, "fifo"): 1.0, (10, "mercury"): 0.7, (20, "mercury"): 0.5}, repeats=2)
    runs = add_configurations(runs)
    assert runs.groupby("config_id")["seed"].nunique().min() == 2  # seeds of one point share a config
    assert runs["config_id"].nunique() == 2
    assert set(runs["config"]) == {"bw 10 Mb/s", "bw 20 Mb/s"}
    table = speedups(runs, iters)
    assert list(table["point.bw_mbps"]) == [10]  # 20 Mb/s has no fifo run: no speedup row
    times = iteration_times(runs, iters)
    assert len(times) == 3 and (times["ci_low"] <= times["iter_time_s"]).all()


def test_configuration_comes_from_the_config_file_not_measured_cells(tmp_path):
    base = {"name": "s", "seed": 0, "workload": {"model": "cnn"}, "cross_traffic": [{"src": "t0"}],
            "scheduler": "fifo", "schedulers": {"fifo": {}}}
    variants = {"a": base, "b": {**base, "scheduler": "p3", "schedulers": {"p3": {"slice": 1}}, "seed": 5},
                "c": {**base, "workload": {"model": "vgg"}}}
    for rid, cfg in variants.items():
        (tmp_path / rid).mkdir()
        (tmp_path / rid / "config.yaml").write_text(yaml.safe_dump(cfg))
    # the row's cross_traffic cell is a measurement (differs per run) and must not split configs
    runs = pd.DataFrame({"run_id": list(variants), "sweep": "s", "cross_traffic": ["x1", "x2", "x3"],
                         "scheduler": ["fifo", "p3", "fifo"]})
    ids = add_configurations(runs, tmp_path).set_index("run_id")["config_id"]
    assert ids["a"] == ids["b"] != ids["c"]


# --------------------------------------------------------------------------- claims, fidelity
def facts_for(runs: pd.DataFrame, **kw) -> pd.DataFrame:
    f = runs.groupby("config_id", as_index=False).first()[["config_id", "config"]]
    defaults = dict(model="cnn", num_hosts=3, num_workers=2, link_mbps_min=10.0, link_mbps_max=100.0,
                    heterogeneous=False, time_varying=False, shared=False, dynamic=False)
    return f.assign(**{**defaults, **kw})


def test_claims_are_tested_only_where_the_sweep_allows():
    runs, iters = synthetic({(10, "fifo"): 1.0, (10, "mercury"): 1 / 1.5}, repeats=3, seed=1)
    runs = add_configurations(runs)
    table = claims.evaluate(runs, iters, facts_for(runs)).set_index("claim")
    plain = table.loc["1.18–2.18x over plain PS"]
    assert plain["testable"] and plain["baseline"] == "fifo" and plain["verdict"].startswith("consistent")
    assert "1.5" in plain["measured"]
    assert "none of `bytescheduler`, `p3` ran" in table.loc["1.08–2.04x over tensor partitioning", "measured"]
    assert "no configuration has shared or time-varying" in table.loc[
        "up to +130% over a parameter server under shared or time-varying bandwidth", "measured"]
    assert "no run of `forest`" in table.loc["up to 18.3x over prior schemes on heterogeneous bandwidth", "measured"]

    runs, iters = synthetic({(10, "fifo"): 1.0, (10, "mercury"): 1 / 3.0}, repeats=3, seed=2)
    runs = add_configurations(runs)
    row = claims.evaluate(runs, iters, facts_for(runs)).set_index("claim").loc["1.18–2.18x over plain PS"]
    assert row["verdict"].startswith("above")
    # the same runs, called dynamic: the static claim cannot be tested, the dynamic one can
    table = claims.evaluate(runs, iters, facts_for(runs, dynamic=True, shared=True)).set_index("claim")
    assert not table.loc["1.18–2.18x over plain PS", "testable"]
    dyn = table.loc["up to +130% over a parameter server under shared or time-varying bandwidth"]
    assert dyn["testable"] and dyn["verdict"].startswith("above the reported maximum of 2.3x")
    assert "none of `bytescheduler`, `p3` ran" in table.loc[
        "up to +104% over tensor partitioning under shared or time-varying bandwidth", "measured"]


def test_fidelity_summary_counts_runs_by_reason():
    runs = pd.DataFrame({
        "run_id": list("abcde"), "scheduler": "fifo", "status": ["ok", "ok", "ok", "ok", "failed"],
        "reason": ["", "", "", "", "timed out after 300 s (timeout_s)"],
        "fidelity_ok": [True, False, False, False, None],
        "fidelity_reasons": ["", "CPU idle fell to 0% (< 35%) in a 1 s window",
                             "CPU idle fell to 12% (< 35%) in a 1 s window; w1->s1 at t=3.0 s ran 9% above its "
                             "configured rate (> 5%)", "something new at 3.5 s", ""]})
    s = fidelity.summary(runs)  # rows without fidelity_codes: codes from the sentences
    assert (s["runs"], s["completed"], s["passed"], s["failed"]) == (5, 4, 1, 3)
    counts = dict(zip(s["reasons"]["category"], s["reasons"]["runs"], strict=True))
    cpu, rate = fidelity.CATEGORIES["cpu_idle"], fidelity.CATEGORIES["rate_excess"]
    assert counts == {cpu: 2, rate: 1, "something new at # s": 1}
    assert list(s["not_completed"]["run_id"]) == ["e"]
    # rows with codes are counted by code, whatever the sentence says; old and new rows mix
    coded = runs.assign(fidelity_codes=[None, None, '["saturation", "rate_excess"]', '["cpu_idle"]', None],
                        fidelity_reasons=[r.replace("CPU idle fell", "idle dipped") for r in runs["fidelity_reasons"]])
    counts = dict(zip(*(fidelity.summary(coded)["reasons"][c] for c in ("category", "runs")), strict=True))
    assert counts == {"idle dipped to #% (< #%) in a # s window": 1, fidelity.CATEGORIES["saturation"]: 1,
                      rate: 1, cpu: 1}


def test_every_reason_code_has_a_category_and_the_mini_set_reads_without_codes():
    from contracts.fidelity import Reason

    assert set(fidelity.CATEGORIES) == {r.value for r in Reason}
    runs = pd.read_parquet(MINI / "runs.parquet")
    assert "fidelity_codes" not in runs  # the committed set predates the codes
    s = fidelity.summary(runs)
    assert s["failed"] == len(runs) and list(s["reasons"]["category"]) == [fidelity.CATEGORIES["cpu_idle"]]


def test_measured_iterations_are_those_after_warmup_and_a_run_with_none_is_refused(tmp_path):
    """load_iterations keeps what the run's row summarised: iterations >= warmup, which must be
    fewer than the iterations (contracts/iterations.py)."""
    run_dir = tmp_path / "r"
    run_dir.mkdir()
    pd.DataFrame({"rank": 0, "iteration": range(4), "start": range(4), "end": np.arange(4) + 0.5}).to_parquet(
        run_dir / "iterations.parquet")
    runs = pd.DataFrame({"run_id": ["r"], "scheduler": "fifo", "repeat": 0, "workload.iterations": 4})
    for warmup, kept in ((0, [0, 1, 2, 3]), (2, [2, 3]), (3, [3])):
        its = load_iterations(tmp_path, runs.assign(**{"workload.warmup": warmup}))
        assert its["iteration"].tolist() == kept, warmup
    for warmup in (4, 9):
        with pytest.raises(NoMeasuredIteration, match=f"warmup \\({warmup}\\)"):
            load_iterations(tmp_path, runs.assign(**{"workload.warmup": warmup}))


def write_sweep(root: Path) -> Path:
    """A made-up sweep on disk, as `./inv sweep` lays it out: 2 models x 2 bandwidths x
    fifo/bytescheduler/mercury x 3 repeats (so intervals are over runs), link samples and
    role specs borrowed from a mini run, no scheduler trace."""
    # the donor's links (50 Mb/s) are what the bounds see: the made-up times must not beat them
    sweep, donor = root / "synth", MINI / "05868d9c075f"
    rows, frames = [], []
    for model, scale in (("cnn", 1.0), ("vgg", 4.0)):
        true = {(bw, s): scale * f * 10 / bw for bw in (10, 50)
                for s, f in (("fifo", 1.0), ("bytescheduler", 0.8), ("mercury", 0.5))}
        runs, iters = synthetic(true, repeats=3, iterations=12, run_noise=0.03, seed=sum(map(ord, model)))
        ids = {r: f"{model}-{r}" for r in runs["run_id"]}
        frames.append(iters.assign(run_id=iters["run_id"].map(ids)))
        rows.append(runs.assign(run_id=runs["run_id"].map(ids), **{"point.workload.model": model}))
    runs, iters = pd.concat(rows, ignore_index=True), pd.concat(frames, ignore_index=True)
    iters["compute_s"], iters["wait_s"] = 0.02, (iters["end"] - iters["start"]) - 0.02
    spec = yaml.safe_load((donor / "config.yaml").read_text())
    for i, run in runs.iterrows():
        d = sweep / run["run_id"]
        shutil.copytree(donor / "roles", d / "roles")
        shutil.copy(donor / "links.parquet", d / "links.parquet")
        mine = iters[iters["run_id"] == run["run_id"]]
        mine.to_parquet(d / "iterations.parquet")
        cfg = {**spec, "name": "synth", "seed": int(run["seed"]), "scheduler": run["scheduler"],
               "schedulers": {run["scheduler"]: {}},
               "workload": {**spec["workload"], "model": run["point.workload.model"]},
               "topology": {**spec["topology"], "bw_mbps": float(run["point.bw_mbps"])}}
        (d / "config.yaml").write_text(yaml.safe_dump(cfg))
        t = (mine["end"] - mine["start"]).median()
        bound = 0.4 * 10 / run["point.bw_mbps"]
        runs.loc[i, ["iter_time_median_s", "wait_median_s", "compute_median_s", "bound_s", "efficiency"]] = [
            t, t - 0.02, 0.02, bound, bound / t]
    donor_row = load_runs(MINI).iloc[0]
    for col in ("roles.workers", "roles.servers", "workload.preset", "workload.warmup", "workload.iterations",
                "workload.batch_size", "num_params", "num_tensors", "topology.kind", "topology.hosts", "compute_mode"):
        runs[col] = donor_row[col]
    runs = runs.assign(**{"sweep": "synth", "workload.model": runs["point.workload.model"], "shaping": "[]",
                          "fidelity_ok": True, "fidelity_reasons": "", "reason": ""})
    runs.to_parquet(sweep / "runs.parquet")
    return sweep


@pytest.mark.slow
def test_report_of_a_faceted_sweep_with_repeats_tests_a_claim(tmp_path):
    sweep = write_sweep(tmp_path)
    md = write_report(sweep).read_text()
    table = load_speedups(sweep)
    assert set(table["unit"]) == {"repeats"} and set(table["n"]) == {3} and len(table) == 8
    for _, row in table.iterrows():
        assert f"| {row['config']} | {row['scheduler']} | 3 |" in md
        assert f"{row['speedup']:.2f} [{row['ci_low']:.2f}, {row['ci_high']:.2f}]" in md
    assert "bw 50 Mb/s · vgg" in md  # the short label of the configuration (contracts/point_label.py)
    mercury = table[table["scheduler"] == "mercury"]
    assert mercury["speedup"].between(1.8, 2.2).all()  # made 2x faster than fifo
    assert "- **Mercury (IEEE TPDS 2023): 1.18–2.18x over plain PS**" in md
    assert f"over `fifo`: measured {mercury['speedup'].min():.2f}x" in md
    assert "over `bytescheduler`: measured" in md  # Mercury vs tensor partitioning is testable too
    assert "*Not drawn:* no run of this sweep was traced" in md
    for stem in ("speedup", "iteration_time", "link_utilisation", "efficiency"):
        assert is_png(sweep / "report" / f"{stem}.png")


# --------------------------------------------------------------------------- figures, report, notebook


@pytest.mark.parametrize("fn", [plots.speedup_plot, plots.iteration_time_sweep_plot,
                                pytest.param(plots.timeline_plot, marks=pytest.mark.slow),
                                pytest.param(plots.link_utilisation_plot, marks=pytest.mark.slow),
                                pytest.param(plots.efficiency_plot, marks=pytest.mark.slow), plots.iteration_time_plot],
                         ids=lambda f: f.__name__)
def test_each_figure_draws_the_mini_sweep(fn, tmp_path):
    out = fn(MINI, out=tmp_path / "fig.png", formats=("png", "pdf"))
    assert out == tmp_path / "fig.png" and is_png(out)
    assert (tmp_path / "fig.pdf").read_bytes()[:4] == b"%PDF"


@pytest.mark.slow
def test_report_task_writes_every_figure_and_the_measured_numbers(tmp_path):
    sweep = tmp_path / "mini"
    shutil.copytree(MINI, sweep)
    res = invoke("report", str(sweep), timeout=120)
    assert res.returncode == 0, res.stderr
    md_path = sweep / "report" / "report.md"
    assert f"report: {md_path}" in res.stdout
    md = md_path.read_text()
    for stem, heading, _, _ in FIGURES:
        assert f"![{heading}]({stem}.png)" in md and f"[PDF]({stem}.pdf)" in md
        assert is_png(sweep / "report" / f"{stem}.png") and (sweep / "report" / f"{stem}.pdf").stat().st_size > 0
    for _, row in load_speedups(MINI).iterrows():  # the summary states what the analysis computes
        assert f"| {row['config']} | {row['scheduler']} |" in md
        assert f"{row['speedup']:.2f} [{row['ci_low']:.2f}, {row['ci_high']:.2f}]" in md
    runs = load_runs(MINI)
    assert f"**{int(runs['fidelity_ok'].sum())} passed**" in md
    assert "not testable: this sweep has no run of `mercury`" in md  # the mini sweep has fifo and bytescheduler


@pytest.mark.slow
def test_report_without_a_trace_says_why_the_timeline_is_missing(tmp_path):
    sweep = tmp_path / "mini"
    shutil.copytree(MINI, sweep)
    for ev in sweep.glob("*/events.parquet"):
        ev.unlink()
    with pytest.raises(plots.Skipped, match="trace: true"):
        plots.timeline_plot(sweep, out=tmp_path / "t.png")
    md = write_report(sweep, tmp_path / "rep").read_text()
    assert "*Not drawn:* no run of this sweep was traced" in md
    assert "![Speedup over the baseline](speedup.png)" in md


@pytest.mark.slow
def test_report_task_refuses_a_missing_sweep(tmp_path):
    res = invoke("report", str(tmp_path / "nothing"), timeout=60)
    assert res.returncode == 2 and "runs.parquet: no such file" in res.stderr


@pytest.mark.slow
def test_notebook_rebuilds_the_figure(tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    from nbclient import NotebookClient

    for var in ("JUPYTER_RUNTIME_DIR", "IPYTHONDIR", "MPLCONFIGDIR"):  # nothing written to $HOME
        monkeypatch.setenv(var, str(tmp_path / var.lower()))
    monkeypatch.setenv("SCHEDLAB_SWEEP", str(MINI))
    monkeypatch.setenv("SCHEDLAB_FIGURE", str(tmp_path / "figure.png"))
    nb = nbformat.read(REPO / "notebooks" / "reproduce_figure.ipynb", as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell("import sys; print(sys.executable)"))
    NotebookClient(nb, timeout=120, kernel_name="python3",
                   resources={"metadata": {"path": str(REPO / "notebooks")}}).execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors
    assert is_png(tmp_path / "figure.png")
    # the kernel is this interpreter (the venv's), not whatever `python` is first on PATH
    assert os.path.realpath(nb.cells[-1].outputs[0]["text"].strip()) == os.path.realpath(sys.executable)


PANDAS_NOTEBOOK = REPO / "notebooks" / "results_with_pandas.ipynb"


def test_pandas_notebook_is_committed_run_and_small():
    """notebooks/results_with_pandas.ipynb is committed with its outputs (it is read on the web
    and in JupyterLab without running it): every code cell ran, none failed, the figures are
    there, and the file stays small."""
    nbformat = pytest.importorskip("nbformat")
    nb = nbformat.read(PANDAS_NOTEBOOK, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.execution_count and c.outputs for c in code), "execute it again and commit its outputs"
    assert not [o for c in code for o in c.outputs if o.output_type == "error"]
    assert sum("image/png" in o.get("data", {}) for c in code for o in c.outputs) >= 3
    assert PANDAS_NOTEBOOK.stat().st_size < 500_000


@pytest.mark.slow
def test_pandas_notebook_runs_on_the_carried_sets(tmp_path, monkeypatch):
    """It executes on the result sets the repository carries, from a copy in a temporary folder
    (its outputs go there, the repository's file is not touched), in the venv's kernel."""
    nbformat = pytest.importorskip("nbformat")
    from nbclient import NotebookClient

    for var in ("JUPYTER_RUNTIME_DIR", "IPYTHONDIR", "MPLCONFIGDIR"):
        monkeypatch.setenv(var, str(tmp_path / var.lower()))
    before = PANDAS_NOTEBOOK.read_bytes()
    nb = nbformat.read(PANDAS_NOTEBOOK, as_version=4)
    NotebookClient(nb, timeout=120, kernel_name="python3",
                   resources={"metadata": {"path": str(REPO / "notebooks")}}).execute()
    nbformat.write(nb, tmp_path / PANDAS_NOTEBOOK.name)
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert "the medians agree with runs.parquet" in text and "pass the fidelity check" in text
    assert PANDAS_NOTEBOOK.read_bytes() == before
