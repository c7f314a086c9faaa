"""Framed messages over TCP: one connection per peer pair, a priority outbox per connection.

A frame is a fixed 24-byte header and an optional payload (float32 gradients; UTF-8 text for
ABORT). Payloads are received with `recv_into` straight into their destination (a result
buffer slice or a pooled array), never through intermediate bytes objects.

Priority only works for bytes that have not been handed to the kernel yet. Left alone, Linux
lets a socket queue megabytes of unsent data (tcp_wmem autotuning), and a frame that becomes
urgent waits behind all of it. So every connection sets TCP_NOTSENT_LOWAT, and the outbox
thread picks the next frame from its heap only when poll() says the kernel wants more: a
frame queued later with a better order overtakes everything not yet picked, and waits
behind at most the frame being written plus the kernel's bounded queue.

The bound is kept in time, not bytes: about QUEUE_S of the rate at which the peer takes our
bytes (from TCP_INFO, see `Connection.retune`). A fixed byte bound is too large for slow
links (64 KiB is 21 ms at 25 Mb/s) or starves fast ones: the outbox thread competes for the
GIL and the CPU with training, and a small queue runs dry whenever the thread is late.
`bench/bench_transport_loopback.py` measures all of this.

A role that fails tells its peers why with an ABORT frame (best effort, bounded), so an
error at the far end names the peer that really died, not just the messenger.
"""
from __future__ import annotations

import fcntl
import heapq
import itertools
import select
import socket
import struct
import termios
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum
from typing import TYPE_CHECKING

import numpy as np

from contracts.role_spec import DEAD_PEER_S
from schedulers.core.base import CommError

if TYPE_CHECKING:
    from schedulers.transport.txstamps import TxStamps

# kind, flags, sender, key, chunk, iteration, priority, nbytes
HEADER = struct.Struct("!BBHIIIII")
_U64 = struct.Struct("=Q")
_ACKED_OFFSET = 120  # struct tcp_info: tcpi_bytes_acked (Linux 4.2+)
_APP_LIMITED = 1     # struct tcp_info byte 7: tcpi_delivery_rate_app_limited (Linux 4.9+)
_NOTSENT_OFFSET = 144  # struct tcp_info: tcpi_notsent_bytes (Linux 4.6+)
_U32 = struct.Struct("=I")
_RCV_MSS_OFFSET = 20   # struct tcp_info: tcpi_rcv_mss
_SEGS_IN_OFFSET = 152  # struct tcp_info: tcpi_data_segs_in (Linux 4.6+)

# The kernel's unsent bytes per socket are kept at about QUEUE_S of the delivery rate,
# within [MIN_LOWAT, MAX_LOWAT]; a connection starts at INITIAL_LOWAT (enough for 1 Gb/s, so
# a fast link is measured at its real rate) and is retuned every RETUNE_S while it sends.
QUEUE_S = 0.010
# Schedulers whose point is priority (the parameter-server family) keep a shorter queue: a frame
# that becomes urgent waits behind at most this much of the link (plus the frame being
# written and the host's qdisc), and bulk goodput stays at iperf3's (bench/bench_schedulers.py
# transport, 16 KiB frames at 100 and 1000 Mb/s) with replayed compute.
PRIORITY_QUEUE_S = 0.002
# ... and, where the kernel gives transmit stamps (schedulers/transport/txstamps.py), they also keep the
# bytes written that have not left the host (kernel queue plus the host's qdisc, which TCP fills
# up to its small-queue limit of two GSO packets) at HOST_QUEUE_S of the rate, MIN_HOST_QUEUE
# at least: an urgent frame then waits behind that and the frame being written, about two
# 16 KiB packets. A stamp that never comes holds the outbox HOST_WAIT_MAX_S at most.
HOST_QUEUE_S = 0.0005
MIN_HOST_QUEUE = 8 * 1024
HOST_WAIT_MAX_S = 0.05
MIN_LOWAT, INITIAL_LOWAT, MAX_LOWAT = 16 * 1024, 1024 * 1024, 4 * 1024 * 1024
RETUNE_S = 0.05
RATE_DECAY = 0.5 ** (RETUNE_S / 1.0)  # the rate estimate halves per second of lower samples
AUTO = "auto"
# A peer whose host vanished (no FIN, no RST) is declared dead after `dead_peer_s` without
# acknowledgements for data we sent (TCP_USER_TIMEOUT) or, when idle, keepalive probes: a third
# of it idle, then 10 probes over the rest. DEAD_PEER_S (contracts/role_spec.py) unless the
# role was told otherwise (set_dead_peer_s: its spec's, x k under time dilation).
_dead_peer_s = DEAD_PEER_S
KEEPALIVE_PROBES = 10
ABORT_LOCK_S = 1.0  # how long an ABORT waits for the frame being written to finish
# A send that fails means the peer is gone; its ABORT (why) or EOF is read by the receive
# thread within moments, and is the error worth keeping, so a send error waits this long.
SEND_ERROR_GRACE_S = 0.5
# tcpi_state where bytes we wrote may still wait for the peer's acknowledgement: ESTABLISHED,
# CLOSE_WAIT, and FIN_WAIT1, LAST_ACK, CLOSING, where our FIN is one of them (its sequence
# number counts in SIOCOUTQ). `Connection.close` asks every FLUSH_POLL_S when it flushes.
_OPEN = (1, 8, 4, 9, 11)
_FIN_UNACKED = (4, 9, 11)
FLUSH_POLL_S = 0.001
_I32 = struct.Struct("=i")


class Kind(IntEnum):
    HELLO = 1   # worker -> server: sender = rank, key = number of workers, chunk = Mode
    PUSH = 2    # gradient slice
    ACK = 3     # server -> worker: push received (PULL mode)
    PULL = 4    # worker -> server: send me the aggregate (PULL mode)
    RESULT = 5  # server -> worker: averaged slice
    BYE = 6     # orderly close: nothing more will come from this side
    ABORT = 7   # the sender failed; payload: why, as UTF-8 text
    PROBE = 8   # bandwidth probe (forest): key = round; the payload is filler
    CTRL = 9    # control message (forest re-planning); payload: JSON, as UTF-8 text


class Mode(IntEnum):
    """How a parameter server answers pushes; a worker's HELLO names the one it speaks."""

    PULL = 1       # ACK each push, send the aggregate when pulled (fifo, bytescheduler)
    QUEUED = 2     # receive-side priority queue, result sent unasked (p3)
    IMMEDIATE = 3  # aggregate on arrival, result sent unasked the moment it is complete (mercury)


@dataclass(frozen=True)
class Header:
    kind: Kind
    sender: int
    key: int
    chunk: int
    it: int
    priority: int
    nbytes: int


def set_dead_peer_s(seconds: float) -> None:
    """How long this process's connections from now on wait for a silent peer (a role's
    entry point sets its spec's `dead_peer_s` before its scheduler connects)."""
    global _dead_peer_s
    if not seconds > 0:
        raise ValueError(f"dead_peer_s must be > 0, not {seconds!r}")
    _dead_peer_s = float(seconds)


def dead_peer_s() -> float:
    """This process's dead-peer time, seconds (what set_dead_peer_s last set)."""
    return _dead_peer_s


def _configure(sock: socket.socket) -> None:
    idle = max(1, round(_dead_peer_s / 3))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, idle)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, max(1, round((_dead_peer_s - idle) / KEEPALIVE_PROBES)))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, KEEPALIVE_PROBES)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, round(_dead_peer_s * 1000))


class Connection:
    """One TCP connection to a named peer. Whole frames are written under a lock, so an
    ABORT from another thread never lands inside a frame."""

    def __init__(self, sock: socket.socket, peer: str, notsent_lowat: int | str | None = AUTO):
        """notsent_lowat: AUTO (time-based, see the module docstring), a fixed number of
        bytes, or None for the kernel's default (no bound; for comparison)."""
        self.sock = sock
        self.peer = peer
        _configure(sock)
        self.adaptive = notsent_lowat == AUTO
        self.queue_s = QUEUE_S  # the unsent queue's bound in time; the PS family sets PRIORITY_QUEUE_S
        self.lowat = INITIAL_LOWAT if self.adaptive else notsent_lowat
        if self.lowat:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NOTSENT_LOWAT, self.lowat)
        self._rate = 0.0      # rate estimate, bytes/s (see retune)
        self._acked, self._acked_at = 0, None
        self._send_lock = threading.Lock()
        self._head = bytearray(HEADER.size)  # received headers land here, never reallocated
        self._outq = bytearray(_I32.size)    # SIOCOUTQ's answer lands here
        self._poll = select.poll()
        self._poll.register(sock, select.POLLOUT)

    # ------------------------------------------------------------------ send
    def send(self, kind: Kind, key: int = 0, chunk: int = 0, it: int = 0,
             payload: np.ndarray | None = None, sender: int = 0, priority: int = 0) -> None:
        body = b"" if payload is None else memoryview(payload).cast("B")
        head = HEADER.pack(kind, 0, sender, key, chunk, it, priority, len(body))
        try:
            with self._send_lock:
                self._send_frame(head, body)
        except OSError as e:
            raise CommError(f"sending to {self.peer}: {e}") from None

    def _send_frame(self, head: bytes, body) -> None:
        # One sendmsg for header and payload: no copy, and no tiny header segment alone.
        sent = self.sock.sendmsg([head, body]) if len(body) else self.sock.send(head)
        if sent < len(head):
            self.sock.sendall(head[sent:])
            sent = len(head)
        if sent < len(head) + len(body):
            self.sock.sendall(body[sent - len(head):])

    def retune(self, backlogged: bool) -> None:
        """Set TCP_NOTSENT_LOWAT to ~QUEUE_S of the rate at which the peer acknowledges our
        bytes. A sample measures the link only if the outbox had frames waiting all along
        and the kernel still had unsent bytes (and did not flag its last sample
        app-limited); otherwise it measured us, and may raise the estimate but not lower it
        (else a sender starved of CPU would shrink its own queue and starve itself more).
        The estimate is a decaying maximum, so it follows a link that slows down within a
        second or two."""
        if not self.adaptive:
            return
        info = self.sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 232)
        if len(info) < _NOTSENT_OFFSET + 4:
            return  # very old kernel: keep the initial bound
        acked, now = _U64.unpack_from(info, _ACKED_OFFSET)[0], time.monotonic()
        if self._acked_at is not None and now > self._acked_at:
            sample = (acked - self._acked) / (now - self._acked_at)
            starved = info[7] & _APP_LIMITED or not _U32.unpack_from(info, _NOTSENT_OFFSET)[0]
            if backlogged and not starved:
                self._rate = max(sample, self._rate * RATE_DECAY)
            else:
                self._rate = max(sample, self._rate)
            lowat = min(MAX_LOWAT, max(MIN_LOWAT, int(self._rate * self.queue_s)))
            if abs(lowat - self.lowat) * 4 > self.lowat:
                self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NOTSENT_LOWAT, lowat)
                self.lowat = lowat
        self._acked, self._acked_at = acked, now

    def rate(self) -> float:
        """The delivery rate estimate of `retune`, bytes/s (0 before the first sample)."""
        return self._rate

    def _tcp_info(self) -> bytes:
        """TCP_INFO; a connection already closed (its peer failed, or the kernel gave up on
        it) is a CommError naming the peer, as a failed send is."""
        try:
            return self.sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 232)
        except OSError as e:
            raise CommError(f"reading the connection to {self.peer}: {e}") from None

    def bytes_acked(self) -> int | None:
        """Bytes of ours the peer has acknowledged so far (TCP_INFO), None where the kernel
        does not say: a sender's goodput measured by the receiver's own acknowledgements."""
        info = self._tcp_info()
        return _U64.unpack_from(info, _ACKED_OFFSET)[0] if len(info) >= _ACKED_OFFSET + 8 else None

    def bytes_arrived(self) -> int | None:
        """Bytes the peer's data segments brought us so far (TCP_INFO tcpi_data_segs_in, at
        the peer's MSS each; retransmissions included), counted as they arrive, in order or
        not: a link's throughput as its receiver sees it. The sender's count of what was
        acknowledged is no substitute over short intervals: it jumps by up to a congestion
        window when a hole is repaired, and lags by the queue the acknowledgements wait in on
        the way back. None where the kernel does not say."""
        info = self._tcp_info()
        if len(info) < _SEGS_IN_OFFSET + 4:
            return None
        return _U32.unpack_from(info, _SEGS_IN_OFFSET)[0] * _U32.unpack_from(info, _RCV_MSS_OFFSET)[0]

    def wait_writable(self, timeout_s: float) -> bool:
        """True once the kernel wants more bytes (unsent bytes below TCP_NOTSENT_LOWAT), or
        the socket has an error that the next send will report."""
        return bool(self._poll.poll(timeout_s * 1000))

    def abort(self, reason: str, sender: int = 0, deadline: float | None = None) -> None:
        """Tell the peer why we give up (`tell`), then close once the peer has it all
        (`close`'s flush); all by `deadline`, ABORT_LOCK_S from now by default. Never blocks
        for long."""
        deadline = time.monotonic() + ABORT_LOCK_S if deadline is None else deadline
        self.tell(reason, sender, deadline)
        self.close(flush_until=deadline)

    def tell(self, reason: str, sender: int, deadline: float) -> None:
        """Write an ABORT with `reason` after the frame being written, if that ends and the
        kernel takes the ABORT by `deadline`, then our FIN: nothing more comes from us."""
        text = reason.encode()[:4000]
        frame = memoryview(HEADER.pack(Kind.ABORT, 0, sender, 0, 0, 0, 0, len(text)) + text)
        if not self._send_lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
            return
        try:
            while frame:
                try:
                    frame = frame[self.sock.send(frame, socket.MSG_DONTWAIT):]
                except (BlockingIOError, InterruptedError):
                    pass
                if frame and not self._poll.poll(max(0.0, deadline - time.monotonic()) * 1000):
                    break
            self.sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        finally:
            self._send_lock.release()

    # ------------------------------------------------------------------ receive
    def recv_header(self) -> Header:
        self.recv_into(memoryview(self._head))
        kind, _flags, sender, key, chunk, it, priority, nbytes = HEADER.unpack(self._head)
        try:
            return Header(Kind(kind), sender, key, chunk, it, priority, nbytes)
        except ValueError:
            raise CommError(f"{self.peer}: bad frame kind {kind}") from None

    def recv_into(self, view: memoryview) -> None:
        view = view.cast("B") if view.format != "B" else view
        got, n = 0, len(view)
        while got < n:
            try:
                # MSG_WAITALL: one syscall per payload instead of one per segment; the loop
                # still covers signals and closes.
                r = self.sock.recv_into(view[got:], n - got, socket.MSG_WAITALL)
            except OSError as e:
                raise CommError(f"{self.peer}: {e}") from None
            if r == 0:
                raise CommError(f"{self.peer} closed the connection")
            got += r

    def recv_array(self, nbytes: int) -> np.ndarray:
        arr = np.empty(nbytes // 4, dtype=np.float32)
        self.recv_into(memoryview(arr))
        return arr

    def recv_text(self, nbytes: int) -> str:
        buf = bytearray(nbytes)
        self.recv_into(memoryview(buf))
        return buf.decode(errors="replace")

    def _unacked(self) -> int:
        """Bytes we wrote that the peer's kernel has not acknowledged (SIOCOUTQ), our FIN not
        counted (its acknowledgement may be delayed); 0 once the connection is gone."""
        state = self.sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0]
        if state not in _OPEN:
            return 0
        fcntl.ioctl(self.sock.fileno(), termios.TIOCOUTQ, self._outq)
        return _I32.unpack(self._outq)[0] - (state in _FIN_UNACKED)

    def close(self, flush_until: float | None = None) -> None:
        """Close, waking the threads blocked in recv or send. flush_until: after our FIN
        (`tell`), first wait until then at most for the peer's kernel to acknowledge every
        byte we wrote. A close with bytes of the peer's unread here resets the connection,
        and the reset discards what we had not sent yet: an ABORT queued behind a frame that
        the peer was slow to read would be lost, and the peer's error would name us."""
        if flush_until is not None:
            try:
                while self._unacked() and time.monotonic() < flush_until:
                    time.sleep(FLUSH_POLL_S)
            except OSError:
                pass
        try:
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes threads blocked in recv/send
        except OSError:
            pass
        self.sock.close()


_STOP = (float("inf"),)


class Outbox:
    """Frames for one connection, sent by one thread in `order` (lowest first; frames of
    equal order in the order they were put, so one constant order makes a FIFO queue).

    The thread waits until the kernel wants more bytes and only then pops the best frame:
    the choice is made as late as possible. `on_send(kind, key, chunk, it)` is called as a
    frame is handed to the socket (tracing); a frame's `on_sent()` once it has been written
    (its payload buffer may then be reused). `stamps` (tracing; schedulers/transport/txstamps.py) logs
    when each frame was put, picked, written and when its bytes left the host; its thread
    also reads the socket's stamps while it waits.

    `host_queue_s` (needs `stamps`): before picking a frame, also wait until the bytes written
    that have not left the host (the kernel's queue and the host's qdisc, which
    TCP_NOTSENT_LOWAT does not bound) are at most that much of the connection's rate, and at
    least MIN_HOST_QUEUE. An urgent frame then waits behind that and the frame being written.
    """

    def __init__(self, conn: Connection, on_error: Callable[[BaseException], None], sender: int = 0,
                 on_send: Callable[[Kind, int, int, int], None] | None = None, stamps: TxStamps | None = None,
                 host_queue_s: float | None = None):
        self.conn = conn
        self.sender = sender
        self._on_error = on_error
        self._on_send = on_send
        self._stamps = stamps
        self._host_queue_s = host_queue_s if stamps is not None else None
        self._heap: list = []
        self._seq = itertools.count()
        self._cv = threading.Condition()
        self._closed = False   # close() called: nothing more is accepted
        self._aborted = False  # abort() called: stop at once
        self._aborted_evt = threading.Event()
        self._went_idle = True  # the heap ran empty since the last retune
        self._thread = threading.Thread(target=self._run, name=f"send-{conn.peer}", daemon=True)
        self._thread.start()

    def put(self, order: tuple, kind: Kind, key: int = 0, chunk: int = 0, it: int = 0,
            payload: np.ndarray | None = None, priority: int = 0,
            on_sent: Callable[[], None] | None = None) -> None:
        self.put_many([(order, kind, key, chunk, it, payload, priority, on_sent)])

    def put_many(self, frames: list[tuple]) -> None:
        """frames: (order, kind, key, chunk, it, payload, priority, on_sent) tuples, queued
        under one lock acquisition (a gradient cut into many packets)."""
        with self._cv:
            if self._closed or self._aborted:
                return  # the peer said BYE or is gone: nothing of this can matter to it
            if self._stamps is None:
                for order, *frame in frames:
                    heapq.heappush(self._heap, (order, next(self._seq), frame))
            else:
                for order, *frame in frames:
                    frame.append(self._stamps.ready(order))
                    heapq.heappush(self._heap, (order, next(self._seq), frame))
            self._cv.notify()

    def _run(self) -> None:
        retuned = 0.0
        try:
            while True:
                with self._cv:
                    while not self._heap and not self._aborted:
                        self._went_idle = True
                        if self._stamps is not None and self._stamps.pending:
                            self._cv.wait(self._stamps.IDLE_DRAIN_S)  # stamps to come: read them
                            self._stamps.drain()
                        else:
                            self._cv.wait()
                if self._aborted:
                    return
                now = time.monotonic()
                if now - retuned >= RETUNE_S:
                    self.conn.retune(backlogged=not self._went_idle)
                    retuned, self._went_idle = now, False
                while not (self.conn.wait_writable(0.2) if self._stamps is None else self._stamps.wait_writable(0.2)):
                    if self._aborted:
                        return
                if self._host_queue_s is not None:
                    limit = max(MIN_HOST_QUEUE, int(self.conn.rate() * self._host_queue_s))
                    self._stamps.wait_host_below(limit, HOST_WAIT_MAX_S)
                with self._cv:
                    if self._aborted or not self._heap:
                        continue
                    order, _, frame = heapq.heappop(self._heap)
                    stamp = None
                    if self._stamps is not None and order != _STOP:
                        stamp = frame.pop()
                        self._stamps.popped(stamp, frame[0], frame[1], frame[2], frame[3], frame[5],
                                            0 if frame[4] is None else frame[4].nbytes)
                if order == _STOP:
                    self.conn.send(Kind.BYE, sender=self.sender)
                    if self._stamps is not None:
                        self._stamps.skip(HEADER.size)
                        self._stamps.close()
                    return
                kind, key, chunk, it, payload, priority, on_sent = frame
                if self._on_send is not None:
                    self._on_send(kind, key, chunk, it)
                if stamp is not None:
                    self._stamps.writing(stamp)
                self.conn.send(kind, key, chunk, it, payload, sender=self.sender, priority=priority)
                if on_sent is not None:
                    on_sent()
        except BaseException as e:  # noqa: BLE001 - reported to the owner, who fails loudly
            if not self._aborted_evt.wait(SEND_ERROR_GRACE_S):
                self._on_error(e)

    def drop(self, kind: Kind) -> int:
        """Forget the queued frames of `kind` (not the one being written); how many there were."""
        with self._cv:
            kept = [e for e in self._heap if e[0] == _STOP or e[2][0] != kind]
            dropped = len(self._heap) - len(kept)
            if dropped:
                heapq.heapify(kept)
                self._heap = kept
            return dropped

    def close(self, timeout: float = 30.0) -> None:
        """Send what is queued and a BYE, then stop the thread."""
        with self._cv:
            if not self._closed and not self._aborted:
                heapq.heappush(self._heap, (_STOP, next(self._seq), None))
                self._closed = True
                self._cv.notify()
        self._thread.join(timeout)

    def abort(self, reason: str) -> None:
        """Drop what is queued, tell the peer `reason`, close the connection."""
        with self._cv:
            self._aborted = True
            self._aborted_evt.set()
            self._heap.clear()
            self._cv.notify()
        self.conn.abort(reason, self.sender)


SO_MAX_PACING_RATE = getattr(socket, "SO_MAX_PACING_RATE", 47)
UNPACED = 0xFFFFFFFF   # SO_MAX_PACING_RATE's "no cap"


def pace(sock: socket.socket, bytes_per_s: int | None) -> None:
    """Cap the socket's sending rate, bytes/s (None: no cap). This turns on TCP's own pacing
    under any congestion control, no fq qdisc needed; the kernel paces whole segments,
    headers included."""
    rate = UNPACED if bytes_per_s is None else max(1, min(int(bytes_per_s), UNPACED - 1))
    sock.setsockopt(socket.SOL_SOCKET, SO_MAX_PACING_RATE, _U32.pack(rate))   # a u32: over a C int


MIN_CHUNK_NUMEL = 4096  # 16 KiB of float32: below this, per-frame Python costs dominate


def stream_chunk_numel(numel: int, parts: int, largest: int) -> int:
    """Floats per chunk when `numel` floats go out as at least `parts` chunks, none under
    MIN_CHUNK_NUMEL (unless `largest` is smaller) and none over `largest`. A hop then
    forwards a stream as it arrives rather than a whole block in one burst: a burst into a
    slow link grows TCP's window until the queue drops, and a drop at a burst's tail waits
    for a retransmission timeout."""
    return min(largest, max(MIN_CHUNK_NUMEL, -(-numel // parts)))


def abort_all(outboxes: list[Outbox], reason: str) -> None:
    """Abort several connections at once, so the time this takes stays ABORT_LOCK_S however
    many peers are in the middle of a long frame."""
    threads = [threading.Thread(target=ob.abort, args=(reason,), daemon=True) for ob in outboxes]
    for th in threads:
        th.start()
    for th in threads:
        th.join(ABORT_LOCK_S + 1)


def listen(ip: str, port: int, backlog: int = 64) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((ip, port))
    s.listen(backlog)
    return s


def connect(ip: str, port: int, peer: str, timeout_s: float) -> Connection:
    """Connect, retrying while the peer is not listening yet (roles start in any order)."""
    deadline = time.monotonic() + timeout_s
    delay = 0.05
    while True:
        try:
            sock = socket.create_connection((ip, port), timeout=5)
            sock.settimeout(None)
            return Connection(sock, peer)
        except OSError as e:
            if time.monotonic() > deadline:
                raise CommError(f"cannot connect to {peer} at {ip}:{port} within {timeout_s:.0f} s: {e}") from None
            time.sleep(delay)
            delay = min(delay * 2, 0.5)
