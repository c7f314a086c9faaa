"""Where the forest paper's 18.3x can show: the predicted forest speed-up over each baseline as
deployed, scanned over settings the testbed builds, and what caps the largest (no network):

    .venv/bin/python -m bench.bench_forest_scale [--workers 16,20,32,64] [--top 3] [--csv FILE]

Settings (emu/config/topospec.py, resolved as a run resolves them; 100 Mb/s hosts):
- heterogeneous hardware: a star with host rates spread geometrically 1x, 10x, 100x, or a
  quarter of the hosts at 1/10 or 1/100;
- switching topologies: racks (2, 4 racks; oversubscription 1, 4, 20; host rates spread 1x or
  100x; uplinks spread 1x or 10x) and sites (2, 4 sites; WAN links at 1, 1/4, 1/20 of a site's
  hosts' sum, spread 1x, 10x, 100x);
- contention with concurrent jobs: racks with a tenant's UDP flow taking half of the slower
  uplink between racks 0 and 1, each way (the capacity the job has, analysis/capacity.py);
- ranks given rack by rack (contiguous) or round-robin across racks and sites, as a launcher
  that spreads a job assigns them.

Baselines: ring in the given rank order, ring in topology order (NCCL's search; the best order on
a tree), hierarchical all-reduce, one parameter server on the best host (`roles.servers: best`,
emu/config/placement.py). Each ratio is `analysis/forest_scale.py` `predict`: the baselines'
bounds (`analysis/bounds.py`) over the forest's optimum. The optimum is the planner's certified
one (`lp_optimum`, its column generation without the choice of shallow trees; equal to
`analysis.bounds.forest_rate_bps` within 1e-7 where that LP runs, which it refuses beyond
MAX_LP_HOSTS); the largest rows up to MAX_LP_HOSTS hosts are checked against that LP and the
check printed.
"""
from __future__ import annotations

import argparse
import itertools
import time

import networkx as nx
import pandas as pd

from analysis.bounds import MAX_LP_HOSTS, forest_rate_bps
from analysis.capacity import Flow, available_capacity
from analysis.forest_scale import PAPER_BEST, cap_text, largest, predict
from emu.config.capacity import capacity_graph
from emu.config.placement import best_server
from emu.config.topospec import RacksTopology, SitesTopology, StarTopology
from schedulers.collective.forest_plan import lp_optimum
from schedulers.core.linkmodel import LinkModel

HOST_MBPS = 100.0


def round_robin(groups: list[list[str]]) -> list[str]:
    """Ranks dealt across groups in turn: g0[0], g1[0], ..., g0[1], g1[1], ..."""
    out = []
    for i in range(max(len(g) for g in groups)):
        out += [g[i] for g in groups if i < len(g)]
    return out


def settings(sizes: list[int]):
    """(label dict, NetSpec, workers in rank order, tenant flows) per setting."""
    for n in sizes:
        slow = [{"kind": "slow", "count": n // 4, "factor": f} for f in (0.1, 0.01)]
        for het in (None, {"kind": "spread", "ratio": 10}, {"kind": "spread", "ratio": 100}, *slow):
            net = StarTopology(kind="star", count=n, bw_mbps=HOST_MBPS, heterogeneity=het).resolve()
            label = "none" if het is None else ",".join(f"{k}={v}" for k, v in het.items())
            yield {"kind": "star", "workers": n, "groups": 1, "hardware": label, "oversubscription": 1,
                   "spread": 1, "ranks": "given", "tenant": "none"}, net, list(net.hosts), []
        for groups, over, host_spread, up_spread, ranks, tenant in itertools.product(
                (2, 4), (1, 4, 20), (1, 100), (1, 10), ("contiguous", "round-robin"), (False, True)):
            net = RacksTopology(kind="racks", racks=groups, hosts_per_rack=n // groups, host_bw_mbps=HOST_MBPS,
                                oversubscription=over, host_spread=host_spread if host_spread > 1 else None,
                                uplink_spread=up_spread if up_spread > 1 else None,
                                tenants_per_rack=1 if tenant else None).resolve()
            workers = [h for h in net.hosts if "t" not in h[1:]]
            per = [[w for w in workers if w.startswith(f"r{r}h")] for r in range(groups)]
            flows = []
            if tenant:   # half of the slower uplink on its path, each way, between racks 0 and 1
                half = min(net.rate("s1", "s0"), net.rate("s2", "s0")) / 2 * 1e6
                flows = [Flow("r0t0", "r1t0", half, 0, 1), Flow("r1t0", "r0t0", half, 0, 1)]
            yield ({"kind": "racks", "workers": n, "groups": groups, "hardware": f"host spread {host_spread}x",
                    "oversubscription": over, "spread": up_spread, "ranks": ranks,
                    "tenant": "UDP, half of racks 0-1's path each way" if tenant else "none"},
                   net, round_robin(per) if ranks == "round-robin" else workers, flows)
        for groups, over, wan_spread, ranks in itertools.product((2, 4), (1, 4, 20), (1, 10, 100),
                                                                 ("contiguous", "round-robin")):
            per_site = n // groups
            net = SitesTopology(kind="sites", sites=groups, hosts_per_site=per_site, host_bw_mbps=HOST_MBPS,
                                wan_mbps=per_site * HOST_MBPS / over, wan_spread=wan_spread).resolve()
            per = [[h for h in net.hosts if h.startswith(f"d{d}h")] for d in range(groups)]
            yield ({"kind": "sites", "workers": n, "groups": groups, "hardware": "none", "oversubscription": over,
                    "spread": wan_spread, "ranks": ranks, "tenant": "none"},
                   net, round_robin(per) if ranks == "round-robin" else [h for p in per for h in p], [])


def scan(sizes: list[int]) -> tuple[pd.DataFrame, list]:
    """Every setting's predict rows (column `setting`: its index) and each setting's (graph, workers)."""
    rows, graphs = [], []
    for i, (label, net, workers, flows) in enumerate(settings(sizes)):
        g = capacity_graph(net)
        if flows:
            g = available_capacity(g, (0, 1), None, flows).graph
        optimum, _ = lp_optimum(LinkModel.from_graph(nx.node_link_data(g, edges="links"), workers))
        table = predict(g, workers, best_server(net, workers), forest_bps=optimum)
        for k, v in {"setting": i, **label}.items():
            table[k] = v
        rows.append(table)
        graphs.append((g, workers))
    return pd.concat(rows, ignore_index=True), graphs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", default="16,20,32,64", help="numbers of workers, comma-separated")
    ap.add_argument("--top", type=int, default=3, help="settings shown per baseline, largest first")
    ap.add_argument("--csv", help="write every row here")
    args = ap.parse_args()
    t0 = time.perf_counter()
    table, graphs = scan([int(s) for s in args.workers.split(",")])
    if args.csv:
        table.to_csv(args.csv, index=False)
    print(f"{len(graphs)} settings, {time.perf_counter() - t0:.0f} s; the paper's best: {PAPER_BEST}x\n")
    cols = ["kind", "workers", "groups", "hardware", "oversubscription", "spread", "ranks", "tenant"]
    print("| baseline | predicted | setting | what caps it |")
    print("|---|---|---|---|")
    for name, grp in table.groupby("baseline", sort=False):
        for _, row in grp.nlargest(args.top, "predicted").iterrows():
            setting = ", ".join(f"{c} {row[c]}" for c in cols)
            print(f"| {name} | {row['predicted']:.2f}x | {setting} | {cap_text(row)} |")
    print("\nLargest predicted per baseline and number of workers:")
    wide = table.groupby(["baseline", "workers"], sort=False)["predicted"].max().unstack()
    print(wide.round(2).to_string())
    print(f"\nLargest per baseline (reaches {PAPER_BEST}x?), the forest's optimum checked against the LP of "
          f"analysis/bounds.py up to {MAX_LP_HOSTS} hosts:")
    for _, row in largest(table).iterrows():
        g, workers = graphs[row["setting"]]
        check = "beyond the LP's size"
        if len(set(workers)) <= MAX_LP_HOSTS:
            check = f"planner / LP = {row['forest_bps'] / forest_rate_bps(g, workers):.7f}"
        print(f"  {row['baseline']}: {row['predicted']:.2f}x, {'yes' if row['reaches_paper'] else 'no'} ({check})")


if __name__ == "__main__":
    main()
