"""Which trees the `forest` scheduler uses and how much of every gradient each one carries.

Topology-adaptive forest packing (Zhang, Wu and Li, INFOCOM 2021), as a pure function of
the capacity graph: no I/O, deterministic, so every worker computes the same plan.

Model. Only hosts aggregate or replicate; switches just forward. A tree spans all
workers; its logical edge {u, v} carries the tree's slice up (reduce, child -> parent) and
down (broadcast, parent -> child) at the same rate, so a tree run at rate y (bit/s of
gradient) puts y on every physical link of the hop-shortest path u->v and of v->u, once
per tree edge that routes over it. With a_T(e) that count for tree T and c(e) the link's
capacity, a forest is feasible when  sum_T y_T a_T(e) <= c(e)  for every link e, and it
all-reduces S bits of gradient in S / sum_T y_T (pipelined). Each tree's slice is
y_T / sum y. So the best forest solves the packing LP

    OPT = max sum_T y_T   s.t.  sum_T y_T a_T(e) <= c(e),  y >= 0,

over all spanning trees T of the workers. Given link prices w, a tree costs
sum_e w(e) a_T(e) = sum over its edges {u,v} of the price of the paths u->v and v->u, so
the cheapest tree is a minimum spanning tree of the workers under those pair prices: an
exact oracle.

Algorithm (the plan). That LP solved exactly by column generation with the MST oracle as
pricing, started from a path and the n stars (the shallowest trees, which the depth LP
below can only choose if they are among the columns: from a path alone, a probe's
near-equal estimates of six equal links gave a depth-3 tree 65% of the data, and 112 ms
iterations where the stars took 87): each round solves the LP over the trees found so
far (HiGHS dual simplex), prices the links by its duals w and adds the MST under w if it
costs less than 1, a tree that can raise the rate; when none does, the restricted LP's
optimum is the optimum. `upper_bound` is the best Lagrangian bound
sum_e c(e) w(e) / min_T cost_w(T) seen on the way: valid for any prices, it certifies the
optimum (they meet at the end). Among forests of that rate over the trees found, a second
LP picks the shallowest (a chunk waits one hop per level); trees under MIN_FRACTION of the
data are dropped where the others reach the rate without them (a small tree the rate needs
stays). The plan's rate is the optimum within the solver's tolerance (the depth LP may give
up 1e-7 of it; tests check 1e-6 against analysis/bounds.py's independent formulation), and
the rates are scaled to fit every link exactly. One solve serves the plan and `optimum`.
Planning time (bench/bench_forest_plan.py): about 20 ms at 9 workers on racks, 60 ms at 16,
0.25 s at 64, plus the one-time import of scipy.optimize (about 0.2 s) in a new process.

Determinism: links, routes and trees are enumerated in name and index order, path prices
are summed link by link (no BLAS), MST ties go to the lowest index and the simplex is
serial, so the same input on the same build gives the same plan; workers compare its
digest on connect all the same.

`epsilon` (ForestParams.epsilon) was the accuracy of the Garg–Könemann approximation this
planner used before (rate >= (1 - eps)^3 OPT, 1-2 s at 16 workers, 96 s at 64); the exact
plan meets that guarantee for every eps, so epsilon is only recorded in the plan.

Both the plan and the optimum are optimal among forests of host-aggregated trees over
shortest paths; schemes where switches aggregate, or routing over several paths, can do better.
"""
from __future__ import annotations

import dataclasses
import json
import math
import zlib
from typing import Any

import numpy as np

from schedulers.core.linkmodel import LinkModel

DEFAULT_EPSILON = 0.03  # accepted and recorded only: the plan is exact (module docstring)
MAX_ROUNDS = 2000  # column generation: a safety net; 64 workers on racks take about 64 rounds
MIN_FRACTION = 1e-3  # a tree carrying less is not worth its connections and frames; dropped
RATE_SLACK = 1e-7  # the shallowest forest may give up this much of the optimum (the solver's tolerance)




# ---------------------------------------------------------------------------- the oracle
def min_spanning_tree(price: np.ndarray) -> tuple[tuple[int, int], ...]:
    """Prim on a dense symmetric price matrix; ties go to the lowest index (deterministic)."""
    n = price.shape[0]
    if n < 2:
        return ()
    in_tree = np.zeros(n, bool)
    in_tree[0] = True
    best = price[0].copy()
    best[0] = np.inf
    via = np.zeros(n, int)
    edges = []
    for _ in range(n - 1):
        v = int(np.argmin(best))
        u = int(via[v])
        edges.append((min(u, v), max(u, v)))
        in_tree[v] = True
        best[v] = np.inf
        closer = (price[v] < best) & ~in_tree
        best[closer] = price[v][closer]
        via[closer] = v
    return tuple(sorted(edges))


def _pair_price(model: LinkModel, w: np.ndarray) -> np.ndarray:
    """(n, n): price of a tree edge {i, j}, the price of path i->j plus that of j->i. Each
    path's few links are summed in index order (no BLAS), so equal paths price equally."""
    path = np.append(w, 0.0)[model.path_links].sum(axis=2)
    return path + path.T


# ---------------------------------------------------------------------------- packing
def _restricted_lp(model: LinkModel, a: np.ndarray, scale: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """max sum y over the trees whose link loads are the columns of `a` (m x k); returns
    (y in bit/s, link prices w = the LP's duals). The LP sees rates in units of `scale`
    (default: the largest capacity, so capacities are at most 1); the duals do not depend on it."""
    from scipy.optimize import linprog  # here: importing the registry must stay cheap
    scale = model.capacity.max() if scale is None else scale
    res = linprog(-np.ones(a.shape[1]), A_ub=a, b_ub=model.capacity / scale, bounds=(0, None),
                  method="highs-ds")
    if res.status != 0:
        raise RuntimeError(f"forest LP failed: {res.message}")
    return res.x * scale, np.maximum(-res.ineqlin.marginals, 0.0)


def _column_generation(model: LinkModel, max_rounds: int):
    """The packing LP by column generation from a path and the n stars: (trees, their loads as the
    columns of a (m x k), rates y, optimum, upper bound).

    Each round solves the LP over the trees so far, prices the links by its duals w, and
    adds the minimum spanning tree if it costs less than 1 (a tree that would raise the
    optimum). value / cost_w(MST) is an upper bound in every round; at the end it is 1."""
    n = model.num_workers
    path = tuple((i, i + 1) for i in range(n - 1))
    stars = [tuple(sorted((min(k, j), max(k, j)) for j in range(n) if j != k)) for k in range(n)]
    trees = list(dict.fromkeys([path, *stars]))   # stars: the shallow trees, so the depth LP can choose them
    cols = [model.tree_load(t) for t in trees]
    bound = math.inf
    for _ in range(max_rounds):
        a = np.stack(cols, axis=1)
        y, w = _restricted_lp(model, a)
        value = float(y.sum())
        tree = min_spanning_tree(_pair_price(model, w))
        load = model.tree_load(tree)
        cost = float(load @ w)
        if cost > 0:
            bound = min(bound, value / cost)
        if cost >= 1 - 1e-9 or tree in trees:
            break
        trees.append(tree)
        cols.append(load)
    return trees[:a.shape[1]], a, y, value, max(bound, value)   # (a tree added in the last round is unsolved)


def lp_optimum(model: LinkModel, max_rounds: int = MAX_ROUNDS) -> tuple[float, float]:
    """(optimum, upper bound) of the packing LP by column generation (see the module docstring)."""
    _, _, _, value, bound = _column_generation(model, max_rounds)
    return value, bound


def _shallowest(model: LinkModel, a: np.ndarray, radius: np.ndarray, rate: float) -> np.ndarray | None:
    """Among forests of (almost) this rate over the trees of `a`, one whose trees are shallowest
    on average: a chunk waits one hop per level, so depth is the pipeline's start-up latency.
    None if these trees cannot reach the rate within RATE_SLACK.

    Both LPs count rates in units of `rate` (the forest's slices: they sum to 1), so the
    solver's absolute tolerances (1e-7) are relative to the rate. Whether the trees reach it
    is the question their own optimum answers, an LP that is always feasible; asked of the
    depth LP as its feasibility instead, a forest short by about the tolerance left HiGHS
    undecided (model status Unknown; 64 workers on 4 racks of 16, ranks round-robin)."""
    from scipy.optimize import linprog
    reach = _restricted_lp(model, a, scale=rate)[0].sum() / rate
    if reach < 1 - RATE_SLACK:
        return None
    res = linprog(radius, A_ub=np.vstack([a, -np.ones((1, a.shape[1]))]),
                  b_ub=np.append(model.capacity / rate, -min(1 - RATE_SLACK, reach * (1 - 1e-9))),
                  bounds=(0, None), method="highs-ds")
    if res.status != 0:
        raise RuntimeError(f"forest LP (depth) failed: {res.message}")
    return res.x * rate


def _few_trees(model: LinkModel, a: np.ndarray, radius: np.ndarray, rate: float) -> np.ndarray:
    """The shallowest forest at `rate` over the trees of `a`, without the trees under
    MIN_FRACTION of it that the others can do without (all at once, else one at a time,
    smallest first): the rate comes first, so a small tree it needs stays."""
    y = _shallowest(model, a, radius, rate)
    if y is None:
        raise RuntimeError("forest LP (depth): the column generation's trees do not reach its optimum")
    allowed = np.ones(len(y), bool)
    while True:         # every pass forbids at least one more tree, or returns
        small = np.flatnonzero((y > 0) & (y <= MIN_FRACTION * y.sum()))
        if not small.size:
            return y
        singles = [[k] for k in sorted(small, key=lambda k: (y[k], k))] if small.size > 1 else []
        for drop in [small, *singles]:
            fewer = allowed.copy()
            fewer[drop] = False
            z = _shallowest(model, a[:, fewer], radius[fewer], rate)
            if z is not None:
                break
        else:
            return y
        allowed = fewer
        y = np.zeros(len(y))
        y[allowed] = z


# ---------------------------------------------------------------------------- the plan
@dataclasses.dataclass(frozen=True)
class Tree:
    root: int
    parent: tuple[int, ...]     # parent[rank]; -1 at the root
    fraction: float             # share of every gradient this tree reduces and broadcasts
    rate: float                 # bit/s of gradient it carries in the plan

    def children(self, rank: int) -> list[int]:
        return [v for v, p in enumerate(self.parent) if p == rank]

    @property
    def depth(self) -> int:
        def d(v):
            return 0 if self.parent[v] < 0 else 1 + d(self.parent[v])
        return max(d(v) for v in range(len(self.parent)))


@dataclasses.dataclass(frozen=True)
class ForestPlan:
    hosts: tuple[str, ...]
    trees: tuple[Tree, ...]
    rate: float                 # sum of the trees' rates: gradient bit/s all-reduced
    optimum: float              # LP optimum (column generation)
    upper_bound: float          # certified bound on the optimum
    ring_rate: float            # ring all-reduce on the same links, for comparison
    epsilon: float
    assumed_topology: bool      # True: no capacity graph given, a uniform unit star assumed

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (infinite rates, e.g. one worker, become null)."""
        def num(x):
            return None if math.isinf(x) else x
        return {
            "algorithm": "LP by column generation (MST pricing), then the shallowest forest at its rate",
            "hosts": list(self.hosts),
            "rate_bps": num(self.rate), "optimum_bps": num(self.optimum),
            "upper_bound_bps": num(self.upper_bound), "ring_rate_bps": num(self.ring_rate),
            "of_optimum": None if math.isinf(self.optimum) else self.rate / self.optimum,
            "epsilon": self.epsilon, "assumed_topology": self.assumed_topology,
            "trees": [{"root": t.root, "parent": list(t.parent), "fraction": t.fraction,
                       "rate_bps": num(t.rate), "depth": t.depth} for t in self.trees],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ForestPlan:
        def num(x):
            return math.inf if x is None else float(x)
        trees = tuple(Tree(t["root"], tuple(t["parent"]), t["fraction"], num(t["rate_bps"])) for t in d["trees"])
        return cls(tuple(d["hosts"]), trees, num(d["rate_bps"]), num(d["optimum_bps"]),
                   num(d["upper_bound_bps"]), num(d["ring_rate_bps"]), d["epsilon"], d["assumed_topology"])

    def digest(self) -> int:
        """32-bit fingerprint of what the data plane depends on: workers compare it on connect."""
        core = [[t.root, list(t.parent), repr(t.fraction)] for t in self.trees]
        return zlib.crc32(json.dumps(core).encode())


def _bfs(adj: list[list[int]], r: int) -> tuple[list[int], list[int]]:
    """(parent, hops from r) in a tree."""
    n = len(adj)
    parent, dist, order = [-1] * n, [0] * n, [r]
    seen = [False] * n
    seen[r] = True
    for u in order:
        for v in adj[u]:
            if not seen[v]:
                seen[v], parent[v], dist[v] = True, u, dist[u] + 1
                order.append(v)
    return parent, dist


def _orient(edges: tuple[tuple[int, int], ...], n: int, root_uses: list[int]) -> tuple[int, tuple[int, ...], int]:
    """Root a tree at a centre (fewest hops to the farthest worker: the shortest pipeline),
    preferring the worker that is root of the fewest trees so far, to spread the roots.
    Returns (root, parent, radius). Eccentricities by a double sweep: in a tree the farthest
    worker from any worker is an end of the diameter found from the far end of a BFS."""
    adj: list[list[int]] = [[] for _ in range(n)]
    for u, v in edges:
        adj[u].append(v)
        adj[v].append(u)
    _, d0 = _bfs(adj, 0)
    _, da = _bfs(adj, d0.index(max(d0)))
    _, db = _bfs(adj, da.index(max(da)))
    ecc = [max(x, y) for x, y in zip(da, db)]
    root = min(range(n), key=lambda r: (ecc[r], root_uses[r], r))
    root_uses[root] += 1
    return root, tuple(_bfs(adj, root)[0]), ecc[root]


def plan_forest(topology: dict[str, Any] | None, hosts: list[str],
                epsilon: float = DEFAULT_EPSILON) -> ForestPlan:
    """The forest for workers on `hosts` (hosts[i] = worker i's node in the capacity graph).

    topology None: a uniform star of unit links is assumed (rates are then in link units).
    Workers that share a host exchange data without crossing a link; if all do, nothing
    constrains the plan and the same uniform star is assumed. `epsilon` is recorded in the
    plan and does not change it (the plan is the LP optimum; see the module docstring)."""
    n = len(hosts)
    model = LinkModel.uniform_star(n) if topology is None else LinkModel.from_graph(topology, hosts)
    if n > 1 and not model.hop_load.any():
        model = LinkModel.uniform_star(n)
    if n == 1:
        tree = Tree(0, (-1,), 1.0, math.inf)
        return ForestPlan(tuple(hosts), (tree,), math.inf, math.inf, math.inf, math.inf, epsilon, model.assumed)
    candidates, a, y, optimum, bound = _column_generation(model, MAX_ROUNDS)
    radius = np.array([_orient(t, n, [0] * n)[2] for t in candidates], float)
    y = _few_trees(model, a, radius, optimum)
    keep = y > 0
    y = y * min(1.0, model.rate_of(a @ y))     # within the solver's tolerance, made exact
    order = sorted(np.flatnonzero(keep), key=lambda k: (-y[k], candidates[k]))
    rate = float(sum(y[k] for k in order))
    root_uses = [0] * n
    trees = []
    for k in order:
        root, parent, _ = _orient(candidates[k], n, root_uses)
        trees.append(Tree(root, parent, float(y[k]) / rate, float(y[k])))
    return ForestPlan(tuple(hosts), tuple(trees), rate, optimum, bound, model.ring_rate(),
                      epsilon, model.assumed)
