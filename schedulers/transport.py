"""Framed messages over TCP: one connection per peer pair, a priority outbox per connection.

A frame is a fixed 20-byte header and an optional float32 payload. Payloads are received
with `recv_into` straight into their destination (a result buffer slice or a fresh array),
never through intermediate bytes objects. The sender thread picks the next frame from a
priority heap only when the socket can take it, so a frame queued later with a better
priority overtakes everything not yet handed to the kernel.
"""
from __future__ import annotations

import heapq
import itertools
import socket
import struct
import threading
import time
from dataclasses import dataclass
from enum import IntEnum
from typing import Callable

import numpy as np

from schedulers.base import CommError

HEADER = struct.Struct("!BBHIIII")  # kind, flags, sender, key, chunk, iteration, nbytes


class Kind(IntEnum):
    HELLO = 1   # worker -> server: sender = rank, key = number of workers
    PUSH = 2    # gradient slice
    ACK = 3     # server -> worker: push received
    PULL = 4    # worker -> server: send me the aggregate
    RESULT = 5  # server -> worker: averaged slice
    BYE = 6     # orderly close


@dataclass(frozen=True)
class Header:
    kind: Kind
    sender: int
    key: int
    chunk: int
    it: int
    nbytes: int


class Connection:
    def __init__(self, sock: socket.socket, peer: str):
        self.sock = sock
        self.peer = peer
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._send_lock = threading.Lock()

    def send(self, kind: Kind, key: int = 0, chunk: int = 0, it: int = 0,
             payload: np.ndarray | None = None, sender: int = 0) -> None:
        nbytes = 0 if payload is None else payload.nbytes
        head = HEADER.pack(kind, 0, sender, key, chunk, it, nbytes)
        try:
            with self._send_lock:
                if payload is None:
                    self.sock.sendall(head)
                else:
                    self._send_vector(head, memoryview(payload).cast("B"))
        except OSError as e:
            raise CommError(f"sending to {self.peer}: {e}") from None

    def _send_vector(self, head: bytes, body: memoryview) -> None:
        # One sendmsg for header and payload: no copy, and no tiny header segment alone.
        sent = self.sock.sendmsg([head, body])
        total = len(head) + len(body)
        if sent < len(head):
            self.sock.sendall(head[sent:])
            sent = len(head)
        if sent < total:
            self.sock.sendall(body[sent - len(head):])

    def recv_header(self) -> Header:
        buf = bytearray(HEADER.size)
        self.recv_into(memoryview(buf))
        kind, _flags, sender, key, chunk, it, nbytes = HEADER.unpack(buf)
        try:
            return Header(Kind(kind), sender, key, chunk, it, nbytes)
        except ValueError:
            raise CommError(f"{self.peer}: bad frame kind {kind}") from None

    def recv_into(self, view: memoryview) -> None:
        view = view.cast("B") if view.format != "B" else view
        got, n = 0, len(view)
        while got < n:
            try:
                r = self.sock.recv_into(view[got:], n - got)
            except OSError as e:
                raise CommError(f"{self.peer}: {e}") from None
            if r == 0:
                raise CommError(f"{self.peer} closed the connection")
            got += r

    def recv_array(self, nbytes: int) -> np.ndarray:
        arr = np.empty(nbytes // 4, dtype=np.float32)
        self.recv_into(memoryview(arr))
        return arr

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


class Outbox:
    """Frames for one connection, sent by one thread in priority order (lowest first)."""

    _STOP = (float("inf"),)

    def __init__(self, conn: Connection, on_error: Callable[[BaseException], None], sender: int = 0):
        self.conn = conn
        self.sender = sender
        self._on_error = on_error
        self._heap: list = []
        self._seq = itertools.count()
        self._cv = threading.Condition()
        self._thread = threading.Thread(target=self._run, name=f"send-{conn.peer}", daemon=True)
        self._thread.start()

    def put(self, prio: tuple, kind: Kind, key: int = 0, chunk: int = 0, it: int = 0,
            payload: np.ndarray | None = None) -> None:
        with self._cv:
            heapq.heappush(self._heap, (prio, next(self._seq), kind, key, chunk, it, payload))
            self._cv.notify()

    def _run(self) -> None:
        try:
            while True:
                with self._cv:
                    while not self._heap:
                        self._cv.wait()
                    prio, _, kind, key, chunk, it, payload = heapq.heappop(self._heap)
                if prio == self._STOP:
                    self.conn.send(Kind.BYE, sender=self.sender)
                    return
                self.conn.send(kind, key, chunk, it, payload, sender=self.sender)
        except BaseException as e:  # noqa: BLE001 - reported to the owner, who fails loudly
            self._on_error(e)

    def close(self, timeout: float = 30.0) -> None:
        """Send what is queued and a BYE, then stop the thread."""
        self.put(self._STOP, Kind.BYE)
        self._thread.join(timeout)


def listen(ip: str, port: int, backlog: int = 64) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((ip, port))
    s.listen(backlog)
    return s


def connect(ip: str, port: int, peer: str, timeout_s: float) -> Connection:
    """Connect, retrying while the peer is not listening yet (roles start in any order)."""
    deadline = time.monotonic() + timeout_s
    delay = 0.05
    while True:
        try:
            sock = socket.create_connection((ip, port), timeout=5)
            sock.settimeout(None)
            return Connection(sock, peer)
        except OSError as e:
            if time.monotonic() > deadline:
                raise CommError(f"cannot connect to {peer} at {ip}:{port} within {timeout_s:.0f} s: {e}") from None
            time.sleep(delay)
            delay = min(delay * 2, 0.5)
