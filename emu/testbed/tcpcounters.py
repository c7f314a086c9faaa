"""TCP's own account of a run: retransmissions and timeouts per host, and drops at a host's port.

Why the orchestrator reads them: incast (many workers sending into one server at once)
overflows the switch's queue toward the server, and TCP pays for it with retransmissions and,
after a tail loss, a retransmission timeout (200 ms at least). A scheduler cannot say so (it
never reads the emulator, and gloo's sockets are not ours), but every Mininet host is a
network namespace whose kernel counts TCP for all of its sockets: /proc/<pid>/net/snmp
(`Tcp:`) and /proc/<pid>/net/netstat (`TcpExt:`) of any process in a host (its shell) show
that namespace's counters. The runner reads every host's when the roles start and again when
they end, before teardown (emu/run/runner.py), and keeps the differences: one row per host in
`tcp.parquet` and their totals in the run's row (`tcp_<counter>`). A host's cross traffic
(iperf3) counts too. Counts are the same in both clocks: time dilation converts none.

The loss itself is in the monitor's queue table (emu/testbed/monitor.py): `drops_toward` sums
what the queues of the link directions into some hosts dropped over the run (the switch's
port toward each server: `server_port_drops`), or those of every direction (`queue_drops`).
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from pathlib import Path

import pandas as pd

PROC = Path("/proc")
# column -> (file under /proc/<pid>/net, section, field): segments sent and what TCP resent
COUNTERS: dict[str, tuple[str, str, str]] = {
    "out_segs": ("snmp", "Tcp", "OutSegs"),               # segments sent, retransmissions excluded
    "retrans_segs": ("snmp", "Tcp", "RetransSegs"),       # segments retransmitted, for any reason
    "fast_retrans": ("netstat", "TcpExt", "TCPFastRetrans"),     # ... by fast retransmit (no timer)
    "timeouts": ("netstat", "TcpExt", "TCPTimeouts"),            # retransmission timers that fired
    "lost_retransmit": ("netstat", "TcpExt", "TCPLostRetransmit"),  # retransmissions lost again
    "sack_recovery": ("netstat", "TcpExt", "TCPSackRecovery"),   # SACK recovery episodes entered
    "syn_retrans": ("netstat", "TcpExt", "TCPSynRetrans"),       # connection attempts resent
}
COLUMNS = ["host", *COUNTERS]


def parse(text: str) -> dict[str, dict[str, int]]:
    """/proc/net/snmp or /proc/net/netstat as section -> field -> value. Each section is two
    lines that start with its name, `Tcp: RtoAlgorithm RtoMin ...` then `Tcp: 1 200 ...`;
    values may be negative (`MaxConn -1`); a line that is not a number stays out."""
    out: dict[str, dict[str, int]] = {}
    names: dict[str, list[str]] = {}
    for line in text.splitlines():
        section, sep, rest = line.partition(":")
        if not sep:
            continue
        fields = rest.split()
        if section not in names:
            names[section] = fields
            continue
        try:
            values = [int(v) for v in fields]
        except ValueError:
            continue
        out[section] = dict(zip(names.pop(section), values, strict=False))
    return out


def counters(snmp: str, netstat: str) -> dict[str, int | None]:
    """COUNTERS from the two files' text (None: a field this kernel does not have)."""
    text = {"snmp": parse(snmp), "netstat": parse(netstat)}
    return {col: text[f].get(sec, {}).get(field) for col, (f, sec, field) in COUNTERS.items()}


def read(pid: int, proc: Path = PROC) -> dict[str, int | None] | None:
    """The counters of the network namespace process `pid` is in; None if it cannot be read
    (the process has exited)."""
    try:
        net = proc / str(pid) / "net"
        return counters((net / "snmp").read_text(), (net / "netstat").read_text())
    except OSError:
        return None


def delta(before: Mapping[str, int | None] | None, after: Mapping[str, int | None] | None) -> dict[str, float]:
    """after - before per counter; NaN where either reading is missing."""
    def one(col: str) -> float:
        a, b = (before or {}).get(col), (after or {}).get(col)
        return math.nan if a is None or b is None else float(b - a)

    return {col: one(col) for col in COUNTERS}


class HostCounters:
    """Every host's TCP counters from now on: the first reading is taken when it is made,
    `table()` takes the second and returns the differences."""

    def __init__(self, pids: Mapping[str, int], proc: Path = PROC):
        self.pids, self.proc = dict(pids), proc
        self.before = {host: read(pid, proc) for host, pid in self.pids.items()}

    def table(self) -> pd.DataFrame:
        """One row per host: what its TCP counted since the first reading (NaN: unreadable)."""
        rows = [{"host": host, **delta(self.before[host], read(pid, self.proc))} for host, pid in self.pids.items()]
        return pd.DataFrame(rows, columns=COLUMNS)


def totals(table: pd.DataFrame | None) -> dict[str, float]:
    """The run row's `tcp_<counter>`: the sum over hosts (NaN when no host could be read)."""
    if table is None or not len(table):
        return {f"tcp_{col}": math.nan for col in COUNTERS}
    return {f"tcp_{col}": float(table[col].sum(min_count=1)) for col in COUNTERS}


def drops_toward(qdiscs: pd.DataFrame | None, hosts: Iterable[str] | None = None) -> float:
    """Packets dropped over the monitored time by the queues of every link direction into
    `hosts` (labels `<peer>-><host>`: on a star, the switch's port toward the host; None: every
    direction, the hosts' own egress queues included). The qdisc's `drops` is the kernel's
    running count, so each direction adds its last sample less its first. NaN when no such
    direction was sampled (no host given, or no queue table)."""
    if qdiscs is None or not len(qdiscs) or (hosts is not None and not set(hosts)):
        return math.nan
    dst = qdiscs["link"].map(lambda label: label.split("->")[-1])
    into = qdiscs if hosts is None else qdiscs[dst.isin(set(hosts))]
    if not len(into):
        return math.nan
    per = into.sort_values("t").groupby("link")["drops"].agg(["first", "last"])
    return float((per["last"] - per["first"]).sum())
