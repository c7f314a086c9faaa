"""Sweeps on Ray (emu/sweeps/raysweep.py; docs/scaling.md: From one machine to N).

Without Ray: the --ray address (unreachable: one line, exit 2, nothing created), the run
directory's round trip, and the driver's bookkeeping against a stand-in for Ray (done runs
skipped, each run recorded once, a run whose node failed every attempt recorded as failed, lost
nodes named). With Ray, as root (tests/mininet/test_raysweep_mininet.py): a real sweep on a
two-node local cluster whose second node is killed mid-run; every run is recorded once, both
nodes ran runs, the lost run was retried, and nothing is left behind. The nodes share this
machine's one network lock, so the test checks distribution, exactly-once and retry, not speed.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tarfile
import tempfile
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from emu.config.experiment import ConfigError
from emu.config.plan import load_plan
from emu.run.results import read_runs, record_run
from emu.sweeps import raysweep
from tasks import _sections
from tests.conftest import REPO, invoke
from tests.factories import GOOD


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_addresses():
    assert raysweep.parse_address("local") == "local" and raysweep.parse_address(" auto ") == "auto"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert raysweep.parse_address(f"127.0.0.1:{port}") == f"127.0.0.1:{port}"
        assert raysweep.parse_address(f"ray://localhost:{port}") == f"ray://localhost:{port}"
    for bad in ("", "lcoal", "10.0.0.5", "10.0.0.5:0", "10.0.0.5:70000", "http://x:1"):
        with pytest.raises(ConfigError, match=r"expected local, auto, HOST:PORT or ray://HOST:PORT"):
            raysweep.parse_address(bad)
    port = closed_port()
    with pytest.raises(ConfigError, match=rf"^--ray '127.0.0.1:{port}': nothing answers at 127.0.0.1:{port} "
                                          r"\(Connection refused\); start the head node"):
        raysweep.parse_address(f"127.0.0.1:{port}")


@pytest.mark.slow
def test_cli_unreachable_address_exit_2_nothing_created(tmp_path):
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(GOOD))
    port = closed_port()
    r = invoke("sweep", str(tmp_path / "c.yaml"), "--ray", f"127.0.0.1:{port}", "--results", str(tmp_path / "r"),
               timeout=60)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().startswith(f"error: --ray '127.0.0.1:{port}': nothing answers at")
    assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "r").exists()


def test_run_directory_round_trip(tmp_path):
    run = tmp_path / "node" / "r1"
    (run / "logs").mkdir(parents=True)
    (run / "logs" / "worker0.err").write_text("last words")
    (run / "iterations.parquet").write_bytes(b"\0" * 1000)
    into = tmp_path / "driver" / "r1"
    (into / "stale").mkdir(parents=True)  # what an interrupted earlier attempt left
    raysweep.unpack(raysweep.pack(run), into)
    assert sorted(p.relative_to(into).as_posix() for p in into.rglob("*")) == [
        "iterations.parquet", "logs", "logs/worker0.err"]
    assert (into / "logs" / "worker0.err").read_text() == "last words"


def test_unpack_refuses_paths_outside_the_run(tmp_path):
    evil = tmp_path / "evil.tar"
    with tarfile.open(evil, "w") as tar:
        (tmp_path / "x").write_text("x")
        tar.add(tmp_path / "x", arcname="../../escaped")
    with pytest.raises(ValueError, match="refusing '../../escaped'"):
        raysweep.unpack(evil.read_bytes(), tmp_path / "into" / "r1")
    assert not (tmp_path / "escaped").exists()


class RayError(Exception):
    pass


class TaskCancelledError(RayError):
    pass


class Ref:
    def __init__(self, args):
        self.args = args


class FakeRay:
    """Ray's calls the driver makes: each task runs at once, in-process, unless it `fails`."""

    exceptions = SimpleNamespace(RayError=RayError, TaskCancelledError=TaskCancelledError)

    def __init__(self, fails=(), nodes=None):
        self.fails, self.calls = set(fails), []
        self._nodes = nodes or [{"NodeID": "a" * 40, "NodeManagerHostname": "h", "Alive": True,
                                 "Resources": {"emu": 1.0}}]

    def cluster_resources(self):
        return {"emu": float(sum(n["Resources"].get("emu", 0) for n in self._nodes if n["Alive"]))}

    def nodes(self):
        return self._nodes

    def remote(self, fn):
        ray = self

        class Task:
            def options(self, **opts):
                assert opts["resources"] == {"emu": 1} and opts["max_retries"] >= 1
                return self

            def remote(self, exp, repeat, point):
                ray.calls.append(exp.run_id(repeat))
                return Ref((exp, repeat, point))

        return Task()

    def wait(self, refs, num_returns=1, timeout=None):
        return refs[:num_returns], refs[num_returns:]

    def get(self, ref):
        exp, repeat, point = ref.args
        rid = exp.run_id(repeat)
        if rid in self.fails:
            raise RayError(f"NodeDiedError: the node running {rid} died\n(details)")
        row = {"run_id": rid, "sweep": exp.name, "repeat": repeat, "status": "ok", "reason": "",
               "iter_time_median_s": 0.1, "wall_s": 2.0, "ray_node": "h/aaaaaaaa", **raysweep.point_columns(point)}
        with tempfile.TemporaryDirectory() as d:
            (Path(d) / "logs").mkdir()
            return raysweep.NodeResult(row=row, tarball=raysweep.pack(Path(d)), node="h/aaaaaaaa",
                                       cleaned=["link s1-eth1 [orchestrator 7]"])


@pytest.fixture
def fake_ray(monkeypatch):
    def use(ray):
        monkeypatch.setattr(raysweep, "connect", lambda address: _yield(ray))
        monkeypatch.setattr(raysweep.preflight, "check", lambda plan: None)
        return ray
    return use


def _yield(value):
    from contextlib import contextmanager

    return contextmanager(lambda: (yield value))()


def plan_of(tmp_path, seeds):
    (tmp_path / "c.yaml").write_text(yaml.safe_dump({**GOOD, "name": "rs", "grid": {"seed": seeds}}))
    return load_plan(tmp_path / "c.yaml", _sections())


def test_driver_records_each_run_once_and_skips_what_is_done(tmp_path, fake_ray, capsys):
    plan = plan_of(tmp_path, [0, 1, 2])
    ids = [e.run_id(0) for e in plan.experiments]
    record_run(tmp_path / "r" / "rs", {"run_id": ids[0], "status": "ok", "started_at": "before"})
    ray = fake_ray(FakeRay())
    rows = raysweep.run_plan_on_ray(plan, tmp_path / "r", "local")
    assert ray.calls == ids[1:] and [r["run_id"] for r in rows] == ids[1:]
    runs = read_runs(tmp_path / "r" / "rs").set_index("run_id")
    assert sorted(runs.index) == sorted(ids) and runs.loc[ids[0], "started_at"] == "before"
    assert (runs.loc[ids[1:], "ray_node"] == "h/aaaaaaaa").all()
    assert all((tmp_path / "r" / "rs" / rid / "logs").is_dir() for rid in ids[1:])
    err = capsys.readouterr().err
    assert f"({ids[0]}): already in" in err and f"({ids[1]}) on h/aaaaaaaa: ok, median iteration 100 ms" in err
    assert "cleaned up link s1-eth1 [orchestrator 7] (on h/aaaaaaaa)" in err
    # again: nothing left to run, nothing recorded twice
    assert raysweep.run_plan_on_ray(plan, tmp_path / "r", "local") == []
    assert len(read_runs(tmp_path / "r" / "rs")) == 3


def test_a_run_whose_every_attempt_failed_is_a_failed_row(tmp_path, fake_ray):
    plan = plan_of(tmp_path, [0, 1])
    bad = plan.experiments[1].run_id(0)
    fake_ray(FakeRay(fails={bad}))
    rows = raysweep.run_plan_on_ray(plan, tmp_path / "r", "local")
    runs = read_runs(tmp_path / "r" / "rs").set_index("run_id")
    assert len(rows) == 2 and runs.loc[bad, "status"] == "failed"
    assert runs.loc[bad, "reason"] == "ray: RayError: (details)" or "NodeDiedError" in runs.loc[bad, "reason"]
    assert runs.loc[bad, "seed"] == 1 and runs.loc[bad, "scheduler"] == GOOD["scheduler"]


def test_no_node_offering_emu_is_refused_before_anything(tmp_path, fake_ray):
    plan = plan_of(tmp_path, [0])
    fake_ray(FakeRay(nodes=[{"NodeID": "b" * 40, "NodeManagerHostname": "h", "Alive": True, "Resources": {}}]))
    with pytest.raises(ConfigError, match=r"no node offers the resource 'emu'; start each node with"):
        raysweep.run_plan_on_ray(plan, tmp_path / "r", "local")
    assert not (tmp_path / "r").exists()


def test_lost_nodes_are_named_and_no_node_for_long_stops_the_sweep(monkeypatch):
    a = {"NodeID": "a" * 40, "NodeManagerHostname": "h1", "Alive": True, "Resources": {"emu": 1.0}}
    b = {"NodeID": "b" * 40, "NodeManagerHostname": "h2", "Alive": True, "Resources": {"emu": 1.0}}
    ray = FakeRay(nodes=[a, b])
    nodes, said = raysweep.Nodes(ray), []
    b["Alive"] = False
    nodes.check(said.append)
    assert said == ["ray: node h2/bbbbbbbb lost; its run, if any, is retried on another node"]
    a["Alive"] = False
    clock = [100.0]
    monkeypatch.setattr(raysweep.time, "monotonic", lambda: clock[0])
    nodes.check(said.append)
    clock[0] += raysweep.NO_NODE_S + 1
    with pytest.raises(RuntimeError, match="no node offers the resource 'emu' for"):
        nodes.check(said.append)


def test_first_ray_use_installs_the_optional_lock(monkeypatch):
    import importlib.util

    import tasks

    calls = []
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None if not calls else object())
    monkeypatch.setattr(subprocess, "run", lambda args, env: calls.append((args, env)) or SimpleNamespace(returncode=0))
    tasks._ensure_ray()
    (args, env), = calls
    assert args == [str(REPO / "scripts" / "setup.sh"), "ray"] and env["SCHEDLAB_VENV"] == sys.prefix


# ---------------------------------------------------------------- a real two-node cluster


def test_the_example_cluster_file_is_valid_for_ray_up():
    """configs/ray/cluster.yaml against the schema `ray up` checks first; its nodes are set up by
    scripts/setup.sh with the Ray group, and each worker node offers one network."""
    import importlib.util

    spec = importlib.util.find_spec("ray")
    if spec is None:
        pytest.skip("Ray is not installed here (the first --ray installs it)")
    import jsonschema

    cfg = yaml.safe_load((REPO / "configs" / "ray" / "cluster.yaml").read_text())
    schema = json.loads((Path(spec.origin).parent / "autoscaler" / "ray-schema.json").read_text())
    jsonschema.validate(cfg, schema)
    assert any("scripts/setup.sh ray" in c for c in cfg["setup_commands"])
    assert """--resources='{"emu": 1}'""" in " ".join(cfg["worker_start_ray_commands"])
    assert cfg["available_node_types"]["emu"]["resources"] == {"emu": 1}


def test_the_ray_driver_leaves_a_claimed_run_to_its_holder_and_takes_its_row(tmp_path, fake_ray, capsys,
                                                                             monkeypatch):
    from emu.run.claims import try_claim

    monkeypatch.setattr(raysweep, "CLAIM_POLL_S", 0.1)
    plan = plan_of(tmp_path, [0, 1])
    ids = [e.run_id(0) for e in plan.experiments]
    sweep_dir = tmp_path / "r" / "rs"
    sweep_dir.mkdir(parents=True)
    other = try_claim(sweep_dir, ids[1])   # another sweep executes the second run ...

    def finish() -> None:   # ... records its row and lets go while this driver waits
        record_run(sweep_dir, {"run_id": ids[1], "status": "ok", "reason": "", "started_at": "other",
                               "iter_time_median_s": 0.2, "wall_s": 3.0})
        other.release()

    threading.Timer(0.5, finish).start()
    ray = fake_ray(FakeRay())
    rows = raysweep.run_plan_on_ray(plan, tmp_path / "r", "local")
    assert ray.calls == ids[:1]   # the claimed run was not submitted
    assert sorted(r["run_id"] for r in rows) == sorted(ids)
    runs = read_runs(sweep_dir).set_index("run_id")
    assert len(runs) == 2 and runs.loc[ids[1], "started_at"] == "other"
    err = capsys.readouterr().err
    assert f"({ids[1]}): claimed by another sweep (pid {os.getpid()}" in err
    assert f"({ids[1]}): run by another sweep meanwhile, not again: ok" in err
    assert not list((sweep_dir / ".claims").iterdir())   # every claim let go
