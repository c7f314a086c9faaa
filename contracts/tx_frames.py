"""The per-frame transmit table of a traced PS run: schedulers/transport/txstamps.py fills it, each
role writes it as `records/<role><rank>.tx_frames.npz` (numpy arrays, one per column), and
the runner collects it as `tx_frames.parquet`. One row per data frame (PUSH from a worker,
RESULT from a server):

    peer          the server (in a worker's file) or worker (in a server's) it went to
    key chunk iteration priority bytes   what the frame carried (bytes: payload)
    ready_t       when it was put into the outbox (wall clock, time.time())
    first_byte_t  when its first byte could leave: max(written, last_byte_t of the frame before)
    last_byte_t   when its last byte left the host (kernel transmit stamp; NaN: none came)
    inversion_s   how long after ready_t bytes of lower priority still stood ahead of it

`summary` gives the figures a run keeps of them (row columns, scheduler_info.json).
"""
from __future__ import annotations

import math
from collections.abc import Iterable

SUFFIX = ".tx_frames.npz"
COLUMNS = ("peer", "key", "chunk", "iteration", "priority", "bytes", "ready_t", "first_byte_t", "last_byte_t",
           "inversion_s")


def _quantile(ordered: list[float], p: float) -> float:
    """numpy's default (linear) quantile of a sorted list."""
    pos = (len(ordered) - 1) * p
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def summary(inversion_s: Iterable[float], prefix: str = "") -> dict[str, float | int]:
    """Figures over data frames: `data_frames`, `inversion_frames` (those that waited behind
    bytes of lower priority: inversion > 0), the median, 99th percentile and maximum inversion
    over all of them (zeros included), and `inversion_unknown` (NaN: a stamp never came)."""
    values = [float(v) for v in inversion_s]
    known = sorted(v for v in values if not math.isnan(v))
    q = (lambda p: _quantile(known, p)) if known else (lambda p: math.nan)
    return {f"{prefix}data_frames": len(values), f"{prefix}inversion_frames": sum(v > 0 for v in known),
            f"{prefix}inversion_p50_s": q(0.5), f"{prefix}inversion_p99_s": q(0.99),
            f"{prefix}inversion_max_s": known[-1] if known else math.nan,
            f"{prefix}inversion_unknown": len(values) - len(known)}
