"""Fault injection in the runner's wait loop over a real loopback job (tests/loopback_roles.py):
a stop longer than the window fails the run naming the fault, and an injected kill is named in
the exit reason. The rest of fault injection is in tests/unit/test_faults.py."""
from __future__ import annotations

import time

import pytest

from emu.run.faults import FaultOps, Faults
from emu.run.watchdog import proc_state


def _run_with_faults(tmp_path, fault_specs, **changes):
    """The runner's wait loop over a real loopback job with `fault_specs` injected, as
    _execute wires them: (the reason it failed with, the faults table, the watchdog)."""
    from emu.run.runner import RunFailed, _evidence, _fault_table, _wait_for_roles, _watchdog
    from tests.loopback_roles import launched, replay_job

    exp = replay_job(faults=fault_specs, **changes)
    with launched(tmp_path, exp) as (bed, roles, rec, logs):
        f = Faults(exp.faults, FaultOps(signal=bed.signal_role, set_link=lambda *a: None,
                                        set_cpu=lambda *a: None, host_of=exp.role_hosts)).start()
        wd = _watchdog(exp, roles, {"ps": "127.0.0.1"}, rec, f.t0)
        try:
            with pytest.raises(RunFailed) as failed:
                _wait_for_roles(bed, roles, exp, logs, rec, lambda n: None, background=(f,), watchdog=wd,
                                evidence=lambda st: _evidence(bed, st, f), faults=f)
            now = time.monotonic()
            failing = f.in_force_ids(now, wd.window_now.seconds)
        finally:
            f.stop()
        states = {r: proc_state(p.pid) for r, p in bed.roles.items()}
    return str(failed.value), _fault_table(f, wd, now - f.t0, failing), states


@pytest.mark.slow
def test_a_stop_longer_than_the_window_fails_the_run_naming_the_fault(tmp_path):
    text, t, states = _run_with_faults(tmp_path, [{"at_s": 3, "kind": "stop", "target": "worker0", "for_s": 60}],
                                       watchdog={"stall_s": 3})
    assert text.startswith("stalled: fault faults[0] (stop worker0 at 3 s for 60 s) in force; "
                           "worker0 on w0 made no progress for "), text
    assert "is stopped (SIGSTOP)" in text
    assert 3 <= t.loc[0, "reason_after_s"] <= 3 + 2.5 and t.loc[0, "stall_max_s"] >= 3
    assert t.loc[0, "ended"] == "at the run's end"           # continued before teardown
    assert all(s in ("S", "R", "D") for s in states.values()), states  # continued: not T (D: waiting on I/O)


@pytest.mark.slow
def test_an_injected_kill_is_named_in_the_exit_reason(tmp_path):
    text, t, _ = _run_with_faults(tmp_path, [{"at_s": 3, "kind": "kill", "target": "worker1"}])
    assert text.startswith("worker1 on w1 was killed by SIGKILL (injected: faults[0] (kill worker1 at 3 s))"), text
    assert 0 <= t.loc[0, "reason_after_s"] <= 2
