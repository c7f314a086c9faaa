"""`faults:` in a config: faults injected on purpose, on the run's timeline.

    faults:
      - {at_s: 10, kind: stop, target: worker0, for_s: 5}         # SIGSTOP, SIGCONT 5 s later
      - {at_s: 20, kind: link_down, target: [w1, s1], for_s: 3}   # both directions, up again
      - {at_s: 25, kind: slow, target: worker1, cpu: 0.1, for_s: 10}  # its host at 10% of the CPU
      - {at_s: 30, kind: kill, target: server0}                   # SIGKILL, not undone

`at_s` counts from the moment the roles are launched (start-up included). A role target
acts on the role's process group (stop, kill) or on its host (slow: the host's CFS bandwidth
cgroup, so every role on that host); a link target is `[a, b]` in either order. The thread
that applies them is emu/run/faults.py.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

Kind = Literal["stop", "kill", "link_down", "slow"]
ROLE_KINDS = ("stop", "kill", "slow")
UNDONE = ("stop", "link_down", "slow")      # the kinds that end after for_s
MAX_FAULTS = 1000
_WEEK_S = 7 * 24 * 3600



class Fault(BaseModel):
    """One fault. `target`: a role (worker0, server0) for stop, kill and slow; a link [a, b]
    for link_down. `for_s`: how long until it is undone (not for kill). `cpu`: slow's share
    of the machine's CPU."""
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    at_s: float = Field(ge=0, le=_WEEK_S, description="seconds after the roles are launched")
    kind: Kind = Field(description="stop: SIGSTOP, SIGCONT after for_s; kill: SIGKILL; link_down: both "
                                   "directions, up after for_s; slow: the host's CPU cgroup, for for_s")
    target: str | tuple[str, str] = Field(description="a role (worker0, server0) for stop, kill and slow; a link "
                                                      "[a, b] for link_down")
    for_s: float | None = Field(default=None, gt=0, le=_WEEK_S, description="seconds until it is undone (not "
                                                                            "for kill)")
    cpu: float | None = Field(default=None, gt=0, le=1,
                              description="slow: the host's fraction 0-1 of the machine's CPU")

    @field_validator("target", mode="before")
    @classmethod
    def _shape(cls, value):
        """One message for a wrong shape, instead of one per member of the union."""
        if isinstance(value, str):
            return value
        if isinstance(value, (list, tuple)) and len(value) == 2 and all(isinstance(v, str) for v in value):
            return tuple(value)
        raise ValueError("must be a role name (worker0, server0) or a link [a, b]")

    @model_validator(mode="after")
    def _valid(self) -> Fault:
        link = isinstance(self.target, tuple)
        if self.kind == "link_down" and not link:
            raise ValueError(f"target: link_down needs a link [a, b], got {self.target!r}")
        if self.kind != "link_down" and link:
            raise ValueError(f"target: {self.kind} needs a role name (worker0, server0), got a link")
        if link and self.target[0] == self.target[1]:
            raise ValueError("target: a link needs two different nodes")
        if self.kind == "kill" and self.for_s is not None:
            raise ValueError("for_s: a kill is not undone; remove for_s")
        if self.kind in UNDONE and self.for_s is None:
            raise ValueError(f"for_s: required for {self.kind} (how long until it is undone)")
        if self.kind == "slow" and self.cpu is None:
            raise ValueError("cpu: required for slow (the host's share of the machine's CPU, e.g. 0.1)")
        if self.kind != "slow" and self.cpu is not None:
            raise ValueError(f"cpu: only applies to slow, not {self.kind}")
        return self

    @property
    def target_text(self) -> str:
        return "-".join(self.target) if isinstance(self.target, tuple) else self.target

    @property
    def end_s(self) -> float | None:
        return None if self.for_s is None else self.at_s + self.for_s

    def resource(self, host_of: Mapping[str, str]) -> tuple[str, str]:
        """What two faults must not share at once: a role's signals, a link, a host's CPU."""
        if self.kind == "link_down":
            return "link", "-".join(sorted(self.target))
        if self.kind == "slow":
            return "host", host_of.get(self.target, self.target)
        return "role", self.target

    def describe(self, i: int) -> str:
        cpu = f" to {self.cpu:g} CPU" if self.cpu is not None else ""
        dur = f" for {self.for_s:g} s" if self.for_s is not None else ""
        return f"faults[{i}] ({self.kind} {self.target_text}{cpu} at {self.at_s:g} s{dur})"


def check_faults(faults: list[Fault], roles: Mapping[str, str], links: set[frozenset[str]],
                 timeout_s: float) -> str | None:
    """Why `faults` cannot run in this experiment (one `faults[i].field: reason` line), or None.
    `roles`: role name -> host; `links`: the topology's links as unordered pairs."""
    for i, f in enumerate(faults):
        if isinstance(f.target, tuple):
            if frozenset(f.target) not in links:
                return f"faults[{i}].target: no link {f.target[0]}-{f.target[1]} in the topology"
        elif f.target not in roles:
            return (f"faults[{i}].target: {f.target!r} is not a role of this run "
                    f"(roles: {', '.join(sorted(roles))})")
        if f.at_s >= timeout_s:
            return (f"faults[{i}].at_s: {f.at_s:g} s is not before the run's timeout_s ({timeout_s:g} s); "
                    f"the fault would never happen")
    for i, f in enumerate(faults):
        for j, g in enumerate(faults[:i]):
            if f.kind == g.kind and f.resource(roles) == g.resource(roles):
                a, b = sorted([(f.at_s, f.end_s or f.at_s), (g.at_s, g.end_s or g.at_s)])
                if b[0] < a[1] or (f.kind == "kill"):
                    return f"faults[{i}]: overlaps {g.describe(j)} on the same {f.resource(roles)[0]}"
    return None
