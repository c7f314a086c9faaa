"""The role process of a conformance job: `python -m conformance.role SPEC.json`.

A worker pushes known gradients (reference.py) in backward order, as training does, waits
for each average, closes, and counts the threads and sockets of its own process before the
scheduler was made and after close(): a role process is where a leak would accumulate over
a long run. A server is the built-in parameter server in the mode the scheduler speaks.
The answer (JSON, to the spec's `out`) is what jobs.py judges; a role never judges itself.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
import threading
import time
import traceback
from pathlib import Path

import numpy as np

from conformance.reference import average, error, gradient
from schedulers import registry
from schedulers.core.base import CommError, Endpoint, RoleContext, TensorSpec
from schedulers.ps.server import ParameterServer

SETTLE_S = 2.0  # how long close()'s threads and sockets may take to go after it returns


def census() -> tuple[set[str], int]:
    """This process's live threads (by name and id) and the number of its open sockets."""
    threads = {f"{t.name}#{t.ident}" for t in threading.enumerate()}
    sockets = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            sockets += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
        except OSError:   # the fd of the listing itself, gone by now
            pass
    return threads, sockets


def left_behind(before: tuple[set[str], int]) -> dict:
    """Threads and sockets that appeared since `before` and are still there after SETTLE_S."""
    deadline = time.monotonic() + SETTLE_S
    while True:
        threads, sockets = census()
        extra = sorted(threads - before[0])
        if (not extra and sockets <= before[1]) or time.monotonic() > deadline:
            return {"threads_left": extra, "sockets_left": max(0, sockets - before[1])}
        time.sleep(0.05)


def answer(spec: dict, result: dict) -> None:
    path = Path(spec["out"])
    path.with_suffix(".tmp").write_text(json.dumps(result))
    os.replace(path.with_suffix(".tmp"), path)


def context(spec: dict) -> RoleContext:
    return RoleContext(rank=spec["rank"], num_workers=len(spec["workers"]),
                       servers=[Endpoint(**s) for s in spec["servers"]],
                       workers=[Endpoint(**w) for w in spec["workers"]], topology=spec["topology"],
                       connect_timeout_s=spec["connect_timeout_s"], iface="lo")


def drive(spec: dict, results: list[dict[int, np.ndarray]]) -> None:
    """Push and wait through every iteration, then close. With `stop_after`, push that many
    gradients of the last iteration and exit at once: no close, no BYE, as a crash."""
    sizes, seed, rank = spec["sizes"], spec["seed"], spec["rank"]
    tensors = [TensorSpec(key=k, name=f"t{k}", numel=n, priority=k) for k, n in enumerate(sizes)]
    sched = registry.create(spec["name"], context(spec), spec["params"])
    sched.start(tensors)
    for it in range(spec["iterations"]):
        for i, t in enumerate(reversed(tensors)):
            if spec.get("stop_after") == i and it == spec["iterations"] - 1:
                answer(spec, {"died_at": time.time()})
                os._exit(0)
            sched.push(t.key, gradient(seed, it, rank, t.key, t.numel), it)
        results.append({t.key: sched.wait(t.key, it).copy() for t in tensors})
    sched.close()


def judge(spec: dict, results: list[dict[int, np.ndarray]]) -> dict:
    """Every result's digest (replicas must agree bit for bit) and, on worker 0, the largest
    error against the reference average and the first result outside the tolerances."""
    digests = [hashlib.blake2b(v.tobytes(), digest_size=8).hexdigest() for res in results for v in res.values()]
    out: dict = {"digests": digests}
    if spec["rank"] == 0:
        worst, wrong = 0.0, None
        for it, res in enumerate(results):
            for key, got in res.items():
                err, ok = error(got, average(spec["seed"], it, len(spec["workers"]), key, spec["sizes"][key]))
                worst = max(worst, err)
                if not ok and wrong is None:
                    wrong = f"iteration {it}, key {key} ({spec['sizes'][key]} elements): max abs error {err:.3g}"
        out.update(max_abs_error=worst, wrong=wrong)
    return out


def worker(spec: dict) -> dict:
    before = census()
    results: list[dict[int, np.ndarray]] = []
    try:
        drive(spec, results)
    except CommError as e:
        return {"error": f"CommError: {e}", "failed_at": time.time()}
    except BaseException as e:  # noqa: BLE001 - the answer carries it to the check, which fails with it
        return {"error": f"{type(e).__name__}: {' '.join(str(e).split())}", "traceback": traceback.format_exc(),
                "failed_at": time.time()}
    return {"error": None, **left_behind(before), **judge(spec, results)}


def server(spec: dict) -> dict:
    try:
        ps = ParameterServer(spec["rank"], len(spec["workers"]), "127.0.0.1", spec["servers"][spec["rank"]]["port"],
                             accept_timeout_s=spec["connect_timeout_s"], mode=registry.server_mode(spec["name"]),
                             log=lambda msg: None)
        ps.serve()
    except CommError as e:
        return {"error": f"CommError: {e}", "failed_at": time.time()}
    return {"error": None}


def load_plugins(spec: dict, spec_path: Path) -> str | None:
    """The plugins that define the scheduler, registered before anything else, as in a run's
    roles (workloads/worker.py); the error, if one does not load."""
    if not spec.get("plugins"):
        return None
    from schedulers.registry.plugins import PluginError
    from schedulers.registry.plugins import load_plugins as load

    try:
        load(spec["plugins"], spec_path.resolve().parent)
    except PluginError as e:
        return f"PluginError: {e}"
    return None


def main(argv: list[str]) -> int:
    spec = json.loads(Path(argv[0]).read_text())
    failed = load_plugins(spec, Path(argv[0]))
    if failed:
        answer(spec, {"error": failed, "failed_at": time.time()})
    else:
        answer(spec, worker(spec) if spec["role"] == "worker" else server(spec))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
