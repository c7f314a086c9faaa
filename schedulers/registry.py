"""Scheduler name -> class. Adding a scheduler: write its module, then add one line here.

Importing this module is cheap (no torch), so the orchestrator can validate configs with
`params_models()` without loading the training stack.
"""
from __future__ import annotations

from pydantic import BaseModel

from schedulers.base import RoleContext, Scheduler
from schedulers.bytescheduler import ByteScheduler
from schedulers.fifo import FIFO
from schedulers.forest import Forest
from schedulers.gloo import Gloo
from schedulers.hierarchical import Hierarchical
from schedulers.mercury import Mercury
from schedulers.p3 import P3
from schedulers.ring import Ring

SCHEDULERS: dict[str, type[Scheduler]] = {
    cls.name: cls for cls in (FIFO, ByteScheduler, P3, Mercury, Ring, Gloo, Forest, Hierarchical)}


def params_models() -> dict[str, type[BaseModel]]:
    return {name: cls.Params for name, cls in SCHEDULERS.items()}


def create(name: str, ctx: RoleContext, params: dict) -> Scheduler:
    cls = SCHEDULERS[name]
    return cls(ctx, cls.Params.model_validate(params))
