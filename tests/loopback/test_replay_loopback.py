"""Replay over real schedulers on loopback: exact aggregation with real buffers through a
parameter server on 127.0.0.1, the profile's timeline kept per layer, and bounded memory
without torch, in jobs run by workloads.local.run_job. The rest of replay (config errors,
the profile loader, committed profiles) is in tests/unit/test_replay.py."""
from __future__ import annotations

import statistics
import threading

import numpy as np
import pytest

from schedulers import registry
from schedulers.core.base import Endpoint, RoleContext
from schedulers.ps.server import ParameterServer
from tests.factories import synthetic_profile
from workloads import profile_file
from workloads.local import run_job
from workloads.replay import TILE, Replay


class Recorder:
    """A scheduler wrapper that remembers the order of pushes and waits."""

    def __init__(self, inner):
        self.inner, self.pushes, self.waits = inner, [], []

    def start(self, tensors):
        self.inner.start(tensors)

    def push(self, key, grad, it):
        self.pushes.append((it, key))
        self.inner.push(key, grad, it)

    def wait(self, key, it):
        self.waits.append((it, key))
        return self.inner.wait(key, it)

    def close(self):
        self.inner.close()


ODD = synthetic_profile([(0.0, [(7, 0.0), (1, 0.0)]), (0.0, [(4099, 0.0)]), (0.0, [(30_001, 0.0), (1000, 0.0)]),
                         (0.0, [(TILE * 2 + 5, 0.0)])])


@pytest.mark.parametrize("scheduler,params", [("fifo", {}), pytest.param("bytescheduler", {"partition_numel": 1000,
                                                                                             "credit_numel": 3000},
                                                                           marks=pytest.mark.slow)])
def test_replay_aggregates_exactly_in_order(scheduler, params):
    workers, iters = 3, 3
    ps = ParameterServer(0, workers, "127.0.0.1", 0, accept_timeout_s=20)
    threading.Thread(target=ps.serve, daemon=True).start()
    replays, errors = {}, []

    def work(rank):
        try:
            ctx = RoleContext(rank, workers, [Endpoint("lo", "127.0.0.1", ps.port)], connect_timeout_s=20)
            rec = Recorder(registry.create(scheduler, ctx, params))
            rp = Replay(ODD, rec, rank, workers)
            for _ in range(iters):
                rp.step()
            rp.finish()
            replays[rank] = (rp, rec)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=work, args=(r,)) for r in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert {rp.checksum() for rp, _ in replays.values()} != {""}
    assert len({rp.checksum() for rp, _ in replays.values()}) == 1
    for rp, rec in replays.values():
        assert rp.max_abs_error == 0.0
        # pushes in the profile's backward order, waits per layer in forward order
        backward = [t.key for t in ODD.tensors]
        assert rec.pushes == [(it, k) for it in range(iters) for k in backward]
        forward = [k for layer in ODD.layers for k in layer.keys]
        assert rec.waits[:len(forward) * (iters - 1)] == [(it, k) for it in range(iters - 1) for k in forward]
    # Independently of replay.py: the average of (r + 1) * b over ranks, in float32.
    rp, rec = replays[0]
    for t in ODD.tensors:
        got = rec.inner.wait(t.key, iters - 1)
        b = (np.arange(t.numel) + 7 * t.key + 13 * (iters - 1)) % 61 + 1
        want = (b * sum(r + 1 for r in range(workers))).astype(np.float32) / np.float32(workers)
        assert np.array_equal(got, want), t.name
    for _, rec in replays.values():
        rec.close()


# A profile whose every step is long against a sleep's overshoot (~0.1 ms) and scheduling
# noise on a busy 2-core machine, with tensors small enough that loopback is never the
# bottleneck.
TIMED = synthetic_profile(
    [(0.030, [(2000, 0.020)]), (0.045, [(50_000, 0.030), (3000, 0.015)]),
     (0.025, [(20_000, 0.025)]), (0.040, [(8000, 0.035), (100, 0.020)])], lead=0.005, tail=0.010)


def run_replay(tmp_path, profile, workers=2, iterations=8, **workload):
    path = tmp_path / "profile.json"
    profile_file.save(profile, path)
    wl = {"model": profile.model, "preset": profile.preset, "compute": "replay", "profile": str(path),
          "batch_size": profile.batch_size, "iterations": iterations, **workload}
    return run_job(wl, tmp_path / "job", workers=workers, timeout_s=120)


@pytest.mark.parametrize("speedup", [1.0, 2.0])
@pytest.mark.slow
def test_replay_keeps_the_profiles_per_layer_times(tmp_path, speedup):
    recs = run_replay(tmp_path, TIMED, speedup=speedup)
    scale = 1 / speedup
    for rec in recs:
        s = rec["summary"]
        assert s["compute_mode"] == "replay" and s["speedup"] == speedup
        assert s["aggregate_max_abs_error"] == 0.0
        rows = [r for r in rec["layers"] if r["iteration"] >= 2]
        for i, layer in enumerate(TIMED.layers):
            mine = [r for r in rows if r["layer"] == i]
            fwd = statistics.median(r["forward_s"] for r in mine)
            bwd = statistics.median(r["backward_s"] for r in mine)
            assert fwd == pytest.approx(layer.forward_s * scale, rel=0.10), f"forward of {layer.name}"
            assert bwd == pytest.approx(layer.backward_s * scale, rel=0.10), f"backward of {layer.name}"
            assert statistics.median(r["wait_s"] for r in mine) < 0.1 * layer.forward_s * scale
        its = [r for r in rec["iterations"] if r["iteration"] >= 2]
        total = (TIMED.forward_s + TIMED.backward_s) * scale
        assert statistics.median(r["end"] - r["start"] for r in its) == pytest.approx(total, rel=0.10)
        assert statistics.median(r["compute_s"] for r in its) == pytest.approx(total, rel=0.10)
    assert recs[0]["summary"]["checksum"] == recs[1]["summary"]["checksum"]


@pytest.mark.slow
def test_replay_worker_holds_about_twice_its_gradients_and_no_torch(tmp_path):
    big = synthetic_profile([(0.0, [(4_000_000, 0.0)]), (0.0, [(12_000_000, 0.0), (16_000_000, 0.0)])])
    small = synthetic_profile([(0.0, [(1000, 0.0)])])
    base = run_replay(tmp_path / "small", small, workers=1, iterations=2, warmup=0)[0]["summary"]["peak_rss_bytes"]
    peak = run_replay(tmp_path / "big", big, workers=1, iterations=2, warmup=0)[0]["summary"]["peak_rss_bytes"]
    assert base < 150e6, "a replay worker is a small process: no torch, no model"
    assert 1.8 * big.grad_bytes < peak - base < 2.3 * big.grad_bytes, (peak - base) / big.grad_bytes


