"""Testbed benchmarks (figures, not pass/fail): run as root from the repository root.

    .venv/bin/python -m bench.bench_testbed [--quick] [--section NAME ...]

1. `bringup`: bring-up and teardown time of a star of N hosts (N = 8, 16, 32, 64).
2. `accuracy`: iperf3 goodput / configured rate, per topology kind and rate.
3. `step`: after `tc class change`, how long until the new rate is delivered.
4. `monitor`: the monitor's own cost. Every link direction's counters and shaping qdisc of
   a star of N hosts (N = 8, 32) sampled at 100 Hz for a few seconds, through netlink and
   through the old tc sampling (and tc at its default 10 Hz), in the same network one after
   the other: samples achieved per second, and the harness process's CPU seconds per second
   (its own, and with the tc processes it waited for).
5. `shaping`: planned against applied time of rate changes: every link direction of a star
   of 8 hosts switching between 100 and 20 Mb/s on a square schedule, applied by the
   Shaper through netlink and through `tc class change`; the rates read back at the end.
"""
from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from emu.config.shaping import LinkShaping
from emu.config.topospec import GraphTopology, RacksTopology, StarTopology
from emu.testbed import tc
from emu.testbed.cleanup import StateDir
from emu.testbed.monitor import Monitor
from emu.testbed.network import Testbed
from emu.testbed.probe import iperf
from emu.testbed.shaping import Shaper


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


def _cpu_s(who: int) -> float:
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime


def _directions(spec) -> list[tuple[str, str, float]]:
    return [(ln.a, ln.b, ln.ab_mbps) for ln in spec.links] + [(ln.b, ln.a, ln.ba_mbps) for ln in spec.links]


def sample(tb: Testbed, spec, backend: str, hz: float, seconds: float, counter_hz: float | None = None
           ) -> dict[str, float]:
    """Every link direction's qdisc sampled at `hz` and counters at `counter_hz` (default:
    `hz`) for `seconds`: samples per second achieved, and the harness's CPU seconds per
    second (own; with waited-for children)."""
    dirs = _directions(spec)
    mon = Monitor(counters={f"{a}->{b}": tb.counter(a, b) for a, b, _ in dirs},
                  egress={f"{a}->{b}": tb.egress(a, b) for a, b, _ in dirs},
                  rates={(a, b): m * 1e6 for a, b, m in dirs}, interval_s=1 / (counter_hz or hz),
                  qdisc_interval_s=1 / hz, backend=backend)
    t_open = time.monotonic()
    mon.start()
    opened = time.monotonic() - t_open
    own0, kids0, t0 = _cpu_s(resource.RUSAGE_SELF), _cpu_s(resource.RUSAGE_CHILDREN), time.monotonic()
    time.sleep(seconds)
    own1, kids1, t1 = _cpu_s(resource.RUSAGE_SELF), _cpu_s(resource.RUSAGE_CHILDREN), time.monotonic()
    links, qdiscs, _ = mon.stop()
    wall = t1 - t0
    return {"open_s": opened, "qdisc_hz": len(qdiscs[qdiscs["t"] >= t0 - mon.t0]) / len(dirs) / wall,
            "link_hz": len(links[links["t"] >= t0 - mon.t0]) / len(dirs) / wall,
            "own": (own1 - own0) / wall, "with_children": (own1 - own0 + kids1 - kids0) / wall}


def monitor_overhead(sizes: list[int], state: StateDir, seconds: float) -> None:
    print(f"\n## Monitor overhead: every link direction's counters and shaping qdisc of an idle star, "
          f"{seconds:g} s each, in the same network")
    print("| hosts | qdiscs | backend | target Hz (queues / counters) | qdisc samples/s each "
          "| counter samples/s each | harness CPU s/s | with its tc processes s/s | sockets opened in s |\n"
          "|---|---|---|---|---|---|---|---|---|")
    sweeps = []
    for n in sizes:
        spec = StarTopology.model_validate({"kind": "star", "count": n, "bw_mbps": 100}).resolve()
        with Testbed(spec, state) as tb:
            # The last: a run's defaults (queues at 100 Hz, counters and CPU at 10 Hz).
            for backend, hz, counter_hz in (("netlink", 100, 100), ("tc", 100, 100), ("tc", 10, 10),
                                            ("netlink", 100, 10)):
                r = sample(tb, spec, backend, hz, seconds, counter_hz)
                opened = f"{r['open_s']:.3f}" if backend == "netlink" else "-"
                print(f"| {n} | {2 * len(spec.links)} | {backend} | {hz} / {counter_hz} | {r['qdisc_hz']:.1f} "
                      f"| {r['link_hz']:.1f} "
                      f"| {r['own']:.3f} | {r['with_children']:.3f} | {opened} |", flush=True)
            sweeps.append((n, sweep_cost(tb, spec)))
    print("\nOne netlink read of every queue, CPU microseconds (user + kernel) back to back and once "
          "every 10 ms (what 100 Hz costs: the core idles between reads and each starts cold):")
    for n, (tight, paced) in sweeps:
        print(f"- {n} hosts: back to back {tight:.0f} us, every 10 ms {paced:.0f} us", flush=True)


def sweep_cost(tb: Testbed, spec) -> tuple[float, float]:
    """CPU microseconds of one Sampler.qdiscs over every shaped interface: in a tight loop,
    and paced at 100 Hz."""
    from emu.testbed.netlink import Sampler

    dirs = _directions(spec)
    s = Sampler({f"{a}->{b}": tb.egress(a, b) for a, b, _ in dirs}, {})
    rows: list = []
    try:
        out = []
        for k, pause in ((2000, 0.0), (300, 0.01)):
            c0 = _cpu_s(resource.RUSAGE_THREAD)
            for _ in range(k):
                s.qdiscs(rows, 0.0)
                rows.clear()
                if pause:
                    time.sleep(pause)
            out.append((_cpu_s(resource.RUSAGE_THREAD) - c0) / k * 1e6)
        return out[0], out[1]
    finally:
        s.close()


def shaping_lag(state: StateDir, seconds: float, hosts: int = 8, period_s: float = 0.2) -> None:
    print(f"\n## Shaping lag: every link direction of a star of {hosts} hosts on a square schedule 100/20 Mb/s, "
          f"period {period_s:g} s, for {seconds:g} s (changes at the same instant are applied one after another)")
    print("| backend | changes | per s | lag p50 ms | lag p99 ms | lag max ms | within 10 ms | harness CPU s/s "
          "| with children s/s | rates read back |\n|---|---|---|---|---|---|---|---|---|---|")
    spec = StarTopology.model_validate({"kind": "star", "count": hosts, "bw_mbps": 100}).resolve()
    dirs = _directions(spec)
    shaping = [LinkShaping.model_validate({"link": [a, b], "schedule": {
        "kind": "square", "period_s": period_s, "high_mbps": 100, "low_mbps": 20}}) for a, b, _ in dirs]
    for backend in ("netlink", "tc"):
        with Testbed(spec, state, netlink=backend == "netlink") as tb:
            rates = {(a, b): m * 1e6 for a, b, m in dirs}
            for s in shaping:
                tb.prepare_rate(tuple(s.link))
            own0, kids0 = _cpu_s(resource.RUSAGE_SELF), _cpu_s(resource.RUSAGE_CHILDREN)
            sh = Shaper(shaping, seconds, tb.set_rate, rates).start()
            time.sleep(seconds + 0.3)
            sh.stop()
            wall = time.monotonic() - sh.t0
            own, kids = _cpu_s(resource.RUSAGE_SELF) - own0, _cpu_s(resource.RUSAGE_CHILDREN) - kids0
            lag = np.array([r["actual_t"] - r["planned_t"] for r in sh.log]) * 1e3
            back = sum(abs(tc.class_rate(*tb.egress(a, b)) - rates[(a, b)]) <= 0.01 * rates[(a, b)]
                       for a, b, _ in dirs)
        if sh.error is not None:
            print(f"| {backend} | failed: {sh.error} |", flush=True)
            continue
        print(f"| {backend} | {len(lag)} | {len(lag) / seconds:.0f} | {np.percentile(lag, 50):.2f} "
              f"| {np.percentile(lag, 99):.2f} | {lag.max():.2f} | {(lag <= 10).mean():.1%} | {own / wall:.3f} "
              f"| {(own + kids) / wall:.3f} | {back} of {len(dirs)} |", flush=True)


SECTIONS = ("bringup", "accuracy", "step", "monitor", "shaping")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer sizes and shorter iperf3 runs")
    ap.add_argument("--section", action="append", choices=SECTIONS, help="run only these (repeatable; default: all)")
    args = ap.parse_args()
    run = set(args.section or SECTIONS)
    logs = Path(tempfile.mkdtemp(prefix="schedlab-bench-"))
    with StateDir() as state:
        if "bringup" in run:
            bringup([8, 16] if args.quick else [8, 16, 32, 64], state)
        if "accuracy" in run:
            accuracy([10, 100, 1000] if args.quick else [10, 100, 1000, 2500, 5000], state, logs,
                     seconds=2 if args.quick else 4)
        if "step" in run:
            step_response(state, logs)
        if "monitor" in run:
            monitor_overhead([8, 32], state, seconds=3 if args.quick else 10)
        if "shaping" in run:
            shaping_lag(state, seconds=3 if args.quick else 10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
