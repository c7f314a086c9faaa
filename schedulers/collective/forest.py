"""Topology-adaptive forest all-reduce (Zhang, Wu and Li, INFOCOM 2021) among the workers.

Plan. Every worker computes the same plan from the capacity graph (`forest_plan.py`): trees
spanning all workers, rooted at different workers, each owning a slice of every gradient
sized to the tree's rate. Workers compare the plan's fingerprint when they connect. With
no capacity graph (`ctx.topology` None) a uniform star over the workers is assumed.

Slices. A tensor larger than one chunk is cut into one slice per tree in proportion to the
trees' fractions; a smaller one goes whole to the tree furthest behind its share (in key
order, so every worker decides alike). Slices are cut into chunks of `chunk_numel`.

Data path, per chunk. Reduce: a worker adds its own gradient and its children's partial
sums (in place: into the pushed gradient, which the worker hands over, or a received
buffer) and passes the sum to its parent the moment the last one is in; the root divides
by the number of workers. Broadcast: the average goes down the
tree, each worker keeping a copy and forwarding it to its children as it arrives. All
trees and all chunks run at once over one connection per pair of tree neighbours, so
aggregation of later chunks overlaps the broadcast of earlier ones. On a shared link,
frames go by iteration, layer priority (nearest the input first), then how far into its
tree's slice a chunk is, which interleaves trees in proportion to their slices
(`priority: false`: in the order they became ready, for comparison).

Chunk size. Every chunk costs a fixed amount of Python time on top of its bytes, so small
chunks waste CPU; but a chunk is forwarded only once all of it is in, so every tree level
adds one chunk's transfer time, twice (reduce and broadcast). So a tree's chunks take at most
`chunk_ms` (8 ms) at its planned rate, between `min_chunk_kb` (16 KiB) and `chunk_numel`
(64 KiB, which a tree reaches at 65 Mb/s). At 64 KiB on the 14 Mb/s of a contended rack uplink
each level cost 37 ms where the iteration's bound was 218 ms; 16 KiB chunks took that forest
from 0.71-0.76 of its bound to 0.86-0.88. Smaller chunks gained nothing there (8 KiB 0.88,
4 KiB 0.86) and cost CPU where many slow trees share fast links (a star of 6 at 100 Mb/s, 6
trees of 9 Mb/s: 9 KiB chunks took the CPU idle to 17%). Where a tree's slice is only a few 16
KiB chunks (20 workers, 15-19 trees, the small CNN), its levels barely overlap: 4 KiB took such
a forest from 0.61-0.65 of its bound to 0.71-0.81, given the CPU for 4x the frames (time
dilation 8; at 4 the CPU idle fell to 0.12-0.24), 2 KiB at dilation 16 to 0.82-0.85
(pipeline share 0.91), and 1 KiB at 32 to 0.86-0.89 (share 0.95; configs/sweeps/forest_scale.yaml).
Uniform sites (9 workers) show the same: their 11 trees have depth 2 and sit at the 16 KiB
floor, so the tree that sets the iteration has a pipeline share (analysis/forest_trees.py:
slice / (slice + 3 chunks)) of 0.77-0.82 and reached 0.73-0.85 of its plan; 4 KiB chunks raise
that share to 0.87-0.92 and took the forest from 0.73-0.83 of its bound to 0.85-0.92, given
time dilation 2-4 for their CPU (undilated, 4-8 KiB chunks took the CPU idle to 0.08-0.34;
configs/examples/forest_chunks.yaml).

Pacing (`pace`, on by default). Each connection is capped (SO_MAX_PACING_RATE, TCP's own
pacing, no fq needed) at the plan's rate for its pair of workers, the sum of the rates of the
trees that join them, times `pace_margin` (1.15), and never below its largest chunk in
chunk_ms (`pace_bytes_per_s`). Unpaced, TCP fills a slow link's queue (100 ms on a 15 Mb/s uplink whose
switch buffer was sized for 75), where the urgent chunks of the next layer wait, and loses to
an unresponsive tenant. Forest over its bound, unpaced / paced (9 iterations each, one run):
star 0.88 / 0.96, star with a 20x spread 0.99 / 0.99, sites 0.85 / 0.81, sites with a 20x WAN
spread 0.93 / 0.97, racks with a UDP tenant 0.64 / 0.91, 4 racks under 45 Mb/s of UDP each way
0.87 / 0.91; a 15 Mb/s uplink, 0.76 / 0.97. The cost: a hop runs at the pair's planned rate,
not the link's, so each tree level adds a chunk's time at that rate (uniform sites, 11 trees).
Pacing is only as good as the probe: when it read 2 Mb/s of a 5 Mb/s WAN, a paced forest ran
at 0.38 of its bound. The margin: headers take about 3.5%; the rest forgives a probe that
under-read (its estimates run 0.94-1.09 of a link's payload rate) and lets a tree that fell
behind catch up, where pacing above a link's rate costs little and below it costs the
difference. Forest over its bound at a margin of 1.05 / 1.1 / 1.15 / 1.2 (2-3 runs each, 22
measured iterations): sites 0.83 / 0.85 / 0.84 / 0.85, racks with a UDP tenant 0.85 / 0.86 /
0.91 / 0.90, 4 racks under 45 Mb/s of UDP each way 0.85 / 0.88 / 0.90 / 0.93; at 1.3 (one run)
0.82, 0.86, 0.93.

Failure. A connection that breaks, a protocol error, or a peer that said BYE while we still
need its data makes this worker fail with the reason (naming that peer) and send it as
ABORT to every peer, who pass it on: every worker raises a CommError naming the culprit.
The transport's keepalive bounds the time to notice a host that vanished silently.
"""
from __future__ import annotations

import array
import fcntl
import functools
import json
import math
import termios
import threading
import time
import zlib
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import numpy as np
from pydantic import Field, model_serializer

from contracts.forest_trees import KEY as TREES_KEY
from contracts.forest_trees import ForestTrees
from schedulers.api import CommError, RoleContext, Scheduler, SchedulerParams, TensorSpec
from schedulers.collective.bandwidth import probe_rounds, skeleton, structure
from schedulers.collective.forest_plan import DEFAULT_EPSILON, ForestPlan, Tree, plan_forest
from schedulers.collective.forest_record import (
    BROADCAST,
    REDUCE,
    TreeRecorder,
    configured_rates,
    epoch_plan,
    gather_tree,
)
from schedulers.collective.forest_replan import PROBE_FRAME, SHARED, Replanner
from schedulers.core.failure import Failure
from schedulers.transport.connection import (
    MIN_CHUNK_NUMEL,
    Connection,
    Kind,
    Outbox,
    abort_all,
    pace,
    stream_chunk_numel,
)
from schedulers.transport.peers import Acceptor, Hello, dial

PACE_MARGIN = 1.15             # pacing over the planned goodput (pace_margin): headers (3.5%) and the probe's error
CHUNK_MS = 8.0                 # a chunk's time at its tree's planned rate (ForestParams.chunk_ms)
PROBE_S = 0.25                 # one probe round (ForestParams.probe_s): 2.75 s for 9 workers; shorter reads noisier
REPLAN_PROBE_S = 0.1           # one round of a re-plan's probe (replan_probe_s): 0.2 s of rounds, 1.1 s if full
REPLAN_ROUNDS = SHARED         # a re-plan re-reads the links between switches only (replan_rounds)
FAN_ROUNDS = 1                 # the start-up probe's fan rounds, times over (ForestParams.fan_rounds)
MIN_CHUNK_KB = MIN_CHUNK_NUMEL * 4 // 1024   # 16: a slow tree's smallest chunk by default (min_chunk_kb)
LATER_DEFAULTS = {"chunk_ms": CHUNK_MS, "min_chunk_kb": MIN_CHUNK_KB, "pace": True, "replan_probe_s": REPLAN_PROBE_S,
                  "pace_margin": PACE_MARGIN, "fan_rounds": FAN_ROUNDS,
                  "replan_rounds": REPLAN_ROUNDS}   # tunables kept out of run ids at these


def pair_trees(trees: tuple[Tree, ...], rank: int) -> dict[int, list[int]]:
    """The trees (indices) that join `rank` to each of its tree neighbours."""
    out: dict[int, list[int]] = {}
    for k, t in enumerate(trees):
        for p in [t.parent[rank], *t.children(rank)]:
            if p >= 0:
                out.setdefault(p, []).append(k)
    return out


def pair_rates(trees: tuple[Tree, ...], rank: int) -> dict[int, float]:
    """Planned bit/s from `rank` to each tree neighbour: a tree edge carries its tree's rate
    both ways (partial sums up, averages down), so a pair's rate is the sum over the trees
    that join them (inf where a tree's rate is unbounded)."""
    return {p: sum(trees[k].rate for k in ks) for p, ks in pair_trees(trees, rank).items()}


def pace_bytes_per_s(pair_bps: float, largest_chunk_bytes: int, chunk_ms: float,
                     margin: float = PACE_MARGIN) -> float:
    """A connection's cap: its pair's planned rate times `margin` (headers and the probe's error),
    but never so low that the largest chunk of a tree it carries takes more than chunk_ms. A chunk is
    forwarded only once all of it is in, so each tree level costs a chunk's time twice; a tree
    of 1 Mb/s whose whole slice is one 9 KB chunk, paced at its rate, took 75 ms a level where
    the iteration's bound was 81 ms."""
    return max(pair_bps / 8 * margin, largest_chunk_bytes / (chunk_ms / 1000))


def tree_chunk_numel(rate_bps: float | None, chunk_ms: float, chunk_numel: int,
                     min_numel: int = MIN_CHUNK_NUMEL) -> int:
    """The largest chunk of a tree planned at `rate_bps`: what that rate moves in chunk_ms,
    within [min_numel, chunk_numel] (chunk_numel where the rate is unbounded)."""
    if rate_bps is None or not rate_bps > 0 or rate_bps == float("inf"):
        return chunk_numel
    numel = int(rate_bps / 8 * chunk_ms / 1000 / 4)
    return min(chunk_numel, max(min_numel, numel))


class ForestParams(SchedulerParams):
    requires_servers: ClassVar[bool] = False
    chunk_numel: int = Field(default=16_384, gt=0, le=16_777_216,
                             description="largest chunk, floats (64 KiB; see the module docstring)")
    priority: bool = Field(default=True, description="send the layers nearest the input first (Mercury's "
                                                      "order, inside the trees); false: first come, first sent")
    chunk_ms: float = Field(default=CHUNK_MS, gt=0, le=10_000, allow_inf_nan=False,
                            description="longest time a chunk takes at its tree's planned rate, ms: each tree "
                                        "level holds a chunk until all of it is in, so a tree on slow links gets "
                                        "smaller chunks (not under min_chunk_kb, never over chunk_numel)")
    min_chunk_kb: int = Field(default=MIN_CHUNK_KB, ge=1, le=65_536,
                              description="smallest chunk a slow tree gets, KiB: smaller chunks pipeline a tree's "
                                          "levels better where its slice is a few chunks, at a Python cost per frame "
                                          "(see the module docstring)")
    pace: bool = Field(default=True,
                       description="cap each connection's sending rate (SO_MAX_PACING_RATE) at the plan's rate for "
                                   "that pair of workers (the sum of the rates of the trees that join them) plus "
                                   "pace_margin, and no lower than its largest "
                                   "chunk in chunk_ms; off while a probe measures. It keeps a slow link's queue short "
                                   "and avoids losses to an unresponsive tenant; false: TCP shares the links as it "
                                   "will (see the module docstring)")
    pace_margin: float = Field(default=PACE_MARGIN, ge=1, le=4, allow_inf_nan=False,
                               description="with pace: the cap over the plan's rate for a pair of workers (a "
                                           "factor): headers take about 3.5%, the rest forgives a probe that "
                                           "under-read and lets a tree that fell behind catch up (see the module "
                                           "docstring)")
    slice_chunks: int = Field(default=8, ge=1, le=4096,
                              description="cut each tree's slice of a tensor into at least this many chunks "
                                          "(a count; none under 4096 floats, 16 KiB)")
    epsilon: float = Field(default=DEFAULT_EPSILON, gt=0, lt=0.5,
                           description="a fraction recorded with the plan; the plan is the exact LP optimum (it was "
                                       "the accuracy of the Garg-Konemann planner this replaced)")
    bandwidth: Literal["measured", "configured"] = Field(
        default="measured", description="measured: plan on what a probe at start-up measures and re-plan when "
        "the all-reduce time changes (forest_replan.py); configured: plan once on the capacity graph's rates")
    probe_s: float = Field(default=PROBE_S, gt=0.05, le=10,
                           description="length of one round of the start-up probe, seconds (n + 2 rounds, back "
                                       "to back)")
    replan_probe_s: float = Field(default=REPLAN_PROBE_S, gt=0.05, le=10,
                                  description="length of one round of a re-plan's probe, seconds: the job waits for "
                                              "it mid-run, where the start-up probe is paid once, so it is shorter "
                                              "and reads noisier (see forest_replan.py)")
    fan_rounds: int = Field(default=FAN_ROUNDS, ge=1, le=8,
                            description="how many times the start-up probe runs its fan rounds (a count): one "
                                        "round per worker, which alone saturates that worker's own link (see "
                                        "bandwidth.py)")
    replan_rounds: Literal["shared", "all"] = Field(
        default=REPLAN_ROUNDS, description="which probe rounds a re-plan runs: shared, all-to-all and the ring, which "
        "saturate the links between switches, keeping each worker's own link at its last full estimate (a re-plan "
        "due before the plan of such a probe ran steadily, or on a star, probes every link); all: the fan rounds "
        "too, one per worker (see forest_replan.py)")
    replan_threshold: float = Field(default=0.25, gt=0, le=10,
                                    description="re-plan when an iteration's all-reduce time leaves "
                                                "[ref / (1 + t), ref * (1 + t)]; t a fraction (0.25: 25 percent)")

    @model_serializer(mode="wrap")
    def _without_later_defaults(self, handler):
        """The tunables added after the first sweeps (LATER_DEFAULTS) are left out of the dump at their
        defaults, so the run ids of configs that do not set them stay as they were (a sweep still resumes)."""
        d = handler(self)
        for name, default in LATER_DEFAULTS.items():
            if getattr(self, name) == default:
                d.pop(name, None)
        return d


@functools.lru_cache(maxsize=8)
def _cached_plan(topology_json: str | None, hosts: tuple[str, ...], epsilon: float) -> ForestPlan:
    """Workers of one process (loopback tests) share the plan instead of each solving it."""
    return plan_forest(None if topology_json is None else json.loads(topology_json), list(hosts), epsilon)


# ---------------------------------------------------------------------------- slices
@dataclass(frozen=True)
class Chunk:
    tree: int
    lo: int
    hi: int
    pos: float      # how far into its tree's slice of the tensor (0 = first chunk)


def _queued(conn: Connection) -> int:
    """Bytes the socket holds unread (FIONREAD): what came in before its header was read."""
    buf = array.array("i", [0])
    try:
        fcntl.ioctl(conn.sock.fileno(), termios.FIONREAD, buf)
    except (OSError, ValueError):
        return 0
    return buf[0]


LATE_REFUSAL_S = 0.5    # how long a worker that failed at start-up still answers connecting peers


def layout(tensors: list[TensorSpec], fractions: list[float], chunk_numel: int,
           slice_chunks: int = 1, largest: list[int] | None = None) -> dict[int, list[Chunk]]:
    """Chunks of every tensor, by key; identical on every worker for the same inputs. A slice
    streams in at least `slice_chunks` chunks of at most chunk_numel, or of at most its
    tree's `largest` where given (transport.stream_chunk_numel).

    Tensors up to chunk_numel go whole, each to the tree furthest behind its share; the
    larger ones are then cut in the proportions that bring every tree to its share of the
    whole gradient. Cutting them by the fractions alone left a tree up to a small tensor over
    its share (12-14% on 11-tree plans of the small CNN), and a tree paced at its planned rate
    then sets the iteration."""
    n = len(fractions)
    ordered = sorted(tensors, key=lambda s: s.key)
    load = [0] * n
    slices: dict[int, list[tuple[int, int, int]]] = {}
    small_total = 0
    for t in (t for t in ordered if t.numel <= chunk_numel):
        k = max(range(n), key=lambda k: (fractions[k] * (small_total + t.numel) - load[k], -k))
        slices[t.key] = [(k, 0, t.numel)]
        load[k] += t.numel
        small_total += t.numel
    total = sum(t.numel for t in ordered)
    residual = [max(0.0, f * total - got) for f, got in zip(fractions, load, strict=True)]
    shares = [r / sum(residual) for r in residual] if sum(residual) > 0 else list(fractions)
    bounds_of = np.cumsum(shares)
    for t in (t for t in ordered if t.numel > chunk_numel):
        cuts = [0] + [int(round(t.numel * b)) for b in bounds_of[:-1]] + [t.numel]
        slices[t.key] = [(k, cuts[k], cuts[k + 1]) for k in range(n)]
    out: dict[int, list[Chunk]] = {}
    for t in ordered:
        chunks = []
        for k, lo, hi in slices[t.key]:
            size = stream_chunk_numel(hi - lo, slice_chunks, chunk_numel if largest is None else largest[k])
            starts = range(lo, hi, size)
            chunks += [Chunk(k, a, min(a + size, hi), q / len(starts)) for q, a in enumerate(starts)]
        out[t.key] = chunks
    return out


@dataclass(eq=False)
class Slot:
    """One chunk of one iteration being reduced here: our sum so far and who is in it."""

    acc: np.ndarray | None = None
    local: bool = False
    got: set[int] = field(default_factory=set)


# ---------------------------------------------------------------------------- scheduler
class Forest(Scheduler):
    name = "forest"
    Params = ForestParams
    family = "collective"
    bound_model = "tree_packing"  # the LP optimum of spanning-tree packing its planner targets
    display_order = 6
    claims = {"forest-heterogeneous": "claimed"}
    report_sections = ("forest_compare", "replan", "forest_trees")

    @classmethod
    def startup_s(cls, params: ForestParams, num_workers: int) -> float:
        """The start-up probe's rounds, on measured bandwidth: 22 of 0.25 s for 20 workers."""
        if params.bandwidth != "measured":
            return 0.0
        return len(probe_rounds(num_workers, params.fan_rounds)) * params.probe_s

    def __init__(self, ctx: RoleContext, params: ForestParams):
        super().__init__(ctx, params)
        if len(ctx.workers) != ctx.num_workers:
            raise ValueError(f"forest needs every worker's endpoint: got {len(ctx.workers)} for "
                             f"{ctx.num_workers} workers")
        self.n, self.rank = ctx.num_workers, ctx.rank
        hosts = [w.host for w in ctx.workers]
        self.replanner: Replanner | None = None
        self.plans: list[dict[str, Any]] = []   # every plan's record: when, why, on what rates
        self.record = TreeRecorder(self.rank)   # what each tree achieved (forest_record.py); observes only
        self._configured = configured_rates(ctx.topology)
        self._records_in: dict[int, ForestTrees] = {}   # close(): the gather tree's children's records
        graph, nodes, model = structure(ctx.topology, hosts)
        self._model = model
        if params.bandwidth == "measured" and self.n > 1:
            self.replanner = Replanner(self, graph, nodes, model, (params.probe_s, params.replan_probe_s),
                                       params.replan_threshold,
                                       params.epsilon, assumed=graph is not ctx.topology,
                                       fan_rounds=params.fan_rounds, replan_rounds=params.replan_rounds)
            self._fingerprint = zlib.crc32(json.dumps(["measured", hosts, skeleton(ctx.topology)]).encode())
            self.peers = [p for p in range(self.n) if p != self.rank]   # any two may share a tree later
            self._plan: ForestPlan | None = None
            self.plan, self.trees, self.parent, self.children = {}, (), [], []
        else:
            topo = None if ctx.topology is None else json.dumps(ctx.topology, sort_keys=True)
            plan = _cached_plan(topo, tuple(hosts), params.epsilon)
            self._fingerprint = plan.digest()
            self._set_plan(plan)
            self.record.add_plan(epoch_plan(0, plan, model, None, self._configured))
            self.peers = sorted({p for p in self.parent if p >= 0} | {c for cs in self.children for c in cs})
        self._failure = Failure(f"worker {self.rank}")
        self._cv = self._failure.cv
        self._ended: set[int] = set()          # peers that said BYE
        self._gone: set[int] = set()           # peers whose receive thread has ended, for any reason
        self._slots: dict[tuple[int, int, int], Slot] = {}
        self._pending: dict[tuple[int, int], set[int]] = {}   # (key, it) -> chunks not averaged yet
        self._pushed: dict[int, int] = {}
        self._done: dict[int, int] = {}
        self.conns: dict[int, Connection] = {}
        self.outboxes: dict[int, Outbox] = {}
        self._caps: dict[int, float] = {}      # pacing: bytes/s per tree neighbour under the plan

    def _peer(self, rank: int) -> str:
        ep = self.ctx.workers[rank]
        return f"worker {rank} ({ep.host} {ep.ip}:{ep.port})"

    # ------------------------------------------------------------------ setup
    def info(self) -> dict[str, Any]:
        trace = self.replanner.trace if self.replanner is not None else []
        return {"plan": self.plan, "plans": self.plans, "allreduce_s": trace,
                TREES_KEY: self.record.record().model_dump(mode="json")}

    def _set_plan(self, plan: ForestPlan) -> None:
        self._plan = plan
        self.plan: dict[str, Any] = plan.to_dict()   # JSON: save it with the run
        self.trees: tuple[Tree, ...] = plan.trees
        self.parent = [t.parent[self.rank] for t in self.trees]
        self.children = [t.children(self.rank) for t in self.trees]

    def install(self, plan: ForestPlan, record: dict[str, Any]) -> None:
        """A new plan from worker 0, between iterations (nothing in flight). Lock held."""
        if self._pending or self._slots:
            raise CommError(f"a new plan arrived with chunks of iterations {sorted(self._pending)} in flight")
        self._set_plan(plan)
        self.plans.append(record)
        assumed = record.get("capacity_bps") or {}
        capacity = [assumed.get(f"{u}>{v}", float("nan")) for u, v in self._model.links]
        self.record.add_plan(epoch_plan(len(self.record.plans), plan, self._model, capacity, self._configured))
        self._set_chunks(list(self.specs.values()))
        for p in list(self.conns):
            self._pace(p)

    def _set_chunks(self, tensors: list[TensorSpec]) -> None:
        """The plan's chunks: each tree's no longer than chunk_ms at its planned rate; and the
        pacing cap (bytes/s) of each tree neighbour: its pair's planned rate, floored by the
        largest chunk of the trees that join them (`pace_bytes_per_s`)."""
        p = self.params
        most = [tree_chunk_numel(t.rate, p.chunk_ms, p.chunk_numel, p.min_chunk_kb * 256) for t in self.trees]
        self.chunks = layout(tensors, [t.fraction for t in self.trees], p.chunk_numel, p.slice_chunks, most)
        self._keys = sum(1 for c in self.chunks.values() if c)
        largest = [0] * len(self.trees)
        for chunks in self.chunks.values():
            for ch in chunks:
                largest[ch.tree] = max(largest[ch.tree], 4 * (ch.hi - ch.lo))
        # A plan on an assumed star without a probe has rates in units of its links, not bit/s.
        real = self.replanner is not None or not self._plan.assumed_topology
        joining, rates = pair_trees(self.trees, self.rank), pair_rates(self.trees, self.rank)
        self._caps = {peer: pace_bytes_per_s(rates[peer], max(largest[k] for k in ks), p.chunk_ms, p.pace_margin)
                      for peer, ks in joining.items() if real and math.isfinite(rates[peer])}

    def start(self, tensors: list[TensorSpec]) -> None:
        self.specs = {t.key: t for t in tensors}
        self.out = {t.key: np.empty(t.numel, np.float32) for t in tensors}
        self._pushed = {t.key: -1 for t in tensors}
        self._done = {t.key: -1 for t in tensors}
        self._iter_left: dict[int, int] = {}     # iteration -> keys not averaged yet
        self._last_it = 0                         # the latest iteration pushed (0: start() probes)
        if self._plan is not None:
            self._set_chunks(tensors)
        if self.peers:
            self._connect()
        if self.replanner is not None:
            self.replanner.gradient_bits = 32.0 * sum(t.numel for t in tensors)
            self.replanner.enter(0)

    def _connect(self) -> None:
        """Higher ranks connect to lower ones; both sides send HELLO (rank, number of workers,
        plan fingerprint) and check the other's, so mismatched plans fail at once. Each
        connection is read from as soon as it is up, so an ABORT during start-up ends it."""
        deadline = time.monotonic() + self.ctx.connect_timeout_s
        me = Hello(self.rank, self.n, self._fingerprint)
        lower = [p for p in self.peers if p < self.rank]
        higher = {p for p in self.peers if p > self.rank}
        stop = threading.Event()
        accept_errors: list[BaseException] = []
        acceptor = None
        if higher:
            listener = Acceptor("0.0.0.0", self.ctx.workers[self.rank].port, me, self.ctx.connect_timeout_s,
                                self._peer)
            acceptor = threading.Thread(target=self._accept, daemon=True, name="forest-accept",
                                        args=(listener, higher, deadline, stop, accept_errors))
            acceptor.start()
        try:
            for p in lower:
                ep = self.ctx.workers[p]
                self._attach(p, dial(ep.ip, ep.port, self._peer(p), max(deadline - time.monotonic(), 0.1), me,
                                     expect=p, check=self._same_plan))
                self._failure.check()
            while acceptor is not None and acceptor.is_alive():
                acceptor.join(0.2)
                self._failure.check()
            if accept_errors:
                raise accept_errors[0]
            self._failure.check()
        except BaseException as e:
            self._fail(str(e))          # first, so peers still connecting are told why; no-op after an ABORT
            stop.set()
            if acceptor is not None:
                acceptor.join()
            self._failure.check()
            raise

    def _accept(self, listener: Acceptor, expected: set[int], deadline: float, stop: threading.Event,
                errors: list) -> None:
        """The acceptor thread: the higher-ranked peers, each attached as it comes; after a
        failure, those still missing are answered with the reason for LATE_REFUSAL_S."""
        try:
            listener.accept(expected, self._same_plan, reply=True, deadline=deadline, stop=stop,
                            on_accept=self._attach)
        except BaseException as e:  # noqa: BLE001 - handed to start(), which fails loudly
            errors.append(e)
        try:
            if listener.waiting:
                reason = str(errors[0]) if errors else self._failure.reason
                listener.turn_away(reason or f"worker {self.rank} failed while starting",
                                   min(deadline - time.monotonic(), LATE_REFUSAL_S))
        finally:
            listener.close()

    def _attach(self, p: int, conn: Connection) -> None:
        """A connection that passed HELLO: give it an outbox and a receive thread."""
        on_send = None
        if self.ctx.trace:
            def on_send(kind, key, chunk, it):   # partial sums up and averages down alike
                self.event("send", key, chunk, it)
        with self._cv:
            self.conns[p] = conn
            ob = self.outboxes[p] = Outbox(conn, lambda e: self._fail(str(e)), sender=self.rank, on_send=on_send)
            failed = self._failure.reason
            self._pace(p)
        if failed is not None:   # we failed while this one was connecting: it must hear why
            ob.abort(failed)
            return
        threading.Thread(target=self._receive, args=(p,), daemon=True, name=f"forest-recv-{p}").start()

    def _pace(self, p: int, capped: bool = True) -> None:
        """With `pace`: cap the connection to p at the plan's rate for the pair, or lift the
        cap (`capped` false, no plan yet, not a tree neighbour, an unbounded rate, rates not in
        bit/s). Without it the socket is left as the kernel made it. Lock held."""
        if not self.params.pace:
            return
        try:
            pace(self.conns[p].sock, self._caps.get(p) if capped else None)
        except OSError:
            pass   # a closed socket: its receive thread reports why

    def unpace(self) -> None:
        """Lift every cap: a probe measures what the links give, not the plan. Lock held."""
        for p in list(self.conns):
            self._pace(p, capped=False)

    def _same_plan(self, conn: Connection, h) -> None:
        """A peer's HELLO (rank and size checked already) must carry our plan's fingerprint."""
        if h.chunk != self._fingerprint:
            raise CommError(f"{conn.peer} computed a different forest plan (fingerprint {h.chunk:08x}, "
                            f"ours {self._fingerprint:08x}): same code, parameters and capacity graph "
                            "everywhere?")

    # ------------------------------------------------------------------ API
    def push(self, key: int, grad: np.ndarray, it: int) -> None:
        grad = np.asarray(grad, np.float32).reshape(-1)
        if grad.size != self.specs[key].numel:
            raise ValueError(f"key {key}: pushed {grad.size} elements, expected {self.specs[key].numel}")
        if self.replanner is not None and it > self._last_it:
            self.replanner.enter(it)          # the first push of an iteration: a probe may be due
            self._last_it = it
        chunks = self.chunks[key]
        with self._cv:
            self._failure.check()
            if it <= self._pushed[key]:
                raise ValueError(f"key {key}: pushed iteration {it} after {self._pushed[key]}")
            self._pushed[key] = it
            self.record.pushed(it, len(self.record.plans) - 1)
            self._iter_left.setdefault(it, self._keys)
            if self.replanner is not None:
                self.replanner.pushed(it)
            if not chunks:
                self._done[key] = it
                self._cv.notify_all()
                return
            self._pending[(key, it)] = set(range(len(chunks)))
            for c, ch in enumerate(chunks):
                self._add(key, c, it, -1, grad[ch.lo:ch.hi])

    def wait(self, key: int, it: int) -> np.ndarray:
        with self._cv:
            if self._pushed[key] < it:
                raise ValueError(f"wait({key}, {it}) before that gradient was pushed")
            while self._done[key] < it:
                self._failure.check()
                culprit = self._needs_ended_peer(key, it)
                if culprit is not None:
                    break
                self._cv.wait(1.0)
            else:
                return self.out[key]
        reason = f"{self._peer(culprit)} ended its session (BYE) while iteration {it} still needed it"
        self._fail(reason)
        raise self._failure.error(reason)

    def close(self) -> None:
        """Finish what was pushed, then BYE to every peer and wait for theirs, so no byte in
        flight is cut off. Closing with work unfinished is a failure (ABORT)."""
        with self._cv:
            if self._failure.closing:
                return
            self._cv.wait_for(lambda: self._failure.failed or not self._pending, self.ctx.connect_timeout_s)
            failed = self._failure.failed
            unfinished = not failed and bool(self._pending)
            self._failure.closing = True
        if unfinished:
            self._abort(f"{self._peer(self.rank)} closed with iterations unfinished")
            return
        if failed:
            self._failure.told()   # a failure's ABORTs are out before the caller may exit
            return
        up, down = self._gather_tree()
        for p, ob in self.outboxes.items():   # BYE at once to all but the gather parent: a peer still
            if p != up:                       # working then fails as before, and we stop waiting for it
                ob.close()
        self._gather_records(up, down)
        if up in self.outboxes:
            self.outboxes[up].close()
        with self._cv:
            self._cv.wait_for(lambda: self._gone >= set(self.conns), self.ctx.connect_timeout_s)
        for conn in self.conns.values():
            conn.close()

    def _gather_tree(self) -> tuple[int, list[int]]:
        """Our parent (-1 at worker 0) and children in a BFS tree from worker 0 over the
        connections (every pair under measured bandwidth, tree neighbours under configured)."""
        if self.n < 2:
            return -1, []
        if self.replanner is not None:
            adjacency = [set(range(self.n)) - {u} for u in range(self.n)]
        else:
            adjacency = [set() for _ in range(self.n)]
            for t in self.trees:
                for v, p in enumerate(t.parent):
                    if p >= 0:
                        adjacency[v].add(p)
                        adjacency[p].add(v)
        parent, children = gather_tree(self.n, adjacency)
        return parent[self.rank], children[self.rank]

    def _gather_records(self, up: int, mine: list[int]) -> None:
        """Pass the per-tree records up the gather tree: wait for the children's (one that is
        gone is left out), merge, send the sum to the parent, before its BYE. After the last
        iteration, so it costs no iteration time."""
        with self._cv:
            self._cv.wait_for(lambda: self._failure.failed or all(c in self._records_in or c in self._gone
                                                                  for c in mine), self.ctx.connect_timeout_s)
            for c in mine:
                if c in self._records_in:
                    self.record.merge(self._records_in.pop(c))
            if self._failure.failed or up not in self.outboxes:
                return
        body = json.dumps({"t": TREES_KEY, "it": 0, "record": self.record.record().model_dump(mode="json")})
        self.outboxes[up].put((-1,), Kind.CTRL, 0, 0, 0, np.frombuffer(body.encode(), np.uint8))

    # ------------------------------------------------------------------ data path
    def _add(self, key: int, c: int, it: int, src: int, data: np.ndarray) -> None:
        """Count one contribution to chunk c (src -1: our own gradient); when the last is in,
        pass the sum up, or average it at the root. Called with the lock held."""
        ch = self.chunks[key][c]
        slot = self._slots.setdefault((key, c, it), Slot())
        if src < 0:
            slot.local = True
        elif src in slot.got:
            raise CommError(f"{self._peer(src)} sent chunk {key}/{c} of iteration {it} twice")
        else:
            slot.got.add(src)
        if slot.acc is None:
            slot.acc = data                     # ours to modify: pushed or freshly received
        else:
            slot.acc += data
        if not slot.local or len(slot.got) < len(self.children[ch.tree]):
            return
        del self._slots[(key, c, it)]
        parent = self.parent[ch.tree]
        if parent >= 0:
            self.outboxes[parent].put(self._order(key, ch, it), Kind.PUSH, key, c, it, slot.acc,
                                      self.specs[key].priority)
        else:
            # A new array: the sum may live in the pushed gradient, which the worker may
            # reuse once wait() returns, before this average has gone down the tree.
            self._deliver(key, c, it, np.divide(slot.acc, np.float32(self.n)))

    def _deliver(self, key: int, c: int, it: int, avg: np.ndarray) -> None:
        """The average of chunk c: keep it and pass it down. Called with the lock held."""
        ch = self.chunks[key][c]
        pending = self._pending[(key, it)]
        self.out[key][ch.lo:ch.hi] = avg
        for child in self.children[ch.tree]:
            self.outboxes[child].put(self._order(key, ch, it), Kind.RESULT, key, c, it, avg,
                                     self.specs[key].priority)
        pending.discard(c)
        self.record.delivered(it, ch.tree)
        if not pending:
            del self._pending[(key, it)]
            self._done[key] = it
            self._cv.notify_all()
            self.event("recv", key, 0, it)
            self._iter_left[it] -= 1
            if not self._iter_left[it]:
                del self._iter_left[it]
                if self.replanner is not None:
                    self.replanner.iteration_done(it)

    def _order(self, key: int, ch: Chunk, it: int) -> tuple:
        if not self.params.priority:
            return (it,)  # the outbox breaks ties in the order frames were queued: first come, first sent
        return (it, self.specs[key].priority, key, ch.pos, ch.tree)

    def _receive(self, p: int) -> None:
        conn = self.conns[p]
        scratch = bytearray(PROBE_FRAME.nbytes)
        try:
            while True:
                h = conn.recv_header()
                if h.kind == Kind.ABORT:
                    self._fail(conn.recv_text(h.nbytes) or f"{conn.peer} aborted")
                    return
                if h.kind == Kind.BYE:
                    with self._cv:
                        self._ended.add(p)
                        self._cv.notify_all()
                    return
                if h.kind == Kind.PROBE:
                    conn.recv_into(memoryview(scratch)[:h.nbytes])
                    continue
                if h.kind == Kind.CTRL:
                    msg = json.loads(conn.recv_text(h.nbytes))
                    if msg.get("t") == TREES_KEY:      # close(): a peer's per-tree record
                        got = ForestTrees.model_validate(msg["record"])
                        with self._cv:
                            self._records_in[p] = got
                            self._cv.notify_all()
                        continue
                    if self.replanner is None:
                        raise CommError(f"{conn.peer} sent a control message {msg.get('t')!r} we do not expect")
                    with self._cv:
                        self.replanner.on_message(p, msg)
                    continue
                if self.replanner is not None and self.replanner.busy is not None:
                    self.replanner.hold(h.it)   # a peer on the new plan: wait until we have it too
                ch = self._check_frame(conn, p, h)
                first = time.time()
                early = _queued(conn) if self.record.is_new(h.it, ch.tree, p) else 0
                data = conn.recv_array(h.nbytes)
                last = time.time()
                with self._cv:
                    self.record.frame(h.it, ch.tree, p, REDUCE if h.kind == Kind.PUSH else BROADCAST, h.nbytes,
                                      first, last, early)
                    if h.kind == Kind.PUSH:
                        self._add(h.key, h.chunk, h.it, p, data)
                    elif h.chunk in self._pending.get((h.key, h.it), ()):
                        self._deliver(h.key, h.chunk, h.it, data)
                    else:
                        raise CommError(f"{conn.peer} sent the average of chunk {h.key}/{h.chunk} of "
                                        f"iteration {h.it} twice or before we pushed it")
        except BaseException as e:  # noqa: BLE001 - every failure ends the job, loudly
            self._fail(str(e))
        finally:
            with self._cv:
                self._gone.add(p)
                self._cv.notify_all()

    def _check_frame(self, conn: Connection, p: int, h) -> Chunk:
        if h.kind not in (Kind.PUSH, Kind.RESULT) or h.key not in self.chunks or h.chunk >= len(self.chunks[h.key]):
            raise CommError(f"{conn.peer} sent {h.kind.name} for chunk {h.key}/{h.chunk}, which does not exist")
        ch = self.chunks[h.key][h.chunk]
        if h.nbytes != (ch.hi - ch.lo) * 4:
            raise CommError(f"{conn.peer} sent {h.nbytes} bytes for chunk {h.key}/{h.chunk} of {ch.hi - ch.lo} floats")
        expected = p in self.children[ch.tree] if h.kind == Kind.PUSH else p == self.parent[ch.tree]
        if not expected:
            raise CommError(f"{conn.peer} sent {h.kind.name} for chunk {h.key}/{h.chunk} of tree {ch.tree}, "
                            f"where it is not our {'child' if h.kind == Kind.PUSH else 'parent'}")
        return ch

    # ------------------------------------------------------------------ ending
    def _needs_ended_peer(self, key: int, it: int) -> int | None:
        """A peer that said BYE sends nothing more: if (key, it) still needs it, we never finish."""
        if not self._ended:
            return None
        for c in self._pending.get((key, it), ()):
            tree = self.chunks[key][c].tree
            if self.parent[tree] in self._ended:
                return self.parent[tree]
            slot = self._slots.get((key, c, it))
            for child in self.children[tree]:
                if child in self._ended and (slot is None or child not in slot.got):
                    return child
        return None

    def _fail(self, reason: str) -> None:
        """The first failure wins: remember it, wake waiters, tell every peer; the error
        reaches the caller once they have been told (core/failure.py)."""
        self._failure.fail(reason, tell=self._abort)

    def _abort(self, reason: str) -> None:
        with self._cv:
            outboxes = list(self.outboxes.values())
        abort_all(outboxes, reason)
