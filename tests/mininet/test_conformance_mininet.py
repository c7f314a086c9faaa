"""The conformance check's Mininet part and the tutorial's commands (docs/writing-a-scheduler.md),
as a user runs them: `./inv check-scheduler` on a built-in and on the tutorial's plugin, then
the tutorial's sweep beside fifo and ring and its report. Root; the full suite only."""
from __future__ import annotations

import pandas as pd
import pytest

from tests.conftest import REPO, invoke
from tests.factories import is_png

EXAMPLE = "examples/schedulers/tree.py"


def _row(out: str, check: str) -> str:
    lines = [ln for ln in out.splitlines() if ln.startswith(check + " ")]
    assert lines, out
    return lines[0]


def _check(*args: str):
    """`./inv check-scheduler ARGS`, run a second time if its one failure was the Mininet run's
    fidelity verdict: on this 2-core machine a 0.3 s busy stretch of a host link once read 88%
    of its rate (the verdict wants 90%) at CPU idle 0.97, where three runs in a row read
    0.93-0.96. That is the machine, not the scheduler, and the command says so in its row; a
    scheduler that loads the CPU fails both runs."""
    r = invoke("check-scheduler", *args, timeout=600)
    failed = [ln for ln in r.stdout.splitlines() if ln.rstrip().endswith("FAIL")]
    if r.returncode == 1 and len(failed) == 1 and "fidelity failed" in failed[0]:
        r = invoke("check-scheduler", *args, timeout=600)
    return r


def test_check_scheduler_on_a_builtin_judges_the_demo_run(tmp_path):
    r = _check("ring", "--results", str(tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr[-2000:]
    assert "fidelity ok" in _row(r.stdout, "mininet run") and _row(r.stdout, "mininet run").endswith("pass")
    assert "of the ring_allreduce bound" in _row(r.stdout, "efficiency"), r.stdout
    runs = pd.read_parquet(tmp_path / "check-ring" / "runs.parquet")
    assert list(runs["status"]) == ["ok"] and list(runs["scheduler"]) == ["ring"]


def test_tutorial_plugin_passes_the_check(tmp_path):
    """The tutorial's command, the plugin given by path: every row passes, no bound."""
    r = _check("tree", "--plugin", EXAMPLE, "--results", str(tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr[-2000:]
    assert "tree: all 8 checks passed" in r.stdout, r.stdout
    assert "no bound" in _row(r.stdout, "efficiency")
    assert list((tmp_path / "check-tree").glob("*/plugins/tree.py")), "the plugin's copy in the run directory"


@pytest.mark.slow
def test_tutorial_sweep_and_report(tmp_path):
    """The tutorial's sweep (fifo, ring and the plugin on a heterogeneous star) and report:
    every run ok with a fidelity verdict; the plugin under its display name, with no bound."""
    r = invoke("sweep", "examples/tree_sweep.yaml", "--results", str(tmp_path), timeout=900)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    sweep = tmp_path / "tree-vs-builtins"
    runs = pd.read_parquet(sweep / "runs.parquet")
    assert sorted(runs["scheduler_name"] if "scheduler_name" in runs else runs["scheduler"]) == ["fifo", "ring", "tree"]
    assert runs["status"].eq("ok").all() and runs["fidelity_ok"].notna().all(), runs[["scheduler", "status"]]
    tree = runs.set_index("scheduler").loc["tree"]
    assert pd.isna(tree["efficiency"]) and runs.set_index("scheduler").loc["ring", "efficiency"] > 0
    r = invoke("report", str(sweep), timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    text = (sweep / "report" / "report.md").read_text()
    assert "binary tree" in text and "no bound" in text
    assert is_png(sweep / "report" / "iteration_time.png")
    assert (REPO / EXAMPLE).is_file()
