"""Sweeps on Ray with Mininet, as root (emu/sweeps/raysweep.py; docs/scaling.md: From one machine to N).

A real sweep on a two-node local cluster whose second node is killed mid-run: every run is
recorded once, both nodes ran runs, the lost run was retried, and nothing is left behind. The
nodes share this machine's one network lock, so the test checks distribution, exactly-once and
retry, not speed. SIGTERM cancels the runs and leaves no Ray process. The rest of the Ray sweep
is in tests/unit/test_raysweep.py.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

import pandas as pd
import pytest
import yaml

from emu.run import results as results_io
from emu.sweeps import raysweep
from tests.conftest import REPO, invoke_popen, wait_for
from tests.factories import experiment, star_topology

SWEEP = experiment(name="ray-e2e", timeout_s=120, topology=star_topology(ps=100, w0=100, w1=100),
                   workload={"model": "cnn", "preset": "small", "compute": "replay", "iterations": 20, "warmup": 2},
                   seeds=[0, 1, 2, 3, 4])


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


@pytest.mark.slow
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
            if not results_io.read_runs(runs.parent)["ray_node"].str.endswith(second.node_id[:8]).any():
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


@pytest.mark.slow
def test_sigterm_cancels_the_runs_and_leaves_no_ray_process(tmp_path, no_leftovers, procs):
    """`--ray local` stopped by SIGTERM mid-run: the run is cancelled (its network torn down),
    exit 130, and the local cluster is gone, processes and temporary directory."""
    import tasks

    tasks._ensure_ray()
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump({**SWEEP, "seeds": [0, 1], "workload": {**SWEEP["workload"], "iterations": 200}}))
    proc = procs.add(invoke_popen("sweep", str(path), "--ray", "local", "--results", str(tmp_path / "results")))
    wait_for(lambda: any((r / "records" / "worker1.progress").exists()
                         for r in raysweep.RUNS_TMP.glob(f"*/{SWEEP['name']}/*")), 120, "a run on the node")
    local = list(Path(tempfile.gettempdir()).glob(f"schedlab-ray-{proc.pid}-*"))
    assert len(local) == 1
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    assert "ray: cancelled 2 run(s)" in err and err.strip().endswith("the same command resumes the sweep")
    assert not local[0].exists()
    wait_for(lambda: not [p for p in os.listdir("/proc") if p.isdigit() and str(local[0]).encode() in _cmdline(p)],
             10, "the local cluster's processes to exit")
    assert not (tmp_path / "results" / SWEEP["name"] / "runs.parquet").exists()  # nothing finished
