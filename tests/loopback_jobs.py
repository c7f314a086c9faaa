"""Jobs of real schedulers over TCP on 127.0.0.1, for the loopback tier: workers that push known
gradients and wait for their averages (`drive`, `run_job`: every scheduler against a reference
average), in-process parameter servers (`Servers`), threads of workers (`run_workers`,
`run_threads`), and endpoints and role contexts on loopback.

`run_job` starts what a scheduler needs: parameter servers for the PS family
(`Params.requires_servers`), none for the collective family, whose workers get free
loopback ports of their own. Workers run as threads of this process, except for
schedulers built on torch.distributed, which allows one process group per process: their
workers are subprocesses (`python -c`), kept in a pool that runs one job after another.
"""
from __future__ import annotations

import atexit
import json
import os
import select
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

import numpy as np

from conformance.reference import SIZES, gradient, tensor_set  # noqa: F401 - tests import them from here
from schedulers import registry
from schedulers.core.base import CommError, Endpoint, RoleContext, TensorSpec
from schedulers.ps.server import ParameterServer
from schedulers.transport.connection import Mode
from tests.conftest import REPO
from tests.factories import star_links
from workloads.local import free_ports

# Small partitions, buckets and chunks, so that the small test tensors still span many.
SMALL_PARTS = {
    "bytescheduler": {"partition_numel": 1024, "credit_numel": 4096},
    "ring": {"bucket_mb": 0.05, "first_bucket_mb": 0.01, "chunk_kb": 16},
    "gloo": {"bucket_mb": 0.05, "first_bucket_mb": 0.01},
}
ONE_WORKER_PER_PROCESS = {"gloo"}  # torch.distributed: one default process group per process
TIMEOUT_S = 60


def drive(name: str, params: dict, ctx: RoleContext, sizes: list[int], iterations: int, seed: int,
          stop_after: int | None = None) -> list[dict[int, np.ndarray]]:
    """One worker: push every gradient in backward order (last layer first), as training
    does, then wait for each average. `stop_after`: push that many gradients of the last
    iteration, then return without closing (a worker that dies)."""
    tensors = [TensorSpec(key=k, name=f"t{k}", numel=n, priority=k) for k, n in enumerate(sizes)]
    sched = registry.create(name, ctx, params)
    sched.start(tensors)
    got = []
    for it in range(iterations):
        for i, t in enumerate(reversed(tensors)):
            if stop_after is not None and it == iterations - 1 and i == stop_after:
                return got
            sched.push(t.key, gradient(seed, it, ctx.rank, t.key, t.numel), it)
        got.append({t.key: sched.wait(t.key, it).copy() for t in tensors})
    sched.close()
    return got


def run_spec(spec: dict) -> str | None:
    """One worker of a job in this process: run `drive`, save the averages as .npz; the
    error, if any (a CommError message, or a traceback for anything else)."""
    ctx = RoleContext(rank=spec["rank"], num_workers=len(spec["workers"]),
                      servers=[Endpoint(**s) for s in spec["servers"]],
                      workers=[Endpoint(**w) for w in spec["workers"]],
                      topology=spec["topology"], connect_timeout_s=spec.get("connect_timeout_s", 20), iface="lo")
    try:
        got = drive(spec["name"], spec["params"], ctx, spec["sizes"], spec["iterations"], spec["seed"],
                    stop_after=spec.get("stop_after"))
    except CommError as e:
        return f"CommError: {e}"
    except BaseException:  # noqa: BLE001 - reported to the test, which fails with it
        return traceback.format_exc()
    if spec.get("stop_after") is not None:
        os._exit(0)  # dies mid-iteration: no close, no BYE, as a crash
    np.savez(spec["out"], **{f"{it}_{k}": v for it, res in enumerate(got) for k, v in res.items()})
    return None


def pool_worker() -> None:
    """Main loop of a pool process: a JSON job spec per stdin line, a JSON answer per line."""
    for line in sys.stdin:
        error = run_spec(json.loads(line))
        print(json.dumps({"error": error}), flush=True)


def spawn_job(spec: dict) -> subprocess.Popen:
    """One worker in a fresh process; it prints its answer as one JSON line."""
    code = ("import json, sys; from tests.loopback_jobs import run_spec; "
            "print(json.dumps({'error': run_spec(json.loads(sys.argv[1]))}), flush=True)")
    return subprocess.Popen([sys.executable, "-c", code, json.dumps(spec)], cwd=REPO,
                            env={**os.environ, "PYTHONPATH": str(REPO)},
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)


class ProcessPool:
    """Worker processes that import torch once and run one job after another (importing
    torch costs about a second of CPU per process). A process whose job failed is replaced."""

    def __init__(self):
        self.procs: list[subprocess.Popen] = []

    def run(self, specs: list[dict], timeout_s: float = TIMEOUT_S) -> list[str | None]:
        """Run specs[i] in process i, all at once; each process's error or None."""
        self.procs = [p for p in self.procs if p.poll() is None]
        while len(self.procs) < len(specs):
            code = "from tests.loopback_jobs import pool_worker; pool_worker()"
            self.procs.append(subprocess.Popen(
                [sys.executable, "-c", code], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True))
        procs = self.procs[:len(specs)]
        for p, spec in zip(procs, specs, strict=True):
            p.stdin.write(json.dumps(spec) + "\n")
            p.stdin.flush()
        deadline = time.monotonic() + timeout_s
        answers: list[str | None] = []
        for rank, p in enumerate(procs):
            ready, _, _ = select.select([p.stdout], [], [], max(0.0, deadline - time.monotonic()))
            line = p.stdout.readline() if ready else ""
            if not line:
                self.close()
                return answers + [f"worker {rank} hung or died (exit status {p.poll()})"]
            answers.append(json.loads(line)["error"])
        for p, error in zip(procs, answers, strict=True):
            if error is not None:  # a failed job may leave torch.distributed state behind
                p.kill()
                p.wait()
        return answers

    def close(self) -> None:
        for p in self.procs:
            p.kill()
            p.wait()
        self.procs = []


POOL = ProcessPool()
atexit.register(POOL.close)


def start_servers(num_servers: int, num_workers: int) -> tuple[list[Endpoint], list[threading.Thread], list]:
    servers = [ParameterServer(s, num_workers, "127.0.0.1", 0, accept_timeout_s=20) for s in range(num_servers)]
    errors: list[BaseException] = []

    def serve(ps):
        try:
            ps.serve()
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=serve, args=(ps,), daemon=True) for ps in servers]
    for t in threads:
        t.start()
    return [Endpoint(f"ps{s}", "127.0.0.1", ps.port) for s, ps in enumerate(servers)], threads, errors


def run_job(name: str, params: dict, num_workers: int, num_servers: int, iterations: int,
            sizes: list[int] | None = None, seed: int = 0, tmp_path: Path | None = None):
    sizes = sizes or SIZES
    needs_servers = registry.SCHEDULERS[name].Params.requires_servers
    servers, sthreads, server_errors = start_servers(num_servers, num_workers) if needs_servers else ([], [], [])
    workers = [Endpoint(f"w{r}", "127.0.0.1", p) for r, p in enumerate(free_ports(num_workers))]
    topology = star_links({e.host: 1000 for e in servers + workers})
    results: dict[int, list[dict[int, np.ndarray]]] = {}

    if name in ONE_WORKER_PER_PROCESS:
        assert tmp_path is not None, f"{name} runs its workers as subprocesses: pass tmp_path"
        specs = [{"name": name, "params": params, "rank": r, "servers": [vars(e) for e in servers],
                  "workers": [vars(e) for e in workers], "topology": topology, "sizes": sizes,
                  "iterations": iterations, "seed": seed, "out": str(tmp_path / f"w{r}.npz")}
                 for r in range(num_workers)]
        errors = POOL.run(specs)
        assert errors == [None] * num_workers, errors
        for r in range(num_workers):
            with np.load(tmp_path / f"w{r}.npz") as z:
                results[r] = [{k: z[f"{it}_{k}"] for k in range(len(sizes))} for it in range(iterations)]
    else:
        worker_errors: list[BaseException] = []

        def work(rank):
            try:
                ctx = RoleContext(rank, num_workers, servers, workers, topology=topology, connect_timeout_s=20)
                results[rank] = drive(name, params, ctx, sizes, iterations, seed)
            except BaseException as e:  # noqa: BLE001
                worker_errors.append(e)

        wthreads = [threading.Thread(target=work, args=(r,), daemon=True) for r in range(num_workers)]
        for t in wthreads:
            t.start()
        for t in wthreads:
            t.join(TIMEOUT_S)
            assert not t.is_alive(), "a worker hung"
        assert not worker_errors, worker_errors
    for t in sthreads:
        t.join(TIMEOUT_S)
        assert not t.is_alive(), "a server hung"
    assert not server_errors, server_errors

    for it in range(iterations):
        for key, numel in enumerate(sizes):
            ref = np.mean([gradient(seed, it, r, key, numel).astype(np.float64) for r in range(num_workers)], axis=0)
            np.testing.assert_allclose(results[0][it][key], ref, rtol=1e-5, atol=1e-6,
                                       err_msg=f"iteration {it}, key {key} ({numel} elements)")
            for r in range(1, num_workers):  # replicas must stay bit-identical
                assert np.array_equal(results[r][it][key], results[0][it][key]), \
                    f"worker {r} differs from worker 0: iteration {it}, key {key}"


class Servers:
    """In-process parameter servers, each serving in its own thread."""

    def __init__(self, n: int, workers: int, mode: Mode | None = None, trace: bool = False):
        self.ps = [ParameterServer(s, workers, "127.0.0.1", 0, accept_timeout_s=20, mode=mode, trace=trace,
                                   log=lambda msg: None) for s in range(n)]
        self.errors: list[BaseException] = []
        self.threads = [threading.Thread(target=self._serve, args=(p,), daemon=True) for p in self.ps]
        for t in self.threads:
            t.start()

    def _serve(self, ps):
        try:
            ps.serve()
        except BaseException as e:  # noqa: BLE001
            self.errors.append(e)

    @property
    def endpoints(self) -> list[Endpoint]:
        return [Endpoint("lo", "127.0.0.1", p.port) for p in self.ps]

    def join(self, timeout: float = 20) -> None:
        for t in self.threads:
            t.join(timeout)
            assert not t.is_alive(), "a server hung"


def run_workers(n: int, body, timeout: float = 30) -> tuple[dict, list]:
    """Run body(rank) in n threads; returns ({rank: result}, [(rank, exception)])."""
    results, errors = {}, []

    def run(rank):
        try:
            results[rank] = body(rank)
        except BaseException as e:  # noqa: BLE001
            errors.append((rank, e))

    threads = [threading.Thread(target=run, args=(r,), daemon=True) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
        assert not t.is_alive(), "a worker hung"
    return results, errors


def create(name: str, rank: int, workers: int, eps: list[Endpoint], params: dict | None = None, trace=False):
    ctx = RoleContext(rank, workers, eps, connect_timeout_s=20, trace=trace)
    return registry.create(name, ctx, params or {})


def endpoints(hosts):
    return [Endpoint(h, "127.0.0.1", p) for h, p in zip(hosts, free_ports(len(hosts)), strict=True)]


def ctx(rank, eps, topology, timeout=20.0, trace=False):
    return RoleContext(rank, len(eps), [], eps, topology=topology, connect_timeout_s=timeout, trace=trace)


def run_threads(fn, n, join_s=60.0):
    """fn(rank) in n threads; returns {rank: result or exception} and the wall time."""
    out: dict[int, object] = {}

    def target(r):
        try:
            out[r] = fn(r)
        except BaseException as e:  # noqa: BLE001
            out[r] = e

    ths = [threading.Thread(target=target, args=(r,), daemon=True) for r in range(n)]
    t0 = time.monotonic()
    for t in ths:
        t.start()
    for t in ths:
        t.join(max(join_s - (time.monotonic() - t0), 0.1))
        assert not t.is_alive(), "a worker hung"
    return out, time.monotonic() - t0


def assert_averages(out, grads, identical=False):
    """out[rank] = (per iteration, per key, what wait() returned, ...): no worker failed, and
    every one got the reference average (identical: the same bytes as worker 0's)."""
    errors = [e for e in out.values() if isinstance(e, BaseException)]
    assert not errors, errors
    n = len(out)
    for it, per_rank in enumerate(grads):
        for k in range(len(per_rank[0])):
            ref = np.mean([per_rank[r][k].astype(np.float64) for r in range(n)], axis=0)
            for r in range(n):
                np.testing.assert_allclose(out[r][0][it][k], ref, rtol=1e-5, atol=1e-6)
                if identical:   # every worker gets the root's bytes: replicas stay bit-identical
                    assert np.array_equal(out[r][0][it][k], out[0][0][it][k])
