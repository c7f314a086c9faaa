"""The training process of one worker, run inside its Mininet host (or on loopback).

    python -m workloads.worker ROLE_SPEC.json

Reads its role spec, trains (`compute: real`: PyTorch; `compute: replay`: a profile played
back, without torch), and writes `<out_dir>/worker<rank>.json`:

    iterations  one record per iteration: rank, iteration, start, end (wall clock; the
                window of contracts/iterations.py, which ends when the iteration's own
                aggregates are applied), compute_s, wait_s (blocked on its own aggregates),
                forward_start, backward_end (its step's compute, wall clock), loss,
                accuracy, samples_per_s
    layers      one record per iteration and layer: rank, iteration, layer (its priority),
                name, wait_s (for the layer's own aggregates), forward_s, backward_s
                (definitions in timing.py)
    summary     parameter checksum, compute mode, speedup, peak memory, ...
    events      the scheduler's trace (if tracing)

and, traced PS runs, `<out_dir>/worker<rank>.tx_frames.npz` (schedulers/transport/txstamps.py).
While it runs it keeps `worker<rank>.progress` (iterations done) and, twice a second,
`worker<rank>.progress.json` (iterations and bytes per connection, contracts/progress.py)
up to date for the orchestrator's watchdog.

`main` reads top to bottom: this is the whole loop; set-up and the summary are the
functions above it.
"""
from __future__ import annotations

import json
import math
import os
import resource
import sys
import time
from pathlib import Path

from contracts import iterations, tx_frames
from contracts.role_spec import RoleSpec
from schedulers import registry
from schedulers.core.base import CommError, Endpoint, RoleContext
from schedulers.core.progress import ProgressReporter
from schedulers.transport.connection import set_dead_peer_s
from schedulers.transport.txstamps import save as save_tx_frames
from workloads import profile_file
from workloads.config import WorkloadConfig


def peak_rss_bytes() -> int:
    """This process's peak resident memory. VmHWM, not getrusage: ru_maxrss survives exec,
    so a worker started by a large parent (pytest with torch) would report the parent's."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def role_context(spec: RoleSpec) -> RoleContext:
    """What the scheduler is told about the job, from the role spec."""
    return RoleContext(
        rank=spec.rank,
        num_workers=len(spec.workers),
        servers=[Endpoint(a.host, a.ip, a.port) for a in spec.servers],
        workers=[Endpoint(a.host, a.ip, a.port) for a in spec.workers],
        topology=spec.topology,
        connect_timeout_s=spec.connect_timeout_s,
        iface=spec.iface,
        trace=spec.trace,
    )


def make_trainer(wl: WorkloadConfig, sched, rank: int, num_workers: int, seed: int):
    """(trainer, data): a model, its data stream and LayerwiseSGD (`compute: real`), or a
    profile played back (`compute: replay`, no data, torch never imported)."""
    if wl.compute == "real":
        import torch  # only real mode loads torch: a replay worker stays small

        from workloads.data import make
        from workloads.models import build, input_spec
        from workloads.trainer import LayerwiseSGD

        torch.set_num_threads(wl.threads)
        model = build(wl.model, wl.preset, seed)
        spec_in = input_spec(wl.model, wl.preset)
        data = make(wl.data, spec_in, seed, rank, wl.batch_size, 256 if wl.preset != "paper" else wl.batch_size)
        return LayerwiseSGD(model, sched, wl.lr, wl.momentum, wl.weight_decay), data
    from workloads.replay import Replay

    return Replay(profile_file.load(wl.profile_path), sched, rank, num_workers, wl.speedup), None


def summarize(wl: WorkloadConfig, rank: int, trainer, sched, data, final_wait_s: float) -> dict:
    """The worker's summary record: parameter checksum, sizes, memory, mode-specific results."""
    summary = {
        "rank": rank,
        "compute_mode": wl.compute,
        "speedup": wl.speedup,
        "checksum": trainer.checksum(),
        "final_wait_s": final_wait_s,
        "num_tensors": len(trainer.tensors),
        "num_params": sum(t.numel for t in trainer.tensors),
        "num_layers": len(trainer.layer_names),
        "peak_rss_bytes": peak_rss_bytes(),
        "scheduler_info": sched.info(),
    }
    if wl.compute == "real":
        import torch

        loss, accuracy = trainer.evaluate(data.eval_batch())
        summary.update(torch_threads=torch.get_num_threads(), eval_loss=loss, eval_accuracy=accuracy)
    else:
        summary.update(profile=str(wl.profile_path), profile_device=trainer.profile.device.name,
                       aggregate_max_abs_error=trainer.max_abs_error, replay_max_late_s=trainer.max_late_s)
    return summary


def iteration_records(wl: WorkloadConfig, rank: int, steps: list[tuple[float, float, float, float]],
                      timings: list, trainer) -> tuple[list[dict], list[dict]]:
    """The iterations and per-layer records, once every iteration's aggregates are applied.

    `steps`: per step (forward start, backward end, loss, accuracy) on the trainer's clock
    (perf_counter), written out as wall-clock instants. An iteration's window, wait and
    compute follow contracts/iterations.py: its wait is the time blocked on its *own*
    aggregates (in the next forward pass, or after the loop), and so is each layer row's."""
    to_wall = time.time() - time.perf_counter()
    agg = trainer.aggregates
    spans = iterations.windows([s[0] for s in steps], agg.applied_at)
    records, layers = [], []
    for it, ((fwd, bwd_end, loss, accuracy), (start, end), tm) in enumerate(zip(steps, spans, timings)):
        wait_s = sum(agg.wait_s[it])
        records.append({
            "rank": rank, "iteration": it, "start": start + to_wall, "end": end + to_wall,
            "compute_s": end - start - wait_s, "wait_s": wait_s,
            "forward_start": fwd + to_wall, "backward_end": bwd_end + to_wall,
            "loss": loss, "accuracy": accuracy, "samples_per_s": wl.batch_size / (end - start),
        })
        tm.wait_s = list(agg.wait_s[it])
        layers += tm.rows(rank, it, trainer.layer_names)
    return records, layers


def load_role_plugins(spec: RoleSpec, spec_path: str) -> None:
    """The run's plugins (files copied into the run directory, or modules) registered before the
    scheduler is created, so a plugin scheduler runs in the roles as a built-in does. A plugin
    that fails here passed validation on the orchestrator's side: a CommError, one line."""
    if not spec.plugins:
        return
    from schedulers.registry.plugins import PluginError, load_plugins

    try:
        load_plugins(spec.plugins, Path(spec_path).resolve().parent)
    except PluginError as e:
        raise CommError(f"{spec.name}: loading its plugins: {e}") from None


def main(spec_path: str) -> int:
    spec = RoleSpec.model_validate_json(Path(spec_path).read_text())
    rank, wl, out_dir = spec.rank, WorkloadConfig.model_validate(spec.workload), Path(spec.out_dir)
    load_role_plugins(spec, spec_path)
    set_dead_peer_s(spec.dead_peer_s)
    reporter = ProgressReporter(out_dir, spec.name).start()  # the orchestrator's watchdog reads it
    sched = registry.create(spec.scheduler.name, role_context(spec), spec.scheduler.params)
    trainer, data = make_trainer(wl, sched, rank, len(spec.workers), spec.seed)

    steps, timings = [], []
    progress = out_dir / f"worker{rank}.progress"
    for it in range(wl.iterations):
        batch = data.batch() if data else None
        start = time.perf_counter()
        loss, accuracy = trainer.step(batch)
        end = time.perf_counter()
        steps.append((start, end, loss, accuracy))
        timings.append(trainer.timing)
        progress.write_text(str(it + 1))
        reporter.iteration(it + 1, end - start)
    reporter.phase("finishing")
    t0 = time.perf_counter()
    trainer.finish()
    final_wait_s = time.perf_counter() - t0
    sched.close()
    records, layers = iteration_records(wl, rank, steps, timings, trainer)

    summary = summarize(wl, rank, trainer, sched, data, final_wait_s)
    tables = sched.tables()
    if "tx_frames" in tables:   # before the JSON, which marks the records complete
        save_tx_frames(out_dir / f"worker{rank}{tx_frames.SUFFIX}", tables["tx_frames"])
    tmp = out_dir / f".worker{rank}.json.tmp"
    tmp.write_text(json.dumps({"summary": summary, "iterations": records, "layers": layers, "events": sched.events}))
    os.replace(tmp, out_dir / f"worker{rank}.json")
    reporter.stop()
    last = records[-1]["loss"]
    loss_text = "" if math.isnan(last) else f"final loss {last:.3f}, "
    print(f"worker {rank}: {wl.iterations} iterations ({wl.compute}), {loss_text}checksum {summary['checksum']}",
          flush=True)
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: python -m workloads.worker ROLE_SPEC.json", file=sys.stderr)
        sys.exit(2)
    try:
        sys.exit(main(sys.argv[1]))
    except CommError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        sys.exit(1)
