"""The parameter-server process of the whole PS family: sums pushes slot by slot.

A slot is (key, chunk, iteration): one slice that every worker pushes once. Each push is
received (`recv_into`) into a buffer from a pool that recycles buffers of the same size, so
after the first iteration nothing is allocated; the first push of a slot becomes its
running sum and the others are added into it. Once every worker's copy is in, the sum is
divided by the number of workers. What happens around that is the server's `Mode`:

    PULL       ACK each push; answer each PULL as soon as its slot is complete, first come,
               first served (fifo, bytescheduler; see below)
    QUEUED     pushes read in one round of the loop go into a priority queue ordered by
               (iteration, layer priority, slice) and are summed in that order after the
               round; each complete slot goes to every worker unasked (p3: the server's
               busy time goes to the layers the next forward pass needs first)
    IMMEDIATE  each push is summed as it is read, and the slot is sent to every worker the
               moment its last copy is in, so push and pull overlap packet by packet
               (mercury)

One thread serves every worker connection (schedulers/transport/loop.py): each has its own
outbox, so one slow worker link never stalls the others, and no frame hands the GIL from
one thread to another. What an outbox sends first depends on the mode:

- PULL: the order in which the requests arrived. Each PUSH and each PULL is stamped with a
  server-wide arrival number as it is read; the ACK of a push carries its push's number, the
  RESULT of a pull its PULL's number (a PULL that came before its slot was complete keeps
  its place), and the outbox sends the lowest first. This is what ps-lite's server does, and
  ByteScheduler keeps that server: its priority lives at the worker (the order in which it
  pushes and pulls, and the credit), so bytescheduler gets arrival order too. Answers
  ordered by (iteration, key, slice), as they once were, follow the forward order
  (keys), so fifo's server answered the layers nearest the input first, a priority that
  fifo does not have.
- QUEUED and IMMEDIATE: (iteration, layer priority, slice), the server-side priority of p3
  and mercury by design.

The workers' HELLO names the mode they speak; `python -m workloads.server SPEC.json`
takes the mode from the spec's `scheduler` entry and refuses workers that speak another
(`ParameterServer(mode=None)`, used in-process by tests, adopts the workers' mode).

Incast (schedulers/ps/share.py): the server measures its inbound rate and, once packets are
dropped before it, sends every worker its share of that rate (CTRL, key = bytes/s), which
the workers of a pacing scheduler apply as their connection's pacing rate.

Failure: a worker that disconnects without BYE, or reports an ABORT, ends the server; every
other worker is sent an ABORT that names the dead peer, so no role waits forever.
"""
from __future__ import annotations

import itertools
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from contracts import tx_frames
from contracts.role_spec import RoleSpec
from schedulers.api import CommError
from schedulers.core.progress import ProgressReporter
from schedulers.ps.share import InboundMeter, out_of_order
from schedulers.transport.connection import (
    HOST_QUEUE_S,
    PRIORITY_QUEUE_S,
    Connection,
    Header,
    Kind,
    Mode,
    set_dead_peer_s,
)
from schedulers.transport.loop import Loop, Peer, PeerError, abort_peers
from schedulers.transport.peers import Acceptor, Hello
from schedulers.transport.txstamps import TxStamps, merge, save

MAX_FRAME_BYTES = 1 << 31  # a bigger push is a protocol error, not an allocation


class BufferPool:
    """Free float32 arrays by size: receive buffers and sums are taken here and given back
    once written out, so steady-state iterations neither allocate nor page-fault. Only the
    server's loop thread uses it (a frame's on_sent runs there too), so it takes no lock."""

    def __init__(self):
        self._free: dict[int, list[np.ndarray]] = {}
        self.allocated = 0  # arrays ever created: flat after the first iterations

    def take(self, numel: int) -> np.ndarray:
        free = self._free.get(numel)
        if free:
            return free.pop()
        self.allocated += 1
        return np.empty(numel, dtype=np.float32)

    def give(self, arr: np.ndarray) -> None:
        self._free.setdefault(arr.size, []).append(arr)


@dataclass
class Slot:
    total: np.ndarray | None = None
    ranks: int = 0                                      # bit r: worker r's push is in
    result: np.ndarray | None = None
    waiting: list[tuple[int, int]] = field(default_factory=list)  # PULL mode: (rank, arrival) of early PULLs
    served: int = 0                                     # PULL mode: results handed to outboxes
    priority: int = 0
    sent: Callable[[], None] | None = None              # PULL mode: see _releaser


class ParameterServer:
    """Serves every worker connection on one thread (schedulers/transport/loop.py): each
    worker is a `Peer` with its own outbox, so one slow worker link never stalls the others,
    and no GIL is handed between threads per frame."""

    def __init__(self, rank: int, num_workers: int, listen_ip: str, port: int,
                 accept_timeout_s: float = 60.0, log=None, mode: Mode | None = None, trace: bool = False):
        self.rank = rank
        self.num_workers = num_workers
        self.mode = mode
        self.acceptor = Acceptor(listen_ip, port, Hello(rank, num_workers), accept_timeout_s)
        self.accept_timeout_s = accept_timeout_s
        self.slots: dict[tuple[int, int, int], Slot] = {}
        self.pool = BufferPool()
        self.error: BaseException | None = None
        self.culprit: int | None = None
        self.done = threading.Event()   # set once serve() has returned or raised
        self.byes = 0
        self.conns: dict[int, Connection] = {}
        self.loop = Loop(self)
        self.peers: dict[int, Peer] = {}
        self.meter = InboundMeter(num_workers)     # incast: each worker's share of our link (share.py)
        self.queue: list = []                      # QUEUED mode: received pushes by priority
        self._seq = itertools.count()
        self._arrival = itertools.count()          # PULL mode: requests in the order they are read
        self.trace = trace
        self.events: list[tuple[str, int, int, int, float]] = []
        self.stamps: list[TxStamps] = []  # traced: when each RESULT's bytes left (schedulers/transport/txstamps.py)
        self.log = log or (lambda msg: print(f"[server {rank}] {msg}", file=sys.stderr, flush=True))

    @property
    def port(self) -> int:
        return self.acceptor.port

    def event(self, what: str, key: int, chunk: int, it: int) -> None:
        """As `Scheduler.event`: "recv" (a push arrived), "done" (a slot is averaged), "send"
        (a result is handed to the socket)."""
        if self.trace:
            self.events.append((what, key, chunk, it, time.time()))

    # ------------------------------------------------------------------ main
    def serve(self) -> None:
        try:
            self._accept_all()
            self.log(f"{self.num_workers} workers connected, mode {self.mode.name}")
            self.loop.after_round = self._after_round
            self.loop.run(done=self._finished)
            self.log("all workers said BYE; done")
        except BaseException as e:
            self.culprit = e.rank if isinstance(e, PeerError) else None
            err = e if isinstance(e, CommError) else CommError(f"{type(e).__name__}: {e}")
            self.error = err
            self._abort_all(str(err))
            raise CommError(f"server {self.rank}: {err}") from None
        finally:
            for stamps in self.stamps_all:
                stamps.close()
            for c in self.conns.values():
                c.close()
            self.loop.close()
            self.acceptor.close()
            self.done.set()

    def _finished(self) -> bool:
        """Every worker said BYE and has been sent everything queued for it, and our BYE."""
        return self.byes == self.num_workers and all(p.bye_sent for p in self.peers.values())

    def _accept_all(self) -> None:
        """Every worker, within accept_timeout_s of the one before (they start at their own pace)."""
        self.acceptor.accept(range(self.num_workers), self._check_mode, per_peer=True, on_accept=self._attach)

    def _check_mode(self, conn: Connection, h: Header) -> None:
        """A worker's HELLO (rank and job size checked already) names the mode it speaks."""
        try:
            mode = Mode(h.chunk)
        except ValueError:
            raise CommError(f"{conn.peer} asks for unknown server mode {h.chunk}") from None
        if self.mode is None:
            self.mode = mode
        elif mode != self.mode:
            raise CommError(f"{conn.peer} speaks {mode.name} but this server runs {self.mode.name}")

    def _attach(self, rank: int, conn: Connection) -> None:
        """A worker that said HELLO: its peer in the loop, with transmit stamps always (the
        host's queue bound, as the workers'); rows when traced."""
        conn.queue_s = PRIORITY_QUEUE_S
        self.conns[rank] = conn
        on_send = self._trace_send if self.trace else None
        stamps = TxStamps.enable(conn.sock, peer=rank, record=self.trace)
        if stamps is not None and self.trace:
            self.stamps.append(stamps)
        self.peers[rank] = self.loop.add(conn, rank, sender=self.rank, stamps=stamps, host_queue_s=HOST_QUEUE_S,
                                         on_send=on_send)

    @property
    def stamps_all(self) -> list[TxStamps]:
        return [p.stamps for p in self.peers.values() if p.stamps is not None]

    def _trace_send(self, kind: Kind, key: int, chunk: int, it: int) -> None:
        if kind == Kind.RESULT:
            self.event("send", key, chunk, it)

    # ------------------------------------------------------------------ failure
    def _abort_all(self, reason: str) -> None:
        """Tell every live worker why we stop (the dead one is just closed)."""
        if self.culprit in self.conns:
            self.conns[self.culprit].close()
        abort_peers([p for rank, p in self.peers.items() if rank != self.culprit], reason)
        for rank, conn in self.conns.items():
            if rank not in self.peers:
                conn.abort(reason, self.rank)

    # ------------------------------------------------------------------ frames (loop.Handler)
    def payload_buffer(self, peer: Peer, h: Header) -> np.ndarray:
        if h.kind != Kind.PUSH:
            raise CommError(f"{peer.conn.peer} sent unexpected {h.kind.name} with a payload")
        if h.nbytes % 4 or h.nbytes > MAX_FRAME_BYTES:
            raise CommError(f"{peer.conn.peer} pushed a {h.nbytes}-byte payload")
        return self.pool.take(h.nbytes // 4)

    def on_frame(self, peer: Peer, h: Header, data: np.ndarray | None) -> None:
        if h.kind == Kind.PUSH:
            if data is None:   # an empty push: an empty slice
                data = self.pool.take(0)
            self.meter.received(h.nbytes)
            if self.trace:
                self.event("recv", h.key, h.chunk, h.it)
            self._pushed(peer.rank, h, data)
        elif h.kind == Kind.PULL and self.mode == Mode.PULL:
            self._pull((h.key, h.chunk, h.it), peer.rank, next(self._arrival))
        elif h.kind == Kind.BYE:
            # The worker has every result it waited for: send what is queued to it, then BYE.
            peer.close()
            self.byes += 1
        else:
            raise CommError(f"{peer.conn.peer} sent unexpected {h.kind.name}")

    def _pushed(self, rank: int, h: Header, data: np.ndarray) -> None:
        if self.mode == Mode.PULL:
            arrival = next(self._arrival)
            self._add(rank, h, data)
            self.peers[rank].put((arrival,), Kind.ACK, h.key, h.chunk, h.it)
        elif self.mode == Mode.QUEUED:
            self.queue.append(((h.it, h.priority, h.chunk), next(self._seq), rank, h, data))
        else:
            self._add(rank, h, data)

    def _after_round(self) -> None:
        if self.mode == Mode.QUEUED:
            self._process_queue()
        now = time.monotonic()
        if self.meter.due(now):
            counts = [out_of_order(c.sock) for c in self.conns.values()]
            share = self.meter.tick(now, None if None in counts else sum(counts))
            if share is not None:   # CTRL to a PS worker: key = its pacing rate, bytes/s
                for peer in self.peers.values():
                    peer.put((-1,), Kind.CTRL, key=min(share, 0xFFFFFFFF))

    def _process_queue(self) -> None:
        """QUEUED mode, after each round of reads: sum what was received, best priority first
        (sorted once per round: cheaper than a heap, as nothing joins the round's pushes
        while they are summed)."""
        queue, self.queue = self.queue, []
        queue.sort()
        for _, _, rank, h, data in queue:
            self._add(rank, h, data)

    # ------------------------------------------------------------------ slots
    def _add(self, rank: int, h: Header, data: np.ndarray) -> None:
        slot_id = (h.key, h.chunk, h.it)
        slot = self.slots.get(slot_id)
        if slot is None:
            slot = self.slots[slot_id] = Slot()
        if slot.ranks >> rank & 1:
            raise CommError(f"worker {rank} pushed key {h.key} slice {h.chunk} it {h.it} twice")
        slot.ranks |= 1 << rank
        if slot.total is None:
            slot.total = data
        else:
            if slot.total.size != data.size:
                raise CommError(f"key {h.key} slice {h.chunk} it {h.it}: sizes differ "
                                f"({slot.total.size} vs {data.size})")
            slot.total += data
            self.pool.give(data)
        if slot.ranks.bit_count() < self.num_workers:
            return
        slot.total /= self.num_workers
        slot.result, slot.total = slot.total, None
        if self.trace:
            self.event("done", h.key, h.chunk, h.it)
        if self.mode == Mode.PULL:
            slot.priority, slot.sent = h.priority, self._releaser(slot.result)
            for r, arrival in slot.waiting:
                self._send_result(slot_id, slot, r, arrival)
            slot.waiting.clear()
        else:
            del self.slots[slot_id]
            self._broadcast(slot_id, slot.result, h.priority)

    def _broadcast(self, slot_id: tuple[int, int, int], result: np.ndarray, priority: int) -> None:
        """Send a complete slot to every worker unasked (QUEUED, IMMEDIATE)."""
        key, chunk, it = slot_id
        sent = self._releaser(result)
        for peer in self.peers.values():
            peer.put((it, priority, chunk), Kind.RESULT, key, chunk, it, result, priority, on_sent=sent)

    def _releaser(self, result: np.ndarray):
        """A callback for each of the num_workers sends of `result`: the last one gives the
        buffer back to the pool (it has been copied into every socket by then)."""
        left = [self.num_workers]

        def sent() -> None:
            left[0] -= 1
            if not left[0]:
                self.pool.give(result)
        return sent

    def _pull(self, slot_id: tuple[int, int, int], rank: int, arrival: int) -> None:
        slot = self.slots.get(slot_id)
        if slot is None:
            slot = self.slots[slot_id] = Slot()
        if slot.result is None:
            slot.waiting.append((rank, arrival))
        else:
            self._send_result(slot_id, slot, rank, arrival)

    def _send_result(self, slot_id, slot: Slot, rank: int, arrival: int) -> None:
        """PULL mode, answered in the order the PULLs arrived."""
        key, chunk, it = slot_id
        self.peers[rank].put((arrival,), Kind.RESULT, key, chunk, it, slot.result, slot.priority,
                             on_sent=slot.sent)
        slot.served += 1
        if slot.served == self.num_workers:
            del self.slots[slot_id]  # the peers' outboxes still hold the array until it is sent


def main(argv: list[str], server_mode: Callable[[str], Mode]) -> int:
    """The server role's process (`python -m workloads.server SPEC.json`); `server_mode` gives the
    mode a scheduler's workers speak (the registry's, which sits above this package)."""
    if len(argv) != 1:
        print("usage: python -m workloads.server ROLE_SPEC.json", file=sys.stderr)
        return 2
    with open(argv[0]) as f:
        spec = RoleSpec.model_validate_json(f.read())
    set_dead_peer_s(spec.dead_peer_s)
    t0 = time.monotonic()
    # The watchdog's view of this server: its bytes per connection (emu/run/watchdog.py).
    reporter = ProgressReporter(spec.out_dir, spec.name, phase="serving").start() if spec.out_dir else None
    try:
        mode = server_mode(spec.scheduler.name)
        ps = ParameterServer(spec.rank, len(spec.workers), "0.0.0.0", spec.address.port,
                             accept_timeout_s=spec.connect_timeout_s, mode=mode, trace=spec.trace)
        ps.serve()
    except CommError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 1
    if ps.trace and spec.out_dir:
        if ps.stamps:   # before the JSON: a role's records are complete once its JSON is there
            save(os.path.join(spec.out_dir, f"server{ps.rank}{tx_frames.SUFFIX}"), merge(ps.stamps))
        path = os.path.join(spec.out_dir, f"server{ps.rank}.json")
        with open(path + ".tmp", "w") as f:
            json.dump({"events": ps.events}, f)
        os.replace(path + ".tmp", path)
    if reporter is not None:
        reporter.stop()
    ps.log(f"served for {time.monotonic() - t0:.1f} s")
    return 0
