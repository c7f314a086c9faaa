"""Scheduler name -> class. Adding a scheduler: write its module (its class declares what the
rest of the harness knows about it, `Scheduler.describe`), then add one line here; or, from
outside the repository, name its file or module in a config's `plugins:` (or install it with a
`schedlab.schedulers` entry point): schedulers/registry/plugins.py registers it here.

Importing this module is cheap (no torch), so the orchestrator can validate configs with
`params_models()` and hand emu/ and analysis/ the schedulers' descriptions (`infos()`) without
loading the training stack.
"""
from __future__ import annotations

from pydantic import BaseModel

from contracts.scheduler_info import SchedulerInfo
from schedulers.api import CommError, RoleContext, Scheduler
from schedulers.collective.forest import Forest
from schedulers.collective.gloo import Gloo
from schedulers.collective.hierarchical import Hierarchical
from schedulers.collective.ring import Ring
from schedulers.ps.bytescheduler import ByteScheduler
from schedulers.ps.fifo import FIFO
from schedulers.ps.mercury import Mercury
from schedulers.ps.p3 import P3
from schedulers.transport.connection import Mode

SCHEDULERS: dict[str, type[Scheduler]] = {
    cls.name: cls for cls in (FIFO, ByteScheduler, P3, Mercury, Ring, Gloo, Forest, Hierarchical)}
# Plugin schedulers (schedulers/registry/plugins.py), by name: where each came from (the file's
# path or the module), to tell a clash from the same plugin loaded again; and its spec.
SOURCES: dict[str, str] = {}
PLUGIN_SPECS: dict[str, str] = {}


def params_models() -> dict[str, type[BaseModel]]:
    return {name: cls.Params for name, cls in SCHEDULERS.items()}


def infos() -> dict[str, SchedulerInfo]:
    """Every scheduler's description (contracts/scheduler_info.py), in registry order."""
    return {name: cls.describe() if name not in PLUGIN_SPECS else
            cls.describe().model_copy(update={"plugin": PLUGIN_SPECS[name]}) for name, cls in SCHEDULERS.items()}


def create(name: str, ctx: RoleContext, params: dict) -> Scheduler:
    cls = SCHEDULERS[name]
    return cls(ctx, cls.Params.model_validate(params))


def server_mode(scheduler: str) -> Mode:
    """The mode a scheduler's workers speak to the parameter server (its class's `server_mode`)."""
    cls = SCHEDULERS.get(scheduler)
    if cls is None:
        raise CommError(f"unknown scheduler {scheduler!r} (known: {', '.join(sorted(SCHEDULERS))})")
    mode = getattr(cls, "server_mode", None)
    if mode is None:
        raise CommError(f"scheduler {scheduler!r} runs among the workers; it has no parameter server")
    return mode
