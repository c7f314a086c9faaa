"""What one run writes into the results directory, estimated from its config before it runs.

A sweep into a results directory that cannot hold it fails hours in, on the run that filled the
disk. So the sweep checks first (emu/sweeps/space.py), and needs each run's size beforehand: the
tables grow with the run's duration at the monitors' rates (every link direction's counters at
`monitor.interval_s`, its queue at the qdisc interval: 100 Hz with netlink, the largest table by
far), with workers x iterations (x layers), and with tracing (every scheduler event, every data
frame); a fixed part (config, meta, role specs, logs, TCP counters) and the run's row come on
top. Bytes per row are as written (compressed Parquet, the roles' JSON records), measured on runs
of the reference machine; the model is pure: the duration and the workload's facts (from its
profile) are given. Earlier runs of the sweep, where there are some, are better evidence, and the
sweep's check prefers them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from emu.config.experiment import NETLINK_QDISC_INTERVAL_S, Experiment

# Bytes per row as written, measured on the reference machine (netlink monitor, 38 runs of the
# incast and priority8 sweeps, 8 workers, and the bench-datapath and a 32-worker dilated run:
# the model within 5% of each; the traced parts on the demo with trace: true).
PER_ROW = {
    "links": 9.3,        # per link direction and sample
    "qdiscs": 9.4,       # per shaped interface and sample
    "cpu": 13.0,         # per sample
    "iterations": 50.0,  # per worker and iteration (Parquet) ...
    "layers": 27.0,      # per worker, iteration and layer
    "events": 8.6,       # traced: per scheduler event
    "tx_frames": 26.0,   # traced, parameter-server family: per data frame (Parquet)
}
RECORD_ITERATION = 300.0   # ... and in the worker's JSON record (records/worker<r>.json)
RECORD_LAYER = 170.0       # per worker, iteration and layer in the JSON record
RECORD_EVENT = 45.0        # traced: per event in a role's JSON record
RECORD_FRAME = 62.0        # traced: per data frame in a role's .npz record
FIXED = 30_000.0           # config.yaml, meta.json, logs, tcp.parquet, the tables' Parquet headers
PER_ROLE = 1_000.0         # each role's spec (roles/*.json) ...
PER_ROLE_LINK = 260.0      # ... which holds the capacity graph: per link of the topology
FILES, FILES_PER_ROLE = 12, 5   # files of a run: its own, and each role's (spec, logs, record, progress)
BLOCK_SLACK = 2_048.0      # what a file's last block wastes on average (4 kB blocks; du counts blocks)
ROW = 500.0                # the run's row in runs.parquet (one of 4-24 rows: 83-94 kB) ...
RUNS_BASE = 80_000.0       # ... whose schema and pandas metadata (a hundred-odd columns) come once
EVENTS_PER_KEY = 4.0       # traced: events per tensor, iteration and role (fifo 3, bytescheduler 5.6 on the demo)
FRAME_BYTES = 65_536.0     # traced: a data frame carries at most this many gradient bytes


@dataclass(frozen=True)
class WorkloadFacts:
    """What the model needs of the workload beyond the config: from its profile."""

    layers: int
    keys: int
    grad_bytes: int


@dataclass(frozen=True)
class Footprint:
    """A run's estimated bytes on disk, and the parts they come from (for the figures a refusal shows)."""

    total: int
    parts: dict[str, int]

    def largest(self, n: int = 2) -> str:
        top = sorted(self.parts.items(), key=lambda kv: -kv[1])[:n]
        return ", ".join(f"{name} {mb(b)}" for name, b in top)


def mb(n: float) -> str:
    """Bytes as a short figure: 340 kB, 12.3 MB, 1.20 GB."""
    if n < 1e6:
        return f"{n / 1e3:.0f} kB"
    if n < 1e9:
        return f"{n / 1e6:.1f} MB"
    return f"{n / 1e9:.2f} GB"


def run_bytes(exp: Experiment, wall_s: float, facts: WorkloadFacts | None, netlink: bool = True,
              k: float | None = None) -> Footprint:
    """One run of `exp` lasting `wall_s` seconds of wall clock at time dilation `k` (default: the
    experiment's; the monitors sample k times less often in wall clock). `netlink`: the monitor's
    backend (the config's, else the one most machines run: netlink, the faster queue sampling).
    `facts`: None where the workload has no profile (layers and tracing then count one layer, one
    tensor and a megabyte of gradient)."""
    k = float(k if k is not None else (1.0 if exp.auto_dilation else exp.time_dilation))
    facts = facts or WorkloadFacts(layers=1, keys=1, grad_bytes=1_000_000)
    workers, servers = len(exp.roles.workers), len(exp.roles.servers)
    its = int(exp.workload["iterations"])
    directions = 2 * len(exp.net.links)
    mon = exp.monitor
    backend_netlink = mon.backend == "netlink" or (mon.backend is None and netlink)
    qdisc_s = (mon.netlink_qdisc_interval_s or NETLINK_QDISC_INTERVAL_S) if backend_netlink else mon.qdisc_interval_s
    rows = {
        "links": directions * wall_s / (mon.interval_s * k),
        "qdiscs": directions * wall_s / (qdisc_s * k),
        "cpu": wall_s / max(mon.interval_s * k, 0.1),
        "iterations": workers * its,
        "layers": workers * its * facts.layers,
    }
    parts = {name: n * PER_ROW[name] for name, n in rows.items()}
    parts["records"] = workers * its * (RECORD_ITERATION + facts.layers * RECORD_LAYER)
    if exp.trace:
        events = (workers + servers) * its * facts.keys * EVENTS_PER_KEY
        parts["events"] = events * (PER_ROW["events"] + RECORD_EVENT)
        if servers:   # each worker's pushes and each server's results, as data frames
            frames = 2 * workers * its * math.ceil(facts.grad_bytes / FRAME_BYTES)
            parts["tx_frames"] = frames * (PER_ROW["tx_frames"] + RECORD_FRAME)
    parts["roles"] = (workers + servers) * (PER_ROLE + PER_ROLE_LINK * len(exp.net.links))
    parts["fixed"] = FIXED
    parts["blocks"] = BLOCK_SLACK * (FILES + FILES_PER_ROLE * (workers + servers))
    parts = {name: int(b) for name, b in parts.items()}
    return Footprint(total=sum(parts.values()), parts=parts)
