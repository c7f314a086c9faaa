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

Algorithm (the plan). Garg–Könemann multiplicative weights with that MST oracle: it
returns a forest of rate >= (1 - eps)^3 * OPT (Garg and Könemann, SIAM J. Comput. 2007;
the bound is the conservative one of their packing analysis). Its trees are then
re-weighted by one LP restricted to them (simplex, so a basic solution with at most one
tree per link): that only raises the rate and drops most of the trees. Among forests of
that rate a second LP picks the shallowest (a chunk waits one hop per level), and trees
under MIN_FRACTION of the data are dropped (the reported rate is what remains).

Optimum (what the plan is compared with). The same LP solved exactly by column
generation with the MST oracle as pricing, started from a single path tree, independent
of the plan. `upper_bound` is the best Lagrangian bound sum_e c(e) w(e) / min_T cost_w(T)
seen on the way: valid for any prices, it certifies the optimum (they meet at the end).
Both are optimal among forests of host-aggregated trees over shortest paths; schemes
where switches aggregate, or routing over several paths, can do better.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import math
import zlib
from collections import deque
from typing import Any

import numpy as np

DEFAULT_EPSILON = 0.03  # (1 - eps)^3 >= 0.91; a smaller eps plans closer to the optimum, slower
MIN_FRACTION = 1e-3  # a tree carrying less is not worth its connections and frames; dropped


# ---------------------------------------------------------------------------- the model
@dataclasses.dataclass(frozen=True)
class LinkModel:
    """Links (directed, capacity in bit/s) and, per worker pair, how often the path i->j
    crosses each link (`hop_load[i, j, e]`); a tree edge between i and j loads
    `pair_load[i, j] = hop_load[i, j] + hop_load[j, i]`."""

    links: tuple[tuple[str, str], ...]
    capacity: np.ndarray            # (m,)
    hop_load: np.ndarray            # (n, n, m)
    assumed: bool = False           # True: no topology was given; a uniform star is assumed

    @functools.cached_property
    def pair_load(self) -> np.ndarray:
        """(n, n, m), symmetric in i, j."""
        return self.hop_load + self.hop_load.transpose(1, 0, 2)

    @property
    def num_workers(self) -> int:
        return self.pair_load.shape[0]

    @classmethod
    def from_graph(cls, topology: dict[str, Any], hosts: list[str]) -> LinkModel:
        """`topology`: networkx node-link data (`edges="links"`) of a directed capacity graph,
        nodes with kind host|switch; `hosts[i]` is worker i's node."""
        kinds = {n["id"]: n.get("kind", "host") for n in topology["nodes"]}
        out: dict[str, list[str]] = {n: [] for n in kinds}
        cap: dict[tuple[str, str], float] = {}
        for e in topology.get("links", topology.get("edges", [])):
            u, v = e["source"], e["target"]
            if "capacity" not in e:
                raise ValueError(f"capacity graph: link {u}->{v} has no capacity")
            if e["capacity"] <= 0:
                raise ValueError(f"capacity graph: link {u}->{v} has capacity {e['capacity']}")
            cap[(u, v)] = float(e["capacity"])
            out[u].append(v)
        for i, h in enumerate(hosts):
            if h not in kinds:
                raise ValueError(f"worker {i}'s host {h!r} is not in the capacity graph")
        links = tuple(sorted(cap))
        index = {link: k for k, link in enumerate(links)}
        paths: dict[tuple[str, str], list[int]] = {}
        for src in sorted(set(hosts)):
            prev = _bfs_through_switches(src, out, kinds)
            for dst in set(hosts):
                if dst == src:
                    paths[(src, dst)] = []
                    continue
                if dst not in prev:
                    raise ValueError(f"capacity graph: no path from {src} to {dst} through switches")
                hops, v = [], dst
                while v != src:
                    hops.append(index[(prev[v], v)])
                    v = prev[v]
                paths[(src, dst)] = hops
        n, m = len(hosts), len(links)
        hop_load = np.zeros((n, n, m))
        for i in range(n):
            for j in range(n):
                for k in paths[(hosts[i], hosts[j])]:
                    hop_load[i, j, k] += 1
        return cls(links, np.array([cap[link] for link in links]), hop_load)

    @classmethod
    def uniform_star(cls, n: int) -> LinkModel:
        """No topology given: n workers, each on its own unit-capacity link to one switch."""
        hosts = [f"worker{i}" for i in range(n)]
        nodes = [{"id": "switch", "kind": "switch"}] + [{"id": h, "kind": "host"} for h in hosts]
        links = [{"source": h, "target": "switch", "capacity": 1.0} for h in hosts]
        links += [{"source": "switch", "target": h, "capacity": 1.0} for h in hosts]
        model = cls.from_graph({"nodes": nodes, "links": links}, hosts)
        return dataclasses.replace(model, assumed=True)

    def tree_load(self, edges: tuple[tuple[int, int], ...]) -> np.ndarray:
        if not edges:
            return np.zeros(len(self.links))
        i, j = np.array(edges).T
        return self.pair_load[i, j].sum(axis=0)

    def rate_of(self, load: np.ndarray) -> float:
        """The most a scheme with this per-link load (per unit of rate) can carry."""
        used = load > 0
        return float(np.min(self.capacity[used] / load[used])) if used.any() else math.inf

    def ring_rate(self) -> float:
        """Ring all-reduce over ranks in order."""
        return self.ring_rate_of(list(range(self.num_workers)))

    def ring_rate_of(self, order: list[int]) -> float:
        """Ring all-reduce along `order` (a list of ranks): every hop carries 2(n-1)/n of the gradient."""
        n = len(order)
        if n < 2:
            return math.inf
        load = self.hop_load[order, order[1:] + order[:1]].sum(axis=0)
        return self.rate_of(load * 2 * (n - 1) / n)


def _bfs_through_switches(src: str, out: dict[str, list[str]], kinds: dict[str, str]) -> dict[str, str]:
    """Hop-shortest paths from `src`, relaying only through switches (hosts do not forward);
    neighbours in name order, so the routes are deterministic."""
    prev: dict[str, str] = {}
    seen = {src}
    queue = deque([src])
    while queue:
        u = queue.popleft()
        if u != src and kinds[u] != "switch":
            continue
        for v in sorted(out[u]):
            if v not in seen:
                seen.add(v)
                prev[v] = u
                queue.append(v)
    return prev


# ---------------------------------------------------------------------------- the oracle
def min_spanning_tree(price: np.ndarray) -> tuple[tuple[int, int], ...]:
    """Prim on a dense symmetric price matrix; ties go to the lowest index (deterministic)."""
    n = price.shape[0]
    if n < 2:
        return ()
    in_tree = np.zeros(n, bool)
    in_tree[0] = True
    best = price[0].copy()
    via = np.zeros(n, int)
    edges = []
    for _ in range(n - 1):
        cand = np.where(in_tree, np.inf, best)
        v = int(np.argmin(cand))
        u = int(via[v])
        edges.append((min(u, v), max(u, v)))
        in_tree[v] = True
        closer = price[v] < best
        best = np.where(closer, price[v], best)
        via = np.where(closer, v, via)
    return tuple(sorted(edges))


def _pair_price(model: LinkModel, w: np.ndarray) -> np.ndarray:
    return model.pair_load @ w


def _tree_cost(model: LinkModel, edges, w: np.ndarray) -> float:
    return float(model.tree_load(edges) @ w)


# ---------------------------------------------------------------------------- packing
def garg_konemann(model: LinkModel, epsilon: float) -> dict[tuple[tuple[int, int], ...], float]:
    """Fractional tree packing of rate >= (1 - eps)^3 OPT: route the bottleneck amount along
    the cheapest tree, raise the price of each link by (1 + eps * its use / capacity), stop
    when the priced capacity sum_e c w reaches 1, then scale down to feasibility."""
    c = model.capacity / model.capacity.max()
    m = len(c)
    delta = (1 + epsilon) * ((1 + epsilon) * m) ** (-1 / epsilon)
    w = delta / c
    flow: dict[tuple[tuple[int, int], ...], float] = {}
    while c @ w < 1:
        tree = min_spanning_tree(_pair_price(model, w))
        load = model.tree_load(tree)
        used = load > 0
        amount = float(np.min(c[used] / load[used]))
        flow[tree] = flow.get(tree, 0.0) + amount
        w = w * (1 + epsilon * amount * load / c)
    scale = math.log((1 + epsilon) / delta, 1 + epsilon)
    return {t: y / scale * model.capacity.max() for t, y in flow.items()}


def _restricted_lp(model: LinkModel, trees: list[tuple[tuple[int, int], ...]]):
    """max sum y over the given trees; returns (y, link prices w normalised to max c = 1)."""
    from scipy.optimize import linprog  # here: importing the registry must stay cheap
    scale = model.capacity.max()
    a = np.stack([model.tree_load(t) for t in trees], axis=1)
    res = linprog(-np.ones(len(trees)), A_ub=a, b_ub=model.capacity / scale, bounds=(0, None),
                  method="highs-ds")
    if res.status != 0:
        raise RuntimeError(f"forest LP failed: {res.message}")
    return res.x * scale, np.maximum(-res.ineqlin.marginals, 0.0)


def _shallowest(model: LinkModel, trees: list[tuple[tuple[int, int], ...]], rate: float) -> np.ndarray:
    """Among forests of (almost) this rate over these trees, one whose trees are shallowest
    on average: a chunk waits one hop per level, so depth is the pipeline's start-up latency."""
    from scipy.optimize import linprog
    n, scale = model.num_workers, model.capacity.max()
    a = np.stack([model.tree_load(t) for t in trees], axis=1)
    radius = np.array([_radius(t, n) for t in trees], float)
    res = linprog(radius, A_ub=np.vstack([a, -np.ones((1, len(trees)))]),
                  b_ub=np.append(model.capacity / scale, -rate / scale * (1 - 1e-7)),
                  bounds=(0, None), method="highs-ds")
    if res.status != 0:
        raise RuntimeError(f"forest LP (depth) failed: {res.message}")
    return res.x * scale


def _radius(edges: tuple[tuple[int, int], ...], n: int) -> int:
    return _orient(edges, n, [0] * n)[2]


def lp_optimum(model: LinkModel, max_rounds: int = 2000) -> tuple[float, float]:
    """(optimum, upper bound) of the packing LP by column generation from one path tree.

    Each round solves the LP over the trees so far, prices the links by its duals w, and
    adds the minimum spanning tree if it costs less than 1 (a tree that would raise the
    optimum). value / cost_w(MST) is an upper bound in every round; at the end it is 1."""
    n = model.num_workers
    trees = [tuple((i, i + 1) for i in range(n - 1))]
    bound = math.inf
    value = 0.0
    for _ in range(max_rounds):
        y, w = _restricted_lp(model, trees)
        value = float(y.sum())
        tree = min_spanning_tree(_pair_price(model, w))
        cost = _tree_cost(model, tree, w)
        if cost > 0:
            bound = min(bound, value / cost)
        if cost >= 1 - 1e-9 or tree in trees:
            break
        trees.append(tree)
    return value, max(bound, value)


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
            "algorithm": f"garg-konemann (eps={self.epsilon}) + restricted LP; "
                         "optimum: LP by column generation",
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


def _orient(edges: tuple[tuple[int, int], ...], n: int, root_uses: list[int]) -> tuple[int, tuple[int, ...], int]:
    """Root a tree at a centre (fewest hops to the farthest worker: the shortest pipeline),
    preferring the worker that is root of the fewest trees so far, to spread the roots."""
    adj = [[] for _ in range(n)]
    for u, v in edges:
        adj[u].append(v)
        adj[v].append(u)

    def bfs(r):
        parent, dist, order = [-1] * n, [0] * n, [r]
        for u in order:
            for v in sorted(adj[u]):
                if v != r and parent[v] < 0 and v not in order:
                    parent[v], dist[v] = u, dist[u] + 1
                    order.append(v)
        return parent, max(dist)

    ecc = [bfs(r)[1] for r in range(n)]
    root = min(range(n), key=lambda r: (ecc[r], root_uses[r], r))
    root_uses[root] += 1
    return root, tuple(bfs(root)[0]), ecc[root]


def plan_forest(topology: dict[str, Any] | None, hosts: list[str],
                epsilon: float = DEFAULT_EPSILON) -> ForestPlan:
    """The forest for workers on `hosts` (hosts[i] = worker i's node in the capacity graph).

    topology None: a uniform star of unit links is assumed (rates are then in link units).
    Workers that share a host exchange data without crossing a link; if all do, nothing
    constrains the plan and the same uniform star is assumed."""
    n = len(hosts)
    model = LinkModel.uniform_star(n) if topology is None else LinkModel.from_graph(topology, hosts)
    if n > 1 and not model.pair_load.any():
        model = LinkModel.uniform_star(n)
    if n == 1:
        tree = Tree(0, (-1,), 1.0, math.inf)
        return ForestPlan(tuple(hosts), (tree,), math.inf, math.inf, math.inf, math.inf, epsilon, model.assumed)
    candidates = sorted(garg_konemann(model, epsilon))
    y, _ = _restricted_lp(model, candidates)
    y = _shallowest(model, candidates, float(y.sum()))
    keep = [(t, float(v)) for t, v in zip(candidates, y, strict=True) if v > MIN_FRACTION * y.sum()]
    rate = sum(v for _, v in keep)
    keep.sort(key=lambda tv: (-tv[1], tv[0]))
    root_uses = [0] * n
    trees = []
    for edges, v in keep:
        root, parent, _ = _orient(edges, n, root_uses)
        trees.append(Tree(root, parent, v / rate, v))
    optimum, bound = lp_optimum(model)
    return ForestPlan(tuple(hosts), tuple(trees), rate, optimum, bound, model.ring_rate(),
                      epsilon, model.assumed)
