"""A role's progress report: how far it got, and the bytes each of its connections moved.

Roles answer the orchestrator only through files. Every role, servers as well as workers,
rewrites `<out_dir>/<role>.progress.json` a few times a second (schedulers/core/progress.py
writes it), and the orchestrator's watchdog (emu/run/watchdog.py) reads it to tell a role that
makes progress from one that has stalled, and to say what the others were waiting on. The
per-connection figures are the kernel's (TCP_INFO of every TCP socket the process holds),
so they cover sockets the harness does not own (gloo's) and cost the data path nothing.

`worker<r>.progress` (the iteration count as text) is still written beside it, for what
already reads that file.
"""
from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

SUFFIX = ".progress.json"
# The report is rewritten this often; a report older than STALE_S says the process is not
# running its threads (stopped, or hung in the kernel).
INTERVAL_S = 0.5
STALE_S = 3.0

Phase = Literal["starting", "training", "finishing", "serving"]


class ConnProgress(BaseModel):
    """One TCP connection of the role, as the kernel counts it."""
    model_config = ConfigDict(extra="forbid", frozen=True)

    local: str                      # "ip:port"
    peer: str                       # "ip:port"
    state: int                      # TCP state (1: established)
    sent_bytes: int = 0             # bytes the peer has acknowledged (tcpi_bytes_acked)
    received_bytes: int = 0         # bytes received in order (tcpi_bytes_received)
    unacked: int = 0                # segments sent and not yet acknowledged
    backoff: int = 0                # RTO backoff: > 0 while retransmissions go unanswered
    idle_send_s: float = 0.0        # since data was last sent on it
    idle_recv_s: float = 0.0        # since data was last received on it


class RoleProgress(BaseModel):
    """One role's report. `key()` changes exactly when the role made progress."""
    model_config = ConfigDict(extra="forbid", frozen=True)

    role: str                       # server0, worker1, ...
    pid: int
    t: float                        # wall clock when written
    seq: int = 0                    # reports written so far (a heartbeat)
    phase: Phase = "starting"
    iterations: int = 0             # completed iterations (workers)
    iteration_median_s: float | None = None  # median of the recent iterations, the first left out
    conns: list[ConnProgress] = Field(default_factory=list)

    @property
    def sent_bytes(self) -> int:
        return sum(c.sent_bytes for c in self.conns)

    @property
    def received_bytes(self) -> int:
        return sum(c.received_bytes for c in self.conns)

    def key(self) -> tuple:
        """What progress is: an iteration completed, a byte moved on any connection, or a
        change of phase (start-up and the final evaluation move no bytes)."""
        return self.phase, self.iterations, self.sent_bytes, self.received_bytes, len(self.conns)


def path(out_dir: str | Path, role: str) -> Path:
    return Path(out_dir) / f"{role}{SUFFIX}"


def read(p: str | Path) -> RoleProgress | None:
    """The report at `p`, None if there is none (yet) or it cannot be read. Reports are
    renamed into place, so a reader never sees half of one."""
    try:
        return RoleProgress.model_validate_json(Path(p).read_bytes())
    except (OSError, ValueError, ValidationError):
        return None
