"""The role spec: everything a role process is told about its job, as one JSON file.

    python -m workloads.worker SPEC.json        python -m workloads.server SPEC.json

Roles hear from the orchestrator only through this file (and answer only through files),
so a worker or server also runs without Mininet. `role_specs()` is the one place specs are
built, by the orchestrator (emu/run/runner.py) and the loopback runner (workloads/local.py)
alike; roles read them with `RoleSpec.model_validate_json`. The fields are declared in the
order the files have always had, so `to_json()` writes what earlier run directories hold
and their `roles/*.json` still read.
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

Role = Literal["server", "worker"]
MODULES: dict[str, str] = {"server": "workloads.server", "worker": "workloads.worker"}  # what runs a role
# A peer whose host vanished (no FIN, no RST) is declared dead after this long without
# acknowledgements for data sent to it (TCP_USER_TIMEOUT) or, when idle, keepalive probes
# (schedulers/transport/connection.py). Under time dilation k the roles get k times this:
# their links run k times slower, and at k = 32 a flow of the forest's probe, one of 100
# sharing a 1.6 Mb/s uplink, went 30 s without an acknowledgement and its connection was dropped.
DEAD_PEER_S = 30.0


class Address(BaseModel):
    """Where a role listens: server i for its workers' pushes, worker i for its peers
    (collective schedulers)."""
    model_config = ConfigDict(extra="forbid", frozen=True)

    host: str
    ip: str
    port: int = Field(ge=0, le=65535)


class SchedulerChoice(BaseModel):
    """The scheduler's registry name and its tunables (validated, defaults filled in)."""
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    params: dict[str, Any] = Field(default_factory=dict)


class RoleSpec(BaseModel):
    """One role's spec. Only `role` and `rank` differ between the roles of a job."""
    model_config = ConfigDict(extra="forbid", frozen=True)

    seed: int  # model initialisation and data streams
    servers: list[Address]  # parameter servers (none for the collective schedulers)
    workers: list[Address]  # len(workers) is the job size
    scheduler: SchedulerChoice
    workload: dict[str, Any]  # the validated `workload:` section (workloads/config.py)
    topology: dict[str, Any] | None = None  # capacity graph, networkx node-link data, bit/s
    out_dir: str  # where the role writes its records
    connect_timeout_s: float = 60.0  # bound on connecting, accepting and rendezvous
    trace: bool = False  # record the scheduler's events
    role: Role
    rank: int = Field(ge=0)  # index into `servers` or `workers`, by role
    iface: str = "lo"  # the role's interface (gloo must be told)
    # plugins to load before the scheduler is created (schedulers/registry/plugins.py): files
    # (their copies in the run directory) or module names; empty for the built-ins
    plugins: list[str] = Field(default_factory=list)
    dead_peer_s: float = Field(default=DEAD_PEER_S, gt=0)  # wall-clock seconds (x k under time dilation)

    @model_validator(mode="after")
    def _rank_names_a_peer(self) -> RoleSpec:
        peers = self.servers if self.role == "server" else self.workers
        if self.rank >= len(peers):
            raise ValueError(f"rank {self.rank}: the spec lists only {len(peers)} {self.role}s")
        return self

    @property
    def name(self) -> str:
        """The role's name in run directories and logs: server0, worker1, ..."""
        return f"{self.role}{self.rank}"

    @property
    def address(self) -> Address:
        """This role's own entry in `servers` or `workers`."""
        return (self.servers if self.role == "server" else self.workers)[self.rank]

    @property
    def module(self) -> str:
        """The module that runs this role: `python -m MODULE SPEC.json`."""
        return MODULES[self.role]

    def to_json(self) -> str:
        # json.dumps, not model_dump_json: the same text as the files written before this model
        # (and so no `plugins` key where there are none, no `dead_peer_s` at its default)
        left_out = set()
        if not self.plugins:
            left_out.add("plugins")
        if self.dead_peer_s == DEAD_PEER_S:
            left_out.add("dead_peer_s")
        return json.dumps(self.model_dump(mode="json", exclude=left_out), indent=1)


def role_specs(servers: Sequence[Address], workers: Sequence[Address], *, seed: int, scheduler: str,
               params: dict[str, Any], workload: dict[str, Any], out_dir: str | Path,
               topology: dict[str, Any] | None = None, connect_timeout_s: float = 60.0, trace: bool = False,
               iface: str | None = None, plugins: Sequence[str] = (),
               dead_peer_s: float = DEAD_PEER_S) -> list[RoleSpec]:
    """The spec of every role of one job, servers first. `iface`: the interface of every
    role (`lo` on loopback); None gives each role its host's `<host>-eth0`, the name
    Mininet gives a host's only interface. `plugins`: what each role loads first."""
    common = dict(seed=seed, servers=list(servers), workers=list(workers),
                  scheduler=SchedulerChoice(name=scheduler, params=params), workload=workload, topology=topology,
                  out_dir=str(out_dir), connect_timeout_s=connect_timeout_s, trace=trace, plugins=list(plugins),
                  dead_peer_s=dead_peer_s)
    return [RoleSpec(**common, role=role, rank=rank, iface=iface or f"{a.host}-eth0")
            for role, peers in (("server", servers), ("worker", workers)) for rank, a in enumerate(peers)]
