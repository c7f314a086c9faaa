"""rtnetlink inside the testbed's network namespaces: link counters, qdisc statistics and
htb rate changes without a process per sample (the `netlink` monitor backend).

Namespaces. Mininet's hosts are unnamed network namespaces, known by the pid of each host's
shell: `/proc/<pid>/ns/net`. A netlink socket belongs to the namespace it was created in,
for its whole life, whichever thread later uses it. So each namespace gets one
NETLINK_ROUTE socket, opened once: a short-lived thread enters the namespace
(pyroute2.netns.setns; setns(2) moves only the calling thread), creates the socket, looks up
the interfaces' indexes there, and leaves. Nothing forks, and no thread of the orchestrator
but that one ever leaves the root namespace. An open socket keeps its namespace alive, so
every socket is closed before the network is torn down (Monitor.stop, Testbed.__exit__).

The hot path. At 100 Hz for 32 hosts the monitor asks 3,300 qdiscs a second. It sends
prebuilt requests (one RTM_GETQDISC per shaped interface, one RTM_GETSTATS dump of the root
namespace's link counters) and reads only the fields it needs, at their fixed offsets, with
`struct`: a few microseconds a message. pyroute2's own decoders read every attribute of every
message into Python objects, which costs far more than the budget (docs/testbed.md: Testbed figures);
tests/unit/test_netlink.py checks these parsers against pyroute2's decoders on kernel replies.

Rate changes. `htb_class_change` is what `tc class change ... htb rate R ceil R burst B
cburst B quantum 1514` sends (emu/testbed/tc.py `_rate_args`), with the link layer given
(Ethernet), so the kernel needs no rate tables; rates of 2^32 bytes/s or more go in the
64-bit attributes, as tc does. The request asks for an acknowledgement, which the kernel
sends after the class has its new rate.
"""
from __future__ import annotations

import errno
import os
import select
import socket
import struct
import threading
import time
from collections.abc import Iterable, Iterator
from typing import NamedTuple

from emu.testbed import tc

# Kernel ABI (linux/netlink.h, linux/rtnetlink.h, linux/pkt_sched.h, linux/gen_stats.h,
# linux/if_link.h). Netlink is in the host's byte order.
NETLINK_ROUTE = 0
NLMSG_ERROR, NLMSG_DONE = 2, 3
NLM_F_REQUEST, NLM_F_MULTI, NLM_F_ACK, NLM_F_ECHO, NLM_F_DUMP = 0x1, 0x2, 0x4, 0x8, 0x300
RTM_NEWQDISC, RTM_GETQDISC = 36, 38
RTM_NEWTCLASS, RTM_GETTCLASS = 40, 42
RTM_NEWSTATS, RTM_GETSTATS = 92, 94
NLA_TYPE_MASK = 0x3FFF  # without NLA_F_NESTED and NLA_F_NET_BYTEORDER
TC_H_ROOT = 0xFFFFFFFF
TCA_KIND, TCA_OPTIONS, TCA_STATS2 = 1, 2, 7
TCA_STATS_BASIC, TCA_STATS_QUEUE = 1, 3
TCA_HTB_PARMS, TCA_HTB_RATE64, TCA_HTB_CEIL64 = 1, 6, 7
IFLA_STATS_LINK_64 = 1
TC_LINKLAYER_ETHERNET = 1

_HDR = struct.Struct("=IHHII")  # nlmsghdr: len, type, flags, seq, pid
_HDR_HEAD = struct.Struct("=IH")  # its len and type
_ATTR = struct.Struct("=HH")  # nlattr: len, type
_TCMSG = struct.Struct("=BxxxiIII")  # family, ifindex, handle, parent, info
_IFSTATS = struct.Struct("=BxxxiI")  # if_stats_msg: family, ifindex, filter_mask
_QUEUE = struct.Struct("=IIIII")  # gnet_stats_queue: qlen, backlog, drops, requeues, overlimits
_QUEUE3 = struct.Struct("=III")  # its qlen, backlog, drops
_IFINDEX = struct.Struct("=4xi")  # the ifindex of a tcmsg or an if_stats_msg
_IF_PARENT = struct.Struct("=4xi4xI")  # a tcmsg's ifindex and parent
_BASIC = struct.Struct("=QI")  # gnet_stats_basic: bytes, packets
_LINK64 = struct.Struct("=QQQQ")  # rtnl_link_stats64: rx_packets, tx_packets, rx_bytes, tx_bytes, ...
_ERR = struct.Struct("=i")
_RATESPEC = struct.Struct("=BBHhHI")  # tc_ratespec: cell_log, linklayer, overhead, cell_align, mpu, rate
_HTB_OPT = struct.Struct("=12s12sIIIII")  # tc_htb_opt: rate, ceil, buffer, cbuffer, quantum, level, prio
_U64 = struct.Struct("=Q")

HTB_HANDLE, HTB_CLASS = 0x50000, 0x50001  # emu/testbed/tc.py: HANDLE "5:", CLASS "5:1"
assert tc.HANDLE == "5:" and tc.CLASS == "5:1"

BUF_BYTES = 1 << 16
DUMP_FROM = 4  # a namespace shaping this many interfaces or more is read by one dump


class NetlinkError(RuntimeError):
    """A namespace could not be opened, or the kernel refused a request."""


def available() -> str | None:
    """Why the netlink backend cannot run here (None: it can): it needs pyroute2, and root
    to enter the hosts' namespaces."""
    try:
        import pyroute2.netns  # noqa: F401
    except ImportError:
        return "the Python package pyroute2 is not installed (requirements.txt)"
    if os.geteuid() != 0:
        return "entering the hosts' network namespaces needs root"
    return None


# ---------------------------------------------------------------------------- messages

def _message(mtype: int, flags: int, body: bytes, seq: int = 0) -> bytes:
    return _HDR.pack(_HDR.size + len(body), mtype, flags, seq, 0) + body


def _attr(atype: int, payload: bytes) -> bytes:
    raw = _ATTR.pack(_ATTR.size + len(payload), atype) + payload
    return raw + b"\0" * (-len(raw) % 4)


def qdisc_request(ifindex: int, seq: int = 0) -> bytes:
    """RTM_GETQDISC for the root qdisc of `ifindex`: one RTM_NEWQDISC (or an error) back.
    The kernel answers a qdisc get as a notification (qdisc_notify), which reaches the asker
    only with NLM_F_ECHO; without it there is no reply at all (measured on Linux 6.18)."""
    body = _TCMSG.pack(socket.AF_UNSPEC, ifindex, 0, TC_H_ROOT, 0)
    return _message(RTM_GETQDISC, NLM_F_REQUEST | NLM_F_ECHO, body, seq)


def link_stats_request(seq: int = 0) -> bytes:
    """RTM_GETSTATS dump of every interface's 64-bit counters (and nothing else)."""
    mask = 1 << (IFLA_STATS_LINK_64 - 1)
    return _message(RTM_GETSTATS, NLM_F_REQUEST | NLM_F_DUMP, _IFSTATS.pack(socket.AF_UNSPEC, 0, mask), seq)


def qdisc_dump_request(seq: int = 0) -> bytes:
    """RTM_GETQDISC dump of every qdisc of the namespace, packed many to a datagram: where a
    namespace shapes many interfaces (the switch's), cheaper than one get each (measured:
    bench/bench_testbed.py's monitor section)."""
    return _message(RTM_GETQDISC, NLM_F_REQUEST | NLM_F_DUMP, _TCMSG.pack(socket.AF_UNSPEC, 0, 0, 0, 0), seq)


_psched: float | None = None


def _tick_in_usec() -> float:
    """Kernel scheduler ticks per microsecond, as tc reads them (/proc/net/psched)."""
    global _psched
    if _psched is None:
        with open("/proc/net/psched") as f:
            t2us, us2t, clock_res = (int(x, 16) for x in f.read().split()[:3])
        if clock_res == 1_000_000_000:
            t2us = us2t
        _psched = t2us / us2t * (clock_res / 1e6)
    return _psched


def _xmittime(rate_Bps: int, size: int) -> int:
    """tc's tc_calc_xmittime: ticks to send `size` bytes at `rate_Bps`, through its two
    conversions to a 32-bit unsigned int (which wrap at htb's minimum rate, as tc's do)."""
    usec = int(1e6 * size / rate_Bps) & 0xFFFFFFFF
    return int(usec * _tick_in_usec()) & 0xFFFFFFFF


def htb_class_change(ifindex: int, rate_bps: float, seq: int = 0) -> bytes:
    """`tc class change dev IF parent 5: classid 5:1 htb` with emu/testbed/tc.py's parameters for
    `rate_bps` (tc.rate_bits, tc.burst_bytes, tc.QUANTUM), acknowledged."""
    rate = tc.rate_bits(rate_bps) // 8  # bytes/s, as tc's get_rate64 truncates
    buffer = _xmittime(rate, tc.burst_bytes(rate_bps))
    spec = _RATESPEC.pack(3, TC_LINKLAYER_ETHERNET, 0, -1, 0, min(rate, 0xFFFFFFFF))  # cell_log 3: tc's, mtu 1600
    opts = b""
    if rate >= 1 << 32:
        opts += _attr(TCA_HTB_RATE64, _U64.pack(rate)) + _attr(TCA_HTB_CEIL64, _U64.pack(rate))
    opts += _attr(TCA_HTB_PARMS, _HTB_OPT.pack(spec, spec, buffer, buffer, int(tc.QUANTUM), 0, 0))
    body = _TCMSG.pack(socket.AF_UNSPEC, ifindex, HTB_CLASS, HTB_HANDLE, 0) + _attr(TCA_KIND, b"htb\0") \
        + _attr(TCA_OPTIONS, opts)
    return _message(RTM_NEWTCLASS, NLM_F_REQUEST | NLM_F_ACK, body, seq)


class Msg(NamedTuple):
    type: int
    flags: int
    seq: int
    start: int  # the payload: buf[start:end]
    end: int


def messages(buf, n: int) -> Iterator[Msg]:
    """The netlink messages in buf[:n]."""
    off = 0
    while off + _HDR.size <= n:
        length, mtype, flags, seq, _ = _HDR.unpack_from(buf, off)
        if length < _HDR.size or off + length > n:
            return
        yield Msg(mtype, flags, seq, off + _HDR.size, off + length)
        off += (length + 3) & ~3


def error_code(buf, msg: Msg) -> int:
    """The errno of an NLMSG_ERROR message (0: an acknowledgement)."""
    return -_ERR.unpack_from(buf, msg.start)[0]


class QdiscStats(NamedTuple):
    ifindex: int
    handle: int
    parent: int
    backlog: int  # bytes queued
    drops: int
    qlen: int  # packets queued
    bytes: int  # sent
    packets: int


def parse_qdisc(buf, start: int, end: int) -> QdiscStats:
    """An RTM_NEWQDISC payload: its tcmsg and TCA_STATS2's queue and basic counters (what
    `tc -s qdisc show` prints as backlog, dropped and Sent). Absent counters are 0."""
    _, ifindex, handle, parent, _ = _TCMSG.unpack_from(buf, start)
    qlen = backlog = drops = nbytes = packets = 0
    off = start + _TCMSG.size
    while off + 4 <= end:
        alen, atype = _ATTR.unpack_from(buf, off)
        if alen < 4:
            break
        if atype & NLA_TYPE_MASK == TCA_STATS2:
            inner, stop = off + 4, min(off + alen, end)
            while inner + 4 <= stop:
                blen, btype = _ATTR.unpack_from(buf, inner)
                if blen < 4:
                    break
                btype &= NLA_TYPE_MASK
                if btype == TCA_STATS_QUEUE and blen >= 4 + _QUEUE.size:
                    qlen, backlog, drops, _, _ = _QUEUE.unpack_from(buf, inner + 4)
                elif btype == TCA_STATS_BASIC and blen >= 4 + _BASIC.size:
                    nbytes, packets = _BASIC.unpack_from(buf, inner + 4)
                inner += (blen + 3) & ~3
            break
        off += (alen + 3) & ~3
    return QdiscStats(ifindex, handle, parent, backlog, drops, qlen, nbytes, packets)


def _queue_offset(buf, start: int, end: int) -> int | None:
    """Where TCA_STATS2's gnet_stats_queue starts in an RTM_NEWQDISC payload (None: absent)."""
    off = start + _TCMSG.size
    while off + 4 <= end:
        alen, atype = _ATTR.unpack_from(buf, off)
        if alen < 4:
            return None
        if atype & NLA_TYPE_MASK == TCA_STATS2:
            inner, stop = off + 4, min(off + alen, end)
            while inner + 4 <= stop:
                blen, btype = _ATTR.unpack_from(buf, inner)
                if blen < 4:
                    return None
                if btype & NLA_TYPE_MASK == TCA_STATS_QUEUE and blen >= 4 + _QUEUE.size:
                    return inner + 4
                inner += (blen + 3) & ~3
            return None
        off += (alen + 3) & ~3
    return None


def queue_stats(buf, start: int, end: int, cache: dict[int, int]) -> tuple[int, int, int]:
    """(ifindex, backlog bytes, drops) of an RTM_NEWQDISC payload, as parse_qdisc reads them.
    The kernel words every reply about the same qdisc alike, so where a payload of this
    length had its queue counters is remembered (`cache`) and tried first, checked by the
    attribute header in front of it."""
    at = cache.get(end - start)
    if at is None or _ATTR.unpack_from(buf, start + at - 4) != (4 + _QUEUE.size, TCA_STATS_QUEUE):
        found = _queue_offset(buf, start, end)
        if found is None:
            return _IFINDEX.unpack_from(buf, start)[0], 0, 0
        at = cache[end - start] = found - start
    _, backlog, drops = _QUEUE3.unpack_from(buf, start + at)
    return _IFINDEX.unpack_from(buf, start)[0], backlog, drops


def parse_link_stats(buf, start: int, end: int) -> tuple[int, int, int] | None:
    """An RTM_NEWSTATS payload: (ifindex, rx_bytes, tx_bytes), None without 64-bit counters."""
    _, ifindex, _ = _IFSTATS.unpack_from(buf, start)
    off = start + _IFSTATS.size
    while off + 4 <= end:
        alen, atype = _ATTR.unpack_from(buf, off)
        if alen < 4:
            break
        if atype & NLA_TYPE_MASK == IFLA_STATS_LINK_64 and alen >= 4 + _LINK64.size:
            _, _, rx, tx = _LINK64.unpack_from(buf, off + 4)
            return ifindex, rx, tx
        off += (alen + 3) & ~3
    return None


# ---------------------------------------------------------------------------- sockets

Ns = int | str | None  # a pid (its /proc/<pid>/ns/net), a namespace file's path, or None: ours


def ns_path(ns: Ns) -> str | None:
    return None if ns is None else f"/proc/{ns}/ns/net" if isinstance(ns, int) else ns


def _new_socket() -> socket.socket:
    s = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, NETLINK_ROUTE)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
    s.bind((0, 0))
    return s


def open_sockets(wanted: dict[Ns, Iterable[str]]) -> dict[Ns, tuple[socket.socket, dict[str, int]]]:
    """A NETLINK_ROUTE socket in each namespace, with the indexes of the named interfaces
    there: ns -> (socket, {name: ifindex}). Raises NetlinkError naming what failed (and
    closes what it opened)."""
    out: dict[Ns, tuple[socket.socket, dict[str, int]]] = {}
    failure: list[BaseException] = []

    def one(ns: Ns, names: Iterable[str]) -> None:
        s = _new_socket()
        index = {}
        for n in names:
            try:
                index[n] = socket.if_nametoindex(n)
            except OSError as e:
                s.close()
                raise NetlinkError(f"interface {n} in network namespace {ns_path(ns) or '(root)'}: "
                                   f"{e.strerror or e}") from None
        out[ns] = (s, index)

    def enter_each() -> None:
        from pyroute2.netns import setns
        own = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        try:
            for ns, names in wanted.items():
                if ns is None:
                    continue
                try:
                    fd = os.open(ns_path(ns), os.O_RDONLY | os.O_CLOEXEC)
                except OSError as e:
                    raise NetlinkError(f"opening network namespace {ns_path(ns)}: {e.strerror}") from None
                try:
                    setns(fd)
                    one(ns, names)
                finally:
                    os.close(fd)
                    setns(own)  # if this failed, the thread would end in the host's namespace, harmlessly
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            failure.append(e)
        finally:
            os.close(own)

    try:
        if None in wanted:
            one(None, wanted[None])
        if any(ns is not None for ns in wanted):
            th = threading.Thread(target=enter_each, name="netns-open", daemon=True)
            th.start()
            th.join()
        if failure:
            e = failure[0]
            raise e if isinstance(e, NetlinkError) else NetlinkError(f"entering a network namespace: {e}")
    except BaseException:
        for s, _ in out.values():
            s.close()
        raise
    return out


def _recv(sock: socket.socket, buf, timeout_s: float = 2.0) -> int:
    """One datagram into buf; waits up to timeout_s only when nothing is queued yet (a
    request's reply is normally queued before send() returns)."""
    try:
        return sock.recv_into(buf, 0, socket.MSG_DONTWAIT)
    except BlockingIOError:
        p = select.poll()
        p.register(sock, select.POLLIN)
        if not p.poll(timeout_s * 1000):
            raise TimeoutError(errno.ETIMEDOUT, "no netlink reply") from None
        return sock.recv_into(buf, 0, socket.MSG_DONTWAIT)


def drain(sock: socket.socket, buf) -> None:
    """Drop whatever replies are still queued (after a failed exchange)."""
    while True:
        try:
            sock.recv_into(buf, 0, socket.MSG_DONTWAIT)
        except OSError:
            return


class HtbRates:
    """htb rate changes through netlink: one socket per namespace, opened on first use (or by
    `prepare`), safe to call from several threads."""

    def __init__(self) -> None:
        self._socks: dict[Ns, tuple[socket.socket, dict[str, int]]] = {}
        self._lock = threading.Lock()
        self._seq = 0
        self._buf = bytearray(BUF_BYTES)

    def prepare(self, dev: str, ns: Ns) -> None:
        with self._lock:
            self._handle(dev, ns)

    def _handle(self, dev: str, ns: Ns) -> tuple[socket.socket, int]:
        if ns not in self._socks:
            self._socks.update(open_sockets({ns: [dev]}))
        sock, index = self._socks[ns]
        if dev not in index:
            index[dev] = open_indexes(ns, [dev])[dev]
        return sock, index[dev]

    def set(self, dev: str, ns: Ns, rate_bps: float) -> None:
        """Class 5:1 of `dev` to `rate_bps`; returns once the kernel acknowledged it."""
        with self._lock:
            sock, ifindex = self._handle(dev, ns)
            self._seq = (self._seq + 1) & 0xFFFFFFFF
            try:
                sock.send(htb_class_change(ifindex, rate_bps, self._seq))
                while True:
                    n = _recv(sock, self._buf)
                    for m in messages(self._buf, n):
                        if m.type == NLMSG_ERROR and m.seq == self._seq:
                            code = error_code(self._buf, m)
                            if code:
                                raise NetlinkError(f"htb class change on {dev} to {rate_bps:g} bit/s: "
                                                   f"{os.strerror(code)}")
                            return
            except OSError as e:
                drain(sock, self._buf)
                raise NetlinkError(f"htb class change on {dev}: {e}") from None

    def close(self) -> None:
        with self._lock:
            for s, _ in self._socks.values():
                s.close()
            self._socks.clear()


def open_indexes(ns: Ns, names: list[str]) -> dict[str, int]:
    """The indexes of interfaces in a namespace (a socket is opened and closed for it)."""
    got = open_sockets({ns: names})
    s, index = got[ns]
    s.close()
    return index


class Sampler:
    """The monitor's prepared queries: the root qdisc of every shaped interface (egress:
    label -> (interface, namespace)) and the root namespace's link counters (counters: label
    -> (interface, 'tx'|'rx')). `sockets` and `dump_socket` replace the ones it would open
    (tests)."""

    def __init__(self, egress: dict[str, tuple[str, Ns]], counters: dict[str, tuple[str, str]],
                 sockets: dict[Ns, tuple[socket.socket, dict[str, int]]] | None = None,
                 dump_socket: socket.socket | None = None):
        wanted: dict[Ns, set[str]] = {}
        for dev, ns in egress.values():
            wanted.setdefault(ns, set()).add(dev)
        if counters:
            wanted.setdefault(None, set()).update(intf for intf, _ in counters.values())
        self._socks = sockets if sockets is not None else open_sockets({ns: sorted(d) for ns, d in wanted.items()})
        self._buf = bytearray(BUF_BYTES)
        # Per namespace: socket, its request (gets in one datagram, or a dump), how many
        # replies (0: a dump, read to its end), ifindex -> labels.
        self._queries: list[tuple[socket.socket, bytes, int, dict[int, list[str]]]] = []
        by_ns: dict[Ns, dict[int, list[str]]] = {}
        for label, (dev, ns) in egress.items():
            by_ns.setdefault(ns, {}).setdefault(self._socks[ns][1][dev], []).append(label)
        for ns, labels in by_ns.items():
            if len(labels) >= DUMP_FROM:
                self._queries.append((self._socks[ns][0], qdisc_dump_request(), 0, labels))
            else:
                self._queries.append((self._socks[ns][0], b"".join(qdisc_request(i) for i in labels), len(labels),
                                      labels))
        self._counters: dict[int, list[tuple[str, bool]]] = {}
        for label, (intf, direction) in counters.items():
            self._counters.setdefault(self._socks[None][1][intf], []).append((label, direction == "tx"))
        self._dump = dump_socket if dump_socket is not None or not counters else _new_socket()
        self._queue_at: dict[int, int] = {}
        self._dump_request = link_stats_request()

    def qdiscs(self, rows: list, t0: float, now=time.monotonic) -> None:
        """Appends (label, t - t0, read_s, backlog bytes, drops) per shaped interface: one
        exchange per namespace, timed (the snapshot lies within [t - read_s, t]; one
        exchange's start is the previous one's end, so one clock read each)."""
        before = now()
        for sock, request, expect, labels in self._queries:
            got: list[tuple[int, int, int] | None] = []
            try:
                sock.send(request)
                self._replies(sock, expect, labels, got)
            except OSError:
                drain(sock, self._buf)
                before = now()
                continue
            after = now()
            t, read_s = after - t0, after - before
            for q in got:
                if q is not None:
                    for label in labels[q[0]]:
                        rows.append((label, t, read_s, q[1], q[2]))
            before = after

    def _replies(self, sock: socket.socket, expect: int, labels: dict[int, list[str]], got: list) -> None:
        """The root qdiscs of `labels`' interfaces among the replies: `expect` of them to gets
        (an error stands for an interface that is gone), or those of a dump, to its end. The
        parse is messages() and parse_qdisc inlined: this runs thousands of times a second."""
        buf, cache = self._buf, self._queue_at
        while True:
            n = _recv(sock, buf)
            off = 0
            while off + _HDR.size <= n:
                length, mtype = _HDR_HEAD.unpack_from(buf, off)
                if length < _HDR.size or off + length > n:
                    break
                if mtype == RTM_NEWQDISC:
                    ifindex, parent = _IF_PARENT.unpack_from(buf, off + _HDR.size)
                    if parent == TC_H_ROOT and ifindex in labels:
                        got.append(queue_stats(buf, off + _HDR.size, off + length, cache))
                elif mtype == NLMSG_ERROR:
                    if not expect:
                        return  # a dump that failed: what came so far counts
                    got.append(None)
                elif mtype == NLMSG_DONE:
                    return
                off += (length + 3) & ~3
            if expect and len(got) >= expect:
                return

    def counters(self) -> dict[str, int]:
        """label -> the byte counter now (root namespace, one dump; messages() and
        parse_link_stats inlined, as in _replies)."""
        out: dict[str, int] = {}
        if self._dump is None:
            return out
        buf, want = self._buf, self._counters
        try:
            self._dump.send(self._dump_request)
            while True:
                n = _recv(self._dump, buf)
                off = 0
                while off + _HDR.size <= n:
                    length, mtype = _HDR_HEAD.unpack_from(buf, off)
                    if length < _HDR.size or off + length > n:
                        break
                    if mtype == RTM_NEWSTATS:
                        labels = want.get(_IFINDEX.unpack_from(buf, off + _HDR.size)[0])
                        if labels is not None:  # else one of the machine's other interfaces
                            got = parse_link_stats(buf, off + _HDR.size, off + length)
                            if got is not None:
                                for label, is_tx in labels:
                                    out[label] = got[2] if is_tx else got[1]
                    elif mtype in (NLMSG_DONE, NLMSG_ERROR):
                        return out
                    off += (length + 3) & ~3
                if n == 0:
                    return out
        except OSError:
            drain(self._dump, buf)
            return out

    def close(self) -> None:
        for s, _ in self._socks.values():
            s.close()
        if self._dump is not None:
            self._dump.close()
