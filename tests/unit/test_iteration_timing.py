"""An iteration's time includes its own communication (contracts/iterations.py), in the real
trainer and in replay alike, the last iteration included.

A one-worker scheduler whose aggregate of a gradient arrives DELAY_S after its push stands in
for the network, so every iteration must take at least DELAY_S: before the rule was fixed, a
run's last iteration ended with its backward pass and came out shorter than its communication.
"""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch
from torch import nn

from contracts.iterations import windows
from schedulers.core.base import RoleContext, Scheduler, SchedulerParams
from tests.factories import synthetic_profile
from workloads.config import WorkloadConfig
from workloads.replay import Replay
from workloads.trainer import LayerwiseSGD
from workloads.worker import iteration_records

DELAY_S = 0.06


class Delayed(Scheduler):
    """One worker; the aggregate of each push is ready DELAY_S after it (a slow network)."""

    name = "delayed"

    def __init__(self):
        super().__init__(RoleContext(rank=0, num_workers=1, servers=[]), SchedulerParams())
        self.ready: dict[tuple[int, int], tuple[float, np.ndarray]] = {}
        self.lock = threading.Lock()

    def start(self, tensors) -> None:
        pass

    def push(self, key, grad, it) -> None:
        with self.lock:
            self.ready[(key, it)] = (time.perf_counter() + DELAY_S, np.array(grad, copy=True))

    def wait(self, key, it):
        with self.lock:
            at, grad = self.ready.pop((key, it))
        delay = at - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        return grad

    def close(self) -> None:
        pass


def train(trainer, iterations: int, batch=None):
    steps, timings = [], []
    for _ in range(iterations):
        start = time.perf_counter()
        loss, acc = trainer.step(batch() if batch else None)
        steps.append((start, time.perf_counter(), loss, acc))
        timings.append(trainer.timing)
    t0 = time.perf_counter()
    trainer.finish()
    final_wait = time.perf_counter() - t0
    wl = WorkloadConfig(model="cnn", preset="tiny", iterations=iterations, warmup=0)
    return iteration_records(wl, 0, steps, timings, trainer), final_wait


def check(records, layers, final_wait):
    assert [r["iteration"] for r in records] == list(range(len(records)))
    for r in records:
        # every iteration holds its own communication, the last one too
        assert r["end"] - r["start"] >= DELAY_S * 0.95, r
        # its window opens during its forward pass (when the previous iteration's last aggregate
        # is applied; iteration 0: as its forward starts) and closes after its backward pass
        assert r["forward_start"] <= r["start"] + 1e-6 < r["backward_end"] <= r["end"] + 1e-6
        assert r["compute_s"] + r["wait_s"] == pytest.approx(r["end"] - r["start"], abs=1e-6)  # wall-clock floats
        own = sum(row["wait_s"] for row in layers if row["iteration"] == r["iteration"])
        assert own == pytest.approx(r["wait_s"])
    for a, b in zip(records, records[1:]):
        assert b["start"] == a["end"]  # the windows tile the run
    # the last iteration's wait is the one after the loop (finish() also applies and checks, so it
    # takes a little longer than the waits inside it)
    assert DELAY_S * 0.5 <= records[-1]["wait_s"] <= final_wait + 1e-6


@pytest.mark.parametrize("iterations", [1, 2, 4])
def test_replay_iterations_end_when_their_aggregates_are_applied(iterations):
    prof = synthetic_profile([(0.004, [(1000, 0.002)]), (0.004, [(5000, 0.002), (300, 0.001)])])
    trainer = Replay(prof, Delayed(), rank=0, num_workers=1)
    (records, layers), final_wait = train(trainer, iterations)
    check(records, layers, final_wait)
    assert trainer.max_abs_error == 0.0


@pytest.mark.parametrize("iterations", [1, 3])
def test_real_trainer_iterations_end_when_their_aggregates_are_applied(iterations):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    trainer = LayerwiseSGD(model, Delayed(), lr=0.1, momentum=0.0, weight_decay=0.0)
    x, y = torch.randn(4, 8), torch.tensor([0, 1, 2, 3])
    (records, layers), final_wait = train(trainer, iterations, batch=lambda: (x, y))
    check(records, layers, final_wait)


def test_windows_sum_to_the_run_from_the_first_forward_to_the_last_update():
    starts = [0.0, 1.0, 2.5]
    applied = [1.2, 2.7, 3.1]
    spans = windows(starts, applied)
    assert sum(b - a for a, b in spans) == pytest.approx(applied[-1] - starts[0])
