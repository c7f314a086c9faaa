"""Priority-based parameter propagation (P3, Jayarajan et al., SysML'19).

Every gradient is cut into slices of `slice_numel` elements (the paper's 40,000), and the
slices are spread over the servers balanced by size, so one large layer keeps every server
link busy. Priority acts at both ends: each worker's per-server outbox always sends its
best (iteration, layer priority, slice) next, and the server queues received slices by the
same order and sums them best first (server mode QUEUED). The server answers each push with
the slice's average once every worker's copy is in: there is no pull request. A modelled
start-up cost (`startup_us`, `schedulers/ps/client.py`) is paid by every slice pushed: each slice
is a request of its own (P3 pushes every slice as a separate key-value message), and the
answer needs no request.
"""
from __future__ import annotations

from pydantic import Field

from contracts.scheduler_info import TuneDim
from schedulers.api import TensorSpec
from schedulers.ps.client import PSParams, PushScheduler, assign_servers
from schedulers.transport.connection import Mode


class P3Params(PSParams):
    slice_numel: int = Field(default=40_000, gt=0, description="elements per slice (P3's default)")


class P3(PushScheduler):
    name = "p3"
    Params = P3Params
    server_mode = Mode.QUEUED
    family = "parameter_server"
    bound_model = "parameter_server"  # each worker pushes and pulls G/S to and from each of the S servers
    display_order = 2
    tuning = (TuneDim(name="slice_numel", param="slice_numel", low=1_000, high=1_000_000, integer=True,
                      about="elements per slice"),)  # around P3's 40k
    claims = {"mercury-over-partitioning": "baseline", "mercury-over-partitioning-dynamic": "baseline",
              "forest-heterogeneous": "baseline"}
    report_sections = ("startup",)  # a reference level per start-up cost

    def slice_numel(self) -> int:
        return self.params.slice_numel

    def layout(self, tensors: list[TensorSpec], sizes: dict[int, list[int]]) -> dict[int, list[int]]:
        slots = [(t.key, c, n) for t in tensors for c, n in enumerate(sizes[t.key])]
        where = assign_servers(slots, len(self.ctx.servers))
        return {t.key: [where[(t.key, c)] for c in range(len(sizes[t.key]))] for t in tensors}
