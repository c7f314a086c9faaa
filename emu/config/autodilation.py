"""`time_dilation: auto`: the arithmetic of the choice, pure (no machine, no files).

A calibration (emu/sweeps/calibrate.py) measured, per scheduler, what one Gbit of a role's
traffic costs this machine in CPU. The model of the machine's CPU load, in CPU-seconds per
second, at time dilation k:

    load(k) = base + (harness x link directions + sum over roles of cost[role] x Gbit/s[role]) / k

- `base`: the machine's own load without this run's network (other processes, the kernel's),
  measured when the k is chosen (emu/sweeps/autodilate.py), once no other run holds the network:
  what the CPU check will see besides the run. Not cached: it is the machine's state, not a cost.
- `Gbit/s[role]`: what the role's host moves in and out at the configured (emulated) rates when
  the job is communication-bound, the bound of `role_rates`: each role's bytes per iteration (a
  parameter-server worker G each way, a server n x G / servers each way; a collective worker
  the same for every worker), over the time the busiest host link needs for its bytes. A
  config's traffic is never above it; a link inside the network (rack uplinks, WAN links)
  slower than the hosts' only lowers it, so the prediction errs towards a larger k.
- `cost[role]`: CPU-seconds per Gbit of that bound, measured in the calibration's worst 1 s
  window (the CPU check judges the worst window): the role's processes, plus the kernel's work
  that no process is charged for (softirq of veth, bridges and htb), shared among the roles by
  the bytes they moved. Because it is per Gbit of the bound, not of what moved, it carries the
  scheduler's own efficiency (fifo moves about half of what its links allow).
- `harness`: the orchestrator's monitors, per link direction; their intervals are x k too.

Predicted idle = 1 - load / cpus; the choice is the smallest whole k >= 1 with predicted idle
>= cpu_idle_min + MARGIN, at most the experiment's largest k. `retry_k`: after a run failed the
CPU check anyway, the k its measured idle asks for (at least one more).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from emu.config.topospec import NetSpec

MARGIN = 0.10       # the predicted idle must clear cpu_idle_min by this much
ROLE_KINDS = ("server", "worker")


class NoDilation(ValueError):
    """No k the experiment allows is predicted to keep the CPU check green."""


@dataclass(frozen=True)
class RoleRate:
    """One role's host and what it moves at the bound, Gbit/s in plus out (emulated)."""
    role: str
    kind: str
    host: str
    gbps: float


def _host_caps(net: NetSpec, host: str) -> tuple[float, float]:
    """(out, in) Mb/s of the host's link (a host attaches to exactly one switch)."""
    for ln in net.links:
        if ln.a == host:
            return ln.ab_mbps, ln.ba_mbps
        if ln.b == host:
            return ln.ba_mbps, ln.ab_mbps
    raise ValueError(f"host {host!r} has no link")


def role_rates(net: NetSpec, servers: list[str], workers: list[str]) -> list[RoleRate]:
    """Each role's traffic, in + out Gbit/s, with the job communication-bound at the configured
    rates (the module's docstring). Parameter-server family where there are servers."""
    n, s = len(workers), len(servers)
    roles = [(f"server{i}", "server", h, n / s) for i, h in enumerate(servers)]
    roles += [(f"worker{i}", "worker", h, 1.0) for i, h in enumerate(workers)]
    if not s and n < 2:
        return [RoleRate(r, kind, h, 0.0) for r, kind, h, _ in roles]
    per_host: dict[str, float] = {}
    for _, _, h, b in roles:  # bytes each way per iteration, in units of G
        per_host[h] = per_host.get(h, 0.0) + b
    need_s = max(b / min(_host_caps(net, h)) for h, b in per_host.items())  # the busiest link's time, G / Mb/s
    return [RoleRate(r, kind, h, 2 * b / need_s / 1e3) for r, kind, h, b in roles]


def link_directions(net: NetSpec) -> int:
    return 2 * len(net.links)


@dataclass(frozen=True)
class SchedulerCost:
    """What the calibration found for one scheduler (the cache's entry)."""
    scheduler: str
    cost: dict[str, float]         # role kind -> CPU-s per Gbit of its bound, worst window
    harness: float                 # CPU-s/s of the orchestrator per link direction, worst window
    cpus: int
    info: dict[str, Any] = field(default_factory=dict)   # the measurements behind them (shown, not used)

    def to_json(self) -> dict[str, Any]:
        return {"scheduler": self.scheduler, "cost": dict(self.cost), "harness": self.harness, "cpus": self.cpus,
                "info": dict(self.info)}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> SchedulerCost:
        return cls(scheduler=str(d["scheduler"]), cost={str(k): float(v) for k, v in d["cost"].items()},
                   harness=float(d["harness"]),
                   cpus=int(d["cpus"]), info=dict(d.get("info") or {}))


def traffic_load(c: SchedulerCost, rates: list[RoleRate], directions: int) -> float:
    """CPU-seconds per second of the run itself at k = 1: its roles' traffic and the orchestrator."""
    fallback = max(c.cost.values(), default=0.0)   # a role kind the calibration did not have
    return c.harness * directions + sum(c.cost.get(r.kind, fallback) * r.gbps for r in rates)


def predicted_load(c: SchedulerCost, rates: list[RoleRate], directions: int, k: float, base: float) -> float:
    """CPU-seconds per second the machine is predicted to be busy at time dilation k."""
    return base + traffic_load(c, rates, directions) / k


def predicted_idle(c: SchedulerCost, rates: list[RoleRate], directions: int, k: float, cpus: int,
                   base: float) -> float:
    return 1.0 - predicted_load(c, rates, directions, k, base) / cpus


@dataclass(frozen=True)
class Choice:
    k: int
    idle: float                # predicted at k
    idle_below: float | None   # predicted at k - 1 (None at k = 1)
    target: float              # cpu_idle_min + MARGIN
    base: float                # the machine's own load it assumed, CPUs

    def reason(self, scheduler: str) -> str:
        below = f", {self.idle_below:.2f} at k={self.k - 1}" if self.idle_below is not None else ""
        return (f"{scheduler}: predicted CPU idle {self.idle:.2f} at k={self.k}{below}; target "
                f"{self.target:.2f} (cpu_idle_min + {MARGIN:g}); the machine's own load {self.base:.2f} CPUs")


def choose(c: SchedulerCost, rates: list[RoleRate], directions: int, cpu_idle_min: float, k_max: int,
           cpus: int, base: float) -> Choice:
    """The smallest whole k in [1, k_max] whose predicted idle is at least cpu_idle_min + MARGIN;
    NoDilation where none is."""
    target = cpu_idle_min + MARGIN
    spare = (1.0 - target) * cpus - base   # CPU-s/s the run may take
    busy = traffic_load(c, rates, directions)
    if spare <= 0 or math.ceil(busy / spare - 1e-9) > k_max:
        best = predicted_idle(c, rates, directions, k_max, cpus, base)
        raise NoDilation(f"{c.scheduler}: no time dilation up to {k_max} is predicted to keep the CPU idle at "
                         f"{target:.2f} (cpu_idle_min + {MARGIN:g}): {best:.2f} at k={k_max} (the machine's own "
                         f"load without this run, {base:.2f} of {cpus} CPUs, stays at any k)")
    k = max(1, math.ceil(busy / spare - 1e-9))
    below = predicted_idle(c, rates, directions, k - 1, cpus, base) if k > 1 else None
    return Choice(k, predicted_idle(c, rates, directions, k, cpus, base), below, target, base)


def retry_k(k: float, idle_min: float, base: float, cpus: int, cpu_idle_min: float, k_max: int) -> int | None:
    """The k for a second try after a run at k had its CPU idle fall to `idle_min`: the load it
    measured above `base`, k times, spread until the idle reaches cpu_idle_min + MARGIN; at least
    k + 1, at most k_max; None when k is k_max already."""
    if k >= k_max:
        return None
    spare = (1.0 - cpu_idle_min - MARGIN) * cpus - base
    busy = max((1.0 - idle_min) * cpus - base, 0.0) * k
    want = math.ceil(busy / spare - 1e-9) if spare > 0 else k_max
    return int(min(max(want, math.floor(k) + 1), k_max))


@dataclass(frozen=True)
class RoleSample:
    """One role of a calibration run over its window: CPU-seconds, bytes moved (in + out of its
    host link) and its bound Gbit/s (`role_rates`)."""
    kind: str
    cpu_s: float
    moved_bytes: float
    bound_gbps: float


def derive(scheduler: str, *, window_s: float, roles: list[RoleSample], harness_s: float,
           uncharged_s: float, peak_over_mean: float, directions: int, cpus: int) -> SchedulerCost:
    """The costs of one calibration run from what it measured over its window: each role's CPU,
    the orchestrator's (`harness_s`) and the kernel's work charged to no process (`uncharged_s`:
    the machine's busy time less every process's), which goes to the roles by the bytes they
    moved; all of it scaled from the window's mean to its busiest second (`peak_over_mean`)."""
    moved = sum(r.moved_bytes for r in roles)
    peak = max(peak_over_mean, 1.0)
    uncharged_s = max(uncharged_s, 0.0)
    cost, per_moved = {}, {}
    for kind in ROLE_KINDS:
        mine = [r for r in roles if r.kind == kind]
        if not mine:
            continue
        cpu = sum(r.cpu_s + (uncharged_s * r.moved_bytes / moved if moved > 0 else 0.0) for r in mine)
        bound_gbit = sum(r.bound_gbps for r in mine) * window_s
        moved_gbit = sum(r.moved_bytes for r in mine) * 8 / 1e9
        cost[kind] = peak * cpu / bound_gbit if bound_gbit > 0 else 0.0
        per_moved[kind] = round(sum(r.cpu_s for r in mine) / moved_gbit, 4) if moved_gbit > 0 else None
    bound = sum(r.bound_gbps for r in roles) * window_s
    info = {"window_s": round(window_s, 3), "peak_over_mean": round(peak, 3),
            "roles_cpus": round(sum(r.cpu_s for r in roles) / window_s, 4),
            "harness_cpus": round(harness_s / window_s, 4), "uncharged_cpus": round(uncharged_s / window_s, 4),
            "process_cpu_s_per_gbit_moved": per_moved,
            "moved_over_bound": round(moved * 8 / 1e9 / bound, 3) if bound > 0 else None}
    harness = peak * harness_s / window_s / directions if directions else 0.0
    return SchedulerCost(scheduler, cost, harness, cpus, info)
