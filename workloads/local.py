"""Run one job on loopback, each role its own process, without Mininet or root: for
benchmarks and tests that need real processes (separate interpreters, so timing and peak
memory are each role's own).

    jobs = run_job({"model": "cnn", "preset": "tiny", "iterations": 3}, workers=2, out_dir=tmp)

Role specs come from the builder the orchestrator uses (contracts/role_spec.py), with
127.0.0.1, free ports and no capacity graph; returns each worker's record (worker<rank>.json).
"""
from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

from contracts.role_spec import Address, role_specs
from schedulers import registry

REPO = Path(__file__).resolve().parents[1]


class JobFailed(RuntimeError):
    pass


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def run_job(workload: dict, out_dir: Path, workers: int = 1, scheduler: str = "fifo", params: dict | None = None,
            servers: int | None = None, seed: int = 0, timeout_s: float = 600, threads: int = 1,
            trace: bool = False, plugins: list[str] = ()) -> list[dict]:
    """`plugins`: files or modules to load first (here and in every role), as a config's `plugins:`."""
    out_dir = Path(out_dir)
    plugins = [str(Path(p).resolve()) if p.endswith(".py") else p for p in plugins]
    if plugins:
        from schedulers.registry.plugins import load_plugins

        load_plugins(plugins, Path.cwd())
    out_dir.mkdir(parents=True, exist_ok=True)
    if servers is None:
        servers = 1 if registry.SCHEDULERS[scheduler].Params.requires_servers else 0
    ports = [Address(host="lo", ip="127.0.0.1", port=p) for p in free_ports(servers + workers)]
    specs = role_specs(ports[:servers], ports[servers:], seed=seed, scheduler=scheduler, params=params or {},
                       workload=workload, out_dir=out_dir, connect_timeout_s=30, iface="lo", trace=trace,
                       plugins=plugins)
    env = {"PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": str(threads),
           "PATH": "/usr/bin:/bin"}
    procs = []
    try:
        for spec in specs:
            path = out_dir / f"{spec.name}.spec.json"
            path.write_text(spec.to_json())
            log = open(out_dir / f"{spec.name}.log", "w")
            procs.append((spec.name, subprocess.Popen([sys.executable, "-m", spec.module, str(path)], cwd=REPO,
                                                      env=env, stdout=log, stderr=subprocess.STDOUT)))
            log.close()
        deadline = time.monotonic() + timeout_s
        for name, p in procs:
            rc = p.wait(timeout=max(1.0, deadline - time.monotonic()))
            if rc != 0:
                tail = (out_dir / f"{name}.log").read_text(errors="replace").strip().splitlines()[-5:]
                raise JobFailed(f"{name} exited with {rc}: " + " | ".join(tail))
    except subprocess.TimeoutExpired:
        raise JobFailed(f"job did not finish within {timeout_s:g} s") from None
    finally:
        for _, p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return [json.loads((out_dir / f"worker{r}.json").read_text()) for r in range(workers)]
