"""Loopback micro-benchmarks of the transport (schedulers/transport/connection.py) and of Mercury's
packet size. Prints tables; the lead repeats the measurements on emulated links.

    .venv/bin/python bench/bench_transport_loopback.py [throughput] [hol] [busy] [packets] [--quick]

throughput  frames/s and MB/s of one Outbox into one reader process, by frame size and
            TCP_NOTSENT_LOWAT (off = kernel default: no bound on unsent bytes).
hol         head-of-line blocking: a reader drains at a fixed rate (an emulated link, with a
            64 KiB receive buffer standing in for its bandwidth-delay product) while the
            outbox holds a backlog of bulk frames; then one urgent frame is queued. Prints
            how long it took to arrive and how many bytes were ahead of it, for each way of
            bounding the kernel's send queue (nothing, TCP_NOTSENT_LOWAT, small SO_SNDBUF).
busy        goodput at 100 Mb/s and 1 Gb/s when the sending process also runs a busy Python
            thread: the cost of a small TCP_NOTSENT_LOWAT (the kernel's queue may drain
            before the outbox thread gets the GIL back).
packets     Mercury end to end (real `python -m workloads.server` process, worker
            processes): time to average one 16 MiB gradient, by packet size; and how long
            one packet holds back a preempting gradient at 100 Mb/s and 1 Gb/s.

Everything runs on 127.0.0.1 and takes about a minute (--quick: a third of that).
"""
from __future__ import annotations

import multiprocessing as mp
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from contracts.role_spec import Address, role_specs
from schedulers import registry
from schedulers.core.base import Endpoint, RoleContext, TensorSpec
from schedulers.transport.connection import AUTO, Connection, Kind, Outbox

REPO = Path(__file__).resolve().parents[1]

KiB, MiB = 1024, 1024 * 1024
URGENT_KEY = 999_999
BURST = 64 * KiB  # what the emulated link may send at once after an idle moment


# ---------------------------------------------------------------- helpers
def _reader(port_q: mp.Queue, out_q: mp.Queue, rate_bps: float | None, rcvbuf: int | None) -> None:
    """Accept one connection and read frames until BYE, optionally at `rate_bps`. Reports
    (monotonic end time, bytes, frames, urgent frame arrival time, bytes before it)."""
    ls = socket.socket()
    if rcvbuf:
        ls.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)  # inherited; fixes the window scale
    ls.bind(("127.0.0.1", 0))
    ls.listen(1)
    port_q.put(ls.getsockname()[1])
    sock, _ = ls.accept()
    conn = Connection(sock, "sender")
    buf = np.empty(16 * MiB // 4, np.float32)
    total = frames = 0
    urgent_at, ahead = None, 0
    next_t = time.monotonic()
    while True:
        h = conn.recv_header()
        if h.kind == Kind.BYE:
            break
        if h.key == URGENT_KEY and urgent_at is None:
            urgent_at, ahead = time.monotonic(), total
        conn.recv_into(memoryview(buf)[:h.nbytes // 4])
        total += h.nbytes + 24
        frames += 1
        if rate_bps:  # a token bucket like htb's: rate_bps with a BURST-byte bucket
            now = time.monotonic()
            next_t = max(next_t, now - BURST * 8 / rate_bps) + (h.nbytes + 24) * 8 / rate_bps
            if next_t > now:
                time.sleep(next_t - now)
    out_q.put((time.monotonic(), total, frames, urgent_at, ahead))
    conn.close()


def _start_reader(rate_bps=None, rcvbuf=None):
    ctx = mp.get_context("fork")
    port_q, out_q = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=_reader, args=(port_q, out_q, rate_bps, rcvbuf), daemon=True)
    p.start()
    return p, port_q.get(timeout=10), out_q


def _sender(port: int, lowat: int | str | None, sndbuf: int | None = None) -> Outbox:
    sock = socket.create_connection(("127.0.0.1", port))
    if sndbuf:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
    conn = Connection(sock, "reader", notsent_lowat=lowat)
    return Outbox(conn, lambda e: print("send error:", e, file=sys.stderr))


def _lowat_name(lowat: int | str | None) -> str:
    return "off" if not lowat else lowat if isinstance(lowat, str) else f"{lowat // KiB} KiB"


# ---------------------------------------------------------------- throughput
def throughput(quick: bool) -> None:
    print("\n## Outbox throughput into a reader process (loopback)")
    print(f"{'frame':>8} {'NOTSENT_LOWAT':>14} {'MB/s':>8} {'frames/s':>10}")
    payload = np.ones(64 * MiB // 4, np.float32)
    for frame in (1 * KiB, 4 * KiB, 16 * KiB, 64 * KiB, 256 * KiB):
        for lowat in (None, 16 * KiB, 64 * KiB, AUTO):
            total = min(64 * MiB, frame * (8000 if quick else 30000))
            n = frame // 4
            p, port, out_q = _start_reader()
            ob = _sender(port, lowat)
            frames = [((0, 0, c), Kind.PUSH, 0, c, 0, payload[c * n:(c + 1) * n], 0, None)
                      for c in range(total // frame)]
            t0 = time.monotonic()
            ob.put_many(frames)
            ob.close()
            t_end, nbytes, count, _, _ = out_q.get(timeout=120)
            p.join()
            ob.conn.close()
            dt = t_end - t0
            print(f"{frame // KiB:>5} KiB {_lowat_name(lowat):>14} {nbytes / dt / 1e6:>8.0f} {count / dt:>10.0f}")


# ---------------------------------------------------------------- head-of-line
def hol(quick: bool) -> None:
    rate = 100e6
    print(f"\n## Head-of-line blocking of an urgent frame behind bulk frames, reader at {rate / 1e6:.0f} Mb/s,"
          " 64 KiB receive buffer")
    print(f"{'bulk frame':>10} {'kernel send queue bound':>24} {'delay ms':>9} {'KiB ahead':>10} {'goodput Mb/s':>13}")
    print("(KiB ahead: what the link carried between queuing the urgent frame and its arrival)")
    variants = [("none (kernel default)", None, None), ("NOTSENT_LOWAT 16 KiB", 16 * KiB, None),
                ("NOTSENT_LOWAT 64 KiB", 64 * KiB, None), ("NOTSENT_LOWAT 256 KiB", 256 * KiB, None),
                ("SO_SNDBUF 64 KiB", None, 64 * KiB), ("NOTSENT_LOWAT auto", AUTO, None)]
    payload = np.ones(8 * MiB // 4, np.float32)
    for frame in (16 * KiB, 256 * KiB):
        for label, lowat, sndbuf in variants:
            n = frame // 4
            p, port, out_q = _start_reader(rate_bps=rate, rcvbuf=64 * KiB)
            ob = _sender(port, lowat, sndbuf)
            backlog = (6 if quick else 12) * MiB
            frames = [((1, 0, c), Kind.PUSH, 0, c, 0, payload[(c * n) % payload.size:][:n], 0, None)
                      for c in range(backlog // frame)]
            t0 = time.monotonic()
            ob.put_many(frames)
            time.sleep(0.3)  # steady state: the kernel's queues are as full as they get
            t_put = time.monotonic()
            ob.put((0, 0, 0), Kind.PUSH, URGENT_KEY, 0, 0, payload[:256])
            ob.close(timeout=120)
            t_end, nbytes, _, urgent_at, _ = out_q.get(timeout=120)
            p.join()
            ob.conn.close()
            delay = urgent_at - t_put
            print(f"{frame // KiB:>6} KiB {label:>24} {delay * 1e3:>9.1f} {delay * rate / 8 / KiB:>10.0f} "
                  f"{nbytes * 8 / (t_end - t0) / 1e6:>13.1f}")


# ---------------------------------------------------------------- busy sender
def _spin(stop: list) -> None:
    x = 0
    while not stop:
        x += 1  # pure Python: holds the GIL except at the interpreter's switch interval


def busy(quick: bool) -> None:
    print("\n## Goodput when the sending process also runs a CPU-bound Python thread (as a worker's")
    print("training loop does): the outbox thread must get the GIL back before the kernel's queue drains")
    print(f"{'link':>9} {'NOTSENT_LOWAT':>14} {'goodput Mb/s':>13} {'of link':>8} {'final lowat KiB':>16}")
    payload = np.ones(32 * MiB // 4, np.float32)
    frame = 16 * KiB
    n = frame // 4
    for rate in (100e6, 1e9):
        for lowat in (None, 64 * KiB, 256 * KiB, 1 * MiB, AUTO):
            total = int(rate / 8 * (0.5 if quick else 1.5))
            p, port, out_q = _start_reader(rate_bps=rate, rcvbuf=64 * KiB)
            ob = _sender(port, lowat)
            frames = [((0, 0, c), Kind.PUSH, 0, c, 0, payload[(c * n) % payload.size:][:n], 0, None)
                      for c in range(total // frame)]
            stop: list = []
            spinner = threading.Thread(target=_spin, args=(stop,), daemon=True)
            spinner.start()
            t0 = time.monotonic()
            ob.put_many(frames)
            ob.close(timeout=120)
            t_end, nbytes, _, _, _ = out_q.get(timeout=120)
            stop.append(1)
            spinner.join()
            p.join()
            ob.conn.close()
            good = nbytes * 8 / (t_end - t0)
            print(f"{rate / 1e6:>5.0f} Mb/s {_lowat_name(lowat):>14} {good / 1e6:>13.1f} {good / rate:>8.2f} "
                  f"{(ob.conn.lowat or 0) / KiB:>16.0f}")


# ---------------------------------------------------------------- mercury packets
def _mercury_worker(rank: int, workers: int, port: int, packet: int, numel: int, iters: int, q) -> None:
    ctx = RoleContext(rank, workers, [Endpoint("lo", "127.0.0.1", port)], connect_timeout_s=20)
    sched = registry.create("mercury", ctx, {"packet_bytes": packet})
    sched.start([TensorSpec(0, "w", numel, 0)])
    grad = np.ones(numel, np.float32)
    times = []
    for it in range(iters):
        t0 = time.monotonic()
        sched.push(0, grad, it)
        sched.wait(0, it)
        times.append(time.monotonic() - t0)
    sched.close()
    q.put(min(times[1:]))  # the first iteration fills the server's buffer pool


def packets(quick: bool) -> None:
    numel = 4 * MiB  # 16 MiB of float32
    iters = 3 if quick else 5
    print(f"\n## Mercury end to end: one {numel * 4 // MiB} MiB gradient, server process + worker processes "
          f"(best of {iters - 1})")
    print(f"{'packet':>8} {'workers':>8} {'ms':>8} {'MB/s per worker':>16} {'packets/s at server':>20} "
          f"{'1 packet @100Mb/s':>18} {'@1Gb/s':>8}")
    mpc = mp.get_context("fork")
    with tempfile.TemporaryDirectory() as tmp:
        for packet in (1 * KiB, 4 * KiB, 8 * KiB, 16 * KiB, 32 * KiB, 64 * KiB, 256 * KiB):
            for workers in (1, 2):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", 0))
                    port = s.getsockname()[1]
                server_spec = role_specs([Address(host="lo", ip="127.0.0.1", port=port)],
                                         [Address(host="lo", ip="127.0.0.1", port=0)] * workers, seed=0,
                                         scheduler="mercury", params={"packet_bytes": packet}, workload={},
                                         out_dir=tmp, connect_timeout_s=20, iface="lo")[0]
                path = Path(tmp) / "server.json"
                path.write_text(server_spec.to_json())
                server = subprocess.Popen([sys.executable, "-m", "workloads.server", str(path)], cwd=REPO,
                                          stderr=subprocess.DEVNULL)
                q = mpc.Queue()
                procs = [mpc.Process(target=_mercury_worker, args=(r, workers, port, packet, numel, iters, q))
                         for r in range(workers)]
                for pr in procs:
                    pr.start()
                best = max(q.get(timeout=300) for _ in procs)
                for pr in procs:
                    pr.join()
                server.wait(timeout=30)
                npk = -(-numel * 4 // packet)
                print(f"{packet // KiB:>5} KiB {workers:>8} {best * 1e3:>8.0f} {numel * 4 / best / 1e6:>16.0f} "
                      f"{2 * workers * npk / best:>20.0f} {packet * 8 / 100e6 * 1e3:>15.2f} ms "
                      f"{packet * 8 / 1e9 * 1e3:>5.2f} ms")


def main(argv: list[str]) -> None:
    quick = "--quick" in argv
    parts = [a for a in argv if not a.startswith("--")] or ["throughput", "hol", "busy", "packets"]
    print(f"# transport loopback bench ({os.cpu_count()} CPUs, kernel {os.uname().release})")
    for part in parts:
        {"throughput": throughput, "hol": hol, "busy": busy, "packets": packets}[part](quick)


if __name__ == "__main__":
    main(sys.argv[1:])
