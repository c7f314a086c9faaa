"""Model zoo. Pure PyTorch, no downloads; every model is built identically on every
worker from the experiment seed, so all replicas start from the same parameters."""
from __future__ import annotations

import torch
from torch import nn

# (conv channels, hidden units): tiny is for tests (seconds), small for demos on 2 cores.
CNN_PRESETS = {"tiny": ((4, 8), 16), "small": ((16, 32), 64)}
IMAGE_SHAPE = (3, 32, 32)
NUM_CLASSES = 10


def cnn(preset: str) -> nn.Sequential:
    (c1, c2), hidden = CNN_PRESETS[preset]
    return nn.Sequential(
        nn.Conv2d(3, c1, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(c1, c2, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(c2 * 8 * 8, hidden), nn.ReLU(),
        nn.Linear(hidden, NUM_CLASSES),
    )


def build(model: str, preset: str, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    if model == "cnn":
        return cnn(preset)
    raise ValueError(f"unknown model {model!r}")
