"""Analytic lower bounds on iteration time, from a run's capacity graph and compute time.

A training iteration cannot be shorter than its compute, nor than the time the busiest
link needs for the bytes that must cross it; with perfect overlap it is the larger:

    bound_s = max(compute_s, comm_bound_s)

`comm_bound_s` depends on the communication pattern:
- parameter-server family (fifo, bytescheduler, p3, mercury): every worker pushes its
  G gradient bytes and pulls G back, 1/S of them to and from each of the S servers, along
  shortest paths; each directed link's bytes over its capacity, the largest wins;
- ring all-reduce (ring, gloo): each worker sends 2(N-1)/N * G to its ring successor;
- any all-reduce among the workers alone (forest; and a floor for ring and gloo): for
  every split of the workers into two non-empty sides, each side needs G bytes of the
  other's contributions, so G must cross the minimum cut in each direction (max-flow
  between the sides). This `cut_bound_s` holds for every algorithm in which only workers
  compute; all 2^N - 2 splits are checked up to 12 workers, single workers beyond.

`efficiency = bound_s / measured median iteration time` (1.0 = as fast as possible).
"""
from __future__ import annotations

import itertools
import json
from functools import lru_cache
from pathlib import Path

import networkx as nx
import pandas as pd

from contracts.role_spec import RoleSpec

PS_FAMILY = {"fifo", "bytescheduler", "p3", "mercury"}
RING_FAMILY = {"ring", "gloo"}


def load_graph(run_dir: Path) -> nx.DiGraph:
    """The capacity graph the run's roles were given (bit/s per directed edge)."""
    spec = RoleSpec.model_validate_json(next((run_dir / "roles").glob("worker*.json")).read_text())
    return nx.node_link_graph(spec.topology, edges="links")


def _add_path(load: dict, g: nx.DiGraph, src: str, dst: str, nbytes: float) -> None:
    if src == dst:
        return
    path = nx.shortest_path(g, src, dst)
    for a, b in zip(path, path[1:]):
        load[(a, b)] = load.get((a, b), 0.0) + nbytes


def _busiest(load: dict, g: nx.DiGraph) -> float:
    return max((nbytes * 8 / g[a][b]["capacity"] for (a, b), nbytes in load.items()), default=0.0)


def ps_bound_s(g: nx.DiGraph, workers: list[str], servers: list[str], grad_bytes: float) -> float:
    load: dict = {}
    share = grad_bytes / len(servers)
    for w in workers:
        for s in servers:
            _add_path(load, g, w, s, share)
            _add_path(load, g, s, w, share)
    return _busiest(load, g)


def ring_bound_s(g: nx.DiGraph, workers: list[str], grad_bytes: float) -> float:
    n = len(workers)
    if n < 2:
        return 0.0
    load: dict = {}
    for i, w in enumerate(workers):
        _add_path(load, g, w, workers[(i + 1) % n], 2 * (n - 1) / n * grad_bytes)
    return _busiest(load, g)


def _cut_bps(g: nx.DiGraph, side_a: tuple[str, ...], side_b: tuple[str, ...]) -> float:
    h = g.copy()
    for w in side_a:
        h.add_edge("_src", w, capacity=float("inf"))
    for w in side_b:
        h.add_edge(w, "_dst", capacity=float("inf"))
    return nx.maximum_flow_value(h, "_src", "_dst")


def cut_bound_s(g: nx.DiGraph, workers: list[str], grad_bytes: float) -> float:
    if len(workers) < 2:
        return 0.0
    if len(workers) <= 12:
        sides = [c for k in range(1, len(workers)) for c in itertools.combinations(workers, k)]
    else:
        sides = [(w,) for w in workers]
    worst = 0.0
    for a in sides:
        b = tuple(w for w in workers if w not in a)
        for x, y in ((a, b), (b, a)):
            worst = max(worst, grad_bytes * 8 / _cut_bps(g, x, y))
    return worst


def comm_bound_s(scheduler: str, g: nx.DiGraph, workers: list[str], servers: list[str],
                 grad_bytes: float) -> tuple[float, float]:
    """(bound of this scheduler's pattern, cut bound of any worker-only all-reduce)."""
    cut = cut_bound_s(g, workers, grad_bytes)
    if scheduler in PS_FAMILY and servers:
        return ps_bound_s(g, workers, servers, grad_bytes), cut
    if scheduler in RING_FAMILY:
        return max(ring_bound_s(g, workers, grad_bytes), cut), cut
    return cut, cut


def annotate(runs: pd.DataFrame, sweep_dir: Path) -> pd.DataFrame:
    """Add comm_bound_s, cut_bound_s, bound_s and efficiency to the completed runs."""
    runs = runs.copy()
    for col in ("comm_bound_s", "cut_bound_s", "bound_s", "efficiency"):
        if col not in runs:
            runs[col] = float("nan")
    for i, run in runs.iterrows():
        if run.get("status") != "ok":
            continue
        run_dir = Path(sweep_dir) / run["run_id"]
        g = _graph(str(run_dir))
        workers, servers = json.loads(run["roles.workers"]), json.loads(run["roles.servers"])
        comm, cut = comm_bound_s(run["scheduler"], g, workers, servers, float(run["num_params"]) * 4)
        bound = max(float(run["compute_median_s"]), comm)
        runs.loc[i, ["comm_bound_s", "cut_bound_s", "bound_s", "efficiency"]] = [
            comm, cut, bound, bound / float(run["iter_time_median_s"])]
    return runs


@lru_cache(maxsize=256)
def _graph(run_dir: str) -> nx.DiGraph:
    return load_graph(Path(run_dir))
