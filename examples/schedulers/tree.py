"""A binary-tree all-reduce, written outside the repository's packages: a plugin, loaded from a
config's `plugins:` or `./inv check-scheduler tree --plugin examples/schedulers/tree.py`.
docs/writing-a-scheduler.md builds it step by step.

Worker r's parent is (r - 1) // 2, its children 2r + 1 and 2r + 2. A worker adds its
children's partial sums to its own gradient, in child order, and sends the sum up; worker 0
divides by the number of workers and sends the average down, each worker passing it on to
its children. Every replica gets worker 0's bytes, so replicas stay bit-identical. Each
tree link carries every tensor once each way, so an inner worker moves 3 G each way: none of
the harness's bound models describes that, so it declares none.
"""
from __future__ import annotations

import threading

import numpy as np

from schedulers.api import CommError, Scheduler, SchedulerParams, TensorSpec
from schedulers.api.transport import Acceptor, Connection, Hello, Kind, Outbox, abort_all, dial

CLOSE_S = 30.0  # how long close() waits for the neighbours' BYE


class TreeParams(SchedulerParams):
    """No tunables; `requires_servers = False` makes it a collective (workers only)."""

    requires_servers = False


class Tree(Scheduler):
    name = "tree"
    Params = TreeParams
    family = "collective"
    bound_model = "none"
    display_name = "binary tree"
    display_order = 20

    def start(self, tensors: list[TensorSpec]) -> None:
        """Listen for our children, dial our parent, then one receive thread per neighbour."""
        ctx = self.ctx
        self.parent = (ctx.rank - 1) // 2 if ctx.rank else None
        self.children = [c for c in (2 * ctx.rank + 1, 2 * ctx.rank + 2) if c < ctx.num_workers]
        self.cv = threading.Condition()
        self.partial: dict[tuple[int, int], list] = {}  # (key, it) -> [own gradient or None, {child: sum}]
        self.results: dict[tuple[int, int], np.ndarray] = {}
        self.gone: set[int] = set()     # neighbours that said BYE
        self.error: str | None = None
        self.told = threading.Event()   # the neighbours have been sent our error
        self.closing = False
        me = Hello(ctx.rank, ctx.num_workers)
        conns: dict[int, Connection] = {}
        with Acceptor("0.0.0.0", ctx.workers[ctx.rank].port, me, ctx.connect_timeout_s) as acceptor:
            if self.parent is not None:
                p = ctx.workers[self.parent]
                conns[self.parent] = dial(p.ip, p.port, f"worker {self.parent} ({p.ip})", ctx.connect_timeout_s,
                                          me, expect=self.parent)
            conns.update(acceptor.accept(set(self.children), reply=True))
        self.conns = conns
        self.outboxes = {peer: Outbox(conn, self._fail, sender=ctx.rank) for peer, conn in conns.items()}
        self.threads = [threading.Thread(target=self._receive, args=(peer, conn), name=f"tree-recv-{peer}",
                                         daemon=True) for peer, conn in conns.items()]
        for t in self.threads:
            t.start()

    # ------------------------------------------------------------------ the training loop's calls
    def push(self, key: int, grad: np.ndarray, it: int) -> None:
        with self.cv:
            self._check()
            self.partial.setdefault((key, it), [None, {}])[0] = grad
            self._ready(key, it)

    def wait(self, key: int, it: int) -> np.ndarray:
        with self.cv:
            while (key, it) not in self.results:
                self._check()
                stuck = self._stuck(key, it)
                if stuck:
                    raise CommError(f"worker {self.ctx.rank}: {stuck}")
                self.cv.wait()
            return self.results.pop((key, it))

    def close(self) -> None:
        """BYE to every neighbour (after what is queued), wait for theirs, leave nothing behind."""
        with self.cv:
            failed, self.closing = self.error, True
        if failed:
            abort_all(list(self.outboxes.values()), failed)
        for ob in self.outboxes.values():
            ob.close(CLOSE_S)
        for t in self.threads:
            t.join(CLOSE_S)
        for conn in self.conns.values():
            conn.close()
        for t in self.threads:
            t.join(1.0)
        if failed:
            raise CommError(failed)

    # ------------------------------------------------------------------ inside
    def _ready(self, key: int, it: int) -> None:
        """Called with the lock held: once our gradient and every child's sum are in, send the
        sum up (or, at the root, the average down)."""
        own, kids = self.partial[(key, it)]
        if own is None or len(kids) < len(self.children):
            return
        del self.partial[(key, it)]
        total = own.astype(np.float32, copy=True)
        for c in self.children:
            total += kids[c]
        if self.parent is not None:
            self.outboxes[self.parent].put((it, key), Kind.PUSH, key=key, it=it, payload=total)
        else:
            self._deliver(key, it, total / np.float32(self.ctx.num_workers))

    def _deliver(self, key: int, it: int, avg: np.ndarray) -> None:
        """Called with the lock held: the average is ours, and goes on to our children."""
        self.results[(key, it)] = avg
        for c in self.children:
            self.outboxes[c].put((it, key), Kind.RESULT, key=key, it=it, payload=avg)
        self.cv.notify_all()

    def _receive(self, peer: int, conn: Connection) -> None:
        """A child's partial sums, or the parent's averages, until BYE; anything else fails us."""
        try:
            while True:
                h = conn.recv_header()
                if h.kind == Kind.BYE:
                    with self.cv:
                        self.gone.add(peer)
                        self.cv.notify_all()
                    return
                if h.kind == Kind.ABORT:
                    raise CommError(conn.recv_text(h.nbytes) or f"{conn.peer} aborted")
                arr = conn.recv_array(h.nbytes)
                with self.cv:
                    if h.kind == Kind.RESULT and peer == self.parent:
                        self._deliver(h.key, h.it, arr)
                    elif h.kind == Kind.PUSH and peer in self.children:
                        self.partial.setdefault((h.key, h.it), [None, {}])[1][peer] = arr
                        self._ready(h.key, h.it)
                    else:
                        raise CommError(f"{conn.peer} sent an unexpected {h.kind.name}")
        except (CommError, OSError) as e:
            self._fail(e)

    def _fail(self, e: BaseException) -> None:
        """The first failure is kept and passed on to every neighbour (ABORT), so that each
        worker's error names the worker that really failed."""
        with self.cv:
            if self.closing or self.error is not None:
                return
            self.error = f"worker {self.ctx.rank}: {e}" if not str(e).startswith("worker ") else str(e)
            self.cv.notify_all()
        abort_all(list(self.outboxes.values()), self.error)
        self.told.set()

    def _check(self) -> None:
        """Raise the failure, once the neighbours have heard of it: a worker that raised may
        exit at once, and its neighbours would then see only its connection close."""
        if self.error is not None:
            self.told.wait(2.0)
            raise CommError(self.error)

    def _stuck(self, key: int, it: int) -> str | None:
        """Why (key, it) can never complete: a neighbour it needs has said BYE."""
        slot = self.partial.get((key, it))
        left = [c for c in self.children if c in self.gone and slot is not None and c not in slot[1]]
        if left:
            return f"worker {left[0]} closed with iteration {it} unfinished"
        if self.parent in self.gone:
            return f"worker {self.parent} closed before sending the average of key {key}, iteration {it}"
        return None
