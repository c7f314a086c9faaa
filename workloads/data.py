"""Seeded synthetic data that a model can actually learn.

Each class has a fixed random prototype image (shared by all workers through the
experiment seed); a sample is its class prototype plus noise drawn from the worker's own
stream, so workers see different batches of the same task and the loss visibly falls.
"""
from __future__ import annotations

import torch

from workloads.models import IMAGE_SHAPE, NUM_CLASSES


class SyntheticImages:
    def __init__(self, seed: int, rank: int, batch_size: int, noise: float = 2.0):
        g = torch.Generator().manual_seed(seed)
        self.prototypes = torch.randn((NUM_CLASSES, *IMAGE_SHAPE), generator=g)
        self.gen = torch.Generator().manual_seed(seed * 1000 + rank + 1)
        self.batch_size = batch_size
        self.noise = noise

    def batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.randint(0, NUM_CLASSES, (self.batch_size,), generator=self.gen)
        x = self.prototypes[y] + self.noise * torch.randn((self.batch_size, *IMAGE_SHAPE), generator=self.gen)
        return x, y
