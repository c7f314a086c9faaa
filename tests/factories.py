"""What tests build their inputs from: the one base experiment and its variants, config files,
topologies (one helper per kind of thing a test needs: a config's topology section, a resolved
NetSpec, a capacity graph, node-link data as role specs carry it), the committed mini sweep and a
synthetic profile. Jobs of real schedulers on loopback are in tests/loopback_jobs.py."""
from __future__ import annotations

import copy
from pathlib import Path

import networkx as nx
import yaml

from emu.config.capacity import capacity_graph
from emu.config.plan import set_dotted
from emu.config.topospec import NetSpec, StarTopology
from tasks import _sections  # noqa: F401 - the config sections every test validates against
from tests.conftest import REPO
from workloads import profile_file

# ---------------------------------------------------------------------------- configs


def star_topology(**mbps: float) -> dict:
    """A config's star topology section: one host per keyword, in order, at that many Mb/s."""
    return {"kind": "star", "hosts": [{"name": h, "bw_mbps": r} for h, r in mbps.items()]}


# The base experiment: a server and two workers on a star, the tiny CNN, fifo.
GOOD = {
    "name": "t",
    "topology": star_topology(ps=100, w0=10, w1=10),
    "roles": {"servers": ["ps"], "workers": ["w0", "w1"]},
    "workload": {"model": "cnn", "preset": "tiny", "iterations": 3},
    "scheduler": "fifo",
}


def experiment(base: dict = GOOD, **top) -> dict:
    """A deep copy of `base` (the base experiment) with the top-level keys in `top` replaced or added."""
    cfg = copy.deepcopy(base)
    cfg.update(copy.deepcopy(top))
    return cfg


def variant(key: str, value, base: dict = GOOD) -> dict:
    """A deep copy of `base` with one dotted key (`topology.hosts.1.bw_mbps`) set."""
    cfg = copy.deepcopy(base)
    set_dotted(cfg, key, value)
    return cfg


def write(tmp_path: Path, cfg: dict, name: str = "c.yaml") -> Path:
    """`cfg` as the YAML file `name` in `tmp_path`."""
    return dump(tmp_path / name, cfg)


def dump(path: Path, obj) -> Path:
    """`obj` as YAML at `path`."""
    path.write_text(yaml.safe_dump(obj))
    return path


# ---------------------------------------------------------------------------- topologies

G = 1e6  # gradient bytes, in the bounds' closed forms
MBPS = 1e6


def secs(mbps: float) -> float:
    """Seconds to move G at `mbps`."""
    return G * 8 / (mbps * MBPS)


def star_spec(*rates, names=None, **kw) -> NetSpec:
    """A resolved star topology: hosts h0.. (or `names`) at `rates`, each Mb/s both ways or (up, down), or
    the config's other star keys (`count`, `bw_mbps`, `heterogeneity`, ...) in `kw`."""
    if rates:
        names = names or [f"h{i}" for i in range(len(rates))]
        kw["hosts"] = [{"name": n, "bw_mbps": r} if not isinstance(r, tuple) else
                       {"name": n, "up_mbps": r[0], "down_mbps": r[1]} for n, r in zip(names, rates, strict=True)]
    return StarTopology.model_validate({"kind": "star", **kw}).resolve()


def star_capacity(rates: dict[str, float]) -> nx.DiGraph:
    """The capacity graph emu/config/capacity.py builds for a star of hosts `rates` (name: Mb/s)."""
    return capacity_graph(star_spec(*rates.values(), names=list(rates)))


def star_graph(rates, up=None, extra=()) -> tuple[nx.DiGraph, list[str]]:
    """A star as capacity_graph builds it, by hand: switch s1, host h{i} at rates[i] Mb/s (or the
    hosts and rates of a dict), uplink `up[i]` if given, plus `extra` hosts (name, Mb/s) that are not
    workers; (the graph, the workers)."""
    named = list(rates.items()) if isinstance(rates, dict) else [(f"h{i}", c) for i, c in enumerate(rates)]
    g = nx.DiGraph()
    g.add_node("s1", kind="switch")
    hosts = [(h, c, (up[i] if up else c)) for i, (h, c) in enumerate(named)]
    for name, down, upr in hosts + [(n, c, c) for n, c in extra]:
        g.add_node(name, kind="host")
        g.add_edge(name, "s1", capacity=upr * MBPS)
        g.add_edge("s1", name, capacity=down * MBPS)
    return g, [h for h, _, _ in hosts]


def star_links(rates, up=None) -> dict:
    """star_graph's graph as networkx node-link data, as role specs carry a topology."""
    return nx.node_link_data(star_graph(rates, up)[0], edges="links")


def racks_graph(sizes, host_mbps, uplink_mbps, extra=()) -> tuple[nx.DiGraph, list[str]]:
    """Racks of the given sizes (hosts r{i}h{j} on ToR s{i+1}, uplinks to core s0 at
    uplink_mbps[i] or one rate for all); `extra` = (name, rack, Mb/s) hosts off the worker list."""
    g = nx.DiGraph()
    g.add_node("s0", kind="switch")
    hosts = []
    for r, size in enumerate(sizes):
        tor, up = f"s{r + 1}", uplink_mbps[r] if isinstance(uplink_mbps, (list, tuple)) else uplink_mbps
        g.add_node(tor, kind="switch")
        g.add_edge(tor, "s0", capacity=up * MBPS)
        g.add_edge("s0", tor, capacity=up * MBPS)
        members = [(f"r{r}h{j}", host_mbps) for j in range(size)] + [(n, c) for n, rr, c in extra if rr == r]
        for h, c in members:
            g.add_node(h, kind="host")
            g.add_edge(h, tor, capacity=c * MBPS)
            g.add_edge(tor, h, capacity=c * MBPS)
        hosts += [f"r{r}h{j}" for j in range(size)]
    return g, hosts


# ---------------------------------------------------------------------------- committed data, profiles

MINI = REPO / "tests" / "data" / "results" / "mini"  # a committed sweep: runs, tables, a trace


def is_png(path: Path) -> bool:
    """A PNG of some size (a figure with something in it) at `path`."""
    return path.exists() and path.stat().st_size > 5000 and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def synthetic_profile(layers, model="cnn", preset="tiny", batch_size=32, lead=0.0, tail=0.0) -> profile_file.Profile:
    """layers: [(forward_s, [(numel, backward_s), ...]), ...] in forward order; backward
    produces the last layer's tensors first."""
    keys, out_layers, key = [], [], 0
    for _, tensors in layers:
        keys.append(list(range(key, key + len(tensors))))
        key += len(tensors)
    tensors = []
    for i in reversed(range(len(layers))):
        for k, (numel, gap) in zip(keys[i], layers[i][1], strict=True):
            tensors.append(profile_file.Tensor(key=k, name=f"l{i}.t{k}", shape=[numel], numel=numel, layer=i,
                                               backward_s=gap))
    for i, (fwd, ts) in enumerate(layers):
        out_layers.append(profile_file.Layer(name=f"l{i}", keys=keys[i], forward_s=fwd,
                                             backward_s=sum(g for _, g in ts)))
    return profile_file.Profile(
        model=model, preset=preset, batch_size=batch_size,
        device=profile_file.Device(kind="cpu", name="test", threads=1, torch="none"),
        warmup=1, iterations=1, created="test", clock="wall", iteration_s=0.0, forward_lead_s=lead,
        backward_tail_s=tail,
        layers=out_layers, tensors=tensors, grad_bytes=4 * sum(n for _, ts in layers for n, _ in ts))


def no_network(monkeypatch, runner) -> None:
    """`runner.run_one` without Mininet: the testbed fails to start, as a machine without one would,
    so a test sees what a run records before its network (the row's start, meta.json)."""
    from emu.testbed.network import NetworkError

    class NoNetwork:
        def __init__(self, *a, **kw): ...

        def __enter__(self):
            raise NetworkError("no network in a unit test")

        def __exit__(self, *exc): ...

    monkeypatch.setattr(runner, "Testbed", NoNetwork)
    monkeypatch.setattr(runner, "backend_for", lambda configured: "tc")


def racks_node_link(per_rack, uplink):
    """Two racks of `per_rack` hosts (100 Mb/s) under one core switch, uplinks at `uplink` Mb/s:
    node-link data as role specs carry it, and the host names."""
    g = nx.DiGraph()
    for s in ("s0", "s1", "s2"):
        g.add_node(s, kind="switch")
    for tor in ("s1", "s2"):
        g.add_edge(tor, "s0", capacity=uplink * 1e6)
        g.add_edge("s0", tor, capacity=uplink * 1e6)
    hosts = []
    for r, tor in enumerate(("s1", "s2")):
        for j in range(per_rack):
            h = f"r{r}h{j}"
            hosts.append(h)
            g.add_node(h, kind="host")
            g.add_edge(h, tor, capacity=100e6)
            g.add_edge(tor, h, capacity=100e6)
    return nx.node_link_data(g, edges="links"), hosts
