"""Replay mode: a profile's compute played back, with real gradient buffers on the wire.

Each step does what the real trainer's hooks do, with the profile's times (divided by
`speedup`, to emulate a faster accelerator) standing in for PyTorch:
- forward: for each layer in forward order, wait for its averaged gradients of the
  previous iteration, then let its forward time pass;
- backward: push each tensor's gradient at its profiled time, in the profiled backward
  order.
Times are kept as deadlines from the start of the step, so sleep overshoot does not add
up, and a push that comes late is caught up on by the next ones. Filling a buffer costs a
memory copy (about 0.1 s for VGG-16's 411 MB fc6 weight on the reference machine), which is late wherever that
is more than the profiled gap divided by `speedup`: `max_late_s` reports the worst.

Memory: one buffer per tensor, reused every iteration (a scheduler is done with a pushed
array once it has returned that iteration's result), plus the scheduler's own result
buffers: about twice the gradient bytes. No model is built and torch is never imported,
so many paper-scale workers fit on one machine.

Gradient content is deterministic: rank r pushes (r + 1) * b for tensor `key` in
iteration `it`, with b[i] = (i + 7 key + 13 it) mod 61 + 1. Every partial sum over ranks is
an integer below 2**24, exact in float32 in any order, so the average every worker
receives is known exactly: `finish()` checks the last iteration's against it
(`aggregate_max_abs_error`, 0 for a correct scheduler that divides the sum by N).
"""
from __future__ import annotations

import hashlib
import math
import time

import numpy as np

from schedulers.core.base import Scheduler, TensorSpec
from workloads.profile_file import Profile
from workloads.timing import Aggregates, StepResult, Timing

PERIOD = 61              # prime, so a partition of any usual size misplaced by the scheduler shows
TILE = PERIOD * 4096     # the pattern is written one tile (1 MB) at a time
BLOCKED_S = 2e-4         # a wait longer than a sleep's overshoot (~0.1 ms) really blocked


def sleep_until(deadline: float) -> None:
    delay = deadline - time.perf_counter()
    if delay > 0:
        time.sleep(delay)


class Replay:
    def __init__(self, profile: Profile, scheduler: Scheduler, rank: int, num_workers: int,
                 speedup: float = 1.0):
        self.profile = profile
        self.sched = scheduler
        self.scale = 1.0 / speedup
        self.tensors = [TensorSpec(key=t.key, name=t.name, numel=t.numel, priority=t.layer)
                        for t in profile.by_key]
        self.layer_names = [layer.name for layer in profile.layers]
        # Touched once here, so first-touch page faults do not make iteration 0 late.
        self.grads = [np.ones(t.numel, dtype=np.float32) for t in self.tensors]
        base = (np.arange(TILE + PERIOD) % PERIOD + 1).astype(np.float32)
        self.tile = base * np.float32(rank + 1)
        n = num_workers
        self.expected_tile = base * np.float32(n * (n + 1) // 2) / np.float32(n)
        self.it = 0
        self.wait_s = 0.0
        self.max_late_s = 0.0
        self.timing = Timing()
        self.aggregates = Aggregates(num_layers=len(self.layer_names))
        self._checksum = ""
        self.max_abs_error = math.nan
        self.sched.start(self.tensors)

    def _shift(self, key: int, it: int) -> int:
        return (7 * key + 13 * it) % PERIOD

    def _fill(self, key: int) -> None:
        buf, src = self.grads[key], self.tile[self._shift(key, self.it):][:TILE]
        full = buf.size // TILE
        if full:
            buf[:full * TILE].reshape(full, TILE)[:] = src
        buf[full * TILE:] = src[:buf.size - full * TILE]

    def step(self, batch=None) -> StepResult:
        p, scale, n = self.profile, self.scale, len(self.layer_names)
        tm = Timing(wait_s=[0.0] * n, forward_s=[0.0] * n, backward_s=[0.0] * n)
        t_start = time.perf_counter()
        deadline = t_start + p.forward_lead_s * scale
        sleep_until(deadline)
        entered: list[float] = []
        for i, layer in enumerate(p.layers):
            entered.append(time.perf_counter())
            if self.it > 0:
                for key in layer.keys:
                    t0 = time.perf_counter()
                    self.sched.wait(key, self.it - 1)
                    now = time.perf_counter()
                    tm.wait_s[i] += now - t0
                    self.aggregates.applied(self.it - 1, i, now - t0, now)
            if tm.wait_s[i] > BLOCKED_S:  # the gradient came late: the layer starts when it came
                deadline = max(deadline, time.perf_counter())
            deadline += layer.forward_s * scale
            sleep_until(deadline)
        t_backward = last = time.perf_counter()
        for i, t in enumerate(entered):
            tm.forward_s[i] = (entered[i + 1] if i + 1 < n else t_backward) - t - tm.wait_s[i]
        tm.lead_s = entered[0] - t_start if entered else 0.0

        for t in p.tensors:  # backward order
            deadline += t.backward_s * scale
            sleep_until(deadline)
            self._fill(t.key)
            now = time.perf_counter()
            self.max_late_s = max(self.max_late_s, now - deadline)
            tm.ready.append((t.key, now - last))
            tm.backward_s[t.layer] += now - last
            last = now
            self.sched.push(t.key, self.grads[t.key], self.it)
        sleep_until(max(deadline, last) + p.backward_tail_s * scale)
        tm.tail_s = time.perf_counter() - last

        self.wait_s += sum(tm.wait_s)
        self.timing = tm
        self.it += 1
        return StepResult(math.nan, math.nan)

    def finish(self) -> None:
        """Wait for the last iteration's averages (the last one's arrival ends the iteration),
        then hash them and check them exactly."""
        if not self.it:
            return
        got = {}
        for t in self.tensors:
            t0 = time.perf_counter()
            got[t.key] = self.sched.wait(t.key, self.it - 1)
            now = time.perf_counter()
            self.aggregates.applied(self.it - 1, t.priority, now - t0, now)
        h, err = hashlib.sha256(), 0.0
        for t in self.tensors:
            h.update(memoryview(got[t.key]).cast("B"))
            err = max(err, self._error(t.key, self.it - 1, got[t.key]))
        self._checksum, self.max_abs_error = h.hexdigest()[:16], err

    def _error(self, key: int, it: int, got: np.ndarray) -> float:
        src = self.expected_tile[self._shift(key, it):][:TILE]
        full, err = got.size // TILE, 0.0
        for r in range(0, full, 16):  # 16 tiles at a time: a small temporary
            block = got[r * TILE:min(r + 16, full) * TILE].reshape(-1, TILE)
            err = max(err, float(np.abs(block - src).max()))
        rest = got[full * TILE:]
        if rest.size:
            err = max(err, float(np.abs(rest - src[:rest.size]).max()))
        return err

    def checksum(self) -> str:
        return self._checksum
