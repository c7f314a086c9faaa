"""The check's table: one row per check, its figure and its verdict, aligned for a terminal."""
from __future__ import annotations

from conformance.checks import Row


def render(name: str, rows: list[Row]) -> str:
    """The rows under a title; failures' reasons below the table, and the overall verdict."""
    head = ("check", "figure", "result")
    cells = [(r.check, r.figure, "pass" if r.passed else "FAIL") for r in rows]
    widths = [max(len(c[i]) for c in [head, *cells]) for i in range(3)]
    line = "  ".join(f"{{:<{w}}}" for w in widths)
    out = [f"check-scheduler {name}", line.format(*head), line.format(*("-" * w for w in widths))]
    out += [line.format(*c).rstrip() for c in cells]
    for r in rows:
        if r.detail and not r.passed:
            out.append(f"  {r.check}: {r.detail}")
    failed = sum(not r.passed for r in rows)
    out.append(f"{name}: all {len(rows)} checks passed" if not failed
               else f"{name}: {failed} of {len(rows)} checks failed")
    return "\n".join(out)
