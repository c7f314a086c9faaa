"""The peer set-up every scheduler shares (schedulers/transport/peers.py), over real TCP on 127.0.0.1.

A dialer retries until the listener appears; a timeout names who is missing; a wrong HELLO,
an unknown rank and a peer that comes after a failure are answered with ABORT and the
reason, so the peer's own error says why rather than 'connection refused'.
"""
from __future__ import annotations

import socket
import threading
import time

import pytest

from schedulers.core.base import CommError
from schedulers.transport.connection import Kind
from schedulers.transport.peers import Acceptor, Hello, dial


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def name(rank: int) -> str:
    return f"worker {rank} (h{rank})"


def in_thread(fn, *args, **kw) -> dict:
    """Run fn in a thread; the dict gets 'value' or 'error' once it ends ('thread' to join)."""
    out: dict = {}

    def run():
        try:
            out["value"] = fn(*args, **kw)
        except BaseException as e:  # noqa: BLE001 - the test inspects it
            out["error"] = e
    out["thread"] = threading.Thread(target=run, daemon=True)
    out["thread"].start()
    return out


def test_dial_retries_until_the_listener_appears():
    port = free_port()
    me = Hello(0, 2, extra=7)

    def listen_late():
        time.sleep(0.3)
        with Acceptor("127.0.0.1", port, me, 2.0, name) as acceptor:
            return acceptor.accept({1}, reply=True)

    late = in_thread(listen_late)
    t0 = time.monotonic()
    conn = dial("127.0.0.1", port, name(0), 3.0, Hello(1, 2, extra=7), expect=0)
    assert time.monotonic() - t0 >= 0.25
    late["thread"].join(2)
    accepted = late["value"][1]
    assert accepted.peer == name(1)            # named after its HELLO
    conn.send(Kind.BYE, sender=1)
    assert accepted.recv_header().kind == Kind.BYE
    conn.close()
    accepted.close()


def test_dial_timeout_names_the_peer():
    port = free_port()
    t0 = time.monotonic()
    with pytest.raises(CommError, match=rf"^cannot connect to worker 3 \(h3\) at 127\.0\.0\.1:{port} within 0 s"):
        dial("127.0.0.1", port, name(3), 0.3, Hello(0, 4))
    assert time.monotonic() - t0 < 1.5


def test_accept_timeout_names_every_missing_peer():
    with Acceptor("127.0.0.1", 0, Hello(0, 4), 0.3, name) as acceptor:
        dialer = in_thread(dial, "127.0.0.1", acceptor.port, name(0), 1.0, Hello(2, 4))
        t0 = time.monotonic()
        with pytest.raises(CommError, match=r"^worker 1 \(h1\), worker 3 \(h3\) never connected within 0 s$"):
            acceptor.accept({1, 2, 3})
        assert time.monotonic() - t0 < 1.0
    dialer["thread"].join(1)
    dialer["value"].close()


@pytest.mark.slow  # a CLI or timing subprocess: about a second
def test_anonymous_peers_are_counted_and_the_deadline_restarts_per_peer():
    """The parameter server: it names no worker it has not heard from, and each worker gets
    timeout_s from the one before."""
    with Acceptor("127.0.0.1", 0, Hello(0, 3), 0.4) as acceptor:
        def late(rank, after):
            time.sleep(after)
            return dial("127.0.0.1", acceptor.port, "server 0", 1.0, Hello(rank, 3))
        dialers = [in_thread(late, 0, 0.25), in_thread(late, 1, 0.5)]   # 0.5 s > 0.4 s, but 0.25 s after 0
        with pytest.raises(CommError, match=r"^1 worker\(s\) never connected within 0 s$"):
            acceptor.accept(range(3), per_peer=True)
        assert acceptor.waiting == {2}
    for d in dialers:
        d["thread"].join(1)
        d["value"].close()


@pytest.mark.parametrize("hello,expected", [
    (Hello(1, 5), r"expected HELLO from worker 1 of 4, got HELLO from 1 of 5"),      # another job's size
    (Hello(3, 4), r"expected HELLO from worker 1 of 4, got HELLO from 3 of 4"),      # an unknown rank
], ids=["size", "rank"])
def test_wrong_hello_is_refused_and_the_dialer_hears_why(hello, expected):
    with Acceptor("127.0.0.1", 0, Hello(0, 4), 2.0, name) as acceptor:
        dialer = in_thread(dial, "127.0.0.1", acceptor.port, name(0), 2.0, hello, expect=0)
        with pytest.raises(CommError, match=rf"^worker at 127\.0\.0\.1:\d+: {expected}$"):
            acceptor.accept({1}, reply=True)
    dialer["thread"].join(2)
    assert isinstance(dialer["error"], CommError) and expected in str(dialer["error"]), dialer


def test_check_callback_refuses_both_ways():
    """The field beyond rank and size (a plan digest, a server mode) is the caller's check; a
    refusal reaches the other side as ABORT, whichever side refuses."""
    def same_digest(conn, h):
        if h.chunk != 42:
            raise CommError(f"{conn.peer} has digest {h.chunk}")

    with Acceptor("127.0.0.1", 0, Hello(0, 2, extra=42), 2.0, name) as acceptor:
        dialer = in_thread(dial, "127.0.0.1", acceptor.port, name(0), 2.0, Hello(1, 2, extra=9), expect=0,
                           check=same_digest)
        with pytest.raises(CommError, match=r"^worker 1 \(h1\) has digest 9$"):
            acceptor.accept({1}, same_digest, reply=True)
    dialer["thread"].join(2)
    assert str(dialer["error"]) == "worker 1 (h1) has digest 9"

    with Acceptor("127.0.0.1", 0, Hello(0, 2, extra=9), 2.0, name) as acceptor:   # the listener is the odd one
        dialer = in_thread(dial, "127.0.0.1", acceptor.port, name(0), 2.0, Hello(1, 2, extra=42), expect=0,
                           check=same_digest)
        (conn,) = acceptor.accept({1}, reply=True).values()
        dialer["thread"].join(2)
        conn.close()
    assert str(dialer["error"]) == "worker 0 (h0) has digest 9"


def test_late_and_waiting_peers_are_turned_away_with_the_reason():
    """A listener that failed answers the peer already in its backlog and, for a moment, the
    one that connects later, instead of closing the port on them."""
    port = free_port()
    acceptor = Acceptor("127.0.0.1", port, Hello(0, 3), 2.0, name)
    acceptor.waiting = {1, 2}
    early = in_thread(dial, "127.0.0.1", port, name(0), 2.0, Hello(1, 3), expect=0)
    time.sleep(0.1)                                           # in the backlog, its HELLO unread
    late = in_thread(lambda: (time.sleep(0.2), dial("127.0.0.1", port, name(0), 2.0, Hello(2, 3), expect=0)))
    t0 = time.monotonic()
    acceptor.turn_away("worker 0 failed: disk on fire", for_s=1.0)
    assert time.monotonic() - t0 < 0.9, "stops once every missing peer has been answered"
    acceptor.close()
    for d in (early, late):
        d["thread"].join(2)
        assert str(d["error"]) == "worker 0 failed: disk on fire", d


def test_failed_block_turns_the_backlog_away():
    """As a context manager: an error inside the block is what the waiting peers hear."""
    port = free_port()
    dialer = None
    with pytest.raises(CommError, match="the next leader is gone"):
        with Acceptor("127.0.0.1", port, Hello(0, 2), 2.0, name):
            dialer = in_thread(dial, "127.0.0.1", port, name(0), 2.0, Hello(1, 2), expect=0)
            time.sleep(0.1)
            raise CommError("the next leader is gone")
    dialer["thread"].join(2)
    assert str(dialer["error"]) == "the next leader is gone"


def test_stop_ends_accept_early_and_hands_over_connections():
    stop = threading.Event()
    attached: list = []
    with Acceptor("127.0.0.1", 0, Hello(0, 3), 5.0, name) as acceptor:
        dialer = in_thread(dial, "127.0.0.1", acceptor.port, name(0), 2.0, Hello(2, 3))
        threading.Timer(0.3, stop.set).start()
        t0 = time.monotonic()
        got = acceptor.accept({1, 2}, stop=stop, on_accept=lambda r, c: attached.append((r, c.peer)))
        assert 0.25 < time.monotonic() - t0 < 1.0
    assert got == {} and attached == [(2, name(2))] and acceptor.waiting == {1}
    dialer["thread"].join(1)
    dialer["value"].close()
