"""An ABORT reaches its peer (schedulers/transport/connection.py, loop.py), over real TCP on 127.0.0.1.

The ABORT is how a survivor learns which peer really died; without it, it can only name the
messenger. Closing a connection with bytes of the peer's unread resets it, and a reset
discards whatever we have not sent yet: an ABORT queued behind a frame the peer is slow to
read was lost that way.
"""
from __future__ import annotations

import socket
import threading
import time

import numpy as np
import pytest

from schedulers.core.base import CommError
from schedulers.transport.connection import ABORT_LOCK_S, Connection, Kind, Outbox
from schedulers.transport.loop import Loop, abort_peers

FRAME_FLOATS = 100_000   # 400 KB: more than the reader's receive window, less than the kernel takes at once


def pair() -> tuple[Connection, Connection]:
    with socket.create_server(("127.0.0.1", 0)) as lsock:
        a = socket.create_connection(lsock.getsockname())
        b, _ = lsock.accept()
    return Connection(a, "A"), Connection(b, "B")


def read_until_abort(conn: Connection, out: list, start_after_s: float) -> None:
    """The peer's receive thread, busy elsewhere for a while: every frame, up to the ABORT."""
    time.sleep(start_after_s)
    try:
        while True:
            h = conn.recv_header()
            if h.kind == Kind.ABORT:
                out.append(conn.recv_text(h.nbytes))
                return
            conn.recv_array(h.nbytes)
    except CommError as e:
        out.append(e)


@pytest.mark.parametrize("via", ["outbox", "loop"])
def test_abort_behind_a_frame_the_peer_reads_late_still_arrives(via):
    """A sends a frame larger than B's receive window and B has sent A bytes A never reads;
    A aborts while most of the frame still waits in its kernel, and B's receive thread gets
    to it only later. B must read the ABORT with its reason, not a reset."""
    a, b = pair()
    b.send(Kind.PUSH, payload=np.ones(10, np.float32))   # unread at A when it closes
    frame = np.ones(FRAME_FLOATS, np.float32)
    got: list = []
    reader = threading.Thread(target=read_until_abort, args=(b, got, 0.2), daemon=True)
    if via == "outbox":
        written = threading.Event()
        outbox = Outbox(a, lambda e: None, sender=1)
        outbox.put((0,), Kind.PUSH, payload=frame, on_sent=written.set)
        assert written.wait(5), "the kernel did not take the frame"
        reader.start()
        t0 = time.monotonic()
        outbox.abort("worker 2 died")
    else:
        a.send(Kind.PUSH, payload=frame)
        loop = Loop(handler=None)
        peer = loop.add(a, 0, sender=1)
        reader.start()
        t0 = time.monotonic()
        abort_peers([peer], "worker 2 died")
        loop.close()
    took = time.monotonic() - t0
    reader.join(5)
    b.close()
    assert got == ["worker 2 died"], got
    assert took < ABORT_LOCK_S + 0.5, took


def test_abort_to_a_peer_that_never_reads_ends_in_time():
    """A peer that reads nothing holds the close up to the deadline, no longer."""
    a, b = pair()
    b.send(Kind.PUSH, payload=np.ones(10, np.float32))
    a.send(Kind.PUSH, payload=np.ones(FRAME_FLOATS, np.float32))
    t0 = time.monotonic()
    a.abort("worker 2 died", deadline=time.monotonic() + 0.2)
    assert 0.15 < time.monotonic() - t0 < 1.0
    b.close()
