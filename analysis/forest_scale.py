"""The forest's predicted speed-up over each baseline as deployed, and what caps it: the forest
paper's "up to 18.3x" held against the bounds of `analysis/bounds.py` on any network, with no
network built (`bench/bench_forest_scale.py` scans settings with it).

A baseline B with a fixed pattern (ring in an order, hierarchical all-reduce, one parameter
server) is bound by its busiest link direction e*: T_B = x_B G / c(e*), where x_B is the number
of gradients B puts on e* per iteration. The forest is bound by its LP optimum r_F: T_F = G / r_F.
So the predicted ratio factors as

    predicted = T_B / T_F = x_B * (r_F / c(e*)).

Every spanning tree crosses each link that separates workers at least once each way, so r_F <=
c(e*) and **the predicted ratio is at most x_B**: the gradients the baseline puts on its
bottleneck where a forest needs one. On a tree network (every topology of the testbed) with N
workers, x_B is at most:

- ring in the given order: 2(N-1)/N per hop, and a link with m workers behind it is crossed by at
  most min(m, N-m) hops each way: x <= min(m, N-m) 2(N-1)/N <= N-1 (two halves, ranks
  interleaved between them);
- ring in topology order (NCCL's search; a depth-first order crosses each separating link once
  each way, the best on a tree): x = 2(N-1)/N < 2, whatever the rates;
- hierarchical all-reduce: a leader's host link carries its H-1 members' gradients and a ring
  hop, (H-1) + 2(L-1)/L for L leaders (one switch: one group, a parameter server on rank 0);
- one parameter server: N-1 gradients on its host's link (N on a host of its own).

The second factor, r_F / c(e*) <= 1, is how close the forest comes to the baseline's bottleneck
rate. The forest is held by its own tightest constraint: one link's cut (every tree crosses it)
or, where host links limit it, the trees' degrees: per unit of rate the host links carry 2(N-1)
slices in all, so N hosts at rate c give at most N c / (2(N-1)), about c / 2. `held_by` says
which: `cut` when r_F is the capacity of the slowest link that separates workers, else
`tree packing` with r_F as a fraction of that link.
"""
from __future__ import annotations

import networkx as nx
import pandas as pd

from analysis.bounds import forest_rate_bps, hierarchical_loads, ps_loads, ring_loads, ring_order, worker_groups

PAPER_BEST = 18.3
HIERARCHICAL = "hierarchical all-reduce"   # the pattern, named apart from the scheduler
BASELINES = ("ring (order given)", "ring (order topology)", HIERARCHICAL, "parameter server (best host)")
_TIGHT = 1e-6


def _behind(g: nx.DiGraph, workers: list[str]) -> dict[tuple[str, str], int]:
    """Link direction (a, b) -> the workers on a's side of the link (a tree: one path per pair)."""
    und = g.to_undirected(as_view=True)
    count = {w: workers.count(w) for w in set(workers)}
    out = {}
    for a, b in g.edges:
        h = nx.restricted_view(und, [], [(a, b), (b, a)])
        side = nx.node_connected_component(h, a)
        out[(a, b)] = sum(k for w, k in count.items() if w in side)
    return out


def _bottleneck(loads: dict, g: nx.DiGraph) -> tuple[tuple[str, str], float]:
    """(link direction, gradients on it) of the busiest direction, loads in gradients."""
    e = max(loads, key=lambda e: (loads[e] / g.edges[e]["capacity"], e))
    return e, loads[e]


def _pattern_cap(name: str, g: nx.DiGraph, workers: list[str], behind: int) -> float:
    """The most gradients this baseline's pattern can put on one link of a tree (module docstring)."""
    n = len(workers)
    hop = 2 * (n - 1) / n
    if name == "ring (order given)":
        return min(behind, n - behind) * hop
    if name == "ring (order topology)":
        return hop
    if name == HIERARCHICAL:
        groups = worker_groups(g, workers)
        lead = len(groups)
        return max(len(grp) for grp in groups) - 1 + (2 * (lead - 1) / lead if lead > 1 else 0.0)
    return float(n)


def predict(g: nx.DiGraph, workers: list[str], server: str, forest_bps: float | None = None) -> pd.DataFrame:
    """One row per baseline (BASELINES) on capacity graph g (bit/s per link direction; the
    capacity the job has, tenants' traffic taken off) with `workers` in rank order and the
    parameter server on `server`: the predicted ratio T_B / T_F and its two factors.

    forest_bps: the forest's optimum, where the caller has it (beyond MAX_LP_HOSTS the
    planner's certified optimum); else `forest_rate_bps` solves the LP.

    Columns: baseline, predicted, bottleneck (link 'a->b'), bottleneck_gradients (x_B),
    pattern_cap (the most gradients the pattern can put on a link with that many workers
    behind it), forest_of_bottleneck (r_F / c(e*)), forest_bps, held_by, forest_of_cut (r_F over
    the slowest link that separates workers), cut_link."""
    if forest_bps is None:
        forest_bps = forest_rate_bps(g, workers)
    behind = _behind(g, workers)
    n = len(workers)
    separating = [e for e, m in behind.items() if 0 < m < n]
    cut_link = min(separating, key=lambda e: (g.edges[e]["capacity"], e))
    of_cut = forest_bps / g.edges[cut_link]["capacity"]
    held = "cut" if of_cut >= 1 - _TIGHT else "tree packing"
    patterns = {
        "ring (order given)": ring_loads(g, workers, 1.0),
        "ring (order topology)": ring_loads(g, ring_order(g, workers), 1.0),
        HIERARCHICAL: hierarchical_loads(g, workers, 1.0),
        "parameter server (best host)": ps_loads(g, workers, [server], 1.0),
    }
    rows = []
    for name, loads in patterns.items():
        e, x = _bottleneck(loads, g)
        share = forest_bps / g.edges[e]["capacity"]
        rows.append({"baseline": name, "predicted": x * share, "bottleneck": f"{e[0]}->{e[1]}",
                     "bottleneck_gradients": x, "pattern_cap": _pattern_cap(name, g, workers, behind[e]),
                     "forest_of_bottleneck": share, "forest_bps": forest_bps, "held_by": held,
                     "forest_of_cut": of_cut, "cut_link": f"{cut_link[0]}->{cut_link[1]}"})
    return pd.DataFrame(rows)


def largest(table: pd.DataFrame) -> pd.DataFrame:
    """Per baseline, the row of `table` (predict's columns and the scan's setting columns) with
    the largest predicted ratio, and whether it reaches the paper's 18.3x."""
    top = table.loc[table.groupby("baseline", sort=False)["predicted"].idxmax()].copy()
    top["reaches_paper"] = top["predicted"] >= PAPER_BEST
    return top.reset_index(drop=True)


def cap_text(row: pd.Series) -> str:
    """What caps a predicted ratio, in words: the baseline's gradients on its bottleneck (at most
    the pattern's cap) times the forest's share of that link's rate, and what holds the forest."""
    forest = (f"the forest at {row['forest_of_bottleneck']:.2f} of {row['bottleneck']}'s rate, held by "
              + (f"the cut at {row['cut_link']}" if row["held_by"] == "cut"
                 else f"its tree packing (host links) at {row['forest_of_cut']:.2f} of {row['cut_link']}"))
    return (f"{row['bottleneck_gradients']:.2f} gradients on {row['bottleneck']} (the pattern's most there: "
            f"{row['pattern_cap']:.2f}) x {forest}")
