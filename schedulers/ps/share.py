"""Incast at the parameter server: each worker paced at its share of the server's link.

When the workers' links together are faster than the server's, their pushes meet in the
switch's queue toward the server. It overflows, TCP retransmits, and the flows that lost a
packet fall behind the others; a slot completes only when its slowest copy is in, so the
iteration waits for the flows that fell behind while the server's link idles at the end.
Measured (8 workers at 100 Mb/s into a 400 Mb/s server, mercury, replayed small VGG): 0.79 of
the bound with 560 segments retransmitted; every worker paced at 48 Mb/s, 0.97 and none.

The server never reads the emulator; it measures. `InboundMeter` counts the payload bytes the
server receives per METER_S and keeps the largest rate seen. A packet dropped before the
server shows as out-of-order segments in the server's sockets (TCP_INFO tcpi_rcv_ooopack,
Linux 5.4+; without it nothing is ever paced). The first drop turns pacing on: every worker is
sent its share, the largest rate / workers (bytes/s of payload), in a CTRL frame, and applies
it as SO_MAX_PACING_RATE on its connection, which turns on TCP's own pacing under any
congestion control, no fq needed. The kernel paces whole segments, headers included, so
the paced payload stays about 3.5% under the share and the queue toward the server drains.
A drop while paced lowers the largest rate by DECREASE and sends the new share. Workers whose
scheduler does not pace (`pace_to_share: false`: the baselines as their authors deploy them)
ignore the frame.
"""
from __future__ import annotations

import socket
import struct

METER_S = 0.1          # the rate is measured over windows this long
DECREASE = 0.95        # a drop while paced takes this much of the largest rate
MIN_CHANGE = 0.02      # a share that moved less than this is not sent again
_TCP_INFO_LEN = 232
_OOOPACK = struct.Struct("=I")
_OOOPACK_OFFSET = 224  # struct tcp_info: tcpi_rcv_ooopack (Linux 5.4+)


def out_of_order(sock: socket.socket) -> int | None:
    """Segments this socket received out of order so far (a loss ahead of it), or None where the
    kernel does not count them."""
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO_LEN)
    except OSError:
        return None
    if len(info) < _OOOPACK_OFFSET + 4:
        return None
    return _OOOPACK.unpack_from(info, _OOOPACK_OFFSET)[0]




class InboundMeter:
    """The server's measure of its own inbound link and the share it gives each worker.

    `received(n)` as each push's payload is read; `tick(now, out_of_order_total)` after a round of
    the server's loop returns a new share in bytes/s to send to every worker, or None. Pure
    bookkeeping: the caller reads the sockets and sends the frames."""

    def __init__(self, workers: int):
        self.workers = workers
        self.bytes = 0
        self.largest = 0.0           # largest rate over a window, bytes/s
        self.share: int | None = None
        self.drops_seen = 0          # windows in which a drop was seen
        self._t0: float | None = None
        self._bytes0 = 0
        self._ooo: int | None = None

    def received(self, nbytes: int) -> None:
        self.bytes += nbytes

    def due(self, now: float) -> bool:
        return self._t0 is None or now - self._t0 >= METER_S

    def tick(self, now: float, ooo: int | None) -> int | None:
        if self._t0 is None:
            self._t0, self._bytes0, self._ooo = now, self.bytes, ooo
            return None
        if now - self._t0 < METER_S:
            return None
        rate = (self.bytes - self._bytes0) / (now - self._t0)
        dropped = ooo is not None and self._ooo is not None and ooo > self._ooo
        self._t0, self._bytes0, self._ooo = now, self.bytes, ooo
        if dropped and self.share is not None:
            self.largest *= DECREASE        # paced and still dropping: the share was too large
        elif rate > self.largest:
            self.largest = rate
        self.drops_seen += dropped
        if not self.drops_seen or self.largest <= 0:
            return None
        share = int(self.largest / self.workers)
        if self.share is not None and abs(share - self.share) <= MIN_CHANGE * self.share:
            return None
        self.share = share
        return share
