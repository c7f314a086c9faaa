"""How long the forest planner takes, beside the independent forest LP solved in the same run:

    .venv/bin/python bench/bench_forest_plan.py [--sizes 4,9,16,32,64] [--repeat 5]

Per size, two topologies as the testbed builds them (emu/config/topospec.py, emu/testbed/topology.py):
racks (sqrt(N) racks of sqrt(N) hosts, or 4 x 8 at 32; 100 Mb/s hosts, 4:1 uplinks) and a
star whose 100 Mb/s hosts are scaled by a seeded lognormal (sigma 1). Columns: the plan's
time (`schedulers.forest_plan.plan_forest`, median of --repeat calls after one warm-up, so
without the one-time import of scipy.optimize, printed first), its trees, and beside it
`analysis.bounds.forest_rate_bps` (the arborescence-cut LP: another formulation, another oracle)
with its time and plan rate / that LP's optimum. That LP refuses more than MAX_LP_HOSTS.

Before the exact planner, it ran Garg-Konemann (eps 0.03) and then column generation for the
optimum: racks 3x3 0.61 s, 4x4 1.19 s, 8x8 96 s on the machine these figures come from.
"""
from __future__ import annotations

import argparse
import statistics
import time

import networkx as nx

from analysis.bounds import MAX_LP_HOSTS, forest_rate_bps
from emu.config.capacity import capacity_graph
from emu.config.topospec import RacksTopology, StarTopology
from schedulers.collective.forest_plan import plan_forest

RACKS = {4: (2, 2), 9: (3, 3), 16: (4, 4), 32: (4, 8), 64: (8, 8)}


def topologies(n: int):
    """(name, capacity graph, worker hosts) for n workers."""
    racks, per_rack = RACKS.get(n, (1, n))
    net = RacksTopology(kind="racks", racks=racks, hosts_per_rack=per_rack, host_bw_mbps=100,
                        oversubscription=4).resolve()
    yield f"racks {racks}x{per_rack}", capacity_graph(net), list(net.hosts)
    net = StarTopology(kind="star", count=n, bw_mbps=100,
                       heterogeneity={"kind": "lognormal", "sigma": 1}).resolve()
    yield "star lognormal", capacity_graph(net), list(net.hosts)


def timed(fn, *args):
    t0 = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="4,9,16,32,64", help="numbers of workers, comma-separated")
    ap.add_argument("--repeat", type=int, default=5, help="plan calls per topology (median)")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    _, first = timed(plan_forest, None, ["a", "b"])
    print(f"first plan in this process (imports scipy.optimize): {first * 1e3:.0f} ms\n")
    print("| workers | topology | plan | trees | independent LP | plan / LP optimum |")
    print("|---|---|---|---|---|---|")
    for n in sizes:
        for name, g, hosts in topologies(n):
            data = nx.node_link_data(g, edges="links")
            plan = plan_forest(data, hosts)
            took = statistics.median(timed(plan_forest, data, hosts)[1] for _ in range(args.repeat))
            if len(set(hosts)) <= MAX_LP_HOSTS:
                reference, lp_s = timed(forest_rate_bps, g, hosts)
                lp, ratio = f"{lp_s * 1e3:.0f} ms", f"{plan.rate / reference:.7f}"
            else:
                lp, ratio = f"refused (> {MAX_LP_HOSTS} hosts)", f"{plan.rate / plan.optimum:.7f} of its own"
            print(f"| {n} | {name} | {took * 1e3:.1f} ms | {len(plan.trees)} | {lp} | {ratio} |", flush=True)


if __name__ == "__main__":
    main()
