"""Every scheduler against a reference average, over real TCP on loopback (no Mininet), in jobs that
tests/loopback_jobs.py's `run_job` starts: parameter servers for the PS family, none for the
collective family; workers as threads, or as subprocesses for schedulers built on torch.distributed.
"""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from schedulers import registry
from schedulers.core.base import CommError, Endpoint, RoleContext, TensorSpec
from schedulers.core.failure import Failure
from schedulers.ps.server import ParameterServer
from tests.loopback_jobs import SMALL_PARTS, run_job, tensor_set

CASES = [(1, 1), (2, 1), (3, 2), (8, 4)]  # (workers, servers); collectives ignore servers


def cases():
    out = []
    for name in sorted(registry.SCHEDULERS):
        collective = not registry.SCHEDULERS[name].Params.requires_servers
        for workers, servers in CASES:
            slow = name in ("gloo", "bytescheduler") or (name == "forest" and workers > 1) or workers == 8
            out.append(pytest.param(name, workers, 0 if collective else servers,
                                    id=f"{name}-{workers}w" + ("" if collective else f"-{servers}s"),
                                    marks=pytest.mark.slow if slow else ()))
    return out


@pytest.mark.parametrize("name,workers,servers", cases())
def test_average_equals_reference(name, workers, servers, tmp_path):
    seed = 7 * workers + servers
    sizes = tensor_set(seed, big=200_000 if workers <= 3 else 0)
    run_job(name, SMALL_PARTS.get(name, {}), workers, servers, iterations=3, sizes=sizes, seed=seed,
            tmp_path=tmp_path)


@pytest.mark.parametrize("name", sorted(registry.SCHEDULERS))
@pytest.mark.slow
def test_paper_defaults_huge_tensor(name, tmp_path):
    """Default parameters, with a tensor larger than one bucket or partition (28 MB)."""
    run_job(name, {}, 2, 1, iterations=2, sizes=[3, 7_000_003, 999_999, 1], seed=1, tmp_path=tmp_path)


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
        try:  # push itself may already see the failure
            sched.push(0, np.ones(10, np.float32), 0)
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


def test_failure_keeps_the_first_reason_until_closing():
    """The helper every scheduler's threads report to: the first reason wins and is raised
    with the role's name; once the role closes on purpose, nothing more is kept."""
    f = Failure("worker 3")
    f.check()
    assert f.fail("worker 1 (h1) closed the connection") and not f.fail("fallout")
    with pytest.raises(CommError, match=r"^worker 3: worker 1 \(h1\) closed the connection$"):
        f.check()
    closing = Failure()
    closing.closing = True
    assert not closing.fail("a peer hung up") and not closing.failed
    assert str(closing.error("left early")) == "left early"


def test_failure_is_raised_once_the_peers_are_told():
    """A process often exits on the error: the ABORTs that name the culprit must be out by
    then. So the error waits for the first failure's `tell` (here slowed, as a starved CPU
    slows it), but not in the thread that tells, and not without bound."""
    f = Failure("worker 0")
    told = threading.Event()
    raised_after_told = []

    def tell(reason):
        assert str(f.error()) == f"worker 0: {reason}"   # the teller itself does not wait for itself
        time.sleep(0.3)
        told.set()

    def waiter():
        with f.cv:
            f.cv.wait_for(lambda: f.failed, 5)
            try:
                f.check()
            except CommError:
                raised_after_told.append(told.is_set())

    th = threading.Thread(target=waiter)
    th.start()
    time.sleep(0.05)
    assert f.fail("worker 2 (h2) closed the connection", tell=tell)
    th.join(5)
    assert raised_after_told == [True]
    stuck = Failure()
    threading.Thread(target=stuck.fail, args=("x", lambda r: time.sleep(1)), daemon=True).start()
    time.sleep(0.05)
    t0 = time.monotonic()
    stuck.told(timeout=0.2)
    assert stuck.failed and 0.15 < time.monotonic() - t0 < 1.0


def _serve_quietly(ps):
    try:
        ps.serve()
    except CommError:
        pass
