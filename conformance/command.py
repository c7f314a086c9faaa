"""`./inv check-scheduler NAME`: the loopback checks, then one run on the demo network, one table.

Exit status: 0 if every check that ran passed, 1 if one failed, 2 for bad input (one
`error:` line). Progress goes to stderr as each check starts; the table goes to stdout.
Without root the Mininet run is skipped with a line saying why, as with --loopback-only.
"""
from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

from conformance import checks, demo
from conformance.table import render
from schedulers import registry


class BadInput(ValueError):
    """What the command was given is wrong: one `error:` line, exit status 2."""


def _progress(t0: float):
    def say(text: str) -> None:
        print(f"  {time.monotonic() - t0:5.1f} s  {text}", file=sys.stderr, flush=True)
    return say


def _mininet(name: str, results: str | None, say) -> list[checks.Row]:
    say("the demo network on Mininet")
    if results is not None:
        return demo.run(name, Path(results))
    with tempfile.TemporaryDirectory(prefix=f"check-{name}-") as tmp:
        return demo.run(name, Path(tmp))


def main(name: str, loopback_only: bool = False, results: str | None = None) -> int:
    """Run the checks of scheduler `name` and print the table; the exit status."""
    if name not in registry.SCHEDULERS:
        raise BadInput(f"unknown scheduler {name!r} (known: {', '.join(sorted(registry.SCHEDULERS))})")
    say = _progress(time.monotonic())
    print(f"checking {name} on loopback ({len(checks.CASES) + 1} jobs)", file=sys.stderr, flush=True)
    rows = checks.loopback(name, progress=say)
    skipped = ""
    if loopback_only:
        skipped = "mininet run: skipped (--loopback-only)"
    elif os.geteuid() != 0:
        skipped = f"mininet run: skipped (Mininet needs root; run as: sudo ./inv check-scheduler {name})"
    else:
        rows += _mininet(name, results, say)
    print(render(name, rows))
    if skipped:
        print(skipped)
    return 0 if all(r.passed for r in rows) else 1
