"""Bring-up and teardown never hang: a node that does not come up fails the network within
seconds, naming it and what its shell said, and `timeout_s` bounds both phases.

The failures are made with stand-ins for one node's tools, first on PATH for this test only:
an `mnexec` that fails the way the real one does where "/" is not a mount point (a chroot),
or that starts a shell that never prompts, and a `brctl` that cannot add one bridge. Every
other call reaches the real tool.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from emu.config.topospec import StarTopology
from emu.testbed import tc
from emu.testbed.cleanup import StateDir
from emu.testbed.network import NetworkError, Testbed
from tests.conftest import invoke

SPEC = {"kind": "star", "hosts": [{"name": "ps", "bw_mbps": 100}, {"name": "w0", "bw_mbps": 40},
                                  {"name": "w1", "bw_mbps": 20}]}


@pytest.fixture
def state(tmp_path):
    with StateDir(root=tmp_path / "state") as s:
        yield s


def stand_in(tmp_path: Path, tool: str, case: str, then: str) -> dict[str, str]:
    """PATH with a `tool` that does `then` when its arguments match the shell pattern `case`,
    and is the real tool otherwise."""
    real = shutil.which(tool)
    assert real, f"{tool} is not installed"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    script = bin_dir / tool
    script.write_text(f'#!/bin/sh\ncase "$*" in {case}) {then} ;; esac\nexec {real} "$@"\n')
    script.chmod(0o755)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}"}


# What mnexec -n prints and does where the root is not a mount point (a chroot: mount(2) of "/"
# with MS_PRIVATE fails with EINVAL), for w1's shell only.
CHROOT_MNEXEC = ('*" mininet:w1"', 'echo "remount: Invalid argument" >&2; exit 1')


def test_a_host_whose_shell_exits_at_once_fails_bring_up_naming_it(tmp_path, state, monkeypatch, no_leftovers):
    monkeypatch.setenv("PATH", stand_in(tmp_path, "mnexec", *CHROOT_MNEXEC)["PATH"])
    t0 = time.monotonic()
    with pytest.raises(NetworkError) as e, Testbed(StarTopology.model_validate(SPEC).resolve(), state):
        pass
    assert time.monotonic() - t0 < 5
    msg = str(e.value)
    assert msg.startswith("host w1 did not start: its shell (mnexec -cdn bash) exited with code 1"), msg
    assert "remount: Invalid argument" in msg, msg


def test_a_shell_that_never_prompts_fails_bring_up_at_timeout_s(tmp_path, state, monkeypatch, no_leftovers):
    monkeypatch.setenv("PATH", stand_in(tmp_path, "mnexec", '*" mininet:w0"', f'exec {shutil.which("mnexec")} '
                                                                             '"$1" sleep 600')["PATH"])
    t0 = time.monotonic()
    with pytest.raises(NetworkError) as e, Testbed(StarTopology.model_validate(SPEC).resolve(), state,
                                                    timeout_s=2):
        pass
    assert 2 <= time.monotonic() - t0 < 8
    assert str(e.value).startswith("bring-up took longer than timeout_s (2 s): host w0 did not start"), str(e.value)


def test_a_bridge_that_cannot_be_added_fails_bring_up_with_brctls_words(tmp_path, state, monkeypatch,
                                                                         no_leftovers):
    monkeypatch.setenv("PATH", stand_in(tmp_path, "brctl", '"addbr s1"',
                                        'echo "add bridge failed: Operation not supported" >&2; exit 1')["PATH"])
    with pytest.raises(NetworkError) as e, Testbed(StarTopology.model_validate(SPEC).resolve(), state):
        pass
    msg = str(e.value)
    assert msg.startswith("switch s1 did not come up: no bridge s1 (brctl addbr s1: add bridge failed: "
                          "Operation not supported"), msg


def test_teardown_of_a_shell_that_stopped_answering_ends_at_timeout_s(tmp_path, state, capfd, no_leftovers):
    """The switch's shell stopped (SIGSTOP): Mininet's stop would wait on it for good; past
    timeout_s the recorded state is removed instead, and nothing is left."""
    t0 = None
    with Testbed(StarTopology.model_validate(SPEC).resolve(), state, timeout_s=2) as tb:
        os.kill(tb.net.get("s1").shell.pid, signal.SIGSTOP)
        t0 = time.monotonic()
    assert time.monotonic() - t0 < 2 + 8
    assert "teardown: teardown took longer than timeout_s (2 s): switch s1 did not answer" in capfd.readouterr().err


def test_a_run_whose_host_does_not_start_fails_in_seconds_naming_it(tmp_path, no_leftovers):
    """Through `./inv run`: the row says which host and why, the network is torn down."""
    cfg = {"name": "bringup", "timeout_s": 60, "topology": SPEC, "roles": {"servers": ["ps"], "workers": ["w0", "w1"]},
           "workload": {"model": "cnn", "preset": "tiny", "iterations": 2, "batch_size": 8, "warmup": 1},
           "scheduler": "fifo"}
    path = tmp_path / "bringup.yaml"
    path.write_text(yaml.safe_dump(cfg))
    results = tmp_path / "results"
    r = invoke("run", str(path), "--results", str(results), timeout=120,
               env={**os.environ, **stand_in(tmp_path, "mnexec", *CHROOT_MNEXEC)})
    assert r.returncode == 1, r.stderr[-2000:]
    row = pd.read_parquet(results / "bringup" / "runs.parquet").iloc[0]
    assert row["status"] == "failed"
    assert row["reason"].startswith("network: host w1 did not start: its shell (mnexec -cdn bash) exited with "
                                    "code 1: remount: Invalid argument"), row["reason"]
    assert row["wall_s"] < 5, row["wall_s"]


def test_commands_in_hosts_do_not_need_the_callers_working_directory(tmp_path, state, monkeypatch, no_leftovers):
    """mnexec -a changes to the caller's working directory inside the host shell's mount
    namespace: one mounted after bring-up (as under a chroot, the repository) is not there."""
    later = tmp_path / "later"
    later.mkdir()
    with Testbed(StarTopology.model_validate(SPEC).resolve(), state) as tb:
        subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(later)], check=True)
        try:
            (later / "cwd").mkdir()
            monkeypatch.chdir(later / "cwd")
            dev, ns = tb.egress("w0", "s1")
            assert "htb 5:" in tc.run(["tc", "qdisc", "show", "dev", dev], ns)
            assert tb.tcp_setting("w0") == "cubic"
        finally:
            monkeypatch.chdir(tmp_path)
            subprocess.run(["umount", str(later)], check=True)
