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
from functools import lru_cache
from pathlib import Path

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
            subprocess.run(["tc", "-n", ns, "qdisc", "del", "dev", "p0", *(["ingress"] if q == "ingress" else ["root"])],
                           capture_output=True)
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


def cgroup_controllers() -> dict[str, str]:
    """controller -> 'v1' | 'v2' for those mounted."""
    out: dict[str, str] = {}
    v2 = Path("/sys/fs/cgroup/cgroup.controllers")
    if v2.exists():
        for c in v2.read_text().split():
            out[c] = "v2"
    for line in Path("/proc/mounts").read_text().splitlines():
        parts = line.split()
        if len(parts) > 3 and parts[2] == "cgroup":
            for opt in parts[3].split(","):
                if opt in ("cpu", "cpuacct", "cpuset", "memory", "pids", "blkio", "net_cls"):
                    out.setdefault(opt, "v1")
    try:
        for line in Path("/proc/cgroups").read_text().splitlines()[1:]:
            name, _h, _n, enabled = line.split()
            if enabled == "1":
                out.setdefault(name, "available (not mounted)")
    except (OSError, ValueError):
        pass
    return out


def tcp_congestion_controls() -> list[str]:
    """Congestion controls this kernel has now (built in or loaded), in its own order."""
    try:
        return Path("/proc/sys/net/ipv4/tcp_available_congestion_control").read_text().split()
    except OSError:
        return []


def tcp_default_congestion_control() -> str | None:
    """The machine's default, which new network namespaces inherit unless a run sets its own."""
    try:
        return Path("/proc/sys/net/ipv4/tcp_congestion_control").read_text().strip()
    except OSError:
        return None


def switches() -> dict[str, bool]:
    return {
        "LinuxBridge (brctl)": bool(shutil.which("brctl")),
        "Open vSwitch (ovs-vsctl)": bool(shutil.which("ovs-vsctl")) and Path("/sys/module/openvswitch").exists(),
    }


def tools() -> dict[str, bool]:
    return {t: bool(shutil.which(t)) for t in ("mnexec", "mn", "tc", "ip", "iperf3", "ethtool", "brctl")}


def report() -> str:
    q, how = qdiscs()
    mark = {True: "yes", False: "NO", None: "?"}
    lines = [f"qdiscs ({how}):"]
    lines += [f"  {name:<9} {mark[ok]}" for name, ok in q.items()]
    lines.append("switches:")
    lines += [f"  {name:<26} {mark[ok]}" for name, ok in switches().items()]
    lines.append("cgroup controllers:")
    cg = cgroup_controllers()
    lines += [f"  {name:<9} {how}" for name, how in sorted(cg.items())] or ["  none found"]
    lines.append("tools:")
    lines += [f"  {name:<9} {mark[ok]}" for name, ok in tools().items()]
    lines.append(f"tcp congestion control: {' '.join(tcp_congestion_controls()) or '?'} "
                 f"(machine default {tcp_default_congestion_control() or '?'}; runs set tcp.congestion_control "
                 f"in every host, cubic unless configured)")
    lines.append(f"kernel: {os.uname().release}; cpus: {os.cpu_count()}")
    if not q.get("netem"):
        lines.append("note: without netem, configs with delay_ms or loss_pct are refused.")
    return "\n".join(lines)
