"""Fault injection without a network (emu/run/faults.py): the timeline, planned against actual,
every fault undone whatever ends the run, signals on real processes, and what a fault cost (in
the runner's loop over real roles: tests/loopback/test_faults_loopback.py)."""
from __future__ import annotations

import math
import os
import signal
import sys
import time

import pandas as pd
import pytest

from emu.config.faults import Fault
from emu.run.faults import FaultOps, Faults, costs, job_iterations
from emu.run.watchdog import proc_state

HOSTS = {"server0": "ps", "worker0": "w0", "worker1": "w1"}


class Recorder:
    """Fake network operations that log what they were asked, and when."""

    def __init__(self, exited=(), fail_on=None):
        self.calls: list[tuple[float, str, object, object]] = []
        self.exited = set(exited)
        self.fail_on = fail_on
        self.t0 = time.monotonic()

    def _log(self, what, a, b):
        if what == self.fail_on:
            raise RuntimeError(f"{what} failed")
        self.calls.append((time.monotonic() - self.t0, what, a, b))

    def ops(self) -> FaultOps:
        def sig(role, s):
            if role in self.exited:
                return False
            self._log("signal", role, signal.Signals(s).name)
            return True
        return FaultOps(signal=sig, set_link=lambda link, up: self._log("link", "-".join(link), up),
                        set_cpu=lambda host, share: self._log("cpu", host, share), host_of=HOSTS)


def faults(*specs) -> list[Fault]:
    return [Fault.model_validate(s) for s in specs]


@pytest.mark.slow
def test_each_fault_is_applied_and_undone_on_time_and_logged():
    rec = Recorder()
    f = Faults(faults({"at_s": 0.1, "kind": "stop", "target": "worker0", "for_s": 0.3},
                      {"at_s": 0.2, "kind": "link_down", "target": ["w1", "s1"], "for_s": 0.15},
                      {"at_s": 0.25, "kind": "slow", "target": "worker1", "cpu": 0.1, "for_s": 0.05},
                      {"at_s": 0.5, "kind": "kill", "target": "server0"}), rec.ops())
    f.start()
    time.sleep(0.8)
    f.stop()
    assert f.error is None
    assert [(what, a, b) for _, what, a, b in rec.calls] == [
        ("signal", "worker0", "SIGSTOP"), ("link", "w1-s1", False), ("cpu", "w1", 0.1), ("cpu", "w1", None),
        ("link", "w1-s1", True), ("signal", "worker0", "SIGCONT"), ("signal", "server0", "SIGKILL")]
    t = f.table()
    assert list(t["target"]) == ["worker0", "w1-s1", "worker1", "server0"]
    assert list(t["host"]) == ["w0", "", "w1", "ps"]
    assert (t["actual_start_s"] - t["planned_start_s"]).between(0, 0.05).all()
    done = t[t["kind"] != "kill"]
    assert (done["actual_end_s"] - done["planned_end_s"]).between(0, 0.05).all()
    assert list(t["ended"]) == ["on time", "on time", "on time", ""]
    assert math.isnan(t.loc[3, "actual_end_s"]) and math.isnan(t.loc[3, "planned_end_s"])


def test_stop_undoes_every_fault_in_force_and_no_later_one_begins():
    rec = Recorder()
    f = Faults(faults({"at_s": 0, "kind": "stop", "target": "worker0", "for_s": 60},
                      {"at_s": 0, "kind": "link_down", "target": ["w1", "s1"], "for_s": 60},
                      {"at_s": 0, "kind": "slow", "target": "worker1", "cpu": 0.5, "for_s": 60},
                      {"at_s": 30, "kind": "kill", "target": "server0"}), rec.ops()).start()
    time.sleep(0.2)
    assert len(f.in_force(time.monotonic())) == 3
    f.stop()
    undone = [(what, a, b) for _, what, a, b in rec.calls[3:]]
    assert sorted(undone, key=str) == sorted([("signal", "worker0", "SIGCONT"), ("link", "w1-s1", True),
                                              ("cpu", "w1", None)], key=str)
    t = f.table()
    assert list(t["ended"]) == ["at the run's end"] * 3 + [""]
    assert math.isnan(t.loc[3, "actual_start_s"])              # never reached
    assert f.in_force(time.monotonic()) == []


def test_one_undo_that_fails_does_not_keep_the_others_in_force():
    rec = Recorder(fail_on="link")
    f = Faults(faults({"at_s": 0, "kind": "stop", "target": "worker0", "for_s": 60}), rec.ops()).start()
    time.sleep(0.1)
    f.faults.append(Fault.model_validate({"at_s": 0, "kind": "link_down", "target": ["w1", "s1"], "for_s": 60}))
    f.state.append({"actual_start_s": 0.0, "actual_end_s": math.nan, "ended": "", "note": ""})
    f._begun.add(1)                                             # as if its begin had gone through
    f.stop()
    assert ("signal", "worker0", "SIGCONT") in [(w, a, b) for _, w, a, b in rec.calls]
    assert f.state[1]["note"] == "undo failed: RuntimeError: link failed" and f.error is not None


def test_a_failed_action_is_the_helpers_error_and_a_gone_target_only_a_note():
    rec = Recorder(exited={"worker0"}, fail_on="link")
    f = Faults(faults({"at_s": 0, "kind": "stop", "target": "worker0", "for_s": 1},
                      {"at_s": 0.05, "kind": "link_down", "target": ["w1", "s1"], "for_s": 1}), rec.ops()).start()
    time.sleep(0.3)
    f.stop()
    assert str(f.error) == "link failed"
    t = f.table()
    assert t.loc[0, "note"] == "its target had already exited"
    assert not any(d.startswith("faults[0]") for d in f.in_force(time.monotonic()))   # it hit nothing
    assert t.loc[1, "note"] == "undo failed: RuntimeError: link failed"   # a half-done fault is undone too


def test_faults_in_force_include_those_just_ended_and_kills():
    rec = Recorder()
    f = Faults(faults({"at_s": 0, "kind": "link_down", "target": ["w1", "s1"], "for_s": 0.1},
                      {"at_s": 0, "kind": "kill", "target": "server0"}), rec.ops()).start()
    time.sleep(0.3)
    now = time.monotonic()
    assert f.in_force(now) == ["faults[1] (kill server0 at 0 s)"]
    recent = f.in_force(now, recent_s=10)
    assert recent[0].startswith("faults[0] (link_down w1-s1 at 0 s for 0.1 s), ended 0.") and len(recent) == 2
    assert f.killed("server0") == "faults[1] (kill server0 at 0 s)" and f.killed("worker0") is None
    f.stop()


@pytest.mark.slow
def test_stop_and_kill_act_on_a_real_process_group(procs):
    """SIGSTOP freezes the whole group (state T), SIGCONT resumes it on time, a kill ends it."""
    p = procs.start([sys.executable, "-c", "import time\nwhile True: time.sleep(0.01)"], start_new_session=True)

    def sig(role, s):
        if p.poll() is not None:
            return False
        os.killpg(p.pid, s)
        return True
    ops = FaultOps(signal=sig, set_link=lambda *a: None, set_cpu=lambda *a: None, host_of=HOSTS)
    f = Faults(faults({"at_s": 0.1, "kind": "stop", "target": "worker0", "for_s": 0.5},
                      {"at_s": 1.0, "kind": "kill", "target": "worker0"}), ops).start()
    time.sleep(0.35)
    assert proc_state(p.pid) == "T"
    time.sleep(0.45)
    assert proc_state(p.pid) in ("S", "R")
    assert p.wait(5) == -signal.SIGKILL
    f.stop()
    t = f.table()
    assert t.loc[0, "ended"] == "on time" and 0.45 <= t.loc[0, "actual_end_s"] - t.loc[0, "actual_start_s"] <= 0.6


# ---------------------------------------------------------------- cost

def iterations_with_a_pause(n=40, dt=0.2, pause_at=20, pause_s=5.0, t0=1000.0):
    """Two lock-step workers; iteration `pause_at` takes pause_s longer."""
    rows, t = [], t0
    for k in range(n):
        d = dt + (pause_s if k == pause_at else 0.0)
        for rank in (0, 1):
            rows.append({"rank": rank, "iteration": k, "start": t + 0.001 * rank, "end": t + d - 0.001 * (1 - rank)})
        t += d
    return pd.DataFrame(rows)


def table(*rows):
    base = {"fault": 0, "kind": "stop", "target": "worker0", "actual_end_s": math.nan}
    return pd.DataFrame([{**base, **r} for r in rows])


def test_a_pause_costs_its_length_in_iteration_time():
    iters = iterations_with_a_pause()
    job = job_iterations(iters)
    assert len(job) == 40 and job["duration_s"].median() == pytest.approx(0.2)
    # the roles launched at wall 990: the pause began 10 s + 4 iterations in... at iteration 20's start
    t0 = 990.0
    start = 1000.0 + 20 * 0.2 + 0.05 - t0
    got = costs(table({"actual_start_s": start, "actual_end_s": start + 5.0},
                      {"kind": "kill", "actual_start_s": start},
                      {"actual_start_s": math.nan},
                      {"actual_start_s": 1.0, "actual_end_s": 2.0}), iters, t0, warmup=2, iterations=40)
    assert got[0] == pytest.approx(5.0, abs=0.01)
    assert math.isnan(got[1]) and math.isnan(got[2])          # a kill; a fault that never happened
    assert math.isnan(got[3])                                  # during start-up: nothing to compare with


def test_a_fault_that_costs_nothing_costs_about_nothing():
    iters = iterations_with_a_pause(pause_s=0.0)
    start = 1000.0 + 10 * 0.2 + 0.05
    assert costs(table({"actual_start_s": start, "actual_end_s": start + 1.0}), iters, 0.0, 2, 40)[0] \
        == pytest.approx(0.0, abs=1e-9)


# ---------------------------------------------------------------- in the runner's loop, real roles


