"""What a job's links can carry: directed links with capacities, and which links each worker pair's path crosses.

`LinkModel` is built from the capacity graph a role spec carries (node-link data; only
hosts aggregate or replicate, switches just forward, routes are hop-shortest and
deterministic). The forest planner packs trees on it, the ring orders its ranks by it, and
the bandwidth probe writes measured capacities into it.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from collections import deque
from typing import Any

import numpy as np


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

    @functools.cached_property
    def path_links(self) -> np.ndarray:
        """(n, n, L) int: the links of path i->j in index order, padded with m (no link)."""
        n, m = self.hop_load.shape[0], self.hop_load.shape[2]
        counts = self.hop_load.astype(int)
        hops = counts.sum(axis=2)
        out = np.full((n, n, max(int(hops.max(initial=0)), 1)), m)
        i, j, k = np.nonzero(counts)
        reps = counts[i, j, k]
        i, j, k = np.repeat(i, reps), np.repeat(j, reps), np.repeat(k, reps)
        start = np.cumsum(hops.ravel()) - hops.ravel()
        slot = np.arange(len(k)) - start[i * n + j]
        out[i, j, slot] = k
        return out

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
        graph, hosts = star_graph(n)
        return dataclasses.replace(cls.from_graph(graph, hosts), assumed=True)

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


def star_graph(n: int) -> tuple[dict[str, Any], list[str]]:
    """The star assumed without a capacity graph (node-link data, unit links) and its
    workers' nodes, worker0..worker{n-1}."""
    hosts = [f"worker{i}" for i in range(n)]
    nodes = [{"id": "switch", "kind": "switch"}] + [{"id": h, "kind": "host"} for h in hosts]
    links = [{"source": h, "target": "switch", "capacity": 1.0} for h in hosts]
    links += [{"source": "switch", "target": h, "capacity": 1.0} for h in hosts]
    return {"directed": True, "multigraph": False, "graph": {}, "nodes": nodes, "links": links}, hosts


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
