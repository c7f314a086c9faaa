"""The profile file: one model's compute, layer by layer, as replay mode plays it back.

Written by workloads/profile.py (`./inv profile`), read by workloads/replay.py, and checked
by the config validator before a run starts; so it is plain pydantic, no torch.

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

FORMAT = 1


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


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
    def _consistent(self) -> "Profile":
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


def load(path: Path) -> Profile:
    if not path.is_file():
        raise ProfileError(f"{path} not found")
    try:
        return Profile.model_validate(json.loads(path.read_text()))
    except (OSError, json.JSONDecodeError) as e:
        raise ProfileError(f"{path} cannot be read: {e}") from None
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
