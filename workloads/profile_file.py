"""The profile file: one model's compute, layer by layer, as replay mode plays it back.

Written by workloads/profile.py (`./inv profile`), read by `load` both when the config is
checked before a run starts and by the replay worker; so it is plain pydantic, no torch.

A *layer* is where the worker blocks on `Scheduler.wait`: the module whose forward
pre-hook first needs a group of parameters (see trainer.py). Times are medians over the
measured iterations, in seconds, on the device named in `device` (`clock` says whether
they are the worker thread's CPU time or elapsed time):

    forward_lead_s     from the start of the step to the first layer
    layers[i].forward_s   after layer i's wait to the next layer's (the last: to the start
                          of backward); includes layer i's SGD update and the parameterless
                          ops after it, e.g. ReLU and pooling
    tensors            in the order backward produced their gradients; backward_s is the
                       time from the previous gradient (the first: from the start of
                       backward) to this one
    backward_tail_s    from the last gradient to the end of backward
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from contracts import bounded_file

FORMAT = 1
# The largest committed profile (profiles/resnet-small.json) is 43 KB.
MAX_PROFILE_BYTES = 4 << 20


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class Device(_Strict):
    kind: str = Field(description="cpu or cuda")
    name: str = Field(description="processor or accelerator model")
    threads: int = Field(description="torch intra-op threads")
    torch: str


class Layer(_Strict):
    name: str
    keys: list[int]
    forward_s: float = Field(ge=0)
    backward_s: float = Field(ge=0)


class Tensor(_Strict):
    key: int
    name: str
    shape: list[int]
    numel: int = Field(ge=0)
    layer: int = Field(ge=0, description="index into layers, which is also its priority")
    backward_s: float = Field(ge=0)


class Profile(_Strict):
    format: Literal[1] = FORMAT
    model: str
    preset: str
    batch_size: int = Field(gt=0)
    device: Device
    warmup: int
    iterations: int = Field(gt=0, description="measured iterations the medians are over")
    created: str
    clock: Literal["thread_cpu", "wall"] = Field(
        description="thread_cpu: the worker thread's CPU time (1 thread; immune to other load); wall: elapsed")
    iteration_s: float = Field(description="median forward + backward + update, one process, no communication")
    forward_lead_s: float = Field(ge=0)
    backward_tail_s: float = Field(ge=0)
    layers: list[Layer]
    tensors: list[Tensor] = Field(description="in backward (gradient-ready) order")
    grad_bytes: int
    load_avg: float | None = Field(default=None, description="1-minute load average when measured")
    bench: dict[str, Any] = Field(default_factory=dict, description="figures added by bench/bench_workloads.py")

    @model_validator(mode="after")
    def _consistent(self) -> Profile:
        keys = sorted(t.key for t in self.tensors)
        if keys != list(range(len(self.tensors))):
            raise ValueError("tensor keys must be 0..n-1, each once")
        in_layers = sorted(k for layer in self.layers for k in layer.keys)
        if in_layers != keys:
            raise ValueError("every tensor must belong to exactly one layer")
        for t in self.tensors:
            if t.layer >= len(self.layers) or t.key not in self.layers[t.layer].keys:
                raise ValueError(f"tensor {t.name} names layer {t.layer}, which does not hold it")
        return self

    @property
    def by_key(self) -> list[Tensor]:
        return sorted(self.tensors, key=lambda t: t.key)

    @property
    def forward_s(self) -> float:
        return self.forward_lead_s + sum(layer.forward_s for layer in self.layers)

    @property
    def backward_s(self) -> float:
        return sum(t.backward_s for t in self.tensors) + self.backward_tail_s

    @property
    def largest(self) -> Tensor:
        return max(self.tensors, key=lambda t: t.numel)


class ProfileError(ValueError):
    """The profile is missing, unreadable, or not for this workload; the text says which."""


def _p(path: Path) -> str:
    text = str(path)
    return text if len(text) <= 120 else text[:50] + "..." + text[-50:]


def _read(path: Path) -> bytes:
    try:
        return bounded_file.read(path, MAX_PROFILE_BYTES)
    except bounded_file.Refused as e:
        if e.kind == bounded_file.MISSING:
            raise ProfileError(f"{path} not found") from None
        if e.kind == bounded_file.TOO_LARGE:
            raise ProfileError(f"{_p(path)} has {e.size} bytes; a profile has at most {MAX_PROFILE_BYTES}"
                               if e.size is not None else
                               f"{_p(path)} has more than {MAX_PROFILE_BYTES} bytes") from None
        if e.kind == bounded_file.BAD_PATH:
            raise ProfileError(f"{_p(path)} is not a valid path ({e.detail})") from None
        if e.kind == bounded_file.UNREADABLE:
            raise ProfileError(f"{_p(path)} cannot be read: {e.detail}") from None
        raise ProfileError(f"{_p(path)} is not a regular file") from None


def _no_constant(name: str):
    raise ValueError(f"{name} is not a number a profile can hold")


def load(path: Path) -> Profile:
    """The profile at `path`. Read within MAX_PROFILE_BYTES from a regular file only, and
    NaN or Infinity refused: the config check before a run and the replay worker during it
    read through here, so what passed the check is what is replayed."""
    data = _read(path)
    try:
        raw = json.loads(data.decode("utf-8"), parse_constant=_no_constant)
    except UnicodeDecodeError as e:
        raise ProfileError(f"{_p(path)} is not UTF-8 text (byte 0x{data[e.start]:02x} at offset "
                           f"{e.start}; a binary file?)") from None
    except RecursionError:
        raise ProfileError(f"{_p(path)} cannot be read: JSON nested too deeply") from None
    except ValueError as e:  # JSONDecodeError included
        raise ProfileError(f"{_p(path)} cannot be read: {str(e)[:200]}") from None
    try:
        return Profile.model_validate(raw)
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        raise ProfileError(f"{path} is not a valid profile ({where}: {err['msg']})") from None


def check(path: Path, model: str, preset: str, batch_size: int) -> Profile:
    """The profile at `path`, if it was measured for this model, preset and batch size."""
    p = load(path)
    if (p.model, p.preset) != (model, preset):
        raise ProfileError(f"{path} profiles model {p.model!r} preset {p.preset!r}, not {model!r} {preset!r}")
    if p.batch_size != batch_size:
        raise ProfileError(f"{path} was measured at batch_size {p.batch_size}, not {batch_size} "
                           f"(re-profile: ./inv profile --model {model} --preset {preset} --batch-size {batch_size})")
    return p


def save(profile: Profile, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(profile.model_dump(mode="json"), indent=1) + "\n")
    tmp.replace(path)
