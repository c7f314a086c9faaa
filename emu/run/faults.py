"""The thread that applies the config's faults (emu/config/faults.py) and undoes them, and what they cost.

A role target acts on the role's process group (stop, kill) or on its host (slow: the
host's CFS bandwidth cgroup, so every role on that host; the host is put in an unlimited
group from the start, so that only the fault changes its share). A kill fails the run (a
role that dies does); a stop, link_down or slow shorter than the stall window
(emu/run/watchdog.py) is survived, and `faults.parquet` says what it cost.

Like emu/testbed/shaping.py, `Faults` logs each fault's planned and actual start and end.
Unlike a rate change, a fault left in force would outlive the run's purpose (a stopped
process, a dead link, a throttled host), so `stop()` undoes every fault in force whatever
ended the run, and teardown is the backstop: stopped groups are continued and killed
(emu/testbed/cleanup.py), links and cgroups are deleted with the network.
"""
from __future__ import annotations

import math
import signal
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import pandas as pd

from contracts.iterations import first_measured
from emu.config.faults import Fault

COLUMNS = ["fault", "kind", "target", "host", "cpu", "planned_start_s", "actual_start_s", "planned_end_s",
           "actual_end_s", "ended", "note"]

# ---------------------------------------------------------------------------- runtime

@dataclass(frozen=True)
class FaultOps:
    """How faults act on the network (emu/testbed/network.py `Testbed` in a run; fakes in tests)."""
    signal: Callable[[str, int], bool]                  # role, signal -> False if it had exited
    set_link: Callable[[tuple[str, str], bool], None]   # link, up
    set_cpu: Callable[[str, float | None], None]        # host, share (None: its configured one)
    host_of: Mapping[str, str]                          # role -> host


class Faults:
    """Applies each fault at its time in one thread, undoes it after `for_s`, and logs both.
    `stop()` undoes whatever is still in force. `error` is set if an action failed (the
    runner fails the run with it); a role that had already exited is only noted."""

    def __init__(self, faults: list[Fault], ops: FaultOps):
        self.faults = faults
        self.ops = ops
        self.state = [{"actual_start_s": math.nan, "actual_end_s": math.nan, "ended": "", "note": ""}
                      for _ in faults]
        self._begun: set[int] = set()
        self._ended: set[int] = set()
        self._void: set[int] = set()     # begun, but the target had already exited
        self.error: BaseException | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="faults", daemon=True)
        self.t0 = time.monotonic()
        self.t0_wall = time.time()

    def start(self) -> Faults:
        self.t0, self.t0_wall = time.monotonic(), time.time()
        if self.faults:
            self._thread.start()
        return self

    def _events(self) -> list[tuple[float, int, int, str]]:
        """(time, order, fault, action): ends before begins at the same time (a fault may
        start where another on the same target ends)."""
        ev = [(f.at_s, 1, i, "begin") for i, f in enumerate(self.faults)]
        ev += [(f.end_s, 0, i, "end") for i, f in enumerate(self.faults) if f.end_s is not None]
        return sorted(ev)

    def _run(self) -> None:
        try:
            for t, _, i, action in self._events():
                if self._stop.wait(max(0.0, self.t0 + t - time.monotonic())):
                    return
                with self._lock:
                    if action == "begin":
                        self._begin(i)
                    elif i in self._begun and i not in self._ended:
                        self._end(i, "on time")
        except BaseException as e:  # noqa: BLE001 - reported by the runner
            self.error = e

    def _begin(self, i: int) -> None:
        f = self.faults[i]
        self.state[i]["actual_start_s"] = time.monotonic() - self.t0
        self._begun.add(i)
        if f.kind in ("stop", "kill"):
            if not self.ops.signal(f.target, signal.SIGSTOP if f.kind == "stop" else signal.SIGKILL):
                self.state[i]["note"] = "its target had already exited"
                self._ended.add(i)
                self._void.add(i)
        elif f.kind == "link_down":
            self.ops.set_link(f.target, False)
        else:
            self.ops.set_cpu(self.ops.host_of[f.target], f.cpu)

    def _end(self, i: int, how: str) -> None:
        f = self.faults[i]
        self._ended.add(i)
        if f.kind == "stop":
            if not self.ops.signal(f.target, signal.SIGCONT):
                self.state[i]["note"] = "its target exited while stopped"
        elif f.kind == "link_down":
            self.ops.set_link(f.target, True)
        elif f.kind == "slow":
            self.ops.set_cpu(self.ops.host_of[f.target], None)
        self.state[i]["actual_end_s"] = time.monotonic() - self.t0
        self.state[i]["ended"] = how

    def stop(self) -> None:
        """Stop applying faults and undo every one still in force, each on its own (one that
        cannot be undone is noted and does not keep the others in force)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(10)
        with self._lock:
            for i in sorted(self._begun - self._ended):
                if self.faults[i].kind == "kill":
                    continue
                try:
                    self._end(i, "at the run's end")
                except Exception as e:  # noqa: BLE001 - noted; teardown is the backstop
                    self.state[i]["note"] = f"undo failed: {type(e).__name__}: {e}"
                    self.error = self.error or e

    def in_force(self, now: float, recent_s: float = 0.0) -> list[str]:
        """Descriptions of the faults in force at monotonic `now`, and of those that ended
        within `recent_s` before it (their effects outlast them: TCP's backoff after a link
        comes back)."""
        out = []
        for i in self.in_force_ids(now, recent_s):
            end = self.state[i]["actual_end_s"]
            ended = f", ended {now - self.t0 - end:.1f} s before" if not math.isnan(end) else ""
            out.append(self.faults[i].describe(i) + ended)
        return out

    def in_force_ids(self, now: float, recent_s: float = 0.0) -> list[int]:
        """As `in_force`, the faults' indices (a kill stays in force once done)."""
        out = []
        for i, f in enumerate(self.faults):
            if i not in self._begun or i in self._void:
                continue
            end = self.state[i]["actual_end_s"]
            if f.kind == "kill" or math.isnan(end) or now - self.t0 - end <= recent_s:
                out.append(i)
        return out

    def killed(self, role: str) -> str | None:
        """The kill fault that hit `role`, described, if one did."""
        for i, f in enumerate(self.faults):
            if f.kind == "kill" and f.target == role and i in self._begun:
                return f.describe(i)
        return None

    def table(self) -> pd.DataFrame:
        """faults.parquet: one row per fault, planned against actual (seconds after the
        roles were launched; NaN: did not happen)."""
        rows = []
        for i, f in enumerate(self.faults):
            rows.append({"fault": i, "kind": f.kind, "target": f.target_text,
                         "host": "" if f.kind == "link_down" else self.ops.host_of.get(f.target, ""),
                         "cpu": f.cpu if f.cpu is not None else math.nan,
                         "planned_start_s": f.at_s, "planned_end_s": f.end_s if f.end_s is not None else math.nan,
                         **self.state[i]})
        return pd.DataFrame(rows, columns=COLUMNS)


# ---------------------------------------------------------------------------- cost

def job_iterations(iters: pd.DataFrame) -> pd.DataFrame:
    """The job's iterations: iteration k ends when its last worker ends it (lock-step), and
    takes `duration_s` = that end less iteration k-1's (iteration 0: less its first start)."""
    ends = iters.groupby("iteration")["end"].max().sort_index()
    prev = ends.shift(1)
    prev.iloc[0] = iters.loc[iters["iteration"] == ends.index[0], "start"].min()
    return pd.DataFrame({"iteration": ends.index, "begin": prev.values, "end": ends.values,
                         "duration_s": (ends - prev).values})


def costs(table: pd.DataFrame, iters: pd.DataFrame, t0_wall: float, warmup: int, iterations: int) -> list[float]:
    """Each fault's cost in iteration time: over the measured iterations whose span overlaps
    the fault (from its actual start to its end plus one median iteration, for the recovery:
    TCP's backoff after a link comes back, a slow start after a pause), the sum of their
    durations less the median. NaN for a fault that did not happen, a kill, or one that began
    before the first measured iteration (start-up is not a steady state to compare with)."""
    job = job_iterations(iters)
    first = first_measured(warmup, iterations)
    job = job[job["iteration"] >= max(first, 1)]
    if not len(job):
        return [math.nan] * len(table)
    median = float(job["duration_s"].median())
    out = []
    for _, f in table.iterrows():
        start = f["actual_start_s"]
        if f["kind"] == "kill" or math.isnan(start) or t0_wall + start < job["begin"].min():
            out.append(math.nan)
            continue
        end = f["actual_end_s"] if not math.isnan(f["actual_end_s"]) else start
        a, b = t0_wall + start, t0_wall + end + median
        hit = job[(job["end"] >= a) & (job["begin"] <= b)]
        out.append(float((hit["duration_s"] - median).sum()))
    return out
