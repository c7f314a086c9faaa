"""Recorded machine settings: the first original wins, and clean restores the oldest last.

The kernel is stood in for by a dict (a narrowly scoped fake of read/write_sysctl), so the
ordering logic is checked without touching this machine; the Mininet tests check the real
thing (tests/mininet/test_e2e_mininet.py, fresh machine)."""
from __future__ import annotations

import json

import pytest

from emu.testbed import cleanup


@pytest.fixture
def kernel(monkeypatch):
    values = {"net.ipv4.tcp_allowed_congestion_control": "reno bbr"}
    monkeypatch.setattr(cleanup, "read_sysctl", values.get)
    monkeypatch.setattr(cleanup, "write_sysctl", values.__setitem__)
    return values


def dead_orchestrator(root, pid: int) -> cleanup.StateDir:
    state = cleanup.StateDir(root, pid)
    state.path.mkdir(parents=True)
    (state.path / "owner.json").write_text(json.dumps({"pid": pid, "started": 1}))  # no such process
    return state


def test_second_change_keeps_the_first_original(tmp_path, kernel):
    state = dead_orchestrator(tmp_path, 999_999_001)
    key = "net.ipv4.tcp_allowed_congestion_control"
    state.change_sysctl(key, "reno bbr cubic")
    state.change_sysctl(key, "reno bbr cubic htcp")
    assert [r["original"] for r in state.sysctls()] == ["reno bbr"]
    assert state.teardown() == [f"sysctl {key} (restored to 'reno bbr')"]
    assert kernel[key] == "reno bbr"


def test_clean_restores_the_machines_own_value_across_killed_runs(tmp_path, kernel):
    """Run A is killed with cubic allowed; run B then records A's value as its original and
    is killed too. Whatever the pids' order, clean leaves the machine's own value."""
    key = "net.ipv4.tcp_allowed_congestion_control"
    first = dead_orchestrator(tmp_path, 999_999_900)
    first.change_sysctl(key, "reno bbr cubic")
    second = dead_orchestrator(tmp_path, 999_999_100)  # a lower pid: sorted first
    second.change_sysctl(key, "reno bbr cubic htcp")
    removed = cleanup.clean(root=tmp_path)
    assert kernel[key] == "reno bbr", removed
    assert not list(tmp_path.iterdir())


def test_unknown_sysctl_is_refused_before_anything_changes(tmp_path, kernel):
    state = dead_orchestrator(tmp_path, 999_999_002)
    with pytest.raises(OSError, match="not present"):
        state.change_sysctl("net.no.such.key", "1")
    assert state.sysctls() == [] and "net.no.such.key" not in kernel


def test_doctor_lists_every_setting_a_run_changes():
    """Each key a run may change has a doctor line that says it is restored."""
    from emu.testbed.capabilities import checks
    from emu.testbed.machine import ALLOWED_CC, RUN_LIMITS

    lines = {c.name: c for c in checks()}
    for key in [ALLOWED_CC, *(limit.key for limit in RUN_LIMITS)]:
        assert key in lines and "restored" in lines[key].handling, key
    assert {"mnexec", "tc", "iperf3", "cgcreate", "sysctl"} <= set(lines)
