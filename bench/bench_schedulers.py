"""Scheduler benchmarks on emulated links (figures, not pass/fail); run as root:

    .venv/bin/python -m bench.bench_schedulers [transport] [ring-gloo]

transport  bulk transfer over one emulated link at 100 and 1000 Mb/s: our transport
           (framed 1 MiB messages through the priority Outbox, recv_into preallocated
           buffers) next to iperf3 on the very same link, as a fraction of the rate.
ring-gloo  `ring` against `gloo` on the same 4-worker star and tensors
           (bench/bench_ring_vs_gloo.py run inside every host): median time per all-reduce.

The third scheduler figure, every scheduler's iteration time beside its analytic bound on
one communication-bound config, is a sweep:
    ./inv sweep configs/sweeps/reference.yaml && ./inv report results/reference
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from schedulers.transport.connection import (
    HOST_QUEUE_S,
    PRIORITY_QUEUE_S,
    QUEUE_S,
    Connection,
    Kind,
    Outbox,
    connect,
    listen,
)
from schedulers.transport.txstamps import TxStamps

REPO = Path(__file__).resolve().parents[1]

# ---------------------------------------------------------------------------- peers (run inside hosts)

def peer_recv(port: int, total: int, frame: int, out: Path) -> None:
    srv = listen("0.0.0.0", port)
    sock, addr = srv.accept()
    conn = Connection(sock, f"sender {addr[0]}")
    buf = np.empty(frame // 4, np.float32)
    got, t0 = 0, None
    while got < total:
        h = conn.recv_header()
        if t0 is None:
            t0 = time.perf_counter()
        conn.recv_into(memoryview(buf)[: h.nbytes // 4])
        got += h.nbytes + 24
    dt = time.perf_counter() - t0
    out.write_text(json.dumps({"bytes": got, "seconds": dt, "mbps": got * 8 / dt / 1e6}))
    conn.close()


def peer_send(ip: str, port: int, total: int, frame: int, ps: bool = False) -> None:
    """ps: the parameter-server family's sending side (its short unsent queue, and the host's
    queue bounded through transmit stamps), as a PS worker sets it up."""
    conn = connect(ip, port, "receiver", 20)
    errors = []
    if ps:
        conn.queue_s = PRIORITY_QUEUE_S
        stamps = TxStamps.enable(conn.sock, record=False)
        box = Outbox(conn, errors.append, stamps=stamps, host_queue_s=HOST_QUEUE_S)
    else:
        box = Outbox(conn, errors.append)
    data = np.ones(frame // 4, np.float32)
    for i in range(total // (frame + 24) + 1):
        box.put((i,), Kind.PUSH, key=0, chunk=i, it=0, payload=data)
    box.close(timeout=300)
    conn.close()
    if errors:
        raise SystemExit(f"send failed: {errors[0]}")


# ---------------------------------------------------------------------------- orchestrated parts

def transport(state, logs: Path) -> None:
    from emu.config.topospec import StarTopology
    from emu.testbed.network import Testbed
    from emu.testbed.probe import iperf

    print("\n## Bulk transfer over one emulated link (goodput / configured rate)")
    print("(frames of 1 MiB, and of 16 KiB as Mercury's packets; the collectives' sending side, and the "
          f"parameter-server family's: unsent queue {PRIORITY_QUEUE_S * 1e3:g} ms, bytes not yet out of the host "
          f"{HOST_QUEUE_S * 1e3:g} ms of the rate)")
    print("| rate | frame, sending side | iperf3 | ours | ours / iperf3 |\n|---|---|---|---|---|")
    for rate in (100, 1000):
        spec = StarTopology.model_validate({"kind": "star", "hosts": [
            {"name": "a", "bw_mbps": rate}, {"name": "b", "bw_mbps": rate}]}).resolve()
        total = int(rate * 1e6 / 8 * 4)  # about 4 s of traffic
        with Testbed(spec, state) as tb:
            ip = iperf(tb, "a", "b", logs, seconds=4)
            for port, (frame, ps) in enumerate(((1 << 20, False), (1 << 14, False), (1 << 14, True)), start=7000):
                res = logs / f"recv-{rate}-{frame}.json"
                py = [sys.executable, "-m", "bench.bench_schedulers"]
                rx = tb.launch("b", f"recv{rate}-{frame}", py + [
                    "--peer", "recv", "--port", str(port), "--bytes", str(total), "--frame", str(frame),
                    "--out", str(res)], logs, aux=True, cwd=REPO, env={"PYTHONPATH": str(REPO)})
                time.sleep(1.0)
                tx = tb.launch("a", f"send{rate}-{frame}", py + [
                    "--peer", "send", "--ip", tb.ip("b"), "--port", str(port), "--bytes", str(total),
                    "--frame", str(frame), *(["--ps"] if ps else [])], logs, aux=True, cwd=REPO,
                    env={"PYTHONPATH": str(REPO)})
                tx.wait(120)
                rx.wait(30)
                ours = json.loads(res.read_text())["mbps"]
                how = "PS side: 2 ms queue, host bound" if ps else f"{QUEUE_S * 1e3:g} ms queue"
                print(f"| {rate} Mb/s | {frame // 1024} KiB, {how} | {ip / rate:.3f} | {ours / rate:.3f} | "
                      f"{ours / ip:.3f} |", flush=True)


def ring_gloo(state, logs: Path, workers: int = 4, rate: float = 100, sizes: str = "5000000") -> None:
    from emu.config.topospec import StarTopology
    from emu.run.runner import WORKER_PORT
    from emu.testbed.network import Testbed

    print(f"\n## ring vs gloo: {workers} workers on a {rate:g} Mb/s star, tensors of {sizes} elements")
    spec = StarTopology.model_validate({"kind": "star", "count": workers, "bw_mbps": rate}).resolve()
    with Testbed(spec, state) as tb:
        eps = [{"host": h, "ip": tb.ip(h), "port": WORKER_PORT + i} for i, h in enumerate(spec.hosts)]
        procs = []
        for i, h in enumerate(spec.hosts):
            role = logs / f"rg{i}.json"
            role.write_text(json.dumps({"rank": i, "workers": eps, "iface": f"{h}-eth0"}))
            procs.append(tb.launch(h, f"rg{i}", [sys.executable, str(REPO / "bench" / "bench_ring_vs_gloo.py"),
                                                 "--spec", str(role), "--sizes", sizes, "--rounds", "2",
                                                 "--iters", "2"], logs, aux=True, cwd=REPO,
                                   env={"PYTHONPATH": str(REPO)}))
        for p in procs:
            p.wait(600)
    print((logs / "rg0.out").read_text().strip())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("parts", nargs="*", default=["transport", "ring-gloo"])
    ap.add_argument("--peer", choices=["send", "recv"], help=argparse.SUPPRESS)
    ap.add_argument("--ip", help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--bytes", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--frame", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--ps", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.peer == "recv":
        peer_recv(args.port, args.bytes, args.frame, args.out)
        return 0
    if args.peer == "send":
        peer_send(args.ip, args.port, args.bytes, args.frame, args.ps)
        return 0

    from emu.testbed.cleanup import StateDir

    logs = Path(tempfile.mkdtemp(prefix="schedlab-bench-"))
    with StateDir() as state:
        if "transport" in args.parts:
            transport(state, logs)
        if "ring-gloo" in args.parts:
            ring_gloo(state, logs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
