"""The training process of one worker, run inside its Mininet host (or on loopback).

    python -m workloads.worker ROLE_SPEC.json

Reads its role spec, trains, and writes `<out_dir>/worker<rank>.json`: one record per
iteration plus a summary (parameter checksum, compute mode). Read top to bottom: this is
the whole loop.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from pathlib import Path

import torch

from schedulers import registry
from schedulers.base import CommError, Endpoint, RoleContext
from workloads.config import WorkloadConfig
from workloads.data import SyntheticImages
from workloads.models import build
from workloads.trainer import LayerwiseSGD


def checksum(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().numpy().tobytes())
    return h.hexdigest()[:16]


def main(spec_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    rank, seed = spec["rank"], spec["seed"]
    wl = WorkloadConfig.model_validate(spec["workload"])
    out_dir = Path(spec["out_dir"])
    torch.set_num_threads(wl.threads)

    model = build(wl.model, wl.preset, seed)
    data = SyntheticImages(seed, rank, wl.batch_size)
    ctx = RoleContext(
        rank=rank,
        num_workers=len(spec["workers"]),
        servers=[Endpoint(**s) for s in spec["servers"]],
        workers=[Endpoint(**w) for w in spec["workers"]],
        topology=spec.get("topology"),
        connect_timeout_s=spec.get("connect_timeout_s", 60),
        iface=spec.get("iface", "lo"),
        trace=spec.get("trace", False),
    )
    sched = registry.create(spec["scheduler"]["name"], ctx, spec["scheduler"]["params"])
    trainer = LayerwiseSGD(model, sched, wl.lr, wl.momentum, wl.weight_decay)

    records = []
    progress = out_dir / f"worker{rank}.progress"
    for it in range(wl.iterations):
        x, y = data.batch()
        start, wait_before = time.time(), trainer.wait_s
        loss = trainer.step(x, y)
        end = time.time()
        wait_s = trainer.wait_s - wait_before
        records.append({
            "rank": rank, "iteration": it, "start": start, "end": end,
            "compute_s": end - start - wait_s, "wait_s": wait_s,
            "loss": loss, "samples_per_s": wl.batch_size / (end - start),
        })
        progress.write_text(str(it + 1))
    t0 = time.perf_counter()
    trainer.finish()
    final_wait_s = time.perf_counter() - t0
    sched.close()

    summary = {
        "rank": rank,
        "compute_mode": wl.compute,
        "checksum": checksum(model),
        "final_wait_s": final_wait_s,
        "num_tensors": len(trainer.tensors),
        "num_params": sum(t.numel for t in trainer.tensors),
        "torch_threads": torch.get_num_threads(),
    }
    tmp = out_dir / f".worker{rank}.json.tmp"
    tmp.write_text(json.dumps({"summary": summary, "iterations": records, "events": sched.events}))
    os.replace(tmp, out_dir / f"worker{rank}.json")
    print(f"worker {rank}: {wl.iterations} iterations, final loss {records[-1]['loss']:.3f}, "
          f"checksum {summary['checksum']}", flush=True)
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
