"""The `workload:` section of an experiment: what each worker trains and how.

Kept free of torch so that the orchestrator can validate configs without loading it.
A replay workload's profile is read and checked here too, so a missing or mismatched
profile stops the run before anything starts.
"""
from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from workloads import profile_file

REPO = Path(__file__).resolve().parents[1]
PROFILES = REPO / "profiles"

# Each iteration's record stays in the worker's memory until the run ends.
MAX_ITERATIONS = 1_000_000
# Per worker and step; large-batch ImageNet training went to 64k for a whole cluster.
MAX_BATCH_SIZE = 65_536
# torch threads per worker; more than any machine's cores only oversubscribes.
MAX_THREADS = 1024
# Replay sleeps profile time / speedup: a device 1000x slower is no experiment, and near 0
# the sleeps overflow.
MIN_SPEEDUP = 1e-3

# model -> (what it takes as input, its presets). tiny: tests; small: demos on 2 cores;
# paper: the architecture the papers train (workloads/models.py).
MODELS = {
    "cnn": ("image", ("tiny", "small")),
    "alexnet": ("image", ("tiny", "small", "paper")),
    "vgg": ("image", ("tiny", "small", "paper")),
    "resnet": ("image", ("tiny", "small", "paper")),
    "bert": ("tokens", ("tiny", "small", "paper")),
    "lstm": ("tokens", ("tiny", "small", "paper")),
}
PRESETS = ("tiny", "small", "paper")


def default_profile(model: str, preset: str) -> Path:
    return PROFILES / f"{model}-{preset}.json"


class WorkloadConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    model: Literal[tuple(MODELS)] = Field(default="cnn", description="the model of the zoo (workloads/models.py)")
    preset: Literal[PRESETS] = Field(default="small", description="its size: tiny (tests), small (demos on 2 "
                                                                  "cores), paper (the papers' architecture)")
    data: Literal["synthetic", "digits"] = Field(
        default="synthetic", description="seeded synthetic samples, or scikit-learn's digits (image models)")
    compute: Literal["real", "replay"] = Field(
        default="real", description="real: PyTorch on the CPU; replay: a profile's per-layer times")
    profile: str | None = Field(
        default=None, description="replay: profile JSON (default profiles/<model>-<preset>.json)")
    speedup: float = Field(default=1.0, gt=0, description="replay: the factor the profile's times are divided by")
    batch_size: int = Field(default=32, gt=0, le=MAX_BATCH_SIZE, description="count of samples per worker and step")
    iterations: int = Field(default=40, gt=0, le=MAX_ITERATIONS, description="count of iterations per worker")
    warmup: int = Field(default=2, ge=0, le=MAX_ITERATIONS,
                        description="count of first iterations left out of summaries")
    threads: int = Field(default=1, gt=0, le=MAX_THREADS, description="count of torch threads per worker")
    lr: float = Field(default=0.01, gt=0, description="SGD's learning rate, dimensionless")
    momentum: float = Field(default=0.9, ge=0, lt=1, description="SGD's momentum, dimensionless")
    weight_decay: float = Field(default=1e-4, ge=0, description="SGD's weight decay (L2), dimensionless")

    @property
    def profile_path(self) -> Path:
        if self.profile is None:
            return default_profile(self.model, self.preset)
        p = Path(self.profile)
        return p if p.is_absolute() else REPO / p

    @model_validator(mode="after")
    def _consistent(self) -> WorkloadConfig:
        kind, presets = MODELS[self.model]
        if self.warmup >= self.iterations:
            raise ValueError(f"workload.iterations ({self.iterations}) must be more than workload.warmup "
                             f"({self.warmup}): the first `warmup` iterations are not measured")
        if self.preset not in presets:
            raise ValueError(f"workload.preset: model {self.model!r} has no preset {self.preset!r} "
                             f"(it has {', '.join(presets)})")
        if self.data == "digits" and (kind != "image" or self.compute == "replay"):
            why = "replay draws no data" if kind == "image" else f"model {self.model!r} takes token sequences"
            raise ValueError(f"workload.data: digits is an image data set and {why}")
        if self.compute == "real":
            for name, unset in (("profile", self.profile is None), ("speedup", self.speedup == 1.0)):
                if not unset:
                    raise ValueError(f"workload.{name}: only applies to compute: replay")
        else:
            if self.speedup < MIN_SPEEDUP:
                raise ValueError(f"workload.speedup: must be >= {MIN_SPEEDUP:g}")
            try:
                profile_file.check(self.profile_path, self.model, self.preset, self.batch_size)
            except profile_file.ProfileError as e:
                shown = str(e).replace(str(REPO) + "/", "")
                hint = f"; make it with: ./inv profile --model {self.model} --preset {self.preset}" \
                    if "not found" in shown and self.profile is None else ""
                raise ValueError(f"workload.profile: {shown}{hint}") from None
        return self
