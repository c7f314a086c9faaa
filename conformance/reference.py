"""What a correct scheduler must return: the average of gradients any process can recompute.

Each role derives its gradient of (iteration, key) from a seed, so the reference average of
a job needs no communication: worker 0 recomputes every rank's gradient and compares. The
tests of the loopback tier (tests/loopback_jobs.py) use the same gradients and tensor sets.
"""
from __future__ import annotations

import numpy as np

# Tiny, odd-sized and multi-partition tensors; tensor_set adds random odd ones and a huge one.
SIZES = [1, 7, 1000, 4099, 30_001]
# Tolerances of the reference average (float32 sums in any order against float64).
RTOL, ATOL = 1e-5, 1e-6


def tensor_set(seed: int, extra: int = 3, big: int = 0) -> list[int]:
    """SIZES plus `extra` random odd sizes and, if `big`, one tensor of about that many."""
    rng = np.random.default_rng(seed)
    sizes = SIZES + [int(n) | 1 for n in rng.integers(2, 50_000, extra)]
    if big:
        sizes.append(big + int(rng.integers(0, 1000)) | 1)
    return sizes


def gradient(seed: int, it: int, rank: int, key: int, numel: int) -> np.ndarray:
    """Worker `rank`'s gradient of `key` in iteration `it`: any process can recompute it."""
    return np.random.default_rng([seed, it, rank, key]).standard_normal(numel, dtype=np.float32)


def average(seed: int, it: int, workers: int, key: int, numel: int) -> np.ndarray:
    """The exact average of every worker's gradient of `key` in iteration `it` (float64)."""
    total = np.zeros(numel, np.float64)
    for r in range(workers):
        total += gradient(seed, it, r, key, numel)
    return total / workers


def error(got: np.ndarray, ref: np.ndarray) -> tuple[float, bool]:
    """(max abs error, whether it is within the tolerances) of one result against the reference."""
    if got.shape != ref.shape:
        return float("inf"), False
    diff = np.abs(got.astype(np.float64) - ref)
    worst = float(diff.max()) if diff.size else 0.0
    return worst, bool(np.all(diff <= ATOL + RTOL * np.abs(ref)))
