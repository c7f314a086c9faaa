"""Declarative topology: config -> Mininet `Topo` and capacity graph, no I/O.

The capacity graph (a networkx DiGraph, one edge per link direction with `capacity` in
bit/s) is what schedulers and analytic bounds see, so it is derived from the very same
config that builds the Mininet network.
"""
from __future__ import annotations

from typing import Any

import networkx as nx
from mininet.topo import Topo

from emu.config import StarTopology


class StarTopo(Topo):
    """One switch; each host reaches it over its own link, shaped both ways to `bw_mbps`."""

    def build(self, spec: StarTopology) -> None:  # type: ignore[override]
        sw = self.addSwitch(spec.switch)
        for h in spec.hosts:
            self.addHost(h.name)
            # TCLink shapes both ends: host->switch (up) and switch->host (down).
            self.addLink(h.name, sw, bw=h.bw_mbps)


def mininet_topo(spec: StarTopology) -> Topo:
    return StarTopo(spec=spec)


def capacity_graph(spec: StarTopology) -> nx.DiGraph:
    g = nx.DiGraph()
    g.add_node(spec.switch, kind="switch")
    for h in spec.hosts:
        g.add_node(h.name, kind="host")
        bps = h.bw_mbps * 1e6
        g.add_edge(h.name, spec.switch, capacity=bps)
        g.add_edge(spec.switch, h.name, capacity=bps)
    return g


def graph_to_json(g: nx.DiGraph) -> dict[str, Any]:
    return nx.node_link_data(g, edges="links")
