"""Worker side of the parameter-server family.

`PSBase` holds what every member shares: one connection and one priority outbox per server,
all served by one I/O thread (schedulers/transport/loop.py: no GIL handed between threads
per frame), a HELLO that names the server mode the scheduler speaks, `wait`, `close`, and
failure handling (the first error is kept, every server is told why, and `wait` raises it).
The training thread hands its pushes to the I/O thread (`Loop.call_soon`, `Loop.wake`) and
waits for results on the scheduler's condition. Two protocols build on it:

- `PSScheduler` (push, ACK, pull). A gradient is cut into partitions (`CommTask`, after
  ByteScheduler's ByteTask). Each waits in a priority queue until the credit window has
  room, is pushed, holds its credit until its server ACKs, and is then pulled; the RESULT
  lands straight in the output buffer. A subclass chooses the partition size, the credit
  window and the priority order (`fifo`, `bytescheduler`).

- `PushScheduler` (push, result comes back unasked): every slice goes straight into its
  server's outbox, ordered by (iteration, layer priority, slice), and the server returns
  the average of each slice as soon as every worker's copy is in. A subclass chooses the
  slice size and which server gets which slice (`p3`, `mercury`).

Every member's params derive from `PSParams`, whose `startup_us` models a per-message
start-up cost (the Mercury paper's "startup time slot inserted before every tensor
partition"). A message is one communication request of the scheduler: each PUSH and each
PULL of `PSScheduler` (a whole tensor for fifo, a partition for bytescheduler), and for a
`PushScheduler` whatever its `starts_message` hook says (each slice for p3; for mercury
only a tensor's first packet on each server connection, its other packets being segments
of the same stream). Each server connection holds a frame that starts a message that long
after picking it and before writing it (`StartupCost`, a `loop.Delay`). Nothing else goes
out on that connection meanwhile, so the cost serialises per connection as a real
per-message cost does; connections to different servers pay theirs in parallel. It is a
timer in the I/O loop, not a busy wait, so it costs no CPU that training could use. The
servers' ACKs and RESULTs pay nothing. Default 0: only what this transport and Python really
cost per message.
"""
from __future__ import annotations

import abc
import heapq
import itertools
import threading
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
from pydantic import Field, model_serializer

from contracts.tx_frames import summary
from schedulers.api import CommError, RoleContext, Scheduler, SchedulerParams, TensorSpec
from schedulers.core.failure import Failure
from schedulers.transport.connection import (
    HOST_QUEUE_S,
    PRIORITY_QUEUE_S,
    Connection,
    Header,
    Kind,
    Mode,
    pace,
)
from schedulers.transport.loop import Loop, Peer, abort_peers
from schedulers.transport.peers import Hello, dial
from schedulers.transport.txstamps import TxStamps, merge


def assign_servers(slots: list[tuple[int, int, int]], num_servers: int) -> dict[tuple[int, int], int]:
    """Spread (key, chunk, numel) slots over servers, balanced by bytes: largest first, to the
    least loaded server. Deterministic, so every worker computes the same map."""
    load = [0] * num_servers
    out: dict[tuple[int, int], int] = {}
    for key, chunk, numel in sorted(slots, key=lambda s: (-s[2], s[0], s[1])):
        s = min(range(num_servers), key=lambda i: (load[i], i))
        out[(key, chunk)] = s
        load[s] += numel
    return out


def chunk_sizes(numel: int, step: int | None) -> list[int]:
    """Sizes of the slices of a `numel`-element tensor cut every `step` (None: whole)."""
    step = step or max(numel, 1)
    return [min(step, numel - off) for off in range(0, max(numel, 1), step)]


class PSParams(SchedulerParams):
    """What every member of the parameter-server family accepts. `startup_us` is left out of
    the dump while it is 0, so the resolved configs, and the run ids hashed from them, of
    runs made before it existed do not change (a sweep still resumes)."""

    startup_us: float = Field(
        default=0.0, ge=0, le=1_000_000, allow_inf_nan=False,
        description="start-up cost per message, microseconds: the worker's connection holds each PUSH and "
                    "PULL frame that starts a message this long before writing it (0: only the transport's "
                    "real cost)")
    pace_to_share: bool = Field(
        default=False,
        description="pace the worker's connection to each server at the share of that server's link the "
                    "server measures and sends once packets are dropped before it (incast; "
                    "schedulers/ps/share.py); the baselines as their authors deploy them do not")

    @model_serializer(mode="wrap")
    def _without_zero_startup(self, handler):
        """startup_us at 0 and pace_to_share at the class's default are left out of the dump,
        so the run ids of configs that do not set them stay as they were."""
        d = handler(self)
        if not self.startup_us:
            d.pop("startup_us", None)
        if self.pace_to_share == type(self).model_fields["pace_to_share"].default:
            d.pop("pace_to_share", None)
        return d


class StartupCost:
    """The modelled start-up cost of one connection's messages (a `loop.Delay`).

    `due` holds a frame that starts a message for `seconds` less whatever the previous holds
    overshot (the loop wakes up late, never early), so after n messages `waited_s` is at
    least n x seconds and exceeds it by at most one wake-up's lateness: small costs are not
    inflated by the timer's granularity.
    """

    def __init__(self, seconds: float, starts_message=lambda kind, key, chunk: True):
        self.seconds = seconds
        self.messages = 0
        self.waited_s = 0.0
        self._owed = 0.0
        self._starts = starts_message

    def due(self, kind: Kind, key: int, chunk: int, it: int) -> float:
        if kind not in (Kind.PUSH, Kind.PULL) or not self._starts(kind, key, chunk):
            return 0.0
        self.messages += 1
        self._owed += self.seconds
        if self._owed <= 0:
            return 0.0
        return self._owed

    def waited(self, seconds: float) -> None:
        self.waited_s += seconds
        self._owed -= seconds


class PSBase(Scheduler):
    """Connections, receive loops, wait/close and failure handling for the PS family."""

    Params: ClassVar[type[SchedulerParams]] = PSParams
    server_mode: ClassVar[Mode]
    CLOSE_WAIT_S: ClassVar[float] = 10.0  # for the servers' BYE after ours

    def __init__(self, ctx: RoleContext, params: SchedulerParams):
        super().__init__(ctx, params)
        self._failure = Failure()
        self._cv = self._failure.cv
        self._lock = self._failure.lock   # _cv's lock: the per-frame paths take it without the Condition's Python
        self._done_it: dict[int, int] = {}     # key -> last iteration whose result is complete
        self.conns: list[Connection] = []
        self.loop = Loop(self)
        self.peers: list[Peer] = []
        self._io: threading.Thread | None = None
        self.startup = [StartupCost(params.startup_us / 1e6, self._starts_frame) for _ in ctx.servers]  # per server
        self.stamps: list[TxStamps] = []  # traced: when each frame's bytes left (schedulers/transport/txstamps.py)
        self.paced: dict[int, int] = {}   # server -> the pacing rate it sent us last, bytes/s
        self.pace_updates = 0

    # ------------------------------------------------------------------ setup
    def _connect(self) -> None:
        try:
            for i, ep in enumerate(self.ctx.servers):
                conn = dial(ep.ip, ep.port, f"server {i} ({ep.host} {ep.ip}:{ep.port})", self.ctx.connect_timeout_s,
                            Hello(self.ctx.rank, self.ctx.num_workers, self.server_mode))
                conn.queue_s = PRIORITY_QUEUE_S
                self.conns.append(conn)
                # Transmit stamps always (the host's queue bound); a row per frame when traced.
                stamps = TxStamps.enable(conn.sock, peer=i, record=self.ctx.trace)
                if stamps is not None and self.ctx.trace:
                    self.stamps.append(stamps)
                self.peers.append(self.loop.add(
                    conn, i, sender=self.ctx.rank, stamps=stamps, host_queue_s=HOST_QUEUE_S,
                    on_send=self._sent_push if self.ctx.trace else None,
                    delay=self.startup[i] if self.params.startup_us > 0 else None))
        except BaseException as e:
            for conn in self.conns:
                conn.abort(str(e), self.ctx.rank)
            raise
        self.loop.after_round = self._after_round
        self._io = threading.Thread(target=self._serve, daemon=True, name="io")
        self._io.start()

    def _serve(self) -> None:
        """The I/O thread: every server connection, until each has said BYE after ours."""
        try:
            self.loop.run(done=self._closed)
        except BaseException as e:  # noqa: BLE001
            self._fail(e)

    def _closed(self) -> bool:
        return self._failure.closing and all(p.bye_sent and p.bye_received for p in self.peers)

    def _after_round(self) -> None:
        """After each round of the I/O loop (a subclass moves queued work to the outboxes)."""

    def _sent_push(self, kind: Kind, key: int, chunk: int, it: int) -> None:
        """Traced: a PUSH's first byte goes to the socket now."""
        if kind == Kind.PUSH:
            self.event("send", key, chunk, it)

    def _starts_frame(self, kind: Kind, key: int, chunk: int) -> bool:
        return self._starts_message(key, chunk)

    def _starts_message(self, key: int, chunk: int) -> bool:
        """Whether the PUSH or PULL frame of (key, chunk) starts a message, one that pays the
        start-up cost. Here every one does: each is a request of its own."""
        return True

    def info(self) -> dict:
        """With a start-up cost: the cost, the messages that paid it and the time waited.
        Traced: `tx`, this worker's priority-inversion figures (contracts/tx_frames.py `summary`)."""
        out = {}
        if self.params.startup_us:
            out.update({"startup_us": self.params.startup_us,
                        "startup_messages": sum(c.messages for c in self.startup),
                        "startup_waited_s": sum(c.waited_s for c in self.startup)})
        if self.stamps:
            out["tx"] = summary(merge(self.stamps)["inversion_s"])
        if self.paced:
            out.update({"pace_bytes_per_s": self.paced, "pace_updates": self.pace_updates})
        return out

    def tables(self) -> dict:
        """Traced: `tx_frames`, one row per PUSH frame (schedulers/transport/txstamps.py)."""
        return {"tx_frames": merge(self.stamps)} if self.stamps else {}

    # ------------------------------------------------------------------ API
    def wait(self, key: int, it: int) -> np.ndarray:
        with self._cv:
            while self._done_it.get(key, -1) < it:
                self._failure.check()
                self._cv.wait(timeout=1.0)
            return self.out[key]

    def close(self) -> None:
        with self._cv:
            self._failure.closing = True
            failed = self._failure.failed
            self._cv.notify_all()
        if not failed and self._io is not None:
            # Each server answers our BYE with its own once it has sent us everything.
            self.loop.call_soon(self._say_bye)
            self._io.join(self.CLOSE_WAIT_S)
        self._failure.told()   # a failure's ABORTs go out before their connections close
        for conn in self.conns:
            conn.close()
        if self._io is None or not self._io.is_alive():
            self.loop.close()

    def _say_bye(self) -> None:
        for p in self.peers:
            p.close()

    # ------------------------------------------------------------------ failure
    def _fail(self, err: BaseException) -> None:
        """Keep the first error, wake `wait`, and tell every server why we stop (on the I/O
        thread, after its loop has ended)."""
        self._failure.fail(str(err), tell=lambda r: abort_peers(self.peers, r))  # the server prefixes our name

    # ------------------------------------------------------------------ receive (loop.Handler)
    def on_frame(self, peer: Peer, h: Header, payload) -> None:
        if h.kind == Kind.BYE:
            if not self._failure.closing:
                raise CommError(f"{peer.conn.peer} ended the session early")
            return
        if h.kind == Kind.CTRL:   # the server's measured share of its link for us (share.py)
            if self.params.pace_to_share:
                pace(peer.sock, h.key)
                self.paced[peer.rank] = h.key
                self.pace_updates += 1
            return
        self._on_frame(peer.rank, peer.conn, h)

    def payload_buffer(self, peer: Peer, h: Header) -> np.ndarray:
        """Where a RESULT's payload lands: its slice of the output buffer."""
        raise NotImplementedError

    def _on_frame(self, s: int, conn: Connection, h: Header) -> None:
        raise NotImplementedError

    def _complete(self, key: int, it: int) -> None:
        """Caller holds self._cv: key's result for `it` is entirely in self.out[key]."""
        self._done_it[key] = it
        self._cv.notify_all()


# ====================================================================== push, ACK, pull
@dataclass(eq=False)
class CommTask:
    """One partition of one tensor's gradient for one iteration.

    It has no state field: where it is kept says where it is (the priority queue until it
    is pushed, `_inflight` until its result is in), and the frames that arrive (ACK, RESULT)
    are the only transitions. ByteScheduler's tasks carry explicit states because its core
    drives several engines through callbacks; here a state would only mirror those two
    containers.
    """

    key: int
    it: int
    priority: int
    data: np.ndarray          # the slice of the gradient to push
    chunk: int = 0
    offset: int = 0
    seq: int = 0              # order in which push() saw the gradient: readiness order
    server: int = 0
    order: tuple = field(default=())

    @property
    def numel(self) -> int:
        return int(self.data.size)


class PSScheduler(PSBase):
    """Push, ACK, pull. A subclass overrides these hooks, each read once in `start`:

    partition_numel()  elements per partition, the unit of one push and one pull request.
                       Default None: whole tensors.
    credit_numel()     elements pushed but not yet acknowledged, at most (with nothing in
                       flight, a partition goes out whatever its size). Default None: no
                       window.
    order(task)        the priority queue's sort key, lowest first. No default.
    wire_order(task)   the order of the task's PUSH and PULL frames in their server's outbox,
                       lowest first. Default: order(task), so a PULL overtakes the pushes of
                       worse tasks not yet handed to the kernel. `fifo` returns one constant:
                       the outbox then sends in the order the frames were queued.
    """

    server_mode = Mode.PULL

    def partition_numel(self) -> int | None:
        return None

    def credit_numel(self) -> int | None:
        return None

    @abc.abstractmethod
    def order(self, task: CommTask) -> tuple: ...

    def wire_order(self, task: CommTask) -> tuple:
        return task.order

    def __init__(self, ctx: RoleContext, params: SchedulerParams):
        super().__init__(ctx, params)
        self._queue: list = []
        self._inflight: dict[tuple[int, int, int], CommTask] = {}
        self._inflight_numel = 0
        self._pending: dict[int, int] = {}     # key -> chunks of its latest push not finished
        self._seq = itertools.count()

    def start(self, tensors: list[TensorSpec]) -> None:
        self.tensors = {t.key: t for t in tensors}
        self.out = {t.key: np.empty(t.numel, dtype=np.float32) for t in tensors}
        self._partition, self._credit = self.partition_numel(), self.credit_numel()
        slots = [(t.key, c, n) for t in tensors for c, n in enumerate(chunk_sizes(t.numel, self._partition))]
        self.server_of = assign_servers(slots, len(self.ctx.servers))
        self._connect()

    def push(self, key: int, grad: np.ndarray, it: int) -> None:
        parts = self._partitions(key, grad.reshape(-1), it)
        with self._cv:
            self._failure.check()
            self._pending[key] = len(parts)
            for p in parts:
                heapq.heappush(self._queue, (p.order, p.seq, p.chunk, p))
        self.loop.wake()   # the I/O thread dispatches them after its round

    def _partitions(self, key: int, flat: np.ndarray, it: int) -> list[CommTask]:
        """The gradient cut every partition_numel elements, each task with its server and order."""
        priority, seq = self.tensors[key].priority, next(self._seq)
        step = self._partition or max(flat.size, 1)
        parts = []
        for chunk, off in enumerate(range(0, max(flat.size, 1), step)):
            task = CommTask(key=key, it=it, priority=priority, data=flat[off:off + step], chunk=chunk,
                            offset=off, seq=seq, server=self.server_of[(key, chunk)])
            task.order = self.order(task)
            parts.append(task)
        return parts

    def _after_round(self) -> None:
        """Move queued tasks to their server in priority order while credit allows (on the
        I/O thread, after each round: a push woke it, or an ACK returned credit)."""
        moved = []
        with self._lock:
            if self._failure.closing or self._failure.failed:
                return
            while self._may_send():
                task: CommTask = heapq.heappop(self._queue)[3]
                self._inflight[(task.key, task.chunk, task.it)] = task
                self._inflight_numel += task.numel
                moved.append(task)
        for task in moved:
            self.peers[task.server].put(self.wire_order(task), Kind.PUSH, task.key, task.chunk, task.it,
                                        task.data, priority=task.priority)

    def _may_send(self) -> bool:
        """The best queued task fits the credit window (caller holds self._cv)."""
        if not self._queue:
            return False
        credit, inflight = self._credit, self._inflight_numel
        return credit is None or inflight == 0 or inflight + self._queue[0][3].numel <= credit

    def _task(self, conn: Connection, h: Header) -> CommTask:
        with self._lock:
            task = self._inflight.get((h.key, h.chunk, h.it))
        if task is None:
            raise CommError(f"{conn.peer} sent {h.kind.name} for unknown slot {h.key}/{h.chunk}/it {h.it}")
        return task

    def payload_buffer(self, peer: Peer, h: Header) -> np.ndarray:
        task = self._task(peer.conn, h)
        if h.kind != Kind.RESULT:
            raise CommError(f"{peer.conn.peer} sent unexpected {h.kind.name} with a payload")
        if h.nbytes != task.numel * 4:
            raise CommError(f"{peer.conn.peer} sent {h.nbytes} bytes for a {task.numel}-element slice")
        return self.out[task.key][task.offset:task.offset + task.numel]

    def _on_frame(self, s: int, conn: Connection, h: Header) -> None:
        task = self._task(conn, h)
        if h.kind == Kind.ACK:
            self._acked(task)
            self.peers[s].put(self.wire_order(task), Kind.PULL, task.key, task.chunk, task.it,
                              priority=task.priority)
        elif h.kind == Kind.RESULT:
            if h.nbytes != task.numel * 4:   # an empty slice's RESULT has no payload buffer
                raise CommError(f"{conn.peer} sent {h.nbytes} bytes for a {task.numel}-element slice")
            self.event("recv", task.key, task.chunk, task.it)
            self._finish(task)
        else:
            raise CommError(f"{conn.peer} sent unexpected {h.kind.name}")

    def _acked(self, task: CommTask) -> None:
        # Credit is returned when the server has the push, not when the pull completes:
        # the pull waits for the slowest worker, and workers that started different
        # partitions would otherwise each hold credit the others wait for (deadlock).
        with self._lock:
            self._inflight_numel -= task.numel

    def _finish(self, task: CommTask) -> None:
        with self._lock:
            task.data = task.data[:0]  # drop the reference to the gradient
            del self._inflight[(task.key, task.chunk, task.it)]
            self._pending[task.key] -= 1
            if self._pending[task.key] == 0:
                self._complete(task.key, task.it)


# ====================================================================== push, result unasked
@dataclass(eq=False)
class KeyState:
    """One tensor's slices and which of its latest push's results are back."""

    priority: int
    step: int                 # elements per slice (the last one may be shorter)
    sizes: list[int]
    servers: list[int]        # server of each slice
    starts: list[bool]        # whether each slice's push starts a message (pays the start-up cost)
    it: int = -1
    missing: int = 0
    got: bytearray = field(default_factory=bytearray)   # 1 where a slice's result is in


class PushScheduler(PSBase):
    """The server answers each push with the slice's average: no ACK, no PULL, no credit.
    Priority acts twice: the per-server outbox always sends its best (iteration, layer
    priority, slice) next, and the server orders its sends the same way. A subclass sets
    `server_mode` and overrides these hooks, each read once in `start`:

    slice_numel()           elements per slice, the unit of one push and one result. No
                            default.
    layout(tensors, sizes)  key -> the server of each of its slices. No default.
    starts_message(servers) given the server of each of a tensor's slices, whether each
                            slice's push starts a message, paying the modelled start-up cost
                            (`startup_us`). Default: every slice (each is a request of its
                            own, as P3's). Pushes go out in slice order per server, so a
                            slice that starts a message is written before the ones it covers.
    """

    @abc.abstractmethod
    def slice_numel(self) -> int: ...

    @abc.abstractmethod
    def layout(self, tensors: list[TensorSpec], sizes: dict[int, list[int]]) -> dict[int, list[int]]: ...

    def starts_message(self, servers: list[int]) -> list[bool]:
        return [True] * len(servers)

    def start(self, tensors: list[TensorSpec]) -> None:
        self.out = {t.key: np.empty(t.numel, dtype=np.float32) for t in tensors}
        step = self.slice_numel()
        sizes = {t.key: chunk_sizes(t.numel, step) for t in tensors}
        servers = self.layout(tensors, sizes)
        self._keys = {t.key: KeyState(t.priority, step, sizes[t.key], servers[t.key],
                                      self.starts_message(servers[t.key]),
                                      got=bytearray(len(sizes[t.key]))) for t in tensors}
        self._connect()

    def _starts_message(self, key: int, chunk: int) -> bool:
        return self._keys[key].starts[chunk]

    def push(self, key: int, grad: np.ndarray, it: int) -> None:
        st = self._keys[key]
        flat = grad.reshape(-1)
        with self._cv:
            self._failure.check()
            if st.missing:
                raise CommError(f"key {key}: iteration {it} pushed before iteration {st.it} came back")
            st.it, st.missing = it, len(st.sizes)
            st.got = bytearray(len(st.sizes))
        batches: dict[int, list[tuple]] = {}
        for c, n in enumerate(st.sizes):
            off = c * st.step
            batches.setdefault(st.servers[c], []).append(
                ((it, st.priority, c), Kind.PUSH, key, c, it, flat[off:off + n], st.priority, None))
        for s, frames in batches.items():
            self.peers[s].put_many(frames)

    def _expected(self, s: int, conn: Connection, h: Header) -> KeyState:
        st = self._keys.get(h.key)
        if h.kind != Kind.RESULT or st is None:
            raise CommError(f"{conn.peer} sent unexpected {h.kind.name} for key {h.key}")
        c = h.chunk
        with self._lock:
            ok = (h.it == st.it and st.missing and 0 <= c < len(st.sizes) and not st.got[c]
                  and st.servers[c] == s and h.nbytes == 4 * st.sizes[c])
        if not ok:
            raise CommError(f"{conn.peer} sent an unexpected result: key {h.key} slice {c} it {h.it}, "
                            f"{h.nbytes} bytes")
        return st

    def payload_buffer(self, peer: Peer, h: Header) -> np.ndarray:
        st = self._expected(peer.rank, peer.conn, h)
        off = h.chunk * st.step
        return self.out[h.key][off:off + st.sizes[h.chunk]]

    def _on_frame(self, s: int, conn: Connection, h: Header) -> None:
        st = self._expected(s, conn, h) if not h.nbytes else self._keys[h.key]   # with a payload: checked already
        c = h.chunk
        self.event("recv", h.key, c, h.it)
        with self._lock:
            st.got[c] = 1
            st.missing -= 1
            if st.missing == 0:
                self._complete(h.key, h.it)
