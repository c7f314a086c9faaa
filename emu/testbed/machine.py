"""Machine-wide kernel settings a run needs: what they are, and how they are read and written.

A Mininet host is a network namespace, but some settings exist only once per machine: the
list of congestion controls a namespace may select, the receive backlog, the neighbour table
and pty limits. A run that needs another value sets it through `StateDir.change_sysctl`,
which records the machine's value before changing it, so teardown (or `./inv clean` after a
`kill -9`) puts it back. Nothing here is left changed after a run.
"""
from __future__ import annotations

import resource
from dataclasses import dataclass
from pathlib import Path

PROC_SYS = Path("/proc/sys")


def sysctl_path(key: str) -> Path:
    return PROC_SYS / key.replace(".", "/")


def read_sysctl(key: str) -> str | None:
    """The value as the kernel prints it (fields joined by single spaces), None if absent."""
    try:
        return " ".join(sysctl_path(key).read_text().split())
    except OSError:
        return None


def write_sysctl(key: str, value: str) -> None:
    """Write one value; raises OSError with the kernel's reason (EPERM, EINVAL...)."""
    sysctl_path(key).write_text(value)


@dataclass(frozen=True)
class Limit:
    """A machine-wide integer limit that a run raises (never lowers) for its duration."""

    key: str
    at_least: int
    why: str


# The limits Mininet's own `fixLimits()` raises machine-wide and never restores. The testbed
# skips that call and raises the ones that matter here itself, recorded and restored.
RUN_LIMITS = (
    Limit("net.core.netdev_max_backlog", 5000, "veth delivers through the per-CPU backlog; 1000 drops bursts"),
    Limit("net.ipv4.neigh.default.gc_thresh1", 4096, "one neighbour table for every namespace"),
    Limit("net.ipv4.neigh.default.gc_thresh2", 8192, "one neighbour table for every namespace"),
    Limit("net.ipv4.neigh.default.gc_thresh3", 16384, "one neighbour table for every namespace"),
    Limit("kernel.pty.max", 20000, "every Mininet node's shell holds a pty"),
)

# TCP buffer autotuning as Mininet sets it, applied inside each host's namespace (these two
# are per-namespace), so the machine's own values are never touched.
HOST_TCP_BUFFERS = {
    "net.ipv4.tcp_rmem": "10240 87380 16777216",
    "net.ipv4.tcp_wmem": "10240 87380 16777216",
}

ALLOWED_CC = "net.ipv4.tcp_allowed_congestion_control"
AVAILABLE_CC = "net.ipv4.tcp_available_congestion_control"


def allowed_with(name: str) -> str | None:
    """The allowed-congestion-control list with `name` added, None if it is already allowed.

    Outside the initial network namespace the kernel lets a namespace select only an
    *allowed* algorithm (EPERM otherwise), and a fresh machine may allow fewer than it has."""
    allowed = (read_sysctl(ALLOWED_CC) or "").split()
    return None if name in allowed else " ".join([*allowed, name])


def raise_process_limits() -> None:
    """Open files and processes for this orchestrator (per process, not machine-wide)."""
    for which, want in ((resource.RLIMIT_NPROC, 8192), (resource.RLIMIT_NOFILE, 16384)):
        soft, hard = resource.getrlimit(which)
        if soft != resource.RLIM_INFINITY and soft < want:
            new_hard = hard if hard == resource.RLIM_INFINITY or hard >= want else want
            try:
                resource.setrlimit(which, (want, new_hard))
            except (ValueError, OSError):
                pass
