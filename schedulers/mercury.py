"""Packet-level priority at the transport layer (Mercury, Duan et al., IEEE TPDS 2023).

Gradients are not partitioned into requests; they are cut into small packets that go into
one priority buffer per server connection (the transport's outbox), and the connection
always sends its highest-priority packet next: (iteration, layer position from the input,
packet). A gradient of a lower layer that becomes ready while a higher layer is on the wire
therefore goes out after at most the packet being written, and then waits only for the
bytes already in the kernel's bounded send queue (~10 ms of the link, see transport.py).
The server (mode IMMEDIATE) sums each packet as it arrives and sends the average back to
every worker the moment the last copy is in, its own sends ordered the same way: push and
pull overlap packet by packet, with no pull request.

Packets are dealt round-robin over the servers, continuing from one tensor to the next, so
the load is balanced to within one packet and every layer uses every server link.

Packet size (`packet_bytes`, payload bytes; default 16 KiB). Smaller packets preempt sooner
but cost the server per packet, in Python, in and out, whatever their size: the server's
packet rate, not the bytes, limits it (`bench/bench_transport_loopback.py packets`). Going
below 16 KiB also buys little: one 16 KiB packet is 1.3 ms at 100 Mb/s, while a preempting
gradient mostly waits behind the kernel's bounded send queue (~10 ms of the link,
transport.py). 16 KiB is the smallest packet that leaves the server CPU for links up to
1 Gb/s; set it lower for slower links if the preemption granularity matters.

A modelled start-up cost (`startup_us`, `schedulers/ps.py`) is paid by every packet, since
each is a frame of its own: the harshest reading of a per-message cost for Mercury, whose
paper puts the start-up slot before each tensor partition, not each transport packet.
"""
from __future__ import annotations

from pydantic import Field

from schedulers.base import TensorSpec
from schedulers.ps import PSParams, PushScheduler
from schedulers.transport import Mode


class MercuryParams(PSParams):
    packet_bytes: int = Field(default=16384, ge=4, le=67_108_864, multiple_of=4,
                              description="payload bytes per packet (a multiple of 4: float32)")


class Mercury(PushScheduler):
    name = "mercury"
    Params = MercuryParams
    server_mode = Mode.IMMEDIATE

    def slice_numel(self) -> int:
        return self.params.packet_bytes // 4

    def layout(self, tensors: list[TensorSpec], sizes: dict[int, list[int]]) -> dict[int, list[int]]:
        num_servers, dealt, out = len(self.ctx.servers), 0, {}
        for t in sorted(tensors, key=lambda t: t.key):
            out[t.key] = [(dealt + c) % num_servers for c in range(len(sizes[t.key]))]
            dealt += len(sizes[t.key])
        return out
