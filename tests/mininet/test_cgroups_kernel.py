"""CPU cgroups on the real kernel (emu/testbed/cgroups.py), as root; tests/unit/test_cgroups.py has the
recorded trees and why cpu.max on a real v2 kernel is shown only there.

The v1 tree drives this machine's cpu hierarchy, and the v2 tree's mechanics (its own cgroup, a
controller enabled in the parents' subtree_control and taken back, a process joined through
cgroup.procs, removal) run on the real unified hierarchy (hugetlb where that is all it offers).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from emu.testbed import cgroups, cleanup
from emu.testbed.network import _joining
from tests.conftest import wait_for


def dead_state(tmp_path: Path, pid: int = 999_999_101) -> cleanup.StateDir:
    state = cleanup.StateDir(tmp_path / "state", pid)
    state.path.mkdir(parents=True)
    (state.path / "owner.json").write_text(json.dumps({"pid": pid, "started": 1}))  # no such process
    return state


def _sleeper(files: list[Path]) -> subprocess.Popen:
    return subprocess.Popen([*_joining(files), "sleep", "30"], start_new_session=True)


def _stop(p: subprocess.Popen) -> None:
    os.killpg(p.pid, signal.SIGKILL)
    p.wait(5)


def test_v1_tree_on_this_kernel(tmp_path):
    layout = cgroups.detect()
    t = layout.cpu_tree()
    if not isinstance(t, cgroups.V1CpuTree):
        pytest.skip(f"the cpu controller is not bound to v1 here ({layout.describe()})")
    name = f"schedlab-test-{os.getpid()}"
    state = dead_state(tmp_path)
    state.add_cgroup(name, t.paths(name))
    try:
        t.create(name)
        assert t.set_limit(name, 0.1) == cgroups.cfs_limit(0.1)
        assert t.set_limit(name, -1) == (-1, cgroups.PERIOD_US)
        p = _sleeper(t.procs_files(name))
        try:
            cg = wait_for(lambda: (c := Path(f"/proc/{p.pid}/cgroup").read_text()).count(f":/{name}\n") == 2 and c,
                          5, "the sleeper in its group")
            assert f":cpu:/{name}\n" in cg and f":cpuacct:/{name}\n" in cg, cg
            assert t.pids(name) == [p.pid]
        finally:
            _stop(p)
    finally:
        found = state.teardown()
    assert found == [f"cgroup {name}"] and not any(d.exists() for d in t.paths(name))


def test_v2_tree_mechanics_on_this_kernels_unified_hierarchy(tmp_path):
    """Its own cgroup under the unified root, a controller enabled in the subtree_control of
    each cgroup above the group (recorded) and taken back, a process joined, everything
    removed. The controller is cpu where the unified root offers it, else one it does offer
    (this machine: hugetlb, the only one not bound to v1)."""
    layout = cgroups.detect()
    if layout.v2 is None or not layout.v2_controllers:
        pytest.skip(f"no unified hierarchy with a controller here ({layout.describe()})")
    ctl = "cpu" if "cpu" in layout.v2_controllers else layout.v2_controllers[0]
    root_subtree = (layout.v2 / "cgroup.subtree_control").read_text()
    parent = f"schedlab-test-{os.getpid()}"
    t = cgroups.V2CpuTree(layout.v2, parent=parent, controller=ctl)
    state = dead_state(tmp_path)
    state.add_cgroup("w1", t.paths("w1"))
    try:
        t.create("w1", on_change=state.add_cgroup_change)
        assert ctl in (layout.v2 / parent / "cgroup.subtree_control").read_text().split()
        assert ctl in (layout.v2 / parent / "w1" / "cgroup.controllers").read_text().split()
        if ctl == "cpu":
            assert t.set_limit("w1", 0.1) == cgroups.cfs_limit(0.1)
            assert t.set_limit("w1", -1) == (-1, cgroups.PERIOD_US)
        p = _sleeper(t.procs_files("w1"))
        try:
            wait_for(lambda: f"\n0::/{parent}/w1\n" in "\n" + Path(f"/proc/{p.pid}/cgroup").read_text(), 5,
                     "the sleeper in its group")
            assert t.pids("w1") == [p.pid]
        finally:
            _stop(p)
    finally:
        found = state.teardown()
        if (layout.v2 / "cgroup.subtree_control").read_text() != root_subtree:  # never leave it changed
            cgroups._write(layout.v2 / "cgroup.subtree_control", f"-{ctl}")
    assert found[0] == "cgroup w1" and f"cgroup {layout.v2}/{parent}" in found
    assert not (layout.v2 / parent).exists()
    assert (layout.v2 / "cgroup.subtree_control").read_text() == root_subtree
