"""Monitors of one run: link byte rates, qdisc backlog and drops, and CPU.

Two backends read the same things into the same tables (`backend`, the config's
`monitor.backend`; the run's row says which one ran):

- `netlink` (emu/testbed/netlink.py): one thread and one netlink socket per namespace, opened once.
  Every `qdisc_interval_s` (100 Hz by default, `monitor.netlink_qdisc_interval_s`) it asks
  each namespace for the root qdisc of its shaped interfaces; every `interval_s` (10 Hz) it
  reads every link counter of the root namespace in one dump, and the CPU. Queues are read
  first in a tick, so a snapshot always precedes the counter read that starts an interval.
- `tc` (the fallback, and the benchmark's baseline): link counters from
  /sys/class/net/*/statistics every `interval_s`, and `tc -s -j qdisc show`, one process
  per namespace, every `qdisc_interval_s`, in a thread of its own.

Byte rates of every link direction come from kernel counters of its root-namespace end;
backlog and drops from each direction's shaping (htb root) qdisc, each row with how long
the read took (the snapshot lies in [t - read_s, t]). CPU: the machine's idle fraction
(/proc/stat) and the orchestrator's own CPU use (/proc/self/stat, all its threads), per
`interval_s` but at most 10 times a second (`CPU_INTERVAL_MIN_S`).
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import threading
import time
from pathlib import Path

import pandas as pd

from emu.testbed.procstat import parse_stat

TICK = os.sysconf("SC_CLK_TCK")
# /proc/stat counts in ticks of 1/TICK s (10 ms), so a finer CPU sample is noise; reading it
# (the kernel formats every CPU's and interrupt's counters) costs about 1% of a core at 100 Hz.
CPU_INTERVAL_MIN_S = 0.1


def _cpu_times() -> tuple[float, float]:
    """(idle, total) jiffies of the whole machine."""
    f = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    v = [float(x) for x in f]
    return v[3] + v[4], sum(v[:8])


def _next_tick(t0: float, every: float, now: float) -> float:
    """The first tick of the grid t0 + k x every after now."""
    return t0 + (math.floor((now - t0) / every) + 1) * every


def _self_cpu() -> float:
    return sum(parse_stat(Path("/proc/self/stat").read_text())) / TICK


class _CpuSampler:
    """Appends (t - t0, the machine's idle fraction, the orchestrator's CPU share) to `rows`
    over each interval of at least `every` s, when asked at a tick that is due."""

    def __init__(self, t0: float, every: float, rows: list[tuple]):
        self.t0, self.every, self.rows = t0, every, rows
        self.last_t, (self.idle, self.total), self.me = t0, _cpu_times(), _self_cpu()
        self.due = t0 + every

    def sample(self, now: float) -> None:
        if now < self.due - 1e-6:
            return
        idle, total = _cpu_times()
        me = _self_cpu()
        self.rows.append((now - self.t0, (idle - self.idle) / max(total - self.total, 1e-9),
                          (me - self.me) / (now - self.last_t)))
        self.last_t, self.idle, self.total, self.me = now, idle, total, me
        self.due = _next_tick(self.t0, self.every, now)


BACKENDS = ("netlink", "tc")


def backend_for(configured: str | None) -> str:
    """The backend a run uses: the configured one, else netlink where it can run here."""
    if configured is not None:
        return configured
    from emu.testbed.netlink import available
    return "netlink" if available() is None else "tc"


class Monitor:
    def __init__(self, counters: dict[str, tuple[str, str]], egress: dict[str, tuple[str, int | None]],
                 rates: dict[tuple[str, str], float], interval_s: float = 0.1, qdisc_interval_s: float = 0.1,
                 backend: str = "tc"):
        """counters: label -> (root-ns interface, 'tx'|'rx'); egress: label -> (interface, ns pid);
        rates: (src, dst) -> configured bit/s now (updated by the shaper)."""
        if backend not in BACKENDS:
            raise ValueError(f"monitor backend {backend!r}: one of {', '.join(BACKENDS)}")
        self.backend = backend
        self.counters = counters
        self.egress = egress
        self.rates = rates
        self.interval_s = interval_s
        self.qdisc_interval_s = qdisc_interval_s
        self.cpu_interval_s = max(interval_s, CPU_INTERVAL_MIN_S)
        self.link_rows: list[tuple] = []
        self.qdisc_rows: list[tuple] = []
        self.cpu_rows: list[tuple] = []
        self._stop = threading.Event()
        self._sampler = None
        self._thread = threading.Thread(target=self._run if backend == "tc" else self._run_netlink, name="monitor",
                                        daemon=True)
        self._qthread = threading.Thread(target=self._run_qdiscs, name="qdisc-monitor", daemon=True)

    def _read(self, intf: str, direction: str) -> int:
        try:
            return int(Path(f"/sys/class/net/{intf}/statistics/{direction}_bytes").read_text())
        except (OSError, ValueError):
            return 0

    def _run(self) -> None:
        last = {k: self._read(*v) for k, v in self.counters.items()}
        last_t, cpu = self.t0, _CpuSampler(self.t0, self.cpu_interval_s, self.cpu_rows)
        while not self._stop.wait(self.interval_s - (time.monotonic() - self.t0) % self.interval_s):
            now = time.monotonic()
            dt = now - last_t
            for label, (intf, direction) in self.counters.items():
                cur = self._read(intf, direction)
                src, dst = label.split("->")
                self.link_rows.append((label, now - self.t0, (cur - last[label]) / dt, self.rates[(src, dst)]))
                last[label] = cur
            last_t = now
            cpu.sample(now)

    def _run_qdiscs(self) -> None:
        by_ns: dict[int | None, dict[str, str]] = {}
        for label, (dev, ns) in self.egress.items():
            by_ns.setdefault(ns, {})[dev] = label
        while not self._stop.wait(self.qdisc_interval_s):
            for ns, devs in by_ns.items():
                cmd = (["mnexec", "-a", str(ns)] if ns is not None else []) + ["tc", "-s", "-j", "qdisc", "show"]
                try:
                    before = time.monotonic()
                    out = subprocess.run(cmd, capture_output=True, text=True, timeout=2).stdout
                    after = time.monotonic()
                    t, read_s = after - self.t0, after - before  # the snapshot lies in [t - read_s, t]
                    for q in json.loads(out or "[]"):
                        if q.get("root") and q.get("dev") in devs:
                            self.qdisc_rows.append((devs[q["dev"]], t, read_s, q.get("backlog", 0), q.get("drops", 0)))
                except (subprocess.SubprocessError, ValueError, OSError):
                    continue

    def _run_netlink(self) -> None:
        """Queues every qdisc_interval_s, then (when due) counters and CPU every interval_s, on
        one clock from t0; a tick that comes late is taken once, not caught up."""
        nl = self._sampler
        last = {label: (v, self.t0) for label, v in nl.counters().items()}  # label -> (counter, when read)
        direction = {label: tuple(label.split("->")) for label in self.counters}  # the key of `rates`
        cpu = _CpuSampler(self.t0, self.cpu_interval_s, self.cpu_rows)
        q_every = self.qdisc_interval_s if self.egress else math.inf
        next_q, next_l = self.t0 + q_every, self.t0 + self.interval_s
        while not self._stop.wait(max(0.0, min(next_q, next_l) - time.monotonic())):
            now = time.monotonic()
            links_due = now >= next_l
            # Queues are read just before the counters whenever their tick is near, so that
            # each counter interval starts after a snapshot (emu/testbed/fidelity.py).
            if now >= next_q or (links_due and next_q - now < q_every / 2):
                nl.qdiscs(self.qdisc_rows, self.t0)
                next_q = _next_tick(self.t0, q_every, now)
            if not links_due:
                continue
            now = time.monotonic()  # before the counters are read
            t, rows, rates = now - self.t0, self.link_rows, self.rates
            for label, v in nl.counters().items():  # a failed read leaves labels out, not wrong
                was = last.get(label)
                if was is not None:
                    rows.append((label, t, (v - was[0]) / (now - was[1]), rates[direction[label]]))
                last[label] = (v, now)
            cpu.sample(now)
            next_l = _next_tick(self.t0, self.interval_s, now)

    def start(self) -> Monitor:
        """Starts sampling; with the netlink backend, opens its sockets first (NetlinkError if
        a namespace or interface cannot be opened)."""
        if self.backend == "netlink":
            from emu.testbed.netlink import Sampler
            self._sampler = Sampler(self.egress, self.counters)
        self.t0 = time.monotonic()
        self.t0_wall = time.time()
        self._thread.start()
        if self.egress and self.backend == "tc":
            self._qthread.start()
        return self

    def stop(self) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
        """(links, qdiscs, cpu) tables."""
        self._stop.set()
        self._thread.join(2)
        if self._qthread.is_alive():
            self._qthread.join(3)
        if self._sampler is not None and not self._thread.is_alive():
            self._sampler.close()  # its sockets hold the hosts' namespaces
        links = pd.DataFrame(self.link_rows, columns=["link", "t", "tx_bytes_per_s", "configured_bps"])
        qdiscs = pd.DataFrame(self.qdisc_rows, columns=["link", "t", "read_s", "backlog_bytes", "drops"])
        cpu = pd.DataFrame(self.cpu_rows, columns=["t", "cpu_idle", "harness_cpu"])
        return links, qdiscs, cpu
