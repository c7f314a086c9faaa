"""PyTorch's own all-reduce (`torch.distributed`, gloo backend): the real-world reference.

Gradients are fused into the same DDP-style buckets as `ring` (`buckets.py`), and each
full bucket is all-reduced asynchronously, so communication overlaps backward. gloo
matches collectives by the order they are issued, so, as DDP does, bucket i is launched
only after buckets 0..i-1 of the same iteration: a bucket that fills early waits for its
predecessors.

Rendezvous is a TCP store at worker 0's ip and `workers[0].port` (what
`init_method="tcp://ip:port"` sets up, but bounded by `connect_timeout_s` rather than the
collective timeout); gloo uses nothing else of ours. It must be told the interface
(`GLOO_SOCKET_IFNAME`: `<host>-eth0` in Mininet, `lo` on loopback) and the process group
must be destroyed before the process exits, or the process dies with SIGABRT: `close()`
does that, a failure does it before raising, and an atexit hook covers a worker that dies
of something else. torch.distributed allows one default group per process, hence one
worker per process.

torch is imported inside the methods: importing the registry must stay cheap.
"""
from __future__ import annotations

import atexit
import os
import socket
import threading
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import numpy as np
from pydantic import Field

from schedulers.api import CommError, RoleContext, Scheduler, TensorSpec
from schedulers.collective.buckets import BucketParams, BucketState, plan_buckets
from schedulers.core.failure import Failure
from schedulers.transport.connection import listen

PROBE_TIMEOUT_S = 0.5
PROBE_ROUNDS, PROBE_PAUSE_S = 5, 0.1
# After a failure, how long a worker stays (its port open) for peers still finding out who
# died: worker 0, whose store holds the verdict, until every live peer has one (LINGER_S at
# most); the others a moment, and only when worker 0 is gone (STORELESS_LINGER_S).
LINGER_S, STORELESS_LINGER_S, LINGER_POLL_S = 3.0, 1.0, 0.02


class GlooParams(BucketParams):
    timeout_s: float = Field(default=300.0, gt=0, le=604_800,
                             description="a collective stalled this many seconds fails")


@dataclass(eq=False, kw_only=True)
class GlooBucket(BucketState):
    tensor: Any                      # a torch tensor...
    buf: np.ndarray                  # ...and the same memory: gradients in, averages out
    ready_it: int = -1               # all gradients of this iteration are in buf
    work: Any = None                 # the async all_reduce of launched_it
    lock: threading.Lock = field(default_factory=threading.Lock)  # one thread finishes a launch


class Gloo(Scheduler):
    name = "gloo"
    Params = GlooParams
    family = "collective"
    bound_model = "ring_allreduce"  # its all-reduce is a ring (in rank order)
    display_order = 5
    claims = {"forest-heterogeneous": "baseline"}
    report_sections = ("forest_compare",)  # a baseline there, judged by its rank-order ring's bound

    def __init__(self, ctx: RoleContext, params: GlooParams):
        super().__init__(ctx, params)
        self._failure = Failure(f"worker {ctx.rank}")
        self._cv = self._failure.cv
        self._group = False
        self._beacon: socket.socket | None = None
        self._store: Any = None

    # ------------------------------------------------------------------ setup
    def start(self, tensors: list[TensorSpec]) -> None:
        import torch
        import torch.distributed as dist

        p = self.params
        self.buckets = []
        for b in plan_buckets(tensors, p):
            tensor = torch.zeros(b.numel, dtype=torch.float32)
            self.buckets.append(GlooBucket(spec=b, tensor=tensor, buf=tensor.numpy()))
        self.bucket_of = {k: gb for gb in self.buckets for k in gb.spec.keys}
        self._pushed = {t.key: -1 for t in tensors}
        self._next = 0  # the bucket gloo must see next

        if self.ctx.rank > 0:
            # A liveness beacon on our otherwise unused port (worker 0 has the store). It
            # stays open until close() or the process exits, so that a worker that failed
            # but lives is not taken for dead by the others.
            self._beacon = listen("0.0.0.0", self.ctx.workers[self.ctx.rank].port)
            atexit.register(self._beacon.close)
        os.environ["GLOO_SOCKET_IFNAME"] = self.ctx.iface
        ep = self.ctx.workers[0]
        try:
            store = dist.TCPStore(ep.ip, ep.port, self.ctx.num_workers, is_master=self.ctx.rank == 0,
                                  timeout=timedelta(seconds=self.ctx.connect_timeout_s))
            dist.init_process_group("gloo", store=store, rank=self.ctx.rank, world_size=self.ctx.num_workers,
                                    timeout=timedelta(seconds=p.timeout_s))
        except (RuntimeError, ValueError) as e:  # DistStoreError and DistNetworkError are RuntimeErrors
            missing = self._unreachable()
            raise CommError(f"gloo rendezvous at worker 0 ({ep.host} {ep.ip}:{ep.port}): {e}"
                            + (f"; {self._names(missing)} not there" if missing else "")) from None
        self._store = store
        self._group = True
        atexit.register(self._destroy)

    def info(self) -> dict:
        return {"bucket_numel": [gb.spec.numel for gb in getattr(self, "buckets", [])]}

    # ------------------------------------------------------------------ API
    def push(self, key: int, grad: np.ndarray, it: int) -> None:
        gb = self.bucket_of[key]
        with self._cv:
            self._failure.check()
            if it <= self._pushed[key]:
                raise ValueError(f"key {key}: pushed iteration {it} after {self._pushed[key]}")
            if (gb.filled and gb.filling_it != it) or gb.ready_it > gb.launched_it:
                raise ValueError(f"key {key}: pushed for iteration {it} while its bucket still waits for "
                                 f"iteration {max(gb.filling_it, gb.ready_it)} to be complete")
            self._pushed[key] = it
            gb.filling_it = it
        if gb.done_it != gb.launched_it:  # the buffer still holds the previous launch
            self._finish(gb)
        np.copyto(gb.buf[gb.spec.span(key)], grad.reshape(-1))
        with self._cv:
            if not gb.add():
                return
            gb.ready_it = it
            self._launch_ready()

    def _launch_ready(self) -> None:
        """Issue all_reduce for every ready bucket whose predecessors are issued (holds _cv)."""
        import torch.distributed as dist

        while self._next < len(self.buckets):
            gb = self.buckets[self._next]
            it = gb.ready_it
            if it <= gb.launched_it:
                return
            try:
                gb.work = dist.all_reduce(gb.tensor, op=dist.ReduceOp.SUM, async_op=True)
            except RuntimeError as e:
                raise self._failed(f"all_reduce of bucket {gb.spec.index}, iteration {it}: {e}") from None
            gb.launched_it = it
            for k in gb.spec.keys:
                self.event("send", k, 0, it)
            self._next = (self._next + 1) % len(self.buckets)
            self._cv.notify_all()

    def wait(self, key: int, it: int) -> np.ndarray:
        gb = self.bucket_of[key]
        with self._cv:
            if self._pushed[key] < it:
                raise ValueError(f"wait({key}, {it}) before that gradient was pushed")
            while gb.launched_it < it:  # an earlier bucket is not full yet
                self._failure.check()
                self._cv.wait(1.0)
        if gb.done_it < it:
            self._finish(gb)
        return gb.buf[gb.spec.span(key)]

    def _finish(self, gb: GlooBucket) -> None:
        """Wait for the bucket's all_reduce and turn its sum into the average."""
        with gb.lock:
            if gb.done_it == gb.launched_it:
                return
            self._failure.check()
            try:
                gb.work.wait()
            except RuntimeError as e:
                raise self._failed(f"all_reduce of bucket {gb.spec.index}, iteration {gb.launched_it}: "
                                   f"{e}") from None
            gb.tensor.div_(self.ctx.num_workers)
            gb.work = None
            gb.done_it = gb.launched_it
        for k in gb.spec.keys:
            self.event("recv", k, 0, gb.done_it)

    def close(self) -> None:
        """Finish what was launched, then destroy the group (a barrier first, so no peer
        sees us leave in the middle of its last collective)."""
        try:
            if self._group and not self._failure.failed:
                for gb in self.buckets:
                    self._finish(gb)
                if any(gb.filled for gb in self.buckets):
                    raise self._failed(f"worker {self.ctx.rank} closed with gradients pushed but not reduced")
                import torch.distributed as dist

                try:
                    dist.barrier()
                except RuntimeError as e:
                    raise self._failed(f"closing: {e}") from None
        finally:
            self._destroy()
            self._close_beacon()

    # ------------------------------------------------------------------ failure
    def _failed(self, reason: str) -> CommError:
        """Record the first failure and leave the group now (aborting our collectives in
        flight): the process can then exit normally, and the peers' pending collectives
        fail at once instead of timing out."""
        first = self._failure.fail(reason)
        dead: list[int] | None = None
        store_gone = False
        if first:
            self._store_call("set", f"left/{self.ctx.rank}", "1")  # alive: not to be blamed
            found = self._diagnose()
            if found:
                dead, verdict = found
                self._failure.amend(f"{verdict}; {reason}")
            store_gone = self._store_call("add", "diagnosed", 1) is None
        self._destroy(abort=True)
        if first:
            self._linger(dead, store_gone)
        return self._failure.error()

    def _diagnose(self) -> tuple[list[int], str] | None:
        """Which peers died, and the verdict naming them. gloo names a peer only by address,
        and workers that leave the group after a failure break the others' collectives too,
        so the first worker to find a dead peer posts its finding in the store (on worker 0),
        later ones read it, and workers that fail but live say so there. A peer is dead when
        its port refuses (the store's on worker 0, the beacon's on the others); a dying
        process closes its sockets one by one, so probing is repeated for a moment."""
        posted = self._store_call("get", "dead") if self._store_call("check", ["dead"]) else None
        if posted:
            return self._verdict(posted)
        for _ in range(PROBE_ROUNDS):
            dead = [r for r in self._unreachable() if not self._store_call("check", [f"left/{r}"])]
            if dead:
                break
            time.sleep(PROBE_PAUSE_S)
        else:
            return None
        finding = f"{','.join(map(str, dead))}\n{self._names(dead)} unreachable"
        agreed = self._store_call("compare_set", "dead", "", finding)
        return self._verdict(agreed or finding.encode())

    @staticmethod
    def _verdict(posted: bytes) -> tuple[list[int], str]:
        ranks, verdict = posted.decode().split("\n", 1)
        return [int(r) for r in ranks.split(",")], verdict

    def _linger(self, dead: list[int] | None, store_gone: bool) -> None:
        """Stay a moment after a failure, so that peers still diagnosing it neither lose the
        store (and the verdict in it) nor find our port closed and blame us: a training
        process exits as soon as it has the error."""
        if self.ctx.rank == 0:
            live = self.ctx.num_workers - len(dead or [])
            deadline = time.monotonic() + LINGER_S
            while time.monotonic() < deadline and (self._store_call("add", "diagnosed", 0) or 0) < live:
                time.sleep(LINGER_POLL_S)
        elif store_gone:  # worker 0 is gone, and with it what we could tell the others by
            time.sleep(STORELESS_LINGER_S)

    def _store_call(self, method: str, *args):
        """A store operation, or None when worker 0 and its store are gone."""
        if self._store is None:
            return None
        try:
            self._store.set_timeout(timedelta(seconds=2 * PROBE_TIMEOUT_S))
            return getattr(self._store, method)(*args)
        except (RuntimeError, ValueError):
            return None

    def _unreachable(self) -> list[int]:
        out = []
        for r, ep in enumerate(self.ctx.workers):
            if r == self.ctx.rank:
                continue
            try:
                socket.create_connection((ep.ip, ep.port), timeout=PROBE_TIMEOUT_S).close()
            except OSError:
                out.append(r)
        return out

    def _names(self, ranks: list[int]) -> str:
        eps = self.ctx.workers
        return ", ".join(f"worker {r} ({eps[r].host} {eps[r].ip}:{eps[r].port})" for r in ranks)

    def _close_beacon(self) -> None:
        if self._beacon is not None:
            self._beacon.close()
            atexit.unregister(self._beacon.close)
            self._beacon = None

    def _destroy(self, abort: bool = False) -> None:
        with self._cv:
            if not self._group:
                return
            self._group = False
        import torch
        import torch.distributed as dist

        try:
            if abort:  # without this, destroying waits for collectives stuck on live peers
                dist.group.WORLD._get_backend(torch.device("cpu")).abort()
            for gb in self.buckets:
                gb.work = None  # a pending work holds gloo's connections open: peers would time out
            dist.destroy_process_group()
        except (RuntimeError, ValueError, AssertionError):
            pass
        atexit.unregister(self._destroy)
