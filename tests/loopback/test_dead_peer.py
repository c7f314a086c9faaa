"""How long a connection waits for a silent peer (schedulers/transport/connection.py), over
real TCP on 127.0.0.1: the kernel's own timers, read back from the sockets.

Under time dilation k a role's links run k times slower, so its dead-peer time is k times the
transport's 30 s (the role spec's `dead_peer_s`): at k = 32 a probe flow sharing a 1.6 Mb/s
uplink with 99 others went 30 s unacknowledged and the kernel dropped a live connection.
"""
from __future__ import annotations

import socket

import pytest

from contracts.role_spec import DEAD_PEER_S
from schedulers.transport import connection
from schedulers.transport.connection import Connection, dead_peer_s, set_dead_peer_s


def _timers(conn: Connection) -> tuple[int, int, int, int]:
    """(TCP_USER_TIMEOUT ms, TCP_KEEPIDLE s, TCP_KEEPINTVL s, TCP_KEEPCNT) as the kernel holds them."""
    s = conn.sock
    return tuple(s.getsockopt(socket.IPPROTO_TCP, opt) for opt in
                 (socket.TCP_USER_TIMEOUT, socket.TCP_KEEPIDLE, socket.TCP_KEEPINTVL, socket.TCP_KEEPCNT))


def _connection() -> Connection:
    with socket.create_server(("127.0.0.1", 0)) as lsock:
        a = socket.create_connection(lsock.getsockname())
        b, _ = lsock.accept()
    b.close()
    return Connection(a, "A")


@pytest.fixture
def restore():
    yield
    set_dead_peer_s(DEAD_PEER_S)


def test_a_connection_gives_up_on_a_silent_peer_after_the_dead_peer_time(restore):
    conn = _connection()
    try:    # 10 s idle, then 10 keepalive probes 2 s apart: 30 s either way
        assert dead_peer_s() == DEAD_PEER_S == 30 and _timers(conn) == (30_000, 10, 2, 10)
    finally:
        conn.sock.close()
    set_dead_peer_s(30 * 32)
    conn = _connection()
    try:    # the role of a run at time dilation 32: every timer 32 times longer
        assert _timers(conn) == (960_000, 320, 64, 10)
    finally:
        conn.sock.close()


@pytest.mark.parametrize("bad", [0, -1.0, float("nan")])
def test_a_dead_peer_time_that_is_not_positive_is_refused(bad, restore):
    with pytest.raises(ValueError, match="dead_peer_s"):
        set_dead_peer_s(bad)
    assert connection.dead_peer_s() == DEAD_PEER_S
