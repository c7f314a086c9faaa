"""A test plugin: every worker sends each gradient to every other worker and averages what it
gets, summing in rank order so that every replica holds the same bits. Loaded through a
config's `plugins:` (tests/unit/test_plugins.py, tests/loopback/test_plugins_loopback.py)."""
from __future__ import annotations

import threading

import numpy as np

from schedulers.api import CommError, Scheduler, SchedulerParams, TensorSpec
from schedulers.api.transport import Acceptor, Hello, Kind, dial


class AllToAllParams(SchedulerParams):
    requires_servers = False


class AllToAll(Scheduler):
    name = "alltoall"
    Params = AllToAllParams
    family = "collective"
    bound_model = "none"
    display_order = 3  # p3's: analysis must still give it a colour of its own
    display_name = "all-to-all"

    def start(self, tensors: list[TensorSpec]) -> None:
        ctx = self.ctx
        me = Hello(ctx.rank, ctx.num_workers)
        self.slots: dict[tuple[int, int], dict[int, np.ndarray]] = {}
        self.cv = threading.Condition()
        self.error: str | None = None
        here = ctx.workers[ctx.rank]
        with Acceptor("0.0.0.0", here.port, me, ctx.connect_timeout_s) as acc:
            self.conns = {j: dial(w.ip, w.port, f"worker {j}", ctx.connect_timeout_s, me, expect=j)
                          for j, w in enumerate(ctx.workers) if j < ctx.rank}
            self.conns.update(acc.accept(set(range(ctx.rank + 1, ctx.num_workers)), reply=True))
        self.threads = [threading.Thread(target=self._recv, args=(j, c), daemon=True) for j, c in self.conns.items()]
        for t in self.threads:
            t.start()

    def _recv(self, j: int, conn) -> None:
        try:
            while (h := conn.recv_header()).kind == Kind.PUSH:
                self._put(h.key, h.it, j, conn.recv_array(h.nbytes))
            if h.kind != Kind.BYE:
                raise CommError(f"worker {j}: {conn.recv_text(h.nbytes) if h.kind == Kind.ABORT else h.kind}")
        except (CommError, OSError) as e:
            with self.cv:
                self.error = self.error or str(e)
                self.cv.notify_all()

    def _put(self, key: int, it: int, rank: int, grad: np.ndarray) -> None:
        with self.cv:
            self.slots.setdefault((key, it), {})[rank] = grad
            self.cv.notify_all()

    def push(self, key: int, grad: np.ndarray, it: int) -> None:
        for conn in self.conns.values():
            conn.send(Kind.PUSH, key=key, it=it, payload=grad, sender=self.ctx.rank)
        self._put(key, it, self.ctx.rank, grad)

    def wait(self, key: int, it: int) -> np.ndarray:
        with self.cv:
            self.cv.wait_for(lambda: self.error or len(self.slots.get((key, it), ())) == self.ctx.num_workers)
            if self.error:
                raise CommError(self.error)
            got = self.slots.pop((key, it))
        total = got[0].copy()
        for r in range(1, self.ctx.num_workers):
            total += got[r]
        return total / np.float32(self.ctx.num_workers)

    def close(self) -> None:
        for conn in self.conns.values():
            conn.send(Kind.BYE, sender=self.ctx.rank)
        for t in self.threads:
            t.join(self.ctx.connect_timeout_s)
        for conn in self.conns.values():
            conn.close()
