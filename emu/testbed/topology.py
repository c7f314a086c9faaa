"""A resolved `NetSpec` as a Mininet `Topo`; no I/O. Mininet is imported only here, where a
`Topo` is built: parsing must not need Mininet.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from emu.config.topospec import NetSpec

if TYPE_CHECKING:
    from mininet.topo import Topo


def mininet_topo(spec: NetSpec, host_cpu: dict[str, float] | None = None, limited_host=None) -> Topo:
    """Hosts, switches and plain links; the testbed shapes every link itself (emu/testbed/tc.py)."""
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
