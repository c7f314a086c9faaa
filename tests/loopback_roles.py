"""A job's real role processes on loopback, launched the way the runner launches them, behind
the part of `Testbed` that the runner's wait loop, the watchdog's evidence and fault
injection use, so those can be tested on real processes without root or Mininet."""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from contracts.role_spec import Address, role_specs
from emu.config.experiment import Experiment, validate_experiment
from tests.conftest import REPO
from tests.factories import _sections, experiment, star_topology
from workloads.local import free_ports


def replay_job(**changes) -> Experiment:
    """A server and two replay workers (no torch: quick to start) on hosts ps, w0, w1."""
    return validate_experiment(experiment(**{
        "name": "loopback", "timeout_s": 120, "topology": star_topology(ps=100, w0=100, w1=100),
        "workload": {"model": "cnn", "preset": "small", "compute": "replay", "iterations": 100_000}, **changes}),
        _sections())


class LoopbackBed:
    """`roles`, `down_links`, `signal_role` as Testbed has them; every host is 127.0.0.1."""

    def __init__(self):
        self.roles: dict[str, subprocess.Popen] = {}

    def down_links(self) -> list[str]:
        return []

    def signal_role(self, role: str, sig: int) -> bool:
        p = self.roles.get(role)
        if p is None or p.poll() is not None:
            return False
        os.killpg(p.pid, sig)
        return True


@contextlib.contextmanager
def launched(tmp_path: Path, exp: Experiment) -> Iterator[tuple[LoopbackBed, list, Path, Path]]:
    """(bed, roles as the runner lists them, records dir, logs dir); every process is gone after."""
    rec, logs = tmp_path / "records", tmp_path / "logs"
    rec.mkdir()
    logs.mkdir()
    ports = free_ports(1 + len(exp.roles.workers))
    specs = role_specs([Address(host=exp.roles.servers[0], ip="127.0.0.1", port=ports[0])],
                       [Address(host=h, ip="127.0.0.1", port=p) for h, p in zip(exp.roles.workers, ports[1:])],
                       seed=0, scheduler=exp.scheduler, params=exp.scheduler_params, workload=exp.workload,
                       out_dir=rec, connect_timeout_s=30, iface="lo")
    roles = [(s.name, s.address.host, s) for s in specs]
    bed = LoopbackBed()
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    try:
        for name, _, spec in roles:
            path = tmp_path / f"{name}.json"
            path.write_text(spec.to_json())
            with open(logs / f"{name}.out", "wb") as out, open(logs / f"{name}.err", "wb") as err:
                bed.roles[name] = subprocess.Popen([sys.executable, "-m", spec.module, str(path)], cwd=REPO,
                                                   env=env, stdout=out, stderr=err, start_new_session=True)
        yield bed, roles, rec, logs
    finally:
        for p in bed.roles.values():
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                os.killpg(p.pid, signal.SIGCONT)
            p.wait(10)


def iterations(rec: Path, worker: str = "worker1") -> int:
    try:
        return int((rec / f"{worker}.progress").read_text() or 0)
    except (OSError, ValueError):
        return 0
