"""meta.json names the machine a run measured on: its CPU model and memory beside the CPU count."""
from __future__ import annotations

import os

from emu.run import runner


def test_machine_reads_the_cpu_model_and_the_memory(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Example CPU @ 2.40GHz\n\n"
                    "processor\t: 1\nmodel name\t: Example CPU @ 2.40GHz\n")
    m = runner.machine(info)
    assert m["cpu_model"] == "Example CPU @ 2.40GHz"
    assert m["memory_bytes"] == os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def test_machine_falls_back_to_platform_processor(tmp_path, monkeypatch):
    monkeypatch.setattr(runner.platform, "processor", lambda: "aarch64")
    assert runner.machine(tmp_path / "missing")["cpu_model"] == "aarch64"
    (tmp_path / "no-model").write_text("processor\t: 0\nBogoMIPS\t: 50.00\n")
    assert runner.machine(tmp_path / "no-model")["cpu_model"] == "aarch64"
    monkeypatch.setattr(runner.platform, "processor", lambda: "")
    assert runner.machine(tmp_path / "missing")["cpu_model"] is None


def test_environment_records_the_machine():
    env = runner.environment()
    assert {"cpus", "cpu_model", "memory_bytes"} <= env.keys()
    assert env["memory_bytes"] > 0
