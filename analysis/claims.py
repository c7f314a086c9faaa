"""The papers' headline claims, set beside what a sweep measured.

A claim is tested only on configurations that match its condition (static, shared or
time-varying, heterogeneous bandwidth) and only where the claimed scheduler and a baseline
ran on the same configuration; otherwise it is reported as not testable, with the reason.
The papers' settings (8 nodes at 10 GbE, five models) are not what an emulated 2-core run
reproduces, so every verdict also states both settings: agreement is indicative only.

Which schedulers a claim is about is theirs to declare (`claims` of their class, read through
analysis/catalog.py): the one whose speedup is claimed, and the baselines it is claimed over,
in display order. A claim here is what the paper says: its id, statement, range and condition.
"""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from analysis import catalog
from analysis.speedup import speedups

CONDITIONS = {
    "static": "fixed bandwidth (no shaping schedule, no cross traffic)",
    "dynamic": "shared or time-varying bandwidth (cross traffic or a shaping schedule)",
    "heterogeneous": "heterogeneous bandwidth (the workers' links differ)",
}


@dataclass(frozen=True)
class Claim:
    id: str                      # what schedulers name in their `claims`
    paper: str
    statement: str               # as the paper reports it
    low: float | None            # the reported range as speedup factors; low None: "up to high"
    high: float
    condition: str               # a key of CONDITIONS
    paper_setting: str
    note: str = ""

    @property
    def schedulers(self) -> list[str]:
        """Whose speedup is claimed (in display order)."""
        return catalog.in_claim(self.id, "claimed")

    @property
    def baselines(self) -> list[str]:
        """Over which of our schedulers (in display order)."""
        return catalog.in_claim(self.id, "baseline")


MERCURY = "Mercury (IEEE TPDS 2023)"
FOREST = "Topology-adaptive forests (INFOCOM 2021)"
MERCURY_SETTING = "8 nodes, 10 GbE, five models"

CLAIMS = [
    Claim("mercury-over-ps", MERCURY, "1.18–2.18x over plain PS", 1.18, 2.18, "static", MERCURY_SETTING),
    Claim("mercury-over-partitioning", MERCURY, "1.08–2.04x over tensor partitioning", 1.08, 2.04, "static",
          MERCURY_SETTING),
    Claim("mercury-over-ps-dynamic", MERCURY,
          "up to +130% over a parameter server under shared or time-varying bandwidth", None, 2.30, "dynamic",
          MERCURY_SETTING),
    Claim("mercury-over-partitioning-dynamic", MERCURY,
          "up to +104% over tensor partitioning under shared or time-varying bandwidth", None, 2.04, "dynamic",
          MERCURY_SETTING),
    Claim("forest-heterogeneous", FOREST, "up to 18.3x over prior schemes on heterogeneous bandwidth", None, 18.3,
          "heterogeneous", "heterogeneous-bandwidth clusters (see the paper)"),
]


def _matching(facts: pd.DataFrame, condition: str) -> set[str]:
    if condition == "static":
        return set(facts.loc[~facts["dynamic"], "config_id"])
    return set(facts.loc[facts[condition], "config_id"])


def _setting(facts: pd.DataFrame) -> str:
    def rng(lo, hi, unit=""):
        return f"{lo:g}{unit}" if lo == hi else f"{lo:g}–{hi:g}{unit}"

    hosts = rng(facts["num_hosts"].min(), facts["num_hosts"].max())
    mbps = rng(facts["link_mbps_min"].min(), facts["link_mbps_max"].max(), " Mb/s")
    models = ", ".join(sorted(facts["model"].astype(str).unique()))
    return f"{hosts} hosts ({rng(facts['num_workers'].min(), facts['num_workers'].max())} workers), links {mbps}, " \
           f"model {models}"


def _fmt(row) -> str:
    ci = f" [{row['ci_low']:.2f}, {row['ci_high']:.2f}]" if pd.notna(row["ci_low"]) else " [no CI]"
    return f"{row['speedup']:.2f}x{ci} on {row['config']}"


def _verdict(claim: Claim, table: pd.DataFrame) -> str:
    lo_ci, hi_ci = table["ci_low"].fillna(table["speedup"]), table["ci_high"].fillna(table["speedup"])
    if claim.low is None:
        best = table.loc[table["speedup"].idxmax()]
        b_lo = best["ci_low"] if pd.notna(best["ci_low"]) else best["speedup"]
        b_hi = best["ci_high"] if pd.notna(best["ci_high"]) else best["speedup"]
        if b_hi < claim.high:
            return f"below the reported maximum of {claim.high:g}x (our best {best['speedup']:.2f}x)"
        if b_lo > claim.high:
            return f"above the reported maximum of {claim.high:g}x (our best {best['speedup']:.2f}x)"
        return f"reaches the reported maximum of {claim.high:g}x within the interval"
    inside = (hi_ci >= claim.low) & (lo_ci <= claim.high)
    if inside.all():
        return f"consistent: every interval overlaps the reported {claim.low:g}–{claim.high:g}x"
    if (hi_ci < claim.low).all():
        return f"below the reported {claim.low:g}–{claim.high:g}x on every configuration"
    if (lo_ci > claim.high).all():
        return f"above the reported {claim.low:g}–{claim.high:g}x on every configuration"
    return f"partly: {int(inside.sum())} of {len(table)} configurations overlap the reported " \
           f"{claim.low:g}–{claim.high:g}x"


def evaluate(runs: pd.DataFrame, iters: pd.DataFrame, facts: pd.DataFrame, claims: list[Claim] = CLAIMS,
             **kw) -> pd.DataFrame:
    """One row per (claim, baseline that could be tested, or the claim alone when none could):
    testable, measured (speedup range with intervals), verdict, and the two settings.
    `runs` need `config_id`/`config` (tables.add_configurations), `facts` is
    tables.config_facts of the same runs; `kw` goes to speedup.speedups."""
    # scheduler variants (tables.variant_names) by registry name: a claim about `mercury` over
    # `bytescheduler` is tested on every variant of each
    names = runs["scheduler_name"] if "scheduler_name" in runs else runs["scheduler"]
    variants: dict[str, list[str]] = {}
    for v, n in dict(zip(runs["scheduler"], names)).items():
        variants.setdefault(n, []).append(v)
    rows = []
    for claim in claims:
        base = {"paper": claim.paper, "claim": claim.statement, "paper_setting": claim.paper_setting,
                "condition": CONDITIONS[claim.condition], "note": claim.note}
        if not claim.schedulers:
            rows.append({**base, "baseline": "", "testable": False,
                         "measured": "not testable: no scheduler declares this claim"})
        for scheduler in claim.schedulers:
            rows += _rows(claim, scheduler, base, runs, iters, facts, variants, kw)
    cols = ["paper", "claim", "baseline", "testable", "measured", "verdict", "condition", "paper_setting",
            "our_setting", "unit", "note"]
    return pd.DataFrame(rows).reindex(columns=cols)


def _rows(claim: Claim, scheduler: str, base: dict, runs: pd.DataFrame, iters: pd.DataFrame, facts: pd.DataFrame,
          variants: dict[str, list[str]], kw: dict) -> list[dict]:
    """`evaluate`'s rows of one claim about one scheduler: one per baseline variant tested, or
    one saying why none could be."""
    present = set(variants)
    if scheduler not in present:
        return [{**base, "baseline": "", "testable": False,
                 "measured": f"not testable: this sweep has no run of `{scheduler}`"}]
    baselines = [b for b in claim.baselines if b in present]
    if not baselines:
        return [{**base, "baseline": "", "testable": False,
                 "measured": "not testable: none of " + ", ".join(f"`{b}`" for b in claim.baselines)
                             + " ran in this sweep"}]
    matching = _matching(facts, claim.condition)
    if not matching:
        return [{**base, "baseline": "", "testable": False,
                 "measured": f"not testable: no configuration has {CONDITIONS[claim.condition]}"}]
    sub = runs[runs["config_id"].isin(matching)]
    rows = []
    for b in [v for name in baselines for v in variants[name]]:
        table = speedups(sub, iters, baseline=b, **kw)
        table = table[table["scheduler"].isin(variants[scheduler])]
        if table.empty:
            rows.append({**base, "baseline": b, "testable": False,
                         "measured": f"not testable: `{scheduler}` and `{b}` never ran on the same "
                                     f"configuration with {CONDITIONS[claim.condition]}"})
            continue
        lo, hi = table.loc[table["speedup"].idxmin()], table.loc[table["speedup"].idxmax()]
        measured = _fmt(hi) if len(table) == 1 else f"{_fmt(lo)} to {_fmt(hi)} ({len(table)} configurations)"
        rows.append({**base, "baseline": b, "testable": True, "measured": measured,
                     "verdict": _verdict(claim, table),
                     "our_setting": _setting(facts[facts["config_id"].isin(set(table["config_id"]))]),
                     "unit": ", ".join(sorted(table["unit"].unique()))})
    return rows
