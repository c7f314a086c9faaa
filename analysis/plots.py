"""Figures from tidy results. Reads only files (runs.parquet and per-run tables).

Every figure function takes a sweep's results directory, writes the figure to `out`
(default: a PNG in the sweep directory) in each of `formats` (e.g. ("png", "pdf")) and
returns the path of the first. Which key goes on the x axis is chosen from the sweep's
`point.*` columns (the swept numeric key with the most values, e.g. a link's bandwidth);
the other swept keys (e.g. the model) become panels, so any sweep can be plotted. A line
joins only points that differ in the x key alone (and in keys that rise or fall with it,
such as the other hosts' rates of one `zip`): where another key changes between them (a
`zip` of model and bandwidth) the figure has panels per that key, or a categorical axis
without lines.

How figures look and what they carry (`figure_context`): the screen style (titles, a width
per panel) or the paper style (no titles, a given total width in inches, TrueType fonts
embedded in the PDF), and the provenance the caller hands down (the commit that drew the
figure, the result set it came from) beside what the runs' meta.json files record (the
commit each run used, the machine's CPU model, cores and memory). It goes into each file's
metadata: PNG text chunks, the PDF's Subject and Keywords (`provenance_of` reads a PNG's back).
"""
from __future__ import annotations

import contextlib
import json
import re
import warnings
import zlib
from dataclasses import dataclass, field, replace
from pathlib import Path

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

from analysis import catalog  # noqa: E402
from analysis.replan import plan_records  # noqa: E402
from analysis.speedup import METHOD, iteration_times, load_comparison, speedups  # noqa: E402
from analysis.tables import NoResults, key_label, load_events, load_iterations, load_links, load_runs, swept_keys  # noqa: E402
from contracts.iterations import measured  # noqa: E402

# Colours: Okabe and Ito's colour-blind-safe palette (the figures draw reference lines in grey).
# A scheduler's declared `display_order` (analysis/catalog.py; a plugin's that clashes with
# another's moved past them, catalog.colour_slots) picks its colour, modulo the palette, so the
# eight built-ins look the same in every figure. Within one figure no two schedulers share a
# look: one whose colour another of the figure already has takes a free colour, and once the
# palette is spent, the colours again with another marker and line style (`_look`). A
# scheduler's variants (tables.variant_names) are shades of its colour.
OKABE_ITO = ["#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#000000", "#F0E442"]
PALETTE = [matplotlib.colors.to_rgb(c) for c in OKABE_ITO]
MARKERS = ["o", "s", "^", "D", "v", "P", "X"]
LINESTYLES = ["-", "--", "-.", ":"]


class Skipped(NoResults):
    """A figure that this sweep's data cannot support (e.g. no scheduler trace)."""


def _base(name: str) -> str:
    """The scheduler a variant's name starts with (its display name): `bytescheduler credit 256k`
    -> bytescheduler; the first word where no known scheduler's name starts it."""
    known = [i.display_name for i in catalog.infos().values()
             if name == i.display_name or name.startswith(i.display_name + " ")]
    return max(known, key=len) if known else name.split(" ", 1)[0]


def _declared_order(base: str) -> int | None:
    info = catalog.by_display_name(base)
    return None if info is None else info.display_order


def _unknown_from() -> int:
    """The first order after every known scheduler's (and colour after every known one's, clashes
    resolved by catalog.colour_slots): where schedulers no one declared go."""
    return max([i.display_order for i in catalog.infos().values()] + list(catalog.colour_slots().values()),
               default=-1) + 1


def _natural(text: str) -> tuple:
    """Sort key reading the numbers in a variant's name as numbers (64k before 256k before 1M)."""
    out = []
    for tok in re.split(r"(\d+(?:,\d{3})*(?:\.\d+)?[kM]?)", text):
        if tok and tok[0].isdigit():
            num = float(tok.rstrip("kM").replace(",", ""))
            out.append((0, num * {"k": 1 << 10, "M": 1 << 20}.get(tok[-1], 1), ""))
        elif tok:
            out.append((1, 0.0, tok))
    return tuple(out)


def scheduler_order(names) -> list[str]:
    """Schedulers in their declared order (`display_order`), unknown ones after, by name; a
    scheduler's variants (`bytescheduler (tuned)`, `bytescheduler credit 256k`) right after
    its plain name, in the order of their values."""
    names = list(dict.fromkeys(names))
    unknown = _unknown_from()

    def key(s: str):
        base = _base(s)
        rank = _declared_order(base)
        return unknown if rank is None else rank, base, s != base, _natural(s[len(base):])
    return sorted(names, key=key)


def _shade(rgb, t: float):
    """`rgb` darkened (t < 0) or lightened (t > 0), |t| <= 1, its hue kept."""
    r = np.asarray(rgb, dtype=float)
    return tuple(float(x) for x in (r * (1 + 0.55 * t) if t < 0 else r + (1 - r) * 0.6 * t))


def _slots(bases) -> dict[str, tuple[int, int]]:
    """Per scheduler drawn together: (its PALETTE index, its cycle): the declared colour where no
    scheduler before it in the figure has it, else a free one; cycle > 0 once the palette is
    spent (another marker and line style)."""
    bases = sorted(set(bases), key=lambda b: (_colour_index(b, bases), b))
    out: dict[str, tuple[int, int]] = {}
    overflow = []
    for b in bases:
        c = _colour_index(b, bases) % len(PALETTE)
        if c in {v[0] for v in out.values()}:
            overflow.append(b)
        else:
            out[b] = (c, 0)
    free = [c for c in range(len(PALETTE)) if c not in {v[0] for v in out.values()}]
    for k, b in enumerate(overflow):
        j = k - len(free)
        out[b] = (free[k], 0) if j < 0 else (j % len(PALETTE), 1 + j // len(PALETTE))
    return out


def _slot(name: str, among=()) -> tuple[int, int]:
    return _slots([*map(_base, among), _base(name)])[_base(name)]


def _look(name: str, among=()) -> dict:
    """matplotlib keywords of a scheduler's look in a figure with `among`: colour, marker, line style."""
    cycle = _slot(name, among)[1]
    return {"color": _colour(name, among), "marker": MARKERS[cycle % len(MARKERS)],
            "ls": LINESTYLES[cycle % len(LINESTYLES)]}


def _colour_index(base: str, among) -> int:
    """PALETTE's index of a scheduler: its declared order; one no scheduler declared takes the
    next free index, in name order among those drawn together (`among`)."""
    info = catalog.by_display_name(base)
    if info is not None:
        return catalog.colour_slots()[info.name]
    unknown = sorted({b for b in map(_base, [*among, base]) if _declared_order(b) is None})
    return _unknown_from() + unknown.index(base)


def _colour(name: str, among=()):
    """A scheduler's fixed colour; a variant of it a shade of that colour. With `among` (the
    names drawn together, or all of the figure's runs, so that shades agree across figures)
    the variants of one scheduler get evenly spread shades, the plain name (or a lone variant)
    keeping the scheduler's own; without it a shade picked by the name."""
    base = _base(name)
    colour = PALETTE[_slot(name, among)[0]]
    if name == base:
        return colour
    family = [s for s in scheduler_order(list(among) + [name]) if _base(s) == base]
    variants = [s for s in family if s != base]
    k, j = len(variants), variants.index(name)
    if not len(among):  # no company known: a shade that this name picks
        return _shade(colour, (zlib.crc32(name.encode()) % 7 - 3) / 3.5)
    if len(family) == 1:  # the only one of its scheduler here
        return colour
    if base in family:  # the plain name is drawn too: shades on both sides of it
        m = -(-k // 2)
        return _shade(colour, (j // 2 + 1) / m * (1 if j % 2 == 0 else -1) * 0.85)
    return _shade(colour, -0.8 + 1.6 * j / (k - 1))


# --------------------------------------------------------------------------- style and provenance
STYLES = ("screen", "paper")
PAPER_WIDTH = 3.5  # inches: one column of a two-column paper


@dataclass(frozen=True)
class FigureContext:
    """How figures are drawn and what they say of their origin (see the module's docstring)."""

    style: str = "screen"
    width: float | None = None  # inches, the whole figure; None: the style's own (paper: PAPER_WIDTH)
    commit: str | None = None   # the code that drew the figure (git short SHA, "+dirty"), from the caller
    source: str | None = None   # the result set the figure came from, as the caller names it
    extra: dict = field(default_factory=dict)  # more metadata keys (text) for every figure


_CONTEXT = FigureContext()


@contextlib.contextmanager
def figure_context(**kw):
    """Figures drawn inside get this style and provenance (FigureContext's fields)."""
    global _CONTEXT
    before = _CONTEXT
    if kw.get("style", "screen") not in STYLES:
        raise ValueError(f"style {kw['style']!r}: one of {', '.join(STYLES)}")
    _CONTEXT = replace(before, **kw)
    try:
        yield _CONTEXT
    finally:
        _CONTEXT = before


def _paper() -> bool:
    return _CONTEXT.style == "paper"


def _width() -> float | None:
    return _CONTEXT.width or (PAPER_WIDTH if _paper() else None)


def _figsize(w: float, h: float) -> tuple[float, float]:
    """A screen figure's size, or in the paper style the given width at the same aspect ratio."""
    width = _width()
    return (w, h) if width is None else (width, width * h / w)


def _theme() -> None:
    if _paper():
        sns.set_theme(style="ticks", context="paper", font_scale=0.8)
        plt.rcParams.update({"pdf.fonttype": 42, "ps.fonttype": 42, "font.family": "DejaVu Sans",
                             "axes.grid": True, "grid.linewidth": 0.4, "lines.linewidth": 1.0,
                             "lines.markersize": 3.5, "legend.frameon": False})
    else:
        sns.set_theme(style="whitegrid", context="notebook", font_scale=0.9)
        plt.rcParams.update({"pdf.fonttype": 42, "ps.fonttype": 42})


def _facet(ax, text: str | None, **kw) -> None:
    """A panel's label (what tells it from the other panels): kept in the paper style, unlike titles."""
    ax.set_title(text or "", **kw)
    ax._schedlab_facet = True


def machine_text(metas: list[dict]) -> str:
    """The machines that the runs of a figure measured on (meta.json), e.g. 'AMD EPYC, 2 cores, 23.5 GiB'."""
    seen = []
    for m in metas:
        mem = m.get("memory_bytes")
        text = ", ".join([m.get("cpu_model") or "CPU model not recorded", f"{m.get('cpus', '?')} cores",
                          f"{mem / 2**30:.1f} GiB" if mem else "memory not recorded"])
        if text not in seen:
            seen.append(text)
    return "; ".join(seen) or "not recorded"


def measured_commits(metas: list[dict]) -> str:
    """The commits the runs used (meta.json git_sha, '+dirty' where the tree had changes)."""
    shas = sorted({(m.get("git_sha") or "unknown")[:7] + ("+dirty" if m.get("git_dirty") else "") for m in metas})
    return ", ".join(shas) or "not recorded"


def _metas(sweep_dir: Path | None, run_ids) -> list[dict]:
    out = []
    for rid in dict.fromkeys(run_ids if run_ids is not None else []):
        p = Path(sweep_dir) / str(rid) / "meta.json" if sweep_dir is not None else None
        if p is not None and p.exists():
            out.append(json.loads(p.read_text()))
    return out


def _provenance(sweep_dir: Path | None, run_ids, description: str) -> dict[str, str]:
    metas = _metas(sweep_dir, run_ids)
    meta = {"Description": description, "Commit": _CONTEXT.commit or "not given",
            "Measured at": measured_commits(metas), "Machine": machine_text(metas),
            "Source": _CONTEXT.source or (str(sweep_dir) if sweep_dir is not None else "not given"),
            "Style": _CONTEXT.style, **_CONTEXT.extra}
    return {k: str(v).encode("latin-1", "replace").decode("latin-1") for k, v in meta.items()}


def provenance_of(png: Path) -> dict[str, str]:
    """The provenance text a figure's PNG carries (its tEXt chunks)."""
    from PIL import Image

    with Image.open(png) as im:
        return dict(getattr(im, "text", {}) or im.info)


def provenance_caption(png: Path) -> str:
    """A caption's provenance sentence for a figure, from its own metadata."""
    m = provenance_of(png)
    return (f"Drawn at commit {m.get('Commit', 'not given')} from {m.get('Source', 'not given')}; runs measured at "
            f"commit {m.get('Measured at', 'not recorded')} on {m.get('Machine', 'not recorded')}.")


def _save(fig, out: Path, formats: tuple[str, ...], sweep_dir: Path | None = None, run_ids=None,
          description: str = "") -> Path:
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if not description and fig._suptitle is not None:
        description = fig._suptitle.get_text().replace("\n", "; ")
    title = next((ax.get_title() for ax in fig.axes if ax.get_title()), "") or description.split("; ")[0]
    meta = _provenance(sweep_dir, run_ids, description)
    if _paper():  # no titles: the caption says it; panels keep their labels
        if fig._suptitle is not None:
            fig._suptitle.set_text("")
        for ax in fig.axes:
            if not getattr(ax, "_schedlab_facet", False):
                ax.set_title("")
        fig.tight_layout()
    paths = [out.with_suffix(f".{fmt}") for fmt in formats]
    for p in paths:
        if p.suffix == ".pdf":
            md = {"Title": title, "Subject": meta["Description"] + " | " + "; ".join(
                f"{k}: {v}" for k, v in meta.items() if k != "Description"),
                  "Keywords": "; ".join(f"{k}={meta[k]}" for k in ("Commit", "Measured at", "Machine", "Source")),
                  "Creator": f"schedlab {meta['Commit']}"}
        elif p.suffix == ".png":
            md = {"Title": title, "Software": f"schedlab {meta['Commit']}", **meta}
        else:
            md = None
        fig.savefig(p, dpi=300 if _paper() else 150, bbox_inches="tight", metadata=md)
    plt.close(fig)
    return paths[0]


def _ps_family(run) -> bool:
    info = catalog.of_run(run)
    if info is not None:
        return info.family == "parameter_server"
    try:
        return bool(json.loads(run["roles.servers"]))
    except (KeyError, TypeError, ValueError):
        return False


def _span(values) -> str:
    vals = sorted({int(v) for v in values if pd.notna(v)})
    return "?" if not vals else str(vals[0]) if len(vals) == 1 else f"{vals[0]}–{vals[-1]}"


def _facts(runs: pd.DataFrame) -> dict[str, str]:
    """What the runs have in common, fact by fact: the model (and its size), the roles (workers;
    parameter servers only for the PS-family schedulers among them), the network."""
    r = runs.iloc[0]
    models = ", ".join(sorted(runs["workload.model"].astype(str).unique()))
    presets = ", ".join(sorted(runs["workload.preset"].astype(str).unique())) if "workload.preset" in runs else ""
    params = f", {r['num_params'] / 1e6:.2g}M params" if "num_params" in runs and runs["num_params"].nunique() == 1 \
        else ""
    ps = runs[[_ps_family(row) for _, row in runs.iterrows()]]
    workers = f"{_span(runs['num_workers'])} workers" if "num_workers" in runs else "workers not recorded"
    servers = _span(ps["roles.servers"].map(lambda v: len(json.loads(v)) if isinstance(v, str) else 0)) \
        if len(ps) else ""
    if not len(ps):
        roles = workers
    elif len(ps) == len(runs):
        roles = f"{workers} + {servers} PS"
    else:
        roles = f"{workers} (+ {servers} PS for {', '.join(scheduler_order(ps['scheduler']))})"
    nets = runs["network"].dropna().unique() if "network" in runs else []
    kinds = ", ".join(sorted(runs["topology.kind"].dropna().astype(str).unique())) if "topology.kind" in runs else ""
    net = nets[0] if len(nets) == 1 else "network varies per configuration" if len(nets) else "network not recorded"
    return {"model": f"{models} ({presets}{params})", "roles": roles, "network": f"{kinds}: {net}" if kinds else net}


def _setting(runs: pd.DataFrame) -> str:
    """What was measured, for titles: model, size, roles, topology, and the network if fixed."""
    return ", ".join(_facts(runs).values())


def _settings(runs: pd.DataFrame, panels: list[pd.DataFrame]) -> tuple[str, list[str]]:
    """(the facts every panel shares, for the figure's title; per panel, the facts of its own runs
    that the others do not share): so that no subtitle states what one of its panels contradicts."""
    per = [_facts(p) if len(p) else {} for p in panels]
    keys = list(_facts(runs))
    common = [k for k in keys if len({f.get(k) for f in per}) == 1]
    shared = ", ".join(per[0][k] for k in common) if per and per[0] else _setting(runs)
    return shared, [", ".join(f[k] for k in keys if k not in common and k in f) for f in per]


def _follows(runs: pd.DataFrame, key: str, x: str, panels: list[str]) -> bool:
    """Within every panel, `key` is constant, or numeric and strictly rising or falling with the x
    key (the other hosts' rates of a `zip` with the x host's): a line along x changes it as x."""
    by = [f"point.{c}" for c in panels]
    groups = runs.groupby(by, dropna=False) if by else [(None, runs)]
    for _, g in groups:
        pairs = g[[f"point.{x}", f"point.{key}"]].astype(str).drop_duplicates()
        if pairs[f"point.{key}"].nunique() <= 1:
            continue
        k = pd.to_numeric(pairs[f"point.{key}"], errors="coerce")
        if k.isna().any():
            return False
        d = k.iloc[np.argsort(pd.to_numeric(pairs[f"point.{x}"]).to_numpy())].diff().dropna()
        if not ((d > 0).all() or (d < 0).all()):
            return False
    return True


def _layout(runs: pd.DataFrame) -> tuple[str | None, list[str]]:
    """(numeric swept key for the x axis or None, the other swept keys -> panels). A line along
    x joins points that differ in x alone (and keys that follow it, `_follows`): a key that
    changes otherwise between them (a model zipped with the bandwidth) makes panels of its
    values where each still has two x values or more, else the axis categorical (None, one
    category per configuration, no line)."""
    keys = swept_keys(runs)
    numeric = [k for k in keys if pd.to_numeric(runs[f"point.{k}"], errors="coerce").notna().all()]
    x = max(numeric, key=lambda k: (runs[f"point.{k}"].nunique(), "mbps" in k), default=None)
    # Keys swept together (a `zip:`) are determined by the x key and the panels already
    # chosen: they would only split panels into one-point slivers. Categorical keys first.
    panels: list[str] = []
    others = sorted((k for k in keys if k != x), key=lambda k: (k in numeric, runs[f"point.{k}"].nunique(), k))
    for k in others:
        by = [f"point.{c}" for c in ([x] if x else []) + panels]
        determined = bool(by) and (runs.groupby(by, dropna=False)[f"point.{k}"].nunique(dropna=False) <= 1).all()
        if not determined:
            panels.append(k)
    if x is not None:
        apart = [k for k in keys if k != x and k not in panels and not _follows(runs, k, x, panels)]
        if apart:
            by = [f"point.{c}" for c in panels + apart]
            if runs.groupby(by, dropna=False)[f"point.{x}"].nunique().min() >= 2:
                return x, panels + apart
            return None, []
    return x, panels


def _panel_labels(table: pd.DataFrame, keys: list[str], runs: pd.DataFrame) -> list[str]:
    """Each table row's values of the facet keys, as the configurations' short labels name them
    (labelled once, among the runs' points, not again per row)."""
    from analysis.tables import host_names
    from contracts.point_label import point_from_columns, short_labels

    def point(r) -> dict:
        return point_from_columns({f"point.{k}": r[f"point.{k}"] for k in keys})

    rows = [point(r) for _, r in table.iterrows()]
    return short_labels([point(r) for _, r in runs.iterrows()] + rows, host_names(runs))[len(runs):]


def _axes(n: int, width: float = 4.6, height: float = 3.6, sharey: bool = True):
    """n panels, at most 3 a row (paper style: at most 2, the whole figure as wide as given)."""
    ncols = min(n, 2 if _paper() else 3)
    nrows = -(-n // ncols)
    total = _width()
    size = (width * ncols + 0.6, height * nrows + 0.8) if total is None else \
        (total, total / ncols * height / width * nrows + 0.3)
    fig, axes = plt.subplots(nrows, ncols, figsize=size, sharey=sharey, squeeze=False)
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    return fig, list(axes.flat[:n])


def _x_positions(table: pd.DataFrame, x_key: str | None, runs: pd.DataFrame):
    """(x value per row, tick positions, tick labels, log scale?, axis label)."""
    if x_key is None:  # no numeric key: one category per configuration
        cats = list(dict.fromkeys(table["config"]))
        pos = table["config"].map({c: i for i, c in enumerate(cats)}).astype(float)
        return pos, list(range(len(cats))), cats, False, "configuration"
    vals = pd.to_numeric(table[f"point.{x_key}"]).astype(float)
    uniq = sorted(vals.unique())
    log = uniq[0] > 0 and uniq[-1] / uniq[0] >= 4
    return vals, uniq, [f"{v:g}" for v in uniq], log, key_label(x_key, runs)


def _dodge(x: pd.Series, i: int, k: int, log: bool, span: float) -> pd.Series:
    off = i - (k - 1) / 2
    return x * (1.04 ** off) if log else x + off * 0.025 * (span or 1.0)


def _interval_plot(table: pd.DataFrame, runs: pd.DataFrame, y: str, scale: float, ylabel: str, title: str,
                   out: Path, formats, ref: float | None = None, ref_label: str = "", times: bool = False,
                   sweep_dir: Path | None = None) -> Path:
    """Shared by the speedup and iteration-time figures: estimate +- CI per scheduler against
    the swept key, one panel per value of the other swept keys. `times`: panels get their
    own y axis (models differ in scale), logarithmic where a panel spans 4x or more."""
    _theme()
    x_key, panel_keys = _layout(runs)
    table = table.assign(_panel=_panel_labels(table, panel_keys, runs))
    panels = list(dict.fromkeys(table["_panel"]))
    shared, own = _settings(runs, [runs[runs["config_id"].isin(table.loc[table["_panel"] == p, "config_id"])]
                                   for p in panels])
    fig, axes = _axes(len(panels), sharey=not times)
    scheds = scheduler_order(table["scheduler"])
    for ax, panel, facts in zip(axes, panels, own):
        sub = table[table["_panel"] == panel]
        xs, ticks, labels, log, xlabel = _x_positions(sub, x_key, runs)
        span = (max(ticks) - min(ticks)) if len(ticks) > 1 else 1.0
        for i, s in enumerate(scheds):
            m = (sub["scheduler"] == s).to_numpy()
            if not m.any():
                continue
            d = sub[m].assign(_x=xs[m]).sort_values("_x")
            est, lo, hi = d[y] * scale, d["ci_low"] * scale, d["ci_high"] * scale
            err = np.vstack([(est - lo).clip(lower=0).fillna(0), (hi - est).clip(lower=0).fillna(0)])
            look = _look(s, runs["scheduler"])
            xs_i = _dodge(d["_x"], i, len(scheds), log, span) if x_key else \
                d["_x"] + (i - (len(scheds) - 1) / 2) * min(0.12, 0.8 / len(scheds))  # within its category
            ax.errorbar(xs_i, est, yerr=err, marker=look["marker"],
                        ms=3.5 if _paper() else 5, capsize=2.5 if _paper() else 4, lw=1.0 if _paper() else 1.6,
                        color=look["color"], ls=look["ls"] if x_key else "none", label=s)
        if ref is not None:
            ax.axhline(ref, color="0.35", ls="--", lw=1, label=ref_label)
        if log:
            ax.set_xscale("log")
            ax.minorticks_off()
        if x_key is None:  # categories: each label wrapped, the axis a category wide on each side of them
            import textwrap

            labels = [textwrap.fill(str(t), 22) for t in labels]
            ax.set_xlim(-0.5, len(ticks) - 0.5)
        ax.set_xticks(ticks, labels, rotation=0 if x_key or len(ticks) <= 3 else 20,
                      ha="center" if x_key or len(ticks) <= 3 else "right")
        ax.set(xlabel=xlabel, ylabel=ylabel)
        said = panel if panel and panel not in (facts or "") else ""  # "4 workers" is in "4 workers (+ 1 PS ...)"
        _facet(ax, "\n".join(t for t in (said, facts) if t) or None, fontsize=8 if _paper() else 10)
        scope = sub if times else table
        top = pd.concat([scope[y], scope["ci_high"]]).max() * scale
        low = pd.concat([scope[y], scope["ci_low"]]).min() * scale
        if times and low > 0 and top / low >= 4:
            ax.set_yscale("log")
            ax.set_ylim(low / 1.3, top * 2.0)  # room for the legend above the highest interval
            plain = matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}" if f"{v:g}"[0] in "125" else "")
            ax.yaxis.set_major_formatter(plain)
            ax.yaxis.set_minor_formatter(plain)
        else:
            ax.set_ylim(0, top * 1.25)
    axes[0].legend(title="scheduler", fontsize=6 if _paper() else 8, title_fontsize=6 if _paper() else 8)
    how = "; ".join(METHOD[u] for u in sorted(table["unit"].unique()))
    ci = f"{table['confidence'].iloc[0]:.0%} CI: {how}; warm-up excluded"
    fig.suptitle(f"{title}\n{shared}\n{ci}", fontsize=9)
    fig.tight_layout()
    return _save(fig, out, formats, sweep_dir, runs["run_id"], description=f"{title}; {shared}; {ci}"
                 + "".join(f"; panel {p or 1}: {f}" for p, f in zip(panels, own) if f))


def speedup_plot(sweep_dir: Path, out: Path | None = None, baseline: str | None = None,
                 run_ids: list[str] | None = None, formats: tuple[str, ...] = ("png",)) -> Path:
    """Speedup of each scheduler over `baseline` (None: the declared one) on the same
    configuration, with 95% CIs, against the swept key (e.g. bandwidth), one panel per other
    swept key (e.g. model)."""
    sweep_dir = Path(sweep_dir)
    runs, iters = load_comparison(sweep_dir, run_ids)
    baseline = catalog.baseline() if baseline is None else baseline
    table = speedups(runs, iters, baseline=baseline)
    if table.empty:
        raise Skipped(f"{sweep_dir}: no configuration has runs of both {baseline!r} and another scheduler")
    return _interval_plot(table, runs, "speedup", 1.0, f"speedup over {baseline} (x)",
                          f"{runs['sweep'].iloc[0]}: speedup over {baseline} on the same configuration",
                          out or sweep_dir / "speedup.png", formats, ref=1.0, ref_label=f"{baseline} (1x)",
                          sweep_dir=sweep_dir)


def iteration_time_sweep_plot(sweep_dir: Path, out: Path | None = None, run_ids: list[str] | None = None,
                              formats: tuple[str, ...] = ("png",)) -> Path:
    """Iteration time of each scheduler against the swept key, with 95% CIs."""
    sweep_dir = Path(sweep_dir)
    runs, iters = load_comparison(sweep_dir, run_ids)
    table = iteration_times(runs, iters)
    return _interval_plot(table, runs, "iter_time_s", 1e3, "iteration time (ms)",
                          f"{runs['sweep'].iloc[0]}: iteration time per scheduler",
                          out or sweep_dir / "iteration_time_sweep.png", formats, times=True, sweep_dir=sweep_dir)


# --------------------------------------------------------------------------- timeline
def _chunk_spans(ev: pd.DataFrame) -> pd.DataFrame:
    """Per (key, chunk): first send and the matching result's arrival (that chunk's recv,
    else the key's last recv: collective schedulers report one recv per tensor)."""
    send = ev[ev["event"] == "send"].groupby(["key", "chunk"])["t"].min().rename("send")
    recv = ev[ev["event"] == "recv"]
    by_chunk = recv.groupby(["key", "chunk"])["t"].max().rename("recv")
    by_key = recv.groupby("key")["t"].max()
    spans = send.to_frame().join(by_chunk, how="left").reset_index()
    spans["recv"] = spans["recv"].fillna(spans["key"].map(by_key))
    return spans.dropna(subset=["recv"])


def _pick_timeline_runs(runs: pd.DataFrame, sweep_dir: Path, config_id: str | None) -> pd.DataFrame:
    traced = runs[[load_events(sweep_dir, r) is not None for r in runs["run_id"]]]
    if traced.empty:
        raise Skipped("no run of this sweep was traced (set `trace: true` in the config to record "
                      "send/recv events); the communication timeline is left out")
    if config_id is None:
        # The configuration with the most traced schedulers; among those, the most
        # communication-bound (longest median iteration), where scheduling matters most.
        score = traced.groupby("config_id").agg(n=("scheduler", "nunique"), t=("iter_time_median_s", "mean"))
        config_id = score.sort_values(["n", "t"], ascending=False).index[0]
    chosen = traced[traced["config_id"] == config_id]
    if chosen.empty:
        raise Skipped(f"configuration {config_id} has no traced run")
    return chosen.sort_values("repeat").groupby("scheduler", sort=False).head(1)


def timeline_plot(sweep_dir: Path, out: Path | None = None, config_id: str | None = None, rank: int = 0,
                  iteration: int | None = None, run_ids: list[str] | None = None,
                  formats: tuple[str, ...] = ("png",)) -> Path:
    """Per-tensor communication of one iteration's gradients on one worker, one panel per
    scheduler: a bar per chunk from its push being sent to its aggregate arriving, tensors
    in priority order (key 0, the input side, at the top). Time 0 is the start of the next
    iteration's forward pass, which needs the aggregates layer by layer, so a bar that ends
    late on a top row is what stalls training; pushes made during the backward pass are at
    t < 0, and the iteration ends when its last aggregate is applied (contracts/iterations.py).
    Unless `iteration` is given, the iteration shown is the measured one (followed by another)
    whose time is closest to the median. Raises Skipped without a trace."""
    from analysis.tables import add_configurations

    _theme()
    sweep_dir = Path(sweep_dir)
    runs = add_configurations(load_runs(sweep_dir, status="ok", run_ids=run_ids), sweep_dir)
    chosen = _pick_timeline_runs(runs, sweep_dir, config_id)
    chosen = chosen.set_index("scheduler").loc[scheduler_order(chosen["scheduler"])].reset_index()
    n_keys = int(chosen["num_tensors"].max())
    panel_h = min(max(0.3 * n_keys, 2.4), 7.0)  # a 200-tensor model still fits a page
    fig, axes = plt.subplots(len(chosen), 1, figsize=_figsize(10, panel_h * len(chosen) + 1.4), sharex=True,
                             squeeze=False)
    host = json.loads(chosen.iloc[0]["roles.workers"])[rank]
    x_min, x_max = 0.0, 0.0
    for ax, (_, run) in zip(axes[:, 0], chosen.iterrows()):
        its = pd.read_parquet(sweep_dir / run["run_id"] / "iterations.parquet")
        its = its[its["rank"] == rank].set_index("iteration").sort_index()
        dur = its["end"] - its["start"]
        # candidates: measured iterations followed by another, whose forward pass is time 0
        shown = dur[measured(dur.index, run["workload.warmup"], run["workload.iterations"])
                    & (dur.index < dur.index.max())]
        if iteration is not None:
            it = iteration
        elif len(shown):
            it = int((shown - shown.median()).abs().idxmin())
        else:
            it = int(dur.index.max()) - 1
        if it + 1 not in its.index or it not in its.index:
            raise Skipped(f"run {run['run_id']}: no iteration {it + 1} after iteration {it}")
        # older tables have no forward_start: their iterations began with the forward pass
        t0 = its.loc[it + 1, "forward_start" if "forward_start" in its else "start"]
        ev = load_events(sweep_dir, run["run_id"])
        spans = _chunk_spans(ev[(ev["rank"] == rank) & (ev["iteration"] == it)])
        # chunks of one tensor side by side within its row, in chunk order
        spans = spans.sort_values(["key", "chunk"])
        spans["j"] = spans.groupby("key").cumcount()
        spans["h"] = 0.8 / spans.groupby("key")["chunk"].transform("size")
        ax.barh(spans["key"] - 0.4 + spans["j"] * spans["h"], (spans["recv"] - spans["send"]) * 1e3,
                left=(spans["send"] - t0) * 1e3, height=spans["h"] * 0.9, align="edge",
                color=_colour(run["scheduler"], runs["scheduler"]), edgecolor="none", alpha=0.85)
        end = (its.loc[it, "end"] - t0) * 1e3
        ax.axvline(0, color="0.3", ls="--", lw=1, label=f"iteration {it + 1}'s forward pass starts")
        ax.axvline(end, color="0.3", ls=":", lw=1.2, label=f"iteration {it} ends (its last aggregate applied)")
        if len(spans):
            x_min = min(x_min, float((spans["send"].min() - t0) * 1e3))
            x_max = max(x_max, end, float((spans["recv"].max() - t0) * 1e3))
        ax.set_yticks(range(0, n_keys, max(1, n_keys // 16)))
        ax.set_ylim(n_keys - 0.5, -0.6)
        ax.set_ylabel("tensor key\n(0 = input side)")
        median = dur[measured(dur.index, run["workload.warmup"], run["workload.iterations"])].median()
        _facet(ax, f"{run['scheduler']}: gradients of iteration {it} ({len(spans)} chunks); iteration {it} "
               f"took {dur.loc[it] * 1e3:.0f} ms (run median {median * 1e3:.0f} ms)", fontsize=9, loc="left")
        ax.legend(fontsize=7, loc="lower right")
        ax.grid(axis="y", visible=False)
    axes[-1, 0].set_xlabel(f"time since the next iteration's forward pass started on worker {rank} ({host}) (ms)")
    pad = (x_max - x_min) * 0.03
    axes[-1, 0].set_xlim(x_min - pad, x_max + pad)
    first = chosen.iloc[0]
    fig.suptitle(f"{first['sweep']}: gradient communication of one iteration, {first['config']}\n"
                 f"{_setting(runs[runs['config_id'] == first['config_id']])}\n"
                 "bar: a chunk's push handed to the socket -> its aggregate received", fontsize=9)
    fig.tight_layout()
    return _save(fig, out or sweep_dir / "timeline.png", formats, sweep_dir, chosen["run_id"])


# --------------------------------------------------------------------------- links
def _pick_link_run(runs: pd.DataFrame) -> pd.Series:
    """A run whose bandwidth varies (shaping or cross traffic) if any; else the baseline's run
    (or any) of the most communication-bound configuration."""
    dyn = runs[(runs.get("shaping_changes", pd.Series(0, index=runs.index)).fillna(0) > 0)
               | (runs.get("cross_traffic", pd.Series("", index=runs.index)).fillna("").astype(str) != "")]
    pool = dyn if len(dyn) else runs
    slow = pool.sort_values("iter_time_median_s", ascending=False)
    base = slow[slow["scheduler"] == catalog.declared_baseline()]
    return (base if len(base) else slow).iloc[0]


def link_utilisation_plot(sweep_dir: Path, out: Path | None = None, run_id: str | None = None,
                          max_links: int = 6, formats: tuple[str, ...] = ("png",)) -> Path:
    """Send rate of the busiest link directions of one run over time, with the configured
    rate (the bandwidth trace, when shaped) overlaid."""
    from analysis.tables import add_configurations

    _theme()
    sweep_dir = Path(sweep_dir)
    runs = add_configurations(load_runs(sweep_dir, status="ok"), sweep_dir)
    if run_id is None:
        run = _pick_link_run(runs)
    else:
        if run_id not in set(runs["run_id"]):
            raise NoResults(f"{sweep_dir}: no completed run {run_id}")
        run = runs.set_index("run_id").loc[run_id].rename(run_id)
        run["run_id"] = run_id
    links = load_links(sweep_dir, run["run_id"])
    links = links.assign(mbps=links["tx_bytes_per_s"] * 8 / 1e6, conf_mbps=links["configured_bps"] / 1e6)
    t_step = links.groupby("link")["t"].diff().median()
    volume = (links["tx_bytes_per_s"] * t_step).groupby(links["link"]).sum().sort_values(ascending=False)
    busy = [ln for ln in volume.index if volume[ln] > 0][:max_links]
    if not busy:
        raise Skipped(f"run {run['run_id']}: no link carried traffic")
    fig, axes = _axes(len(busy), width=5.0, height=2.6, sharey=False)
    for ax, ln in zip(axes, busy):
        d = links[links["link"] == ln].sort_values("t")
        ax.fill_between(d["t"], d["mbps"], step="post", color=_colour(run["scheduler"]), alpha=0.35, lw=0)
        ax.step(d["t"], d["mbps"], where="post", color=_colour(run["scheduler"]), lw=1, label="sent")
        ax.step(d["t"], d["conf_mbps"], where="post", color="k", ls="--", lw=1.2, label="configured rate")
        active = d[d["mbps"] > 0.01 * d["conf_mbps"]]
        util = (active["mbps"] / active["conf_mbps"]).mean() if len(active) else 0.0
        _facet(ax, f"{ln}: {volume[ln] / 1e6:.1f} MB sent, {util:.0%} of the rate while sending", fontsize=9)
        ax.set(xlabel="time since the monitor started (s)", ylabel="rate (Mb/s)")
        ax.set_ylim(0, max(d["conf_mbps"].max(), d["mbps"].max()) * 1.15)
    axes[0].legend(fontsize=8, loc="upper right")
    left_out = len([v for v in volume if v > 0]) - len(busy)
    more = f"; {left_out} quieter link direction(s) not shown" if left_out > 0 else ""
    fig.suptitle(f"{run['sweep']}: link utilisation of run {run['run_id']} ({run['scheduler']}, {run['config']}, "
                 f"repeat {run['repeat']})\n{run.get('network', '')}; sampled every {t_step:.2g} s, "
                 f"warm-up included{more}", fontsize=9)
    fig.tight_layout()
    return _save(fig, out or sweep_dir / "link_utilisation.png", formats, sweep_dir, [run["run_id"]])


# --------------------------------------------------------------------------- bounds
def efficiency_plot(sweep_dir: Path, out: Path | None = None, run_ids: list[str] | None = None,
                    formats: tuple[str, ...] = ("png",)) -> Path:
    """Measured iteration time of each run (median; the mean where its bandwidth varied, see
    analysis/bounds.py) against the lower bound of its scheduler's model (left), and
    efficiency = bound / measured per scheduler against the swept key (right)."""
    from analysis.bounds import annotate
    from analysis.tables import add_configurations

    _theme()
    sweep_dir = Path(sweep_dir)
    runs = add_configurations(load_runs(sweep_dir, status="ok", run_ids=run_ids), sweep_dir)
    everyone = runs["scheduler"]  # shades as in the other figures
    if "bound_model" not in runs or runs["bound_model"].isna().any():
        runs = annotate(runs, sweep_dir)  # in memory; `./inv run` stores them in runs.parquet
    runs = runs[runs["efficiency"].notna()]
    if runs.empty:
        raise Skipped("no completed run has a bound")
    runs = runs.assign(_measured=runs["bound_s"] / runs["efficiency"])  # median, or mean where it varied
    scheds = scheduler_order(runs["scheduler"])
    looks = {s: _look(s, everyone) for s in scheds}
    colours = {s: v["color"] for s, v in looks.items()}
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=_figsize(11, 4.4))
    lim = [min(runs["bound_s"].min(), runs["_measured"].min()) * 1e3 * 0.7,
           max(runs["bound_s"].max(), runs["_measured"].max()) * 1e3 * 1.4]
    ax1.plot(lim, lim, color="k", lw=1, label="measured = bound")
    ax1.plot(lim, [2 * v for v in lim], color="0.5", lw=1, ls=":", label="2 x bound")
    for s in scheds:
        d = runs[runs["scheduler"] == s]
        ax1.scatter(d["bound_s"] * 1e3, d["_measured"] * 1e3, color=colours[s], marker=looks[s]["marker"], s=28,
                    label=s, alpha=0.85)
    ax1.set(xscale="log", yscale="log", xlim=lim, ylim=lim, xlabel="analytic lower bound (ms)",
            ylabel="measured iteration (ms)", title="Each run against its bound")
    ax1.legend(fontsize=8)

    x_key, panel_keys = _layout(runs)
    joined = x_key is not None and not panel_keys  # one axis for every run: a line only along x alone
    xs, ticks, labels, log, xlabel = _x_positions(runs, x_key, runs)
    span = (max(ticks) - min(ticks)) if len(ticks) > 1 else 1.0
    for i, s in enumerate(scheds):
        m = (runs["scheduler"] == s).to_numpy()
        d = runs[m].assign(_x=_dodge(xs[m], i, len(scheds), log, span))
        ax2.scatter(d["_x"], d["efficiency"], color=colours[s], marker=looks[s]["marker"], s=22, alpha=0.7)
        mean = d.groupby("_x")["efficiency"].mean()
        ax2.plot(mean.index, mean.values, color=colours[s], marker="_", ms=14, lw=1.4,
                 ls=looks[s]["ls"] if joined else "none", label=s)
    if log:
        ax2.set_xscale("log")
        ax2.minorticks_off()
    ax2.set_xticks(ticks, labels)
    ax2.set(ylim=(0, 1.05), xlabel=xlabel, ylabel="efficiency = bound / measured",
            title="Efficiency per run (line: mean)" if joined else "Efficiency per run (bar: mean)")
    ax2.legend(fontsize=8)
    fig.suptitle(f"{runs['sweep'].iloc[0]}: measured iteration time against the lower bound of each "
                 f"scheduler's model (max of compute and its communication at the model's optimum)\n"
                 f"{_setting(runs)}", fontsize=9)
    fig.tight_layout()
    return _save(fig, out or sweep_dir / "efficiency.png", formats, sweep_dir, runs["run_id"])


# --------------------------------------------------------------------------- demo figure
def iteration_time_plot(sweep_dir: Path, out: Path | None = None, run_ids: list[str] | None = None,
                        formats: tuple[str, ...] = ("png",)) -> Path:
    """Per-iteration time of each worker, one box per scheduler, beside the split of the
    median iteration into compute and time blocked on communication."""
    sweep_dir = Path(sweep_dir)
    runs = load_runs(sweep_dir, status="ok", run_ids=run_ids)
    iters = load_iterations(sweep_dir, runs)
    iters["iteration_ms"] = (iters["end"] - iters["start"]) * 1e3
    order = list(dict.fromkeys(runs.sort_values("iter_time_median_s", ascending=False)["scheduler"]))

    _theme()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=_figsize(11, 4.2), gridspec_kw={"width_ratios": [3, 2]})
    with warnings.catch_warnings():  # seaborn 0.13 still passes matplotlib 3.11's deprecated `vert`
        warnings.filterwarnings("ignore", message="vert: bool was deprecated", category=DeprecationWarning)
        sns.boxplot(data=iters, x="scheduler", y="iteration_ms", order=order, ax=ax1, color="#cfe0f3",
                    showfliers=False)
    sns.stripplot(data=iters, x="scheduler", y="iteration_ms", hue="worker", order=order, ax=ax1,
                  dodge=True, size=2 if _paper() else 3, alpha=0.7,
                  palette=(OKABE_ITO[:1] + OKABE_ITO[5:6] + OKABE_ITO[2:5] + OKABE_ITO[7:])[
                      :max(1, iters["worker"].nunique())])
    ax1.set(xlabel="scheduler", ylabel="iteration time (ms)", title="Iteration time per worker")
    ax1.set_ylim(bottom=0, top=iters["iteration_ms"].max() * 1.15)
    baseline = catalog.declared_baseline()
    if baseline in order:
        base = iters.loc[iters["scheduler"] == baseline, "iteration_ms"].median()
        for i, name in enumerate(order):
            m = iters.loc[iters["scheduler"] == name, "iteration_ms"].median()
            ax1.annotate(f"{base / m:.2f}x vs {baseline}", (i, iters["iteration_ms"].max() * 1.07), ha="center",
                         fontsize=9, color="#333")
    ax1.legend(title="worker", fontsize=8, title_fontsize=8, loc="lower right")

    med = iters.groupby("scheduler")[["compute_s", "wait_s"]].median().reindex(order) * 1e3
    med.plot(kind="barh", stacked=True, ax=ax2, color=[OKABE_ITO[0], OKABE_ITO[1]])
    ax2.set(xlabel="median per iteration (ms)", ylabel="", title="Compute vs. blocked on communication")
    ax2.legend(["compute", "waiting for gradients"], fontsize=8, loc="lower right")

    first = runs.iloc[0]
    fig.suptitle(f"{first['sweep']}: {first['workload.model']} ({first['workload.preset']}, "
                 f"{first['num_params'] / 1e3:.0f}k params), {_facts(runs)['roles']}, "
                 f"{first['compute_mode']} compute; {first.get('topology.kind', '')}: {first.get('network', '')}; "
                 f"warm-up excluded", fontsize=9)
    fig.tight_layout()
    return _save(fig, out or sweep_dir / "iteration_time.png", formats, sweep_dir, runs["run_id"])


def summary_table(sweep_dir: Path, run_ids: list[str] | None = None) -> pd.DataFrame:
    runs = load_runs(sweep_dir, run_ids=run_ids)
    cols = ["run_id", "scheduler", "repeat", "status", "iter_time_median_s", "wait_median_s",
            "compute_median_s", "bound_s", "efficiency", "fidelity_ok", "final_loss", "params_consistent",
            "wall_s", "reason"]
    return runs[[c for c in cols if c in runs.columns]]


# --------------------------------------------------------------------------- forest
def predicted_measured_plot(table: pd.DataFrame, out: Path, formats: tuple[str, ...] = ("png",),
                            sweep_dir: Path | None = None, run_ids=None) -> Path:
    """Forest/baseline ratios: predicted by the bounds (x) against measured (y), one point per
    baseline and network (`analysis/forest_compare.py`), coloured by baseline scheduler."""
    if table.empty:
        raise Skipped("no network has both a forest run and a baseline")
    _theme()
    fig, ax = plt.subplots(figsize=_figsize(6.2, 5))
    lo = min(table["predicted"].min(), table["measured"].min()) * 0.8
    hi = max(table["predicted"].max(), table["measured"].max()) * 1.25
    ax.plot([lo, hi], [lo, hi], color="k", lw=1, label="measured = predicted")
    ax.plot([lo, hi], [0.9 * lo, 0.9 * hi], color="0.5", lw=1, ls="--", label="0.9 x predicted")
    sched = table["baseline"].map(_base)
    for s in scheduler_order(sched):
        d = table[sched == s]
        look = _look(s, sched)
        ax.scatter(d["predicted"], d["measured"], color=look["color"], marker=look["marker"], s=32, alpha=0.85,
                   label=s)
    ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi), xlabel="predicted forest speed-up (bounds)",
           ylabel="measured forest speed-up", title="Forest over each baseline, per network")
    from matplotlib.ticker import FuncFormatter
    for axis in (ax.xaxis, ax.yaxis):   # 0.5x, 1x, 2x, ... rather than powers of ten
        axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}x"))
        axis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:g}x" if v in (0.5, 2, 3, 5, 7) else ""))
    ax.legend(fontsize=8)
    return _save(fig, out, formats, sweep_dir, run_ids, description="Forest over each baseline, per network: "
                 "predicted (bounds) against measured speed-up")


def replan_plot(sweep_dir: Path, out: Path | None = None, formats: tuple[str, ...] = ("png",)) -> Path:
    """Iteration time of every forest run against the iteration (the workers' mean), one panel
    per configuration: the forest that re-plans on what it measures beside the one that keeps
    the plan of the configured rates. A dotted line marks each plan the measuring forest
    installed (scheduler_info.json `plans`), at the iteration it took effect."""
    from analysis.tables import add_configurations

    _theme()
    sweep_dir = Path(sweep_dir)
    runs = load_runs(sweep_dir, status="ok")
    runs = runs[runs["scheduler_name"].isin(catalog.with_section(REPLAN))]  # every variant (tables.variant_names)
    plans = {r: plan_records(sweep_dir / r) for r in runs["run_id"]}
    if not any(len(p) > 1 for p in plans.values()):
        raise Skipped("no forest run re-planned")
    runs = add_configurations(runs, sweep_dir)
    configs = list(dict.fromkeys(runs.loc[runs["run_id"].map(lambda r: len(plans[r]) > 1), "config"]))
    fig, axes = plt.subplots(len(configs), 1, figsize=_figsize(9, 3.2 * len(configs)), squeeze=False)
    for ax, cfg in zip(axes[:, 0], configs, strict=True):
        for _, run in runs[runs["config"] == cfg].iterrows():
            its = load_iterations(sweep_dir, run.to_frame().T, drop_warmup=False)
            per = its.assign(t=its["end"] - its["start"]).groupby("iteration")["t"].mean() * 1e3
            bw = run.get(f"schedulers.{run['scheduler_name']}.bandwidth")
            label = f"{run['scheduler_name']}, {bw if isinstance(bw, str) else 'measured'} bandwidth"
            look = _look(run["scheduler"], runs["scheduler"])
            line, = ax.plot(per.index, per.values, lw=1.2, color=look["color"], ls=look["ls"], label=label)
            for rec in plans[run["run_id"]][1:]:
                ax.axvline(rec["iteration"], color=line.get_color(), ls=":", lw=1)
        ax.set(yscale="log", xlabel="iteration", ylabel="iteration time (ms)")
        _facet(ax, cfg)
        ax.legend(fontsize=8)
    fig.tight_layout()
    return _save(fig, out or sweep_dir / "replan.png", formats, sweep_dir, runs["run_id"],
                 description=f"{runs['sweep'].iloc[0]}: iteration time of each forest run against the iteration, "
                 f"a dotted line at each plan installed; {_setting(runs)}")


REPLAN = "replan"  # the report section of the schedulers that re-plan (their `report_sections`)


# --------------------------------------------------------------------------- start-up cost
def _startup_text(us: float) -> str:
    return "no start-up cost" if not us else f"{us / 1e3:g} ms"


def startup_plot(sweep_dir: Path, out: Path | None = None, run_ids: list[str] | None = None,
                 formats: tuple[str, ...] = ("png",)) -> Path:
    """bytescheduler's iteration time against its partition size (log x), one line per
    start-up cost (`startup_us`) with its intervals, and fifo, p3 and mercury at the same
    cost as horizontal lines of that cost's colour, one line style per scheduler; one panel
    per configuration (`analysis/startup.py`). Raises Skipped unless the sweep varies both
    the start-up cost and the partition."""
    from analysis import startup

    _theme()
    sweep_dir = Path(sweep_dir)
    runs, iters = load_comparison(sweep_dir, run_ids)
    if not startup.varies(runs):
        raise Skipped("this sweep does not vary both the start-up cost (startup_us) and bytescheduler's "
                      "partition_numel")
    table = startup.times(runs, iters)
    costs = sorted(table["startup_us"].unique())
    colours = dict(zip(costs, sns.color_palette("plasma", len(costs) + 1)[:len(costs)]))  # no pale yellow
    configs = list(dict.fromkeys(table["config_id"]))
    fig, axes = _axes(len(configs), width=6.0, height=4.4, sharey=False)
    for ax, cid in zip(axes, configs):
        sub = table[table["config_id"] == cid]
        bs = sub[sub["scheduler"] == startup.PARTITIONED].sort_values("partition_numel")
        ticks = sorted(bs["partition_numel"].unique())
        for cost in costs:
            d = bs[bs["startup_us"] == cost]
            if len(d):
                est, lo, hi = d["iter_time_s"] * 1e3, d["ci_low"] * 1e3, d["ci_high"] * 1e3
                err = np.vstack([(est - lo).clip(lower=0).fillna(0), (hi - est).clip(lower=0).fillna(0)])
                ax.errorbar(d["partition_numel"], est, yerr=err, marker="o", ms=5, capsize=4, lw=1.6,
                            color=colours[cost])
            for s, ls in startup.REFERENCE_STYLES.items():
                ref = sub[(sub["scheduler"] == s) & (sub["startup_us"] == cost)]
                if len(ref):
                    ax.axhline(ref["iter_time_s"].iloc[0] * 1e3, color=colours[cost], ls=ls, lw=1.3)
        ax.set_xscale("log")
        ax.minorticks_off()
        ax.set_xticks(ticks, [f"{int(v):,}" for v in ticks], rotation=30, ha="right")
        top = pd.concat([sub["iter_time_s"], sub["ci_high"]]).max() * 1e3
        low = pd.concat([sub["iter_time_s"], sub["ci_low"]]).min() * 1e3
        if low > 0 and top / low >= 4:
            ax.set_yscale("log")
            ax.set_ylim(low / 1.25, top * 1.25)
            ax.yaxis.set_major_locator(matplotlib.ticker.LogLocator(subs=(1, 2, 3, 5)))
            ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
            ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        else:
            ax.set_ylim(0, top * 1.15)
        ax.set(xlabel=f"{startup.PARTITIONED} partition size (parameters)", ylabel="iteration time (ms)")
        _facet(ax, sub["config"].iloc[0] if len(configs) > 1 else None)
    from matplotlib.lines import Line2D
    present = set(table["scheduler"])
    cost_handles = [Line2D([], [], color=colours[c], lw=2, label=_startup_text(c)) for c in costs]
    style_handles = [Line2D([], [], color="0.3", lw=1.6, marker="o", ms=5,
                            label=f"{startup.PARTITIONED} (per partition)")]
    style_handles += [Line2D([], [], color="0.3", ls=ls, lw=1.3, label=s)
                      for s, ls in startup.REFERENCE_STYLES.items() if s in present]
    first = axes[-1].legend(handles=cost_handles, title="start-up cost per message", fontsize=8, title_fontsize=8,
                            loc="upper left", bbox_to_anchor=(1.02, 1.0))
    axes[-1].add_artist(first)
    axes[-1].legend(handles=style_handles, title="scheduler", fontsize=8, title_fontsize=8, loc="upper left",
                    bbox_to_anchor=(1.02, 0.55))
    how = "; ".join(METHOD[u] for u in sorted(table["unit"].unique()))
    fig.suptitle(f"{runs['sweep'].iloc[0]}: partitioning against a per-message start-up cost\n{_setting(runs)}\n"
                 f"{table['confidence'].iloc[0]:.0%} CI: {how}; warm-up excluded", fontsize=9)
    fig.tight_layout()
    return _save(fig, out or sweep_dir / "startup.png", formats, sweep_dir, runs["run_id"])


# --------------------------------------------------------------------------- faults
def faults_plot(sweep_dir: Path, out: Path | None = None, formats: tuple[str, ...] = ("png",)) -> Path:
    """How each scheduler degrades under injected faults (analysis/faults.py). First panel:
    what each scenario's faults cost per run in iteration time, a bar per scheduler and
    scenario (a cross where the fault ended the run). Then one panel per scenario: the
    job's iteration time against the time since the roles were launched, a line per
    scheduler, each fault's planned span shaded."""
    from analysis import faults as faults_mod

    _theme()
    sweep_dir = Path(sweep_dir)
    runs = faults_mod.with_scenarios(load_runs(sweep_dir))
    if not faults_mod.has_faults(runs):
        raise Skipped("no run of this sweep has faults")
    table = faults_mod.load_faults(sweep_dir, runs)
    scenarios = [s for s in dict.fromkeys(runs["scenario"]) if s != faults_mod.NONE]
    scheds = scheduler_order(runs["scheduler"])
    fig, axes = _axes(1 + len(scenarios), width=5.2, height=3.4, sharey=False)
    ax = axes[0]
    width = 0.8 / max(len(scenarios), 1)
    hatches = ["", "//", "..", "xx"]
    for j, scen in enumerate(scenarios):
        for i, s in enumerate(scheds):
            f = table[(table["scenario"] == scen) & (table["scheduler"] == s)] if len(table) else table
            x = i - 0.4 + width * (j + 0.5)
            if not len(f):
                continue
            if (f["status"] != "ok").any():
                ax.plot(x, 0, "x", color="black", ms=8)
                continue
            cost = f.groupby("run_id")["cost_s"].sum(min_count=1).median()
            ax.bar(x, cost, width, color=_colour(s, scheds), hatch=hatches[j % len(hatches)], edgecolor="white",
                   label=scen if i == 0 else None)
    ax.set_xticks(range(len(scheds)), scheds, rotation=45, ha="right")
    ax.set(ylabel="cost per run (s of iteration time)")
    _facet(ax, "what the faults cost")
    ax.legend(fontsize=7, title="scenario (hatch)", title_fontsize=7)
    for ax, scen in zip(axes[1:], scenarios, strict=True):
        for s in scheds:
            mine = runs[(runs["scenario"] == scen) & (runs["scheduler"] == s) & (runs["status"] == "ok")]
            if not len(mine):
                continue
            run = mine.iloc[0]
            job = faults_mod.job_iterations(load_iterations(sweep_dir, mine.iloc[:1], drop_warmup=False))
            # steps: each iteration's time over its own span, from the previous end to its end
            ax.plot(job["end"] - run["roles_t0_wall"], job["duration_s"] * 1e3, lw=1, color=_colour(s, scheds), label=s,
                    drawstyle="steps-pre")
        f = table[table["scenario"] == scen].drop_duplicates("fault") if len(table) else table
        for _, row in f.iterrows():
            end = row["planned_end_s"] if pd.notna(row["planned_end_s"]) else row["planned_start_s"] + 0.2
            ax.axvspan(row["planned_start_s"], end, color="grey", alpha=0.25, lw=0)
        ax.set(yscale="log", xlabel="time since the roles were launched (s)", ylabel="iteration time (ms)")
        _facet(ax, scen)
        ax.legend(fontsize=7, ncol=2)
    fig.suptitle(f"Faults: {_setting(runs)}", fontsize=9)
    fig.tight_layout()
    return _save(fig, out or sweep_dir / "faults.png", formats, sweep_dir, runs["run_id"])
