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


def test_check_scheduler_on_a_builtin_judges_the_demo_run(tmp_path):
    r = invoke("check-scheduler", "ring", "--results", str(tmp_path), timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr[-2000:]
    assert "fidelity ok" in _row(r.stdout, "mininet run") and _row(r.stdout, "mininet run").endswith("pass")
    assert "of the ring_allreduce bound" in _row(r.stdout, "efficiency"), r.stdout
    runs = pd.read_parquet(tmp_path / "check-ring" / "runs.parquet")
    assert list(runs["status"]) == ["ok"] and list(runs["scheduler"]) == ["ring"]


def test_tutorial_plugin_passes_the_check(tmp_path):
    """The tutorial's command, the plugin given by path: every row passes, no bound."""
    r = invoke("check-scheduler", "tree", "--plugin", EXAMPLE, "--results", str(tmp_path), timeout=600)
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
