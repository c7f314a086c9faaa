"""Packet-level priority at the transport layer (Mercury, Duan et al., IEEE TPDS 2023).

Gradients are not partitioned into requests; they are cut into small packets that go into
one priority buffer per server connection (the transport's outbox), and the connection
always sends its highest-priority packet next: (iteration, layer position from the input,
packet). A gradient of a lower layer that becomes ready while a higher layer is on the wire
therefore goes out after at most the packet being written, and then waits only for the
bytes not yet out of the host, which the PS family bounds to 0.5 ms of the link (8 KiB at
least, transport.py HOST_QUEUE_S): about two packet times in all, measured per packet
with `trace: true` (`inversion_s`, schedulers/transport/txstamps.py).
The server (mode IMMEDIATE) sums each packet as it arrives and sends the average back to
every worker the moment the last copy is in, its own sends ordered the same way: push and
pull overlap packet by packet, with no pull request.

Packets are dealt round-robin over the servers, continuing from one tensor to the next, so
the load is balanced to within one packet and every layer uses every server link.

Packet size (`packet_bytes`, payload bytes; default 16 KiB). Smaller packets preempt sooner
but cost the server per packet, in Python, in and out, whatever their size: the server's
packet rate, not the bytes, limits it (`bench/bench_transport_loopback.py packets`). Going
below 16 KiB also buys little: one 16 KiB packet is 1.3 ms at 100 Mb/s, and a preempting
gradient still waits behind the host's bounded queue (at least 8 KiB). 16 KiB is the
smallest packet that leaves the server CPU for links up to 1 Gb/s; set it lower for slower
links if the preemption granularity matters.

A modelled start-up cost (`startup_us`, `schedulers/ps/client.py`) is paid once per tensor per
iteration on each server connection that carries any of its packets, when the tensor's
first packet on that connection is written; its other packets pay nothing. The paper puts
the start-up slot before each communication request (ByteScheduler's every partition), and
Mercury makes no request per packet: its packets are transport-level segments of one
stream per tensor, so a tensor is one message per connection however finely it is cut
and however often it is preempted. (An earlier reading charged every packet the start-up cost, the
harshest one, which charged Mercury for partitioning it does not do.)
"""
from __future__ import annotations

from pydantic import Field

from schedulers.api import TensorSpec
from schedulers.ps.client import PSParams, PushScheduler
from schedulers.transport.connection import Mode


class MercuryParams(PSParams):
    packet_bytes: int = Field(default=16384, ge=4, le=67_108_864, multiple_of=4,
                              description="payload bytes per packet (a multiple of 4: float32)")
    pace_to_share: bool = Field(
        default=True,
        description="pace the worker's connection to each server at the share of that server's link the "
                    "server measures and sends once packets are dropped before it (incast; "
                    "schedulers/ps/share.py): a transport-level mechanism, as Mercury's priority is")


class Mercury(PushScheduler):
    name = "mercury"
    Params = MercuryParams
    server_mode = Mode.IMMEDIATE
    family = "parameter_server"
    bound_model = "parameter_server"  # each worker pushes and pulls G/S to and from each of the S servers
    display_order = 3
    claims = {"mercury-over-ps": "claimed", "mercury-over-partitioning": "claimed",
              "mercury-over-ps-dynamic": "claimed", "mercury-over-partitioning-dynamic": "claimed"}
    report_sections = ("startup",)  # its start-up cost once per tensor against partitioning's

    def slice_numel(self) -> int:
        return self.params.packet_bytes // 4

    def layout(self, tensors: list[TensorSpec], sizes: dict[int, list[int]]) -> dict[int, list[int]]:
        num_servers, dealt, out = len(self.ctx.servers), 0, {}
        for t in sorted(tensors, key=lambda t: t.key):
            out[t.key] = [(dealt + c) % num_servers for c in range(len(sizes[t.key]))]
            dealt += len(sizes[t.key])
        return out

    def starts_message(self, servers: list[int]) -> list[bool]:
        """A tensor's first packet on each server starts its message there; the rest are
        segments of the same stream."""
        seen: set[int] = set()
        starts = []
        for s in servers:
            starts.append(s not in seen)
            seen.add(s)
        return starts
