"""The bandwidth a run actually had: per link direction, the capacity left to the job,
averaged over the run's measured window.

For a window W (the measured iterations, from the first start to the last end, in the
monitor's clock) and a link direction e:

    available_e = ( ∫_W configured_e(t) dt  -  Σ_f mbps_f · |I_f ∩ W| [f routed over e] ) / |W|

- `configured_e(t)`: the rate configured at each 10 Hz sample of `links.parquet`
  (`configured_bps`, read at the sample's time), each held from the midpoint with the sample
  before to the midpoint with the one after, so a rate step is placed within half a sample
  (0.05 s) of when it happened;
- cross-traffic flow f (the row's `cross_traffic`, what iperf3 achieved) is taken as
  steady at its achieved rate `mbps_f` over its active interval I_f = [start_s, end] (start
  no earlier than 0.3 s, when the flows are let go; end: its `stop_s`, the run's timeout or
  the last monitor sample, whichever comes first), routed along the hop-shortest path from
  `src` to `dst` through switches (the topology is a tree, so the path is the only one),
  and only its data direction is charged: TCP's acknowledgements (about 2% of the bytes,
  the other way) and the flow's header bytes are not, so the available capacity errs on
  the high side and every bound computed on it stays a lower bound;
- a flow that started but reported no result (iperf3 killed before it wrote its JSON)
  counts as 0, and the run's `basis` note says so.

Why an average of capacity and not a bound integrated instant by instant: over the window
each link direction can carry at most ∫_W available_e dt bits, and that is the only thing a
schedule must obey; hosts may buffer, so data can cross one link while it is fast and the
next one later. The optimum of any of the bound models (a linear programme in the
capacities) on these averages is therefore a lower bound on the window's *mean* iteration
time. Taking each instant's optimum and integrating it (∫ OPT(c(t)) dt = bits) is tighter
but not a bound: with two links in series that are fast in turn it says 10 where buffering
reaches 50. For a single link both agree, and the time to move B bits is the T with
∫ rate dt = B over the window's average rate. Because the bound is on the mean,
`analysis/bounds.py` compares it with the mean iteration when the capacity varied inside
the window (a step, a flow starting or stopping) and with the median otherwise.

A time-dilated run (`time_dilation` k > 1, emu/config/dilation.py) stored its tables, its iteration
times and the row's cross-traffic rates in emulated time already; only its roles' capacity
graph holds the dilated rates, which `analysis/bounds.py` `load_graph` multiplies back by k,
and the 0.3 s the flows wait is wall clock, 0.3 / k emulated. So the bound of a dilated run
is the bound of the same config undilated.

Runs without the monitor's clock in their row (`monitor_t0_wall`, rows older than it) or
without `links.parquet` cannot be placed in time: they keep the configured capacities when
their bandwidth was shared or shaped, and the basis says so.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import networkx as nx
import numpy as np
import pandas as pd
import yaml

from contracts.iterations import measured

FLOWS_START_S = 0.3  # emu/testbed/crosstraffic.py lets the flows go 0.3 s after the monitor's t = 0
MIN_SHARE = 1e-3  # available capacity is kept at least this share of the configured (a link
#                   whose cross traffic measured above its rate is nearly, not entirely, taken)


@dataclass(frozen=True)
class Flow:
    """One cross-traffic flow as it ran: achieved bit/s over [start, end] of monitor time."""
    src: str
    dst: str
    bps: float
    start: float
    end: float


@dataclass(frozen=True)
class Capacity:
    graph: nx.DiGraph  # the same nodes and edges; `capacity` in bit/s as the job had it
    basis: str  # "configured" or "available", with a reason when it had to be configured
    varies: bool = False  # the capacity changed inside the window: compare with the mean
    window: tuple[float, float] | None = None  # monitor time
    notes: tuple[str, ...] = field(default=())


def route(g: nx.DiGraph, src: str, dst: str) -> list[tuple[str, str]]:
    """Link directions of the hop-shortest path src -> dst that relays only through switches
    (hosts do not forward); [] when src == dst."""
    if src == dst:
        return []
    def through(n):
        return n in (src, dst) or g.nodes[n].get("kind", "host") == "switch"
    path = nx.shortest_path(nx.subgraph_view(g, filter_node=through), src, dst)
    return list(zip(path, path[1:]))


def _held(t: np.ndarray, rate: np.ndarray, w0: float, w1: float) -> tuple[float, np.ndarray]:
    """(∫_w0^w1 of the sampled rate, the rates held inside the window): each sample's rate
    holds from the midpoint with the sample before to the midpoint with the one after
    (before the first sample the first rate, after the last the last)."""
    order = np.argsort(t)
    t, rate = t[order], rate[order]
    mid = (t[1:] + t[:-1]) / 2
    lo = np.concatenate([[-np.inf], mid])
    hi = np.concatenate([mid, [np.inf]])
    overlap = np.clip(np.minimum(hi, w1) - np.maximum(lo, w0), 0, None)
    return float(overlap @ rate), rate[overlap > 0]


def available_capacity(g: nx.DiGraph, window: tuple[float, float], links: pd.DataFrame | None = None,
                       flows: list[Flow] = ()) -> Capacity:
    """The capacity graph averaged over `window` (monitor time): configured rates integrated
    from `links` (columns link 'a->b', t, configured_bps; a direction with no samples keeps
    the graph's rate), less the bits each flow put on the directions along its path."""
    w0, w1 = window
    span = w1 - w0
    if span <= 0:
        raise ValueError(f"empty window {window}")
    bits = {e: g.edges[e]["capacity"] * span for e in g.edges}
    varies = False
    if links is not None and len(links):
        for label, df in links.groupby("link"):
            a, _, b = str(label).partition("->")
            if (a, b) not in bits:
                continue
            bits[(a, b)], held = _held(df["t"].to_numpy(float), df["configured_bps"].to_numpy(float), w0, w1)
            varies |= bool(len(held) and np.ptp(held) > 1e-9 * held.max())
    configured = dict(bits)
    for f in flows:
        share = max(0.0, min(f.end, w1) - max(f.start, w0))
        varies |= share > 0 and (f.start > w0 or f.end < w1)  # it starts or stops inside the window
        for e in route(g, f.src, f.dst):
            bits[e] -= f.bps * share
    h = g.copy()
    for e, b in bits.items():
        h.edges[e]["capacity"] = max(b, MIN_SHARE * configured[e]) / span
    return Capacity(h, "available", varies, window)


def time_dilation(run_dir: Path) -> float:
    """The run's `time_dilation` k from its config.yaml (emu/config/dilation.py; absent: 1), or,
    where that says `auto`, the k the run was given, from its meta.json. Its tables are in
    emulated time already; only what its roles were given (the capacity graph of roles/*.json)
    is in the dilated clock."""
    path = Path(run_dir) / "config.yaml"
    if not path.exists():
        return 1.0
    k = (yaml.safe_load(path.read_text()) or {}).get("time_dilation", 1.0)
    if k == "auto":
        try:
            k = json.loads((Path(run_dir) / "meta.json").read_text()).get("time_dilation")
        except (OSError, ValueError):
            k = None
    return float(k) if isinstance(k, (int, float)) and not isinstance(k, bool) and k >= 1 else 1.0


def measured_window(run_dir: Path, run) -> tuple[float, float] | None:
    """[first start, last end] of the measured iterations, in the monitor's clock; None
    without the monitor's t = 0 (`monitor_t0_wall`) or the iterations."""
    t0 = run.get("monitor_t0_wall")
    path = run_dir / "iterations.parquet"
    if t0 is None or pd.isna(t0) or not path.exists():
        return None
    its = pd.read_parquet(path, columns=["iteration", "start", "end"])
    its = its[measured(its["iteration"], run["workload.warmup"], run["workload.iterations"])]
    if its.empty:
        return None
    return float(its["start"].min() - t0), float(its["end"].max() - t0)


def cross_flows(run_dir: Path, run, last_t: float) -> tuple[list[Flow], list[str]]:
    """The flows that ran (the row's `cross_traffic`: achieved Mb/s) with their intervals
    (the run's config.yaml), and notes on any that could not be counted."""
    cell = run.get("cross_traffic")
    if not isinstance(cell, str) or not cell.strip():
        return [], []
    achieved = json.loads(cell)
    cfg_path = run_dir / "config.yaml"
    planned = (yaml.safe_load(cfg_path.read_text()).get("cross_traffic") or []) if cfg_path.exists() else []
    timeout = float(run.get("timeout_s") or np.inf)
    # the 0.3 s the iperf3 servers get to bind is wall clock: 0.3 / k emulated seconds
    released = FLOWS_START_S / time_dilation(run_dir)
    flows, notes = [], []
    for i, r in enumerate(achieved):
        if not r.get("started", True):
            continue
        if r.get("mbps") is None:
            notes.append(f"cross flow {i} reported no rate, counted as 0")
            continue
        p = planned[i] if i < len(planned) else {}
        start = max(float(p.get("start_s") or 0.0), released)
        stop = p.get("stop_s")
        end = min(float(stop) if stop is not None else np.inf, timeout, last_t)
        flows.append(Flow(r["src"], r["dst"], float(r["mbps"]) * 1e6, start, max(end, start)))
    return flows, notes


def _shaped(run) -> bool:
    return str(run.get("shaping") or "[]").strip() not in ("[]", "", "None", "nan")


def _shared(run) -> bool:
    return isinstance(run.get("cross_traffic"), str) and run["cross_traffic"].strip() not in ("", "[]")


def run_capacity(g: nx.DiGraph, run, run_dir: Path) -> Capacity:
    """What the run had: the configured graph when its bandwidth was neither shaped nor
    shared; otherwise `available_capacity` over its measured window, or the configured graph
    with the reason when the run's files cannot place it in time."""
    if not (_shaped(run) or _shared(run)):
        return Capacity(g, "configured")
    window = measured_window(run_dir, run)
    if window is None:
        return Capacity(g, "configured (no monitor clock in the row to place the run's window)")
    return run_capacities(g, run, run_dir, [window])[0]


def run_capacities(g: nx.DiGraph, run, run_dir: Path, windows: list[tuple[float, float]]) -> list[Capacity]:
    """`run_capacity` over each of `windows` (monitor time), the run's files read once."""
    if not (_shaped(run) or _shared(run)):
        return [Capacity(g, "configured")] * len(windows)
    links_path = run_dir / "links.parquet"
    links = pd.read_parquet(links_path, columns=["link", "t", "configured_bps"]) if links_path.exists() else None
    if links is None and _shaped(run):
        return [Capacity(g, "configured (no links.parquet for the shaped rates)")] * len(windows)
    last_t = float(links["t"].max()) if links is not None and len(links) else max(w1 for _, w1 in windows)
    flows, notes = cross_flows(run_dir, run, last_t)
    basis = "available" + (f" ({'; '.join(notes)})" if notes else "")
    out = []
    for window in windows:
        cap = available_capacity(g, window, links, flows)
        out.append(Capacity(cap.graph, basis, cap.varies, window, tuple(notes)))
    return out
