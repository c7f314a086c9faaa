"""The conformance check's loopback part (conformance/checks.py) on every built-in scheduler:
averages at 1, 2, 3 and 8 workers against the reference, a dead peer named, nothing left by
close(); and what the command says for bad input and a failing check. Real role processes
over 127.0.0.1 (conformance/jobs.py)."""
from __future__ import annotations

import pytest

from conformance import checks
from conformance.table import render
from schedulers import registry
from tests.conftest import REPO, invoke


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(registry.SCHEDULERS))
def test_builtin_passes_the_loopback_checks(name, tmp_path):
    rows = checks.loopback(name, work_dir=tmp_path)
    assert [r.check for r in rows][-2:] == ["dead peer", "close()"]
    assert len(rows) == len(checks.CASES) + 2
    failed = [r for r in rows if not r.passed]
    assert not failed, render(name, rows)


def test_wrong_params_fail_the_averages_row_with_the_reason(tmp_path):
    """A job that cannot run (here: params the scheduler rejects) is a failed row naming the
    role and its error, not an exception out of the check."""
    row, answers = checks.averages("ring", {"no_such_key": 1}, 2, 0, tmp_path)
    assert not row.passed and answers == []
    assert "worker0" in row.detail and "no_such_key" in row.detail, row.detail


@pytest.mark.slow  # a CLI or timing subprocess: about a second
def test_unknown_scheduler_is_one_error_line():
    r = invoke("check-scheduler", "no-such-scheduler", "--loopback-only", timeout=60)
    assert r.returncode == 2, r
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: unknown scheduler 'no-such-scheduler'"), r.stderr


@pytest.mark.slow
def test_tutorial_plugin_passes_through_the_command():
    """docs/writing-a-scheduler.md's command on its example, the plugin given by path (loaded in
    every role process): the table, progress as each check starts, exit 0."""
    r = invoke("check-scheduler", "tree", "--plugin", "examples/schedulers/tree.py", "--loopback-only", timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "averages 8w " in r.stdout and "tree: all 6 checks passed" in r.stdout, r.stdout
    assert "skipped (--loopback-only)" in r.stdout
    assert "[5/5] a dead peer" in r.stderr


@pytest.mark.slow  # a CLI or timing subprocess: about a second
def test_plugin_that_fails_to_load_is_one_error_line():
    r = invoke("check-scheduler", "x", "--plugin", "tests/data/plugins/broken_import.py", "--loopback-only",
               timeout=60)
    assert r.returncode == 2, r
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --plugin[0]: ") and "broken_import.py:" in lines[0], r.stderr


def test_the_tutorials_commands_are_the_ones_the_suite_runs():
    """docs/writing-a-scheduler.md's commands, exactly: the check (here and in
    tests/mininet/test_conformance_mininet.py), the sweep and the report (there)."""
    text = (REPO / "docs" / "writing-a-scheduler.md").read_text()
    lines = [ln.strip() for ln in text.splitlines()]
    commands = [ln.removeprefix("sudo ") for ln in lines if ln.startswith(("./inv", "sudo "))]
    assert commands == ["./inv check-scheduler tree --plugin examples/schedulers/tree.py",
                        "./inv sweep examples/tree_sweep.yaml", "./inv report results/tree-vs-builtins"], commands


@pytest.fixture
def clean_registry(monkeypatch):
    """A plugin loaded in this process registers globally: the built-ins alone again after."""
    from schedulers.registry import plugins

    monkeypatch.setattr(registry, "SCHEDULERS", dict(registry.SCHEDULERS))
    monkeypatch.setattr(registry, "SOURCES", {})
    monkeypatch.setattr(registry, "PLUGIN_SPECS", {})
    monkeypatch.setattr(plugins, "_LOADED", {})


@pytest.mark.slow
def test_tutorial_plugin_trains_like_ring(tmp_path, clean_registry):
    """The tutorial's plugin in real worker processes (workloads.worker loads it from the role
    spec): two workers train the tiny CNN to the same bits as through ring, where every scheme
    adds the same two numbers."""
    from workloads.local import run_job

    workload = {"model": "cnn", "preset": "tiny", "iterations": 4, "batch_size": 8}
    sums = {name: {r["summary"]["checksum"] for r in run_job(workload, tmp_path / name, workers=2, scheduler=name,
                                                             plugins=plugins, timeout_s=120)}
            for name, plugins in (("tree", [str(REPO / "examples/schedulers/tree.py")]), ("ring", []))}
    assert len(sums["tree"]) == 1 and sums["tree"] == sums["ring"], sums
