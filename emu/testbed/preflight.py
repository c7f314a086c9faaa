"""Preflight: can this machine emulate what a parsed plan asks for?

Parsing (emu/config/plan.py, emu/config/experiment.py) looks at the config only, so a config has one meaning
and one set of run ids on every machine, and a plan made on a laptop can be checked, sharded
and merged anywhere. What the kernel offers is checked here, as a separate step after parsing
and still before anything is created: the congestion control of `tcp:`, the netem qdisc for
links with delay_ms or loss_pct, the cgroup cpu controller for `host_cpu` and `slow` faults
(bound to a v1 hierarchy or offered by the unified one: the doctor's rule and words),
and pyroute2 and root for `monitor.backend: netlink`. Each probe
runs at most once per check, however many experiments share the need.
"""
from __future__ import annotations

import platform
from collections.abc import Iterable
from typing import Any

from emu.config.experiment import ConfigError, Experiment
from emu.config.plan import Plan, at_point
from emu.testbed import capabilities


class _Machine:
    """The probes of one check, each run on first need."""

    def __init__(self) -> None:
        self._cc: list[str] | None = None
        self._cpu: dict[str, str] | None = None
        self._netem: bool | None = None
        self._netlink: str | None | bool = False  # False: not probed yet

    def netlink(self) -> str | None:
        """Why the netlink monitor backend cannot run here, or None."""
        if self._netlink is False:
            from emu.testbed.netlink import available
            self._netlink = available()
        return self._netlink

    def congestion_controls(self) -> list[str]:
        if self._cc is None:
            self._cc = capabilities.tcp_congestion_controls()
        return self._cc

    def cpu_refusal(self, field: str) -> str | None:
        """Why `field` (host_cpu, a slow fault) cannot run here: the doctor's rule and words."""
        if self._cpu is None:
            self._cpu = capabilities.cgroup_controllers()
        return capabilities.cpu_cgroup_refusal(field, self._cpu)

    def netem(self) -> bool:
        if self._netem is None:  # unknown (not root, no /proc/config.gz) counts as absent
            self._netem = bool(capabilities.has_qdisc("netem"))
        return self._netem


def _refusal(exp: Experiment, machine: _Machine) -> str | None:
    """Why this machine cannot run `exp` (the first reason), or None."""
    cc = exp.tcp.congestion_control
    have = machine.congestion_controls()
    if have and cc not in have:  # nothing listed: /proc unreadable, so not known to be missing
        return (f"tcp.congestion_control: {cc!r} is not available in this kernel ({platform.release()}); "
                f"it has: {', '.join(have)}")
    if exp.host_cpu and (why := machine.cpu_refusal("host_cpu:")) is not None:
        return why
    if exp.monitor.backend == "netlink" and (why := machine.netlink()) is not None:
        return f"monitor.backend: netlink: {why} (or set monitor.backend: tc)"
    slow = next((i for i, f in enumerate(exp.faults) if f.kind == "slow"), None)
    if slow is not None and (why := machine.cpu_refusal(f"faults[{slow}]: slow")) is not None:
        return why
    netem = exp.net.needs_netem()
    if netem and not machine.netem():
        ln = exp.net.links[netem[0]]
        return (f"topology: link {ln.a}-{ln.b} asks for delay_ms/loss_pct, which needs the netem "
                f"qdisc (CONFIG_NET_SCH_NETEM); this kernel ({platform.release()}) has none")
    return None


def check(plan: Plan | Iterable[Experiment]) -> None:
    """Refuse, with one `ConfigError` line naming the field (and the grid point), the first
    experiment of `plan` that this machine cannot emulate."""
    if isinstance(plan, Plan):
        experiments: list[Experiment] = plan.experiments
        points: list[dict[str, Any]] = plan.points
    else:
        experiments = list(plan)
        points = [{} for _ in experiments]
    machine = _Machine()
    for exp, point in zip(experiments, points, strict=True):
        reason = _refusal(exp, machine)
        if reason is not None:
            raise at_point(ConfigError(reason), point)
