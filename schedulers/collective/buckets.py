"""DDP-style gradient buckets, shared by the collectives that fuse gradients (ring,
hierarchical, gloo), and the worker side that ring and hierarchical share (`BucketCollective`).

One collective per parameter would pay its fixed cost hundreds of times per iteration, and
one for the whole model could start only after backward ends. So, as PyTorch DDP does,
gradients are fused into flat buckets of about `bucket_mb`, filled in the order backward is
expected to produce them (the layer farthest from the input first), with a smaller first
bucket so that communication starts early. Every worker computes the same buckets from the
same tensor list, and a bucket is ready once its last gradient has been pushed.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
from pydantic import Field

from schedulers.api import CommError, RoleContext, Scheduler, SchedulerParams, TensorSpec
from schedulers.core.failure import Failure
from schedulers.transport.connection import Connection, Kind

MiB = 1024 * 1024


class BucketParams(SchedulerParams):
    """The bucket caps (DDP's defaults). Bucketing collectives run among the workers alone."""

    requires_servers: ClassVar[bool] = False
    bucket_mb: float = Field(default=25.0, gt=0, le=1_048_576, description="bucket cap in MiB (DDP's bucket_cap_mb)")
    first_bucket_mb: float = Field(default=1.0, gt=0, le=1_048_576, description="cap of the first bucket in MiB (DDP)")


@dataclass
class Bucket:
    """Gradients fused into one flat buffer; `offsets[key]` is where each one starts."""

    index: int
    keys: list[int]
    offsets: dict[int, int]
    numel: int
    sizes: dict[int, int] = field(default_factory=dict)   # key -> its number of elements

    def span(self, key: int) -> slice:
        """Where gradient `key` lies in the bucket's buffer."""
        return slice(self.offsets[key], self.offsets[key] + self.sizes[key])


def assign_buckets(tensors: list[TensorSpec], cap_bytes: int, first_cap_bytes: int) -> list[Bucket]:
    """DDP's rule over the expected readiness order: add tensors to the current bucket until
    it reaches its cap (a tensor larger than the cap gets a bucket of its own)."""
    order = sorted(tensors, key=lambda t: (-t.priority, -t.key))  # backward: output side first
    buckets: list[Bucket] = []
    keys: list[int] = []
    offsets: dict[int, int] = {}
    numel = 0
    for t in order:
        keys.append(t.key)
        offsets[t.key] = numel
        numel += t.numel
        if numel * 4 >= (first_cap_bytes if not buckets else cap_bytes):
            buckets.append(Bucket(len(buckets), keys, offsets, numel))
            keys, offsets, numel = [], {}, 0
    if keys:
        buckets.append(Bucket(len(buckets), keys, offsets, numel))
    sizes = {t.key: t.numel for t in tensors}
    for b in buckets:
        b.sizes = {k: sizes[k] for k in b.keys}
    return buckets


def plan_buckets(tensors: list[TensorSpec], params: BucketParams) -> list[Bucket]:
    """The buckets for a scheduler's caps."""
    return assign_buckets(tensors, int(params.bucket_mb * MiB), int(params.first_bucket_mb * MiB))


@dataclass(eq=False, kw_only=True)
class BucketState:
    """One bucket at this worker: the gradients pushed for its next launch, and which
    iteration was last launched and last completed. A bucket's buffers serve one launch
    at a time: a gradient is copied in only once `done_it == launched_it`."""

    spec: Bucket
    filled: int = 0                # gradients pushed for the next launch...
    filling_it: int = -1           # ...which is of this iteration
    launched_it: int = -1
    done_it: int = -1

    def add(self) -> bool:
        """One more gradient of `filling_it` is in; True, and the count starts over, when it
        was the last one (caller holds the scheduler's lock)."""
        self.filled += 1
        if self.filled < len(self.spec.keys):
            return False
        self.filled = 0
        return True


class BucketCollective(Scheduler):
    """The worker side of a bucketing collective over our transport (ring, hierarchical).

    `push` copies a gradient into its bucket and launches the bucket once its last gradient
    of the iteration is in (after the bucket's previous launch has finished with its
    buffers); `wait` blocks until the bucket's average of that iteration is in its result
    buffer and returns a view of it; the first failure is kept and relayed; a peer's BYE or
    ABORT is counted; `close` finishes what was launched, says BYE and waits for every
    peer's. A subclass builds `buckets` (with `chunks`, `inp`, `out`) and `bucket_of` in
    start(), sets `_connected`, and provides `_ready_at_launch`, `_launch`, `_bye`,
    `_connections` and `_abort`."""

    def __init__(self, ctx: RoleContext, params: SchedulerParams):
        super().__init__(ctx, params)
        self.n, self.rank = ctx.num_workers, ctx.rank
        self._failure = Failure(f"worker {self.rank}")
        self._cv = self._failure.cv
        self._pushed: dict[int, int] = {}
        self._ended = 0  # peers that said BYE (or vanished while we close)
        self._connected = False
        self.buckets: list[Any] = []
        self.bucket_of: dict[int, Any] = {}

    def _peer(self, rank: int) -> str:
        ep = self.ctx.workers[rank]
        return f"worker {rank} ({ep.host} {ep.ip}:{ep.port})"

    # ------------------------------------------------------------------ API
    def push(self, key: int, grad: np.ndarray, it: int) -> None:
        rb = self.bucket_of[key]
        with self._cv:
            self._failure.check()
            if it <= self._pushed[key]:
                raise ValueError(f"key {key}: pushed iteration {it} after {self._pushed[key]}")
            if rb.filled and rb.filling_it != it:
                raise ValueError(f"key {key}: pushed for iteration {it} while its bucket still misses "
                                 f"gradients of iteration {rb.filling_it}")
            self._pushed[key] = it
            rb.filling_it = it
            while rb.done_it != rb.launched_it:  # our buffers still serve the previous launch
                self._cv.wait(1.0)
                self._failure.check()
        np.copyto(rb.inp[rb.spec.span(key)], grad.reshape(-1))
        with self._cv:
            if not rb.add():
                return
            rb.launched_it, rb.finished = it, 0
            ready = self._ready_at_launch(rb, it)
        self._launch(rb, it, ready)

    def wait(self, key: int, it: int) -> np.ndarray:
        """A view of the bucket's result buffer: it holds the average until `key` is pushed again."""
        rb = self.bucket_of[key]
        with self._cv:
            if self._pushed[key] < it:
                raise ValueError(f"wait({key}, {it}) before that gradient was pushed")
            while rb.done_it < it:
                self._failure.check()
                self._cv.wait(1.0)
        return rb.out[rb.spec.span(key)]

    def close(self) -> None:
        """Finish what was launched, then BYE to every peer and wait for every peer's BYE, so
        no byte in flight is cut off. Closing with work unfinished is a failure (ABORT)."""
        with self._cv:
            if self._failure.closing:
                return
            self._cv.wait_for(lambda: self._failure.failed or all(
                rb.done_it == rb.launched_it for rb in self.buckets), self.ctx.connect_timeout_s)
            complete = not self._failure.failed and all(
                rb.filled == 0 and rb.done_it == self.buckets[0].done_it for rb in self.buckets)
            self._failure.closing = True
        if not self._connected:  # one worker, or start() failed (and told the peers)
            return
        if not complete:
            if not self._failure.failed:
                self._abort(f"{self._peer(self.rank)} closed with iterations unfinished")
            self._failure.told()   # a failure's ABORTs are out before the caller may exit
            return
        peers = self._bye()
        with self._cv:
            self._cv.wait_for(lambda: self._ended >= peers, self.ctx.connect_timeout_s)
        for conn in self._connections():
            conn.close()

    # ------------------------------------------------------------------ subclass
    def _ready_at_launch(self, rb, it: int) -> Any:
        """What `_launch` gets with the bucket (caller holds the lock)."""
        raise NotImplementedError

    def _launch(self, rb, it: int, ready: Any) -> None:
        raise NotImplementedError

    def _bye(self) -> int:
        """Close the outboxes (each sends BYE) and say BYE where no outbox does; return how
        many peers' BYE to wait for."""
        raise NotImplementedError

    def _connections(self) -> list[Connection]:
        raise NotImplementedError

    def _abort(self, reason: str) -> None:
        raise NotImplementedError

    # ------------------------------------------------------------------ shared steps
    def _finished(self, rb, it: int, count: int) -> None:
        """`count` more chunks of the bucket's launch of `it` have their average here."""
        with self._cv:
            rb.finished += count
            if rb.finished < len(rb.chunks):
                return
            rb.done_it = it
            self._cv.notify_all()
        for key in rb.spec.keys:
            self.event("recv", key, 0, it)

    def _target(self, conn: Connection, h) -> tuple[Any, Any]:
        """The bucket and chunk a received frame is for, checked against its size."""
        if h.key >= len(self.buckets) or h.chunk >= len(self.buckets[h.key].chunks):
            raise CommError(f"{conn.peer} sent chunk {h.key}/{h.chunk}, which does not exist")
        rb = self.buckets[h.key]
        ch = rb.chunks[h.chunk]
        if h.nbytes != (ch.hi - ch.lo) * 4:
            raise CommError(f"{conn.peer} sent {h.nbytes} bytes for chunk {h.key}/{h.chunk} "
                            f"of {ch.hi - ch.lo} floats")
        return rb, ch

    # ------------------------------------------------------------------ ending
    def _peer_ends(self, conn: Connection, h) -> None:
        if h.kind == Kind.ABORT:
            reason = conn.recv_text(h.nbytes) or f"{conn.peer} aborted"
            self._fail(reason, via=conn.peer)
            return
        # A peer says BYE only once all its iterations are complete, which needs every
        # worker's contribution: nothing we still need can come after it.
        with self._cv:
            self._ended += 1
            self._cv.notify_all()

    def _fail(self, reason: str, via: str | None = None) -> None:
        """The first failure wins: remember it, wake waiters, tell every peer (who pass the
        reason on unchanged, so it names the peer that failed first); the error reaches
        the caller once they have been told."""
        if self._failure.fail(reason if via is None else f"{reason} (relayed by {via})",
                              tell=lambda _: self._abort(reason)):
            return
        with self._cv:
            self._ended += 1  # a peer went away while we close: stop waiting for it
            self._cv.notify_all()
