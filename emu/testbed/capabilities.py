"""What this kernel and machine can emulate: qdiscs, switches, cgroup controllers, tools.

As root, qdiscs are probed for real: each is added to a veth in a scratch network
namespace that is deleted right after. Without root, the kernel's build config
(/proc/config.gz) is read instead. A config that needs a missing feature is refused
before anything starts, naming the feature.
"""
from __future__ import annotations

import gzip
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from emu.testbed import cgroups, machine

QDISCS = ("htb", "tbf", "netem", "pfifo", "bfifo", "prio", "fq", "fq_codel", "sfq", "red", "ingress")
_KCONFIG = {"htb": "NET_SCH_HTB", "tbf": "NET_SCH_TBF", "netem": "NET_SCH_NETEM", "prio": "NET_SCH_PRIO",
            "fq": "NET_SCH_FQ", "fq_codel": "NET_SCH_FQ_CODEL", "sfq": "NET_SCH_SFQ", "red": "NET_SCH_RED",
            "ingress": "NET_SCH_INGRESS", "pfifo": "NET_SCH_FIFO", "bfifo": "NET_SCH_FIFO"}


# Qdiscs that refuse to be added without parameters.
_ARGS = {"tbf": ["rate", "1mbit", "burst", "32kbit", "latency", "400ms"],
         "red": ["limit", "400000", "min", "30000", "max", "90000", "avpkt", "1000", "burst", "55",
                 "bandwidth", "10mbit"]}


def _kernel_config() -> dict[str, str]:
    try:
        text = gzip.open("/proc/config.gz", "rt").read()
    except OSError:
        return {}
    return dict(re.findall(r"^CONFIG_(\w+)=(\S+)", text, re.M))


def _probe_qdiscs() -> dict[str, bool]:
    ns = f"schedlab-probe-{os.getpid()}"
    out: dict[str, bool] = {}

    def ip(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["ip", *args], capture_output=True, text=True)

    if ip("netns", "add", ns).returncode != 0:
        return {}
    try:
        if ip("-n", ns, "link", "add", "p0", "type", "veth", "peer", "name", "p1").returncode != 0:
            return {}
        for q in QDISCS:
            where = ["ingress"] if q == "ingress" else ["root", q, *_ARGS.get(q, [])]
            r = subprocess.run(["tc", "-n", ns, "qdisc", "add", "dev", "p0", *where], capture_output=True)
            out[q] = r.returncode == 0
            where = ["ingress"] if q == "ingress" else ["root"]
            subprocess.run(["tc", "-n", ns, "qdisc", "del", "dev", "p0", *where], capture_output=True)
    finally:
        ip("netns", "del", ns)
    return out


@lru_cache(maxsize=1)
def qdiscs() -> tuple[dict[str, bool | None], str]:
    """qdisc -> available (None: unknown), and how that was found out."""
    if os.geteuid() == 0 and shutil.which("tc"):
        probed = _probe_qdiscs()
        if probed:
            return probed, "probed in a scratch network namespace"
    cfg = _kernel_config()
    if cfg:
        return {q: cfg.get(_KCONFIG[q]) in ("y", "m") for q in QDISCS}, "read from /proc/config.gz"
    return {q: None for q in QDISCS}, "unknown (not root, no /proc/config.gz)"


def has_qdisc(name: str) -> bool | None:
    return qdiscs()[0].get(name)


def cgroup_layout() -> cgroups.Layout:
    """The cgroup hierarchies mounted here (v1, v2 or hybrid) and their controllers."""
    return cgroups.detect()


def cgroup_controllers() -> dict[str, str]:
    """controller -> 'v1' | 'v2' for those mounted (v2: offered by the unified root's
    cgroup.controllers), 'available (not mounted)' for those the kernel has in neither."""
    return cgroup_layout().controllers()


def cpu_cgroup_problem(controllers: dict[str, str] | None = None) -> tuple[str, str | None] | None:
    """Why `host_cpu` and `slow` faults cannot run here, and the fix this system can do;
    None if they can. One rule for the doctor, preflight and the testbed: the cpu controller
    bound to a v1 hierarchy, or offered by the unified (v2) root. `controllers`:
    `cgroup_controllers()`, if the caller has it already."""
    where = (cgroup_controllers() if controllers is None else controllers).get("cpu")
    if where in ("v1", "v2"):
        return None
    # The controllers decide; the hierarchy (read again, only on a refusal) explains.
    return cgroup_layout().cpu_problem() or ("which is not mounted here", None)


def cpu_cgroup_refusal(field: str, controllers: dict[str, str] | None = None) -> str | None:
    """The one-line refusal of `field` (host_cpu, faults[i]: slow) on this machine, or None."""
    problem = cpu_cgroup_problem(controllers)
    if problem is None:
        return None
    why, fix = problem
    return f"{field} needs the cgroup cpu controller (CFS bandwidth), {why}" + (f"; fix: {fix}" if fix else "")


def tcp_congestion_controls() -> list[str]:
    """Congestion controls this kernel has now (built in or loaded), in its own order."""
    return (machine.read_sysctl(machine.AVAILABLE_CC) or "").split()


def tcp_default_congestion_control() -> str | None:
    """The machine's default, which new network namespaces inherit unless a run sets its own."""
    return machine.read_sysctl("net.ipv4.tcp_congestion_control")


def switches() -> dict[str, bool]:
    return {
        "LinuxBridge (brctl)": bool(shutil.which("brctl")),
        "Open vSwitch (ovs-vsctl)": bool(shutil.which("ovs-vsctl")) and Path("/sys/module/openvswitch").exists(),
    }


# Commands the harness runs -> the Debian package that has each (scripts/setup.sh installs them).
TOOLS = {"mn": "mininet", "mnexec": "mininet", "tc": "iproute2", "ip": "iproute2", "iperf3": "iperf3",
         "brctl": "bridge-utils", "ifconfig": "net-tools", "ethtool": "ethtool", "cgcreate": "cgroup-tools",
         "cgclassify": "cgroup-tools", "sysctl": "procps"}


def tools() -> dict[str, bool]:
    return {t: bool(shutil.which(t)) for t in TOOLS}


@dataclass(frozen=True)
class Check:
    """One thing the harness depends on or changes: its state here, and what to do about it."""

    area: str
    name: str
    ok: bool          # False: a run (or some configs) cannot work until it is fixed
    state: str        # what this machine has
    handling: str     # what the harness or scripts/setup.sh does about it, or how to fix it


def _sysctl_checks() -> list[Check]:
    out = []
    avail = tcp_congestion_controls()
    allowed = machine.read_sysctl(machine.ALLOWED_CC) or "?"
    out.append(Check("sysctl", machine.AVAILABLE_CC, "cubic" in avail, " ".join(avail) or "?",
                     "tcp.congestion_control must be one of these (default cubic); others are refused before a run"))
    out.append(Check("sysctl", machine.ALLOWED_CC, True, allowed,
                     "a run adds its algorithm if missing (namespaces may only select allowed ones), "
                     "recorded first, restored at teardown or by ./inv clean"))
    out.append(Check("sysctl", "net.ipv4.tcp_congestion_control", True, machine.read_sysctl(
        "net.ipv4.tcp_congestion_control") or "?", "left alone: every host sets its own"))
    for key in machine.HOST_TCP_BUFFERS:
        out.append(Check("sysctl", key, True, machine.read_sysctl(key) or "?",
                         f"left alone: every host sets {machine.HOST_TCP_BUFFERS[key]!r} in its own namespace"))
    for limit in machine.RUN_LIMITS:
        have = machine.read_sysctl(limit.key) or "?"
        out.append(Check("sysctl", limit.key, have != "?", have,
                         f"raised to {limit.at_least} for a run if lower ({limit.why}), restored afterwards"))
    for key in ("net.core.rmem_max", "net.core.wmem_max", "fs.file-max", "net.ipv4.route.max_size"):
        out.append(Check("sysctl", key, True, machine.read_sysctl(key) or "?",
                         "left alone (Mininet's fixLimits() would change it and never restore it; it is skipped)"))
    nf = machine.read_sysctl("net.bridge.bridge-nf-call-iptables")
    out.append(Check("sysctl", "net.bridge.bridge-nf-call-iptables", True, nf or "absent (no br_netfilter)",
                     "left alone; if 1, bridged frames pass iptables' FORWARD chain, which must accept them "
                     "(see the iptables line)" if nf == "1" else "left alone"))
    out.append(Check("sysctl", "net.ipv4.ip_forward", True, machine.read_sysctl("net.ipv4.ip_forward") or "?",
                     "left alone: not needed (every topology is one bridged layer-2 segment)"))
    return out


def _forward_policy() -> Check:
    """With bridge netfilter on, a FORWARD policy of DROP (Docker sets it) drops the emulated traffic."""
    nf = machine.read_sysctl("net.bridge.bridge-nf-call-iptables") or "0"
    if nf != "1" or not shutil.which("iptables") or os.geteuid() != 0:
        return Check("firewall", "iptables FORWARD", True, "not consulted for bridged frames" if nf != "1"
                     else "unknown (no iptables command, or not root)", "nothing to do")
    r = subprocess.run(["iptables", "-S", "FORWARD"], capture_output=True, text=True)
    policy = next((ln.split()[-1] for ln in r.stdout.splitlines() if ln.startswith("-P FORWARD")), "?")
    return Check("firewall", "iptables FORWARD", policy != "DROP", f"policy {policy}",
                 "fix: sysctl -w net.bridge.bridge-nf-call-iptables=0 for the session, or accept the "
                 "bridges' traffic" if policy == "DROP" else "accepts bridged frames")


def _cgroup_checks() -> list[Check]:
    """The hierarchy found, and whether host_cpu and slow faults work on it (and how)."""
    layout = cgroup_layout()
    out = [Check("cgroup", "hierarchy", True, layout.describe(),
                 "the harness mounts none; it makes its groups in whichever holds the cpu controller (below)")]
    tree = layout.cpu_tree()
    if tree is not None:
        where = (f"yes: v1, {', '.join(str(p.parent) for p in tree.paths('h'))}" if tree.hierarchy == "v1" else
                 f"yes: v2, cpu in {layout.v2}/cgroup.controllers")
        how = ("one group per limited host (cpu.cfs_quota_us), recorded and removed with the network"
               if tree.hierarchy == "v1" else
               f"one group per limited host (cpu.max) below {layout.v2}/{cgroups.V2_PARENT}; cpu enabled in the "
               "subtree_control above it where it is not, each change recorded and undone with the network")
        out.append(Check("cgroup", "cpu controller (host_cpu, slow)", True, where, how))
    else:
        why, fix = layout.cpu_problem() or ("which is not mounted here", None)
        out.append(Check("cgroup", "cpu controller (host_cpu, slow)", False, f"no: {why}",
                         "needed only for host_cpu and slow faults (refused without it)"
                         + (f"; fix: {fix}" if fix else "")))
    return out


def checks() -> list[Check]:
    """Every piece of machine state the harness depends on or changes (docs/testbed.md: Machine requirements)."""
    out: list[Check] = []
    root = os.geteuid() == 0
    out.append(Check("user", "root", root, "root" if root else f"uid {os.geteuid()}",
                     "Mininet needs root: run as sudo ./inv ..."))
    for t, ok in tools().items():
        out.append(Check("tool", t, ok, shutil.which(t) or "missing",
                         f"Debian package {TOOLS[t]}, installed by scripts/setup.sh (run ./inv as root)"))
    q, how = qdiscs()
    for name in ("htb", "bfifo", "pfifo", "tbf", "netem"):
        ok = q.get(name)
        need = name != "netem" and name != "tbf"
        out.append(Check("kernel", f"qdisc {name}", bool(ok) or not need,
                         {True: "yes", False: "no", None: "unknown"}[ok] + f" ({how})",
                         "needed for every link" if need else
                         "optional: configs with delay_ms/loss_pct need netem and are refused without it"))
    for feature, path in (("network namespaces", "/proc/self/ns/net"), ("veth", "/sys/module/veth"),
                          ("bridge", "/sys/module/bridge")):
        ok = Path(path).exists() or (feature != "network namespaces" and bool(q.get("htb")))
        out.append(Check("kernel", feature, ok, "yes" if ok else "not found",
                         "built in or auto-loaded on first use; a loaded module stays loaded"))
    out += _cgroup_checks()
    from emu.testbed.netlink import available
    why = available()
    try:
        from importlib.metadata import version
        have = f"pyroute2 {version('pyroute2')}"
    except Exception:  # noqa: BLE001 - not installed
        have = "pyroute2 missing"
    out.append(Check("python", "netlink monitor (pyroute2)", True, have + ("" if why is None else
                     f"; {why}"), "the monitor and rate changes use netlink in the hosts' namespaces (100 Hz "
                     "queues); without it a run falls back to a tc process per sample (monitor.backend: tc)"))
    state_root = Path(os.environ.get("SCHEDLAB_STATE_DIR", "/run/schedlab"))
    parent = state_root if state_root.exists() else state_root.parent
    writable = os.access(parent, os.W_OK)
    out.append(Check("files", str(state_root), writable, "writable" if writable else "not writable",
                     "each orchestrator records what it creates in <pid>/, removed at exit or by ./inv clean; "
                     "network.lock (empty) serialises runs"))
    out += _sysctl_checks()
    out.append(_forward_policy())
    return out


def report() -> str:
    lines = []
    for c in checks():
        mark = "ok" if c.ok else "MISSING"
        lines.append(f"{mark:<8} {c.area:<9} {c.name:<42} {c.state}")
        lines.append(f"{'':<19}{c.handling}")
    q, how = qdiscs()
    lines.append(f"qdiscs ({how}): " + ", ".join(f"{n}={'yes' if ok else 'no' if ok is False else '?'}"
                                               for n, ok in q.items()))
    lines.append("switches: " + ", ".join(f"{n}={'yes' if ok else 'no'}" for n, ok in switches().items()))
    lines.append(f"kernel: {os.uname().release}; cpus: {os.cpu_count()}")
    return "\n".join(lines)
