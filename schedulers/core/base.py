"""The worker-side scheduler interface every scheduler implements (docs/design.md).

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
import time
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator

from contracts.scheduler_info import BoundModel, ClaimRole, Family, SchedulerInfo, TuneDim


class SchedulerParams(BaseModel):
    """Base of every scheduler's config section: unknown keys are errors.

    `requires_servers`: whether the scheduler needs parameter-server roles (the PS family)
    or runs among the workers alone (the collective family).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)
    requires_servers: ClassVar[bool] = True

    @field_validator("*", mode="before")
    @classmethod
    def _numbers_are_not_booleans(cls, v: Any, info: ValidationInfo) -> Any:
        """pydantic takes true as 1 for a number; a tunable set to true is a mistake, refused."""
        if isinstance(v, bool) and info.field_name is not None and _is_number(cls.model_fields[info.field_name]):
            raise ValueError("must be a number, not true or false")
        return v


def _is_number(field_info) -> bool:
    """An int or float field (optionally None), not a bool one."""
    ann = field_info.annotation
    args = typing.get_args(ann) if typing.get_origin(ann) in (typing.Union, types.UnionType) else (ann,)
    kinds = {a for a in args if a is not type(None)}
    return bool(kinds) and kinds <= {int, float}


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
    """What a worker knows about the job: who it is and whom it talks to.

    workers[i].port is where worker i listens for its peers (collective schedulers).
    iface is this role's network interface (`<host>-eth0` in Mininet, `lo` on loopback),
    for libraries such as gloo that must be told which one to use.
    trace: record scheduler events (see `Scheduler.event`).
    """

    rank: int
    num_workers: int
    servers: list[Endpoint]
    workers: list[Endpoint] = field(default_factory=list)
    topology: dict[str, Any] | None = None  # networkx node-link data with capacities
    connect_timeout_s: float = 60.0
    iface: str = "lo"
    trace: bool = False


class CommError(RuntimeError):
    """A peer failed or closed its connection; the message names the peer."""


class Scheduler(abc.ABC):
    name: ClassVar[str]
    Params: ClassVar[type[SchedulerParams]] = SchedulerParams
    # What the rest of the harness knows about the scheduler, declared here once (`describe`,
    # contracts/scheduler_info.py); those without a default every scheduler must declare.
    family: ClassVar[Family]
    bound_model: ClassVar[BoundModel]
    display_order: ClassVar[int]
    display_name: ClassVar[str | None] = None  # None: its name
    tuning: ClassVar[tuple[TuneDim, ...]] = ()
    baseline: ClassVar[bool] = False
    claims: ClassVar[Mapping[str, ClaimRole]] = {}
    report_sections: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def describe(cls) -> SchedulerInfo:
        """The class's declarations as one typed description: what emu/ and analysis/, which
        may not import schedulers, read instead (registry.infos(), the run's row)."""
        return SchedulerInfo(name=cls.name, family=cls.family, requires_servers=cls.Params.requires_servers,
                             bound_model=cls.bound_model, display_name=cls.display_name or cls.name,
                             display_order=cls.display_order, tuning=cls.tuning, baseline=cls.baseline,
                             claims=dict(cls.claims), report_sections=cls.report_sections)

    @classmethod
    def startup_s(cls, params: SchedulerParams, num_workers: int) -> float:
        """Seconds of the emulated network the job waits, before its first iteration, for what
        the scheduler does on its own (forest: its start-up probe); no bound counts them, so a
        dry run adds them to its estimate. 0 unless a scheduler says otherwise."""
        return 0.0

    def __init__(self, ctx: RoleContext, params: SchedulerParams):
        self.ctx = ctx
        self.params = params
        self.events: list[tuple[str, int, int, int, float]] = []

    def event(self, what: str, key: int, chunk: int, it: int) -> None:
        """Record (what, key, chunk, iteration, time.time()) when tracing is on; e.g. what =
        "send" when a chunk's first byte is handed to the socket, "recv" when its result
        arrives. The worker saves them as the run's events.parquet."""
        if self.ctx.trace:
            self.events.append((what, key, chunk, it, time.time()))

    def info(self) -> dict[str, Any]:
        """What the run should keep about this scheduler's decisions (e.g. forest's plan)."""
        return {}

    def tables(self) -> dict[str, dict[str, np.ndarray]]:
        """Long tables the run should keep, as columns (traced PS runs: `tx_frames`, when
        each data frame was ready and its bytes left the host; schedulers/transport/txstamps.py)."""
        return {}

    @abc.abstractmethod
    def start(self, tensors: list[TensorSpec]) -> None: ...

    @abc.abstractmethod
    def push(self, key: int, grad: np.ndarray, it: int) -> None: ...

    @abc.abstractmethod
    def wait(self, key: int, it: int) -> np.ndarray: ...

    @abc.abstractmethod
    def close(self) -> None: ...
