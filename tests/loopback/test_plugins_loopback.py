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


@pytest.mark.slow  # two training jobs of real processes: about 19 s
def test_worker_processes_load_the_plugin_and_train_as_with_ring(tmp_path):
    """With two workers every scheme adds the same two numbers: the checksums are equal."""
    workload = {"model": "cnn", "preset": "tiny", "iterations": 3, "batch_size": 8}
    mine = run_training(workload, tmp_path / "alltoall", workers=2, scheduler="alltoall", plugins=[str(ALLTOALL)],
                        timeout_s=120)
    ring = run_training(workload, tmp_path / "ring", workers=2, scheduler="ring", timeout_s=120)
    sums = {r["summary"]["checksum"] for r in mine}
    assert sums == {r["summary"]["checksum"] for r in ring} and len(sums) == 1
    assert '"plugins"' in (tmp_path / "alltoall" / "worker0.spec.json").read_text()


@pytest.mark.slow  # two training jobs of real processes, with a server each
def test_a_parameter_server_plugin_is_served_by_the_built_in_server(tmp_path):
    """A PS-family plugin (the built-in server's mode, declared by its class): the server process
    loads the plugin from its spec to learn the mode, and training equals fifo's to the bit."""
    workload = {"model": "cnn", "preset": "tiny", "iterations": 3, "batch_size": 8}
    mine = run_training(workload, tmp_path / "plugin", workers=2, scheduler="plugin_fifo", plugins=[str(PS_FIFO)],
                        timeout_s=120)
    fifo = run_training(workload, tmp_path / "fifo", workers=2, scheduler="fifo", timeout_s=120)
    sums = {r["summary"]["checksum"] for r in mine}
    assert sums == {r["summary"]["checksum"] for r in fifo} and len(sums) == 1
    assert '"plugins"' in (tmp_path / "plugin" / "server0.spec.json").read_text()
