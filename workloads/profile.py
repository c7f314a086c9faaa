"""Profiler: a model's per-layer forward and backward times, for replay mode.

    python -m workloads.profile MODEL PRESET [--batch-size 32] [--iterations N] [--threads 1]
    ./inv profile --model vgg --preset paper

It runs the real trainer (`LayerwiseSGD`) in one process with a one-worker scheduler that
hands each gradient straight back, so the layers, keys, priorities and timing definitions
(timing.py) are exactly those of a real run; only the network is missing. Times are
medians over the measured iterations (after `warmup`, which also excludes the first
iteration: it has no updates). With 1 thread they are the thread's CPU time, so a profile
taken on a shared, busy machine still says how long the step takes on an idle one.
Writes profiles/<model>-<preset>.json (profile_file.py).
"""
from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

from contracts.iterations import windows as iteration_windows
from schedulers.core.base import RoleContext, Scheduler, SchedulerParams
from workloads import profile_file
from workloads.config import MODELS, WorkloadConfig, default_profile
from workloads.data import make
from workloads.models import build, input_spec
from workloads.trainer import LayerwiseSGD


class Alone(Scheduler):
    """One worker and no network: the average of a single gradient is that gradient."""

    name = "alone"

    def __init__(self):
        super().__init__(RoleContext(rank=0, num_workers=1, servers=[]), SchedulerParams())
        self.results = {}

    def start(self, tensors) -> None:
        pass

    def push(self, key, grad, it) -> None:
        self.results[key] = grad

    def wait(self, key, it):
        return self.results[key]

    def close(self) -> None:
        pass


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def default_iterations(preset: str) -> tuple[int, int]:
    """(warmup, measured): a paper-scale step takes seconds to a minute on one core."""
    return (1, 3) if preset == "paper" else (3, 20)


def run(model: str, preset: str, batch_size: int = 32, iterations: int | None = None,
        warmup: int | None = None, threads: int = 1, seed: int = 0, log=print) -> profile_file.Profile:
    w, m = default_iterations(preset)
    warmup = max(1, w if warmup is None else warmup)
    iterations = m if iterations is None else iterations
    torch.set_num_threads(threads)
    net = build(model, preset, seed)
    data = make("synthetic", input_spec(model, preset), seed, 0, batch_size)
    hp = WorkloadConfig()
    # One thread does all the work of a 1-thread worker (autograd runs CPU backward on the
    # calling thread), so its CPU time is the step's time on an idle machine, whatever
    # else runs here. With more threads only wall time sees all of it.
    clock = time.thread_time if threads == 1 else time.perf_counter
    trainer = LayerwiseSGD(net, Alone(), hp.lr, hp.momentum, hp.weight_decay, clock=clock)
    timings, forward_starts = [], []
    for i in range(warmup + iterations):
        batch = data.batch()
        forward_starts.append(clock())
        trainer.step(batch)
        log(f"  {model}-{preset} iteration {i}: {clock() - forward_starts[-1]:.3f} s forward and backward"
            f"{' (warm-up)' if i < warmup else ''}")
        if i >= warmup:
            timings.append(trainer.timing)
    trainer.finish()
    # the iterations' times as a run measures them (contracts/iterations.py): to the last update
    totals = [end - start for start, end in iteration_windows(forward_starts, trainer.aggregates.applied_at)]
    totals = totals[warmup:]

    def med(values) -> float:
        return float(statistics.median(values))

    gaps = {key: med([dict(t.ready)[key] for t in timings]) for key, _ in timings[0].ready}
    specs = trainer.tensors
    params = {trainer.names[id(p)]: p for p in trainer.params}
    tensors = [profile_file.Tensor(key=key, name=specs[key].name, shape=list(params[specs[key].name].shape),
                                   numel=specs[key].numel, layer=specs[key].priority, backward_s=gaps[key])
               for key, _ in timings[0].ready]
    layers = []
    for i, name in enumerate(trainer.layer_names):
        keys = [s.key for s in specs if s.priority == i]
        layers.append(profile_file.Layer(name=name, keys=keys, forward_s=med([t.forward_s[i] for t in timings]),
                                         backward_s=sum(gaps[k] for k in keys)))
    return profile_file.Profile(
        model=model, preset=preset, batch_size=batch_size,
        device=profile_file.Device(kind="cpu", name=cpu_name(), threads=torch.get_num_threads(),
                                   torch=torch.__version__),
        clock="thread_cpu" if clock is time.thread_time else "wall",
        warmup=warmup, iterations=iterations,
        created=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        iteration_s=med(totals),
        forward_lead_s=med([t.lead_s for t in timings]),
        backward_tail_s=med([t.tail_s for t in timings]),
        layers=layers, tensors=tensors,
        grad_bytes=4 * sum(s.numel for s in specs),
        load_avg=os.getloadavg()[0],
    )


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m workloads.profile", description=__doc__.splitlines()[0])
    ap.add_argument("model", choices=list(MODELS))
    ap.add_argument("preset", choices=["tiny", "small", "paper"])
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--iterations", type=int, default=None, help="measured iterations (default: 3 paper, 20 else)")
    ap.add_argument("--warmup", type=int, default=None)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=None, help="default profiles/<model>-<preset>.json")
    a = ap.parse_args(argv)
    if a.preset not in MODELS[a.model][1]:
        ap.error(f"model {a.model!r} has no preset {a.preset!r} (it has {', '.join(MODELS[a.model][1])})")
    if a.batch_size <= 0 or a.threads <= 0 or (a.iterations is not None and a.iterations <= 0):
        ap.error("--batch-size, --threads and --iterations must be > 0")
    out = a.out or default_profile(a.model, a.preset)
    prof = run(a.model, a.preset, a.batch_size, a.iterations, a.warmup, a.threads,
               log=lambda s: print(s, file=sys.stderr, flush=True))
    profile_file.save(prof, out)
    print(f"{out}: {len(prof.layers)} layers, {len(prof.tensors)} tensors, {prof.grad_bytes / 1e6:.1f} MB of "
          f"gradients, {prof.iteration_s:.3f} s per iteration ({prof.forward_s:.3f} forward, "
          f"{prof.backward_s:.3f} backward) on {prof.device.name}, {prof.device.threads} thread(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
