"""Our `ring` against PyTorch's gloo (`gloo` scheduler) on the same workers and tensors.

Each worker runs both schedulers side by side (connected once) and alternates between
them round by round, so both see the same machine load and links. One iteration = push
every tensor in backward order, then wait for every average: pure communication, no
compute. Prints the median iteration time of each and the ratio ring/gloo (goal: <= 1).

    # all workers on loopback, spawned here:
    .venv/bin/python bench/bench_ring_vs_gloo.py --workers 4 --sizes 25000000
    .venv/bin/python bench/bench_ring_vs_gloo.py --workers 3 --model vgg16:small
    # one worker of a job started elsewhere, e.g. in every Mininet host (a runner role
    # spec works: it has rank, workers [{host, ip, port}] and iface):
    python bench/bench_ring_vs_gloo.py --spec ROLE.json --sizes 25000000 [--out result.json]

ring uses workers[i].port; gloo uses the same hosts at port + --gloo-port-offset (its
store on worker 0, its liveness beacon on the others). Worker 0 prints the summary; with
--out every worker writes its times as JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from schedulers import registry
from schedulers.core.base import Endpoint, RoleContext, TensorSpec

REPO = Path(__file__).resolve().parents[1]


def tensor_sizes(args) -> list[int]:
    if args.model:
        from workloads.models import build

        model, _, preset = args.model.partition(":")
        return [p.numel() for p in build(model, preset or "small", 0).parameters()]
    return [int(float(s)) for s in args.sizes.split(",")]


def run_worker(spec: dict, args) -> dict:
    import torch

    torch.set_num_threads(1)
    sizes = tensor_sizes(args)
    tensors = [TensorSpec(key=k, name=f"t{k}", numel=n, priority=k) for k, n in enumerate(sizes)]
    workers = [Endpoint(**w) for w in spec["workers"]]
    gloo_workers = [Endpoint(w.host, w.ip, w.port + args.gloo_port_offset) for w in workers]
    rank, iface = spec["rank"], spec.get("iface", "lo")
    timeout = spec.get("connect_timeout_s", 60)
    params = json.loads(args.params)
    scheds = {
        "ring": registry.create("ring", RoleContext(rank, len(workers), [], workers, connect_timeout_s=timeout,
                                                    iface=iface), params.get("ring", {})),
        "gloo": registry.create("gloo", RoleContext(rank, len(workers), [], gloo_workers, connect_timeout_s=timeout,
                                                    iface=iface), params.get("gloo", {})),
    }
    for s in scheds.values():
        s.start(tensors)
    rng = np.random.default_rng(rank)
    grads = [rng.standard_normal(n, dtype=np.float32) for n in sizes]

    def iteration(s, it: int) -> tuple[float, float]:
        t0, c0 = time.perf_counter(), time.process_time()
        for t in reversed(tensors):
            s.push(t.key, grads[t.key], it)
        for t in tensors:
            s.wait(t.key, it)
        return time.perf_counter() - t0, time.process_time() - c0

    times: dict[str, list[float]] = {name: [] for name in scheds}
    cpu: dict[str, list[float]] = {name: [] for name in scheds}  # this process, all its threads
    its = {name: 0 for name in scheds}
    for r in range(args.rounds):
        order = list(scheds) if r % 2 == 0 else list(scheds)[::-1]
        for name in order:
            for i in range(args.iters + (1 if r == 0 else 0)):  # one warm-up iteration each
                dt, dc = iteration(scheds[name], its[name])
                its[name] += 1
                if r > 0 or i > 0:
                    times[name].append(dt)
                    cpu[name].append(dc)
    for s in scheds.values():
        s.close()
    nbytes = 4 * sum(sizes)
    med = {name: float(np.median(v)) for name, v in times.items()}
    n = len(workers)
    return {
        "rank": rank, "workers": n, "tensors": len(sizes), "bytes": nbytes, "times": times,
        "median_s": med, "ratio_ring_over_gloo": med["ring"] / med["gloo"],
        "cpu_s": {name: float(np.median(v)) for name, v in cpu.items()},
        # bytes every link must carry per all-reduce, over the time: the link rate reached
        "bus_MBps": {name: (2 * (n - 1) / n * nbytes / m / 1e6 if n > 1 else 0.0) for name, m in med.items()},
    }


def summary(res: dict) -> str:
    m, bus, cpu = res["median_s"], res["bus_MBps"], res["cpu_s"]
    return (f"{res['workers']} workers, {res['tensors']} tensors, {res['bytes'] / 1e6:.1f} MB per all-reduce: "
            + ", ".join(f"{name} {m[name] * 1e3:.1f} ms ({bus[name]:.0f} MB/s per link, "
                        f"{cpu[name] * 1e3:.0f} ms CPU of worker 0)" for name in ("ring", "gloo"))
            + f"; ring/gloo = {res['ratio_ring_over_gloo']:.2f}")


def free_block(k: int) -> int:
    """The first of k consecutive ports that are all free on 127.0.0.1."""
    rng = np.random.default_rng()
    while True:
        base = int(rng.integers(20000, 60000 - k))
        socks = []
        try:
            for p in range(base, base + k):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", p))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()


def launch_loopback(args) -> int:
    """Spawn --workers copies of this script on 127.0.0.1, one per role spec; print rank 0's result."""
    first = free_block(2 * args.workers)
    base = [first + i for i in range(args.workers)]
    gloo_offset = args.workers
    with tempfile.TemporaryDirectory() as tmp:
        procs = []
        for r in range(args.workers):
            spec = {"rank": r, "iface": "lo", "workers": [{"host": f"w{i}", "ip": "127.0.0.1", "port": p}
                                                          for i, p in enumerate(base)]}
            path = Path(tmp) / f"w{r}.json"
            path.write_text(json.dumps(spec))
            cmd = [sys.executable, __file__, "--spec", str(path), "--out", str(Path(tmp) / f"r{r}.json"),
                   "--gloo-port-offset", str(gloo_offset), "--rounds", str(args.rounds),
                   "--iters", str(args.iters), "--params", args.params]
            cmd += ["--model", args.model] if args.model else ["--sizes", args.sizes]
            procs.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL))
        rcs = [p.wait() for p in procs]
        if any(rcs):
            print(f"error: workers exited with {rcs}", file=sys.stderr)
            return 1
        res = json.loads((Path(tmp) / "r0.json").read_text())
    if args.out:
        Path(args.out).write_text(json.dumps(res))
    print(summary(res))
    return 0


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--spec", help="role spec JSON of this worker (rank, workers, iface); else run all on loopback")
    ap.add_argument("--workers", type=int, default=4, help="loopback: how many workers")
    ap.add_argument("--sizes", default="25000000", help="comma-separated tensor sizes (elements)")
    ap.add_argument("--model", help="take the tensor sizes of a model instead, e.g. vgg16:small")
    ap.add_argument("--rounds", type=int, default=4, help="alternations between ring and gloo")
    ap.add_argument("--iters", type=int, default=3, help="iterations per scheduler and round")
    ap.add_argument("--gloo-port-offset", type=int, default=100, help="gloo's ports = workers' ports + this")
    ap.add_argument("--params", default="{}", help='JSON {"ring": {...}, "gloo": {...}} scheduler params')
    ap.add_argument("--out", help="write the result JSON here")
    args = ap.parse_args(argv)
    if not args.spec:
        return launch_loopback(args)
    res = run_worker(json.loads(Path(args.spec).read_text()), args)
    if args.out:
        tmp = Path(args.out).with_suffix(".tmp")
        tmp.write_text(json.dumps(res))
        os.replace(tmp, args.out)
    if res["rank"] == 0:
        print(summary(res), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
