"""The `workload:` section of an experiment: what each worker trains and how.

Kept free of torch so that the orchestrator can validate configs without loading it.
A replay workload's profile is read and checked here too, so a missing or mismatched
profile stops the run before anything starts.
"""
from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from workloads import profile_file

REPO = Path(__file__).resolve().parents[1]
PROFILES = REPO / "profiles"

# The largest committed profile (profiles/resnet-small.json) is 43 KB.
MAX_PROFILE_BYTES = 4 << 20
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

    model: Literal[tuple(MODELS)] = "cnn"
    preset: Literal[PRESETS] = "small"
    data: Literal["synthetic", "digits"] = Field(
        default="synthetic", description="seeded synthetic samples, or scikit-learn's digits (image models)")
    compute: Literal["real", "replay"] = Field(
        default="real", description="real: PyTorch on the CPU; replay: a profile's per-layer times")
    profile: str | None = Field(
        default=None, description="replay: profile JSON (default profiles/<model>-<preset>.json)")
    speedup: float = Field(default=1.0, gt=0, description="replay: divide the profile's times by this")
    batch_size: int = Field(default=32, gt=0, le=MAX_BATCH_SIZE)
    iterations: int = Field(default=40, gt=0, le=MAX_ITERATIONS)
    warmup: int = Field(default=2, ge=0, le=MAX_ITERATIONS, description="first iterations left out of summaries")
    threads: int = Field(default=1, gt=0, le=MAX_THREADS, description="torch threads per worker")
    lr: float = Field(default=0.01, gt=0)
    momentum: float = Field(default=0.9, ge=0, lt=1)
    weight_decay: float = Field(default=1e-4, ge=0)

    @property
    def profile_path(self) -> Path:
        if self.profile is None:
            return default_profile(self.model, self.preset)
        p = Path(self.profile)
        return p if p.is_absolute() else REPO / p

    @model_validator(mode="after")
    def _consistent(self) -> "WorkloadConfig":
        kind, presets = MODELS[self.model]
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
                _precheck(self.profile_path)
                profile_file.check(self.profile_path, self.model, self.preset, self.batch_size)
            except profile_file.ProfileError as e:
                shown = str(e).replace(str(REPO) + "/", "")
                hint = f"; make it with: ./inv profile --model {self.model} --preset {self.preset}" \
                    if "not found" in shown and self.profile is None else ""
                raise ValueError(f"workload.profile: {shown}{hint}") from None
        return self


def _p(path: Path) -> str:
    text = str(path)
    return text if len(text) <= 120 else text[:50] + "..." + text[-50:]


def _precheck(path: Path) -> None:
    """What profile_file.load would choke on, refused first: anything but a regular file (a
    FIFO would block, /dev/zero never ends), a file beyond MAX_PROFILE_BYTES, JSON nested
    beyond the parser's recursion, NaN or Infinity. Existence is left to load ("not found")."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return  # load says "not found"
    except ValueError as e:
        raise profile_file.ProfileError(f"{_p(path)} is not a valid path ({e})") from None
    except OSError as e:
        raise profile_file.ProfileError(f"{_p(path)} cannot be read: {e.strerror or e}") from None
    if not stat.S_ISREG(st.st_mode):
        raise profile_file.ProfileError(f"{_p(path)} is not a regular file")
    if st.st_size > MAX_PROFILE_BYTES:
        raise profile_file.ProfileError(f"{_p(path)} has {st.st_size} bytes; a profile has at most {MAX_PROFILE_BYTES}")
    key = (str(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    if key in _CHECKED:
        return
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise profile_file.ProfileError(f"{_p(path)} is not a regular file")
            with os.fdopen(fd, "rb", closefd=False) as f:
                data = f.read(MAX_PROFILE_BYTES + 1)
        finally:
            os.close(fd)
    except OSError as e:
        raise profile_file.ProfileError(f"{_p(path)} cannot be read: {e.strerror or e}") from None
    if len(data) > MAX_PROFILE_BYTES:
        raise profile_file.ProfileError(f"{_p(path)} has more than {MAX_PROFILE_BYTES} bytes")

    def no_constant(name: str):
        raise ValueError(f"{name} is not a number a profile can hold")

    try:
        json.loads(data.decode("utf-8"), parse_constant=no_constant)
    except UnicodeDecodeError as e:
        raise profile_file.ProfileError(f"{_p(path)} is not UTF-8 text (byte 0x{data[e.start]:02x} at offset "
                                        f"{e.start}; a binary file?)") from None
    except RecursionError:
        raise profile_file.ProfileError(f"{_p(path)} cannot be read: JSON nested too deeply") from None
    except ValueError as e:  # JSONDecodeError included
        raise profile_file.ProfileError(f"{_p(path)} cannot be read: {str(e)[:200]}") from None
    if len(_CHECKED) >= 64:
        _CHECKED.clear()
    _CHECKED.add(key)


_CHECKED: set[tuple] = set()  # files that passed, by identity: a sweep validates each experiment
