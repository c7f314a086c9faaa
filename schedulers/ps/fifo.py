"""FIFO parameter server: whole tensors in the order they become ready, push then pull.

The baseline both papers measure against: no partitioning and no credit window (the
defaults of `PSScheduler`'s hooks), and no priority anywhere, first come, first served:

- worker, queue: tensors leave in the order `push()` saw them (readiness order);
- worker, connection: every frame has the same outbox order, so PUSH and PULL frames go
  out in the order they were queued. (Once a PULL carried its tensor's
  readiness position and overtook the pushes of later-ready tensors still waiting in the
  outbox, a priority fifo does not have; a plain FIFO queue sends it after them.)
- server (mode PULL): ACKs and results in the order the pushes and pulls arrived
  (`schedulers/ps/server.py`; it once answered by key, which is layer order).
"""
from __future__ import annotations

from schedulers.ps.client import CommTask, PSParams, PSScheduler


class FIFOParams(PSParams):
    pass


class FIFO(PSScheduler):
    name = "fifo"
    Params = FIFOParams
    family = "parameter_server"
    bound_model = "parameter_server"  # each worker pushes and pulls G/S to and from each of the S servers
    display_order = 0
    baseline = True  # the plain parameter server both papers measure against
    claims = {"mercury-over-ps": "baseline", "mercury-over-ps-dynamic": "baseline",
              "forest-heterogeneous": "baseline"}
    report_sections = ("startup",)  # a reference level per start-up cost

    def order(self, task: CommTask) -> tuple:
        return (task.seq, task.chunk)

    def wire_order(self, task: CommTask) -> tuple:
        return ()  # one order for every frame: the outbox sends in queueing order
