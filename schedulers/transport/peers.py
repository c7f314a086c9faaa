"""Setting up a job's connections: listen, dial, say HELLO, check the peers' HELLO.

Every scheduler on this transport starts alike. Roles start in any order, so a dialer
retries until the connect timeout (`connection.connect`); the first frame each way is a
HELLO (sender = rank, key = the job's size, chunk = one field both sides must agree on:
forest's plan digest, the PS server mode, else 0); and a role that fails while starting
answers whoever still connects with ABORT and the reason, not a reset, so that the peer's
error names the role that really failed. Ring, hierarchical, forest, the PS workers and
the parameter server differ only in whom they dial, whom they expect, and what a HELLO
must say beyond rank and size: that is the `check` callback.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass

from schedulers.core.base import CommError
from schedulers.transport.connection import Connection, Header, Kind, connect, listen

Check = Callable[[Connection, Header], None]  # raises CommError if a HELLO (rank and size already checked) is wrong
POLL_S = 0.2        # how often an accept with a `stop` event looks at it
LATE_HELLO_S = 0.5  # how long a turned-away peer's HELLO is waited for (read, closing sends FIN, not RST)


@dataclass(frozen=True)
class Hello:
    """What our HELLO says: our rank, the number of workers, and `extra` (its chunk field)."""

    rank: int
    n: int
    extra: int = 0

    def send(self, conn: Connection) -> None:
        conn.send(Kind.HELLO, key=self.n, chunk=self.extra, sender=self.rank)


def expect_hello(h: Header, where: str, ranks: Collection[int], n: int) -> None:
    """A HELLO from one of `ranks` in a job of `n` workers, or a CommError saying what came."""
    if h.kind != Kind.HELLO or h.sender not in ranks or h.key != n:
        who = f"worker {next(iter(ranks))}" if len(ranks) == 1 else f"one of workers {sorted(ranks)}"
        raise CommError(f"{where}: expected HELLO from {who} of {n}, got {h.kind.name} from {h.sender} of {h.key}")


def dial(ip: str, port: int, peer: str, timeout_s: float, me: Hello, expect: int | None = None,
         check: Check | None = None) -> Connection:
    """Connect to `peer`, retrying until timeout_s, and say HELLO. With `expect` (its rank),
    also wait, within what is left of timeout_s, for its HELLO in reply and check it: an
    ABORT in its place raises the peer's reason, so a refusal names who refused and why."""
    deadline = time.monotonic() + timeout_s
    conn = connect(ip, port, peer, timeout_s)
    try:
        me.send(conn)
        if expect is not None:
            conn.sock.settimeout(max(deadline - time.monotonic(), 0.1))
            h = conn.recv_header()
            if h.kind == Kind.ABORT:
                raise CommError(conn.recv_text(h.nbytes) or f"{conn.peer} aborted")
            expect_hello(h, conn.peer, {expect}, me.n)
            if check is not None:
                check(conn, h)
            conn.sock.settimeout(None)
    except BaseException:
        conn.close()
        raise
    return conn


class Acceptor:
    """The listening side of a rendezvous: our port, the peers that must dial in, and the
    refusal of the rest. As a context manager it closes the port on exit, first answering
    whoever waits in the backlog with ABORT and the reason if the block failed."""

    def __init__(self, ip: str, port: int, me: Hello, timeout_s: float, name: Callable[[int], str] | None = None):
        """me: our HELLO (a peer's must give the same number of workers; its rank is the
        sender of our ABORTs). name: a peer's name by rank; None: 'worker R (its IP)', and a
        timeout counts the missing workers instead of naming them."""
        self.sock = listen(ip, port)
        self.me, self.timeout_s, self._name = me, timeout_s, name
        self.waiting: set[int] = set()   # expected by the last accept() and not accepted

    @property
    def port(self) -> int:
        return self.sock.getsockname()[1]

    def accept(self, expected: Collection[int], check: Check | None = None, *, reply: bool = False,
               deadline: float | None = None, per_peer: bool = False, stop: threading.Event | None = None,
               on_accept: Callable[[int, Connection], None] | None = None) -> dict[int, Connection]:
        """Accept until every rank in `expected` has said a good HELLO (and, with `reply`,
        heard ours), by `deadline` (default: timeout_s from now; `per_peer`: timeout_s from
        the last peer accepted). A wrong HELLO fails: that peer is sent ABORT with the
        reason, and so is every peer accepted so far and not handed to `on_accept` (which
        then owns its connection). With `stop`, returns early once it is set."""
        self.waiting = set(expected)
        got: dict[int, Connection] = {}
        deadline = time.monotonic() + self.timeout_s if deadline is None else deadline
        try:
            while self.waiting and not (stop is not None and stop.is_set()):
                left = deadline - time.monotonic()
                self.sock.settimeout(max(min(left, POLL_S) if stop is not None else left, 0.01))
                try:
                    sock, addr = self.sock.accept()
                except TimeoutError:
                    if stop is not None and time.monotonic() < deadline:
                        continue
                    raise self._never_connected() from None
                rank, conn = self._admit(sock, addr, check, reply)
                self.waiting.discard(rank)
                if on_accept is not None:
                    on_accept(rank, conn)
                else:
                    got[rank] = conn
                if per_peer:
                    deadline = time.monotonic() + self.timeout_s
        except BaseException as e:
            for conn in got.values():
                conn.abort(str(e), self.me.rank)
            raise
        return got

    def _admit(self, sock, addr: tuple, check: Check | None, reply: bool) -> tuple[int, Connection]:
        """One connection: its HELLO read (within timeout_s: a silent peer must not block the
        rest) and checked, the connection named after it; refused with ABORT otherwise."""
        where = f"worker at {addr[0]}:{addr[1]}"
        only = next(iter(self.waiting)) if len(self.waiting) == 1 and self._name is not None else None
        conn = Connection(sock, where if only is None else self._name(only))
        try:
            sock.settimeout(self.timeout_s)
            h = conn.recv_header()
            expect_hello(h, where, self.waiting, self.me.n)
            conn.peer = self._name(h.sender) if self._name is not None else f"worker {h.sender} ({addr[0]})"
            if check is not None:
                check(conn, h)
            if reply:
                self.me.send(conn)
            sock.settimeout(None)
        except BaseException as e:
            conn.abort(str(e), self.me.rank)
            raise
        return h.sender, conn

    def _never_connected(self) -> CommError:
        missing = sorted(self.waiting)
        who = f"{len(missing)} worker(s)" if self._name is None else ", ".join(self._name(p) for p in missing)
        return CommError(f"{who} never connected within {self.timeout_s:.0f} s")

    def turn_away(self, reason: str, for_s: float = 0.0) -> None:
        """After failing at start-up: answer with ABORT and `reason` every peer waiting in the
        backlog and, for up to for_s while expected peers are still missing, every one that
        still connects. A closed port would only say 'refused', and the peer would wait out
        its own timeout to report that."""
        until = time.monotonic() + for_s
        while True:
            left = until - time.monotonic() if self.waiting else 0.0
            self.sock.settimeout(max(left, 0.0))   # 0: only what is in the backlog already
            try:
                sock, _addr = self.sock.accept()
            except OSError:   # timed out, or nothing waiting
                return
            conn = Connection(sock, "a late peer")
            sock.settimeout(LATE_HELLO_S)
            try:
                self.waiting.discard(conn.recv_header().sender)
            except (OSError, CommError):
                pass
            conn.abort(reason, self.me.rank)

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> Acceptor:
        return self

    def __exit__(self, kind, exc, tb) -> None:
        try:
            if exc is not None:
                self.turn_away(str(exc))
        finally:
            self.close()
