"""Where one parameter server goes: the host where it has the highest rate on the configured
network (`roles.servers: best`). Pure: no I/O, the same answer on every machine.

With one server on host s, every worker w pushes the gradient G to s and pulls G back from
s, each along the hop-shortest path through switches (hosts do not forward); a worker on s
itself costs no link. Per unit of gradient a link direction carries one unit per worker
whose path crosses it, and the server's rate is

    rate(s) = min over loaded link directions of capacity / load      (bit/s of gradient),

so one iteration's traffic takes at least G x 8 / rate(s): `analysis/bounds.py` `ps_bound_s`
for S = 1 (tests/unit/test_placement.py checks they agree).

Every `NetSpec` is a tree (switches form one, each host hangs off one switch), so the
shortest path between two hosts is the tree path, and a link carries, both ways, one unit per
worker on the far side from s. Rooted and numbered in depth-first preorder, the subtree
under a link is an interval of that order, so the rate of every host comes from one walk:
for each host, the links above it (s inside the subtree: the workers outside load it) and
the links whose subtree lies before or after it in the order (s outside: the workers inside).
Linear in the network, where one shortest path per worker and candidate would be quadratic
(a 1,024-host racks network would take seconds to parse).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import accumulate

import networkx as nx

from emu.config.capacity import capacity_graph
from emu.config.topospec import NetSpec


def server_rates(net: NetSpec, workers: Sequence[str]) -> dict[str, float]:
    """rate(s) in bit/s for a single parameter server on each host s of `net` (NetSpec order),
    with `workers` (distinct hosts of `net`); inf where no link is loaded (every worker on s)."""
    g = capacity_graph(net)
    tree = g.to_undirected(as_view=True)
    if not nx.is_tree(tree) or any(tree.degree(h) != 1 for h in net.hosts):
        raise ValueError("placement needs a tree of switches with each host on one link (one path per host pair)")
    root = (net.switches or net.hosts)[0]
    edges = list(nx.dfs_edges(tree, root))  # (parent, child) in preorder: neighbours in NetSpec order
    order = [root] + [v for _, v in edges]
    pos = {v: i for i, v in enumerate(order)}
    parent = {v: u for u, v in edges}
    n = len(order)
    size = dict.fromkeys(order, 1)
    inside = dict.fromkeys(order, 0)  # workers in each node's subtree
    for w in workers:
        inside[w] = 1
    for v in reversed(order[1:]):
        size[parent[v]] += size[v]
        inside[parent[v]] += inside[v]
    total = len(workers)
    # Per child v, the link v - parent(v): its capacity (the slower direction: both carry the
    # same load), divided by the workers on the side without the server.
    below = [math.inf] * (n + 1)  # min over links whose subtree ends at position t (server after it)
    after = [math.inf] * (n + 1)  # min over links whose subtree starts at position t (server before it)
    through = dict.fromkeys(order, math.inf)  # min over the links above a node (server inside)
    for v in order[1:]:
        u = parent[v]
        cap = min(g[u][v]["capacity"], g[v][u]["capacity"])
        out = cap / inside[v] if inside[v] else math.inf
        below[pos[v] + size[v]] = min(below[pos[v] + size[v]], out)
        after[pos[v]] = min(after[pos[v]], out)
        through[v] = min(through[u], cap / (total - inside[v]) if total > inside[v] else math.inf)
    before_min = list(accumulate(below, min))  # links with subtree ending at or before t
    after_min = list(accumulate(reversed(after), min))[::-1]  # links with subtree starting at or after t
    return {s: min(through[s], before_min[pos[s]], after_min[pos[s] + 1]) for s in net.hosts}


def best_server(net: NetSpec, workers: Sequence[str]) -> str:
    """The host where one parameter server for `workers` has the highest rate (`server_rates`);
    among equals the first in NetSpec order. Every host is a candidate, workers' included (a
    server may share a host with a worker: it listens on another port)."""
    rates = server_rates(net, workers)
    return max(net.hosts, key=lambda h: rates[h])  # max keeps the first of equal keys
