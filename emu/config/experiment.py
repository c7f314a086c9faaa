"""The experiment model: what one run is, validated in full before anything is created.

Every error becomes one `ConfigError` whose text names the field
(`topology.hosts[1].bw_mbps: must be > 0`), so the CLI can print one line and exit 2
before anything is created or started (pydantic's errors are reworded in
emu/config/errors.py).

emu/ may not import workloads/ or schedulers/, yet their sections must be validated up
front. So the caller passes their pydantic models in (`Sections`): dependency injection
keeps the layering and still validates everything before a run starts. The same hand-over
carries what the registry says about each scheduler (`SchedulerInfo`, contracts/scheduler_info.py):
a validated experiment keeps its scheduler's (`scheduler_info`, outside the resolved config and so
outside the run id), which the runner records with the run.

Validation looks at the config only, never at the machine, so a config means the same, and
has the same run ids, everywhere. Whether this kernel can emulate it (congestion control,
netem, the cgroup cpu controller) is a separate step, emu/testbed/preflight.py. A file with a grid
becomes a list of experiments in emu/config/plan.py.
"""
from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)

from contracts.scheduler_info import SchedulerInfo
from emu.config.crosstraffic import Flow
from emu.config.dilation import AUTO, MAX_TIME_DILATION, dilate_params, dilate_workload, is_time
from emu.config.errors import describe, quote
from emu.config.faults import MAX_FAULTS, Fault, check_faults
from emu.config.placement import best_server
from emu.config.shaping import MAX_RATE_CHANGES, LinkShaping
from emu.config.topospec import MAX_GRAPH_NODES, NetSpec, Topology
from emu.config.watchdog import WatchdogConfig

# A run holds the machine's one emulated network; a week is beyond any experiment here.
MAX_TIMEOUT_S = 7 * 24 * 3600
NETLINK_QDISC_INTERVAL_S = 0.01  # the netlink monitor's queue sampling when the config leaves it unset
# Each flow is an iperf3 server and client with its own port from 5201.
MAX_FLOWS = 256
# netem's delay of a link (topospec.LinkOptions.delay_ms), also once dilated.
MAX_DELAY_MS = 60_000
# What the user sees is one line: longer messages (a huge value quoted back) are cut.
MAX_MESSAGE_CHARS = 400


def _one_line(text: str) -> str:
    text = text[:4 * MAX_MESSAGE_CHARS]
    if not text.isprintable():
        text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return text if len(text) <= MAX_MESSAGE_CHARS else text[:MAX_MESSAGE_CHARS - 3] + "..."


class ConfigError(ValueError):
    """A bad config or argument; its text is the whole one-line message for the user."""

    def __init__(self, message: object = ""):
        super().__init__(_one_line(str(message)))


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class Roles(Strict):
    """Which hosts run the parameter servers and the workers. The two words are resolved by
    `Experiment` against its topology, so a validated experiment holds host names only:
    "best" becomes the host chosen by emu/config/placement.py, "rest" the hosts left."""

    servers: list[str] | Literal["best"] = Field(
        default_factory=list, description='parameter servers (PS family only), or "best": one server on the host '
                                          'where it has the highest rate on the configured network')
    workers: list[str] | Literal["rest"] = Field(description='host names, or "rest": every host not a server')

    @field_validator("servers", "workers", mode="before")
    @classmethod
    def _names_or_word(cls, value, info):
        """One message for a wrong shape, instead of one per member of the union."""
        word = "best" if info.field_name == "servers" else "rest"
        if value == word:
            return value
        if not isinstance(value, list):
            raise ValueError(f'must be a list of host names or "{word}", got {quote(value)}')
        for i, n in enumerate(value):
            if not isinstance(n, str):
                raise ValueError(f"[{i}]: must be a host name, got {quote(n)}")
        return value

    @field_validator("servers", "workers")
    @classmethod
    def _no_repeats(cls, names):
        if isinstance(names, str):
            return names
        seen: set[str] = set()
        for i, n in enumerate(names):
            if n in seen:
                raise ValueError(f"[{i}]: host {n!r} is listed twice")
            seen.add(n)
        return names

    @field_validator("workers")
    @classmethod
    def _some_workers(cls, names):
        if not names:
            raise ValueError('must name at least one host (or be "rest": every host not a server)')
        return names


class MonitorConfig(Strict):
    """What the monitors sample, and how often (emu/testbed/monitor.py). The two new keys default to
    None, so configs that leave them out keep their run ids."""

    interval_s: float = Field(default=0.1, ge=0.001, le=0.1,
                              description="seconds between samples of link counters and CPU (10 Hz or better)")
    qdisc_interval_s: float = Field(default=0.1, ge=0.001, le=10,
                                    description="seconds between samples of qdisc backlog/drops with the tc "
                                                "backend; costs one tc call per host each time")
    backend: Literal["netlink", "tc"] | None = Field(
        default=None, description="netlink: counters, queues and rate changes through netlink sockets in the hosts' "
                                  "namespaces; tc: a tc process per namespace and sample, sysfs counters, tc class "
                                  "change; unset: netlink where pyroute2 is installed and the harness is root")
    netlink_qdisc_interval_s: float | None = Field(
        default=None, ge=0.001, le=10,
        description=f"seconds between samples of qdisc backlog/drops with the netlink backend (unset: "
                    f"{NETLINK_QDISC_INTERVAL_S} s, 100 Hz)")


class TcpConfig(Strict):
    """TCP as the emulated hosts run it. Set in every host's network namespace, because a
    namespace otherwise inherits the machine's default congestion control, and that default
    changes results (docs/testbed.md: TCP in the hosts). Whether this kernel has the algorithm is
    checked by emu/testbed/preflight.py, not here, so that parsing does not depend on the machine."""

    congestion_control: str = Field(
        default="cubic", pattern=r"^[a-z0-9_]{1,15}$",
        description="net.ipv4.tcp_congestion_control in every host (Linux's default: cubic)")


class FidelityConfig(Strict):
    """Thresholds of the per-run fidelity verdict (after Handigol et al., CoNEXT 2012)."""

    window_s: float = Field(default=1.0, ge=0.1, le=MAX_TIMEOUT_S,
                            description="length of one window of the verdict, seconds; a window holds samples at "
                                        "10 Hz")
    cpu_idle_min: float = Field(default=0.35, ge=0, le=1,
                                description="the machine's CPU idle in every window, at least: a fraction 0-1")
    rate_tolerance: float = Field(default=0.05, ge=0, description="realized rate <= configured x (1 + this): a "
                                                                  "fraction of the configured rate (0.05: 5 percent)")
    saturated_min: float = Field(default=0.9, ge=0, le=1,
                                 description="a link with proven queued work reaches this fraction 0-1 of its rate")


class PluginRef(Strict):
    """One plugin of the config (`plugins:`) as the run id hashes it: what the config wrote and
    what identifies its code (schedulers/registry/plugins.py loads it and says). The file's path
    on this machine is kept (the runner copies the file into the run) but not dumped, so
    neither the run id nor config.yaml depends on where the checkout lies."""

    spec: str = Field(description="the file (relative to the config file, or absolute) or module, as written")
    kind: Literal["file", "module", "entry_point"] = Field(
        description="how it was named: a Python file, a module, or an installed package's entry point")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="of the file, or of the package's source files")
    version: str | None = Field(default=None, description="the installed distribution's version (modules)")
    path: str | None = Field(default=None, exclude=True, description="the file on this machine; not hashed")
    module: str | None = Field(default=None, exclude=True, description="what a role imports (modules); not hashed")


class Experiment(Strict):
    """One fully resolved experiment: what `run_id` hashes. Its model validator checks what
    no single field can: that roles, host_cpu, shaped links and flows name hosts and links of
    the topology, that faults name its roles and links and do not overlap, and that the rate
    schedules and faults fit the run's timeout."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$",
                      description="the experiment's name: its runs go to results/<name>/")
    seed: int = Field(default=0, ge=0, le=2 ** 32 - 1,
                      description="the run's integer seed: torch gets seed x 1000 + stream, which must fit in 64 bits")
    timeout_s: float = Field(default=600, ge=1, le=MAX_TIMEOUT_S,
                             description="limit of one run, seconds (emulated: x time_dilation of wall clock)")
    time_dilation: Annotated[float, Field(ge=1, le=MAX_TIME_DILATION)] | Literal["auto"] = Field(
        default=1.0,
        description="factor k: run k times slower, every link rate / k, every time x k (emu/config/dilation.py); "
                    "results are recorded in emulated time. Left out of the resolved config, and so of the run id, "
                    "at 1. \"auto\": the harness picks the smallest whole k that its calibration of this machine "
                    "predicts keeps the CPU check green (emu/sweeps/autodilate.py); the run id stays that of "
                    "\"auto\", the row's time_dilation is the k used")
    trace: bool = Field(default=False, description="record scheduler events into events.parquet")
    topology: Topology = Field(
        description="the network, of one of four kinds (star, racks, graph, sites), resolved to hosts, switches and "
                    "links (emu/config/topospec.py)")
    shaping: list[LinkShaping] = Field(
        default_factory=list, max_length=2 * MAX_GRAPH_NODES,
        description="rate schedules over the run, at most one per link direction (emu/config/shaping.py)")
    cross_traffic: list[Flow] = Field(
        default_factory=list, max_length=MAX_FLOWS,
        description="iperf3 flows between hosts that compete with the training's traffic (emu/config/crosstraffic.py)")
    host_cpu: dict[str, Annotated[float, Field(gt=0, le=1)]] = Field(
        default_factory=dict, description="host -> its fraction 0-1 of the machine's CPU (CFS bandwidth cgroup)")
    monitor: MonitorConfig = Field(default=MonitorConfig(),
                                   description="what the monitors sample, and how often (emu/testbed/monitor.py)")
    tcp: TcpConfig = Field(default=TcpConfig(),
                           description="TCP as the emulated hosts run it, set in every host's network namespace")
    fidelity: FidelityConfig = Field(
        default=FidelityConfig(), description="thresholds of the per-run fidelity verdict (after Handigol et al., "
                                              "CoNEXT 2012)")
    # None, not WatchdogConfig(): unset, it stays out of the run id (see run_id)
    watchdog: WatchdogConfig | None = Field(
        default=None, description="the stall window (emu/run/watchdog.py); unset: derived from the run")
    faults: list[Fault] = Field(default_factory=list, max_length=MAX_FAULTS,
                                description="faults injected on the run's timeline (emu/run/faults.py)")
    roles: Roles = Field(description="which hosts run the parameter servers and the workers")
    workload: dict[str, Any] = Field(description="what each worker trains, and how (workloads/config.py)")
    scheduler: str = Field(description="the scheduler under test: a name of the registry (schedulers/registry/) "
                                       "or of a plugin")
    schedulers: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="scheduler name -> its tunables; the run id hashes the chosen "
                                          "scheduler's only")
    plugins: list[PluginRef] = Field(
        default_factory=list, max_length=64,
        description="Python files (relative to the config file, or absolute) or module names defining schedulers "
                    "(schedulers/registry/plugins.py); each one's code hash is part of the run id. Empty: left out "
                    "of the run id")
    label: str | None = Field(
        default=None, pattern=r"^[A-Za-z0-9][A-Za-z0-9 _.,=+-]{0,39}$",
        description="names this variant of the scheduler in reports (e.g. tuned: `bytescheduler (tuned)` beside "
                    "`bytescheduler`); unset by default, when it changes nothing, run ids included")
    _net: NetSpec | None = PrivateAttr(default=None)
    _scheduler_info: SchedulerInfo | None = PrivateAttr(default=None)  # from Sections; not hashed

    _auto_k_max: int | None = PrivateAttr(default=None)  # validate_experiment's, with the sections; not hashed
    _time_params: dict[str, Any] = PrivateAttr(default_factory=dict)  # see `time_params`; not hashed

    @field_validator("time_dilation", mode="before")
    @classmethod
    def _a_number_or_auto(cls, value):
        if value == AUTO:
            return value
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise ValueError(f'must be a number or "{AUTO}", got {quote(value)}')
        try:
            k = float(value)
        except ValueError:
            raise ValueError(f'must be a number or "{AUTO}", got {quote(value)}') from None
        if not math.isfinite(k):
            raise ValueError(f"must be a finite number, got {quote(value)}")
        if k < 1:
            raise ValueError("must be >= 1")
        if k > MAX_TIME_DILATION:
            raise ValueError(f"must be <= {MAX_TIME_DILATION:g}")
        return k

    @model_serializer(mode="wrap")
    def _without_unit_dilation(self, handler):
        """`time_dilation` is left out of the dump at 1, so the resolved configs, and the run
        ids hashed from them, of runs made before it existed do not change."""
        d = handler(self)
        if self.time_dilation == 1:
            d.pop("time_dilation", None)
        return d

    @model_validator(mode="after")
    def _consistent(self) -> Experiment:
        try:
            net = self.topology.resolve()
        except ValueError as e:
            raise ConfigError(f"topology.{e}") from None
        _check_dilation(self, net)
        object.__setattr__(self, "roles", _resolve_roles(self.roles, net))
        hosts = set(net.hosts)
        for h in self.host_cpu:
            if h not in hosts:
                raise ConfigError(f"host_cpu.{h}: {h!r} is not a host of the topology")
        directions = {d for ln in net.links for d in ((ln.a, ln.b), (ln.b, ln.a))}
        shaped: dict[tuple[str, str], int] = {}
        changes = 0.0
        for i, s in enumerate(self.shaping):
            link = tuple(s.link)
            if link not in directions:
                raise ConfigError(f"shaping[{i}].link: no link {s.link[0]} -> {s.link[1]} in the topology")
            if link in shaped:
                raise ConfigError(f"shaping[{i}].link: {s.link[0]} -> {s.link[1]} already has a schedule "
                                  f"(shaping[{shaped[link]}])")
            shaped[link] = i
            n = s.schedule.changes(self.timeout_s)
            changes += n
            if changes > MAX_RATE_CHANGES:
                what = f"shaping[{i}].schedule" if n > MAX_RATE_CHANGES else "shaping"
                raise ConfigError(f"{what}: {min(changes, 1e18):.0f} rate changes within timeout_s "
                                  f"({self.timeout_s:g} s); at most {MAX_RATE_CHANGES}, each one a tc call "
                                  f"(lengthen the period or window, or shorten timeout_s)")
        for i, f in enumerate(self.cross_traffic):
            for end in ("src", "dst"):
                if getattr(f, end) not in hosts:
                    raise ConfigError(f"cross_traffic[{i}].{end}: {getattr(f, end)!r} is not a host of the topology")
            if f.start_s >= self.timeout_s:
                raise ConfigError(f"cross_traffic[{i}].start_s: {f.start_s:g} s is not before the run's timeout_s "
                                  f"({self.timeout_s:g} s); the flow would never start")
        links = {frozenset((ln.a, ln.b)) for ln in net.links}
        problem = check_faults(self.faults, self.role_hosts, links, self.timeout_s)
        if problem:
            raise ConfigError(problem)
        self._net = net
        return self

    @property
    def auto_dilation(self) -> bool:
        """`time_dilation: auto`: the k is chosen for this machine when the run starts (emu/sweeps/autodilate.py)."""
        return self.time_dilation == AUTO

    @property
    def dilation_k_max(self) -> int:
        """The largest whole k this experiment can run at: what the timeout, netem's delay and (where
        validate_experiment had them) the workload's and scheduler's models allow once dilated."""
        limit = _config_k_max(self, self.net)
        return limit if self._auto_k_max is None else min(limit, self._auto_k_max)

    @property
    def role_hosts(self) -> dict[str, str]:
        """Role name (server0, worker1, ...) -> its host."""
        return {**{f"server{i}": h for i, h in enumerate(self.roles.servers)},
                **{f"worker{i}": h for i, h in enumerate(self.roles.workers)}}

    @property
    def slowed_hosts(self) -> list[str]:
        """Hosts that a `slow` fault throttles: they need a CPU cgroup from the start."""
        hosts = self.role_hosts
        return sorted({hosts[f.target] for f in self.faults if f.kind == "slow"})

    @property
    def net(self) -> NetSpec:
        return self._net

    @property
    def scheduler_params(self) -> dict[str, Any]:
        return dict(self.schedulers.get(self.scheduler, {}))

    @property
    def time_params(self) -> dict[str, Any]:
        """The chosen scheduler's tunables that are times, defaults included: a default its dump
        leaves out (to keep run ids) is dilated like a value the config sets (wall_plan)."""
        return dict(self._time_params)

    @property
    def scheduler_info(self) -> SchedulerInfo | None:
        """What the registry says about the scheduler (Sections.infos), None where it was not handed over."""
        return self._scheduler_info

    def resolved(self) -> dict[str, Any]:
        """Plain dict of the config with only the chosen scheduler's section (what is hashed)."""
        d = self.model_dump(mode="json")
        d["schedulers"] = {self.scheduler: self.scheduler_params}
        return d

    def run_id(self, repeat: int) -> str:
        """Hash of the resolved config and the repeat. Unused optional features (empty or
        None) are left out, so adding one to the harness does not change existing run ids
        (a sweep still resumes); any value that is set, defaults included, is hashed."""
        blob = json.dumps({"config": _drop_empty(self.resolved()), "repeat": repeat}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]


def _config_k_max(exp: Experiment, net: NetSpec) -> int:
    """The largest whole k at which the run's wall-clock limit and netem's delays still fit."""
    limit = min(int(MAX_TIME_DILATION), math.floor(MAX_TIMEOUT_S / exp.timeout_s))
    delays = [ln.delay_ms for ln in net.links if ln.delay_ms]
    return min(limit, math.floor(MAX_DELAY_MS / max(delays))) if delays else limit


def _check_dilation(exp: Experiment, net: NetSpec) -> None:
    """What time dilation stretches must still fit: the run's wall-clock limit, netem's delay."""
    k = exp.time_dilation
    if k == 1:
        return
    if exp.faults:
        # their times, the costs and faults.parquet are wall clock; not converted yet
        shown = AUTO if k == AUTO else f"{k:g}"
        raise ConfigError(f"faults: not supported with time_dilation: {shown} (set time_dilation: 1, or leave "
                          f"faults out)")
    if k == AUTO:
        return  # the choice stays within _config_k_max
    if exp.timeout_s * k > MAX_TIMEOUT_S:
        raise ConfigError(f"time_dilation: timeout_s ({exp.timeout_s:g} s) x {k:g} is {exp.timeout_s * k:.0f} s "
                          f"of wall clock; at most {MAX_TIMEOUT_S} (7 days): shorten timeout_s or lower "
                          f"time_dilation")
    for ln in net.links:
        if ln.delay_ms and ln.delay_ms * k > MAX_DELAY_MS:
            raise ConfigError(f"time_dilation: link {ln.a}-{ln.b}'s delay_ms ({ln.delay_ms:g}) x {k:g} is above "
                              f"{MAX_DELAY_MS} ms")


def _resolve_roles(roles: Roles, net: NetSpec) -> Roles:
    """`roles` with host names only, each checked against `net`. "best": the one host where
    a parameter server for the workers has the highest rate (emu/config/placement.py). With
    "workers: rest" too, the workers are every other host, and the server's host is chosen
    as if all hosts were workers, which gives the same rates (a worker on the server's host
    costs no link)."""
    hosts = set(net.hosts)
    for field_name in ("servers", "workers"):
        names = getattr(roles, field_name)
        for i, n in enumerate(names if isinstance(names, list) else []):
            if n not in hosts:
                raise ConfigError(f"roles.{field_name}[{i}]: {n!r} is not a host of the topology")
    servers = roles.servers
    if servers == "best":
        servers = [best_server(net, net.hosts if roles.workers == "rest" else roles.workers)]
    workers = roles.workers
    if workers == "rest":
        workers = [h for h in net.hosts if h not in servers]
        if not workers:
            raise ConfigError("roles.workers: no host is left for workers")
    return Roles(servers=servers, workers=workers)


def _drop_empty(d: Any) -> Any:
    if isinstance(d, dict):
        return {k: _drop_empty(v) for k, v in d.items() if v not in (None, {}, [])}
    return d


@dataclass(frozen=True)
class Sections:
    """Validators for the sections that belong to upper layers.

    workload: pydantic model of the `workload:` section.
    schedulers: scheduler name -> pydantic model of its tunables.
    infos: scheduler name -> what the registry says about it (its tuning space, its family, ...).
    with_plugins: (the config's `plugins:`, the directory relative paths start from) -> these
        sections with the plugins' schedulers added, the plugins loaded (tasks.py gives the
        registry's loader); raises ConfigError. None: a config with plugins is refused.
    plugins: plugin spec -> its identity (PluginRef's fields), for those loaded: a config's, and
        installed packages' entry points (`entry_point:<name>`).
    """

    workload: type[BaseModel] | None = None
    schedulers: Mapping[str, type[BaseModel]] = field(default_factory=dict)
    infos: Mapping[str, SchedulerInfo] = field(default_factory=dict)
    with_plugins: Callable[[list[str], Path], Sections] | None = None
    plugins: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)


def validate_experiment(raw: dict[str, Any], sections: Sections, base_dir: Path = Path("."),
                        traces: dict | None = None) -> Experiment:
    """One experiment from its raw config: the model, then the upper layers' sections through
    `sections`, with their defaults filled in, so that `run_id` hashes the values a run uses.
    `base_dir`: where relative trace paths start (the config file's directory). `traces`:
    parsed trace files by file identity, shared by the experiments of one plan (the model is
    validated twice per experiment, and a plan's experiments often share a trace)."""
    ctx = {"base_dir": str(base_dir), "traces": {} if traces is None else traces}
    raw, sections = _with_plugins(raw, sections, base_dir)
    try:
        exp = Experiment.model_validate(raw, context=ctx)
    except ValidationError as e:
        raise ConfigError(describe(e)) from None
    d = exp.model_dump()
    if sections.workload is not None:
        try:
            d["workload"] = sections.workload.model_validate(exp.workload).model_dump(mode="json")
        except ValidationError as e:
            raise ConfigError(describe(e, "workload")) from None
    if sections.schedulers:
        known = sorted(sections.schedulers)
        if exp.scheduler not in sections.schedulers:
            raise ConfigError(f"scheduler: unknown scheduler {exp.scheduler!r} (known: {', '.join(known)})")
        resolved: dict[str, dict[str, Any]] = {}
        for name, params in exp.schedulers.items():
            if name not in sections.schedulers:
                raise ConfigError(f"schedulers.{name}: unknown scheduler (known: {', '.join(known)})")
            if not isinstance(params, dict):
                raise ConfigError(f"schedulers.{name}: must be a mapping")
        for name in set(exp.schedulers) | {exp.scheduler}:
            try:
                model = sections.schedulers[name].model_validate(exp.schedulers.get(name) or {})
            except ValidationError as e:
                raise ConfigError(describe(e, f"schedulers.{name}")) from None
            resolved[name] = model.model_dump(mode="json")
        d["schedulers"] = resolved
        needs = getattr(sections.schedulers[exp.scheduler], "requires_servers", True)
        if needs and not exp.roles.servers:
            raise ConfigError(f"roles.servers: scheduler {exp.scheduler!r} needs at least one parameter server")
        if not needs and exp.roles.servers:
            raise ConfigError(f"roles.servers: scheduler {exp.scheduler!r} runs among the workers; "
                              f"it uses no servers (remove them)")
    k_max = None
    if exp.time_dilation == AUTO:
        k_max = _auto_k_max(d, sections, _config_k_max(exp, exp.net))
    else:
        _check_dilated_sections(exp.time_dilation, d, sections)
    d["plugins"] = raw.get("plugins", [])  # with their paths, which the dump leaves out
    out = Experiment.model_validate(d, context=ctx)
    out._scheduler_info = sections.infos.get(out.scheduler)
    out._auto_k_max = k_max
    if out.scheduler in sections.schedulers:
        out._time_params = _time_params(sections.schedulers[out.scheduler], out.scheduler_params)
    return out


def _time_params(model: type[BaseModel], params: dict[str, Any]) -> dict[str, Any]:
    """`params`' tunables that are times (`*_s`, `*_ms`, `*_us`), with the defaults of those it leaves out."""
    full = model.model_validate(params)
    return {name: getattr(full, name) for name in model.model_fields if is_time(name)}


def _with_plugins(raw: dict[str, Any], sections: Sections, base_dir: Path) -> tuple[dict[str, Any], Sections]:
    """The config's `plugins:` loaded (through `sections.with_plugins`) and replaced by their
    identities, and the sections that know their schedulers. An entry point's scheduler (an
    installed package's) adds its plugin too, so its code is part of the run id even though the
    config does not list it. A resolved config's plugins (dicts, config.yaml) load again by spec."""
    given = raw.get("plugins")
    if given is None or given == []:
        specs: list[str] = []
    elif not isinstance(given, list):
        raise ConfigError(f"plugins: must be a list of Python files or module names, got {quote(given)}")
    else:
        specs = []
        for i, s in enumerate(given):
            s = s.get("spec") if isinstance(s, dict) else s
            if not isinstance(s, str) or not s.strip():
                raise ConfigError(f"plugins[{i}]: must be a Python file or a module name, got {quote(s)}")
            specs.append(s)
        if sections.with_plugins is None:
            raise ConfigError("plugins: this command cannot load plugins")
        sections = sections.with_plugins(specs, base_dir)
    info = sections.infos.get(raw.get("scheduler")) if isinstance(raw.get("scheduler"), str) else None
    if info is not None and info.plugin and info.plugin.startswith("entry_point:") and info.plugin not in specs:
        specs.append(info.plugin)
    if not specs:
        return raw, sections
    return {**raw, "plugins": [dict(sections.plugins[s]) for s in specs]}, sections


def _auto_k_max(d: dict[str, Any], sections: Sections, upper: int) -> int:
    """`time_dilation: auto`: replayed compute only (the k chosen may be above 1), and the largest
    whole k up to `upper` at which the dilated workload and scheduler tunables still pass their
    models (each bound is one-sided in k, so a bisection finds it)."""
    if d["workload"].get("compute", "real") != "replay":
        raise ConfigError(f"time_dilation: {AUTO} needs workload.compute: replay; the k it picks may be above 1, and "
                          f"real PyTorch compute runs at the machine's own speed and cannot be slowed down (replay a "
                          f"profile, or set time_dilation: 1)")

    def fits(k: int) -> bool:
        try:
            _check_dilated_sections(k, d, sections)
        except ConfigError:
            return False
        return True

    lo, hi = 1, upper
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
    return lo


def _check_dilated_sections(k: float, d: dict[str, Any], sections: Sections) -> None:
    """With time dilation k > 1, the roles get replayed compute k times slower and the
    scheduler's times x k (emu/config/dilation.py): refuse real compute, which cannot be slowed
    down, and check the values the roles will get against their own models."""
    if k == 1:
        return
    workload = d["workload"]
    if workload.get("compute", "real") != "replay":
        raise ConfigError(f"time_dilation: {k:g} needs workload.compute: replay; real PyTorch compute runs at the "
                          f"machine's own speed and cannot be slowed down {k:g} times (replay a profile, or set "
                          f"time_dilation: 1)")
    if sections.workload is not None:
        try:
            sections.workload.model_validate(dilate_workload(workload, k))
        except ValidationError as e:
            raise ConfigError(f"time_dilation: {k:g} replays compute {k:g} times slower (speedup / {k:g}), and "
                              f"{describe(e, 'workload')}") from None
    name = d["scheduler"]
    if name in sections.schedulers:
        params = d["schedulers"].get(name) or {}
        try:
            model = sections.schedulers[name]
            model.model_validate(dilate_params({**_time_params(model, params), **params}, k))
        except ValidationError as e:
            raise ConfigError(f"time_dilation: {k:g} x {describe(e, f'schedulers.{name}')} (a scheduler's times "
                              f"are multiplied by time_dilation)") from None
