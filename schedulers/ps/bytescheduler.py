"""Tensor partitioning with priority and credit (ByteScheduler, SOSP'19).

Each gradient is cut into partitions; partitions go out by layer priority (the layer
nearest the input first) and then partition index; a credit window bounds how many
parameters are pushed but not yet acknowledged by their server, so a high-priority
partition that becomes ready waits behind at most `credit_numel` parameters in the
network. Each partition is its own push and pull request, so the per-request start-up
cost is paid for real (and `startup_us` adds a modelled one per PUSH and PULL, see
`schedulers/ps/client.py`). The PULL frames go in the same priority order as the pushes.

The server answers in the order the requests arrive (server mode PULL), as ByteScheduler's
unmodified ps-lite server does: all of its priority is the worker's.
Defaults are the paper's PS defaults (partition 1,000,000, credit 4,000,000 parameters).
"""
from __future__ import annotations

from pydantic import Field

from contracts.scheduler_info import TuneDim
from schedulers.ps.client import CommTask, PSParams, PSScheduler


class ByteSchedulerParams(PSParams):
    partition_numel: int = Field(default=1_000_000, gt=0, description="elements (parameters) per partition")
    credit_numel: int = Field(default=4_000_000, gt=0, description="elements (parameters) in flight at most")


class ByteScheduler(PSScheduler):
    name = "bytescheduler"
    Params = ByteSchedulerParams
    family = "parameter_server"
    bound_model = "parameter_server"  # each worker pushes and pulls G/S to and from each of the S servers
    display_order = 1
    # Around the paper's defaults and the 1/60 scaling of configs/sweeps/priority_base.yaml (partition
    # 16k, credit 64k), wide enough for models of 0.1M to 100M parameters. Credit is searched as a
    # multiple of the partition, so every point is a valid pair (credit >= partition) and the space
    # stays a fixed box, which TPE and GP sample best.
    tuning = (TuneDim(name="partition_numel", param="partition_numel", low=1_000, high=4_000_000, integer=True,
                      about="parameters per partition"),
              TuneDim(name="credit_ratio", param="credit_numel", low=1.0, high=16.0, integer=False,
                      about="credit_numel = round(partition_numel x credit_ratio)", ratio_of="partition_numel"))
    claims = {"mercury-over-partitioning": "baseline", "mercury-over-partitioning-dynamic": "baseline",
              "forest-heterogeneous": "baseline"}
    report_sections = ("startup",)  # its partition against the start-up cost

    def partition_numel(self) -> int:
        return self.params.partition_numel

    def credit_numel(self) -> int:
        return self.params.credit_numel

    def order(self, task: CommTask) -> tuple:
        return (task.it, task.priority, task.chunk)
