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

from schedulers.ps.client import CommTask, PSParams, PSScheduler


class ByteSchedulerParams(PSParams):
    partition_numel: int = Field(default=1_000_000, gt=0, description="parameters per partition")
    credit_numel: int = Field(default=4_000_000, gt=0, description="parameters in flight at most")


class ByteScheduler(PSScheduler):
    name = "bytescheduler"
    Params = ByteSchedulerParams

    def partition_numel(self) -> int:
        return self.params.partition_numel

    def credit_numel(self) -> int:
        return self.params.credit_numel

    def order(self, task: CommTask) -> tuple:
        return (task.it, task.priority, task.chunk)
