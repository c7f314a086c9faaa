"""What bandwidth the job has, from its own probes: the forest plans on this, never on the
emulator's configuration (a real deployment cannot read tc).

The job knows the network's structure (which hosts hang off which switch: the capacity
graph's nodes and links) but not its rates. A probe runs rounds of TCP flows between workers
over the job's own connections; after a slow-start skip, each receiver counts what arrived on
every connection in the round's window (`Connection.bytes_arrived`: data segments as they
come, in order or not), flows of earlier rounds still draining included. Each round then
reads, for every link, the sum of what the flows whose path crosses it delivered: the link's
capacity where the round saturates it, less where it does not.

Which reading. A round's reading is off by what a queue elsewhere on the paths held at the
window's ends: on a 15 Mb/s uplink (14.35 of payload) the rounds that saturate it read
12.2-16.2 Mb/s, so the largest over-read by up to 13%. Where a tenant's UDP takes 50 of a
75 Mb/s uplink (23.9 left), TCP reads 12-25 Mb/s, most rounds below what is left: there the
median of the saturating rounds under-read by 8-10%, and a plan paced at it ran at 0.79 of its
bound where the largest reading's ran at 0.91 (pacing above a link's rate costs little, below
it costs the difference). The estimate is the upper quartile (QUANTILE) of the readings within
BAND of the largest (the rounds that saturate the link, give or take that noise): 1.00-1.09
of the payload rate on the 15 Mb/s uplink, 0.94-0.99 of what the tenant leaves. A link only one
round saturates gets that round's reading.

Why the receiver. The sender's count of acknowledged bytes read 10 of 14.3 Mb/s on a 15 Mb/s
uplink and, counted on every connection, up to 18.9: it jumps by up to a congestion window
when a lost segment is repaired, and on a link loaded both ways the acknowledgements wait
in the reverse direction's queue (100 ms there), so a window of 0.33 s can count 0.43 s of
deliveries. Counted where the bytes arrive, the same rounds read 13.3-15.1.

Rounds (`probe_rounds`): every worker to every other at once; a ring, worker i to i + 1,
one flow on each host link and direction; then, for each worker k, k to all others and all
others to k at once. All-to-all saturates the links that bottleneck a spread-out pattern
(oversubscribed uplinks); the fan rounds saturate a fast host's own link, which all-to-all
leaves half idle when the hosts it sends to are slow; the ring measures a slow host's link
with one flow, where several flows into a small queue lose packets and stall (five flows
into a 5 Mb/s link read 3.4 Mb/s). A link that no round saturates is underestimated: the
planner then loads it at most as much as the busiest round did, which costs rate only if
the optimum needs more of it. n workers take n + 2 rounds.

A worker's own link is saturated by its fan round alone, so its estimate is one reading:
on uniform sites (9 workers, 100 Mb/s, 95.6 of payload) a run's lowest host-link estimate was
84.7-89.5 Mb/s and the plans came out at 50.9-52.3 Mb/s against a 53.8 optimum. `fan_rounds: 2`
(ForestParams) runs the fans twice at start-up, n more rounds (2.3 s more for 9 workers):
lowest 93.2-93.6, plans at 53.3-53.4 (three runs each). It did not raise the forest's
efficiency there (0.76-0.89 and 0.82-0.87, the latter runs red at CPU idle 0.33-0.34: the
trees' store-and-forward holds it) nor on racks with a tenant (0.91-0.92 both, held by the
contended uplink), and pacing's margin forgives the under-read, so it is off by default.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from schedulers.core.linkmodel import LinkModel, star_graph

Pair = tuple[int, int]
BAND = 0.25        # readings this far below a link's largest still count as saturating it
QUANTILE = 0.75    # of those readings, the estimate


def probe_rounds(n: int, fan_rounds: int = 1) -> list[list[Pair]]:
    """(sender, receiver) flows of each round: all-to-all, a ring (one flow per host link and
    direction), then a fan in and out of each worker, `fan_rounds` times over."""
    if n < 2:
        return []
    everyone = [(i, j) for i in range(n) for j in range(n) if i != j]
    ring = [(i, (i + 1) % n) for i in range(n)] if n > 2 else [(0, 1), (1, 0)]
    fans = [[(k, j) for j in range(n) if j != k] + [(j, k) for j in range(n) if j != k] for k in range(n)]
    return [everyone, ring, *fans * fan_rounds]


def shared_links(model: LinkModel, nodes: list[str]) -> np.ndarray:
    """Per link (model.links order): on some worker's path and touching no worker's node, the
    links all-to-all and the ring saturate and a re-plan's shared probe re-reads (forest_replan.py)."""
    own = set(nodes)
    return np.array([u not in own and v not in own for u, v in model.links], bool) & model.hop_load.any(axis=(0, 1))


def structure(topology: dict[str, Any] | None, hosts: list[str]) -> tuple[dict[str, Any], list[str], LinkModel]:
    """The graph whose capacities the probe estimates, the node of each worker in it, and its
    link model. Without a capacity graph (or with every worker on one host, as on loopback) a
    star of one link per worker is assumed, as the configured-rate planner does."""
    n = len(hosts)
    if topology is not None:
        model = LinkModel.from_graph(topology, hosts)
        if n < 2 or model.pair_load.any():
            return topology, list(hosts), model
    star, nodes = star_graph(n)
    return star, nodes, LinkModel.uniform_star(n)


def estimate(model: LinkModel, rounds: list[dict[Pair, float]]) -> np.ndarray:
    """Per link (model.links order), bit/s: the QUANTILE of the rounds' readings within BAND of
    the largest (see the module docstring). A link no worker's path crosses gets the largest
    estimate (it constrains no plan)."""
    loads = np.zeros((max(len(rounds), 1), len(model.links)))
    for r, rates in enumerate(rounds):
        for (i, j), bps in rates.items():
            if bps > 0 and math.isfinite(bps):
                loads[r] += bps * model.hop_load[i, j]
    saturating = np.where(loads >= (1 - BAND) * loads.max(axis=0), loads, np.nan)   # never all NaN
    est = np.nanquantile(saturating, QUANTILE, axis=0)
    if not est.any():
        raise ValueError("the probe measured no bandwidth on any link")
    return np.where(est > 0, est, est.max())


def with_capacities(graph: dict[str, Any], model: LinkModel, capacity: np.ndarray) -> dict[str, Any]:
    """`graph` (node-link data, the planner's input) with its links at `capacity` (bit/s, in
    model.links order); only the rates change."""
    rate = {link: float(c) for link, c in zip(model.links, capacity, strict=True)}
    links = [{"source": e["source"], "target": e["target"], "capacity": rate[(e["source"], e["target"])]}
             for e in graph.get("links", graph.get("edges", []))]
    return {"directed": True, "multigraph": False, "graph": {},
            "nodes": [{"id": n["id"], "kind": n.get("kind", "host")} for n in graph["nodes"]], "links": links}


def skeleton(topology: dict[str, Any] | None) -> list:
    """What of the capacity graph the job may know (nodes, kinds, links; no rates): workers
    compare its fingerprint when they connect."""
    if topology is None:
        return []
    nodes = sorted((n["id"], n.get("kind", "host")) for n in topology["nodes"])
    links = sorted((e["source"], e["target"]) for e in topology.get("links", topology.get("edges", [])))
    return [nodes, links]
