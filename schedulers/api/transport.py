"""The transport for scheduler authors: framed TCP between peers and the peer set-up helpers,
the same the built-in schedulers use (schedulers/transport/, docs/design.md: Transport).

- `Connection`: one TCP connection to a named peer; `send(kind, key, chunk, it, payload,
  sender, priority)` writes one frame, `recv_header()` reads the next 24-byte header
  (`Header`: kind, flags, sender, key, chunk, it, priority, nbytes), `recv_into(view)` /
  `recv_array(nbytes)` its float32 payload, `recv_text(nbytes)` an ABORT's reason,
  `abort(reason, sender)`, `close()`.
- `Kind`: frame kinds (HELLO, PUSH, ACK, PULL, RESULT, BYE, ABORT, ...); `Mode`: the built-in
  parameter server's modes (a PS-family plugin's `server_mode`).
- `Outbox(conn, on_error, sender)`: a send thread per connection taking frames in priority
  order (`put(order, kind, ...)`, `close()`, `abort(reason)`).
- `Hello(rank, n, extra)`, `dial(ip, port, peer, timeout_s, me, expect=None, check=None)`: connect
  with retries until the timeout and exchange HELLOs; `Acceptor(ip, port, me, timeout_s)`:
  as a context manager, `accept(expected_ranks, reply=True)` -> {rank: Connection}, refusing
  wrong or unexpected peers with ABORT and the reason.
- `listen(ip, port)`, `connect(ip, port, peer, timeout_s)`: the plain socket steps.
"""
from __future__ import annotations

from schedulers.transport.connection import Connection, Header, Kind, Mode, Outbox, abort_all, connect, listen
from schedulers.transport.peers import Acceptor, Hello, dial, expect_hello

__all__ = ["Acceptor", "Connection", "Header", "Hello", "Kind", "Mode", "Outbox", "abort_all", "connect", "dial",
           "expect_hello", "listen"]
