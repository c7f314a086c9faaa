"""Hierarchical all-reduce: reduce inside each group, ring among the group leaders, broadcast.

Why. Where hosts share a switch, traffic among them stays under that switch, and the
links between switches (rack uplinks, often oversubscribed) are the scarce ones. So, as
NCCL's and Horovod's hierarchical all-reduce is deployed, only one worker per group, its
leader, talks across groups: the links between groups carry a ring's 2(L-1)/L of each
bucket for L leaders, whatever the group sizes. The price is the leader's own link, which
carries each member's gradient in and the average back out.

Groups (`groups`): the workers whose hosts hang off the same switch of the capacity graph
(workers sharing a host always together); the leader is the group's lowest rank, and the
leaders' ring runs in rank order. Without a graph, or with one switch, there is one group:
the ring is its leader alone, and the whole is a reduce to worker 0 and a broadcast.

Data path. Buckets are DDP's (`buckets.py`), launched when their last gradient is pushed.
A bucket is cut as ring.py cuts it for L workers: L segments, each in `segment_chunks` or
more chunks of up to `chunk_kb`. (1) A member sends every chunk to its leader, the first
chunk of every segment, then the second of every segment, and so on (`_upload_order`).
Once its own and all its members' chunk c are in, the leader adds them, in rank order
(the group sum). (2) The leaders run
ring.py's reduce-scatter and all-gather on the group sums; the leader that owns a segment
divides by n, the number of all workers. (3) A leader sends each averaged chunk to its
members the moment it has it. Every step is per chunk: no stage waits for another to end,
and all three keep their links busy at once.

Failure. A member watches its leader's connection, a leader those of its members and both
ring neighbours (the right one carries nothing back but BYE or ABORT), so any death is
seen at once. A worker that fails, or learns of a failure, sends ABORT with the reason on
every connection it has, and each worker passes it on: every worker raises a CommError
naming the peer that died.
"""
from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from pydantic import Field

from schedulers.api import CommError, RoleContext, TensorSpec
from schedulers.collective.buckets import BucketCollective, BucketParams, BucketState, plan_buckets
from schedulers.collective.ring import Chunk, ring_chunks
from schedulers.transport.connection import Connection, Kind, Outbox, abort_all, stream_chunk_numel
from schedulers.transport.peers import Acceptor, Hello, dial


class HierarchicalParams(BucketParams):
    chunk_kb: int = Field(default=256, gt=0, le=1_048_576, description="largest frame sent, KiB")
    segment_chunks: int = Field(default=8, ge=1, le=4096, description="cut each of the leaders' ring segments "
                                "into at least this many chunks (a count; none under 16 KiB)")


def groups(topology: dict | None, hosts: list[str]) -> list[list[int]]:
    """Worker ranks grouped by the switch their host hangs off (`hosts[i]`: worker i's node
    in the node-link capacity graph), each group in rank order, groups in order of their
    lowest rank (the leader). Workers sharing a host share its switch; a host linked to
    several switches takes the first by name, one linked to none forms its own group. No
    graph: one group."""
    if topology is None:
        return [list(range(len(hosts)))]
    kinds = {node["id"]: node.get("kind", "host") for node in topology["nodes"]}
    switches: dict[str, set[str]] = {}
    for e in topology.get("links", topology.get("edges", [])):
        for a, b in ((e["source"], e["target"]), (e["target"], e["source"])):
            if kinds.get(b) == "switch":
                switches.setdefault(a, set()).add(b)
    out: dict[str, list[int]] = {}
    for rank, host in enumerate(hosts):
        if host not in kinds:
            raise ValueError(f"worker {rank}'s host {host!r} is not in the capacity graph")
        out.setdefault(min(switches.get(host, ()), default=host), []).append(rank)
    return list(out.values())


def chunk_numel(bucket_numel: int, leaders: int, params: HierarchicalParams) -> int:
    """Floats per chunk: each of the leaders' ring segments streams in at least
    `segment_chunks` chunks of at most chunk_kb (transport.stream_chunk_numel)."""
    segment = -(-bucket_numel // max(leaders, 1))
    return stream_chunk_numel(segment, params.segment_chunks, max(1, params.chunk_kb * 1024 // 4))


@dataclass(eq=False, kw_only=True)
class HierBucket(BucketState):
    """A bucket at this worker. inp holds our gradients (at a leader, chunk by chunk, the
    group sum), out the averages. The dicts, keyed by (iteration, chunk), are a leader's."""

    chunks: list[Chunk]
    inp: np.ndarray
    out: np.ndarray
    finished: int = 0              # chunks of launched_it whose average is in `out`
    parts: dict[tuple[int, int], list] = field(default_factory=dict)        # members' chunks, by member
    summed: set[tuple[int, int]] = field(default_factory=set)               # group sum in, partial awaited
    early: dict[tuple[int, int], np.ndarray] = field(default_factory=dict)  # partial in, group sum awaited


class Hierarchical(BucketCollective):
    name = "hierarchical"
    Params = HierarchicalParams
    family = "collective"
    bound_model = "hierarchical_allreduce"
    display_order = 7

    def __init__(self, ctx: RoleContext, params: HierarchicalParams):
        super().__init__(ctx, params)
        self.groups = groups(ctx.topology, [w.host for w in ctx.workers])
        self.leaders = [g[0] for g in self.groups]
        group = next(g for g in self.groups if self.rank in g)
        self.leader, self.is_leader = group[0], group[0] == self.rank
        self.members = group[1:] if self.is_leader else []
        self.L = len(self.leaders)
        self.pos = self.leaders.index(self.leader)  # our group's place in the leaders' ring
        self.right_rank = self.leaders[(self.pos + 1) % self.L]
        self.left_rank = self.leaders[(self.pos - 1) % self.L]
        self._conns: list[Connection] = []           # every connection, for ABORT and close
        self._outboxes: list[Outbox] = []
        self.up: Outbox | None = None                # member: to the leader
        self.right: Outbox | None = None             # leader: to the next leader
        self.left: Connection | None = None          # leader: from the previous leader
        self._right_conn: Connection | None = None   # leader: the connection under `right`
        self.down: list[Outbox] = []                 # leader: to each member, in rank order

    def info(self) -> dict:
        return {"groups": self.groups, "bucket_numel": [rb.spec.numel for rb in self.buckets],
                "chunks_per_bucket": [len(rb.chunks) for rb in self.buckets]}

    # ------------------------------------------------------------------ setup
    def start(self, tensors: list[TensorSpec]) -> None:
        for b in plan_buckets(tensors, self.params):
            chunks = ring_chunks(b.numel, self.L, chunk_numel(b.numel, self.L, self.params))
            self.buckets.append(HierBucket(spec=b, chunks=chunks, inp=np.zeros(b.numel, np.float32),
                                           out=np.zeros(b.numel, np.float32)))
        self.bucket_of = {k: rb for rb in self.buckets for k in rb.spec.keys}
        self._pushed = {t.key: -1 for t in tensors}
        if self.n > 1:
            self._connect()

    def _connect(self) -> None:
        """Member: connect to the leader. Leader: listen, connect to the next leader, accept
        the members and the previous leader; HELLO names each. A failure here is passed on to
        whoever is connected already (or waits in the leader's backlog), so that they too
        name the worker that is missing."""
        try:
            conns = self._leader_handshake() if self.is_leader else {self.leader: self._dial(self.leader)}
        except CommError as e:
            for conn in self._conns:
                conn.abort(str(e), self.rank)
            raise
        on_error = lambda e: self._fail(str(e))  # noqa: E731
        threads = []
        if not self.is_leader:
            self.up = Outbox(conns[self.leader], on_error, sender=self.rank)
            threads.append((conns[self.leader], self._on_result))
        for m in self.members:
            self.down.append(Outbox(conns[m], on_error, sender=self.rank))
            threads.append((conns[m], self._on_member(self.members.index(m))))
        if self.is_leader and self.L > 1:
            self.right = Outbox(self._right_conn, on_error, sender=self.rank)
            self.left = conns[self.left_rank]
            threads += [(self._right_conn, self._on_backwards), (self.left, self._on_left)]
        self._outboxes = [ob for ob in (self.up, self.right, *self.down) if ob is not None]
        for conn, handle in threads:
            threading.Thread(target=self._serve, args=(conn, handle), daemon=True, name="hier-recv").start()
        self._connected = True

    def _dial(self, rank: int) -> Connection:
        ep = self.ctx.workers[rank]
        conn = dial(ep.ip, ep.port, self._peer(rank), self.ctx.connect_timeout_s, Hello(self.rank, self.n))
        self._conns.append(conn)
        return conn

    def _leader_handshake(self) -> dict[int, Connection]:
        """Members wait in the backlog while the leader connects to the next leader."""
        with Acceptor("0.0.0.0", self.ctx.workers[self.rank].port, Hello(self.rank, self.n),
                      self.ctx.connect_timeout_s, self._peer) as acceptor:
            if self.L > 1:
                self._right_conn = self._dial(self.right_rank)
            conns = acceptor.accept(set(self.members) | ({self.left_rank} if self.L > 1 else set()))
        self._conns += conns.values()
        return conns

    # ------------------------------------------------------------------ BucketCollective hooks
    def _ready_at_launch(self, rb: HierBucket, it: int) -> list[tuple[int, list]]:
        """A leader's chunks whose members are all in already (all of them, without members)."""
        return [(c, parts) for c in range(len(rb.chunks)) if (parts := self._take(rb, it, c)) is not None]

    def _bye(self) -> int:
        """Every outbox sends its BYE; the previous leader hears ours on the connection it
        sends on. Wait for each member, both ring neighbours and our leader."""
        for ob in self._outboxes:
            ob.close()
        if self.left is not None:
            try:
                self.left.send(Kind.BYE, sender=self.rank)
            except CommError:
                pass
        return len(self.members) + (2 if self.right is not None else 0) + (1 if self.up is not None else 0)

    def _connections(self) -> list[Connection]:
        return self._conns

    # ------------------------------------------------------------------ data path
    def _take(self, rb: HierBucket, it: int, c: int) -> list | None:
        """A leader's members' chunk c of `it` once all are in, taken (caller holds the lock)."""
        if not self.members:
            return [] if self.is_leader else None
        parts = rb.parts.get((it, c))
        if parts is None or any(p is None for p in parts):
            return None
        del rb.parts[(it, c)]
        return parts

    def _launch(self, rb: HierBucket, it: int, ready: list[tuple[int, list]]) -> None:
        for key in rb.spec.keys:
            self.event("send", key, 0, it)
        if self.n == 1:
            np.copyto(rb.out, rb.inp)
            self._finished(rb, it, len(rb.chunks))
        elif not rb.chunks:  # an empty bucket: nothing to reduce
            self._finished(rb, it, 0)
        elif not self.is_leader:
            self.up.put_many([(order, Kind.PUSH, rb.spec.index, c, it, rb.inp[ch.lo:ch.hi], 0, None)
                              for c, ch, order in self._upload_order(rb, it)])
        else:
            for c, parts in ready:
                self._group_sum(rb, c, it, parts)

    def _upload_order(self, rb: HierBucket, it: int) -> list[tuple[int, Chunk, tuple]]:
        """A member's chunks with their outbox order: the j-th chunk of every segment, in the
        order the leader's reduce-scatter reaches the segments, before the (j+1)-th of any.
        So the leader's ring gets every segment at once, as ring.py starts them, and averages
        come back from the first chunks on. (Segment by segment in ring order instead, the
        last segment's averages, hence the broadcast, would wait for the last 1/L of the
        upload.)"""
        first: dict[int, int] = {}
        return [(c, ch, (it, rb.spec.index, c - first.setdefault(ch.segment, c), (self.pos - ch.segment - 1) % self.L))
                for c, ch in enumerate(rb.chunks)]

    def _group_sum(self, rb: HierBucket, c: int, it: int, parts: list[np.ndarray]) -> None:
        """Our own and every member's chunk c are in: add them (rank order), then start the
        chunk's reduce-scatter, or pass the sum on if a partial from the left waits for it."""
        ch = rb.chunks[c]
        mine = rb.inp[ch.lo:ch.hi]
        for p in parts:
            mine += p
        if self.L == 1:
            np.divide(mine, self.n, out=rb.out[ch.lo:ch.hi])
            self._deliver(rb, c, it)
            return
        if ch.segment == (self.pos - 1) % self.L:
            self.right.put((it, rb.spec.index, 0, c), Kind.PUSH, rb.spec.index, c, it, mine)
            return
        with self._cv:
            partial = rb.early.pop((it, c), None)
            if partial is None:
                rb.summed.add((it, c))
                return
        self._reduce(rb, c, it, partial)

    def _reduce(self, rb: HierBucket, c: int, it: int, partial: np.ndarray) -> None:
        """ring.py's step: add our group sum to the partial sum of chunk c from the left, then
        pass it on or, when the segment is ours, average it and start its all-gather."""
        ch = rb.chunks[c]
        partial += rb.inp[ch.lo:ch.hi]
        b = rb.spec.index
        if ch.segment == self.pos:
            res = rb.out[ch.lo:ch.hi]
            np.divide(partial, self.n, out=res)
            self.right.put((it, b, -(self.L - 1), c), Kind.RESULT, b, c, it, res)
            self._deliver(rb, c, it)
        else:
            stage = (self.pos - ch.segment - 1) % self.L
            self.right.put((it, b, -stage, c), Kind.PUSH, b, c, it, partial)

    def _gather(self, rb: HierBucket, c: int, it: int) -> None:
        """The average of chunk c has landed in `out`: pass it on unless the next leader owns it."""
        ch = rb.chunks[c]
        if (self.pos + 1) % self.L != ch.segment:
            b = rb.spec.index
            stage = self.L - 1 + (self.pos - ch.segment) % self.L
            self.right.put((it, b, -stage, c), Kind.RESULT, b, c, it, rb.out[ch.lo:ch.hi])
        self._deliver(rb, c, it)

    def _deliver(self, rb: HierBucket, c: int, it: int) -> None:
        """The average of chunk c is in `out`: to every member, and it is done here."""
        ch, b = rb.chunks[c], rb.spec.index
        for ob in self.down:
            ob.put((it, b, c), Kind.RESULT, b, c, it, rb.out[ch.lo:ch.hi])
        self._finished(rb, it, 1)

    # ------------------------------------------------------------------ receiving
    def _serve(self, conn: Connection, handle: Callable) -> None:
        """Frames from one peer until its BYE or ABORT; anything else that goes wrong fails the job."""
        try:
            while True:
                h = conn.recv_header()
                if h.kind in (Kind.BYE, Kind.ABORT):
                    self._peer_ends(conn, h)
                    return
                handle(conn, h, *self._target(conn, h))
        except BaseException as e:  # noqa: BLE001 - every failure ends the job, loudly
            self._fail(str(e))

    def _on_member(self, j: int) -> Callable:
        """Leader: member j's (index in `members`) chunks of its gradients."""
        def handle(conn: Connection, h, rb: HierBucket, ch: Chunk) -> None:
            if h.kind != Kind.PUSH:
                raise CommError(f"{conn.peer} sent unexpected {h.kind.name}")
            part = conn.recv_array(h.nbytes)
            with self._cv:
                parts = rb.parts.setdefault((h.it, h.chunk), [None] * len(self.members))
                if parts[j] is not None:
                    raise CommError(f"{conn.peer} sent chunk {h.key}/{h.chunk} of iteration {h.it} twice")
                parts[j] = part
                ready = self._take(rb, h.it, h.chunk) if rb.launched_it == h.it else None
            if ready is not None:
                self._group_sum(rb, h.chunk, h.it, ready)
        return handle

    def _on_left(self, conn: Connection, h, rb: HierBucket, ch: Chunk) -> None:
        """Leader: partial sums (PUSH) and averages (RESULT) from the previous leader."""
        if h.kind == Kind.PUSH:
            partial = conn.recv_array(h.nbytes)
            with self._cv:
                ready = (h.it, h.chunk) in rb.summed
                if ready:
                    rb.summed.discard((h.it, h.chunk))
                else:
                    rb.early[(h.it, h.chunk)] = partial
            if ready:
                self._reduce(rb, h.chunk, h.it, partial)
        elif h.kind == Kind.RESULT:
            self._check_launched(conn, h, rb)
            conn.recv_into(memoryview(rb.out[ch.lo:ch.hi]))
            self._gather(rb, h.chunk, h.it)
        else:
            raise CommError(f"{conn.peer} sent unexpected {h.kind.name}")

    def _on_result(self, conn: Connection, h, rb: HierBucket, ch: Chunk) -> None:
        """Member: the averages from the leader."""
        if h.kind != Kind.RESULT:
            raise CommError(f"{conn.peer} sent unexpected {h.kind.name}")
        self._check_launched(conn, h, rb)
        conn.recv_into(memoryview(rb.out[ch.lo:ch.hi]))
        self._finished(rb, h.it, 1)

    def _on_backwards(self, conn: Connection, h, rb: HierBucket, ch: Chunk) -> None:
        """Leader: the connection to the next leader carries nothing back but BYE or ABORT."""
        raise CommError(f"{conn.peer} sent unexpected {h.kind.name} backwards")

    def _check_launched(self, conn: Connection, h, rb: HierBucket) -> None:
        if rb.launched_it != h.it:
            raise CommError(f"{conn.peer} sent the average of bucket {h.key} for iteration {h.it} "
                            f"before we pushed it")

    def _abort(self, reason: str) -> None:
        abort_all(self._outboxes, reason)
        if self.left is not None:
            self.left.abort(reason, self.rank)
