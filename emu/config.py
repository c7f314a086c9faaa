"""Typed experiment configuration: YAML in, validated `Experiment` objects out.

Every error becomes one `ConfigError` whose text names the field
(`topology.hosts[1].bw_mbps: must be > 0`), so the CLI can print one line and exit 2
before anything is created or started.

emu/ may not import workloads/ or schedulers/, yet their sections must be validated up
front. So the caller passes their pydantic models in (`Sections`): dependency injection
keeps the layering and still validates everything before a run starts.
"""
from __future__ import annotations

import copy
import hashlib
import itertools
import json
import math
import platform
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, Mapping

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator, model_validator

from emu import capabilities, yaml_input
from emu.crosstraffic import Flow
from emu.shaping import MAX_RATE_CHANGES, LinkShaping
from emu.topospec import MAX_GRAPH_NODES, TOPOLOGY_KINDS, NetSpec, Topology
from emu.yaml_input import MAX_DEPTH, MAX_FILE_BYTES, InputError, YamlSyntaxError

# Every experiment of a plan (a shard's too) is validated and held before the first run
# starts, at about 0.1 ms and 10 KB each; 5,000 runs of tens of seconds are days of one machine.
MAX_RUNS = 5_000
# All experiments of a plan together, in config values plus ten per host and link of each
# experiment's network (a host or link costs about ten values to validate): about 0.5 s.
MAX_PLAN_SIZE = 1_000_000
# A run holds the machine's one emulated network; a week is beyond any experiment here.
MAX_TIMEOUT_S = 7 * 24 * 3600
# Each flow is an iperf3 server and client with its own port from 5201.
MAX_FLOWS = 256
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
    servers: list[str] = Field(default_factory=list, description="parameter servers (PS family only)")
    workers: list[str] | Literal["rest"] = Field(description='host names, or "rest": every host not a server')

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
    interval_s: float = Field(default=0.1, ge=0.001, le=0.1,
                              description="link counters and CPU: 10 Hz or better")
    qdisc_interval_s: float = Field(default=0.1, ge=0.001, le=10,
                                    description="qdisc backlog/drops; costs one tc call per host each time")


class TcpConfig(Strict):
    """TCP as the emulated hosts run it. Set in every host's network namespace, because a
    namespace otherwise inherits the machine's default, and that default changes results:
    on this machine it is bbr, under which the four result streams of a parameter server
    sharing one link drifted apart by 150 ms per iteration and mercury ran 1.33x slower
    than with cubic (610 vs 458 ms on configs/sweeps/reference.yaml)."""

    congestion_control: str = Field(default="cubic", pattern=r"^[a-z0-9_]{1,15}$",
                                    description="net.ipv4.tcp_congestion_control in every host (Linux's default: cubic)")

    @field_validator("congestion_control")
    @classmethod
    def _available(cls, name: str) -> str:
        have = capabilities.tcp_congestion_controls()
        if have and name not in have:
            raise ValueError(f"{name!r} is not available in this kernel ({platform.release()}); "
                             f"it has: {', '.join(have)}")
        return name


class FidelityConfig(Strict):
    """Thresholds of the per-run fidelity verdict (after Handigol et al., CoNEXT 2012)."""

    window_s: float = Field(default=1.0, ge=0.1, le=MAX_TIMEOUT_S,
                            description="a window holds samples at 10 Hz")
    cpu_idle_min: float = Field(default=0.35, ge=0, le=1, description="machine CPU idle, every window")
    rate_tolerance: float = Field(default=0.05, ge=0, description="realized rate <= configured x (1 + this)")
    saturated_min: float = Field(default=0.9, ge=0, le=1, description="a link with proven queued work reaches this x rate")


class Experiment(Strict):
    """One fully resolved experiment: what `run_id` hashes."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
    seed: int = Field(default=0, ge=0, le=2 ** 32 - 1,
                      description="torch gets seed x 1000 + stream, which must fit in 64 bits")
    timeout_s: float = Field(default=600, ge=1, le=MAX_TIMEOUT_S, description="wall-clock limit of one run")
    trace: bool = Field(default=False, description="record scheduler events into events.parquet")
    topology: Topology
    shaping: list[LinkShaping] = Field(default_factory=list, max_length=2 * MAX_GRAPH_NODES)
    cross_traffic: list[Flow] = Field(default_factory=list, max_length=MAX_FLOWS)
    host_cpu: dict[str, Annotated[float, Field(gt=0, le=1)]] = Field(
        default_factory=dict, description="host -> share of the machine's CPU (CFS bandwidth cgroup)")
    monitor: MonitorConfig = MonitorConfig()
    tcp: TcpConfig = TcpConfig()
    fidelity: FidelityConfig = FidelityConfig()
    roles: Roles
    workload: dict[str, Any]
    scheduler: str
    schedulers: dict[str, dict[str, Any]] = Field(default_factory=dict)
    _net: NetSpec | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _consistent(self) -> "Experiment":
        try:
            net = self.topology.resolve()
        except ValueError as e:
            raise ConfigError(f"topology.{e}") from None
        hosts = set(net.hosts)
        for i, n in enumerate(self.roles.servers):
            if n not in hosts:
                raise ConfigError(f"roles.servers[{i}]: {n!r} is not a host of the topology")
        if self.roles.workers == "rest":
            workers = [h for h in net.hosts if h not in self.roles.servers]
            if not workers:
                raise ConfigError("roles.workers: no host is left for workers")
            object.__setattr__(self, "roles", Roles(servers=self.roles.servers, workers=workers))
        for i, n in enumerate(self.roles.workers):
            if n not in hosts:
                raise ConfigError(f"roles.workers[{i}]: {n!r} is not a host of the topology")
        for h in self.host_cpu:
            if h not in hosts:
                raise ConfigError(f"host_cpu.{h}: {h!r} is not a host of the topology")
        if self.host_cpu and "cpu" not in capabilities.cgroup_controllers():
            raise ConfigError("host_cpu: needs the cgroup cpu controller (CFS bandwidth), which is not mounted here")
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
        netem = net.needs_netem()
        if netem and not capabilities.has_qdisc("netem"):
            ln = net.links[netem[0]]
            raise ConfigError(f"topology: link {ln.a}-{ln.b} asks for delay_ms/loss_pct, which needs the netem "
                              f"qdisc (CONFIG_NET_SCH_NETEM); this kernel ({platform.release()}) has none")
        self._net = net
        return self

    @property
    def net(self) -> NetSpec:
        return self._net

    @property
    def scheduler_params(self) -> dict[str, Any]:
        return dict(self.schedulers.get(self.scheduler, {}))

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


def _drop_empty(d: Any) -> Any:
    if isinstance(d, dict):
        return {k: _drop_empty(v) for k, v in d.items() if v not in (None, {}, [])}
    return d


@dataclass(frozen=True)
class Sections:
    """Validators for the sections that belong to upper layers.

    workload: pydantic model of the `workload:` section.
    schedulers: scheduler name -> pydantic model of its tunables.
    """

    workload: type[BaseModel] | None = None
    schedulers: Mapping[str, type[BaseModel]] = field(default_factory=dict)


@dataclass(frozen=True)
class Plan:
    """What a config file asks for: the experiments of its grid, each repeated."""

    name: str
    experiments: list[Experiment]
    repeats: int
    source: Path
    points: list[dict[str, Any]] = field(default_factory=list)  # the grid/zip values of each experiment


# ---------------------------------------------------------------------------- errors

def _num(x: Any) -> str:
    return f"{x:g}" if isinstance(x, float) else str(x)


def _r(x: Any) -> str:
    """repr of a value the user gave, short enough for one line (it may be a 1 MB string)."""
    if isinstance(x, str) and len(x) > 60:
        return repr(x[:57]) + "..."
    if isinstance(x, (list, dict)) and len(x) > 8:
        return f"a {type(x).__name__} of {len(x)} items"
    text = repr(x)
    return text if len(text) <= 80 else text[:77] + "..."


_MESSAGES = {
    "extra_forbidden": lambda e: "unknown key",
    "missing": lambda e: "required field is missing",
    "greater_than": lambda e: f"must be > {_num(e['ctx']['gt'])}",
    "greater_than_equal": lambda e: f"must be >= {_num(e['ctx']['ge'])}",
    "less_than": lambda e: f"must be < {_num(e['ctx']['lt'])}",
    "less_than_equal": lambda e: f"must be <= {_num(e['ctx']['le'])}",
    "too_short": lambda e: f"must have at least {e['ctx']['min_length']} item(s)",
    "too_long": lambda e: f"must have at most {e['ctx']['max_length']} item(s)",
    "finite_number": lambda e: f"must be a finite number, got {_r(e['input'])}",
    "int_type": lambda e: f"must be an integer, got {_r(e['input'])}",
    "int_parsing": lambda e: f"must be an integer, got {_r(e['input'])}",
    "int_from_float": lambda e: f"must be an integer, got {_r(e['input'])}",
    "float_type": lambda e: f"must be a number, got {_r(e['input'])}",
    "float_parsing": lambda e: f"must be a number, got {_r(e['input'])}",
    "string_type": lambda e: f"must be a string, got {_r(e['input'])}",
    "list_type": lambda e: f"must be a list, got {_r(e['input'])}",
    "tuple_type": lambda e: f"must be a list, got {_r(e['input'])}",
    "dict_type": lambda e: f"must be a mapping, got {_r(e['input'])}",
    "model_type": lambda e: f"must be a mapping, got {_r(e['input'])}",
    "bool_type": lambda e: f"must be true or false, got {_r(e['input'])}",
    "bool_parsing": lambda e: f"must be true or false, got {_r(e['input'])}",
    "string_pattern_mismatch": lambda e: f"{_r(e['input'])} must match {e['ctx']['pattern']}",
    "literal_error": lambda e: f"must be one of {e['ctx']['expected']}, got {_r(e['input'])}",
}


def _path(prefix: str, loc: tuple) -> str:
    out = prefix
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif str(part).startswith("["):
            out += str(part)
        else:
            out += f".{part}" if out else str(part)
    return out


_SUBPATH = re.compile(r"^((?:\[\d+\]|\.?[A-Za-z_][\w]*)(?:\[\d+\]|\.[A-Za-z_]\w*)*): (.*)$", re.S)
_TAGS = set(TOPOLOGY_KINDS) | {"steps", "square", "onoff", "mahimahi", "csv", "slow", "lognormal"}
_UNIONS = {"topology", "schedule", "heterogeneity"}  # fields whose value is a tagged union


def describe(err: ValidationError, prefix: str = "") -> str:
    """First error of a ValidationError as `field.path: reason`."""
    e = err.errors()[0]
    # Tagged unions put the tag in loc (topology.star.hosts...); it adds nothing for the user.
    loc: tuple = ()
    raw = e["loc"]
    for i, p in enumerate(raw):
        is_tag = isinstance(p, str) and p in _TAGS and i and raw[i - 1] in _UNIONS
        if isinstance(p, str) and p.startswith("function-") or is_tag:
            continue
        loc += (p,)
    if e["type"] in ("union_tag_invalid", "union_tag_not_found"):
        tag = e["ctx"]["discriminator"].strip("'")
        known = e["ctx"].get("expected_tags", "")
        got = e["ctx"].get("tag")
        what = f"unknown kind {got!r}" if got is not None else "required field is missing"
        return f"{_path(prefix, loc)}.{tag}: {what}" + (f" (known: {known.replace(chr(39), '')})" if known else "")
    fmt = _MESSAGES.get(e["type"])
    if fmt is not None:
        msg = fmt(e)
    else:
        msg = e["msg"]
        for lead in ("Value error, ", "Assertion failed, "):
            if msg.startswith(lead):
                msg = msg[len(lead):]
    if msg.startswith(("roles.", "topology", "workload.", "schedulers.", "shaping[", "cross_traffic[")):
        return msg  # already a full path (raised by a model validator)
    # A validator may have put a sub-path in front of its message: "[1].name: ...", "hosts[2].name: ..."
    m = _SUBPATH.match(msg)
    if m:
        sub, msg = m.group(1), m.group(2)
        base = _path(prefix, loc)
        joiner = "" if sub.startswith("[") or not base else "."
        return f"{base}{joiner}{sub.lstrip('.')}: {msg}"
    return f"{_path(prefix, loc)}: {msg}" if loc or prefix else msg


# ---------------------------------------------------------------------------- loading

def read_yaml(path: Path) -> dict[str, Any]:
    """A config or sweep file, read and parsed within the limits of emu/yaml_input.py."""
    try:
        data = yaml_input.load_file(path, MAX_FILE_BYTES)
        if not isinstance(data, dict):
            got = "nothing (an empty file)" if data is None else f"a {type(data).__name__}"
            raise InputError(yaml_input.shown(path), f"must contain a mapping at the top level, got {got}")
        yaml_input.check_values(data)
    except InputError as e:
        raise ConfigError(str(e)) from None
    return data


def set_dotted(d: dict[str, Any], key: str, value: Any, copy_path: bool = False) -> None:
    """`topology.hosts.1.bw_mbps = 5` style assignment into nested dicts and lists.
    copy_path: copy each container on the way (shallow) instead of changing it in place, so
    a grid point changes its own variant and shares the rest with the base."""
    if not isinstance(key, str):
        raise ConfigError(f"{_r(key)}: a dotted key must be a string")
    parts = key.split(".", MAX_DEPTH)
    if len(parts) > MAX_DEPTH:
        raise ConfigError(f"{key[:60]}...: a key of more than {MAX_DEPTH} levels")
    cur: Any = d
    for i, p in enumerate(parts[:-1]):
        nxt = parts[i + 1]
        if isinstance(cur, list):
            try:
                at: Any = int(p)
                child = cur[at]
            except (ValueError, IndexError):
                raise ConfigError(f"{key}: no list item {p!r}") from None
        else:
            if not isinstance(cur, dict):
                raise ConfigError(f"{key}: {'.'.join(parts[:i])} is not a mapping")
            at = p
            child = cur.setdefault(p, [] if nxt.isdigit() else {})
        if copy_path and isinstance(child, (dict, list)):
            child = cur[at] = copy.copy(child)
        cur = child
    last = parts[-1]
    if isinstance(cur, list):
        try:
            cur[int(last)] = value
        except (ValueError, IndexError):
            raise ConfigError(f"{key}: no list item {last!r}") from None
    elif isinstance(cur, dict):
        cur[last] = value
    else:
        raise ConfigError(f"{key}: parent is not a mapping")


def parse_override(text: str) -> tuple[str, Any]:
    """`key=value` from the command line; the value is parsed as YAML (numbers, lists...),
    within the same limits as a config file; text that is not YAML stays a string."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"--set {_r(text)}: expected key=value")
    key = key.strip()
    where = f"--set {key}"
    try:
        if len(text.encode(errors="surrogateescape")) > MAX_FILE_BYTES:
            raise InputError(where, f"longer than {MAX_FILE_BYTES} bytes")
        try:
            value = yaml_input.parse(raw, where) if raw.strip() else ""
        except YamlSyntaxError:
            value = raw
        yaml_input.check_values(value, where)
    except InputError as e:
        raise ConfigError(str(e)) from None
    return key, value


def validate_experiment(raw: dict[str, Any], sections: Sections, base_dir: Path = Path(".")) -> Experiment:
    ctx = {"base_dir": str(base_dir)}
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
    return Experiment.model_validate(d, context=ctx)


_PLAN_KEYS = ("base", "set", "grid", "zip", "seeds", "repeats")


def _listing(raw: dict, key: str) -> dict[str, list]:
    value = raw.pop(key, None) or {}
    if not isinstance(value, dict):
        raise ConfigError(f"{key}: must be a mapping of config keys to lists of values")
    for k, vals in value.items():
        if not isinstance(vals, list) or not vals:
            raise ConfigError(f"{key}.{k}: must be a non-empty list of values")
    return value


def load_plan(path: str | Path, sections: Sections, overrides: list[str] = ()) -> Plan:
    """Read a config or sweep file into the experiments it describes.

    The experiment is either the file itself or, with `base: FILE` (relative to this file),
    another config file, updated by `set: {dotted.key: value}`. On top of it:
    - `grid`: dotted keys -> lists of values; their Cartesian product is run;
    - `zip`: dotted keys -> lists of equal length, taken together (one point per index);
    - `seeds`: a list of seeds (a grid over `seed`);
    - `repeats`: how often each point runs (default 1); each repeat has its own run_id.
    `overrides` (`key=value`, from --set) apply to the experiment before the grid.
    """
    path = Path(path)
    raw = read_yaml(path)
    base_dir = path.parent
    if "base" in raw:
        base = raw.pop("base")
        if not isinstance(base, str):
            raise ConfigError("base: must be the path of a config file")
        base_path = base_dir / base
        updates = raw.pop("set", None) or {}
        plan_keys = {k: raw.pop(k) for k in ("grid", "zip", "seeds", "repeats") if k in raw}
        if not isinstance(updates, dict):
            raise ConfigError("set: must be a mapping of config keys to values")
        name = raw.pop("name", None)
        if raw:
            raise ConfigError(f"{next(iter(raw))}: unknown key in a sweep file (known: name, "
                              f"{', '.join(_PLAN_KEYS)})")
        raw = read_yaml(base_path)
        for k in ("grid", "zip", "seeds", "repeats"):
            raw.pop(k, None)  # the sweep file's own plan replaces the base's
        raw.update(plan_keys)
        for k, v in updates.items():
            set_dotted(raw, k, v)
        if name is not None:
            raw["name"] = name
        base_dir = base_path.parent
    for text in overrides:
        k, v = parse_override(text)
        set_dotted(raw, k, v)
    grid = _listing(raw, "grid")
    zipped = _listing(raw, "zip")
    seeds = raw.pop("seeds", None)
    if seeds is not None:
        if not isinstance(seeds, list) or not seeds or not all(isinstance(x, int) and x >= 0 for x in seeds):
            raise ConfigError(f"seeds: must be a non-empty list of integers >= 0, got {_r(seeds)}")
        grid["seed"] = seeds
    repeats = raw.pop("repeats", 1)
    if not isinstance(repeats, int) or isinstance(repeats, bool) or repeats < 1:
        raise ConfigError(f"repeats: must be an integer >= 1, got {_r(repeats)}")
    lengths = {k: len(v) for k, v in zipped.items()}
    if len(set(lengths.values())) > 1:
        raise ConfigError("zip: lists must have equal lengths (" +
                          ", ".join(f"{k} has {n}" for k, n in lengths.items()) + ")")
    # Counted before anything is expanded: 10 lists of 10 values are 10^10 points.
    runs = math.prod(len(v) for v in grid.values()) * max(lengths.values(), default=1) * repeats
    if runs > MAX_RUNS:
        sizes = ", ".join([f"{k}: {len(v)}" for k, v in grid.items()] +
                          ([f"zip: {max(lengths.values())}"] if zipped else []) +
                          ([f"repeats: {repeats}"] if repeats > 1 else []))
        raise ConfigError(f"grid: {runs} runs ({sizes}); a plan has at most {MAX_RUNS} "
                          f"(split the sweep into several files)")
    try:
        values = yaml_input.check_values(raw)  # the merged config: --set a.b.c... may nest it deeper
    except InputError as e:
        raise ConfigError(str(e)) from None
    points_total = runs // repeats
    if points_total * values > MAX_PLAN_SIZE:
        raise ConfigError(f"grid: {points_total} experiments of {values} values each; a plan holds at most "
                          f"{MAX_PLAN_SIZE} values in all (split the sweep into several files)")
    zip_points = [dict(zip(zipped, vals)) for vals in zip(*zipped.values())] if zipped else [{}]
    experiments: list[Experiment] = []
    points: list[dict[str, Any]] = []
    keys = list(grid)
    size = 0
    for combo in itertools.product(*(grid[k] for k in keys)):
        for zp in zip_points:
            point = {**dict(zip(keys, combo)), **zp}
            variant = dict(raw)
            for k, v in point.items():
                set_dotted(variant, k, v, copy_path=True)
            try:
                experiments.append(validate_experiment(variant, sections, base_dir))
                points.append(point)
            except ConfigError as e:
                if point:
                    where = ", ".join(f"{k}={_r(v)}" for k, v in point.items())
                    raise ConfigError(f"{e} (grid point {where})") from None
                raise
            net = experiments[-1].net
            size += values + 10 * (len(net.hosts) + len(net.links))
            if size > MAX_PLAN_SIZE:
                raise ConfigError(f"grid: {points_total} experiments of {values} values and {len(net.hosts)} "
                                  f"hosts each; a plan holds at most {MAX_PLAN_SIZE} values in all, counting "
                                  f"ten per host and link (split the sweep into several files)")
    name = experiments[0].name
    return Plan(name=name, experiments=experiments, repeats=repeats, source=path, points=points)
