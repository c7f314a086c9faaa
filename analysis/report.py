"""A sweep's report: one Markdown file with every figure (PNG, and PDF for papers), the
summary table, the fidelity verdicts and the papers' claims beside what was measured.

    ./inv report results/<sweep>      ->  results/<sweep>/report/report.md

Each table of the report is also written beside it as CSV and LaTeX (`<name>.csv`,
`<name>.tex`); each figure's caption names its provenance (the commit that drew it, the result
set, the commit the runs used and their machine), which its PNG and PDF carry as metadata.
`style="paper"`: figures without titles, as wide as `width` inches, fonts embedded; the
captions still say what each shows.

Everything in it is computed from the sweep's files; nothing is typed in by hand, so
re-running it after more runs completes updates every number.
"""
from __future__ import annotations

import contextlib
import datetime as dt
import inspect
import json
from pathlib import Path

import pandas as pd

from analysis import bounds as bounds_mod
from analysis import catalog, fidelity, forest_compare, forest_trees, physics, plots, startup
from analysis import claims as claims_mod
from analysis import faults as faults_mod
from analysis import incast as incast_mod
from analysis import replan as replan_mod
from analysis.speedup import METHOD, MIN_REPEATS, baseline_variant, iteration_times, load_comparison, speedups
from analysis.tables import NoResults, add_configurations, config_facts, key_label, load_runs, swept_keys

FIGURES = [  # (file stem, heading, function, caption)
    ("speedup", "Speedup over the baseline", plots.speedup_plot,
     "Each scheduler's speedup over the baseline on the same configuration (ratio of iteration times), "
     "with 95% intervals (see Setup); the dashed line is the baseline."),
    ("iteration_time", "Iteration time", plots.iteration_time_sweep_plot,
     "Iteration time of each scheduler against the swept key, with 95% intervals (see Setup)."),
    ("timeline", "Communication timeline of one iteration", plots.timeline_plot,
     "One iteration's gradients on one worker, per scheduler: a bar per chunk from its push leaving to its "
     "aggregate arriving, tensors in priority order (key 0 is the input side and is needed first). Time 0 is "
     "the start of the next iteration, whose forward pass waits for these aggregates layer by layer."),
    ("link_utilisation", "Link utilisation", plots.link_utilisation_plot,
     "Send rate of the busiest link directions of one run, with the configured rate (the bandwidth trace "
     "when shaped) dashed."),
    ("efficiency", "Efficiency against the analytic bound", plots.efficiency_plot,
     "Left: each run's measured iteration (median; the mean where its bandwidth varied) against the lower "
     "bound of its scheduler's model on the bandwidth the run had (see Bounds). Right: efficiency = bound / "
     "measured."),
]


_EXPORT: dict = {"dir": None, "names": []}  # where write_report writes its tables' CSV and LaTeX


@contextlib.contextmanager
def _exporting(out_dir: Path):
    before = dict(_EXPORT)
    _EXPORT.update(dir=Path(out_dir), names=[])
    try:
        yield _EXPORT
    finally:
        _EXPORT.clear()
        _EXPORT.update(before)


def export_table(df: pd.DataFrame, out_dir: Path, name: str) -> tuple[Path, Path]:
    """`df` as `<name>.csv` and `<name>.tex` (a LaTeX tabular, booktabs rules) in `out_dir`."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    csv, tex = out_dir / f"{name}.csv", out_dir / f"{name}.tex"
    df.to_csv(csv, index=False)
    text = df.astype(str).map(lambda v: v.replace("–", "--"))
    tex.write_text(text.to_latex(index=False, escape=True))
    return csv, tex


def md_table(df: pd.DataFrame, name: str | None = None, drop: list[str] = ()) -> str:
    """A pipe table (pandas' to_markdown needs tabulate, which the harness does not pin). With
    `name`, inside write_report, the table also goes beside the report as CSV and LaTeX, whole:
    `drop` leaves columns out of the Markdown only (those the text states once, to fit 80 columns)."""
    if name is not None and _EXPORT["dir"] is not None:
        stem = name if name not in _EXPORT["names"] else f"{name}_{len(_EXPORT['names'])}"
        _EXPORT["names"].append(stem)
        export_table(df, _EXPORT["dir"], stem)
    df = df.drop(columns=list(drop))

    def cell(v) -> str:
        return str(v).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(cell(c) for c in df.columns) + " |", "|" + "---|" * len(df.columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join(lines)


def _figure_note(png: Path) -> str:
    """A caption's end: in the paper style what the dropped title said, then the figure's
    provenance (from its own metadata) and its PDF."""
    meta = plots.provenance_of(png)
    what = f"{meta['Description']}. " if meta.get("Style") == "paper" and meta.get("Description") else ""
    return f"{what}{plots.provenance_caption(png)} ([PDF]({png.with_suffix('.pdf').name}))"


def configurations_legend(runs: pd.DataFrame) -> pd.DataFrame:
    """Each configuration's short label beside its full point: every swept key and its value,
    one row each (the label only on its configuration's first row), so it reads at 80 columns."""
    keys = swept_keys(runs)
    rows = []
    for config, grp in runs.groupby("config", sort=False):
        r = grp.iloc[0]
        for i, k in enumerate(keys):
            v = r.get(f"point.{k}")
            v = int(v) if isinstance(v, float) and v.is_integer() else v
            rows.append({"configuration": config if i == 0 else "", "key": f"{key_label(k, runs)} (`{k}`)",
                         "value": v})
        if not keys:
            rows.append({"configuration": config, "key": "–", "value": "–"})
    return pd.DataFrame(rows, columns=["configuration", "key", "value"])


def _ci(est: float, lo: float, hi: float, fmt: str) -> str:
    if pd.isna(est):
        return "–"
    if pd.isna(lo):
        return f"{est:{fmt}} (no CI)"
    return f"{est:{fmt}} [{lo:{fmt}}, {hi:{fmt}}]"


def summary(runs: pd.DataFrame, iters: pd.DataFrame, baseline: str) -> pd.DataFrame:
    """Per (configuration, scheduler): runs, iteration time and speedup with CIs, share of
    the iteration spent blocked on gradients, efficiency, and fidelity passes."""
    times = iteration_times(runs, iters)
    sp = speedups(runs, iters, baseline=baseline).set_index(["config_id", "scheduler"])
    order = plots.scheduler_order(runs["scheduler"])
    rows = []
    for _, t in times.iterrows():
        grp = runs[(runs["config_id"] == t["config_id"]) & (runs["scheduler"] == t["scheduler"])]
        key = (t["config_id"], t["scheduler"])
        if t["scheduler"] == baseline_variant(runs[runs["config_id"] == t["config_id"]], baseline):
            speed = "1 (baseline)"
        elif key in sp.index:
            s = sp.loc[key]
            speed = _ci(s["speedup"], s["ci_low"], s["ci_high"], ".2f")
        else:
            speed = "– (no baseline run)"
        wait = (grp["wait_median_s"] / grp["iter_time_median_s"]).mean()
        fid = grp["fidelity_ok"] if "fidelity_ok" in grp else pd.Series(None, index=grp.index, dtype=object)
        rows.append({"configuration": t["config"], "scheduler": t["scheduler"], "runs": len(grp),
                     "iteration ms (95% CI)": _ci(t["iter_time_s"] * 1e3, t["ci_low"] * 1e3, t["ci_high"] * 1e3,
                                                  ".0f"),
                     f"speedup over {baseline} (95% CI)": speed, "blocked": f"{wait:.0%}",
                     "efficiency": f"{grp['efficiency'].mean():.2f}" if grp["efficiency"].notna().any() else
                                   "no bound" if _no_bound(grp) else "–",
                     "fidelity": f"{int((fid == True).sum())}/{int(fid.notna().sum())}"  # noqa: E712
                                        if fid.notna().any() else "not judged",
                     "_sort": order.index(t["scheduler"])})
    df = pd.DataFrame(rows)
    # Configurations in sweep order, schedulers in the canonical order within each
    df["_cfg"] = df["configuration"].map({c: i for i, c in enumerate(dict.fromkeys(times["config"]))})
    return df.sort_values(["_cfg", "_sort"]).drop(columns=["_cfg", "_sort"])


def _model_text(m: str) -> str:
    if m in bounds_mod.MODELS:
        return bounds_mod.MODELS[m].description
    return bounds_mod.NO_BOUND_TEXT if m == bounds_mod.NO_BOUND else m


def _no_bound(grp: pd.DataFrame) -> bool:
    """Every run of the group is of a scheduler that declares no bound model (bound model none)."""
    return "bound_model" in grp and (grp["bound_model"] == bounds_mod.NO_BOUND).all()


def _ms(values: pd.Series) -> str:
    return f"{values.mean() * 1e3:.0f}" if values.notna().any() else "–"


def _bounds(runs: pd.DataFrame) -> list[str]:
    """Which bound each scheduler's efficiency uses, and every bound of each configuration."""
    used = runs.dropna(subset=["bound_model"]).groupby("bound_model", sort=False)["scheduler"]
    out = ["Each run is judged against the optimum of the model its scheduler plays in (`analysis/bounds.py`): "
           "bound = max(compute, that model's communication time at its optimum), on the TCP payload the links can "
           f"carry: {bounds_mod.PAYLOAD_FRACTION:.4f} of their rate (MSS 1448 bytes in a 1514-byte frame; iperf3 "
           "reaches 0.956). The models in this sweep:", ""]
    out += [f"- `{m}` ({', '.join(f'`{s}`' for s in plots.scheduler_order(scheds.unique()))}): "
            f"{_model_text(m)}." for m, scheds in used]
    caps = runs["bound_capacity"].fillna("not computed").value_counts()
    out += ["", "The cut bound (`cut_bound_s`, `cut_efficiency`) is the same for every scheduler and needs no model: "
            + bounds_mod.MODELS[bounds_mod.CUT].description
            + ". Capacity: " + "; ".join(f"{n} run(s) {c}" for c, n in caps.items()) + " (configured: the rates "
            "of the topology; available: what the shaping schedule and the cross traffic left, averaged over the "
            "measured window, and then the mean iteration is compared where the capacity varied inside it).", ""]
    rows = []
    order = plots.scheduler_order(runs["scheduler"])
    for (config, sched), grp in runs.groupby(["config", "scheduler"], sort=False):
        basis = ", ".join(sorted(grp["efficiency_basis"].dropna().unique())) or "–"
        rows.append({"configuration": config, "scheduler": sched,
                     "model": ", ".join(grp["bound_model"].dropna().unique()) or "–",
                     "capacity": ", ".join(grp["bound_capacity"].fillna("not computed").unique()),
                     "bound ms": "no bound" if _no_bound(grp) else _ms(grp["bound_s"]), "of": basis,
                     "eff.": "no bound" if _no_bound(grp) else _mean(grp["efficiency"]),
                     "cut ms": _ms(grp[["cut_bound_s", "compute_median_s"]].max(axis=1)),
                     "cut eff.": _mean(grp["cut_efficiency"]),
                     "configured ms": _ms(grp["bound_configured_s"]),
                     "line-rate eff.": _mean(grp["efficiency_line_rate"])
                     if "efficiency_line_rate" in grp else "–",
                     "_sort": order.index(sched)})
    table = pd.DataFrame(rows)
    table["_cfg"] = table["configuration"].map({c: i for i, c in enumerate(dict.fromkeys(runs["config"]))})
    table = table.sort_values(["_cfg", "_sort"]).drop(columns=["_cfg", "_sort"])
    same = [c for c in ("model", "capacity", "of") if table[c].nunique() == 1]  # said once, not per row
    out += [md_table(table, "bounds", drop=same), "",
            ("Every row: " + "; ".join(f"{c} {table[c].iloc[0]}" for c in same) + ". " if same else "") +
            "Columns: model, the bound model; capacity, the rates it is computed on; bound ms, the bound (compute "
            "included: the larger of the two); of, the measured iteration it is set against (the median, or the "
            "mean over the measured window where the capacity varied in it); eff., bound over measured (a mean "
            "over runs); cut ms and cut eff., the same for the cut bound; configured ms, the bound on the "
            "configured rates; line-rate eff., the efficiency at line rate rather than TCP payload."]
    return out


def _mean(values: pd.Series) -> str:
    return f"{values.mean():.2f}" if values.notna().any() else "–"


def _provenance(sweep_dir: Path, runs: pd.DataFrame) -> list[str]:
    metas = []
    for rid in runs["run_id"]:
        p = sweep_dir / rid / "meta.json"
        if p.exists():
            metas.append(json.loads(p.read_text()))
    if not metas:
        return []
    shas = sorted({m.get("git_sha", "?")[:10] + (" (dirty)" if m.get("git_dirty") else "") for m in metas})
    kernels = sorted({m.get("kernel", "?") for m in metas})
    cpus = sorted({str(m.get("cpus", "?")) for m in metas})
    v = metas[0].get("versions", {})
    versions = ", ".join(f"{k} {v[k]}" for k in ("python", "torch", "mininet") if k in v)
    return [f"- Code: git {', '.join(shas)}; kernel {', '.join(kernels)}; {', '.join(cpus)} CPUs; {versions}."]


def _setup(runs_all: pd.DataFrame, runs: pd.DataFrame, facts: pd.DataFrame) -> list[str]:
    """What was run: every swept key with its values, those that make configurations and those
    that make scheduler variants (tunables, `roles.servers`, labels) alike."""
    r = runs.iloc[0]
    keys = swept_keys(runs)
    variant_keys = [k for k in swept_keys(runs, treatments=True) if k not in keys]
    lines = [f"- Runs: {len(runs_all)} recorded, {len(runs)} completed "
             f"({', '.join(f'{n} {s}' for s, n in runs_all['status'].value_counts().items())})."]
    lines.append(f"- Schedulers: {', '.join(plots.scheduler_order(runs['scheduler']))}.")
    lines.append(f"- Workload: {', '.join(sorted(runs['workload.model'].astype(str).unique()))} "
                 f"({r['workload.preset']}, {r['num_params']:,} parameters in {r['num_tensors']} tensors), "
                 f"batch {r['workload.batch_size']}, {r['workload.iterations']} iterations of which the first "
                 f"{r['workload.warmup']} are warm-up and left out, {r['compute_mode']} compute.")
    servers = (", ".join(json.loads(r["roles.servers"])) or "none") if runs["roles.servers"].nunique() == 1 \
        else "per scheduler variant (swept)"
    lines.append(f"- Roles: {r['num_workers']} workers ({', '.join(json.loads(r['roles.workers']))}), servers: "
                 f"{servers}; topology {r.get('topology.kind', '?')}.")
    for k in keys + variant_keys:
        vals = ", ".join(str(int(v) if isinstance(v, float) and v.is_integer() else v)
                         for v in dict.fromkeys(runs[f"point.{k}"].tolist())
                         if v is not None and not (isinstance(v, float) and v != v))
        role = "" if k in keys else "; runs of one variant pool over it" if k == "seed" else \
            "; each value a scheduler variant of its own"
        lines.append(f"- Swept: {key_label(k, runs)} (`{k}`) = {vals}{role}.")
    lines.append(f"- Configurations: {len(facts)} — " + "; ".join(
        f"{f['config']}" + (f": {f['network']}" if f["network"] and f["network"] != f["config"] else "")
        + (" (shared or time-varying bandwidth)" if f["dynamic"] else "") for _, f in facts.iterrows()) + ".")
    reps = runs.groupby(["config_id", "scheduler"])["run_id"].nunique()
    per = f"{reps.min()}" if reps.min() == reps.max() else f"{reps.min()}–{reps.max()}"
    lines.append(f"- Runs per configuration and scheduler: {per}. 95% intervals: where every scheduler of a "
                 f"configuration has at least {MIN_REPEATS} runs, a {METHOD['repeats']} (estimate: ratio of "
                 f"geometric means); otherwise a {METHOD['iterations']} (estimate: ratio of medians), which "
                 f"reflects the noise within those runs only, not run-to-run variation.")
    return lines


def _fidelity(runs_all: pd.DataFrame) -> list[str]:
    f = fidelity.summary(runs_all)
    out = [f"Of {f['runs']} runs, {f['completed']} completed. Of those, **{f['passed']} passed** the fidelity "
           f"check and **{f['failed']} failed** it" + (f" ({f['unjudged']} have no verdict)" if f["unjudged"] else "")
           + ". A failed check of the monitors does not drop a run from the figures; it says that the emulation "
             "may not have behaved like the configured network (e.g. CPU contention adds time that is not "
             "communication). A run that breaks physics (faster than a lower bound, or fewer bytes on a worker's "
             "links than its gradients) measured a bug, not a network: it is left out of the summary, the speedups, "
             "the bounds' statistics and the figures, and listed under \"Runs that break physics\"."]
    if len(f["reasons"]):
        out += ["", "Why runs failed the check (a run can fail for several reasons):", "",
                md_table(f["reasons"].rename(columns={"category": "reason", "runs": "runs affected",
                                                      "example": "example"}), "fidelity_reasons")]
    if len(f["not_completed"]):
        out += ["", "Runs that did not complete:", "", md_table(f["not_completed"], "not_completed")]
    return out


def _physics(broken: pd.DataFrame) -> list[str]:
    """The runs that failed a physics check (analysis/physics.py), one row each with its
    figures, so that a number beyond what the links allow is named instead of averaged."""
    out = ["These runs reported what the network cannot do: an iteration shorter than a lower bound on it (the "
           "model's or the model-free cut bound, by more than the run's `fidelity.rate_tolerance`), or fewer bytes "
           "on a worker host's links than the gradients it must send or receive each iteration (G = 4 bytes x "
           "parameters, every iteration, warm-up included). Each measured a bug, so it is left out of the summary, "
           "the speedups, the bounds' statistics and the figures.", ""]
    order = plots.scheduler_order(broken["scheduler"])
    table = broken.assign(_sort=broken["scheduler"].map(order.index)).sort_values(["config", "_sort", "run_id"])
    out.append(md_table(pd.DataFrame({"run": table["run_id"], "scheduler": table["scheduler"],
                                      "configuration": table["config"], "why": table["physics_reasons"]}),
                        "physics"))
    return out


def _claims(runs: pd.DataFrame, iters: pd.DataFrame, facts: pd.DataFrame) -> list[str]:
    table = claims_mod.evaluate(runs, iters, facts)
    out = ["Each claim is tested only where this sweep ran the claimed scheduler and a baseline on the same "
           "configuration under the claim's condition. Settings differ from the papers', so agreement is "
           "indicative only.", ""]
    for (paper, claim), grp in table.groupby(["paper", "claim"], sort=False):
        first = grp.iloc[0]
        out.append(f"- **{paper}: {claim}** (paper: {first['paper_setting']}; condition: {first['condition']})")
        for _, row in grp.iterrows():
            if row["testable"]:
                out.append(f"  - over `{row['baseline']}`: measured {row['measured']} — {row['verdict']}. "
                           f"Our setting: {row['our_setting']}.")
            else:
                out.append(f"  - {row['measured']}.")
        if first["note"]:
            out.append(f"  - Note: {first['note']}")
    return out


def _concerned(runs: pd.DataFrame, section: str) -> bool:
    """A run of the sweep is of a scheduler that declares this report section (analysis/catalog.py)."""
    names = runs["scheduler_name"] if "scheduler_name" in runs else runs["scheduler"]
    return bool(set(names) & set(catalog.with_section(section)))


def _forest(runs: pd.DataFrame, sweep_dir: Path, out_dir: Path) -> list[str]:
    """Predicted against measured forest/baseline ratios, where the sweep has both."""
    if not _concerned(runs, forest_compare.SECTION):
        return []
    table = forest_compare.compare(runs, sweep_dir)
    if table.empty:
        return []
    top = forest_compare.headline(table)
    out = ["## Forest against its baselines: predicted and measured", "",
           "At each network the forest that plans on what it measures is compared with every other run there. "
           "Predicted: the baseline's bound / the forest's bound, each the optimum of its own model on the "
           "bandwidth the run had (ring and gloo in their given order: that order's ring). Measured: the ratio "
           f"of iteration times. Agreement = measured / predicted (target: {forest_compare.TARGET_AGREEMENT} "
           "or more); efficiency = bound / measured iteration.", ""]
    shown = table.assign(**{c: table[c].map("{:.2f}".format) for c in
                            ("predicted", "measured", "agreement", "forest_efficiency", "baseline_efficiency")},
                         forest_ms=table["forest_ms"].map("{:.0f}".format),
                         baseline_ms=table["baseline_ms"].map("{:.0f}".format))
    out += [md_table(shown, "forest_compare"), ""]
    if "largest" in top:
        out += [f"- Largest measured forest/ring (or gloo): **{top['ring_allreduce']:.2f}x** "
                f"({top['ring_allreduce_where']}; predicted {top['ring_allreduce_predicted']:.2f}x).",
                f"- Largest measured forest/best baseline (the fastest baseline at each network): "
                f"**{top['best']:.2f}x** ({top['best_where']}; predicted {top['best_predicted']:.2f}x).",
                f"- The paper's {forest_compare.PAPER_BEST}x: the largest ratio over any baseline here is "
                f"{top['largest']:.2f}x measured and {top['largest_predicted']:.2f}x predicted. A ratio beyond the "
                "predicted one would mean a baseline ran below its own optimum, so how close a sweep can come is "
                "set by the networks it runs (how unequal the links, how badly a baseline's fixed pattern "
                "loads the slow ones), not by the forest's execution.", ""]
    try:
        png = plots.predicted_measured_plot(table, out=out_dir / "forest_predicted_measured.png",
                                            formats=("png", "pdf"), sweep_dir=sweep_dir, run_ids=runs["run_id"])
        out += [f"![Predicted against measured]({png.name})", "",
                "Each point is one baseline at one network; on the solid line measured equals predicted, on "
                f"the dashed one it is {forest_compare.TARGET_AGREEMENT} of it. "
                f"{_figure_note(png)}", ""]
    except NoResults as e:
        out += [f"*Not drawn:* {e}.", ""]
    return out


def _forest_trees(runs: pd.DataFrame, sweep_dir: Path) -> list[str]:
    """Per forest run: each tree's planned against achieved rate and who set the iterations
    (analysis/forest_trees.py, from the run's scheduler_info.json); nothing where no run kept the record."""
    names = runs["scheduler_name"] if "scheduler_name" in runs else runs["scheduler"]
    forest = runs[names.isin(catalog.with_section(forest_trees.SECTION))]
    if forest.empty:
        return []
    labels = forest_compare.network_labels(forest, sweep_dir)
    per_run, per_tree = [], []
    for _, run in forest.iterrows():
        warmup = int(run.get("workload.warmup", 0) or 0)
        s = forest_trees.run_summary(Path(sweep_dir) / run["run_id"], warmup)
        if s is None:
            continue
        where = {"network": labels.get(run["run_id"], run["run_id"]),
                 "bandwidth": run.get("schedulers.forest.bandwidth") or "measured"}
        eff = run.get("efficiency")
        per_run.append({**where, "efficiency": "" if eff is None or pd.isna(eff) else f"{eff:.2f}",
                        "trees": len(s["trees"]), "set by tree": f"{s['setter_tree']} ({s['setter_share']})",
                        "its achieved / planned": f"{s['setter_of_planned']:.2f}",
                        "its pipeline share": f"{s['setter_pipeline_share']:.2f}",
                        "its slowest edge": s["setter_edge"], "links (tightest first)": s["setter_links"],
                        "physics violations": s["physics_violations"], "workers in record": s["ranks"]})
        for t in s["trees"].itertuples():
            per_tree.append({**where, "epoch": t.epoch, "tree": t.tree, "root": t.root, "depth": t.depth,
                             "fraction": f"{t.fraction:.3f}", "planned Mb/s": f"{t.planned_bps / 1e6:.1f}",
                             "achieved Mb/s": f"{t.achieved_bps / 1e6:.1f}", "of planned": f"{t.of_planned:.2f}",
                             "pipeline share": f"{t.pipeline_share:.2f}", "finish ms": f"{t.finish_s * 1e3:.0f}",
                             "set iterations": f"{t.set_iterations}/{t.iterations}", "slowest edge": t.slowest_edge,
                             "edge Mb/s": f"{t.slowest_bps / 1e6:.1f}", "links": t.slowest_links})
    if not per_run:
        return []
    return ["## Forest trees: planned against achieved", "",
            "Per forest run, over the measured iterations (the run's scheduler_info.json `trees`; "
            "analysis/forest_trees.py). A tree's achieved rate is its slice of the gradient over its all-reduce "
            "time (the longest, over workers, from a worker's first push to the tree's last average there): on "
            "plan, every tree finishes "
            "together at achieved = planned. Its pipeline share is what of that it reaches when each hop runs "
            "at the planned rate and forwards whole chunks: its slice over the slice plus (2 depth - 1) chunks. "
            "The tree that finishes last sets the iteration; its slowest edge "
            "(the rate of its stream there, first frame to last) and that edge's links, the plan's tightest "
            "first, say where it was held back. Physics violations: iterations in which the tree edges into a "
            "host (the hop a receiver times) carried more than that link's configured rate (a measurement bug).",
            "",
            md_table(pd.DataFrame(per_run), "forest_trees_runs"), "",
            md_table(pd.DataFrame(per_tree), "forest_trees"), ""]


def _replan(sweep_dir: Path, out_dir: Path) -> list[str]:
    """The re-planning figure and, per run, the optimum averaged over the run and what the
    probes took (analysis/replan.py), where a forest re-planned (nothing otherwise)."""
    try:
        png = plots.replan_plot(sweep_dir, out=out_dir / "replan.png", formats=("png", "pdf"))
    except NoResults:
        return []
    return ["## Forest re-planning", "", f"![Forest re-planning]({png.name})", "",
            "Iteration time of each forest run, per configuration: the forest that plans on what it measures "
            "(dotted lines: where a new plan took effect) beside the one that keeps the plan of the configured "
            f"rates. Each plan, its reason and the rates it assumed are in the run's scheduler_info.json. "
            f"{_figure_note(png)}", "", *replan_table(sweep_dir)]


def replan_table(sweep_dir: Path) -> list[str]:
    """Per forest run of a sweep where one re-planned: its iterations against the optimum of
    each iteration's own bandwidth, with and without its re-plans' probes."""
    runs = load_runs(sweep_dir, status="ok")
    runs = add_configurations(runs[runs["scheduler_name"].isin(catalog.with_section(plots.REPLAN))], sweep_dir)
    rows = []
    for _, run in runs.iterrows():
        s = replan_mod.summary(run, Path(sweep_dir) / run["run_id"])
        if s is None:
            continue
        bw = run.get(f"schedulers.{run['scheduler_name']}.bandwidth")
        rows.append({"configuration": run["config"], "bandwidth": bw if isinstance(bw, str) else "measured",
                     "of the optimum over the run": f"{s['of_instant_optimum']:.2f}",
                     "without the probes": f"{s['without_probes']:.2f}",
                     "after the last re-plan": "–" if pd.isna(s["after_last"]) else f"{s['after_last']:.2f}",
                     "re-plans (iteration: probe s)": ", ".join(f"{i}: {p:.2f}" for i, _, p in s["replans"]) or "–",
                     "probes' share of the time": f"{s['probe_share']:.1%}",
                     "efficiency (bound on the averaged capacity)": f"{run['efficiency']:.2f}"
                     if pd.notna(run.get("efficiency")) else "–"})
    if not rows:
        return []
    return ["Per run, over its measured iterations: their summed optimum, each on the bandwidth that iteration "
            "had (the run's bound model on the capacity averaged over the iteration; analysis/replan.py), over "
            "their summed times, so a probe and the slow iterations before a re-plan count; the same without "
            "the probes' time, and over the iterations after the last re-plan. The runs table's efficiency "
            "averages the capacity over the whole window instead, which lends the slow part the fast part's "
            "capacity: a lower bound, but one that a forest re-planning at once would still not reach.", "",
            md_table(pd.DataFrame(rows), "forest_replan"), ""]


def startup_table(table: pd.DataFrame) -> pd.DataFrame:
    """`startup.summary`'s numbers as the report shows them, one row per start-up cost (and
    configuration, where the sweep has several)."""
    def ms(v) -> str:
        return f"{v * 1e3:.0f}" if pd.notna(v) else "–"

    rows = []
    for _, r in table.iterrows():
        rows.append({"configuration": r["config"], "start-up (ms)": f"{r['startup_us'] / 1e3:g}",
                     "best bytescheduler partition": f"{int(r['best_partition']):,}"
                                                     if pd.notna(r["best_partition"]) else "–",
                     "bytescheduler best (ms)": ms(r["bytescheduler_best_s"]),
                     "largest partition (ms)": ms(r["bytescheduler_largest_s"]),
                     "partitioning gain": f"{r['partitioning_gain']:.2f}x" if pd.notna(r["partitioning_gain"]) else "–",
                     "mercury (ms)": ms(r["mercury_s"]), "fifo (ms)": ms(r["fifo_s"]), "p3 (ms)": ms(r["p3_s"]),
                     "mercury / bytescheduler best, 95% CI": _ci(r["mercury_over_best"], r["ci_low"], r["ci_high"],
                                                                 ".2f")})
    df = pd.DataFrame(rows)
    if df["configuration"].nunique() == 1:
        df = df.drop(columns=["configuration"])
    if (df["p3 (ms)"] == "–").all():
        df = df.drop(columns=["p3 (ms)"])
    return df


def _startup(runs: pd.DataFrame, iters: pd.DataFrame, sweep_dir: Path, out_dir: Path) -> list[str]:
    """Partitioning's gain against the start-up cost, where the sweep varies both the cost
    and bytescheduler's partition (nothing otherwise)."""
    if not _concerned(runs, startup.SECTION) or not startup.varies(runs):
        return []
    table = startup.summary(runs, iters)
    out = ["## Start-up cost: partitioning against Mercury", "",
           "The Mercury paper argues that a start-up slot before every tensor partition takes away what "
           "partitioning gains, while Mercury pays it once per tensor (its packets are segments of one stream). "
           "Each run's scheduler pays `startup_us` per message (`schedulers/ps/client.py`): bytescheduler and fifo per "
           "PUSH and PULL, p3 per slice, mercury once per tensor per iteration per server connection. Per start-up "
           "cost: bytescheduler's fastest partition and its iteration time, its time at its largest partition "
           "(the gain = largest / best), the other schedulers' times, and mercury's speed-up over the best "
           "bytescheduler (its time / mercury's) with a 95% interval (see Setup for the method). The best "
           "partition is the fastest measured, so its time is biased low where runs are few.", "",
           md_table(startup_table(table), "startup"), ""]
    try:
        png = plots.startup_plot(sweep_dir, out=out_dir / "startup.png", formats=("png", "pdf"))
        out += [f"![Start-up cost]({png.name})", "",
                "bytescheduler's iteration time against its partition size, one colour per start-up cost, with "
                "95% intervals; fifo, p3 and mercury at the same cost as horizontal lines of that colour. "
                f"{_figure_note(png)}", ""]
    except NoResults as e:
        out += [f"*Not drawn:* {e}.", ""]
    return out


def faults_table(table: pd.DataFrame) -> pd.DataFrame:
    """`faults.summary` as the report shows it."""
    def num(fmt):
        return lambda v: format(v, fmt) if pd.notna(v) else "–"

    out = table.assign(survived=table["survived"].astype(str) + "/" + table["runs"].astype(str))
    for col, fmt in (("median iteration (ms)", ".0f"), ("mean iteration (ms)", ".0f"), ("fault cost (s)", ".2f"),
                     ("longest stall (s)", ".1f"), ("named after (s)", ".1f")):
        out[col] = out[col].map(num(fmt))
    return out.drop(columns=["runs"])


def _faults(runs_all: pd.DataFrame, sweep_dir: Path, out_dir: Path) -> list[str]:
    """Injected faults: what each cost, what ended runs, and the figure (nothing without faults)."""
    if not faults_mod.has_faults(runs_all):
        return []
    table = faults_mod.summary(runs_all, faults_mod.load_faults(sweep_dir, runs_all))
    out = ["## Faults", "",
           "Faults injected on the run's timeline (`faults:`, emu/run/faults.py), per scenario and scheduler. "
           "Survived: runs that completed. Fault cost: per run, the measured iterations that overlap a fault "
           "(plus one median iteration for the recovery) less the median iteration, summed over its faults "
           "(median over runs). Longest stall: the longest time any role made no progress around a fault, "
           "as the watchdog saw it (to about 0.5 s). Named after: for runs a fault ended, the time from the "
           "fault to the run's reason. The median iteration hides a pause; the mean shows it.", "",
           md_table(faults_table(table), "faults"), ""]
    failed = runs_all[(runs_all["status"] != "ok") & faults_mod.with_scenarios(runs_all)["scenario"].ne(
        faults_mod.NONE)]
    for _, r in failed.iterrows():
        out.append(f"- {r['scheduler']}, {faults_mod.scenario(r['faults'])}: {r['reason']}")
    if len(failed):
        out.append("")
    try:
        png = plots.faults_plot(sweep_dir, out=out_dir / "faults.png", formats=("png", "pdf"))
        out += [f"![Faults]({png.name})", "",
                "Left: each scheduler's fault cost per scenario (a cross: the fault ended the run). Then, per "
                "scenario, one run's iteration time against the time since its roles were launched, the planned "
                f"fault spans shaded. {_figure_note(png)}", ""]
    except NoResults as e:
        out += [f"*Not drawn:* {e}.", ""]
    return out


def incast_table(table: pd.DataFrame) -> pd.DataFrame:
    """`incast.table` as the report shows it."""
    def num(col: str, fmt: str, scale: float = 1.0) -> pd.Series:
        return table[col].map(lambda v: format(v * scale, fmt) if pd.notna(v) else "–")

    return pd.DataFrame({
        "configuration": table["config"],
        "server link": [f"{incast_mod.fraction_text(f)} ({m:g} Mb/s)" for f, m in
                        zip(table["server_fraction"], table["server_mbps"], strict=True)],
        "scheduler": table["scheduler"], "runs": table["runs"],
        "iteration ms": num("iter_time_s", ".0f", 1e3), "bound ms": num("bound_s", ".0f", 1e3),
        "eff.": num("efficiency", ".2f"), "retrans./iter.": num("retrans_per_iter", ".1f"),
        "RTOs": num("timeouts", ".0f"), "drops": num("server_port_drops", ".0f"),
        "other drops": num("other_drops", ".0f"),
        "fidelity": [f"{p}/{j}" if j else "not judged" for p, j in
                     zip(table["fidelity_passed"], table["fidelity_judged"], strict=True)],
        "CPU idle min": num("cpu_idle_min", ".0%")})


def _incast(runs: pd.DataFrame, sweep_dir: Path, name: str) -> list[str]:
    """Per scheduler and server-link fraction, what incast cost: where the sweep takes the
    servers' links below the workers' sum, or is named incast (nothing otherwise)."""
    runs = incast_mod.with_fractions(runs, sweep_dir)
    if not incast_mod.applies(runs, name):
        return []
    table = incast_mod.table(runs, plots.scheduler_order(runs["scheduler"]))
    if table.empty:
        return []
    drop = ["configuration"] if incast_mod.one_config_per_fraction(table) else []
    return ["## Incast", "",
            "The parameter servers' links slower than the sum of their workers' links: when the workers push at "
            "once, the switch's port toward a server receives up to that sum, its queue overflows, and TCP "
            "resends what it dropped, after a tail loss only when its retransmission timer fires (200 ms at "
            "least). Per server-link fraction (the rate into the servers over the rate out of the workers) and "
            "scheduler, the iteration beside its bound (the parameter-server model on the same links, see "
            "Bounds) and what TCP and the queue counted (`emu/testbed/tcpcounters.py`).", "",
            md_table(incast_table(table), "incast", drop=drop), "",
            "Columns: iteration ms, the median over runs of each run's median iteration; bound ms and eff., the "
            "bound and bound / measured (means over runs); retrans./iter., TCP segments every host retransmitted "
            "over the whole run (warm-up and connection set-up included) divided by the iterations run; RTOs, "
            "retransmission timeouts in the run; drops, packets the queues of the switch's ports toward the "
            "servers dropped in the run; other drops, those every other queue dropped (a server's results "
            "bursting into one worker's port, a host's own egress queue) (these four: medians over runs); "
            "fidelity, runs that passed the verdict of those judged; CPU idle min, the machine's lowest idle "
            "fraction in a window of the measured iterations, over the runs (the fidelity verdict's CPU check).", ""]


def write_report(sweep_dir: Path, out_dir: Path | None = None, baseline: str | None = None, style: str = "screen",
                 width: float | None = None, commit: str | None = None, source: str | None = None) -> Path:
    """Write report.md, its figures and its tables' CSV and LaTeX into `out_dir` (default:
    <sweep>/report); returns its path. `baseline` None: the scheduler declared the baseline
    (analysis/catalog.py). `style`, `width`: the figures' (plots.figure_context); `commit`: the
    code drawing them, as the caller knows it (analysis reads stored files only); `source`: how
    to name the result set (default: the sweep directory)."""
    sweep_dir = Path(sweep_dir)
    out_dir = Path(out_dir) if out_dir else sweep_dir / "report"
    with plots.figure_context(style=style, width=width, commit=commit, source=source or str(sweep_dir)), \
            _exporting(out_dir):
        return _write_report(sweep_dir, out_dir, baseline)


def _write_report(sweep_dir: Path, out_dir: Path, baseline: str | None) -> Path:
    runs_all = load_runs(sweep_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    name = runs_all["sweep"].iloc[0] if len(runs_all) else sweep_dir.name
    md = [f"# Sweep `{name}`: gradient-communication schedulers compared", "",
          f"Generated by `./inv report {sweep_dir}` on {dt.date.today().isoformat()} from `{sweep_dir}/runs.parquet` "
          f"and the run directories. Figures are PNG (shown) and PDF (linked) beside this file.", ""]
    try:
        runs, iters = load_comparison(sweep_dir)
    except NoResults:
        md += ["**No run of this sweep completed**, so there is nothing to compare.", "", "## Fidelity", "",
               *_fidelity(runs_all)]
        path = out_dir / "report.md"
        path.write_text("\n".join(md) + "\n")
        return path
    baseline = catalog.baseline() if baseline is None else baseline  # after load_runs: its rows' records count
    runs = physics.ensure(runs, sweep_dir)  # bounds where a row has none, and the physics checks; in memory only
    runs_all = physics.carry(runs_all, runs)  # the verdicts the Fidelity section counts
    facts = config_facts(runs, sweep_dir)
    md += ["## Setup", "", *_setup(runs_all, runs, facts), *_provenance(sweep_dir, runs), ""]
    if swept_keys(runs):
        md += ["### Configurations", "", "What each configuration label in the tables and figures stands for: "
               "every swept key and its value.", "", md_table(configurations_legend(runs), "configurations"), ""]
    broken = physics.broken(runs)
    if len(broken) == len(runs):
        md += ["## Runs that break physics", "", *_physics(broken), "", "**Every completed run breaks physics**, "
               "so there is nothing to compare.", "", "## Fidelity", "", *_fidelity(runs_all), ""]
        path = out_dir / "report.md"
        path.write_text("\n".join(md))
        return path
    if len(broken):  # listed, not averaged: every table, speedup and figure below is of the other runs
        runs = runs[~runs["run_id"].isin(broken["run_id"])]
        iters = iters[iters["run_id"].isin(runs["run_id"])]
    md += ["## Summary", "", md_table(summary(runs, iters, baseline), "summary"), "",
           "Iteration time: geometric mean of the runs' median iteration times, or the median of pooled "
           "iterations (see Setup). Blocked: median time a worker waited for aggregates, as a "
           "share of the median iteration. Efficiency: the lower bound of the scheduler's model / measured "
           "(1 = as fast as that model allows; see Bounds). Fidelity: runs that passed the fidelity verdict, "
           "of those judged."
           + (f" {len(broken)} run(s) that break physics are left out (next section)." if len(broken) else ""), ""]
    if len(broken):
        md += ["## Runs that break physics", "", *_physics(broken), ""]
    md += ["## Bounds", "", *_bounds(runs), ""]
    md += ["## Figures", ""]
    for stem, heading, fn, caption in FIGURES:
        md += [f"### {heading}", ""]
        kw = {"baseline": baseline} if fn is plots.speedup_plot else {}
        if len(broken) and "run_ids" in inspect.signature(fn).parameters:
            kw["run_ids"] = runs["run_id"].tolist()
        try:
            png = fn(sweep_dir, out=out_dir / f"{stem}.png", formats=("png", "pdf"), **kw)
        except NoResults as e:  # includes plots.Skipped
            md += [f"*Not drawn:* {e}.", ""]
            continue
        md += [f"![{heading}]({png.name})", "", f"{caption} {_figure_note(png)}", ""]
    md += _forest(runs, sweep_dir, out_dir)
    md += _forest_trees(runs, sweep_dir)
    md += _replan(sweep_dir, out_dir)
    md += _startup(runs, iters, sweep_dir, out_dir)
    md += _faults(runs_all, sweep_dir, out_dir)
    md += _incast(runs, sweep_dir, name)
    md += ["## Fidelity", "", *_fidelity(runs_all), ""]
    md += ["## Paper claims beside this sweep", "", *_claims(runs, iters, facts), ""]
    md += ["## Reproduce", "", f"- This report: `./inv report {sweep_dir}`.",
           "- A figure from the tables in pandas: `notebooks/reproduce_figure.ipynb`.", ""]
    path = out_dir / "report.md"
    path.write_text("\n".join(md))
    return path
