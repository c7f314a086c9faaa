"""Incast: a parameter server whose link is slower than the sum of its workers' links
(`configs/sweeps/incast.yaml`), the common case in a real cluster.

When every worker pushes at once, the switch's port toward the server receives up to the
workers' sum and sends the server's rate; its queue overflows, and TCP pays for each drop
with a retransmission, after a tail loss with a retransmission timeout (200 ms at least).
What that costs each scheduler is read off per scheduler and *server-link fraction*: the
rate into the servers over the rate out of the workers, from the capacity graph the roles
were given (on a star, the server's link over the sum of the workers' links; 1/8 for 8
workers at 100 Mb/s and a 100 Mb/s server). Beside the iteration and its bound: TCP's
retransmissions per iteration (the hosts' own counters, `tcp_retrans_segs`, over the whole
run, warm-up and connection included, divided by the iterations run), its timeouts, and the
packets the queues into the servers dropped (`server_port_drops`, over the same time) and
those every other queue dropped (`queue_drops` less those: a server's burst of results into
one worker's port, a host's own egress queue), from the run's row (emu/testbed/tcpcounters.py).
"""
from __future__ import annotations

import json
import math
from fractions import Fraction
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.bounds import load_graph

NAME = "incast"  # a sweep named so gets the section whatever it varies


def server_links(g, workers: list[str], servers: list[str]) -> tuple[float, float]:
    """(bit/s into the servers, bit/s out of the workers): each the sum of the capacities of
    their hosts' link directions in the capacity graph `g` (edges carry `capacity`)."""
    into = sum(d["capacity"] for _, v, d in g.edges(data=True) if v in servers)
    out = sum(d["capacity"] for u, _, d in g.edges(data=True) if u in workers)
    return float(into), float(out)


def with_fractions(runs: pd.DataFrame, sweep_dir: Path) -> pd.DataFrame:
    """`runs` with `server_in_bps`, `workers_out_bps` and `server_fraction` (their ratio), NaN
    for a run without parameter servers or without its role specs (emulated bit/s:
    analysis/bounds.py load_graph)."""
    into, out = [], []
    for _, run in runs.iterrows():
        servers, workers = json.loads(run["roles.servers"]), json.loads(run["roles.workers"])
        try:
            a, b = server_links(load_graph(Path(sweep_dir) / run["run_id"]), workers, servers) if servers \
                else (math.nan, math.nan)
        except (OSError, StopIteration, ValueError):
            a, b = math.nan, math.nan
        into.append(a)
        out.append(b)
    into_s, out_s = pd.Series(into, index=runs.index), pd.Series(out, index=runs.index)
    return runs.assign(server_in_bps=into_s, workers_out_bps=out_s, server_fraction=into_s / out_s)


def applies(runs: pd.DataFrame, sweep: str) -> bool:
    """The section is shown: the sweep is named incast, or it varies the server-link fraction
    (`with_fractions`) and takes it below 1 (the servers slower than the workers' sum)."""
    f = runs["server_fraction"].dropna() if "server_fraction" in runs else pd.Series(dtype=float)
    if not len(f):
        return False
    return NAME in str(sweep).lower() or (f.round(6).nunique() > 1 and bool((f < 1 - 1e-9).any()))


def fraction_text(f: float) -> str:
    """0.125 -> '1/8', 1.0 -> '1', 0.3 -> '0.3' (a fraction only where a small one is exact)."""
    if pd.isna(f):
        return "–"
    q = Fraction(float(f)).limit_denominator(64)
    if abs(float(q) - f) > 1e-9 * max(1.0, f):
        return f"{f:.3g}"
    return str(q.numerator) if q.denominator == 1 else f"{q.numerator}/{q.denominator}"


def _col(g: pd.DataFrame, name: str) -> pd.Series:
    return g[name].astype(float) if name in g else pd.Series(np.nan, index=g.index)


def table(runs: pd.DataFrame, order: list[str] | None = None) -> pd.DataFrame:
    """One row per (configuration, scheduler) of the completed PS-family runs that have a
    server-link fraction, by fraction then scheduler (`order`, else as they come): runs, the
    fraction and the servers' Mb/s, the median iteration (median over runs of their medians,
    s), the bound (s) and efficiency (means over runs), TCP retransmitted segments per
    iteration, timeouts, the drops at the servers' ports and at every other queue (medians over
    runs; NaN for rows recorded before the counters), fidelity passed and judged, and the
    lowest CPU idle."""
    ok = runs[(runs["status"] == "ok") & runs["server_fraction"].notna()]
    rows = []
    for (config, sched), g in ok.groupby(["config", "scheduler"], sort=False):
        fid = g["fidelity_ok"].dropna() if "fidelity_ok" in g else pd.Series(dtype=object)
        iterations = g["workload.iterations"].astype(float)
        rows.append({"config": config, "scheduler": sched, "runs": len(g),
                     "server_fraction": float(g["server_fraction"].median()),
                     "server_mbps": float(g["server_in_bps"].median()) / 1e6,
                     "iter_time_s": float(g["iter_time_median_s"].median()),
                     "bound_s": float(_col(g, "bound_s").mean()), "efficiency": float(_col(g, "efficiency").mean()),
                     "retrans_per_iter": float((_col(g, "tcp_retrans_segs") / iterations).median()),
                     "timeouts": float(_col(g, "tcp_timeouts").median()),
                     "server_port_drops": float(_col(g, "server_port_drops").median()),
                     "other_drops": float((_col(g, "queue_drops") - _col(g, "server_port_drops")).median()),
                     "fidelity_passed": int((fid == True).sum()), "fidelity_judged": len(fid),  # noqa: E712
                     "cpu_idle_min": float(_col(g, "fidelity_cpu_idle_min").min())})
    cols = ["config", "scheduler", "runs", "server_fraction", "server_mbps", "iter_time_s", "bound_s", "efficiency",
            "retrans_per_iter", "timeouts", "server_port_drops", "other_drops", "fidelity_passed", "fidelity_judged",
            "cpu_idle_min"]
    out = pd.DataFrame(rows, columns=cols)
    rank = {s: i for i, s in enumerate(order or dict.fromkeys(out["scheduler"]))}
    out["_s"] = out["scheduler"].map(lambda s: rank.get(s, len(rank)))
    return out.sort_values(["server_fraction", "_s"], kind="stable").drop(columns="_s").reset_index(drop=True)


def one_config_per_fraction(t: pd.DataFrame) -> bool:
    """Each configuration has one fraction and each fraction one configuration: the fraction
    names the configuration (the report leaves the configuration column out)."""
    pairs = t[["config", "server_fraction"]].drop_duplicates()
    return pairs["config"].is_unique and pairs["server_fraction"].is_unique
