"""Which iterations are measured: the one rule that summaries, the fidelity window,
analysis and plots share.

The first `warmup` iterations are left out (start-up: imports, the first forward pass
that records the layer order, buffers allocated on first use). A run with `warmup >=
iterations` still measures its last iteration, so every completed run has a summary
rather than empty statistics.
"""
from __future__ import annotations

from typing import Any


def first_measured(warmup: int, iterations: int) -> int:
    """The index of the first measured iteration."""
    return max(0, min(int(warmup), int(iterations) - 1))


def measured(iteration: Any, warmup: int, iterations: int) -> Any:
    """Whether `iteration` is measured: a bool for an int, an element-wise mask for a
    pandas Series or numpy array of iteration indices."""
    return iteration >= first_measured(warmup, iterations)
