"""A resolved `NetSpec` as a Mininet `Topo` and as a capacity graph; no I/O.

The capacity graph (a networkx DiGraph, one edge per link direction with `capacity` in
bit/s) is what schedulers and analytic bounds see, so it comes from the very same
`NetSpec` that builds the Mininet network. Config parsing uses it too (`roles.servers:
best`, emu/placement.py), so Mininet is imported only where a `Topo` is built: parsing
must not need Mininet.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import networkx as nx

from emu.topospec import NetSpec

if TYPE_CHECKING:
    from mininet.topo import Topo


def mininet_topo(spec: NetSpec, host_cpu: dict[str, float] | None = None, limited_host=None) -> Topo:
    """Hosts, switches and plain links; the testbed shapes every link itself (emu/tc.py)."""
    from mininet.topo import Topo

    topo = Topo()
    for h in spec.hosts:
        share = (host_cpu or {}).get(h)
        if share is None:
            topo.addHost(h)
        else:  # a CFS bandwidth cgroup: `share` of the whole machine's CPU
            topo.addHost(h, cls=limited_host, cpu=share)
    for i, s in enumerate(spec.switches):
        # Explicit dpid: Mininet derives one from digits in the name otherwise.
        topo.addSwitch(s, dpid=f"{i + 1:x}")
    for ln in spec.links:
        topo.addLink(ln.a, ln.b)
    return topo


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
