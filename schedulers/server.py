"""The parameter-server process: sums pushes slot by slot and serves averaged results.

A slot is (key, chunk, iteration). The server ACKs each push; a PULL is answered as soon
as all workers' pushes for that slot have been summed (at once if they already have).
Each worker connection has its own receive thread and its own send outbox, so one slow
worker link never stalls the others.

Run as `python -m schedulers.server ROLE_SPEC.json`; `serve()` is the same in-process
(loopback tests). A worker that disconnects without BYE is an error that ends the server,
which closes every other connection, so no role waits forever on a dead peer.
"""
from __future__ import annotations

import json
import sys
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from schedulers.base import CommError
from schedulers.transport import Connection, Kind, Outbox, listen


@dataclass
class Slot:
    total: np.ndarray | None = None
    count: int = 0
    result: np.ndarray | None = None
    waiting: list[int] = field(default_factory=list)   # ranks whose PULL came early
    served: int = 0


class ParameterServer:
    def __init__(self, rank: int, num_workers: int, listen_ip: str, port: int,
                 accept_timeout_s: float = 60.0, log=None):
        self.rank = rank
        self.num_workers = num_workers
        self.sock = listen(listen_ip, port)
        self.sock.settimeout(accept_timeout_s)
        self.slots: dict[tuple[int, int, int], Slot] = {}
        self.lock = threading.Lock()
        self.error: BaseException | None = None
        self.done = threading.Event()
        self.byes = 0
        self.log = log or (lambda msg: print(f"[server {rank}] {msg}", file=sys.stderr, flush=True))

    @property
    def port(self) -> int:
        return self.sock.getsockname()[1]

    # ------------------------------------------------------------------ main
    def serve(self) -> None:
        self.conns: dict[int, Connection] = {}
        self.outboxes: dict[int, Outbox] = {}
        try:
            while len(self.conns) < self.num_workers:
                try:
                    sock, addr = self.sock.accept()
                except TimeoutError:
                    missing = self.num_workers - len(self.conns)
                    raise CommError(f"server {self.rank}: {missing} worker(s) never connected") from None
                conn = Connection(sock, f"worker at {addr[0]}:{addr[1]}")
                h = conn.recv_header()
                if h.kind != Kind.HELLO or h.key != self.num_workers:
                    raise CommError(f"{conn.peer}: expected HELLO for {self.num_workers} workers, got "
                                    f"{h.kind.name} with {h.key}")
                conn.peer = f"worker {h.sender} ({addr[0]})"
                self.conns[h.sender] = conn
                self.outboxes[h.sender] = Outbox(conn, self._fail, sender=self.rank)
            self.log(f"{self.num_workers} workers connected")
            for rank in self.conns:
                threading.Thread(target=self._receive, args=(rank,), daemon=True, name=f"recv-w{rank}").start()
            self.done.wait()
            if self.error is not None:
                raise self.error
            for ob in self.outboxes.values():
                ob.close()
            self.log("all workers said BYE; done")
        finally:
            for c in self.conns.values():
                c.close()
            self.sock.close()

    def _fail(self, err: BaseException) -> None:
        with self.lock:
            if self.error is None:
                self.error = err
        self.done.set()

    # ------------------------------------------------------------------ per worker
    def _receive(self, rank: int) -> None:
        conn, out = self.conns[rank], self.outboxes[rank]
        try:
            while True:
                h = conn.recv_header()
                slot_id = (h.key, h.chunk, h.it)
                if h.kind == Kind.PUSH:
                    data = conn.recv_array(h.nbytes)
                    self._add(slot_id, data)
                    out.put((h.it, h.key, h.chunk), Kind.ACK, h.key, h.chunk, h.it)
                elif h.kind == Kind.PULL:
                    self._pull(slot_id, rank)
                elif h.kind == Kind.BYE:
                    with self.lock:
                        self.byes += 1
                        if self.byes == self.num_workers:
                            self.done.set()
                    return
                else:
                    raise CommError(f"{conn.peer} sent unexpected {h.kind.name}")
        except CommError as e:
            self._fail(CommError(f"server {self.rank}: {e}"))
        except BaseException as e:  # noqa: BLE001
            self._fail(e)

    def _add(self, slot_id: tuple[int, int, int], data: np.ndarray) -> None:
        with self.lock:
            slot = self.slots.setdefault(slot_id, Slot())
            if slot.total is None:
                slot.total = data
            else:
                if slot.total.size != data.size:
                    raise CommError(f"slot {slot_id}: sizes differ ({slot.total.size} vs {data.size})")
                slot.total += data
            slot.count += 1
            if slot.count == self.num_workers:
                slot.total /= self.num_workers
                slot.result, slot.total = slot.total, None
                for r in slot.waiting:
                    self._send_result(slot_id, slot, r)
                slot.waiting.clear()

    def _pull(self, slot_id: tuple[int, int, int], rank: int) -> None:
        with self.lock:
            slot = self.slots.setdefault(slot_id, Slot())
            if slot.result is None:
                slot.waiting.append(rank)
            else:
                self._send_result(slot_id, slot, rank)

    def _send_result(self, slot_id, slot: Slot, rank: int) -> None:
        key, chunk, it = slot_id
        self.outboxes[rank].put((it, key, chunk), Kind.RESULT, key, chunk, it, slot.result)
        slot.served += 1
        if slot.served == self.num_workers:
            del self.slots[slot_id]  # the outboxes still hold the array until it is sent


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m schedulers.server ROLE_SPEC.json", file=sys.stderr)
        return 2
    spec = json.loads(open(argv[0]).read())
    me = spec["servers"][spec["rank"]]
    t0 = time.monotonic()
    ps = ParameterServer(spec["rank"], len(spec["workers"]), "0.0.0.0", me["port"],
                         accept_timeout_s=spec.get("connect_timeout_s", 60))
    try:
        ps.serve()
    except CommError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 1
    ps.log(f"served for {time.monotonic() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
