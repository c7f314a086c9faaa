"""The `workload:` section of an experiment: what each worker trains and how.

Kept free of torch so that the orchestrator can validate configs without loading it.
"""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

MODELS = ("cnn",)
PRESETS = ("tiny", "small")


class WorkloadConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    model: Literal[MODELS] = "cnn"
    preset: Literal[PRESETS] = "small"
    data: Literal["synthetic"] = "synthetic"
    compute: Literal["real"] = Field(default="real", description="PyTorch on the CPU")
    batch_size: int = Field(default=32, gt=0)
    iterations: int = Field(default=40, gt=0)
    warmup: int = Field(default=2, ge=0, description="first iterations left out of summaries")
    threads: int = Field(default=1, gt=0, description="torch threads per worker")
    lr: float = Field(default=0.01, gt=0)
    momentum: float = Field(default=0.9, ge=0, lt=1)
    weight_decay: float = Field(default=1e-4, ge=0)
