"""The worker-side scheduler interface every scheduler implements (DESIGN.md).

    start(tensors)        tensors: TensorSpec list; priority 0 = closest to the input
    push(key, grad, it)   non-blocking: the gradient of `key` for iteration `it` is ready
    wait(key, it) -> buf  block until the averaged gradient of `key` for `it` is in buf
    close()

Gradients are flat float32 numpy arrays, so the schedulers need no torch. A scheduler may
keep the array it was pushed until that iteration's result is back: the worker hands
over ownership (it drops its own reference to the gradient).
"""
from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
from pydantic import BaseModel, ConfigDict


class SchedulerParams(BaseModel):
    """Base of every scheduler's config section: unknown keys are errors."""

    model_config = ConfigDict(extra="forbid", frozen=True)


@dataclass(frozen=True)
class TensorSpec:
    key: int
    name: str
    numel: int
    priority: int


@dataclass(frozen=True)
class Endpoint:
    host: str
    ip: str
    port: int


@dataclass(frozen=True)
class RoleContext:
    """What a worker knows about the job: who it is and whom it talks to."""

    rank: int
    num_workers: int
    servers: list[Endpoint]
    workers: list[Endpoint] = field(default_factory=list)
    topology: dict[str, Any] | None = None  # networkx node-link data with capacities
    connect_timeout_s: float = 60.0


class CommError(RuntimeError):
    """A peer failed or closed its connection; the message names the peer."""


class Scheduler(abc.ABC):
    name: ClassVar[str]
    Params: ClassVar[type[SchedulerParams]] = SchedulerParams

    def __init__(self, ctx: RoleContext, params: SchedulerParams):
        self.ctx = ctx
        self.params = params

    @abc.abstractmethod
    def start(self, tensors: list[TensorSpec]) -> None: ...

    @abc.abstractmethod
    def push(self, key: int, grad: np.ndarray, it: int) -> None: ...

    @abc.abstractmethod
    def wait(self, key: int, it: int) -> np.ndarray: ...

    @abc.abstractmethod
    def close(self) -> None: ...
