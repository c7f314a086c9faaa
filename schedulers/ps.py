"""Worker side of the parameter-server family, built around one task abstraction.

A `CommTask` (after ByteScheduler's ByteTask) is one tensor's gradient for one iteration,
or one partition of it, moving through explicit states:

    POSTED   the whole gradient was handed to push()
    READY    partitioned, waiting in the priority queue for credit
    STARTED  pushed to its server (holding credit until the server acknowledges it),
             then pulled
    FINISHED the averaged slice is in the result buffer

A subclass only chooses three things: the partition size, the credit window, and the
priority order. `fifo` and `bytescheduler` are such subclasses.
"""
from __future__ import annotations

import heapq
import itertools
import threading
from dataclasses import dataclass, field
from enum import Enum
from typing import ClassVar

import numpy as np

from schedulers.base import CommError, RoleContext, Scheduler, SchedulerParams, TensorSpec
from schedulers.transport import Connection, Kind, Outbox, connect


class State(Enum):
    POSTED = "posted"
    READY = "ready"
    STARTED = "started"
    FINISHED = "finished"


@dataclass(eq=False)
class CommTask:
    key: int
    it: int
    priority: int
    data: np.ndarray          # the gradient (or slice of it) to push
    chunk: int = 0
    offset: int = 0
    seq: int = 0              # order in which push() saw it: readiness order
    state: State = State.POSTED
    server: int = 0
    order: tuple = field(default=())

    @property
    def numel(self) -> int:
        return int(self.data.size)

    def partition(self, size: int | None) -> list["CommTask"]:
        """Split into tasks of at most `size` elements (None: one task), each READY."""
        step = size if size else max(self.numel, 1)
        parts = []
        for chunk, off in enumerate(range(0, max(self.numel, 1), step)):
            parts.append(CommTask(key=self.key, it=self.it, priority=self.priority,
                                  data=self.data[off:off + step], chunk=chunk, offset=off,
                                  seq=self.seq, state=State.READY))
        return parts


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


class PSScheduler(Scheduler):
    """Push/ACK/pull client; subclasses set `partition_numel`, `credit_numel` and `order`."""

    partition_numel: ClassVar[int | None] = None

    def credit_numel(self) -> int | None:
        return None

    def order(self, task: CommTask) -> tuple:
        raise NotImplementedError

    def __init__(self, ctx: RoleContext, params: SchedulerParams):
        super().__init__(ctx, params)
        self._cv = threading.Condition()
        self._queue: list = []
        self._inflight: dict[tuple[int, int, int], CommTask] = {}
        self._inflight_numel = 0
        self._pending: dict[int, int] = {}     # key -> chunks of its latest push not finished
        self._done_it: dict[int, int] = {}     # key -> last iteration whose result is complete
        self._seq = itertools.count()
        self._error: BaseException | None = None
        self._closing = False

    # ------------------------------------------------------------------ setup
    def start(self, tensors: list[TensorSpec]) -> None:
        self.tensors = {t.key: t for t in tensors}
        self.out = {t.key: np.empty(t.numel, dtype=np.float32) for t in tensors}
        size = self._partition_size()
        slots = []
        for t in tensors:
            step = size if size else max(t.numel, 1)
            slots += [(t.key, c, min(step, t.numel - off)) for c, off in enumerate(range(0, max(t.numel, 1), step))]
        self.server_of = assign_servers(slots, len(self.ctx.servers))
        self.conns: list[Connection] = []
        self.outboxes: list[Outbox] = []
        for i, ep in enumerate(self.ctx.servers):
            conn = connect(ep.ip, ep.port, f"server {i} ({ep.host} {ep.ip}:{ep.port})", self.ctx.connect_timeout_s)
            conn.send(Kind.HELLO, key=self.ctx.num_workers, sender=self.ctx.rank)
            self.conns.append(conn)
            self.outboxes.append(Outbox(conn, self._fail, sender=self.ctx.rank))
        self._threads = [threading.Thread(target=self._receive, args=(i,), daemon=True, name=f"recv-s{i}")
                         for i in range(len(self.conns))]
        self._threads.append(threading.Thread(target=self._dispatch, daemon=True, name="dispatch"))
        for th in self._threads:
            th.start()

    def _partition_size(self) -> int | None:
        return self.partition_numel

    # ------------------------------------------------------------------ API
    def push(self, key: int, grad: np.ndarray, it: int) -> None:
        spec = self.tensors[key]
        task = CommTask(key=key, it=it, priority=spec.priority, data=grad.reshape(-1), seq=next(self._seq))
        parts = task.partition(self._partition_size())
        with self._cv:
            self._raise_if_failed()
            self._pending[key] = len(parts)
            for p in parts:
                p.server = self.server_of[(p.key, p.chunk)]
                p.order = self.order(p)
                heapq.heappush(self._queue, (p.order, p.seq, p.chunk, p))
            self._cv.notify_all()

    def wait(self, key: int, it: int) -> np.ndarray:
        with self._cv:
            while self._done_it.get(key, -1) < it:
                self._raise_if_failed()
                self._cv.wait(timeout=1.0)
            return self.out[key]

    def close(self) -> None:
        with self._cv:
            self._closing = True
            self._cv.notify_all()
        for ob in getattr(self, "outboxes", []):
            ob.close()
        for conn in getattr(self, "conns", []):
            # The server answers our BYE by closing; wait for that so nothing is cut off.
            try:
                conn.sock.settimeout(10)
                while conn.sock.recv(65536):
                    pass
            except OSError:
                pass
            conn.close()

    # ------------------------------------------------------------------ threads
    def _fail(self, err: BaseException) -> None:
        with self._cv:
            if self._error is None and not self._closing:
                self._error = err
            self._cv.notify_all()

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise CommError(str(self._error))

    def _dispatch(self) -> None:
        """Move READY tasks to their server in priority order while credit allows."""
        credit = self.credit_numel()
        while True:
            with self._cv:
                while not self._closing and self._error is None and not (
                        self._queue and (credit is None or self._inflight_numel == 0
                                         or self._inflight_numel + self._queue[0][3].numel <= credit)):
                    self._cv.wait()
                if self._closing or self._error is not None:
                    return
                task: CommTask = heapq.heappop(self._queue)[3]
                task.state = State.STARTED
                self._inflight[(task.key, task.chunk, task.it)] = task
                self._inflight_numel += task.numel
            self.outboxes[task.server].put(task.order, Kind.PUSH, task.key, task.chunk, task.it, task.data)

    def _receive(self, s: int) -> None:
        conn = self.conns[s]
        try:
            while True:
                h = conn.recv_header()
                if h.kind == Kind.BYE:
                    if not self._closing:
                        raise CommError(f"{conn.peer} ended the session early")
                    return
                with self._cv:
                    task = self._inflight.get((h.key, h.chunk, h.it))
                if task is None:
                    raise CommError(f"{conn.peer} sent {h.kind.name} for unknown slot {h.key}/{h.chunk}/it {h.it}")
                if h.kind == Kind.ACK:
                    self._acked(task)
                    self.outboxes[s].put(task.order, Kind.PULL, task.key, task.chunk, task.it)
                elif h.kind == Kind.RESULT:
                    if h.nbytes != task.numel * 4:
                        raise CommError(f"{conn.peer} sent {h.nbytes} bytes for a {task.numel}-element slice")
                    conn.recv_into(memoryview(self.out[task.key][task.offset:task.offset + task.numel]))
                    self._finish(task)
                else:
                    raise CommError(f"{conn.peer} sent unexpected {h.kind.name}")
        except BaseException as e:  # noqa: BLE001
            self._fail(e)

    def _acked(self, task: CommTask) -> None:
        # Credit is returned when the server has the push, not when the pull completes:
        # the pull waits for the slowest worker, and workers that started different
        # partitions would otherwise each hold credit the others wait for (deadlock).
        with self._cv:
            self._inflight_numel -= task.numel
            self._cv.notify_all()

    def _finish(self, task: CommTask) -> None:
        with self._cv:
            task.state = State.FINISHED
            task.data = task.data[:0]  # drop the reference to the gradient
            del self._inflight[(task.key, task.chunk, task.it)]
            self._pending[task.key] -= 1
            if self._pending[task.key] == 0:
                self._done_it[task.key] = task.it
            self._cv.notify_all()
