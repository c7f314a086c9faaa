"""A resolved `NetSpec` as a capacity graph; no I/O.

The capacity graph (a networkx DiGraph, one edge per link direction with `capacity` in
bit/s) is what schedulers and analytic bounds see, so it comes from the very same
`NetSpec` that builds the Mininet network (emu/testbed/topology.py). Config parsing uses it
too (`roles.servers: best`, emu/config/placement.py), so it needs no Mininet.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import networkx as nx

from emu.config.topospec import NetSpec

if TYPE_CHECKING:
    pass


def capacity_graph(spec: NetSpec) -> nx.DiGraph:
    g = nx.DiGraph()
    for h in spec.hosts:
        g.add_node(h, kind="host")
    for s in spec.switches:
        g.add_node(s, kind="switch")
    for ln in spec.links:
        g.add_edge(ln.a, ln.b, capacity=ln.ab_mbps * 1e6)
        g.add_edge(ln.b, ln.a, capacity=ln.ba_mbps * 1e6)
    return g


def graph_to_json(g: nx.DiGraph) -> dict[str, Any]:
    return nx.node_link_data(g, edges="links")
