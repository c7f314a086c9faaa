"""Ring all-reduce among the workers over our own TCP transport (the collective baseline).

Buckets: DDP's (`buckets.py`). A bucket is launched the moment its last gradient is
pushed, so buckets go out in readiness order.

Ring. The worker at ring position p (rank order, or the searched `order: topology`) sends
only to p+1 and receives only from p-1. A bucket is cut into one segment per worker and
each segment into chunks (`chunk_numel`). Segment s is
reduced along s+1 -> s+2 -> ... -> s (reduce-scatter: each hop adds its own values and
passes the partial sum on), averaged at s, then passed s -> s+1 -> ... -> s-1
(all-gather). That is 2(n-1)/n of the bucket over every link, the bandwidth optimum.

Pipelining. There are no lock-step rounds: each chunk is forwarded the moment it arrives
and the local gradient is there (a partial sum that arrives before our own push waits in
memory). All n segments start at once, every link carries a chunk while the next is being
added, and later buckets overlap earlier ones, so no link idles while the ring has bytes
for it. Among queued frames a link sends the oldest iteration, then the earliest bucket,
then the chunk furthest along its path, which finishes buckets in order
(tests/loopback/test_schedulers_collective.py checks the time against the bandwidth optimum).

`wait` returns a view of the bucket's result buffer: it holds the average until that
gradient is pushed again (the trainer applies it before the next backward).

Failure. Worker i also watches the connection to i+1 (which carries nothing back except
BYE or ABORT), so the death of either neighbour is seen at once, even when idle. A worker
that fails, or learns of a failure, sends ABORT with the reason to both neighbours, who
pass it on: every worker raises a CommError naming the peer that died.
"""
from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
from pydantic import Field

from schedulers.api import CommError, RoleContext, TensorSpec
from schedulers.collective.buckets import BucketCollective, BucketParams, BucketState, plan_buckets
from schedulers.core.linkmodel import LinkModel
from schedulers.transport.connection import (  # noqa: F401 - MIN_CHUNK_NUMEL: part of the ring chunking rule
    MIN_CHUNK_NUMEL,
    Connection,
    Kind,
    Outbox,
    stream_chunk_numel,
)
from schedulers.transport.peers import Acceptor, Hello, dial


class RingParams(BucketParams):
    order: Literal["given", "topology"] = Field(
        default="given", description="given: ranks in order, as a job launcher assigns them; topology: the "
        "order with the highest bottleneck rate on the capacity graph (NCCL's ring search)")
    chunk_kb: int = Field(default=256, gt=0, le=1_048_576, description="largest frame passed around the ring, KiB")
    segment_chunks: int = Field(default=8, ge=1, le=4096,
                                description="cut each segment into at least this many chunks (a count; none "
                                            "under 16 KiB)")


SEARCH_MAX_WORKERS = 9  # (n-1)! orders: 40,320 at 9 workers, a fraction of a second


def depth_first_order(topology: dict, hosts: list[str]) -> list[int]:
    """The ranks in the order a depth-first walk of the capacity graph (links both ways,
    neighbours in name order) from rank 0's host reaches their hosts; ranks of one host
    together, in rank order, so rank 0 comes first. On a tree (every testbed topology) this
    ring crosses each link direction that separates workers exactly once, the fewest any ring
    can: it is the best order for every set of rates."""
    import networkx as nx  # here: importing the registry must stay cheap

    graph = nx.node_link_graph(topology, edges="links").to_undirected(as_view=True)
    reached = {node: i for i, node in enumerate(nx.dfs_preorder_nodes(graph, hosts[0], sort_neighbors=sorted))}
    return sorted(range(len(hosts)), key=lambda rank: (reached[hosts[rank]], rank))


def ring_order(topology: dict | None, hosts: list[str], how: str) -> list[int]:
    """The ring as a list of ranks: rank order, or (`topology`) the order whose busiest link,
    counting every hop's path through the switches, gives the highest rate. Up to
    SEARCH_MAX_WORKERS workers every order is tried (the best on any graph); beyond, the
    depth-first order (`depth_first_order`, the best on a tree). Rank order is kept unless
    the order found is faster. Every worker computes the same order from the same inputs."""
    n = len(hosts)
    if how == "given" or topology is None or n < 3:
        return list(range(n))
    model = LinkModel.from_graph(topology, hosts)
    if n <= SEARCH_MAX_WORKERS:
        candidates = ([0, *rest] for rest in itertools.permutations(range(1, n)))
    else:
        candidates = iter([depth_first_order(topology, hosts)])
    best, best_rate = list(range(n)), model.ring_rate_of(list(range(n)))
    for order in candidates:
        rate = model.ring_rate_of(order)
        if rate > best_rate * (1 + 1e-9):
            best, best_rate = order, rate
    return best


def chunk_numel(bucket_numel: int, n: int, params: RingParams) -> int:
    """Floats per chunk: each of the n segments streams in `segment_chunks` chunks of at most
    chunk_kb (transport.stream_chunk_numel)."""
    segment = -(-bucket_numel // max(n, 1))
    return stream_chunk_numel(segment, params.segment_chunks, max(1, params.chunk_kb * 1024 // 4))


# ---------------------------------------------------------------------------- ring state
@dataclass(frozen=True)
class Chunk:
    segment: int
    lo: int
    hi: int


@dataclass(eq=False, kw_only=True)
class RingBucket(BucketState):
    """A bucket and its progress at this worker. inp holds our gradients, out the averages."""

    chunks: list[Chunk]
    own: list[int]                 # chunks this worker starts (segment position-1)
    inp: np.ndarray
    out: np.ndarray
    finished: int = 0              # chunks of launched_it whose average is in `out`
    early: dict[int, list[tuple[int, np.ndarray]]] = field(default_factory=dict)


def ring_chunks(numel: int, n: int, chunk_numel: int) -> list[Chunk]:
    """n near-equal segments, each cut into chunks of at most chunk_numel (empty ones dropped)."""
    out = []
    for s in range(n):
        lo, hi = s * numel // n, (s + 1) * numel // n
        out += [Chunk(s, a, min(a + chunk_numel, hi)) for a in range(lo, hi, chunk_numel)]
    return out


class Ring(BucketCollective):
    name = "ring"
    Params = RingParams
    family = "collective"
    bound_model = "ring_allreduce"
    display_order = 4
    claims = {"forest-heterogeneous": "baseline"}
    report_sections = ("forest_compare",)  # a baseline there, its ring's order part of its name and bound

    def __init__(self, ctx: RoleContext, params: RingParams):
        super().__init__(ctx, params)
        # Segments and stages are counted in ring positions; peers are named by rank.
        self.order = ring_order(ctx.topology, [w.host for w in ctx.workers], params.order)
        self.pos = self.order.index(self.rank)
        self.right_rank = self.order[(self.pos + 1) % self.n]
        self.left_rank = self.order[(self.pos - 1) % self.n]
        self._threads: list[threading.Thread] = []

    # ------------------------------------------------------------------ setup
    def start(self, tensors: list[TensorSpec]) -> None:
        for b in plan_buckets(tensors, self.params):
            chunks = ring_chunks(b.numel, self.n, chunk_numel(b.numel, self.n, self.params))
            own = [c for c, ch in enumerate(chunks) if ch.segment == (self.pos - 1) % self.n] if self.n > 1 else []
            self.buckets.append(RingBucket(spec=b, chunks=chunks, own=own, inp=np.zeros(b.numel, np.float32),
                                           out=np.zeros(b.numel, np.float32)))
        self.bucket_of = {k: rb for rb in self.buckets for k in rb.spec.keys}
        self._pushed = {t.key: -1 for t in tensors}
        if self.n > 1:
            self._connect()

    def _connect(self) -> None:
        """Listen, connect to the right neighbour, accept the left one; HELLO names each.
        A failure here is passed on to whichever neighbour is connected already (or waits
        in our backlog), so that it too names the worker that is missing."""
        self.right = self.left = None
        try:
            self._handshake()
        except CommError as e:
            for conn in (self.right, self.left):
                if conn is not None:
                    conn.abort(str(e), self.rank)
            raise
        self.outbox = Outbox(self.right, lambda e: self._fail(str(e)), sender=self.rank)
        self._threads = [threading.Thread(target=self._receive, daemon=True, name="ring-recv"),
                         threading.Thread(target=self._watch_right, daemon=True, name="ring-watch")]
        for th in self._threads:
            th.start()
        self._connected = True

    def _handshake(self) -> None:
        me = Hello(self.rank, self.n)
        with Acceptor("0.0.0.0", self.ctx.workers[self.rank].port, me, self.ctx.connect_timeout_s,
                      self._peer) as acceptor:
            right = self.ctx.workers[self.right_rank]
            self.right = dial(right.ip, right.port, self._peer(self.right_rank), self.ctx.connect_timeout_s, me)
            self.left = acceptor.accept({self.left_rank})[self.left_rank]

    def info(self) -> dict:
        return {"bucket_numel": [rb.spec.numel for rb in self.buckets],
                "chunks_per_bucket": [len(rb.chunks) for rb in self.buckets]}

    # ------------------------------------------------------------------ BucketCollective hooks
    def _ready_at_launch(self, rb: RingBucket, it: int) -> list[tuple[int, np.ndarray]]:
        return rb.early.pop(it, [])   # partial sums of `it` that came before our launch

    def _bye(self) -> int:
        """BYE both ways: the outbox's to the right, ours on the left connection."""
        self.outbox.close()
        try:
            self.left.send(Kind.BYE, sender=self.rank)
        except CommError:
            pass
        return 2

    def _connections(self) -> list[Connection]:
        return [self.right, self.left]

    # ------------------------------------------------------------------ data path
    def _launch(self, rb: RingBucket, it: int, early: list[tuple[int, np.ndarray]]) -> None:
        for key in rb.spec.keys:
            self.event("send", key, 0, it)
        if self.n == 1:
            np.copyto(rb.out, rb.inp)
            self._finished(rb, it, len(rb.chunks))
            return
        if not rb.chunks:  # an empty bucket: nothing to reduce
            self._finished(rb, it, 0)
            return
        b = rb.spec.index
        own = [rb.chunks[c] for c in rb.own]
        self.outbox.put_many([((it, b, 0, c), Kind.PUSH, b, c, it, rb.inp[ch.lo:ch.hi], 0, None)
                              for c, ch in zip(rb.own, own, strict=True)])
        for c, partial in early:
            self._reduce(rb, c, it, partial)

    def _reduce(self, rb: RingBucket, c: int, it: int, partial: np.ndarray) -> None:
        """A partial sum of chunk c from the left: add ours, then pass it on or, when the
        segment is ours, average it and start its all-gather."""
        ch = rb.chunks[c]
        partial += rb.inp[ch.lo:ch.hi]
        b = rb.spec.index
        if ch.segment == self.pos:
            res = rb.out[ch.lo:ch.hi]
            np.divide(partial, self.n, out=res)
            self.outbox.put((it, b, -(self.n - 1), c), Kind.RESULT, b, c, it, res)
            self._finished(rb, it, 1)
        else:
            stage = (self.pos - ch.segment - 1) % self.n
            self.outbox.put((it, b, -stage, c), Kind.PUSH, b, c, it, partial)

    def _gather(self, rb: RingBucket, c: int, it: int) -> None:
        """The average of chunk c has landed in `out`: pass it on unless the next worker owns it."""
        ch = rb.chunks[c]
        if (self.pos + 1) % self.n != ch.segment:
            b = rb.spec.index
            stage = self.n - 1 + (self.pos - ch.segment) % self.n
            self.outbox.put((it, b, -stage, c), Kind.RESULT, b, c, it, rb.out[ch.lo:ch.hi])
        self._finished(rb, it, 1)

    def _receive(self) -> None:
        """Frames from the left neighbour: partial sums (PUSH) and averages (RESULT)."""
        conn = self.left
        try:
            while True:
                h = conn.recv_header()
                if h.kind in (Kind.BYE, Kind.ABORT):
                    self._peer_ends(conn, h)
                    return
                rb, ch = self._target(conn, h)
                if h.kind == Kind.PUSH:
                    partial = conn.recv_array(h.nbytes)
                    with self._cv:
                        ready = rb.launched_it == h.it
                        if not ready:
                            rb.early.setdefault(h.it, []).append((h.chunk, partial))
                    if ready:
                        self._reduce(rb, h.chunk, h.it, partial)
                elif h.kind == Kind.RESULT:
                    if rb.launched_it != h.it:
                        raise CommError(f"{conn.peer} sent the average of bucket {h.key} for iteration {h.it} "
                                        f"before we pushed it")
                    conn.recv_into(memoryview(rb.out[ch.lo:ch.hi]))
                    self._gather(rb, h.chunk, h.it)
                else:
                    raise CommError(f"{conn.peer} sent unexpected {h.kind.name}")
        except BaseException as e:  # noqa: BLE001 - every failure ends the job, loudly
            self._fail(str(e))

    def _watch_right(self) -> None:
        """The connection to the right carries nothing back but BYE or ABORT: EOF is death."""
        conn = self.right
        try:
            h = conn.recv_header()
            if h.kind not in (Kind.BYE, Kind.ABORT):
                raise CommError(f"{conn.peer} sent unexpected {h.kind.name} backwards")
            self._peer_ends(conn, h)
        except BaseException as e:  # noqa: BLE001
            self._fail(str(e))

    def _abort(self, reason: str) -> None:
        self.outbox.abort(reason)
        self.left.abort(reason, self.rank)
