"""FIFO parameter server: whole tensors in the order they become ready, push then pull.

The baseline both papers measure against: no partitioning and no credit window (the
defaults of `PSScheduler`'s hooks), no priority (readiness order).
"""
from __future__ import annotations

from schedulers.base import SchedulerParams
from schedulers.ps import CommTask, PSScheduler


class FIFOParams(SchedulerParams):
    pass


class FIFO(PSScheduler):
    name = "fifo"
    Params = FIFOParams

    def order(self, task: CommTask) -> tuple:
        return (task.seq, task.chunk)
