"""What the harness knows about a scheduler besides its code: one typed description per
scheduler, declared on its class (schedulers/core/base.py `Scheduler.describe`) and served by
the registry (`schedulers.registry.infos()`).

emu/ and analysis/ may not import schedulers/, so they read these instead: emu through the
`Sections` hand-over (emu/config/experiment.py) and each run's row, where the runner records
the run's description (`COLUMN`, JSON); analysis from those rows, and for rows written before
that record from the registry's descriptions, which tasks.py hands over (analysis/catalog.py).

A bound model (`BoundModel`) is the communication pattern a scheduler's lower bound is
computed for (analysis/bounds.py): named for what it models, never for a scheduler, so that
several schedulers can play in one and analysis dispatches on the model alone.
"""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_serializer

COLUMN = "scheduler_metadata"  # the row's column: SchedulerInfo as JSON text

Family = Literal["parameter_server", "collective"]
BoundModel = Literal["parameter_server", "ring_allreduce", "tree_packing", "hierarchical_allreduce", "cut", "none"]
# "none": no model fits the scheduler (a plugin's own pattern); analysis leaves its bound and
# efficiency empty and says "no bound" rather than judge it against a bound that does not apply.
NO_BOUND = "none"
BOUND_MODELS: tuple[str, ...] = tuple(m for m in BoundModel.__args__ if m != NO_BOUND)  # those with a bound
ClaimRole = Literal["claimed", "baseline"]

# Rows annotated before the models had names of their own say these (analysis reads them as the new name).
LEGACY_BOUND_MODELS = {"ps": "parameter_server", "ring": "ring_allreduce", "forest": "tree_packing",
                       "hierarchical": "hierarchical_allreduce"}


class TuneDim(BaseModel):
    """One coordinate of a scheduler's search space (emu/sweeps/tune.py), log-uniform on [low, high]."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description="the search coordinate (optuna's parameter name)")
    param: str = Field(description="the tunable of the scheduler's config section it sets")
    low: int | float = Field(description="smallest value searched")
    high: int | float = Field(description="largest value searched")
    integer: bool = Field(description="searched as an integer")
    about: str = Field(description="what the coordinate is, for tuned.json")
    ratio_of: str | None = Field(
        default=None, description="the coordinate is a ratio: `param` = max(v, round(v x coordinate)), v the value "
                                  "of this other tunable; so every point of the box is a valid pair")


class SchedulerInfo(BaseModel):
    """A scheduler as the rest of the harness sees it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description="registry name, the config's `scheduler:`")
    family: Family = Field(description="parameter_server (workers push to servers) or collective (workers only)")
    requires_servers: bool = Field(description="needs parameter-server roles (its Params' `requires_servers`)")
    bound_model: BoundModel = Field(description="the model its lower bound is computed in (analysis/bounds.py)")
    display_name: str = Field(description="how tables and figures name it (its variants' names start with it)")
    display_order: int = Field(ge=0, description="its place in tables and legends, and its colour's index; "
                                                 "unique among schedulers")
    tuning: tuple[TuneDim, ...] = Field(default=(), description="its search space for ./inv tune (empty: not tuned)")
    baseline: bool = Field(default=False, description="the default baseline of speedups (one scheduler declares it)")
    claims: dict[str, ClaimRole] = Field(
        default_factory=dict, description="paper claims (ids of analysis/claims.py) that concern it, and whether its "
                                          "speedup is claimed or it is a baseline")
    report_sections: tuple[str, ...] = Field(
        default=(), description="report sections about it; a section with a module of its own is "
                                "analysis/<section>.py, the only analysis modules that name it")
    plugin: str | None = Field(
        default=None, description="the plugin it came from (its spec in `plugins:`, or `entry_point:<name>`); "
                                  "None for a built-in, and then left out of the JSON, so built-ins' records read "
                                  "as before")

    @model_serializer(mode="wrap")
    def _without_builtin_plugin(self, handler):
        d = handler(self)
        if self.plugin is None:
            d.pop("plugin", None)
        return d
