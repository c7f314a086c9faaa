"""Time dilation, after Gupta et al., "To Infinity and Beyond: Time-Warped Network Emulation"
(NSDI 2006): an experiment run k times slower, on links k times slower, is the same
experiment, and the machine has k times the CPU for each emulated second.

`time_dilation: k` (emu/config/experiment.py; 1, the default, changes nothing) has two halves here:

- `wall_plan(exp)`: what the testbed runs, in wall-clock time. Every link rate is divided by
  k (the topology, every shaping schedule's rates, cross-traffic rates); every time is
  multiplied by k: replayed compute (the workers get `speedup / k`), queue lengths in time
  (`queue_ms`, so a queue holds the same bytes: rate / k x queue_ms x k), propagation delay,
  shaping schedule times, periods and ON/OFF means (their points, computed in emulated time,
  are stretched), cross-traffic start and stop, the monitors' sampling intervals, the run's
  `timeout_s`, the roles' connect timeout, the servers' grace after the workers, and every
  scheduler tunable that is a time (named `*_s`, `*_ms`, `*_us`: `startup_us`, forest's
  `probe_s` and `chunk_ms`, gloo's `timeout_s`), at its default too where the config leaves it
  out (`Experiment.time_params`). A scheduler never learns k: it is handed slower links and
  longer times, and it lives in wall-clock time (its capacity graph in the role spec holds
  the rates the links really run at).
  `time_dilation: auto` has no k of its own: the runner is handed the k chosen for this machine
  (emu/sweeps/autodilate.py) and runs `wall_plan(exp, k)`; the experiment, its config.yaml
  and its run id keep `auto`.
- `table_to_emulated` and friends: what the run measured, back in emulated time, at
  collection (emu/run/runner.py), so every stored table and the row are in emulated time:
  durations divided by k, rates multiplied by k, wall-clock instants t mapped to
  origin + (t - origin) / k around the monitors' t = 0 (`monitor_t0_wall`, which stays as it
  is), monitor-relative times divided by k. The row records `time_dilation`, and `wall_s`,
  `bringup_s`, `teardown_s` stay wall-clock seconds of the harness.

What cannot be dilated: real PyTorch compute (it runs at the machine's speed, so
`workload.compute: real` with k > 1 is refused), TCP's own timers (minimum RTO 200 ms,
delayed ACKs, TCP_USER_TIMEOUT) and htb's burst (1 ms of wall clock), the transport's
constants (its unsent-bytes bounds of 10, 2 and 0.5 ms, counted in wall-clock time of the
slower rate), and the per-message CPU costs of Python and the kernel, which shrink k times
against the dilated links: that is the point, the CPU headroom that lets more hosts run
faithfully. `scheduler_info.json` is the scheduler's own report, in its wall-clock units.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import pandas as pd

from contracts.role_spec import DEAD_PEER_S
from emu.config.crosstraffic import Flow
from emu.config.shaping import schedule_events
from emu.config.topospec import NetSpec

MAX_TIME_DILATION = 100.0
AUTO = "auto"  # time_dilation: auto, the k chosen per run on this machine (emu/sweeps/autodilate.py)
CONNECT_TIMEOUT_S = 60.0   # the roles' bound on connecting, accepting and rendezvous
ROLES_GRACE_S = 15.0       # servers may outlive the workers by this much
TIME_SUFFIXES = ("_s", "_ms", "_us")  # a scheduler tunable with such a name is a time


def is_time(name: str) -> bool:
    return name.endswith(TIME_SUFFIXES)


# ---------------------------------------------------------------------------- the run in wall-clock time

def dilate_net(net: NetSpec, k: float) -> NetSpec:
    """`net` with every rate divided by k and its queues (queue_ms) and delays multiplied by
    k: the same bytes queued, each taking k times as long."""
    if k == 1:
        return net
    links = [dataclasses.replace(ln, ab_mbps=ln.ab_mbps / k, ba_mbps=ln.ba_mbps / k, queue_ms=ln.queue_ms * k,
                                 delay_ms=None if ln.delay_ms is None else ln.delay_ms * k)
             for ln in net.links]
    return NetSpec(hosts=list(net.hosts), switches=list(net.switches), links=links)


def dilate_flow(flow: Flow, k: float) -> Flow:
    """A cross-traffic flow at 1/k of its rate, started and stopped k times later."""
    if k == 1:
        return flow
    return flow.model_copy(update={"rate_mbps": None if flow.rate_mbps is None else flow.rate_mbps / k,
                                   "start_s": flow.start_s * k,
                                   "stop_s": None if flow.stop_s is None else flow.stop_s * k})


def dilate_params(params: Mapping[str, Any], k: float) -> dict[str, Any]:
    """A scheduler's tunables with every time (`*_s`, `*_ms`, `*_us`) multiplied by k."""
    def number(v: Any) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool)

    return {name: v * k if k != 1 and is_time(name) and number(v) else v for name, v in params.items()}


def dilate_workload(workload: Mapping[str, Any], k: float) -> dict[str, Any]:
    """The `workload:` section the workers get: replayed compute k times slower, through the
    effective speedup (the profile's times are divided by it)."""
    if k == 1:
        return dict(workload)
    return {**workload, "speedup": float(workload.get("speedup", 1.0)) / k}


@dataclass(frozen=True)
class WallPlan:
    """One experiment as the testbed runs it, in wall-clock time and rates (k = 1: as configured)."""

    k: float
    net: NetSpec                                        # rates / k, queue_ms and delay_ms x k
    shaping_events: list[tuple[float, tuple[str, str], float]]  # (wall s, link direction, bit/s)
    flows: list[Flow]                                   # cross traffic: rates / k, start_s, stop_s x k
    timeout_s: float
    monitor_interval_s: float
    qdisc_interval_s: float
    connect_timeout_s: float
    dead_peer_s: float                                  # the transport's, x k (contracts/role_spec.py)
    roles_grace_s: float
    workload: dict[str, Any]                            # speedup / k
    scheduler_params: dict[str, Any]                    # times x k


def wall_plan(exp, k: float | None = None) -> WallPlan:
    """What `exp` (an emu.config.experiment.Experiment) runs on the testbed under its `time_dilation`,
    or under `k` where given (the k chosen for `time_dilation: auto`, which has none of its own)."""
    if k is None:
        if exp.time_dilation == AUTO:
            raise ValueError("time_dilation: auto: the run needs the k chosen for it (emu/sweeps/autodilate.py)")
        k = exp.time_dilation
    k = float(k)
    return WallPlan(
        k=k, net=dilate_net(exp.net, k), shaping_events=schedule_events(exp.shaping, exp.timeout_s, k),
        flows=[dilate_flow(f, k) for f in exp.cross_traffic], timeout_s=exp.timeout_s * k,
        monitor_interval_s=exp.monitor.interval_s * k, qdisc_interval_s=exp.monitor.qdisc_interval_s * k,
        connect_timeout_s=CONNECT_TIMEOUT_S * k, dead_peer_s=DEAD_PEER_S * k, roles_grace_s=ROLES_GRACE_S * k,
        workload=dilate_workload(exp.workload, k),
        scheduler_params=dilate_params({**exp.time_params, **exp.scheduler_params} if k != 1 else exp.scheduler_params,
                                       k))


# ---------------------------------------------------------------------------- results in emulated time

class Units(NamedTuple):
    """Which columns of a table are wall-clock instants (time.time()), durations or times
    relative to a start, and rates (per second)."""
    instants: tuple[str, ...] = ()
    durations: tuple[str, ...] = ()
    rates: tuple[str, ...] = ()


# Every table the runner stores (docs/results.md: Results layout). Bytes, counts and fractions (CPU
# idle, the harness's CPU share) are the same in both clocks.
TABLES: dict[str, Units] = {
    "iterations": Units(("start", "end", "forward_start", "backward_end"), ("compute_s", "wait_s"), ("samples_per_s",)),
    "layers": Units((), ("wait_s", "forward_s", "backward_s")),
    "events": Units(("t",)),
    "tx_frames": Units(("ready_t", "first_byte_t", "last_byte_t"), ("inversion_s",)),
    "links": Units((), ("t",), ("tx_bytes_per_s", "configured_bps")),
    "qdiscs": Units((), ("t", "read_s")),
    "cpu": Units((), ("t",)),
    "shaping": Units((), ("planned_t", "actual_t"), ("rate_bps",)),
    "tcp": Units(),   # each host's TCP counters over the run (emu/testbed/tcpcounters.py): counts only
}


def instant_to_emulated(t, k: float, origin: float):
    """A wall-clock instant (or a column of them) in emulated time around `origin`, which
    both clocks share (the monitors' t = 0)."""
    return t if k == 1 else origin + (t - origin) / k


def table_to_emulated(name: str, df: pd.DataFrame, k: float, origin: float | None = None) -> pd.DataFrame:
    """A stored table (TABLES names its units) in emulated time: a new frame; `df` itself
    when k = 1. `origin` is needed where the table has wall-clock instants."""
    if k == 1 or df is None or not len(df):
        return df
    units = TABLES[name]
    out = df.copy()
    for col in units.instants:
        if col in out:
            if origin is None:
                raise ValueError(f"{name}.{col}: wall-clock instants need the origin both clocks share")
            out[col] = instant_to_emulated(out[col].astype(float), k, origin)
    for col in units.durations:
        if col in out:
            out[col] = out[col].astype(float) / k
    for col in units.rates:
        if col in out:
            out[col] = out[col].astype(float) * k
    return out


# In a worker's summary record (workloads/worker.py): seconds, and the replay speedup it got.
SUMMARY_DURATIONS = ("final_wait_s", "replay_max_late_s")


def summary_to_emulated(summary: dict[str, Any], k: float) -> dict[str, Any]:
    """A worker's summary in emulated time: its waits and lateness / k, and the speedup it was
    given (speedup / k) back to the configured one. The scheduler's info stays its own."""
    if k == 1:
        return summary
    out = dict(summary)
    for key in SUMMARY_DURATIONS:
        if isinstance(out.get(key), (int, float)):
            out[key] = out[key] / k
    if isinstance(out.get("speedup"), (int, float)):
        out["speedup"] = out["speedup"] * k
    return out


def cross_to_emulated(flows: list[dict[str, Any]], k: float) -> list[dict[str, Any]]:
    """The cross-traffic summary (emu/testbed/crosstraffic.py `summary`): achieved Mb/s x k."""
    if k == 1:
        return flows
    return [{**f, "mbps": None if f.get("mbps") is None else f["mbps"] * k} for f in flows]


def rates_to_emulated(values: dict[str, Any], k: float) -> dict[str, Any]:
    """Row values named `*_bps` (the forest plan's rates) x k; the rest as they are."""
    if k == 1:
        return values
    return {key: v * k if key.endswith("_bps") and isinstance(v, (int, float)) and not isinstance(v, bool) else v
            for key, v in values.items()}
