"""Lower bounds on iteration time: each run against the optimum of the model its scheduler
plays in, and against a model-free cut bound, on the bandwidth the run actually had.

A training iteration cannot be shorter than its compute, nor than the communication its
model needs at the best possible schedule; with perfect overlap it is the larger:

    bound_s = max(compute_s, comm_bound_s),     comm_bound_s = G * 8 / rate of the model,

G = 4 bytes x parameters. The model (`bound_model`) is the one the scheduler declares it plays
in (its class's `bound_model`, contracts/scheduler_info.py, read from the run's row or from the
registry's descriptions, analysis/catalog.py); this module knows models, never schedulers.
MODELS says what each one is (the report quotes it) and computes it:

- "parameter_server" (the PS family): every worker pushes G/S to and pulls G/S from
  each of the S servers along shortest paths; the busiest link direction decides. The
  pattern is fixed, so this is its optimum. Without servers: the cut bound.
- "ring_allreduce" (ring, gloo): ring all-reduce, every ring hop carrying 2(N-1)/N * G, in the *best*
  order. On a tree (every topology of the testbed is one) a ring must cross each link
  direction that separates workers at least once, and the order of a depth-first walk of
  the tree crosses each exactly once, so that order is optimal for every set of rates (ring's
  `order: topology` finds such an order: by exhaustive search up to 9 workers, beyond by the same
  depth-first walk). The ring in the order the ranks were given
  (gloo's, and ring's `order: given`) is kept beside it as `ring_rank_order_bound_s`; their
  efficiency shows what that order costs.
- "tree_packing" (forest): the optimal fractional packing of spanning trees of the workers,
  aggregating at hosts, a tree edge {u, v} carrying its slice both ways over the shortest
  paths u->v and v->u: the LP optimum the forest planner targets. Solved here by an
  independent formulation (`forest_rate_bps`), not the planner's column generation. Beyond
  MAX_LP_HOSTS hosts: the cut bound.
- "hierarchical_allreduce" (hierarchical): the workers under one switch form a group whose lowest rank
  leads it (`worker_groups`, the grouping schedulers/collective/hierarchical.py uses); each member sends
  G to its leader and gets G back, and the leaders run a ring in rank order, each hop carrying
  2(L-1)/L * G for L leaders. All stages are pipelined at once, so a link carries the sum of
  its loads in every stage (a leader's host link: its members' gradients and averages and its
  ring hops) and the busiest link direction decides. The pattern is fixed, so this is its optimum.
- "cut" (a scheduler that declares it, or none): the cut bound below.
- "none" (a plugin whose pattern no model fits): no bound; `bound_s`, `efficiency` and the
  model's other columns stay empty and the report says "no bound", rather than judge the run
  against a bound that does not apply. The model-free cut bound and `cut_efficiency` are kept.

`cut_bound_s` is model-free, for every run with 2 or more workers: for every split of the
workers into two sides, each side needs G bytes of the other's contributions, so G must
cross the maximum flow between the sides, in each direction (relaying through any node).
All 2^H - 2 splits of the H worker hosts up to 12 hosts; beyond, each host alone and, where
the graph is a tree (every testbed topology), the hosts beyond each link: on a tree the
tightest split is among those (a minimal cut's every link direction, alone, bounds a split
at least as tight), so the bound is the exhaustive one. It holds for every scheme that
moves each side's contribution uncompressed, parameter servers included.

Payload, not line rate: every scheduler here (gloo included) moves its bytes over TCP/IPv4 on
Ethernet with the emulated links' MTU of 1500, and the links are shaped on the frames they
carry. A full frame carries MSS = 1448 bytes of payload (1500 - 20 IP - 20 TCP - 12 TCP
timestamp option, on by default) in 1514 bytes that htb counts (the 14-byte Ethernet header
included), so no transport over these links delivers more than PAYLOAD_FRACTION = 1448/1514 =
0.9564 of a link's rate; iperf3 measures 0.956 through htb (docs/testbed.md: Testbed figures,
`bench/bench_schedulers.py transport`). Every bound is computed on that payload capacity;
`bound_line_rate_s` and `efficiency_line_rate` keep the model's bound at the raw line rate.

Capacity: `analysis/capacity.py`. A run whose bandwidth was neither shaped nor shared uses
the configured capacity graph; otherwise every bound is computed on the capacity available
to the job, averaged over its measured window (`bound_capacity` says which, and why when a
run's files could not place it in time); `bound_configured_s` keeps the same model's bound
on the configured rates. That average makes the bound one on the window's mean iteration,
so `efficiency = bound_s / measured` compares with the mean iteration
(`efficiency_basis` = "mean") when the capacity varied inside the window, and with the
median otherwise (1.0 = as fast as the model allows). `cut_efficiency` is
max(compute_s, cut_bound_s) / the same measured time.
"""
from __future__ import annotations

import itertools
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import networkx as nx
import numpy as np
import pandas as pd

from analysis import catalog
from analysis.capacity import route, run_capacity, time_dilation
from contracts.role_spec import RoleSpec
from contracts.scheduler_info import NO_BOUND

MAX_LP_HOSTS = 128  # the forest LP: 2-4 s at 128 hosts (forest_rate_bps); beyond, forest is judged by the cut bound
SPREAD = 0.1  # forest LP: the share of the rate its second LP gives every arc it can (forest_rate_bps)
EXHAUSTIVE_CUT_HOSTS = 12  # the cut bound tries all 2^H - 2 splits up to this many hosts (cut_splits)
COLUMNS = ["comm_bound_s", "cut_bound_s", "bound_s", "efficiency", "bound_model", "bound_capacity",
           "efficiency_basis", "bound_configured_s", "cut_efficiency", "ring_rank_order_bound_s",
           "bound_line_rate_s", "efficiency_line_rate"]
# TCP payload per byte htb counts: a 1514-byte frame (MTU 1500 + Ethernet header) carries MSS 1448
# (IPv4, TCP, timestamp option), see the module docstring.
MTU, ETHERNET_HEADER, IP_TCP_HEADERS = 1500, 14, 20 + 20 + 12
PAYLOAD_FRACTION = (MTU - IP_TCP_HEADERS) / (MTU + ETHERNET_HEADER)
_TEXT = {"bound_model", "bound_capacity", "efficiency_basis"}


def load_graph(run_dir: Path) -> nx.DiGraph:
    """The capacity graph of the run's network in emulated bit/s per directed edge: the graph
    its roles were given, whose rates a time-dilated run (emu/config/dilation.py) divided by its
    `time_dilation` k, multiplied back by k, so that every bound is in emulated time as the
    run's tables are."""
    spec = RoleSpec.model_validate_json(next((run_dir / "roles").glob("worker*.json")).read_text())
    g = nx.node_link_graph(spec.topology, edges="links")
    k = time_dilation(run_dir)
    if k != 1:
        for _, _, d in g.edges(data=True):
            d["capacity"] = d["capacity"] * k
    return g


# ---------------------------------------------------------------------------- fixed patterns
def _add_path(load: dict, g: nx.DiGraph, src: str, dst: str, nbytes: float) -> None:
    for e in route(g, src, dst):
        load[e] = load.get(e, 0.0) + nbytes


def _busiest(load: dict, g: nx.DiGraph) -> float:
    return max((nbytes * 8 / g.edges[e]["capacity"] for e, nbytes in load.items()), default=0.0)


def ps_loads(g: nx.DiGraph, workers: list[str], servers: list[str], grad_bytes: float) -> dict:
    """Bytes per link direction of the parameter-server pattern (`ps_bound_s`)."""
    load: dict = {}
    share = grad_bytes / len(servers)
    for w in workers:
        for s in servers:
            _add_path(load, g, w, s, share)
            _add_path(load, g, s, w, share)
    return load


def ps_bound_s(g: nx.DiGraph, workers: list[str], servers: list[str], grad_bytes: float) -> float:
    return _busiest(ps_loads(g, workers, servers, grad_bytes), g)


def ring_loads(g: nx.DiGraph, workers: list[str], grad_bytes: float) -> dict:
    """Bytes per link direction of the ring in the order given (`ring_bound_s`)."""
    n = len(workers)
    load: dict = {}
    for i, w in enumerate(workers if n > 1 else []):
        _add_path(load, g, w, workers[(i + 1) % n], 2 * (n - 1) / n * grad_bytes)
    return load


def ring_bound_s(g: nx.DiGraph, workers: list[str], grad_bytes: float) -> float:
    """The ring in the order given: each worker sends 2(N-1)/N * G to its successor."""
    if len(workers) < 2:
        return 0.0
    return _busiest(ring_loads(g, workers, grad_bytes), g)


def ring_order(g: nx.DiGraph, workers: list[str]) -> list[str]:
    """The workers in the order a depth-first walk of the (undirected) topology reaches
    their hosts, from the first worker's host; workers of one host stay together in their
    given order. On a tree this order crosses every link direction that separates workers
    exactly once, the minimum for any ring."""
    if len(workers) < 2:
        return list(workers)
    und = g.to_undirected(as_view=True)  # neighbours in name order: the same order on every machine
    rank = {node: i for i, node in enumerate(nx.dfs_preorder_nodes(und, workers[0], sort_neighbors=sorted))}
    return sorted(workers, key=lambda w: rank.get(w, len(rank)))  # stable: same-host order kept


def best_ring_bound_s(g: nx.DiGraph, workers: list[str], grad_bytes: float) -> float:
    return ring_bound_s(g, ring_order(g, workers), grad_bytes)


def worker_groups(g: nx.DiGraph, workers: list[str]) -> list[list[int]]:
    """Worker indices grouped by the switch their host hangs off (workers of one host
    together; several switches: the first by name; none: the host alone), each group in
    index order, groups by their first index (the leader). Mirrors
    schedulers/collective/hierarchical.py `groups`, which analysis may not import."""
    out: dict[str, list[int]] = {}
    for i, host in enumerate(workers):
        switches = {v for v in (*g.successors(host), *g.predecessors(host)) if g.nodes[v].get("kind") == "switch"}
        out.setdefault(min(switches, default=host), []).append(i)
    return list(out.values())


def hierarchical_bound_s(g: nx.DiGraph, workers: list[str], grad_bytes: float) -> float:
    """Members to their leader and back (G each way), the leaders' ring in rank order
    (2(L-1)/L * G per hop), every stage at once: the busiest link direction's total."""
    return _busiest(hierarchical_loads(g, workers, grad_bytes), g)


def hierarchical_loads(g: nx.DiGraph, workers: list[str], grad_bytes: float) -> dict:
    """Bytes per link direction of hierarchical all-reduce, all stages summed (`hierarchical_bound_s`)."""
    grouped = worker_groups(g, workers)
    load: dict = {}
    for group in grouped:
        leader = workers[group[0]]
        for i in group[1:]:
            _add_path(load, g, workers[i], leader, grad_bytes)
            _add_path(load, g, leader, workers[i], grad_bytes)
    leaders = [workers[group[0]] for group in grouped]
    n = len(leaders)
    for i, w in enumerate(leaders if n > 1 else []):
        _add_path(load, g, w, leaders[(i + 1) % n], 2 * (n - 1) / n * grad_bytes)
    return load


# ---------------------------------------------------------------------------- cut bound
def _cut_bps(g: nx.DiGraph, side_a: tuple[str, ...], side_b: tuple[str, ...]) -> float:
    h = g.copy()
    for w in side_a:
        h.add_edge("_src", w, capacity=float("inf"))
    for w in side_b:
        h.add_edge(w, "_dst", capacity=float("inf"))
    return nx.maximum_flow_value(h, "_src", "_dst")


def _link_sides(g: nx.DiGraph, hosts: list[str]) -> list[tuple[str, ...]]:
    """On a tree-shaped graph (links taken both ways), per link the hosts beyond it seen from
    hosts[0]: the split that removing the link makes. [] on any other graph."""
    und = g.to_undirected(as_view=True)
    if not nx.is_tree(und):
        return []
    below = nx.bfs_tree(und, hosts[0])
    out = []
    for _, child in below.edges:
        beyond = {child} | nx.descendants(below, child)
        out.append(tuple(w for w in hosts if w in beyond))
    return out


def cut_splits(g: nx.DiGraph, hosts: list[str], exhaustive: bool | None = None) -> list[tuple[str, ...]]:
    """One side of each split cut_bound_s tries, each split once. exhaustive (default: up to
    EXHAUSTIVE_CUT_HOSTS hosts): all 2^H - 2; else each host alone and, on a tree, the hosts
    beyond each link, which include the tightest split (cut_bound_s)."""
    if exhaustive is None:
        exhaustive = len(hosts) <= EXHAUSTIVE_CUT_HOSTS
    if exhaustive:  # the side that holds hosts[0]
        return [(hosts[0], *c) for k in range(len(hosts) - 1) for c in itertools.combinations(hosts[1:], k)]
    out: dict[frozenset[str], tuple[str, ...]] = {}
    for side in [*((w,) for w in hosts), *_link_sides(g, hosts)]:
        key = frozenset(side) if hosts[0] not in side else frozenset(hosts) - frozenset(side)
        if 0 < len(side) < len(hosts):
            out.setdefault(key, side)
    return list(out.values())


def cut_bound_s(g: nx.DiGraph, workers: list[str], grad_bytes: float, exhaustive: bool | None = None) -> float:
    """G over the smallest max flow between the two sides of the splits of `cut_splits`, each way."""
    hosts = list(dict.fromkeys(workers))  # workers sharing a host exchange without a link
    if len(hosts) < 2:
        return 0.0
    worst = 0.0
    for a in cut_splits(g, hosts, exhaustive):
        b = tuple(w for w in hosts if w not in a)
        for x, y in ((a, b), (b, a)):
            worst = max(worst, grad_bytes * 8 / _cut_bps(g, x, y))
    return worst


# ---------------------------------------------------------------------------- forest optimum
def _pair_loads(g: nx.DiGraph, workers: list[str]) -> tuple[list[tuple[str, str]], np.ndarray]:
    """(links, load[i, j, k]): how often a tree edge between workers i and j crosses link k
    (path i->j plus path j->i)."""
    n = len(workers)
    paths = {(a, b): route(g, a, b) for a in set(workers) for b in set(workers)}
    links = sorted({e for p in paths.values() for e in p})
    index = {e: k for k, e in enumerate(links)}
    load = np.zeros((n, n, len(links)))
    for i, j in itertools.permutations(range(n), 2):
        for e in paths[(workers[i], workers[j])] + paths[(workers[j], workers[i])]:
            load[i, j, index[e]] += 1
    return links, load


def _rooted_cuts(z: np.ndarray, tail: np.ndarray, head: np.ndarray, n: int) -> tuple[float, list[frozenset[int]]]:
    """(the least max flow from worker 0 to another under arc capacities z, and per other worker
    t the two minimum 0-t cuts as the sets on 0's side: those 0 still reaches in the residual
    network, and all but those that still reach t). networkx's Edmonds-Karp: each augmentation
    empties a residual arc exactly, so float capacities are safe."""
    from networkx.algorithms.flow import edmonds_karp

    tiny = 1e-12 * z.max()
    flow = nx.DiGraph()
    flow.add_nodes_from(range(n))
    flow.add_weighted_edges_from(((int(u), int(v), c) for u, v, c in zip(tail, head, z) if c > tiny),
                                 weight="capacity")
    least, sides = math.inf, []
    for t in range(1, n):
        r = edmonds_karp(flow, 0, t)
        least = min(least, r.graph["flow_value"])
        left = nx.DiGraph((u, v) for u, v, d in r.edges(data=True) if d["capacity"] - d["flow"] > tiny)
        left.add_nodes_from(range(n))
        sides += [frozenset(nx.descendants(left, 0) | {0}), frozenset(range(n)) - nx.ancestors(left, t) - {t}]
    return least, sides


def forest_rate_bps(g: nx.DiGraph, workers: list[str]) -> float:
    """The LP optimum of fractional spanning-tree packing (gradient bit/s all-reduced).

    Formulation (directed cuts, Edmonds' branching theorem): orient every tree away from
    worker 0. Arc (u, v) between workers gets capacity z_uv >= 0; a tree edge carries its
    slice both ways, so z_uv loads link k by load[u, v, k] and sum z * load <= c. The z
    contain a fractional packing of arborescences of total rate L rooted at 0 exactly when
    every set S of workers that holds 0 and not all of them has z(S -> rest) >= L (Edmonds),
    and every arborescence is a spanning tree. So

        max L  s.t.  sum_uv z_uv load[u, v, k] <= c_k,  z(S -> rest) >= L for every such S,  z >= 0.

    Its cut rows are generated (HiGHS dual simplex, networkx max flow). Each round: (1) the LP
    over the cuts so far, first those around each single worker, bounds the optimum L from
    above; (2) among the z within the links that meet those cuts at L, a second LP takes one
    that gives as many arcs as it can SPREAD * L (max sum min(z_uv, SPREAD L)): a vertex of
    the first LP is as sparse as its rows allow and leaves most sets of workers cut off, so
    its cuts come one handful a round (minutes at 64 hosts), where this z is connected
    wherever capacity is spare; (3) if that z carries L from worker 0 to every worker (max
    flow), L is reached and is the optimum; else its minimum 0-t cuts below L are rows the
    LP lacks (`_rooted_cuts`), added. Both bounds meet within 1e-8. Workers sharing a host
    count once (their tree edges are free). Infinite when no link constrains (fewer than two
    hosts). 0.4-0.7 s at 64 hosts on racks and stars, 0.2 s on average and 1.9 s at most over
    the 548 settings of bench/bench_forest_scale.py (16-64 workers; the flow formulation used
    before took 8 s at 32 and minutes at 64), 2-4 s at 128; more than MAX_LP_HOSTS is refused."""
    from scipy.optimize import linprog
    from scipy.sparse import csr_matrix, hstack, identity, vstack

    workers = list(dict.fromkeys(workers))  # workers of one host: joined by free tree edges, one node
    n = len(workers)
    if n > MAX_LP_HOSTS:
        raise ValueError(f"forest LP: {n} hosts, more than {MAX_LP_HOSTS}")
    links, load = _pair_loads(g, workers)
    if n < 2 or not links:
        return math.inf
    tail, head = (np.array(x) for x in zip(*itertools.permutations(range(n), 2)))
    na, m = len(tail), len(links)
    loads = csr_matrix(load[tail, head].T)                   # link x arc
    cap = np.array([g.edges[e]["capacity"] for e in links])
    scale = cap.max()

    def crossing(side: frozenset[int]) -> np.ndarray:        # the arcs from side to the rest
        inside = np.isin(np.arange(n), list(side))
        return inside[tail] & ~inside[head]

    everyone = frozenset(range(n))
    cuts = [frozenset({0}), *(everyone - {t} for t in range(1, n))]
    known = set(cuts)
    while True:
        cross = csr_matrix(np.array([crossing(s) for s in cuts], float))
        k = len(cuts)
        # (1) variables [L, z], capacities in units of the largest: max L, L - z(S -> rest) <= 0
        res = linprog(np.append(-1.0, np.zeros(na)),
                      A_ub=vstack([hstack([csr_matrix((m, 1)), loads]), hstack([np.ones((k, 1)), -cross])]).tocsc(),
                      b_ub=np.append(cap / scale, np.zeros(k)), bounds=(0, None), method="highs-ds")
        if res.status != 0:
            raise RuntimeError(f"forest LP: {res.message}")
        rate = float(res.x[0]) * scale
        # (2) variables [z, s] in units of L: max sum s, s <= z, s <= SPREAD, z(S -> rest) >= 1 - 1e-9
        res = linprog(np.append(np.zeros(na), -np.ones(na)),
                      A_ub=vstack([hstack([loads, csr_matrix((m, na))]), hstack([-cross, csr_matrix((k, na))]),
                                   hstack([-identity(na), identity(na)])]).tocsc(),
                      b_ub=np.concatenate([cap / rate, np.full(k, -(1 - 1e-9)), np.zeros(na)]),
                      bounds=[(0, None)] * na + [(0, SPREAD)] * na, method="highs-ds")
        if res.status != 0:
            raise RuntimeError(f"forest LP (spread): {res.message}")
        z = res.x[:na]
        carried, sides = _rooted_cuts(z, tail, head, n)
        if carried >= 1 - 1e-8:
            return rate
        new = [s for s in dict.fromkeys(sides) if s not in known and z[crossing(s)].sum() < 1 - 1e-8]
        if not new:
            raise RuntimeError(f"forest LP: the cuts' optimum {rate:.6g} bit/s is carried only to "
                               f"{carried * rate:.6g}, and no cut is violated")
        known.update(new)
        cuts += new


def forest_bound_s(g: nx.DiGraph, workers: list[str], grad_bytes: float) -> float:
    rate = forest_rate_bps(g, workers)
    return 0.0 if math.isinf(rate) else grad_bytes * 8 / rate


# ---------------------------------------------------------------------------- the models
Bound = Callable[[nx.DiGraph, list[str], list[str], float], float]  # (g, workers, servers, G bytes) -> s


@dataclass(frozen=True)
class Model:
    """A bound model: what it is (the report quotes it), its optimum's communication time, and
    where it applies (elsewhere a run is judged by the cut bound)."""

    description: str
    bound: Bound
    applies: Callable[[list[str], list[str]], bool] = lambda workers, servers: True


CUT = "cut"
NO_BOUND_TEXT = ("no bound: the scheduler declares that no model fits it, so its efficiency is left empty; the cut "
                 "bound below still applies")
MODELS: dict[str, Model] = {  # every name of contracts.scheduler_info.BoundModel
    "parameter_server": Model(
        "parameter server: each worker pushes and pulls G/S to and from each of the S servers along "
        "shortest paths; the busiest link direction's bytes over its rate",
        ps_bound_s, lambda workers, servers: bool(servers)),
    "ring_allreduce": Model(
        "ring all-reduce in the best order (a depth-first walk of the topology tree, optimal on a tree): "
        "every ring hop carries 2(N-1)/N x G; the busiest link direction's bytes over its rate",
        lambda g, workers, servers, grad: best_ring_bound_s(g, workers, grad)),
    "tree_packing": Model(
        "the optimal forest: the largest rate at which fractional spanning trees of the workers "
        "(aggregation at hosts, each tree edge carrying its slice both ways over shortest paths) fit "
        "the links, an LP solved independently of the planner; G over that rate",
        lambda g, workers, servers, grad: forest_bound_s(g, workers, grad),
        lambda workers, servers: len(set(workers)) <= MAX_LP_HOSTS),
    "hierarchical_allreduce": Model(
        "hierarchical all-reduce: each worker sends G to its group's leader (the lowest rank "
        "under its switch) and gets G back, and the leaders run a ring in rank order (2(L-1)/L x G per "
        "hop); all stages pipelined, the busiest link direction's summed bytes over its rate",
        lambda g, workers, servers, grad: hierarchical_bound_s(g, workers, grad)),
    CUT: Model(
        "G must cross the maximum flow between the two sides of every split of the workers, each way, "
        "whatever the scheme (the cut bound)",
        lambda g, workers, servers, grad: cut_bound_s(g, workers, grad)),
}


# ---------------------------------------------------------------------------- per run
def bound_model(declared: str | None, workers: list[str], servers: list[str]) -> str:
    """The model a run is judged in: the one its scheduler declares where it applies; "cut"
    for a scheduler that declares none (or one unknown here), for a parameter server without
    servers, and for tree packing beyond MAX_LP_HOSTS hosts (the report then names the cut
    bound as its bound); "none" for a scheduler that declares no bound fits it."""
    if declared == NO_BOUND:
        return NO_BOUND
    model = MODELS.get(declared) if declared is not None else None
    return declared if model is not None and model.applies(workers, servers) else CUT


def model_bound_s(model: str, g: nx.DiGraph, workers: list[str], servers: list[str], grad_bytes: float) -> float:
    """Communication time of one iteration at the model's optimum on capacity graph g."""
    return MODELS[model].bound(g, workers, servers, grad_bytes)


def payload_graph(g: nx.DiGraph) -> nx.DiGraph:
    """g with every capacity scaled to the TCP payload it can carry (PAYLOAD_FRACTION)."""
    out = g.copy()
    for _, _, d in out.edges(data=True):
        d["capacity"] = d["capacity"] * PAYLOAD_FRACTION
    return out


@dataclass(frozen=True)
class RunPattern:
    """What a run's bounds are computed from, its capacity apart."""
    line_graph: nx.DiGraph     # the configured capacity graph, at the line rate
    workers: list[str]
    servers: list[str]
    grad_bytes: float
    model: str                 # bound_model's answer for the run's scheduler
    compute_s: float           # no iteration is faster than its compute


def run_pattern(run, run_dir: Path) -> RunPattern:
    workers, servers = json.loads(run["roles.workers"]), json.loads(run["roles.servers"])
    declared = catalog.of_run(run)  # a labelled variant: its scheduler's
    return RunPattern(_graph(str(run_dir)), workers, servers, float(run["num_params"]) * 4,
                      bound_model(None if declared is None else declared.bound_model, workers, servers),
                      float(run["compute_median_s"]))


def comm_bound_s(p: RunPattern, avail: nx.DiGraph, cut: float | None = None) -> float:
    """The pattern's communication bound on payload capacity graph `avail`: its model's, the cut
    bound (`cut`, when already computed) for "cut", NaN for "none"."""
    if p.model == NO_BOUND:
        return float("nan")
    if p.model == CUT:
        return cut if cut is not None else cut_bound_s(avail, p.workers, p.grad_bytes)
    return model_bound_s(p.model, avail, p.workers, p.servers, p.grad_bytes)


def run_bounds(run, run_dir: Path) -> dict:
    """Every bound column of one completed run (see the module docstring)."""
    p = run_pattern(run, run_dir)
    line_g, workers, servers, grad, model = p.line_graph, p.workers, p.servers, p.grad_bytes, p.model
    cap = run_capacity(line_g, run, run_dir)
    g, avail = payload_graph(line_g), payload_graph(cap.graph)
    cut = cut_bound_s(avail, workers, grad)
    if model == NO_BOUND:
        return _no_bound(run, cap, cut, ring_bound_s(avail, workers, grad))
    line = model_bound_s(model, cap.graph, workers, servers, grad)
    comm = comm_bound_s(p, avail, cut)
    configured = comm if cap.graph is line_g else model_bound_s(model, g, workers, servers, grad)
    compute = p.compute_s
    mean = cap.varies and pd.notna(run.get("iter_time_mean_s"))
    measured_s = float(run["iter_time_mean_s"] if mean else run["iter_time_median_s"])
    bound = max(compute, comm)
    return {"comm_bound_s": comm, "cut_bound_s": cut, "bound_s": bound, "efficiency": bound / measured_s,
            "bound_model": model, "bound_capacity": cap.basis, "efficiency_basis": "mean" if mean else "median",
            "bound_configured_s": max(compute, configured), "cut_efficiency": max(compute, cut) / measured_s,
            "ring_rank_order_bound_s": ring_bound_s(avail, workers, grad),
            "bound_line_rate_s": max(compute, line), "efficiency_line_rate": max(compute, line) / measured_s}


def _no_bound(run, cap, cut: float, ring_rank_order: float) -> dict:
    """A run whose scheduler declares no bound model: the cut bound only, the model's columns empty."""
    compute = float(run["compute_median_s"])
    mean = cap.varies and pd.notna(run.get("iter_time_mean_s"))
    measured_s = float(run["iter_time_mean_s"] if mean else run["iter_time_median_s"])
    nan = float("nan")
    return {"comm_bound_s": nan, "cut_bound_s": cut, "bound_s": nan, "efficiency": nan, "bound_model": NO_BOUND,
            "bound_capacity": cap.basis, "efficiency_basis": "mean" if mean else "median", "bound_configured_s": nan,
            "cut_efficiency": max(compute, cut) / measured_s, "ring_rank_order_bound_s": ring_rank_order,
            "bound_line_rate_s": nan, "efficiency_line_rate": nan}


def annotate(runs: pd.DataFrame, sweep_dir: Path) -> pd.DataFrame:
    """Add the bound columns (COLUMNS) to the completed runs; other rows keep NaN. The
    physics checks (analysis/physics.py) go into each verdict here, where the bounds they
    need are computed, so every caller's verdict includes them."""
    from analysis import physics  # it reads capacity graphs through this module

    runs = runs.copy()
    for col in COLUMNS:
        if col not in runs:
            runs[col] = None if col in _TEXT else float("nan")
        elif col in _TEXT:
            runs[col] = runs[col].astype(object)
    for i, run in runs.iterrows():
        if run.get("status") != "ok":
            continue
        try:
            values = run_bounds(run, Path(sweep_dir) / run["run_id"])
        except (OSError, StopIteration, ValueError, KeyError, RuntimeError, nx.NetworkXException) as e:
            values = {"bound_capacity": f"no bound: {type(e).__name__}: {e}"}  # the row stays, its bounds NaN
        for col, value in values.items():
            runs.at[i, col] = value
    return physics.apply(runs, sweep_dir)


@lru_cache(maxsize=256)
def _graph(run_dir: str) -> nx.DiGraph:
    return load_graph(Path(run_dir))
