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


Point = tuple[float, float]   # (a role's Gbit/s in + out on the testbed, CPU-s per Gbit of its bound there)


@dataclass(frozen=True)
class SchedulerCost:
    """What the calibration found for one scheduler (the cache's entry): per role kind, the cost
    per Gbit at each rate it was measured at, by rate."""
    scheduler: str
    cost: dict[str, list[Point]]   # role kind -> [(Gbit/s of one role, CPU-s per Gbit of its bound)], few workers
    harness: float                 # CPU-s/s of the orchestrator per link direction at k = 1, busiest second
    cpus: int
    info: dict[str, Any] = field(default_factory=dict)   # the measurements behind them (shown, not used)
    workers: dict[str, list[Point]] = field(default_factory=dict)   # role kind -> [(workers, cost factor)]

    def to_json(self) -> dict[str, Any]:
        return {"scheduler": self.scheduler, "cost": {k: [list(p) for p in v] for k, v in self.cost.items()},
                "workers": {k: [list(p) for p in v] for k, v in self.workers.items()},
                "harness": self.harness, "cpus": self.cpus, "info": dict(self.info)}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> SchedulerCost:
        def points(m: dict) -> dict[str, list[Point]]:
            return {str(k): sorted((float(a), float(b)) for a, b in v) for k, v in m.items()}

        return cls(scheduler=str(d["scheduler"]), cost=points(d["cost"]), workers=points(d.get("workers") or {}),
                   harness=float(d["harness"]), cpus=int(d["cpus"]), info=dict(d.get("info") or {}))


EXTRAPOLATE = 2.0   # below the slowest calibrated rate, the power law holds down to 1/this of it, then flat


def cost_at(points: list[Point], gbps: float) -> float:
    """CPU-s per Gbit of a role moving `gbps` on the testbed, from its calibration points: a power
    law between two neighbouring points (cost x rate^alpha constant); below the slowest, the same
    law down to 1/EXTRAPOLATE of its rate and flat beneath (a segment per wakeup is the most a
    byte can cost); above the fastest, its cost. The exponent is kept within [0, 1]: a role never
    costs less per Gbit at a lower rate, and its load (cost x rate) never grows as its rate falls."""
    pts = sorted(points)
    if not pts:
        return 0.0
    if len(pts) == 1 or gbps >= pts[-1][0]:
        return pts[-1][1]
    gbps = max(gbps, pts[0][0] / EXTRAPOLATE)
    i = next((j for j in range(1, len(pts)) if gbps < pts[j][0]), len(pts) - 1)
    (r0, c0), (r1, c1) = pts[i - 1], pts[i]
    alpha = min(max(math.log(c0 / c1) / math.log(r1 / r0), 0.0), 1.0) if min(c0, c1, r0) > 0 and r1 > r0 else 0.0
    return c1 * (r1 / gbps) ** alpha


def workers_factor(points: list[Point], n: int) -> float:
    """How much more a role costs per Gbit with n workers than with the calibration's fewest: a
    line through the calibration's (workers, factor) points, never below 1 (a ring's chunks, and
    so its messages per byte, grow with n; a parameter server's do not)."""
    pts = sorted(points)
    if len(pts) < 2:
        return 1.0
    (n0, f0), (n1, f1) = pts[0], pts[-1]
    return max(1.0, f0 + (f1 - f0) * (n - n0) / (n1 - n0)) if n1 > n0 else 1.0


def traffic_load(c: SchedulerCost, rates: list[RoleRate], directions: int, k: float) -> float:
    """CPU-seconds per second of the run itself at k: its roles' traffic (each at its rate on the
    testbed, bound / k, and its job's number of workers) and the orchestrator's monitors."""
    n = sum(1 for r in rates if r.kind == "worker")
    worst = max(c.cost, key=lambda kind: max(p[1] for p in c.cost[kind]), default=None)   # for a kind not calibrated

    def cost(kind: str, gbps: float) -> float:
        kind = kind if kind in c.cost else worst
        return 0.0 if kind is None else cost_at(c.cost[kind], gbps) * workers_factor(c.workers.get(kind, []), n)

    return c.harness * directions / k + sum(cost(r.kind, r.gbps / k) * r.gbps / k for r in rates if r.gbps > 0)


def predicted_load(c: SchedulerCost, rates: list[RoleRate], directions: int, k: float, base: float) -> float:
    """CPU-seconds per second the machine is predicted to be busy at time dilation k."""
    return base + traffic_load(c, rates, directions, k)


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
    """The smallest whole k in [1, k_max] whose predicted idle is at least cpu_idle_min + MARGIN
    (the predicted load never grows with k); NoDilation where none is."""
    target = cpu_idle_min + MARGIN
    idle = [predicted_idle(c, rates, directions, k, cpus, base) for k in range(1, k_max + 1)]
    k = next((i + 1 for i, v in enumerate(idle) if v >= target - 1e-12), None)
    if k is None:
        raise NoDilation(f"{c.scheduler}: no time dilation up to {k_max} is predicted to keep the CPU idle at "
                         f"{target:.2f} (cpu_idle_min + {MARGIN:g}): {idle[-1]:.2f} at k={k_max} (the machine's own "
                         f"load without this run, {base:.2f} of {cpus} CPUs, stays at any k)")
    return Choice(k, idle[k - 1], idle[k - 2] if k > 1 else None, target, base)


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
    """The costs of one calibration run (one point per role kind: a role's bound rate, its cost)
    from what it measured over its window: each role's CPU, the orchestrator's (`harness_s`) and
    the kernel's work charged to no process (`uncharged_s`: the machine's busy time less every
    process's), which goes to the roles by the bytes they moved; all of it scaled from the
    window's mean to its busiest second (`peak_over_mean`)."""
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
        cost[kind] = [(bound_gbit / window_s / len(mine), peak * cpu / bound_gbit if bound_gbit > 0 else 0.0)]
        per_moved[kind] = round(sum(r.cpu_s for r in mine) / moved_gbit, 4) if moved_gbit > 0 else None
    bound = sum(r.bound_gbps for r in roles) * window_s
    info = {"window_s": round(window_s, 3), "peak_over_mean": round(peak, 3),
            "roles_cpus": round(sum(r.cpu_s for r in roles) / window_s, 4),
            "harness_cpus": round(harness_s / window_s, 4), "uncharged_cpus": round(uncharged_s / window_s, 4),
            "process_cpu_s_per_gbit_moved": per_moved,
            "moved_over_bound": round(moved * 8 / 1e9 / bound, 3) if bound > 0 else None}
    harness = peak * harness_s / window_s / directions if directions else 0.0
    return SchedulerCost(scheduler, cost, harness, cpus, info)


def combine(runs: list[tuple[int, SchedulerCost]]) -> SchedulerCost:
    """One scheduler's calibration runs, (workers, costs) each, as one entry: the runs with the
    fewest workers give each kind's cost by rate; each run with more workers gives a factor over
    what those predict at its rate. The largest orchestrator cost; each run's measurements in
    `info.runs`."""
    fewest = min(n for n, _ in runs)
    first = runs[0][1]
    cost: dict[str, list[Point]] = {}
    for n, c in runs:
        if n == fewest:
            for kind, pts in c.cost.items():
                cost[kind] = sorted(cost.get(kind, []) + list(pts))
    workers: dict[str, list[Point]] = {}
    for n, c in runs:
        if n != fewest:
            for kind, pts in c.cost.items():
                if kind in cost:
                    factor = max(got / cost_at(cost[kind], gbps) for gbps, got in pts)
                    workers[kind] = sorted(workers.get(kind, [(float(fewest), 1.0)]) + [(float(n), factor)])
    return SchedulerCost(first.scheduler, cost, max(c.harness for _, c in runs), first.cpus,
                         {"runs": [{**c.info, "workers": n} for n, c in runs]}, workers)
