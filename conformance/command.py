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


def _mininet(name: str, results: str | None, sections, plugins: list[str], say) -> list[checks.Row]:
    say("the demo network on Mininet")
    if results is not None:
        return demo.run(name, Path(results), sections, plugins)
    with tempfile.TemporaryDirectory(prefix=f"check-{name}-") as tmp:
        return demo.run(name, Path(tmp), sections, plugins)


def load(plugin: str | None) -> list[str]:
    """The plugin file registered here (and, by path, in every role): its absolute path."""
    if plugin is None:
        return []
    from schedulers.registry.plugins import PluginError, load_plugins

    path = str(Path(plugin).expanduser().resolve())
    try:
        load_plugins([path], Path.cwd(), where="--plugin")
    except PluginError as e:
        raise BadInput(str(e)) from None
    return [path]


def main(name: str, sections, plugin: str | None = None, loopback_only: bool = False,
         results: str | None = None) -> int:
    """Run the checks of scheduler `name` (defined in `plugin`, a file, if given) and print the
    table; the exit status. `sections`: what validates the demo's config (tasks.py's)."""
    plugins = load(plugin)
    if name not in registry.SCHEDULERS:
        raise BadInput(f"unknown scheduler {name!r} (known: {', '.join(sorted(registry.SCHEDULERS))})")
    say = _progress(time.monotonic())
    print(f"checking {name} on loopback ({len(checks.CASES) + 1} jobs)", file=sys.stderr, flush=True)
    rows = checks.loopback(name, progress=say, plugins=plugins)
    skipped = ""
    if loopback_only:
        skipped = "mininet run: skipped (--loopback-only)"
    elif os.geteuid() != 0:
        skipped = f"mininet run: skipped (Mininet needs root; run as: sudo ./inv check-scheduler {name})"
    else:
        rows += _mininet(name, results, sections, plugins, say)
    print(render(name, rows))
    if skipped:
        print(skipped)
    return 0 if all(r.passed for r in rows) else 1
