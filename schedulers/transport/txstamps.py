"""When each frame's bytes leave the host, and how long a ready frame waited behind bytes of
lower priority: traced runs only (`trace: true`).

An outbox (transport.py) picks its best frame as late as it can, but a frame that becomes
ready may still find bytes of worse frames ahead of it: the frame being written and what
the kernel already holds (its bounded send queue, the host's qdisc). For a frame P with
outbox order o_P (lower = more urgent), put into the outbox at r_P:

    inversion(P) = max(0, max{ t_last(Q) : Q written before P, o_Q > o_P } - r_P)

where t_last(Q) is when the last byte of Q left the host. Only frames that carry data
(PUSH, RESULT) are reported; every frame, control frames too, can stand ahead of one.

How t_last is measured: the socket asks for SO_TIMESTAMPING software transmit stamps
(SOF_TIMESTAMPING_TX_SOFTWARE | SOFTWARE | OPT_ID | OPT_ID_TCP | OPT_TSONLY). For TCP the
kernel stamps the last byte of each send call when the device driver takes the packet that
holds it (a whole GSO packet, up to 64 KiB, at once), after the qdisc: on a Mininet host
that is when the host's htb (its egress shaping) dequeues it to the veth, which stamps
(veth_xmit; `ethtool -T` lists software-transmit). Checked in a network namespace pair,
veth with htb 10 Mbit/s and a bfifo: five 20 kB writes in 0.1 ms got SCHED stamps (qdisc
entry) at the writes but SND stamps at 0 (the htb burst), 19 ms and 67 ms, the qdisc's
pace; two of the five stamps were merged away (below). On loopback it is when the packet is
handed to `lo`, which waits for the reader's window. Queues after the host (a switch port's
htb) are not included. The stamp comes back on the socket's error queue with the byte's
offset (counted from when stamping was turned on: OPT_ID_TCP, Linux 6.2+; without it
`TxStamps.enable` gives None and the run has no table) and CLOCK_REALTIME, the clock of
time.time().

Two kernel facts shape the bookkeeping:
- A later send that is appended to a packet not yet sent moves that packet's stamp to its
  own last byte, so some frames get no stamp of their own. TCP sends in order, so a stamp
  for offset k says every byte up to k has left: each stamp completes every frame that
  ends at or before k (a frame without its own stamp gets the next one, an upper bound).
- poll() reports POLLERR while stamps wait in the error queue, so the outbox thread reads
  them whenever its wait for the socket (`wait_writable`) wakes for them, every
  IDLE_DRAIN_S while it is idle with stamps to come, and for up to CLOSE_WAIT_S after its
  BYE. (The queue is charged to the socket's receive buffer; a stamp the kernel drops for
  want of room is covered by the next, as above.)

t_last(Q) grows with the write order, so the maximum above is t_last of the last frame
written before P whose order is worse. Frames written before P with a worse order were all
picked before P was put (the outbox sends its best frame), so that frame is found when P is
put: `ready` keeps the frames picked whose stamp had not come yet as a stack of strictly
decreasing orders (a frame followed by one of no better order can never be the answer) and
takes the newest frame in it that is worse than P.

Every data frame gets a row, kept in arrays, not a sample (about 56 bytes a frame: 1e6
frames cost about 56 MB; the event trace costs more per frame): the columns of
contracts/tx_frames.py. first_byte_t is max(write time, last_byte_t of the frame written
before): when its first byte could leave. Cost, loopback on the 2-core reference machine:
about 5-6 µs of CPU per frame (16 KiB frames: 9 µs without stamps, 14.5 µs with).
"""
from __future__ import annotations

import math
import os
import select
import socket
import struct
import time
from array import array
from collections import deque

import numpy as np

from contracts.tx_frames import COLUMNS
from schedulers.transport.connection import HEADER, Kind

SO_TIMESTAMPING = getattr(socket, "SO_TIMESTAMPING", 37)
SOF_TIMESTAMPING_TX_SOFTWARE = 1 << 1
SOF_TIMESTAMPING_SOFTWARE = 1 << 4
SOF_TIMESTAMPING_OPT_ID = 1 << 7
SOF_TIMESTAMPING_OPT_TSONLY = 1 << 11
SOF_TIMESTAMPING_OPT_ID_TCP = 1 << 16  # offsets from the next byte written (Linux 6.2+)
FLAGS = (SOF_TIMESTAMPING_TX_SOFTWARE | SOF_TIMESTAMPING_SOFTWARE | SOF_TIMESTAMPING_OPT_ID
         | SOF_TIMESTAMPING_OPT_ID_TCP | SOF_TIMESTAMPING_OPT_TSONLY)
SCM_TSTAMP_SND = 0
_RECVERR = {(socket.SOL_IP, 11), (getattr(socket, "SOL_IPV6", 41), 25)}  # IP_RECVERR, IPV6_RECVERR
_SEE = struct.Struct("=IBBBBII")   # struct sock_extended_err: ee_info, ee_data at 8 and 12
_TS = struct.Struct("=qq")         # struct timespec, the first of SCM_TIMESTAMPING's three
_ERRQ = socket.MSG_ERRQUEUE | socket.MSG_DONTWAIT
_U32, _HALF = 0xFFFFFFFF, 0x80000000
IDLE_DRAIN_S = 0.01  # how often an idle outbox with stamps to come reads them
CLOSE_WAIT_S = 2.0   # how long a closing outbox waits for its last frames' stamps
DATA = (Kind.PUSH, Kind.RESULT)


class Frame:
    """One frame from `ready` to its stamp."""

    __slots__ = ("order", "ready", "blocker", "end", "write_t", "left", "ident")

    def __init__(self, order, ready: float, blocker: Frame | None):
        self.order, self.ready, self.blocker = order, ready, blocker
        self.end = 0            # bytes written through this frame's last byte
        self.write_t = ready    # when it was handed to the socket
        self.left: float | None = None  # t_last: when its last byte left the host
        self.ident: tuple | None = None  # (key, chunk, it, priority, payload bytes) of a data frame


class FrameLog:
    """The bookkeeping of one connection, without the socket (unit-testable): `ready` when a
    frame is put (caller holds the outbox lock), `popped` when it is picked (same lock),
    `writing` just before it is written, `stamped(k, t)` when the bytes through offset k have
    left the host, `finish` at the end (frames never stamped get NaN times)."""

    def __init__(self, peer: int = 0, record: bool = True):
        """record: keep a row per data frame (tracing); without it only the host's queue is
        followed (`host_bytes`, for the outbox's bound), and a frame costs no clock reads
        and no search for the frame that blocks it."""
        self.peer = peer
        self.record = record
        self._left_end = 0                     # bytes that have left the host (a frame end)
        self._stack: deque[Frame] = deque()    # picked, maybe not left; orders strictly decreasing
        self._pending: deque[Frame] = deque()  # written, not stamped yet, in write order
        self._written = 0                      # bytes written (frame ends)
        self._prev_left = -math.inf            # t_last of the frame completed last
        self.stamps = 0                        # stamps that completed at least one frame
        self.unstamped = 0                     # data frames whose last byte never got a stamp
        self._cols = (array("I"), array("I"), array("I"), array("I"), array("I"),
                      array("d"), array("d"), array("d"), array("d"))

    @property
    def pending(self) -> int:
        return len(self._pending)

    def ready(self, order, now: float | None = None) -> Frame:
        if not self.record:   # the host's queue only: no times, no blockers (a frame's end is enough)
            return Frame(order, 0.0, None)
        now = time.time() if now is None else now
        st = self._stack
        while st and st[0].left is not None and st[0].left <= now:
            st.popleft()   # left before now: can delay nothing put from now on
        blocker = None
        for q in reversed(st):   # newest first; orders grow toward the oldest
            if q.order > order:
                blocker = q
                break
        return Frame(order, now, blocker)

    def popped(self, f: Frame, kind: Kind, key: int, chunk: int, it: int, priority: int, nbytes: int) -> None:
        self._written += HEADER.size + nbytes
        f.end = self._written
        if not self.record:
            self._pending.append(f)
            return
        if kind in DATA and nbytes:
            f.ident = (key, chunk, it, priority, nbytes)
        st = self._stack
        while st and not st[-1].order > f.order:
            st.pop()
        st.append(f)
        self._pending.append(f)

    def writing(self, f: Frame, now: float | None = None) -> None:
        if self.record:
            f.write_t = time.time() if now is None else now

    def skip(self, nbytes: int) -> None:
        """Bytes written outside the frames logged (the closing BYE)."""
        self._written += nbytes

    def stamped(self, offset: int, t: float) -> None:
        """Every byte through `offset` (mod 2**32, from the first byte logged) left at t."""
        pend, done = self._pending, False
        while pend and ((offset - (pend[0].end - 1)) & _U32) < _HALF:
            self._complete(pend.popleft(), t)
            done = True
        self.stamps += done

    def host_bytes(self) -> int:
        """Bytes written that have not left the host yet: the kernel's send queue and the
        host's qdisc together (as far as the stamps read so far tell)."""
        return self._written - self._left_end

    def _complete(self, f: Frame, t: float) -> None:
        f.left = t
        if not math.isnan(t):
            self._left_end = f.end
        if not self.record:
            return
        first, self._prev_left = max(f.write_t, self._prev_left), t
        if f.ident is not None and self.record:
            b = f.blocker
            if b is None:
                inv = 0.0
            elif b.left is None or math.isnan(b.left):
                inv = math.nan
            else:
                inv = max(0.0, b.left - f.ready)
            if math.isnan(t):
                self.unstamped += 1
            for col, v in zip(self._cols, (*f.ident, f.ready, first, t, inv)):
                col.append(v)
        f.blocker = None   # frees the chain of frames behind it

    def finish(self) -> None:
        """Frames still without a stamp are kept with NaN times."""
        while self._pending:
            self._complete(self._pending.popleft(), math.nan)
        self._stack.clear()

    def columns(self) -> dict[str, np.ndarray]:
        cols = {name: np.frombuffer(col.tobytes(), dtype=col.typecode)   # a copy made under the GIL
                for name, col in zip(COLUMNS[1:], self._cols)}
        return {"peer": np.full(len(cols["key"]), self.peer, np.uint32), **cols}


class TxStamps(FrameLog):
    """A FrameLog fed by the socket's transmit stamps (see the module docstring)."""

    IDLE_DRAIN_S = IDLE_DRAIN_S

    def __init__(self, sock: socket.socket, peer: int = 0, record: bool = True):
        """Raises OSError where the kernel lacks OPT_ID_TCP (before Linux 6.2): see `enable`."""
        super().__init__(peer, record)
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPING, FLAGS)
        self.sock = sock
        self._poll = select.poll()
        self._poll.register(sock, select.POLLOUT)
        self._err_poll = select.poll()
        self._err_poll.register(sock, 0)   # POLLERR, POLLHUP only

    @classmethod
    def enable(cls, sock: socket.socket, peer: int = 0, record: bool = True) -> TxStamps | None:
        """Stamps for `sock`, or None where this kernel cannot give them."""
        try:
            return cls(sock, peer, record)
        except OSError:
            return None

    def drain(self, most: int | None = None) -> int:
        """Read the stamps queued, `most` messages at most (never blocks); the number read. An
        epoll loop reads one per EPOLLERR (epoll reports it again while more wait), which
        spares the read that finds the queue empty."""
        n = 0
        while most is None or n < most:
            try:
                _, anc, _, _ = self.sock.recvmsg(0, 256, _ERRQ)
            except (BlockingIOError, InterruptedError):
                return n
            except OSError:
                return n   # closed: what was read is what there is
            n += 1
            t = key = None
            for level, typ, data in anc:
                if level == socket.SOL_SOCKET and typ == SO_TIMESTAMPING:
                    sec, nsec = _TS.unpack_from(data)
                    t = sec + nsec * 1e-9
                elif (level, typ) in _RECVERR:
                    _, _, _, _, _, info, key = _SEE.unpack_from(data)
                    if info != SCM_TSTAMP_SND:
                        key = None
            if t is not None and key is not None:
                self.stamped(key, t)
        return n

    def wait_writable(self, timeout_s: float) -> bool:
        """Connection.wait_writable for a stamped socket: whenever poll() reports POLLERR the
        stamps are read, and if it woke for them alone it waits on; a POLLERR with nothing
        to read is a real error, which the next send reports."""
        deadline = time.monotonic() + timeout_s
        while True:
            ev = self._poll.poll(max(0.0, deadline - time.monotonic()) * 1000)
            if not ev:
                return False
            events = ev[0][1]
            if events & select.POLLERR and not self.drain():
                return True
            if events & ~select.POLLERR:
                return True
            if time.monotonic() >= deadline:
                return False

    def wait_host_below(self, limit: int, timeout_s: float) -> bool:
        """Wait until at most `limit` bytes written have not left the host (reading stamps as
        they come), or timeout_s. False on timeout, or on a socket error (the next send
        reports it)."""
        self.drain()
        deadline = time.monotonic() + timeout_s
        while self.host_bytes() > limit:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            if self._err_poll.poll(left * 1000) and not self.drain():
                return False   # POLLERR with no stamp to read: a real error
        return True

    def close(self, timeout_s: float = CLOSE_WAIT_S) -> None:
        """Wait (at most timeout_s, and not at all if this socket never gave a stamp) for the
        stamps of the frames written, then `finish`."""
        deadline = time.monotonic() + timeout_s
        self.drain()
        while self._pending and self.stamps and time.monotonic() < deadline:
            self._err_poll.poll(max(0.0, min(0.05, deadline - time.monotonic())) * 1000)
            self.drain()
        self.finish()


def merge(logs: list[FrameLog]) -> dict[str, np.ndarray]:
    """One role's frames from all its connections, as columns (contracts/tx_frames.py)."""
    parts = [log.columns() for log in logs] or [FrameLog().columns()]
    return {name: np.concatenate([p[name] for p in parts]) for name in COLUMNS}


def save(path: str | os.PathLike, cols: dict[str, np.ndarray]) -> None:
    """A role's `<role><rank>.tx_frames.npz`, written atomically."""
    tmp = f"{os.fspath(path)}.tmp"
    with open(tmp, "wb") as f:
        np.savez(f, **{name: cols[name] for name in COLUMNS})
    os.replace(tmp, path)

