"""What one iteration's time is, and which iterations are measured: the one rule that the
trainer, replay mode, the profiler, summaries, the fidelity window, analysis and plots share.

An iteration is not over when its backward pass ends: its gradients still have to be
aggregated and applied, and with priority scheduling that happens during the next
iteration's forward pass (each layer waits for its own aggregate just before it runs). So
iteration i runs from the moment iteration i - 1's last aggregate was applied (iteration 0:
the start of its forward pass) to the moment its own last aggregate was applied; the last
iteration's are waited for after the loop. The windows tile the run without gaps or
overlaps, each holds all of its iteration's communication, and their sum is the run's time
from the first forward pass to the last update. An iteration therefore can never be shorter
than the communication its gradients need, which is what its lower bound assumes.

The first `warmup` iterations are left out (start-up: imports, the first forward pass that
records the layer order, buffers allocated on first use), so `warmup < iterations` is
required: a run always measures `iterations - warmup` iterations.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class NoMeasuredIteration(ValueError):
    """`warmup >= iterations`: every iteration would be warm-up."""


def first_measured(warmup: int, iterations: int) -> int:
    """The index of the first measured iteration."""
    warmup, iterations = int(warmup), int(iterations)
    if not 0 <= warmup < iterations:
        raise NoMeasuredIteration(f"warmup ({warmup}) must be at least 0 and less than iterations ({iterations}): "
                                  f"no iteration would be measured")
    return warmup


def measured(iteration: Any, warmup: int, iterations: int) -> Any:
    """Whether `iteration` is measured: a bool for an int, an element-wise mask for a
    pandas Series or numpy array of iteration indices."""
    return iteration >= first_measured(warmup, iterations)


def windows(forward_starts: Sequence[float], applied: Sequence[float]) -> list[tuple[float, float]]:
    """(start, end) of every iteration, on whatever clock both sequences use:
    `forward_starts[i]` is when iteration i's forward pass began, `applied[i]` when the last
    of its aggregated gradients had been applied."""
    if len(forward_starts) != len(applied):
        raise ValueError(f"{len(forward_starts)} forward passes but {len(applied)} iterations applied")
    out = []
    for i, end in enumerate(applied):
        start = forward_starts[0] if i == 0 else applied[i - 1]
        if end < start:
            raise ValueError(f"iteration {i}: applied at {end} before it began at {start}")
        out.append((float(start), float(end)))
    return out
