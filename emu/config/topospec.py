"""Topology section of the config: three declarative kinds resolved to one `NetSpec`.

- `star`: one switch, a link per host; a rate per host, optionally separate up/down rates;
  hosts listed one by one or generated (`count`), with an optional heterogeneity
  generator so a sweep can vary heterogeneity as one number.
- `racks`: R racks of H hosts (or a size per rack), a top-of-rack switch each, rack uplinks to
  one core switch with an oversubscription ratio; uplink and host rates optionally spread
  geometrically, and tenant hosts for cross traffic.
- `sites`: N sites of H hosts (or a size per site), a LAN switch each, joined by WAN links of
  their own rates (a list, or one rate spread geometrically) to one WAN core switch.
- `graph`: any nodes and links, a rate per direction.

Everything resolves to a `NetSpec` (hosts, switches, directed link rates), which is all
that building the network, the capacity graph and the bounds ever look at. Bridged
Ethernet (LinuxBridge, no STP) floods forever around a loop, so the switch graph must be
a tree and each host hangs off exactly one switch; both are checked here.
"""
from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

import networkx as nx
from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, model_validator

# The testbed shapes with tc itself, so links up to 100 Gb/s can be configured.
MAX_MBPS = 100_000
# Each host is a Mininet shell in its own network namespace (64 took 2.3 s to bring up on 2
# cores); 1,024 is racks' own maximum (16 racks of 64).
MAX_HOSTS = 1024
MAX_GRAPH_NODES = 2 * MAX_HOSTS
# Linux interface names hold 15 characters (IFNAMSIZ 16 with the NUL); Mininet names a node's
# interfaces <node>-eth<port>, a switch's ports counting from 1.
IFNAMSIZ = 15
# tc's bfifo limit (queue_ms of the link's rate, in bytes) is a 32-bit count.
MAX_QUEUE_BYTES = 2 ** 32 - 1

NodeName = Annotated[str, Field(pattern=r"^[a-z][a-z0-9]{0,9}$")]
Mbps = Annotated[float, Field(gt=0, le=MAX_MBPS)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


DEFAULT_QUEUE_MS = 20.0


class LinkOptions(_Strict):
    """Per-link options beyond rate. Delay and loss need the kernel's netem qdisc.

    The queue is bounded in bytes by default (`queue_ms` of the link's rate, a bfifo):
    a bound in packets is no bound here, because veth hands the qdisc GSO packets of up to
    64 KB. With the kernel's default 1000 packets, one cubic iperf3 flow kept a 12 MB queue
    (0.9 s) on a 106 Mb/s link, and bytescheduler's request/response rounds behind it took
    24 s per iteration."""

    delay_ms: float | None = Field(default=None, ge=0, le=60_000,
                                   description="delay of each direction, ms (netem); at most a minute")
    loss_pct: float | None = Field(default=None, ge=0, le=100,
                                   description="random loss of each direction, percent of packets (netem)")
    queue_ms: float = Field(default=DEFAULT_QUEUE_MS, gt=0,
                            description="drop-tail queue of each direction, in ms of its configured rate "
                                        "(at least 64 KB; a rate change keeps the bytes)")
    queue_pkts: int | None = Field(default=None, gt=0, le=2 ** 32 - 1,
                                   description="a queue of this many packets instead (pfifo; netem's limit "
                                               "with delay/loss)")


@dataclass(frozen=True)
class LinkSpec:
    a: str
    b: str
    ab_mbps: float            # rate a -> b (egress of a's interface)
    ba_mbps: float            # rate b -> a
    delay_ms: float | None = None
    loss_pct: float | None = None
    queue_pkts: int | None = None
    queue_ms: float = DEFAULT_QUEUE_MS


@dataclass(frozen=True)
class NetSpec:
    hosts: list[str]
    switches: list[str]
    links: list[LinkSpec] = field(default_factory=list)

    def rate(self, src: str, dst: str) -> float | None:
        """Configured Mb/s of the direction src -> dst, None if there is no such link."""
        for ln in self.links:
            if (ln.a, ln.b) == (src, dst):
                return ln.ab_mbps
            if (ln.b, ln.a) == (src, dst):
                return ln.ba_mbps
        return None

    def describe(self, limit: int = 8) -> str:
        """Short text for plots and tables: 'w0 40/20, w1 20' (Mb/s; up/down where they differ)."""
        parts = []
        for ln in self.links[:limit]:
            rate = f"{ln.ab_mbps:g}" if ln.ab_mbps == ln.ba_mbps else f"{ln.ab_mbps:g}/{ln.ba_mbps:g}"
            parts.append(f"{ln.a}-{ln.b} {rate}")
        more = f", +{len(self.links) - limit} links" if len(self.links) > limit else ""
        return ", ".join(parts) + more + " Mb/s"

    def needs_netem(self) -> list[int]:
        return [i for i, ln in enumerate(self.links) if ln.delay_ms or ln.loss_pct]


def _kernel_limits(net: NetSpec, node_field: Callable[[str], str], queue_field: Callable[[int], str]) -> NetSpec:
    """Refuse what the kernel would refuse at bring-up: an interface name longer than
    IFNAMSIZ, a bfifo limit beyond 32 bits. `*_field` name the config field to blame."""
    degree: dict[str, int] = {}
    for ln in net.links:
        for end in (ln.a, ln.b):
            degree[end] = degree.get(end, 0) + 1
    switches = set(net.switches)
    for node, n in degree.items():
        name = f"{node}-eth{n if node in switches else n - 1}"
        if len(name) > IFNAMSIZ:
            raise ValueError(f"{node_field(node)}: Mininet would name an interface {name!r}, longer than the "
                             f"{IFNAMSIZ} characters Linux allows; use a shorter name than {node!r}")
    for i, ln in enumerate(net.links):
        if ln.queue_pkts is None and not (ln.delay_ms or ln.loss_pct):
            for mbps in (ln.ab_mbps, ln.ba_mbps):
                limit = mbps * 1e6 / 8 * ln.queue_ms / 1e3
                if limit > MAX_QUEUE_BYTES:
                    raise ValueError(f"{queue_field(i)}: {ln.queue_ms:g} ms of {mbps:g} Mb/s is {limit:.0f} bytes; "
                                     f"tc's queue limit is at most {MAX_QUEUE_BYTES}")
    return net


# ---------------------------------------------------------------------------- star

class SlowHosts(_Strict):
    """`count` hosts at `factor` times the rate (chosen last-first, or at random with seed)."""

    kind: Literal["slow"] = Field(description="slow: count hosts at factor times the rate")
    count: int = Field(ge=0, description="count of hosts slowed down")
    factor: float = Field(gt=0, le=1, default=0.1, description="the slow hosts' rate as a fraction 0-1 of theirs")
    pick: Literal["last", "random"] = Field(default="last", description="which hosts: the last ones, or chosen at "
                                                                        "random with seed")
    seed: int = Field(default=0, description="integer seed of the random pick")


class LogNormal(_Strict):
    """Rates multiplied by exp(sigma*Z - sigma^2/2), Z ~ N(0,1) seeded: mean-preserving,
    sigma = 0 is homogeneous, so sigma is the one heterogeneity knob of a sweep."""

    kind: Literal["lognormal"] = Field(description="lognormal: rates x exp(sigma Z - sigma^2 / 2), mean-preserving")
    sigma: float = Field(ge=0, le=3, description="standard deviation of the log rate, dimensionless (0: homogeneous)")
    seed: int = Field(default=0, description="integer seed of Z")


class Spread(_Strict):
    """Rates geometric over the hosts not kept, in order: host k of n at the rate x
    ratio^(-k/(n-1)), the first at the full rate, the last at 1/ratio of it. Deterministic;
    the mean is NOT preserved (it falls as ratio grows); ratio 1 is homogeneous."""

    kind: Literal["spread"] = Field(description="spread: rates geometric from the full rate down to 1/ratio of it")
    ratio: float = Field(ge=1, description="ratio of the fastest to the slowest host rate")


Heterogeneity = Annotated[SlowHosts | LogNormal | Spread, Field(discriminator="kind")]
HETEROGENEITY_KINDS = ("slow", "lognormal", "spread")


class StarHost(_Strict):
    name: NodeName = Field(description="the host's name (a lowercase letter, then at most 9 letters or digits)")
    bw_mbps: Mbps | None = Field(default=None, description="rate of both directions, Mb/s (or up_mbps and "
                                                           "down_mbps)")
    up_mbps: Mbps | None = Field(default=None, description="rate host -> switch, Mb/s")
    down_mbps: Mbps | None = Field(default=None, description="rate switch -> host, Mb/s")

    @model_validator(mode="after")
    def _rates(self) -> StarHost:
        if self.bw_mbps is None and (self.up_mbps is None or self.down_mbps is None):
            raise ValueError("give bw_mbps, or both up_mbps and down_mbps")
        return self

    @property
    def up(self) -> float:
        return self.up_mbps if self.up_mbps is not None else self.bw_mbps

    @property
    def down(self) -> float:
        return self.down_mbps if self.down_mbps is not None else self.bw_mbps


class StarTopology(LinkOptions):
    kind: Literal["star"] = Field(description="star: one switch, a link per host")
    switch: NodeName = Field(default="s1", description="the switch's name")
    hosts: list[StarHost] | None = Field(default=None, max_length=MAX_HOSTS,
                                         description="the hosts one by one (or count)")
    count: int | None = Field(default=None, ge=2, le=256,
                              description="count of hosts to generate, h0..h{count-1} (or hosts)")
    bw_mbps: Mbps | None = Field(default=None, description="rate of generated hosts, Mb/s")
    heterogeneity: Heterogeneity | None = Field(
        default=None, description="a generator of unequal host rates (unset: the rates as given)")
    keep: list[NodeName] = Field(default_factory=list, max_length=MAX_HOSTS,
                                 description="hosts the generator leaves alone")

    @model_validator(mode="after")
    def _hosts(self) -> StarTopology:
        if (self.hosts is None) == (self.count is None):
            raise ValueError("give either hosts (a list) or count (with bw_mbps)")
        if self.count is not None and self.bw_mbps is None:
            raise ValueError("count needs bw_mbps, the rate of the generated hosts")
        if self.hosts is not None:
            if len(self.hosts) < 2:
                raise ValueError("hosts: must have at least 2 item(s)")
            seen: set[str] = set()
            for i, h in enumerate(self.hosts):
                if h.name in seen:
                    raise ValueError(f"hosts[{i}].name: host name {h.name!r} is used twice")
                if h.name == self.switch:
                    raise ValueError(f"hosts[{i}].name: {h.name!r} is the switch's name")
                seen.add(h.name)
        return self

    def host_list(self) -> list[StarHost]:
        hosts = list(self.hosts) if self.hosts is not None else [
            StarHost(name=f"h{i}", bw_mbps=self.bw_mbps) for i in range(self.count)]
        return _apply_heterogeneity(hosts, self.heterogeneity, set(self.keep))

    def resolve(self) -> NetSpec:
        hosts = self.host_list()
        opts = dict(delay_ms=self.delay_ms, loss_pct=self.loss_pct, queue_pkts=self.queue_pkts,
                    queue_ms=self.queue_ms)
        net = NetSpec(hosts=[h.name for h in hosts], switches=[self.switch],
                      links=[LinkSpec(h.name, self.switch, h.up, h.down, **opts) for h in hosts])
        return _kernel_limits(net, lambda node: "switch" if node == self.switch else "hosts",
                              lambda i: "queue_ms")


def _apply_heterogeneity(hosts: list[StarHost], het, keep: set[str]) -> list[StarHost]:
    if het is None:
        return hosts
    idx = [i for i, h in enumerate(hosts) if h.name not in keep]
    factors = {i: 1.0 for i in idx}
    if isinstance(het, SlowHosts):
        if het.count > len(idx):
            raise ValueError(f"heterogeneity.count: {het.count} slow hosts, but only {len(idx)} hosts to slow down")
        chosen = idx[len(idx) - het.count:] if het.pick == "last" else random.Random(het.seed).sample(idx, het.count)
        for i in chosen:
            factors[i] = het.factor
    elif isinstance(het, Spread):
        factors = dict(zip(idx, _geometric(len(idx), het.ratio)))
    else:
        rng = random.Random(het.seed)
        for i in idx:
            factors[i] = math.exp(het.sigma * rng.gauss(0, 1) - het.sigma ** 2 / 2)
    out = []
    for i, h in enumerate(hosts):
        f = factors.get(i, 1.0)
        out.append(h if f == 1.0 else StarHost(name=h.name, up_mbps=_clip(h.up * f), down_mbps=_clip(h.down * f)))
    return out


def _clip(mbps: float) -> float:
    return round(min(max(mbps, 0.01), MAX_MBPS), 3)


def _geometric(n: int, spread: float) -> list[float]:
    """n factors from 1 down to 1/spread, geometrically: item k is spread^(-k/(n-1))."""
    return [spread ** (-k / (n - 1)) if n > 1 else 1.0 for k in range(n)]


def _scaled(mbps: float, factor: float) -> float:
    """mbps x factor through `_clip`; factor 1 keeps the configured value as it is."""
    return mbps if factor == 1.0 else _clip(mbps * factor)


def _link_opts(t: LinkOptions) -> dict[str, Any]:
    return dict(delay_ms=t.delay_ms, loss_pct=t.loss_pct, queue_pkts=t.queue_pkts, queue_ms=t.queue_ms)


# ---------------------------------------------------------------------------- one value, or one per group

def _form(v: Any) -> str:
    return "each" if isinstance(v, (list, tuple)) else "one"


# A field that takes one value for every rack (site) or a list with one per rack (site). The
# callable discriminator picks the form by the value's type, so a bad value gets the one error
# of the form it has (a plain union reports one per member, under pydantic's names for them);
# config_errors drops the tag from the field's path.
ONE_OR_EACH_TAGS = ("one", "each")
ONE_OR_EACH_FIELDS = ("hosts_per_rack", "hosts_per_site", "wan_mbps")
MAX_GROUPS = 16
HostCount = Annotated[int, Field(ge=1, le=64)]
HostCounts = Annotated[Annotated[HostCount, Tag("one")]
                       | Annotated[list[HostCount], Tag("each"), Field(min_length=1, max_length=MAX_GROUPS)],
                       Discriminator(_form)]
Rates = Annotated[Annotated[Mbps, Tag("one")]
                  | Annotated[list[Mbps], Tag("each"), Field(min_length=1, max_length=MAX_GROUPS)],
                  Discriminator(_form)]


def _each(value: Any, n: int, name: str, group: str) -> list:
    """`value` for each of n groups: a list as it is (it must have n items), one value n times."""
    if not isinstance(value, list):
        return [value] * n
    if len(value) != n:
        raise ValueError(f"{name}: a list of {len(value)} for {n} {group}s; give one per {group}, "
                         f"or one value for all")
    return list(value)


def _host_total(sizes: list[int], tenants: int, tenants_field: str) -> None:
    total = sum(sizes) + tenants * len(sizes)
    if total > MAX_HOSTS:
        raise ValueError(f"{tenants_field}: {sum(sizes)} hosts and {tenants * len(sizes)} tenant hosts are "
                         f"{total}; at most {MAX_HOSTS}")


# ---------------------------------------------------------------------------- racks

class RacksTopology(LinkOptions):
    """Hosts r{i}h{j} and tenant hosts r{i}t{j}; top-of-rack switches s1..sR; core switch s0.

    Rack r's uplink runs at hosts_per_rack[r] x host_bw_mbps / oversubscription (worker hosts
    only: tenants and host_spread do not change it), times uplink_spread^(-r/(racks-1)). The
    worker hosts, rack by rack, run at host_bw_mbps x host_spread^(-k/(n-1)) for the k-th of
    n; tenant hosts at host_bw_mbps."""

    kind: Literal["racks"] = Field(description="racks: top-of-rack switches under one core switch")
    racks: int = Field(ge=1, le=MAX_GROUPS, description="count of racks")
    hosts_per_rack: HostCounts = Field(description="count of worker hosts per rack; a list gives one per rack")
    host_bw_mbps: Mbps = Field(description="rate of a host's link to its top-of-rack switch, Mb/s (the first "
                                           "worker host's with host_spread)")
    oversubscription: float = Field(default=1.0, ge=1, description="ratio of a rack's hosts' rate to its uplink "
                                                                   "rate")
    # None (not 1 or 0) when unset: run ids leave None out, so racks configs written before
    # these fields keep their run ids and a sweep resumes.
    uplink_spread: float | None = Field(default=None, ge=1, description="ratio: rack 0's uplink at the full "
                                                                        "rate, the last rack's at 1/this (default 1)")
    host_spread: float | None = Field(default=None, ge=1, description="ratio: first worker host at host_bw_mbps, "
                                                                      "the last at 1/this of it (default 1)")
    tenants_per_rack: int | None = Field(default=None, ge=0, le=64,
                                         description="count of extra hosts r{i}t{j} per rack for cross traffic "
                                                     "(default 0)")

    @model_validator(mode="after")
    def _sizes(self) -> RacksTopology:
        _host_total(_each(self.hosts_per_rack, self.racks, "hosts_per_rack", "rack"), self.tenants,
                    "tenants_per_rack")
        return self

    @property
    def tenants(self) -> int:
        return self.tenants_per_rack or 0

    def resolve(self) -> NetSpec:
        opts = _link_opts(self)
        sizes = _each(self.hosts_per_rack, self.racks, "hosts_per_rack", "rack")
        host_factor = iter(_geometric(sum(sizes), self.host_spread or 1.0))
        uplink_factor = _geometric(self.racks, self.uplink_spread or 1.0)
        hosts, tenants, links = [], [], []
        for r, size in enumerate(sizes):
            tor = f"s{r + 1}"
            for j in range(size):
                h, bw = f"r{r}h{j}", _scaled(self.host_bw_mbps, next(host_factor))
                hosts.append(h)
                links.append(LinkSpec(h, tor, bw, bw, **opts))
            for j in range(self.tenants):
                tenants.append(f"r{r}t{j}")
                links.append(LinkSpec(tenants[-1], tor, self.host_bw_mbps, self.host_bw_mbps, **opts))
            if self.racks > 1:
                uplink = _clip(size * self.host_bw_mbps / self.oversubscription * uplink_factor[r])
                links.append(LinkSpec(tor, "s0", uplink, uplink, **opts))
        switches = [f"s{r + 1}" for r in range(self.racks)] + (["s0"] if self.racks > 1 else [])
        return _kernel_limits(NetSpec(hosts=hosts + tenants, switches=switches, links=links),
                              lambda node: "racks", lambda i: "queue_ms")


# ---------------------------------------------------------------------------- sites

class SitesTopology(LinkOptions):
    """Hosts d{i}h{j} and tenant hosts d{i}t{j} on site switches s1..sN (LAN links at
    host_bw_mbps); each site switch has a WAN link to the core s0.

    Site s's WAN link runs at wan_mbps[s] (a list), or at wan_mbps x wan_spread^(-s/(sites-1))
    (one rate). WAN links take wan_delay_ms in place of delay_ms where it is set."""

    kind: Literal["sites"] = Field(description="sites: site switches joined by WAN links to one WAN core switch")
    sites: int = Field(ge=2, le=MAX_GROUPS, description="count of sites")
    hosts_per_site: HostCounts = Field(description="count of worker hosts per site; a list gives one per site")
    host_bw_mbps: Mbps = Field(description="LAN rate: each host's link to its site switch, Mb/s")
    wan_mbps: Rates = Field(description="rate of each site's link to the WAN core, Mb/s; a list gives one per site")
    wan_spread: float = Field(default=1.0, ge=1,
                              description="ratio: with one wan_mbps, site 0 at that rate, the last site at 1/this")
    wan_delay_ms: float | None = Field(default=None, ge=0, le=60_000,
                                       description="delay of WAN links only, ms (in place of delay_ms)")
    tenants_per_site: int = Field(default=0, ge=0, le=64,
                                  description="count of extra hosts d{i}t{j} per site for cross traffic")

    @model_validator(mode="after")
    def _sizes(self) -> SitesTopology:
        _host_total(_each(self.hosts_per_site, self.sites, "hosts_per_site", "site"), self.tenants_per_site,
                    "tenants_per_site")
        _each(self.wan_mbps, self.sites, "wan_mbps", "site")
        if isinstance(self.wan_mbps, list) and self.wan_spread != 1:
            raise ValueError("wan_spread: applies to one wan_mbps; a list already gives each site's rate")
        return self

    def wan_rates(self) -> list[float]:
        if isinstance(self.wan_mbps, list):
            return [_clip(w) for w in self.wan_mbps]
        return [_clip(self.wan_mbps * f) for f in _geometric(self.sites, self.wan_spread)]

    def resolve(self) -> NetSpec:
        lan = _link_opts(self)
        wan = {**lan, "delay_ms": self.wan_delay_ms if self.wan_delay_ms is not None else self.delay_ms}
        hosts, tenants, links = [], [], []
        sizes = _each(self.hosts_per_site, self.sites, "hosts_per_site", "site")
        for d, (size, rate) in enumerate(zip(sizes, self.wan_rates())):
            switch = f"s{d + 1}"
            site_hosts = [f"d{d}h{j}" for j in range(size)]
            site_tenants = [f"d{d}t{j}" for j in range(self.tenants_per_site)]
            hosts += site_hosts
            tenants += site_tenants
            links += [LinkSpec(h, switch, self.host_bw_mbps, self.host_bw_mbps, **lan)
                      for h in site_hosts + site_tenants]
            links.append(LinkSpec(switch, "s0", rate, rate, **wan))
        switches = [f"s{d + 1}" for d in range(self.sites)] + ["s0"]
        return _kernel_limits(NetSpec(hosts=hosts + tenants, switches=switches, links=links),
                              lambda node: "sites", lambda i: "queue_ms")


# ---------------------------------------------------------------------------- graph

class GraphNode(_Strict):
    name: NodeName = Field(description="the node's name (a lowercase letter, then at most 9 letters or digits)")
    kind: Literal["host", "switch"] = Field(description="a host (one link, to a switch) or a switch")


class GraphLink(LinkOptions):
    a: NodeName = Field(description="one end: a node's name")
    b: NodeName = Field(description="the other end")
    bw_mbps: Mbps | None = Field(default=None, description="rate of both directions, Mb/s (or ab_mbps and ba_mbps)")
    ab_mbps: Mbps | None = Field(default=None, description="rate a -> b, Mb/s")
    ba_mbps: Mbps | None = Field(default=None, description="rate b -> a, Mb/s")

    @model_validator(mode="after")
    def _rates(self) -> GraphLink:
        if self.bw_mbps is None and (self.ab_mbps is None or self.ba_mbps is None):
            raise ValueError("give bw_mbps, or both ab_mbps and ba_mbps")
        return self


class GraphTopology(_Strict):
    kind: Literal["graph"] = Field(description="graph: any hosts, switches and links (the switches a tree, each "
                                               "host on one switch)")
    nodes: list[GraphNode] = Field(min_length=2, max_length=MAX_GRAPH_NODES, description="the hosts and switches")
    links: list[GraphLink] = Field(min_length=1, max_length=MAX_GRAPH_NODES,
                                   description="the links, each with a rate per direction")

    @model_validator(mode="after")
    def _valid(self) -> GraphTopology:
        kinds: dict[str, str] = {}
        for i, n in enumerate(self.nodes):
            if n.name in kinds:
                raise ValueError(f"nodes[{i}].name: node name {n.name!r} is used twice")
            kinds[n.name] = n.kind
        g = nx.Graph()
        g.add_nodes_from(kinds)
        for i, ln in enumerate(self.links):
            for end in ("a", "b"):
                if getattr(ln, end) not in kinds:
                    raise ValueError(f"links[{i}].{end}: unknown node {getattr(ln, end)!r}")
            if ln.a == ln.b:
                raise ValueError(f"links[{i}]: a link from {ln.a!r} to itself")
            if g.has_edge(ln.a, ln.b):
                raise ValueError(f"links[{i}]: a second link between {ln.a!r} and {ln.b!r}")
            if kinds[ln.a] == kinds[ln.b] == "host":
                raise ValueError(f"links[{i}]: hosts {ln.a!r} and {ln.b!r} must connect through a switch")
            g.add_edge(ln.a, ln.b)
        if not nx.is_connected(g):
            parts = sorted((sorted(c) for c in nx.connected_components(g)), key=len)
            raise ValueError(f"links: the graph is disconnected: {', '.join(parts[0])} cannot reach "
                             f"{', '.join(parts[-1][:4])}{'...' if len(parts[-1]) > 4 else ''}")
        for name, kind in kinds.items():
            if kind == "host" and g.degree(name) != 1:
                raise ValueError(f"nodes: host {name!r} has {g.degree(name)} links; a host attaches to exactly "
                                 f"one switch")
        switches = g.subgraph([n for n, k in kinds.items() if k == "switch"])
        try:
            cycle = nx.find_cycle(switches)
            raise ValueError(f"links: switches form a loop ({' - '.join(a for a, _ in cycle)}); bridged "
                             f"Ethernet without STP needs a tree")
        except nx.NetworkXNoCycle:
            pass
        if sum(1 for k in kinds.values() if k == "host") < 2:
            raise ValueError("nodes: need at least 2 hosts")
        return self

    def resolve(self) -> NetSpec:
        links = []
        for ln in self.links:
            ab = ln.ab_mbps if ln.ab_mbps is not None else ln.bw_mbps
            ba = ln.ba_mbps if ln.ba_mbps is not None else ln.bw_mbps
            links.append(LinkSpec(ln.a, ln.b, ab, ba, ln.delay_ms, ln.loss_pct, ln.queue_pkts, ln.queue_ms))
        net = NetSpec(hosts=[n.name for n in self.nodes if n.kind == "host"],
                      switches=[n.name for n in self.nodes if n.kind == "switch"], links=links)
        index = {n.name: i for i, n in enumerate(self.nodes)}
        return _kernel_limits(net, lambda node: f"nodes[{index[node]}].name", lambda i: f"links[{i}].queue_ms")


Topology = Annotated[StarTopology | RacksTopology | GraphTopology | SitesTopology, Field(discriminator="kind")]
TOPOLOGY_KINDS = ("star", "racks", "graph", "sites")
