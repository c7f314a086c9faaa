"""What each zoo model costs a worker on the machine it runs on, 1 torch thread:

    .venv/bin/python bench/bench_workloads.py [--presets small,paper] [--models vgg,resnet] [--profile]

Per model and preset: forward + backward time per iteration (from its profile, measured
by workloads/profile.py; --profile re-measures it first), gradient bytes, number of
tensors and layers, the largest tensor, and the worker's peak memory (VmHWM) in each
compute mode: a real worker and a replay worker, each training on loopback with a
parameter server in its own process (workloads/local.py). Prints a table and stores the
figures in the profile's `bench` section.

Paper presets allocate one model at a time (every role is its own process and runs one
after the other), but a real paper-scale worker needs several GB and about a minute
per iteration on one core.
"""
from __future__ import annotations

import argparse
import datetime as dt
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from workloads import profile_file
from workloads.config import MODELS, default_profile
from workloads.local import run_job

REPO = Path(__file__).resolve().parents[1]


def bench_one(model: str, preset: str, reprofile: bool, tmp: Path) -> dict:
    path = default_profile(model, preset)
    if reprofile or not path.exists():
        subprocess.run([sys.executable, "-m", "workloads.profile", model, preset], cwd=REPO, check=True)
    prof = profile_file.load(path)
    paper = preset == "paper"
    real = run_job({"model": model, "preset": preset, "iterations": 2 if paper else 6, "warmup": 1},
                   tmp / f"{model}-{preset}-real", timeout_s=3600)[0]
    # Replay's memory does not depend on its speed: play paper profiles 20x faster.
    replay = run_job({"model": model, "preset": preset, "compute": "replay", "iterations": 3,
                      "speedup": 20.0 if paper else 1.0}, tmp / f"{model}-{preset}-replay", timeout_s=600)[0]
    real_compute = statistics.median(r["compute_s"] for r in real["iterations"][1:])
    figures = {
        "measured": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "real_peak_rss_bytes": real["summary"]["peak_rss_bytes"],
        "replay_peak_rss_bytes": replay["summary"]["peak_rss_bytes"],
        "real_worker_compute_s": real_compute,
        "replay_max_abs_error": replay["summary"]["aggregate_max_abs_error"],
    }
    profile_file.save(prof.model_copy(update={"bench": figures}), path)
    largest = prof.largest
    return {
        "model": model, "preset": preset,
        "params": prof.grad_bytes // 4,
        "grad_MB": prof.grad_bytes / 1e6,
        "tensors": len(prof.tensors),
        "layers": len(prof.layers),
        "largest": f"{largest.name} {largest.numel * 4 / 1e6:.1f} MB",
        "fwd_s": prof.forward_s,
        "bwd_s": prof.backward_s,
        "iter_s": prof.iteration_s,
        "real_worker_s": real_compute,
        "real_MB": figures["real_peak_rss_bytes"] / 1e6,
        "replay_MB": figures["replay_peak_rss_bytes"] / 1e6,
        "replay/grad": figures["replay_peak_rss_bytes"] / prof.grad_bytes,
    }


def table(rows: list[dict]) -> str:
    cols = list(rows[0])
    fmt = {"grad_MB": "{:.1f}", "fwd_s": "{:.3f}", "bwd_s": "{:.3f}", "iter_s": "{:.3f}", "real_worker_s": "{:.3f}",
           "real_MB": "{:.0f}", "replay_MB": "{:.0f}", "replay/grad": "{:.2f}", "params": "{:,}"}
    cells = [[fmt.get(c, "{}").format(r[c]) for c in cols] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(cols, widths)) + " |",
             "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    lines += ["| " + " | ".join(v.rjust(w) for v, w in zip(row, widths)) + " |" for row in cells]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--presets", default="small,paper")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--profile", action="store_true", help="re-measure the profiles first")
    a = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench_workloads.") as tmp:
        for preset in a.presets.split(","):
            for model in a.models.split(","):
                if preset not in MODELS[model][1]:
                    continue
                rows.append(bench_one(model, preset, a.profile, Path(tmp)))
                print(f"{model}-{preset}: done", file=sys.stderr, flush=True)
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
