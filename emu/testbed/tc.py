"""Link shaping with tc, configured by the testbed itself (not Mininet's TCIntf).

TCIntf silently ignores rates above 1000 Mb/s and rebuilds qdiscs to change a rate.
Here every shaped interface gets `htb` root 5: with one class 5:1 (all traffic), and a
leaf queue: a bfifo of `queue_ms` of the rate by default, a pfifo of `queue_pkts`, or
netem for delay/loss. A rate change is one
`tc class change` on 5:1: the queue is kept (rebuilding a qdisc flushes it; mininet #650).

Commands are argument lists, never shell strings; `ns_pid` runs them inside a Mininet
host's network namespace through `mnexec -a`, from "/": mnexec -a enters the host shell's
mount namespace too and changes to the caller's working directory there, which that
namespace need not have (it was copied at bring-up; under a chroot its root is the
machine's), and then fails with "<directory>: No such file or directory".
"""
from __future__ import annotations

import re
import subprocess

HANDLE = "5:"
CLASS = "5:1"


def rate_bits(rate_bps: float) -> int:
    """The rate set, in bit/s: htb's minimum is 8 (a rate of 0 is an outage)."""
    return max(int(rate_bps), 8)


def burst_bytes(rate_bps: float) -> int:
    """1 ms of traffic, at least ten full-size frames: enough for htb to reach high rates
    without letting more than a millisecond's worth through above the rate."""
    return max(int(rate_bps / 8 * 1e-3), 15140)


def _bits(rate_bps: float) -> str:
    return f"{rate_bits(rate_bps)}bit"


def _burst(rate_bps: float) -> str:
    return f"{burst_bytes(rate_bps)}b"


# htb's default quantum (rate / r2q) is "big" above ~2 Mb/s and triggers warnings; one MTU
# is right for a single class.
QUANTUM = "1514"


def _rate_args(rate_bps: float) -> list[str]:
    """The htb class parameters for `rate_bps`, the same at setup and at every change."""
    return ["rate", _bits(rate_bps), "ceil", _bits(rate_bps), "burst", _burst(rate_bps),
            "cburst", _burst(rate_bps), "quantum", QUANTUM]


MIN_QUEUE_BYTES = 64 * 1024  # one GSO packet from veth must always fit


def queue_bytes(rate_bps: float, queue_ms: float) -> int:
    return max(int(rate_bps / 8 * queue_ms / 1e3), MIN_QUEUE_BYTES)


def setup_commands(dev: str, rate_bps: float, delay_ms: float | None = None, loss_pct: float | None = None,
                   queue_pkts: int | None = None, queue_ms: float | None = None) -> list[list[str]]:
    cmds = [
        ["tc", "qdisc", "add", "dev", dev, "root", "handle", HANDLE, "htb", "default", "1"],
        ["tc", "class", "add", "dev", dev, "parent", HANDLE, "classid", CLASS, "htb", *_rate_args(rate_bps)],
    ]
    if delay_ms or loss_pct:
        leaf = ["tc", "qdisc", "add", "dev", dev, "parent", CLASS, "handle", "10:", "netem"]
        if delay_ms:
            leaf += ["delay", f"{delay_ms}ms"]
        if loss_pct:
            leaf += ["loss", f"{loss_pct}%"]
        if queue_pkts:
            leaf += ["limit", str(queue_pkts)]
        cmds.append(leaf)
    elif queue_pkts:
        cmds.append(["tc", "qdisc", "add", "dev", dev, "parent", CLASS, "handle", "10:", "pfifo",
                     "limit", str(queue_pkts)])
    elif queue_ms:
        cmds.append(["tc", "qdisc", "add", "dev", dev, "parent", CLASS, "handle", "10:", "bfifo",
                     "limit", str(queue_bytes(rate_bps, queue_ms))])
    return cmds


def change_command(dev: str, rate_bps: float) -> list[str]:
    return ["tc", "class", "change", "dev", dev, "parent", HANDLE, "classid", CLASS, "htb", *_rate_args(rate_bps)]


class TcError(RuntimeError):
    pass


def run(cmd: list[str], ns_pid: int | None = None) -> str:
    full = (["mnexec", "-a", str(ns_pid)] if ns_pid is not None else []) + cmd
    r = subprocess.run(full, capture_output=True, text=True, cwd="/")
    if r.returncode != 0:
        raise TcError(f"{' '.join(cmd)}: {r.stderr.strip() or r.stdout.strip()}")
    return r.stdout


_UNITS = {"": 1, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}


def class_rate(dev: str, ns_pid: int | None = None) -> float | None:
    """The htb rate of class 5:1 in bit/s, as the kernel reports it."""
    out = run(["tc", "class", "show", "dev", dev, "classid", CLASS], ns_pid)
    m = re.search(r"\brate (\d+(?:\.\d+)?)([KMGT]?)bit", out)
    return float(m.group(1)) * _UNITS[m.group(2)] if m else None
