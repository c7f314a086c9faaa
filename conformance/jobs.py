"""One conformance job on loopback: every server and worker its own process over 127.0.0.1.

Separate processes, as in a real run (workloads/local.py starts the training roles the same
way): a scheduler's threads, sockets and torch.distributed state are each role's own, and a
worker that dies really exits. The capacity graph is the one the orchestrator would build
for a star of 1 Gb/s hosts (emu/config/capacity.py), for schedulers that plan on it.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from emu.config.capacity import capacity_graph, graph_to_json
from emu.config.topospec import StarTopology
from schedulers import registry
from workloads.local import REPO, free_ports

CONNECT_TIMEOUT_S = 20
SERVER_GRACE_S = 5.0  # how long servers may serve on once every worker has exited


@dataclass
class Job:
    """What one job runs: a scheduler and its params, how many roles, which tensors, how long,
    and the plugins that define the scheduler (loaded in every role, as a run's roles do).
    `stop_after`: rank -> gradients of the last iteration that worker pushes before it dies."""

    name: str
    params: dict
    workers: int
    servers: int
    sizes: list[int]
    iterations: int
    seed: int = 0
    stop_after: dict[int, int] | None = None
    timeout_s: float = 120.0
    plugins: list[str] = field(default_factory=list)  # absolute plugin files (or modules) each role loads


@dataclass
class Outcome:
    """Each role's answer (None: it gave none: hung, or killed) and the job's wall time."""

    servers: list[dict | None]
    workers: list[dict | None]
    wall_s: float


def topology(hosts: list[str]) -> dict:
    """The star's capacity graph; a lone role gets an idle second host, as a config must have."""
    hosts = hosts + ["idle"] * (len(hosts) < 2)
    star = StarTopology.model_validate({"kind": "star", "hosts": [{"name": h, "bw_mbps": 1000} for h in hosts]})
    return graph_to_json(capacity_graph(star.resolve()))


def specs(job: Job, out_dir: Path) -> list[dict]:
    """Every role's spec, servers first; servers only where the scheduler needs them."""
    servers = job.servers if registry.SCHEDULERS[job.name].Params.requires_servers else 0
    ports = free_ports(servers + job.workers)
    sends = [{"host": f"ps{s}", "ip": "127.0.0.1", "port": p} for s, p in enumerate(ports[:servers])]
    wends = [{"host": f"w{r}", "ip": "127.0.0.1", "port": p} for r, p in enumerate(ports[servers:])]
    common = {"name": job.name, "params": job.params, "servers": sends, "workers": wends,
              "topology": topology([e["host"] for e in sends + wends]), "sizes": job.sizes,
              "iterations": job.iterations, "seed": job.seed, "connect_timeout_s": CONNECT_TIMEOUT_S,
              "plugins": job.plugins}
    roles = [("server", s) for s in range(servers)] + [("worker", r) for r in range(job.workers)]
    return [{**common, "role": role, "rank": rank, "out": str(out_dir / f"{role}{rank}.json"),
             "stop_after": (job.stop_after or {}).get(rank) if role == "worker" else None} for role, rank in roles]


def run(job: Job, out_dir: Path) -> Outcome:
    """Start every role, wait for all (killing what is left at the timeout), read the answers."""
    out_dir.mkdir(parents=True, exist_ok=True)
    env = {"PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "PATH": os.environ["PATH"]}
    all_specs = specs(job, out_dir)
    procs = []
    t0 = time.monotonic()
    try:
        for spec in all_specs:
            path = out_dir / f"{spec['role']}{spec['rank']}.spec.json"
            path.write_text(json.dumps(spec))
            with open(out_dir / f"{spec['role']}{spec['rank']}.log", "w") as log:
                procs.append(subprocess.Popen([sys.executable, "-m", "conformance.role", str(path)], cwd=REPO,
                                              env=env, stdout=log, stderr=subprocess.STDOUT))
        n = sum(s["role"] == "server" for s in all_specs)
        _wait_all(procs[n:], t0 + job.timeout_s)
        _wait_all(procs[:n], min(t0 + job.timeout_s, time.monotonic() + SERVER_GRACE_S))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
    wall = time.monotonic() - t0
    answers = [_read(Path(s["out"])) for s in all_specs]
    n = sum(s["role"] == "server" for s in all_specs)
    return Outcome(servers=answers[:n], workers=answers[n:], wall_s=wall)


def _wait_all(procs: list[subprocess.Popen], deadline: float) -> None:
    """Wait for every process until `deadline` (those still running are killed by the caller)."""
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            return


def _read(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def log_tail(out_dir: Path, role: str, lines: int = 3) -> str:
    try:
        return " | ".join((out_dir / f"{role}.log").read_text(errors="replace").strip().splitlines()[-lines:])
    except OSError:
        return ""
