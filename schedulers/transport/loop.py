"""Many connections served by one thread: frames in and out over non-blocking sockets.

A process that gives every connection a receive thread and a send thread (`Outbox`) spends
much of its CPU handing the GIL from thread to thread: the parameter server at 4 mercury
workers made about 50 futex calls per frame it moved (strace). One thread that waits in
epoll on every socket never hands the GIL to anyone, and reads a frame's payload together
with the header of the frame behind it (one recvmsg for both).

Each connection is a `Peer`: a receive state (a header, then its payload straight into the
buffer the handler names, as `Connection.recv_into` does) and a priority outbox with
`Outbox`'s rules, which this module keeps:

- a frame is picked only when the kernel wants more bytes (EPOLLOUT: the unsent bytes are
  below TCP_NOTSENT_LOWAT, retuned from the delivery rate every RETUNE_S while it sends),
  so a frame queued later with a better order overtakes everything not yet picked;
- with transmit stamps (`host_queue_s`), also only when the bytes written that have not
  left the host are below host_queue_s of the rate (MIN_HOST_QUEUE at least), waiting
  HOST_WAIT_MAX_S at most. The stamps come back on the socket's error queue, which epoll
  reports as EPOLLERR: the loop reads them whenever they come;
- frames of equal order go in the order they were put; `on_sent()` once a frame is
  written; a closing peer sends what is queued, then BYE.

Only the loop's thread calls a Peer's methods and the handler's (`Handler`), but
`Peer.put_many`: a handler runs on it, between two waits. Another thread hands work to the
loop with `call_soon` (a queue and an eventfd that wakes the wait), or queues frames with
`put_many`, which compete for the next pick at once (a worker's training thread pushing a
gradient's packets: a packet of a layer that becomes ready waits behind at most the one
being written, however busy the loop is).

A `Delay` (a modelled per-message start-up cost, schedulers/ps/client.py) may hold a picked
frame for a while before it is written; nothing else goes out on that connection meanwhile,
and the loop goes on serving the others.
"""
from __future__ import annotations

import heapq
import itertools
import os
import select
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Protocol

import numpy as np

from schedulers.core.base import CommError
from schedulers.transport.connection import (
    ABORT_LOCK_S,
    HEADER,
    HOST_WAIT_MAX_S,
    MIN_HOST_QUEUE,
    RETUNE_S,
    Connection,
    Header,
    Kind,
)
from schedulers.transport.txstamps import TxStamps

MAX_ABORT_TEXT = 1 << 20   # an ABORT's reason longer than this is a protocol error
FRAMES_PER_READ = 64       # frames read from one peer before the loop looks at the others
POLL_MAX_S = 0.05          # the longest wait: done() is asked at least this often
_STOP = (float("inf"),)
_IN, _OUT = select.EPOLLIN | select.EPOLLRDHUP, select.EPOLLOUT
_KINDS = {k.value: k for k in Kind}


class PeerError(CommError):
    """A CommError that names the peer (its `rank`) whose connection failed."""

    def __init__(self, message: str, rank: int):
        super().__init__(message)
        self.rank = rank


class Handler(Protocol):
    def payload_buffer(self, peer: Peer, h: Header) -> np.ndarray | bytearray:
        """Where the payload of frame `h` goes (its nbytes > 0): raise CommError to refuse it."""

    def on_frame(self, peer: Peer, h: Header, payload: np.ndarray | bytearray | None) -> None:
        """A whole frame (not ABORT, which the loop raises as the peer's error)."""


class Delay(Protocol):
    def due(self, kind: Kind, key: int, chunk: int, it: int) -> float:
        """A frame was picked: seconds to hold it before it is written (0: none)."""

    def waited(self, seconds: float) -> None:
        """It was held that long (at least what `due` said: the loop wakes late, never early)."""


class Peer:
    """One connection in the loop: its receive state and its outbox. `on_send(kind, key,
    chunk, it)` is called as a frame's first byte is handed to the socket (tracing)."""

    def __init__(self, loop: Loop, conn: Connection, rank: int, sender: int, stamps: TxStamps | None,
                 host_queue_s: float | None, on_send: Callable[[Kind, int, int, int], None] | None,
                 delay: Delay | None = None):
        self.loop, self.conn, self.sock, self.rank, self.sender = loop, conn, conn.sock, rank, sender
        self.stamps = stamps
        self.host_queue_s = host_queue_s if stamps is not None else None
        self.on_send = on_send
        self.delay = delay
        self.fd = conn.sock.fileno()
        # receive
        self._head = bytearray(HEADER.size)
        self._head_mv = memoryview(self._head)
        self._hgot = 0
        self._h: Header | None = None
        self._obj = None
        self._dest: memoryview | None = None
        self._dgot = 0
        self.bye_received = False
        # send
        self._heap: list = []
        self._seq = itertools.count()
        self._lock = threading.Lock()   # the heap and the stamps' bookkeeping: put_many comes from any thread
        self._cur: list[memoryview] | None = None     # what is left of the frame being written
        self._cur_sent: Callable[[], None] | None = None
        self._cur_frame: tuple | None = None          # (kind, key, chunk, it, stamp) until its first write
        self._held_from = 0.0
        self.held_until: float | None = None          # a Delay holds the picked frame until then
        self._closing = False      # close(): nothing more is accepted, BYE after what is queued
        self.bye_sent = False
        self._went_idle = True
        self._retuned = 0.0
        self._host_blocked = False                 # waiting for the host's queue to drain ...
        self._host_deadline: float | None = None   # ... until this instant at most
        self._host_lim = MIN_HOST_QUEUE            # the host's queue bound, bytes (from the rate, at each retune)
        self._lowat_follows = False                # a host queue under its bound implies EPOLLOUT (see _retuned_to)
        self.hold: int | None = None               # tests: picks allowed (None: no hold)
        self._mask = _IN
        self._wpoll = select.poll()
        self._wpoll.register(self.fd, select.POLLOUT)

    # ------------------------------------------------------------------ send
    def put(self, order: tuple, kind: Kind, key: int = 0, chunk: int = 0, it: int = 0,
            payload: np.ndarray | None = None, priority: int = 0,
            on_sent: Callable[[], None] | None = None) -> None:
        """On the loop's thread: queue one frame."""
        with self._lock:
            self._push(order, [kind, key, chunk, it, payload, priority, on_sent])
        self._update()

    def put_many(self, frames: list[tuple]) -> None:
        """From any thread: queue (order, kind, key, chunk, it, payload, priority, on_sent)
        frames at once (a gradient cut into packets). They compete for the next pick as soon
        as this returns; the loop is woken to ask epoll for EPOLLOUT if it was not."""
        with self._lock:
            for order, *frame in frames:
                self._push(order, frame)
        if self.loop.on_loop_thread():
            self._update()
        else:
            self.loop.call_soon(self._update)

    def _push(self, order: tuple, frame: list) -> None:
        """Caller holds self._lock (the stamps' bookkeeping of `ready` and `popped` too)."""
        if self._closing:
            return   # the peer said BYE: nothing of this can matter to it
        if self.stamps is not None:
            frame.append(self.stamps.ready(order))
        heapq.heappush(self._heap, (order, next(self._seq), frame))

    def queued(self) -> int:
        return len(self._heap)

    def close(self) -> None:
        """Send what is queued, then BYE."""
        with self._lock:
            if self._closing:
                return
            heapq.heappush(self._heap, (_STOP, next(self._seq), None))
            self._closing = True
        self._update()

    def _update(self) -> None:
        """Ask epoll for EPOLLOUT exactly while there is something we may write now."""
        if self.held_until is not None:
            want = False
        else:
            want = self._cur is not None or (bool(self._heap) and not self._host_blocked and self.hold != 0)
        mask = _IN | _OUT if want else _IN
        if mask != self._mask:
            self._mask = mask
            self.loop.modify(self, mask)

    def writable(self) -> None:
        """EPOLLOUT: the kernel wants more bytes."""
        self._send()
        self._update()

    def _send(self) -> None:
        """Write the frame being written, or pick one and write it; then, if another waits
        and the host's queue is over its bound, wait for stamps from now on (no EPOLLOUT
        round only to find that out)."""
        if self._cur is None and not self._pick():
            return
        if self.held_until is None:
            self._write()
        if self._cur is None and self._heap and self.host_queue_s is not None:
            self._host_full(time.monotonic())

    def hold_over(self, now: float) -> None:
        """The Delay's hold of the picked frame is over: write it."""
        if self.held_until is not None and now >= self.held_until:
            self.held_until = None
            self.loop.timed.discard(self)
            self.delay.waited(now - self._held_from)
            self._write()
            self._update()

    def _pick(self) -> bool:
        """Take the best frame, as Outbox does, if it may go now; False if none may."""
        if not self._heap:
            self._went_idle = True
            return False
        if self.hold == 0:
            return False
        now = time.monotonic()
        if now - self._retuned >= RETUNE_S:
            self.conn.retune(backlogged=not self._went_idle)
            self._retuned, self._went_idle = now, False
            self._retuned_to()
        # The stamps are read as epoll reports them (EPOLLERR, `stamps_came`), not here: one
        # that came since is seen in the next round.
        if self.host_queue_s is not None and self._heap[0][0] != _STOP and self._host_full(now):
            return False
        self._host_blocked, self._host_deadline = False, None
        self.loop.timed.discard(self)
        if self.hold is not None:
            self.hold -= 1
        with self._lock:
            order, _, frame = heapq.heappop(self._heap)
            if order != _STOP and self.stamps is not None:
                self.stamps.popped(frame[7], frame[0], frame[1], frame[2], frame[3], frame[5],
                                   0 if frame[4] is None else frame[4].nbytes)
        if order == _STOP:
            self._cur, self._cur_sent = [memoryview(HEADER.pack(Kind.BYE, 0, self.sender, 0, 0, 0, 0, 0))], self._bye
            if self.stamps is not None:
                self.stamps.skip(HEADER.size)
            return True
        kind, key, chunk, it, payload, priority, on_sent = frame[:7]
        body = None if payload is None else memoryview(payload).cast("B")
        nbytes = 0 if body is None else len(body)
        stamp = frame[7] if self.stamps is not None else None
        head = memoryview(HEADER.pack(kind, 0, self.sender, key, chunk, it, priority, nbytes))
        self._cur, self._cur_sent = ([head, body] if nbytes else [head]), on_sent
        self._cur_frame = (kind, key, chunk, it, stamp)
        if self.delay is not None:
            hold = self.delay.due(kind, key, chunk, it)
            if hold > 0:
                self._held_from, self.held_until = now, now + hold
                self.loop.timed.add(self)
        return True

    def _host_full(self, now: float) -> bool:
        """Whether the bytes written that have not left the host are over the bound, and the
        wait for them (HOST_WAIT_MAX_S from when it began) is not over: then blocked."""
        if self.stamps.host_bytes() <= self._host_lim:
            return False
        if self._host_deadline is None:
            self._host_deadline = now + HOST_WAIT_MAX_S
        if now >= self._host_deadline:
            return False
        self._host_blocked = True
        self.loop.timed.add(self)
        return True

    def _retuned_to(self) -> None:
        """After a retune: the host's queue bound from the new rate, and whether it is below
        TCP_NOTSENT_LOWAT. Then a host queue under its bound means the kernel wants bytes
        (its unsent bytes are part of that queue: every byte stamped as gone was sent), so
        `stamps_came` needs no poll to find out. At worst the kernel's send buffer is full
        and the write takes less, or none, and EPOLLOUT says when to go on."""
        if self.host_queue_s is not None:
            self._host_lim = max(MIN_HOST_QUEUE, int(self.conn.rate() * self.host_queue_s))
        lowat = self.conn.lowat
        self._lowat_follows = bool(lowat) and self._host_lim < lowat

    def _write(self) -> None:
        if self._cur_frame is not None:   # the frame's first byte goes to the socket now
            kind, key, chunk, it, stamp = self._cur_frame
            self._cur_frame = None
            if stamp is not None:
                self.stamps.writing(stamp)
            if self.on_send is not None:
                self.on_send(kind, key, chunk, it)
        bufs = self._cur
        try:
            n = self.sock.sendmsg(bufs)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as e:
            self._send_failed(e)
        while n and bufs:
            if n >= len(bufs[0]):
                n -= len(bufs[0])
                bufs.pop(0)
            else:
                bufs[0] = bufs[0][n:]
                n = 0
        if not bufs:
            done, self._cur, self._cur_sent = self._cur_sent, None, None
            if done is not None:
                done()

    def _kernel_wants(self) -> bool:
        """Whether the kernel wants more bytes now (what EPOLLOUT says: unsent bytes under
        TCP_NOTSENT_LOWAT), asked with a poll() of this socket alone."""
        ev = self._wpoll.poll(0)
        return bool(ev) and bool(ev[0][1] & select.POLLOUT)

    def _bye(self) -> None:
        self.bye_sent = True

    def _send_failed(self, e: OSError) -> None:
        """A send that fails means the peer is gone: what it sent before (an ABORT, its
        reason) is the error worth raising, if it is here to read."""
        try:
            self.readable(FRAMES_PER_READ)
        except CommError:
            raise
        except Exception:  # noqa: BLE001 - the send error below is the one to report
            pass
        raise PeerError(f"sending to {self.conn.peer}: {e}", self.rank) from None

    def stamps_came(self) -> None:
        """EPOLLERR: read the transmit stamps; with none to read, the socket has an error."""
        if self.stamps is not None and self.stamps.drain(most=1):
            if self._host_blocked and self.stamps.host_bytes() <= self._host_lim:
                self._host_blocked, self._host_deadline = False, None
                self.loop.timed.discard(self)
                if (self._cur is None and self.held_until is None and self.hold != 0
                        and (self._lowat_follows or self._kernel_wants())):
                    self._send()   # the next frame now, not after a round that asks epoll for EPOLLOUT
                self._update()
            return
        err = self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if err:
            self.readable(FRAMES_PER_READ)   # an ABORT already here names the cause better
            raise PeerError(f"{self.conn.peer}: {os.strerror(err)}", self.rank)

    def host_wait_over(self, now: float) -> None:
        """The wait for the host's queue is over: the next pick goes even above the bound."""
        if self._host_blocked and now >= self._host_deadline:
            self._host_blocked = False
            self.loop.timed.discard(self)
            self._update()

    def tell(self, reason: str, deadline: float) -> None:
        """Drop what is queued, finish the frame being written if that can be done by
        `deadline`, then send the ABORT with `reason` and our FIN (Connection.tell); the
        caller closes (`abort_peers`)."""
        with self._lock:
            self._heap.clear()
            self._closing = True
        if self.held_until is not None:   # a held frame was never begun: drop it
            self.held_until, self._cur = None, None
            self.loop.timed.discard(self)
        try:
            if self._cur:
                self.sock.settimeout(max(0.01, deadline - time.monotonic()))
                for b in self._cur:
                    self.sock.sendall(b)
                self._cur = None
            self.sock.setblocking(False)
        except OSError:
            return
        self.conn.tell(reason, self.sender, deadline)

    # ------------------------------------------------------------------ receive
    def readable(self, budget: int = FRAMES_PER_READ) -> None:
        """Read what the socket holds (up to `budget` frames), handing each whole frame on."""
        handler = self.loop.handler
        while budget > 0:
            if self._h is None:
                if self._hgot < HEADER.size:
                    n = self._recv(self._head_mv[self._hgot:])
                    if n is None:
                        return
                    self._hgot += n
                    if self._hgot < HEADER.size:
                        return
                h = self._parse()
                self._hgot = 0
                if not h.nbytes:
                    budget -= 1
                    self._deliver(handler, h, None)
                    continue
                self._h = h
                self._obj = self._abort_text(h) if h.kind == Kind.ABORT else handler.payload_buffer(self, h)
                self._dest, self._dgot = memoryview(self._obj).cast("B"), 0
                if len(self._dest) != h.nbytes:
                    raise PeerError(f"{self.conn.peer}: a {h.nbytes}-byte payload does not fit its "
                                    f"{len(self._dest)}-byte buffer", self.rank)
            want = len(self._dest) - self._dgot
            try:
                n = self.sock.recvmsg_into([self._dest[self._dgot:], self._head_mv])[0]
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                raise PeerError(f"{self.conn.peer}: {e}", self.rank) from None
            if n == 0:
                raise PeerError(f"{self.conn.peer} closed the connection", self.rank)
            if n < want:
                self._dgot += n
                return
            self._hgot = n - want
            h, obj = self._h, self._obj
            self._h = self._obj = self._dest = None
            budget -= 1
            self._deliver(handler, h, obj)
            if self._hgot < HEADER.size and n < want + HEADER.size:
                return   # the socket held no more than this: epoll says when more comes (no EAGAIN read)

    def _recv(self, view: memoryview) -> int | None:
        try:
            n = self.sock.recv_into(view)
        except (BlockingIOError, InterruptedError):
            return None
        except OSError as e:
            raise PeerError(f"{self.conn.peer}: {e}", self.rank) from None
        if n == 0:
            if self.bye_received and not self._hgot:
                self.loop.forget(self)   # it said BYE and closed: nothing more comes
                return None
            raise PeerError(f"{self.conn.peer} closed the connection", self.rank)
        return n

    def _parse(self) -> Header:
        kind, _flags, sender, key, chunk, it, priority, nbytes = HEADER.unpack(self._head)
        k = _KINDS.get(kind)
        if k is None:
            raise PeerError(f"{self.conn.peer}: bad frame kind {kind}", self.rank)
        return Header(k, sender, key, chunk, it, priority, nbytes)

    def _abort_text(self, h: Header) -> bytearray:
        if h.nbytes > MAX_ABORT_TEXT:
            raise PeerError(f"{self.conn.peer} sent a {h.nbytes}-byte ABORT", self.rank)
        return bytearray(h.nbytes)

    def _deliver(self, handler: Handler, h: Header, payload) -> None:
        if h.kind == Kind.ABORT:
            raise PeerError(f"{self.conn.peer} reports: {payload.decode(errors='replace') if payload else ''}",
                            self.rank)
        if h.kind == Kind.BYE:
            self.bye_received = True
        try:
            handler.on_frame(self, h, payload)
        except PeerError:
            raise
        except CommError as e:
            raise PeerError(str(e), self.rank) from None


class Loop:
    """The epoll loop over every Peer; `run` returns when `done()` holds after a round, and
    raises the first error (a PeerError where a peer's connection failed)."""

    def __init__(self, handler: Handler):
        self.handler = handler
        self._ep = select.epoll()
        self.peers: dict[int, Peer] = {}     # fd -> Peer
        self.after_round: Callable[[], None] | None = None   # called after each round of events
        self.timed: set[Peer] = set()        # peers waiting for a time: the host's queue, a Delay
        self._calls: deque = deque()
        self._thread: int | None = None      # the ident of the thread in run()
        self._wake_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._ep.register(self._wake_fd, select.EPOLLIN)

    def call_soon(self, fn: Callable, *args) -> None:
        """From any thread: run fn(*args) on the loop's thread, in order, at its next round."""
        self._calls.append((fn, args))
        self.wake()

    def on_loop_thread(self) -> bool:
        return threading.get_ident() == self._thread

    def wake(self) -> None:
        """From any thread: end the loop's current wait (its after_round hook runs)."""
        os.eventfd_write(self._wake_fd, 1)

    def _run_calls(self) -> None:
        try:
            os.eventfd_read(self._wake_fd)
        except BlockingIOError:
            pass
        while self._calls:
            fn, args = self._calls.popleft()
            fn(*args)

    def add(self, conn: Connection, rank: int, sender: int = 0, stamps: TxStamps | None = None,
            host_queue_s: float | None = None, on_send: Callable[[Kind, int, int, int], None] | None = None,
            delay: Delay | None = None) -> Peer:
        conn.sock.setblocking(False)
        peer = Peer(self, conn, rank, sender, stamps, host_queue_s, on_send, delay)
        self.peers[peer.fd] = peer
        self._ep.register(peer.fd, peer._mask)
        return peer

    def modify(self, peer: Peer, mask: int) -> None:
        if peer.fd in self.peers:
            self._ep.modify(peer.fd, mask)

    def forget(self, peer: Peer) -> None:
        if self.peers.pop(peer.fd, None) is not None:
            try:
                self._ep.unregister(peer.fd)
            except OSError:
                pass

    def run(self, done: Callable[[], bool]) -> None:
        self._thread = threading.get_ident()
        while not done():
            timeout, first = POLL_MAX_S, None
            if self.timed:
                first = min(p.held_until if p.held_until is not None else p._host_deadline for p in self.timed)
                timeout = min(timeout, max(0.0, first - time.monotonic()))
            try:
                events = self._ep.poll(timeout)
            except InterruptedError:
                continue
            for fd, ev in events:
                peer = self.peers.get(fd)
                if peer is None:
                    if fd == self._wake_fd:
                        self._run_calls()
                    continue
                if ev & select.EPOLLERR:
                    peer.stamps_came()
                if ev & (select.EPOLLIN | select.EPOLLHUP | select.EPOLLRDHUP):
                    peer.readable()
                if ev & select.EPOLLOUT and fd in self.peers:
                    peer.writable()
            if self.after_round is not None:
                self.after_round()
            now = time.monotonic() if first is not None and self.timed else None
            if now is not None and now >= first:
                # Only then can a wait be over (one added during this round ends later; the
                # next wait's timeout covers it).
                for peer in list(self.timed):
                    if peer.held_until is not None:
                        peer.hold_over(now)
                    else:
                        peer.host_wait_over(now)

    def close(self) -> None:
        self._ep.close()
        os.close(self._wake_fd)


def abort_peers(peers: list[Peer], reason: str) -> None:
    """Tell every peer why we stop, within ABORT_LOCK_S in all: every ABORT first, then
    each connection closed once its peer has it (one slow peer holds up no other's ABORT)."""
    deadline = time.monotonic() + ABORT_LOCK_S
    for p in peers:
        p.tell(reason, deadline)
    for p in peers:
        p.conn.close(flush_until=deadline)


