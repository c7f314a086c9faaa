"""A plugin scheduler (tests/data/plugins/alltoall.py, loaded as a config's `plugins:` is) in real
jobs on loopback: its averages equal the reference with threads of workers, and real worker
processes (workloads/local.py, which hands the plugin to every role through its spec) train
with it to the same parameters as with ring."""
from __future__ import annotations

from pathlib import Path

import pytest

from schedulers import registry
from schedulers.registry import plugins
from tests.conftest import REPO
from tests.loopback_jobs import run_job, tensor_set
from workloads.local import run_job as run_training

ALLTOALL = REPO / "tests" / "data" / "plugins" / "alltoall.py"
PS_FIFO = REPO / "tests" / "data" / "plugins" / "ps_fifo.py"


@pytest.fixture(autouse=True)
def clean_registry(monkeypatch):
    monkeypatch.setattr(registry, "SCHEDULERS", dict(registry.SCHEDULERS))
    monkeypatch.setattr(registry, "SOURCES", {})
    monkeypatch.setattr(registry, "PLUGIN_SPECS", {})
    monkeypatch.setattr(plugins, "_LOADED", {})


@pytest.mark.parametrize("workers", [1, 3])
def test_a_plugin_schedulers_averages_equal_the_reference(workers):
    plugins.load_plugins([str(ALLTOALL)], Path("/"))
    run_job("alltoall", {}, workers, 0, iterations=3, sizes=tensor_set(workers))


@pytest.mark.slow  # two training jobs of real processes each: about 12-19 s
@pytest.mark.parametrize("plugin,scheduler,reference,role", [
    (ALLTOALL, "alltoall", "ring", "worker0"),      # a collective
    (PS_FIFO, "plugin_fifo", "fifo", "server0"),    # the PS family: the built-in server loads it for the mode
])
def test_role_processes_load_the_plugin_and_train_as_with_a_built_in(tmp_path, plugin, scheduler, reference, role):
    """With two workers every scheme adds the same two numbers: the checksums are equal."""
    workload = {"model": "cnn", "preset": "tiny", "iterations": 3, "batch_size": 8}
    mine = run_training(workload, tmp_path / "plugin", workers=2, scheduler=scheduler, plugins=[str(plugin)],
                        timeout_s=120)
    theirs = run_training(workload, tmp_path / "builtin", workers=2, scheduler=reference, timeout_s=120)
    sums = {r["summary"]["checksum"] for r in mine}
    assert sums == {r["summary"]["checksum"] for r in theirs} and len(sums) == 1
    assert '"plugins"' in (tmp_path / "plugin" / f"{role}.spec.json").read_text()
