"""Testbed benchmarks (figures, not pass/fail): run as root from the repository root.

    .venv/bin/python -m bench.bench_testbed [--quick]

1. Bring-up and teardown time of a star of N hosts (N = 8, 16, 32, 64).
2. Shaping accuracy: iperf3 goodput / configured rate, per topology kind and rate.
3. Step response: after `tc class change`, how long until the new rate is delivered.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from emu.cleanup import StateDir
from emu.monitor import Monitor
from emu.network import Testbed
from emu.probe import iperf
from emu.topospec import GraphTopology, RacksTopology, StarTopology


def bringup(sizes: list[int], state: StateDir) -> None:
    print("\n## Bring-up and teardown (star, LinuxBridge, htb on both ends of every link)")
    print("| hosts | bring-up s | teardown s |\n|---|---|---|")
    for n in sizes:
        spec = StarTopology.model_validate({"kind": "star", "count": n, "bw_mbps": 100}).resolve()
        t0 = time.monotonic()
        with Testbed(spec, state) as tb:
            up = tb.bringup_s
        total = time.monotonic() - t0
        print(f"| {n} | {up:.2f} | {tb.teardown_s:.2f} (whole exit {total - up:.2f}) |", flush=True)


def specs(rate: float):
    yield "star", StarTopology.model_validate({"kind": "star", "hosts": [
        {"name": "a", "bw_mbps": rate}, {"name": "b", "bw_mbps": rate}]}).resolve(), ("a", "b")
    yield "racks", RacksTopology.model_validate({"kind": "racks", "racks": 2, "hosts_per_rack": 1,
                                                 "host_bw_mbps": rate}).resolve(), ("r0h0", "r1h0")
    yield "graph", GraphTopology.model_validate({"kind": "graph", "nodes": [
        {"name": "a", "kind": "host"}, {"name": "b", "kind": "host"}, {"name": "s1", "kind": "switch"},
        {"name": "s2", "kind": "switch"}], "links": [{"a": "a", "b": "s1", "bw_mbps": rate},
                                                     {"a": "s1", "b": "s2", "bw_mbps": rate},
                                                     {"a": "s2", "b": "b", "bw_mbps": rate}]}).resolve(), ("a", "b")


def accuracy(rates: list[float], state: StateDir, logs: Path, seconds: float) -> None:
    print("\n## Shaping accuracy: iperf3 TCP goodput / configured rate")
    print("| kind | " + " | ".join(f"{r:g} Mb/s" for r in rates) + " |\n|---|" + "---|" * len(rates))
    for kind in ("star", "racks", "graph"):
        cells = []
        for rate in rates:
            _, spec, (src, dst) = next(s for s in specs(rate) if s[0] == kind)
            with Testbed(spec, state) as tb:
                got = iperf(tb, src, dst, logs, seconds=seconds)
            cells.append(f"{got / rate:.3f}")
        print(f"| {kind} | " + " | ".join(cells) + " |", flush=True)


def step_response(state: StateDir, logs: Path) -> None:
    print("\n## Step response (star, a->b, iperf3 TCP; counters at 100 Hz; settled = 100 ms mean within 10%)")
    print("| step | settled after s |\n|---|---|")
    spec = StarTopology.model_validate({"kind": "star", "hosts": [
        {"name": "a", "bw_mbps": 100}, {"name": "b", "bw_mbps": 100}]}).resolve()
    for before, after in ((100, 20), (20, 100), (100, 10), (10, 100)):
        with Testbed(spec, state) as tb:
            tb.set_rate(("a", "s1"), before * 1e6)
            rates = {("a", "s1"): before * 1e6}
            mon = Monitor({"a->s1": tb.counter("a", "s1")}, {}, rates, interval_s=0.01).start()

            def change(tb=tb, after=after, rates=rates, mon=mon):  # bound now: joined within this iteration
                time.sleep(2.0)
                tb.set_rate(("a", "s1"), after * 1e6)
                rates[("a", "s1")] = after * 1e6
                change.at = time.monotonic() - mon.t0

            th = threading.Thread(target=change)
            th.start()
            iperf(tb, "a", "b", logs, seconds=4)
            th.join()
            links, _, _ = mon.stop()
        t = links["t"].to_numpy()
        bps = links["tx_bytes_per_s"].to_numpy() * 8
        settled = None
        for i in np.nonzero(t > change.at)[0]:
            win = (t > t[i] - 0.1) & (t <= t[i])
            if abs(bps[win].mean() - 0.95 * after * 1e6) <= 0.1 * after * 1e6:
                settled = t[i] - change.at
                break
        print(f"| {before} -> {after} Mb/s | {settled:.3f} |" if settled is not None else
              f"| {before} -> {after} Mb/s | not within 2 s |", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer sizes and shorter iperf3 runs")
    args = ap.parse_args()
    logs = Path(tempfile.mkdtemp(prefix="schedlab-bench-"))
    with StateDir() as state:
        bringup([8, 16] if args.quick else [8, 16, 32, 64], state)
        accuracy([10, 100, 1000] if args.quick else [10, 100, 1000, 2500, 5000], state, logs,
                 seconds=2 if args.quick else 4)
        step_response(state, logs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
