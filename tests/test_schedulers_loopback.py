"""Every scheduler against a reference average, over real TCP on loopback (no Mininet)."""
from __future__ import annotations

import threading

import numpy as np
import pytest

from schedulers import registry
from schedulers.base import CommError, Endpoint, RoleContext, TensorSpec
from schedulers.server import ParameterServer

# Tiny, odd-sized and (for partitioned schedulers) multi-partition tensors.
SIZES = [1, 7, 1000, 4099, 30_001]
SMALL_PARTS = {"bytescheduler": {"partition_numel": 1024, "credit_numel": 4096}}


def run_job(name: str, params: dict, num_workers: int, num_servers: int, iterations: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    tensors = [TensorSpec(key=k, name=f"t{k}", numel=n, priority=k) for k, n in enumerate(SIZES)]
    grads = rng.standard_normal((iterations, num_workers, len(SIZES), max(SIZES))).astype(np.float32)

    servers = [ParameterServer(s, num_workers, "127.0.0.1", 0, accept_timeout_s=20) for s in range(num_servers)]
    eps = [Endpoint("lo", "127.0.0.1", ps.port) for ps in servers]
    server_errors: list[BaseException] = []

    def serve(ps):
        try:
            ps.serve()
        except BaseException as e:  # noqa: BLE001
            server_errors.append(e)

    sthreads = [threading.Thread(target=serve, args=(ps,), daemon=True) for ps in servers]
    for t in sthreads:
        t.start()

    results = {}
    worker_errors: list[BaseException] = []

    def work(rank):
        try:
            sched = registry.create(name, RoleContext(rank, num_workers, eps, connect_timeout_s=20), params)
            sched.start(tensors)
            got = []
            for it in range(iterations):
                # Backward produces the last layer first: push in reverse order, as training does.
                for t in reversed(tensors):
                    sched.push(t.key, grads[it, rank, t.key, :t.numel].copy(), it)
                got.append({t.key: sched.wait(t.key, it).copy() for t in tensors})
            sched.close()
            results[rank] = got
        except BaseException as e:  # noqa: BLE001
            worker_errors.append(e)

    wthreads = [threading.Thread(target=work, args=(r,), daemon=True) for r in range(num_workers)]
    for t in wthreads:
        t.start()
    for t in wthreads + sthreads:
        t.join(60)
        assert not t.is_alive(), "a role hung"
    assert not worker_errors, worker_errors
    assert not server_errors, server_errors
    for rank in range(num_workers):
        for it in range(iterations):
            for t in tensors:
                ref = grads[it, :, t.key, :t.numel].astype(np.float64).mean(axis=0)
                np.testing.assert_allclose(results[rank][it][t.key], ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", sorted(registry.SCHEDULERS))
@pytest.mark.parametrize("workers,servers", [(1, 1), (2, 1), (3, 2), (8, 4)])
def test_average_equals_reference(name, workers, servers):
    run_job(name, SMALL_PARTS.get(name, {}), workers, servers, iterations=3)


def test_bytescheduler_paper_defaults_single_partition():
    run_job("bytescheduler", {}, 2, 1, iterations=2)


def test_worker_sees_dead_server_quickly():
    """A server that dies makes the worker fail with an error naming it, not hang."""
    ps = ParameterServer(0, 2, "127.0.0.1", 0, accept_timeout_s=20)
    ep = Endpoint("psh", "127.0.0.1", ps.port)
    threading.Thread(target=lambda: _serve_quietly(ps), daemon=True).start()
    errors = []

    def worker(rank):
        sched = registry.create("fifo", RoleContext(rank, 2, [ep], connect_timeout_s=10), {})
        sched.start([TensorSpec(0, "w", 10, 0)])
        if rank == 1:
            sched.conns[0].close()  # rank 1 dies without BYE (FIN, as at process exit)
            return
        sched.push(0, np.ones(10, np.float32), 0)
        try:
            sched.wait(0, 0)
        except CommError as e:
            errors.append(str(e))

    ts = [threading.Thread(target=worker, args=(r,), daemon=True) for r in (0, 1)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(20)
        assert not t.is_alive()
    assert errors and "server 0" in errors[0], errors


def _serve_quietly(ps):
    try:
        ps.serve()
    except CommError:
        pass
