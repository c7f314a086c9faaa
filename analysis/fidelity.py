"""Fidelity verdicts of a sweep, summarised: how many completed runs the emulation can be
trusted for, and why the others cannot.

Each run's row carries `fidelity_ok` and `fidelity_reasons` ("; "-separated sentences with
numbers and link names in them). Counting the sentences as they are would give one line
per run, so each is put in a category by what it says.
"""
from __future__ import annotations

import re

import pandas as pd

CATEGORIES = [  # (pattern, category): the first that matches wins
    (r"CPU idle fell", "CPU saturated: idle time fell below the threshold, so compute and "
                       "protocol processing competed for cores"),
    (r"above its configured rate", "a link sent faster than its configured rate (shaping leaked)"),
    (r"had queued work but reached only|backlogged but reached only",  # the second: older rows
     "a link with queued work delivered less than its configured rate"),
]


def categorise(reason: str) -> str:
    for pattern, category in CATEGORIES:
        if re.search(pattern, reason):
            return category
    return re.sub(r"\d+(\.\d+)?", "#", reason)  # an unknown sentence, its numbers masked


def summary(runs: pd.DataFrame) -> dict:
    """Counts of runs by status and verdict, plus one row per failure category (runs
    affected, and the worst-sounding example) and the runs that did not complete."""
    ok = runs[runs["status"] == "ok"]
    verdict = ok["fidelity_ok"] if "fidelity_ok" in ok else pd.Series(None, index=ok.index, dtype=object)
    judged = verdict.notna()
    rows: dict[str, dict] = {}
    if "fidelity_reasons" in ok:
        for _, run in ok[judged & (verdict == False)].iterrows():  # noqa: E712 - pandas bools
            for sentence in str(run["fidelity_reasons"] or "").split("; "):
                if not sentence:
                    continue
                cat = categorise(sentence)
                r = rows.setdefault(cat, {"category": cat, "runs": set(), "example": sentence})
                r["runs"].add(run["run_id"])
    reasons = pd.DataFrame([{**r, "runs": len(r["runs"])} for r in rows.values()],
                           columns=["category", "runs", "example"])
    not_ok = runs[runs["status"] != "ok"]
    return {
        "runs": len(runs),
        "completed": len(ok),
        "not_completed": not_ok[["run_id", "scheduler", "status", "reason"]].reset_index(drop=True),
        "passed": int((verdict == True).sum()),  # noqa: E712
        "failed": int((verdict == False).sum()),  # noqa: E712
        "unjudged": int((~judged).sum()),
        "reasons": reasons.sort_values("runs", ascending=False).reset_index(drop=True),
    }
