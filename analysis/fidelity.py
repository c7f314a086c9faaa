"""Fidelity verdicts of a sweep, summarised: how many completed runs the emulation can be
trusted for, and why the others cannot.

Each run's row carries `fidelity_ok`, `fidelity_reasons` ("; "-separated sentences with
numbers and link names in them) and `fidelity_codes` (one reason code per sentence,
contracts/fidelity.py): the monitors' checks (emu/testbed/fidelity.py) and, once the bounds are
computed, the physics checks (analysis/physics.py). Failures are counted by code, so each
reason is one line however its numbers differ from run to run; a sentence serves as the
example.
"""
from __future__ import annotations

import re

import pandas as pd

from contracts.fidelity import COLUMN as CODES_COLUMN
from contracts.fidelity import Reason, decode

CATEGORIES = {
    Reason.CPU_IDLE.value: "CPU saturated: idle time fell below the threshold, so compute and protocol "
                           "processing competed for cores",
    Reason.RATE_EXCESS.value: "a link sent faster than its configured rate (shaping leaked)",
    Reason.SATURATION.value: "a link with queued work delivered less than its configured rate",
    Reason.BELOW_BOUND.value: "breaks physics: the measured iteration is shorter than a lower bound on it "
                              "(the model's or the cut's), beyond the tolerance",
    Reason.TOO_FEW_BYTES.value: "breaks physics: a worker host's links carried fewer bytes than the gradients "
                                "it must send or receive each iteration",
}

# Rows written before the verdict had codes: each code's sentence, as emu/testbed/fidelity.py worded it.
LEGACY_SENTENCES = [
    (r"CPU idle fell", Reason.CPU_IDLE.value),
    (r"above its configured rate", Reason.RATE_EXCESS.value),
    (r"had queued work but reached only|backlogged but reached only", Reason.SATURATION.value),
]


def findings(run: pd.Series) -> list[tuple[str | None, str]]:
    """(code, sentence) per failed check of one run's row. A row without codes (written
    before they existed) gets them from its sentences; None where none matches."""
    text = run.get("fidelity_reasons")
    sentences = [s for s in (text if isinstance(text, str) else "").split("; ") if s]  # NaN: a row never judged
    cell = run.get(CODES_COLUMN)
    if isinstance(cell, str):
        return list(zip(decode(cell), sentences, strict=False))  # emu writes them aligned
    return [(next((code for pattern, code in LEGACY_SENTENCES if re.search(pattern, s)), None), s)
            for s in sentences]


def category(code: str | None, sentence: str) -> str:
    """The line a failure is counted under: its code's description; an unknown sentence
    with its numbers masked."""
    if code is None:
        return re.sub(r"\d+(\.\d+)?", "#", sentence)
    return CATEGORIES.get(code, code)


def summary(runs: pd.DataFrame) -> dict:
    """Counts of runs by status and verdict, plus one row per failure category (runs
    affected, and the first run's sentence as an example) and the runs that did not complete."""
    ok = runs[runs["status"] == "ok"]
    verdict = ok["fidelity_ok"] if "fidelity_ok" in ok else pd.Series(None, index=ok.index, dtype=object)
    judged = verdict.notna()
    rows: dict[str, dict] = {}
    for _, run in ok[judged & (verdict == False)].iterrows():  # noqa: E712 - pandas bools
        for code, sentence in findings(run):
            cat = category(code, sentence)
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
