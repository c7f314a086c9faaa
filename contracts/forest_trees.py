"""The forest's per-tree record: what each tree of the plan was given and what it achieved, per
iteration, kept under `trees` in the run's scheduler_info.json (schedulers/collective/forest_record.py
fills it, analysis/forest_trees.py reads it). It answers which tree, and which link, held an
iteration back.

Every worker records what it sees; at close the workers pass their records up a gather tree
to worker 0 (`ranks` says whose are in), whose `info()` becomes scheduler_info.json.
Times are wall-clock (`time.time()`, one clock for every host of the emulated network), rates
bit/s, both in wall-clock units like the rest of scheduler_info.json (a dilated run's analysis
multiplies rates by its k).

    plans   one per plan epoch (0: the first plan; measured bandwidth re-plans add more): each
            tree's root, parent, fraction and planned rate, its edges with the links each
            direction crosses, and per link the capacity the plan assumed and its planned load
    edges   per (iteration, tree, directed tree edge src -> dst), as the receiver dst saw it:
            phase (0 reduce: child to parent, 1 broadcast: parent to child), payload bytes,
            first_t (the first frame's header was read), last_t (the last frame's payload was
            in), frames, early (bytes the socket held already when first_t's header was read:
            they came in before first_t). rate = 8 (bytes - early) / (last_t - first_t): at most
            what the tree's stream got on that edge over that time
    done    per (iteration, tree, rank): when the last chunk of the tree's average arrived there
    pushes  per (iteration, rank): the plan epoch, the first and last gradient pushed
"""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

KEY = "trees"   # the key of scheduler_info.json that holds a ForestTrees


class TreeEdge(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    child: int
    parent: int
    up: list[int] = Field(description="links (indices into the epoch's `links`) the path child -> parent crosses")
    down: list[int] = Field(description="links the path parent -> child crosses")


class PlannedTree(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    tree: int
    root: int
    depth: int
    fraction: float = Field(description="share of every gradient it reduces and broadcasts")
    rate_bps: float | None = Field(description="planned rate, bit/s of gradient (None: unbounded)")
    edges: list[TreeEdge]


class EpochPlan(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    epoch: int
    rate_bps: float | None
    links: list[str] = Field(description="every link of the model, 'u>v'")
    capacity_bps: list[float | None] = Field(description="per link: the capacity the plan assumed")
    configured_bps: list[float | None] = Field(description="per link: the capacity graph's rate (None: not given)")
    planned_bps: list[float] = Field(description="per link: the plan's load, sum over trees of rate x crossings")
    trees: list[PlannedTree]


class EdgeColumns(BaseModel):
    model_config = ConfigDict(extra="forbid")

    iteration: list[int] = []
    tree: list[int] = []
    src: list[int] = []
    dst: list[int] = []
    phase: list[int] = []
    bytes: list[int] = []
    first_t: list[float] = []
    last_t: list[float] = []
    frames: list[int] = []
    early: list[int] = []


class DoneColumns(BaseModel):
    model_config = ConfigDict(extra="forbid")

    iteration: list[int] = []
    tree: list[int] = []
    rank: list[int] = []
    t: list[float] = []


class PushColumns(BaseModel):
    model_config = ConfigDict(extra="forbid")

    iteration: list[int] = []
    rank: list[int] = []
    epoch: list[int] = []
    first_t: list[float] = []
    last_t: list[float] = []


class ForestTrees(BaseModel):
    """The record (module docstring). Column lists of one table have equal lengths."""

    model_config = ConfigDict(extra="forbid")

    ranks: list[int] = Field(default_factory=list, description="workers whose records are in")
    plans: list[EpochPlan] = Field(default_factory=list)
    edges: EdgeColumns = Field(default_factory=EdgeColumns)
    done: DoneColumns = Field(default_factory=DoneColumns)
    pushes: PushColumns = Field(default_factory=PushColumns)

    @model_validator(mode="after")
    def _equal_columns(self) -> ForestTrees:
        for name in ("edges", "done", "pushes"):
            lengths = {len(v) for v in getattr(self, name).model_dump().values()}
            if len(lengths) > 1:
                raise ValueError(f"trees.{name}: columns of different lengths {sorted(lengths)}")
        return self

    def merge(self, other: ForestTrees) -> None:
        """Append another worker's (or subtree's) rows; plans are the same everywhere, kept once."""
        self.ranks = sorted(set(self.ranks) | set(other.ranks))
        if not self.plans:
            self.plans = list(other.plans)
        for name in ("edges", "done", "pushes"):
            mine, theirs = getattr(self, name), getattr(other, name)
            for col in type(mine).model_fields:
                getattr(mine, col).extend(getattr(theirs, col))
