"""Figures fit for a paper: no line across another swept key, subtitles true for every panel,
a look of its own for every scheduler, the paper style, provenance in every file, tables as
CSV and LaTeX, and docs/'s figures drawn again from the committed result sets."""
from __future__ import annotations

import json

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest

from analysis import figures, plots
from analysis.report import configurations_legend, export_table
from analysis.speedup import speedups
from analysis.tables import add_configurations
from tests.conftest import REPO
from tests.factories import is_png

MODELS = {"alexnet": 42, "vgg": 52, "resnet": 37, "bert": 32, "lstm": 64}  # zipped with the bandwidth


def zipped(points: list[dict], schedulers=("fifo", "mercury"), servers: dict | None = None, workers=8,
           iterations: int = 12, seed: int = 0) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Runs and iterations of a made-up sweep over `points` (each {key: value} of the grid)."""
    rng = np.random.default_rng(seed)
    runs, iters = [], []
    for i, point in enumerate(points):
        for s in schedulers:
            rid = f"{s}-{i}"
            nw = point.get("_workers", workers)
            runs.append({"run_id": rid, "sweep": "synthetic", "scheduler": s, "scheduler_name": s, "repeat": 0,
                         "seed": 0, "status": "ok", "point.scheduler": s, "workload.preset": "small",
                         "workload.model": point.get("workload.model", "cnn"), "num_params": 1e6,
                         "num_workers": nw, "roles.servers": json.dumps((servers or {}).get(s, ["ps"])),
                         "topology.kind": "star", "network": "star",
                         **{f"point.{k}": v for k, v in point.items() if not k.startswith("_")}})
            t = 0.1 * (2.0 if s == "fifo" else 1.0) * (1 + i)
            for it in range(iterations):
                d = t * rng.lognormal(0, 0.02)
                iters.append({"run_id": rid, "rank": 0, "iteration": it, "start": it * d, "end": (it + 1) * d})
    return pd.DataFrame(runs), pd.DataFrame(iters)


def _lines_with_points(fig) -> list:
    """Every scheduler's data line of more than one point that is drawn as a line (not markers only)."""
    out = []
    for ax in fig.axes:
        for c in ax.containers:
            line = c.lines[0] if hasattr(c, "lines") else None
            if line is not None and len(line.get_xdata()) > 1 and line.get_linestyle() not in ("None", "none", ""):
                out.append(line)
    return out


def _draw(runs, iters, tmp_path, monkeypatch):
    figs = []
    monkeypatch.setattr(plots, "_save", lambda fig, out, formats, *a, **kw: figs.append(fig) or out)
    runs = add_configurations(runs)
    table = speedups(runs, iters, baseline="fifo")
    plots._interval_plot(table, runs, "speedup", 1.0, "speedup", "t", tmp_path / "f.png", ("png",), ref=1.0,
                         ref_label="fifo (1x)")
    return figs[0], table


def test_a_zipped_model_and_bandwidth_sweep_draws_no_line_across_models(tmp_path, monkeypatch):
    points = [{"workload.model": m, "topology.hosts.1.bw_mbps": bw, "topology.hosts.0.bw_mbps": 8 * bw}
              for m, bw in MODELS.items()]
    runs, iters = zipped(points)
    assert plots._layout(runs) == (None, [])  # a categorical axis: one category per configuration
    fig, table = _draw(runs, iters, tmp_path, monkeypatch)
    assert _lines_with_points(fig) == []
    mercury = [c for c in fig.axes[0].containers if c.get_label() == "mercury"]
    assert len(mercury) == 1 and len(mercury[0].lines[0].get_xdata()) == len(MODELS)
    plt.close(fig)


def test_a_bandwidth_sweep_per_model_joins_the_bandwidths_of_one_model_only(tmp_path, monkeypatch):
    points = [{"workload.model": m, "topology.hosts.1.bw_mbps": bw * f, "topology.hosts.0.bw_mbps": 8 * bw * f}
              for m, bw in list(MODELS.items())[:2] for f in (1, 2)]
    runs, iters = zipped(points)
    x, panels = plots._layout(runs)
    assert x == "topology.hosts.1.bw_mbps" and panels == ["workload.model"]
    fig, _ = _draw(runs, iters, tmp_path, monkeypatch)
    lines = _lines_with_points(fig)
    assert lines and all(len(line.get_xdata()) == 2 for line in lines)  # the two bandwidths of one model
    plt.close(fig)


def test_a_key_that_changes_along_x_but_not_with_it_makes_panels(tmp_path, monkeypatch):
    """speedup 0.25, 0.5 zipped with bandwidth 10, 20, 40, 80 (not monotone): panels per speedup."""
    points = [{"topology.bw_mbps": bw, "workload.speedup": sp} for bw, sp in ((10, .25), (20, .5), (40, .25),
                                                                               (80, .5))]
    runs, _ = zipped(points)
    assert plots._layout(runs) == ("topology.bw_mbps", ["workload.speedup"])


def test_subtitles_state_each_panels_workers_and_servers_only_for_the_ps_family():
    points = [{"roles.workers": json.dumps(["h3", "h4", "h5", "h6"]), "_workers": 4},
              {"roles.workers": json.dumps(["h1", "h2", "h3", "h4", "h5", "h6"]), "_workers": 6}]
    runs, _ = zipped(points, schedulers=("fifo", "ring"), servers={"ring": []})
    runs["config_id"] = runs["point.roles.workers"]
    shared, own = plots._settings(runs, [runs[runs["num_workers"] == n] for n in (4, 6)])
    assert "workers" not in shared and "PS" not in shared
    assert own == ["4 workers (+ 1 PS for fifo)", "6 workers (+ 1 PS for fifo)"]
    collective = runs[runs["scheduler"] == "ring"]
    assert plots._facts(collective[collective["num_workers"] == 6])["roles"] == "6 workers"
    assert plots._facts(runs[runs["scheduler"] == "fifo"])["roles"] == "4–6 workers + 1 PS"


def test_every_scheduler_of_a_figure_has_a_look_of_its_own():
    names = [f"plugin{i}" for i in range(len(plots.PALETTE) + 5)] + ["fifo", "ring"]
    looks = {n: plots._look(n, names) for n in names}
    pairs = {(tuple(v["color"]), v["marker"], v["ls"]) for v in looks.values()}
    assert len(pairs) == len(names)
    first = [looks[n]["color"] for n in names[:len(plots.PALETTE)]]
    assert len(set(map(tuple, first))) == len(plots.PALETTE)  # the palette is spent before markers repeat it
    assert looks["fifo"]["color"] == plots.PALETTE[0] and looks["fifo"]["marker"] == "o"  # built-ins keep theirs
    assert [matplotlib_hex(c) for c in plots.PALETTE] == [c.lower() for c in plots.OKABE_ITO]


def matplotlib_hex(rgb) -> str:
    import matplotlib.colors

    return matplotlib.colors.to_hex(rgb)


def test_paper_style_has_no_titles_a_given_width_embedded_fonts_and_provenance(tmp_path):
    from PIL import Image

    sweep = REPO / "tests" / "data" / "results" / "mini"
    with plots.figure_context(style="paper", width=3.5, commit="abc1234+dirty", source="the mini set"):
        png = plots.iteration_time_sweep_plot(sweep, out=tmp_path / "f.png", formats=("png", "pdf"))
    meta = plots.provenance_of(png)
    assert meta["Commit"] == "abc1234+dirty" and meta["Source"] == "the mini set" and meta["Style"] == "paper"
    assert meta["Machine"] and meta["Measured at"] and "iteration time" in meta["Description"]
    with Image.open(png) as im:
        assert im.size[0] <= 3.5 * 300 + 10  # at most the width asked for (bbox tight may trim)
    pdf = (tmp_path / "f.pdf").read_bytes()
    assert b"/FontFile2" in pdf and b"/Type3" not in pdf  # TrueType embedded (pdf.fonttype 42)
    assert b"abc1234+dirty" in pdf  # Subject and Keywords


def test_screen_figures_keep_their_titles(tmp_path):
    figs = []
    sweep = REPO / "tests" / "data" / "results" / "mini"
    save = plots._save

    def spy(fig, out, formats, *a, **kw):
        figs.append(fig._suptitle.get_text() if fig._suptitle else "")
        return save(fig, out, formats, *a, **kw)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(plots, "_save", spy)
        png = plots.speedup_plot(sweep, out=tmp_path / "s.png")
    assert figs[0] and plots.provenance_of(png)["Commit"] == "not given"
    assert plots.provenance_caption(png).startswith("Drawn at commit not given from ")


def test_tables_go_beside_the_report_as_csv_and_latex(tmp_path):
    df = pd.DataFrame({"configuration": ["a_b", "c"], "speedup, 95% CI": ["1.2 [1.1, 1.3]", "–"]})
    csv, tex = export_table(df, tmp_path, "summary")
    assert pd.read_csv(csv).equals(df)
    text = tex.read_text()
    assert "\\begin{tabular}" in text and "a\\_b" in text and "--" in text


def test_the_legend_names_every_swept_key_of_each_configuration():
    points = [{"workload.model": m, "topology.hosts.1.bw_mbps": bw} for m, bw in list(MODELS.items())[:2]]
    runs, _ = zipped(points)
    runs["config"] = runs["point.workload.model"]
    runs["topology.hosts"] = json.dumps([{"name": "ps"}, {"name": "w0"}])
    legend = configurations_legend(runs)
    assert legend["configuration"].tolist() == ["alexnet", "", "vgg", ""]
    assert legend["value"].tolist() == ["alexnet", 42, "vgg", 52]
    assert any("w0 link bandwidth" in k for k in legend["key"])


def test_every_docs_figure_has_a_mapping_and_a_committed_set():
    assert {f.file for f in figures.FIGURES} == {p.name for p in (REPO / "docs").glob("*.png")}
    assert set(figures.PLOTS) >= {f.plot for f in figures.FIGURES}
    committed = REPO / figures.COMMITTED
    total = sum(p.stat().st_size for p in committed.rglob("*") if p.is_file())
    assert total < 3.5e6, total  # small sets only (3.25 MB: nine sets, the faults one 0.94 MB of 400-iteration runs)
    assert not list(committed.rglob("logs")) and not list(committed.rglob("qdiscs.parquet"))


def test_a_kept_set_drops_the_forest_per_tree_record_unless_it_keeps_every_table(tmp_path):
    """The per-tree record is most of a forest run's scheduler_info.json (1.3 MB of a 160-iteration
    run) and no figure reads it; the plans, which the re-planning figure reads, stay."""
    run = tmp_path / "src" / "r1"
    run.mkdir(parents=True)
    pd.DataFrame({"run_id": ["r1"]}).to_parquet(tmp_path / "src" / "runs.parquet")
    (run / "config.yaml").write_text("name: x\n")
    info = {"plans": [{"iteration": 0}], "trees": {"ranks": [0, 1]}}
    (run / "scheduler_info.json").write_text(json.dumps(info))
    figures.keep_set(tmp_path / "src", tmp_path / "figs")
    assert json.loads((tmp_path / "figs" / "r1" / "scheduler_info.json").read_text()) == {"plans": [{"iteration": 0}]}
    figures.keep_set(tmp_path / "src", tmp_path / "all", tables="all")
    assert json.loads((tmp_path / "all" / "r1" / "scheduler_info.json").read_text()) == info


@pytest.mark.slow
def test_figures_are_drawn_again_from_the_committed_sets_with_provenance(tmp_path):
    outcomes = figures.regenerate(tmp_path, REPO, results=tmp_path / "no-long-sweeps", commit="abc1234")
    drawn = [o for o in outcomes if o.path is not None]
    assert drawn, figures.table(outcomes)
    committed = {f.sweep for f in figures.FIGURES if (REPO / figures.COMMITTED / f.sweep / "runs.parquet").exists()}
    assert {o.figure.sweep for o in drawn} == committed, figures.table(outcomes)
    for o in drawn:
        assert o.path.parent == tmp_path and is_png(o.path)
        meta = plots.provenance_of(o.path)
        assert meta["Commit"] == "abc1234" and "committed small set" in meta["Source"], (o.figure.file, meta)
        assert str(figures.COMMITTED / o.figure.sweep) in meta["Source"]
        assert "cores" in meta["Machine"] and meta["Measured at"] != "not recorded"
    assert "no-long-sweeps" in figures.table(outcomes)
