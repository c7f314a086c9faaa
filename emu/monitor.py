"""Monitors of one run: link byte rates, qdisc backlog and drops, and CPU.

- Byte rates of every link direction come from kernel counters of its root-namespace end
  (/sys/class/net/*/statistics), every `interval_s` (10 Hz by default): cheap file reads.
- Backlog and drops of each direction's shaping qdisc come from `tc -s -j qdisc show`,
  one call per network namespace every `qdisc_interval_s`: host-side qdiscs live in the
  hosts' namespaces, so this costs one short process per host per sample.
- CPU: the machine's idle fraction (/proc/stat) and the orchestrator's own CPU use
  (/proc/self/stat, all its threads), per interval.
"""
from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from pathlib import Path

import pandas as pd

TICK = os.sysconf("SC_CLK_TCK")


def _cpu_times() -> tuple[float, float]:
    """(idle, total) jiffies of the whole machine."""
    f = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    v = [float(x) for x in f]
    return v[3] + v[4], sum(v[:8])


def _self_cpu() -> float:
    st = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
    return (int(st[11]) + int(st[12])) / TICK


class Monitor:
    def __init__(self, counters: dict[str, tuple[str, str]], egress: dict[str, tuple[str, int | None]],
                 rates: dict[tuple[str, str], float], interval_s: float = 0.1, qdisc_interval_s: float = 0.1):
        """counters: label -> (root-ns interface, 'tx'|'rx'); egress: label -> (interface, ns pid);
        rates: (src, dst) -> configured bit/s now (updated by the shaper)."""
        self.counters = counters
        self.egress = egress
        self.rates = rates
        self.interval_s = interval_s
        self.qdisc_interval_s = qdisc_interval_s
        self.link_rows: list[tuple] = []
        self.qdisc_rows: list[tuple] = []
        self.cpu_rows: list[tuple] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="monitor", daemon=True)
        self._qthread = threading.Thread(target=self._run_qdiscs, name="qdisc-monitor", daemon=True)

    def _read(self, intf: str, direction: str) -> int:
        try:
            return int(Path(f"/sys/class/net/{intf}/statistics/{direction}_bytes").read_text())
        except (OSError, ValueError):
            return 0

    def _run(self) -> None:
        last = {k: self._read(*v) for k, v in self.counters.items()}
        last_t, (last_idle, last_total), last_self = self.t0, _cpu_times(), _self_cpu()
        while not self._stop.wait(self.interval_s - (time.monotonic() - self.t0) % self.interval_s):
            now = time.monotonic()
            dt = now - last_t
            for label, (intf, direction) in self.counters.items():
                cur = self._read(intf, direction)
                src, dst = label.split("->")
                self.link_rows.append((label, now - self.t0, (cur - last[label]) / dt, self.rates[(src, dst)]))
                last[label] = cur
            idle, total = _cpu_times()
            me = _self_cpu()
            self.cpu_rows.append((now - self.t0, (idle - last_idle) / max(total - last_total, 1e-9),
                                  (me - last_self) / dt))
            last_t, last_idle, last_total, last_self = now, idle, total, me

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

    def start(self) -> Monitor:
        self.t0 = time.monotonic()
        self.t0_wall = time.time()
        self._thread.start()
        if self.egress:
            self._qthread.start()
        return self

    def stop(self) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
        """(links, qdiscs, cpu) tables."""
        self._stop.set()
        self._thread.join(2)
        if self._qthread.is_alive():
            self._qthread.join(3)
        links = pd.DataFrame(self.link_rows, columns=["link", "t", "tx_bytes_per_s", "configured_bps"])
        qdiscs = pd.DataFrame(self.qdisc_rows, columns=["link", "t", "read_s", "backlog_bytes", "drops"])
        cpu = pd.DataFrame(self.cpu_rows, columns=["t", "cpu_idle", "harness_cpu"])
        return links, qdiscs, cpu
