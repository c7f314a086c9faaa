"""The role side of the progress report (contracts/progress.py): a thread that rewrites it.

The orchestrator's watchdog needs to know, for every role, whether it is still moving:
iterations completed, and bytes moved per connection. Counting bytes in the transport would
miss the sockets it does not own (gloo's) and put work on the data path, so the thread asks
the kernel instead: every INTERVAL_S it lists the process's TCP sockets (/proc/self/fd) and
reads each one's TCP_INFO. That is a few syscalls per socket, twice a second.

The sockets are read through their file descriptors with libc directly (ctypes), never
wrapped in Python socket objects: a wrapper made while `socket.setdefaulttimeout` is set
would switch the shared descriptor to non-blocking under its owner's feet.

Reporting is best effort: a report that cannot be written is skipped, never an error of the
role (a role that dies of its own watchdog would be the worst kind of stall).
"""
from __future__ import annotations

import collections
import ctypes
import ipaddress
import json
import os
import socket
import statistics
import struct
import threading
import time
from pathlib import Path

from contracts import progress as contract

_TCP_INFO_LEN = 232
_LISTEN = 10                    # TCP state LISTEN: no peer, nothing to report
RECENT = 100                    # iterations the median is taken over (the recent behaviour)
MIN_TIMED = 3                   # iterations (after the first) before a median is reported

_libc = ctypes.CDLL(None, use_errno=True)


def _sockaddr(fn, fd: int) -> str | None:
    """getsockname/getpeername of `fd` as "ip:port", None when it has none (or is not IP)."""
    buf = ctypes.create_string_buffer(128)
    n = ctypes.c_uint32(128)
    if fn(fd, buf, ctypes.byref(n)) != 0:
        return None
    raw = buf.raw
    family = struct.unpack_from("=H", raw, 0)[0]
    port = struct.unpack_from("!H", raw, 2)[0]
    if family == socket.AF_INET:
        return f"{ipaddress.IPv4Address(raw[4:8])}:{port}"
    if family == socket.AF_INET6:
        ip6 = ipaddress.IPv6Address(raw[8:24])
        return f"{ip6.ipv4_mapped or ip6}:{port}"
    return None


def tcp_info(fd: int) -> bytes | None:
    """The kernel's struct tcp_info of socket `fd`, None if `fd` is not a TCP socket."""
    buf = ctypes.create_string_buffer(_TCP_INFO_LEN)
    n = ctypes.c_uint32(_TCP_INFO_LEN)
    if _libc.getsockopt(fd, socket.IPPROTO_TCP, socket.TCP_INFO, buf, ctypes.byref(n)) != 0:
        return None
    return buf.raw[:n.value]


def conn_progress(fd: int) -> contract.ConnProgress | None:
    """What connection `fd` has moved, from TCP_INFO (offsets of struct tcp_info in
    linux/tcp.h: bytes_acked and bytes_received since Linux 4.1/4.2)."""
    info = tcp_info(fd)
    if info is None or len(info) < 60 or info[0] == _LISTEN:
        return None
    peer = _sockaddr(_libc.getpeername, fd)
    local = _sockaddr(_libc.getsockname, fd)
    if peer is None or local is None:
        return None
    acked, received = struct.unpack_from("=QQ", info, 120) if len(info) >= 136 else (0, 0)
    return contract.ConnProgress(
        local=local, peer=peer, state=info[0], sent_bytes=acked, received_bytes=received,
        unacked=struct.unpack_from("=I", info, 24)[0], backoff=info[4],
        idle_send_s=struct.unpack_from("=I", info, 44)[0] / 1e3,
        idle_recv_s=struct.unpack_from("=I", info, 52)[0] / 1e3)


def tcp_connections() -> list[contract.ConnProgress]:
    """Every connected TCP socket of this process. A descriptor closed (or reused) while it
    is read gives an error or another socket's figures: skipped, or right for that one."""
    out = []
    try:
        fds = os.listdir("/proc/self/fd")
    except OSError:
        return out
    for name in fds:
        try:
            if not os.readlink(f"/proc/self/fd/{name}").startswith("socket:"):
                continue
        except OSError:
            continue
        c = conn_progress(int(name))
        if c is not None:
            out.append(c)
    return sorted(out, key=lambda c: (c.peer, c.local))


class ProgressReporter:
    """Rewrites `<out_dir>/<role>.progress.json` every `interval_s` from a daemon thread.

    A worker calls `iteration()` after each iteration and `phase()` when it leaves the loop;
    a server only starts it (its progress is its bytes)."""

    def __init__(self, out_dir: str | Path, role: str, phase: contract.Phase = "starting",
                 interval_s: float = contract.INTERVAL_S):
        self.path = contract.path(out_dir, role)
        self.role = role
        self.interval_s = interval_s
        self._phase: contract.Phase = phase
        self._iterations = 0
        self._times: collections.deque[float] = collections.deque(maxlen=RECENT)
        self._seq = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="progress", daemon=True)

    def start(self) -> ProgressReporter:
        self._thread.start()
        return self

    def iteration(self, done: int, duration_s: float) -> None:
        """`done` iterations are complete; the last took `duration_s` (the first is left out
        of the median: it records the layer order and connects)."""
        if done > 1:
            self._times.append(duration_s)
        self._iterations = done
        if self._phase == "starting":
            self._phase = "training"

    def phase(self, phase: contract.Phase) -> None:
        self._phase = phase

    def snapshot(self) -> contract.RoleProgress:
        conns = tcp_connections()   # first: the time and counts below are then no older than it
        times = list(self._times)
        self._seq += 1
        return contract.RoleProgress(
            role=self.role, pid=os.getpid(), t=time.time(), seq=self._seq, phase=self._phase,
            iterations=self._iterations,
            iteration_median_s=statistics.median(times) if len(times) >= MIN_TIMED else None,
            conns=conns)

    def write(self) -> None:
        try:
            tmp = self.path.with_name(f".{self.path.name}.tmp")
            tmp.write_text(json.dumps(self.snapshot().model_dump(mode="json")))
            os.replace(tmp, self.path)
        except (OSError, ValueError):
            pass  # best effort: see the module's docstring

    def _run(self) -> None:
        while True:
            self.write()
            if self._stop.wait(self.interval_s):
                return

    def stop(self) -> None:
        """Stop the thread and write a last report (what the role ended with)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(2 * self.interval_s + 1)
        self.write()
