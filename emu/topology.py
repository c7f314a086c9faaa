"""A resolved `NetSpec` as a Mininet `Topo` and as a capacity graph; no I/O.

The capacity graph (a networkx DiGraph, one edge per link direction with `capacity` in
bit/s) is what schedulers and analytic bounds see, so it comes from the very same
`NetSpec` that builds the Mininet network.
"""
from __future__ import annotations

from typing import Any

import networkx as nx
from mininet.topo import Topo

from emu.topospec import NetSpec


class SpecTopo(Topo):
    """Hosts, switches and plain links; the testbed shapes every link itself (emu/tc.py)."""

    def build(self, spec: NetSpec, host_cpu: dict[str, float] | None = None,  # type: ignore[override]
              limited_host=None) -> None:
        for h in spec.hosts:
            share = (host_cpu or {}).get(h)
            if share is None:
                self.addHost(h)
            else:  # a CFS bandwidth cgroup: `share` of the whole machine's CPU
                self.addHost(h, cls=limited_host, cpu=share)
        for i, s in enumerate(spec.switches):
            # Explicit dpid: Mininet derives one from digits in the name otherwise.
            self.addSwitch(s, dpid=f"{i + 1:x}")
        for ln in spec.links:
            self.addLink(ln.a, ln.b)


def mininet_topo(spec: NetSpec, host_cpu: dict[str, float] | None = None, limited_host=None) -> Topo:
    return SpecTopo(spec=spec, host_cpu=host_cpu, limited_host=limited_host)


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
