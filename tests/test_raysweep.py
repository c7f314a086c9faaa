"""Sweeps on Ray (emu/sweeps/raysweep.py; README: From one machine to N).

Without Ray: the --ray address (unreachable: one line, exit 2, nothing created), the run
directory's round trip, and the driver's bookkeeping against a stand-in for Ray (done runs
skipped, each run recorded once, a run whose node failed every attempt recorded as failed,
lost nodes named). With Ray, as root: a real sweep on a two-node local cluster whose second
node is killed mid-run; every run is recorded once, both nodes ran runs, the lost run was
retried, and nothing is left behind. The nodes share this machine's one network lock, so
the test checks distribution, exactly-once and retry, not speed.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
import yaml

from emu.config.experiment import ConfigError
from emu.config.plan import load_plan
from emu.run.results import read_runs, record_run
from emu.sweeps import raysweep
from tasks import _sections
from tests.conftest import REPO, invoke, invoke_popen, needs_root, wait_for
from tests.test_config import GOOD


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

SWEEP = {
    "name": "ray-e2e",
    "timeout_s": 120,
    "topology": {"kind": "star", "hosts": [{"name": "ps", "bw_mbps": 100}, {"name": "w0", "bw_mbps": 100},
                                           {"name": "w1", "bw_mbps": 100}]},
    "roles": {"servers": ["ps"], "workers": ["w0", "w1"]},
    "workload": {"model": "cnn", "preset": "small", "compute": "replay", "iterations": 20, "warmup": 2},
    "scheduler": "fifo",
    "seeds": [0, 1, 2, 3, 4],
}


def lock_holder() -> int | None:
    """The pid that holds (or last held) the machine's one network (emu/testbed/network.py writes it)."""
    try:
        text = Path("/run/schedlab/network.lock").read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() and Path(f"/proc/{text}").exists() else None


def parent(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def children(pid: int) -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit() and parent(int(p)) == pid]


def in_flight(worker: int) -> tuple[str, int] | None:
    """(run_id, iterations worker1 reported) of the run a Ray worker process has on its node."""
    for run in raysweep.RUNS_TMP.glob(f"{worker}-*/{SWEEP['name']}/*"):
        try:
            return run.name, int((run / "records" / "worker1.progress").read_text() or 0)
        except (OSError, ValueError):
            return run.name, 0
    return None


def _cmdline(pid: str) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


@needs_root
@pytest.mark.mininet
def test_two_node_cluster_runs_each_once_and_retries_a_lost_nodes_run(tmp_path, monkeypatch, no_leftovers):
    """Both nodes offer {"emu": 1} and share this machine's network lock. Once the second node
    has finished a run and is mid-way through another, it is lost (its worker and raylet
    SIGKILLed, so its network is left up): that run is retried on the head, every run is
    recorded once, and nothing of the runs or of Ray is left."""
    import tasks

    tasks._ensure_ray()
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(SWEEP))
    results, runs = tmp_path / "results", tmp_path / "results" / SWEEP["name"] / "runs.parquet"
    ray_tmp = Path(tempfile.mkdtemp(prefix="rt-"))  # short: Ray's socket paths must fit 107 bytes
    (ray_tmp / "ray").mkdir()
    for k, v in {"RAY_TMPDIR": str(ray_tmp), "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "token",
                 "RAY_AUTH_TOKEN": os.urandom(32).hex()}.items():
        monkeypatch.setenv(k, v)  # the driver (a subprocess) inherits them
    from ray.cluster_utils import Cluster  # after those: Ray reads its settings once, on import

    args = {"num_cpus": 1, "resources": {"emu": 1}, "temp_dir": str(ray_tmp / "ray")}
    cluster = Cluster(initialize_head=True, head_node_args={**args, "include_dashboard": False})
    proc = None
    try:
        head, second = cluster.head_node, cluster.add_node(**args)
        raylet = second.all_processes["raylet"][0].process.pid
        proc = invoke_popen("sweep", str(path), "--ray", cluster.address, "--results", str(results))

        def second_node_mid_run():  # after a run of its own is recorded
            holder = lock_holder()
            if not (holder and parent(holder) == raylet and runs.exists()):
                return None
            if not pd.read_parquet(runs)["ray_node"].str.endswith(second.node_id[:8]).any():
                return None
            got = in_flight(holder)
            return (holder, got[0]) if got and got[1] >= 3 else None

        worker, lost_run = wait_for(second_node_mid_run, 240, "the second node mid-way through its second run")
        for pid in [worker, *children(raylet)]:  # the node is lost: its processes die with it
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        cluster.remove_node(second, allow_graceful=False)
        out, err = proc.communicate(timeout=300)
        (tmp_path / "driver.err").write_text(err)  # kept by pytest for a look after a failure
        assert proc.returncode == 0, err[-3000:]
    finally:
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        cluster.shutdown()
        shutil.rmtree(ray_tmp, ignore_errors=True)
    got = pd.read_parquet(runs).set_index("run_id")
    assert len(got) == 5 and got.index.is_unique and (got["status"] == "ok").all(), got[["status", "reason"]]
    node_of = got["ray_node"].str.split("/").str[1]
    assert set(node_of) == {head.node_id[:8], second.node_id[:8]}  # both nodes ran runs
    assert node_of[lost_run] == head.node_id[:8]  # the lost run, retried on the head, recorded once
    # (Ray's GCS names the node dead once its health checks fail, often after the sweep is over:
    # the driver's line "ray: node ... lost" is not waited for here.)
    assert "cleaned up" in err, err[-3000:]  # the lost node's network, before the retry
    meta = json.loads((results / SWEEP["name"] / lost_run / "meta.json").read_text())
    head_sha = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    assert meta["git_sha"] == head_sha.strip()
    # nothing of Ray's is left: no process of the cluster, no node-local run directory
    wait_for(lambda: not [p for p in os.listdir("/proc") if p.isdigit() and str(ray_tmp).encode() in _cmdline(p)],
             10, "the cluster's processes to exit")
    assert not list(raysweep.RUNS_TMP.glob("*"))


@needs_root
@pytest.mark.mininet
def test_sigterm_cancels_the_runs_and_leaves_no_ray_process(tmp_path, no_leftovers):
    """`--ray local` stopped by SIGTERM mid-run: the run is cancelled (its network torn down),
    exit 130, and the local cluster is gone, processes and temporary directory."""
    import tasks

    tasks._ensure_ray()
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump({**SWEEP, "seeds": [0, 1], "workload": {**SWEEP["workload"], "iterations": 200}}))
    proc = invoke_popen("sweep", str(path), "--ray", "local", "--results", str(tmp_path / "results"))
    try:
        wait_for(lambda: any((r / "records" / "worker1.progress").exists()
                             for r in raysweep.RUNS_TMP.glob(f"*/{SWEEP['name']}/*")), 120, "a run on the node")
        local = list(Path(tempfile.gettempdir()).glob(f"schedlab-ray-{proc.pid}-*"))
        assert len(local) == 1
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, err[-2000:]
    assert "ray: cancelled 2 run(s)" in err and err.strip().endswith("the same command resumes the sweep")
    assert not local[0].exists()
    wait_for(lambda: not [p for p in os.listdir("/proc") if p.isdigit() and str(local[0]).encode() in _cmdline(p)],
             10, "the local cluster's processes to exit")
    assert not (tmp_path / "results" / SWEEP["name"] / "runs.parquet").exists()  # nothing finished


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
