"""The config reference: every key a config can hold, read off the pydantic models.

A pure function of model classes, no I/O: `collect(Experiment, workload=..., schedulers=...)`
walks the experiment model and the upper layers' models handed in (as `Sections` hands them
to validation: emu/ imports neither workloads/ nor schedulers/) and returns a `Reference`:
sections, each of one or more blocks (one per variant of a discriminated union: a topology
kind, a shaping schedule kind, a heterogeneity kind), each a list of `Key`s with their dotted
path (`topology.heterogeneity.pick`, `schedulers.forest.replan_threshold`; a list's items are
`shaping[].link`), type, default, unit, range, meaning and an example value.

The meaning is the field's description; the range comes from its constraints (ge, gt, le, lt,
lengths, patterns) and choices (Literal); the unit from the name's suffix (`_s`, `_ms`, `_mbps`,
`_numel`, ...) or else the first unit word of the description (`fraction`, `count`, `ratio`,
...). `render_markdown` gives docs/config-reference.md (`./inv explain --write`), `find` and
`render_key` what `./inv explain KEY` prints.
"""
from __future__ import annotations

import difflib
import re
import types
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import yaml
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

GENERAL = "general"   # the section of the experiment's scalar keys
SWEEP = "sweep"       # the section of a plan's keys (emu/config/plan.py)

# A field's unit from its name: the first suffix that matches.
SUFFIX_UNITS = (("_mbps", "Mb/s"), ("_ms", "ms"), ("_us", "µs"), ("_s", "s"), ("_pct", "%"), ("_mb", "MiB"),
                ("_kb", "KiB"), ("_bytes", "bytes"), ("_numel", "elements"), ("_pkts", "packets"))
# Else the unit is the earliest of these words in its description.
UNIT_WORDS = (("seconds", "s"), ("milliseconds", "ms"), ("ms", "ms"), ("microseconds", "µs"), ("Mb/s", "Mb/s"),
              ("MiB", "MiB"), ("KiB", "KiB"), ("bytes", "bytes"), ("elements", "elements"),
              ("floats", "elements"), ("packets", "packets"), ("percent", "%"), ("fraction", "fraction"),
              ("count", "count"), ("ratio", "ratio"), ("factor", "factor"), ("dimensionless", "dimensionless"),
              ("seed", "seed"))
_UNIT_RE = re.compile("|".join(rf"(?<![\w/]){re.escape(w)}(?![\w/])" for w, _ in UNIT_WORDS))

# How a config writes a key whose model holds something else: `plugins:` lists files or module
# names, which validation replaces by their identities (PluginRef).
AS_WRITTEN = {"plugins": "list of str"}
# Units a description's words cannot give (a pair of two units).
UNITS = {"shaping[].schedule.steps": "s, Mb/s"}
# Examples for keys without a default worth showing (the rest show their default, or a value in range).
EXAMPLES: dict[str, Any] = {
    "name": "demo", "plugins": ["my_scheduler.py"], "label": "tuned", "host_cpu": {"h1": 0.5},
    "topology.hosts[].name": "h1", "topology.hosts[].bw_mbps": 100,
    "topology.bw_mbps": 100, "topology.count": 4, "topology.hosts": [{"name": "h1", "bw_mbps": 100}],
    "topology.keep": ["h0"], "topology.heterogeneity.count": 1, "topology.heterogeneity.sigma": 0.5,
    "topology.heterogeneity.ratio": 4, "topology.racks": 2, "topology.hosts_per_rack": 4, "topology.sites": 2,
    "topology.hosts_per_site": [4, 2], "topology.host_bw_mbps": 1000, "topology.wan_mbps": 100,
    "topology.nodes": [{"name": "h1", "kind": "host"}, {"name": "s1", "kind": "switch"}],
    "topology.nodes[].name": "s1", "topology.links": [{"a": "h1", "b": "s1", "bw_mbps": 100}],
    "topology.links[].a": "h1", "topology.links[].b": "s1", "topology.links[].bw_mbps": 100,
    "*.delay_ms": 5, "*.loss_pct": 0.1, "*.queue_pkts": 1000,
    "topology.wan_delay_ms": 20, "topology.uplink_spread": 2, "topology.host_spread": 2,
    "topology.tenants_per_rack": 1, "topology.hosts[].up_mbps": 40, "topology.hosts[].down_mbps": 20,
    "topology.links[].ab_mbps": 40, "topology.links[].ba_mbps": 20,
    "shaping[].link": ["h1", "s1"], "shaping[].schedule.steps": [[0, 100], [10, 20]],
    "shaping[].schedule.period_s": 4, "shaping[].schedule.high_mbps": 100, "shaping[].schedule.low_mbps": 10,
    "shaping[].schedule.on_mbps": 100, "shaping[].schedule.off_mbps": 0, "shaping[].schedule.mean_on_s": 5,
    "shaping[].schedule.mean_off_s": 1, "shaping[].schedule.file": "../traces/wifi_like.csv",
    "cross_traffic[].src": "h2", "cross_traffic[].dst": "h1", "cross_traffic[].rate_mbps": 50,
    "cross_traffic[].stop_s": 30, "roles.servers": ["h0"], "roles.workers": "rest",
    "faults[].at_s": 10, "faults[].target": "worker0", "faults[].for_s": 5, "faults[].cpu": 0.1,
    "watchdog.stall_s": 30, "monitor.backend": "netlink", "monitor.netlink_qdisc_interval_s": 0.01,
    "workload.profile": "profiles/cnn-small.json",
    "base": "priority_base.yaml", "set": {"workload.iterations": 20}, "grid": {"topology.bw_mbps": [10, 100]},
    "zip": {"topology.count": [4, 8], "workload.batch_size": [16, 32]}, "seeds": [0, 1, 2], "repeats": 3,
}
# The keys of a sweep or plan file (emu/config/plan.py load_plan): (key, type, default, meaning, example).
SWEEP_KEYS = (
    ("base", "str", "unset", "sweep file: the config file (relative to this file) the sweep starts from", "base"),
    ("set", "mapping of dotted key to value", "{}", "sweep file: dotted keys set in the base config "
     "(`topology.hosts.1.bw_mbps: 5`), before the grid", "set"),
    ("name", "str", "the base's name", "sweep file: the experiment's name, in place of the base's", "name"),
    ("grid", "mapping of dotted key to list", "{}", "dotted keys -> lists of values; their Cartesian product is "
     "run (a sweep file's grid replaces the base's)", "grid"),
    ("zip", "mapping of dotted key to list", "{}", "dotted keys -> lists of equal length, taken together (one "
     "point per index), times the grid", "zip"),
    ("seeds", "list of int", "unset", "a list, one integer seed per experiment: a grid over `seed`", "seeds"),
    ("repeats", "int", "1", "how often each point runs (count); each repeat has its own run id", "repeats"),
)


@dataclass(frozen=True)
class Key:
    """One key of the reference. `when`: the variant it belongs to (`topology.kind: star`), or ''."""

    path: str
    type: str
    default: str
    unit: str
    range: str
    meaning: str
    example: str
    when: str = ""
    numeric: bool = False   # an int or float field (so it has a unit)


@dataclass
class Block:
    title: str
    when: str = ""
    keys: list[Key] = field(default_factory=list)


@dataclass
class Section:
    name: str
    meaning: str
    blocks: list[Block] = field(default_factory=list)

    def keys(self) -> Iterator[Key]:
        for b in self.blocks:
            yield from b.keys


@dataclass
class Reference:
    sections: list[Section]

    def keys(self) -> list[Key]:
        return [k for s in self.sections for k in s.keys()]

    def top_level(self) -> list[Key]:
        """The top-level keys, each once (sweep keys apart), their meaning cut to its first clause."""
        seen: dict[tuple[str, bool], Key] = {}
        for k in self.keys():
            if "." not in k.path and "[" not in k.path:
                seen.setdefault((k.path, k.when == SWEEP), replace(k, meaning=_first_clause(k.meaning)))
        return list(seen.values())


class UnknownKey(KeyError):
    """`find` of a key the reference does not have; `close`: the nearest keys."""

    def __init__(self, key: str, close: list[str]):
        super().__init__(key)
        self.key, self.close = key, close

    def __str__(self) -> str:
        hint = f" (did you mean: {', '.join(self.close)}?)" if self.close else ""
        return f"unknown config key {self.key!r}{hint}"


# ---------------------------------------------------------------------------- types

def _unwrap(ann: Any) -> tuple[Any, list[Any]]:
    """`ann` without Annotated, and the constraints it carried (FieldInfo's flattened)."""
    meta: list[Any] = []
    while get_origin(ann) is Annotated:
        ann, *more = get_args(ann)
        meta += more
    flat: list[Any] = []
    for m in meta:
        if isinstance(m, FieldInfo):
            flat += m.metadata
            if m.discriminator is not None:
                flat.append(_Disc(m.discriminator))
        else:
            flat.append(m)
    return ann, flat


@dataclass(frozen=True)
class _Disc:
    name: Any


def _is_union(ann: Any) -> bool:
    return get_origin(ann) in (Union, types.UnionType)


def _members(ann: Any) -> list[Any]:
    return [a for a in get_args(ann) if a is not type(None)] if _is_union(ann) else [ann]


def _is_model(ann: Any) -> bool:
    return isinstance(ann, type) and issubclass(ann, BaseModel)


def _type_name(ann: Any, in_union: bool = False) -> str:
    ann, _ = _unwrap(ann)
    if _is_union(ann):
        members = _members(ann)
        if len(members) == 1:   # X | None: unset is the default's business
            return _type_name(members[0], in_union)
        names = [_type_name(a, True) for a in members]
        return " or ".join(dict.fromkeys(names))
    origin = get_origin(ann)
    if origin is Literal:
        values = get_args(ann)
        return " or ".join(f'"{v}"' for v in values) if in_union else _type_name(type(values[0]))
    if origin is list:
        return f"list of {_type_name(get_args(ann)[0])}"
    if origin is tuple:
        return "[" + ", ".join(_type_name(a) for a in get_args(ann)) + "]"
    if origin in (dict, Mapping):
        k, v = get_args(ann)
        return f"mapping of {_type_name(k)} to {_type_name(v)}"
    if _is_model(ann):
        return "mapping"
    if ann is Any:
        return "any"
    return getattr(ann, "__name__", str(ann))


def _num(x: Any) -> str:
    if isinstance(x, float) and x.is_integer() and abs(x) < 1e15:
        return str(int(x))
    return str(x)


def _bounds(meta: list[Any]) -> list[str]:
    got = {n: getattr(m, n) for m in meta for n in ("ge", "gt", "le", "lt", "multiple_of", "min_length",
                                                    "max_length", "pattern") if getattr(m, n, None) is not None}
    parts = []
    lo = ("[", got["ge"]) if "ge" in got else ("(", got["gt"]) if "gt" in got else None
    hi = ("]", got["le"]) if "le" in got else (")", got["lt"]) if "lt" in got else None
    if lo and hi:
        parts.append(f"{lo[0]}{_num(lo[1])}, {_num(hi[1])}{hi[0]}")
    elif lo:
        parts.append(f"{'>=' if lo[0] == '[' else '>'} {_num(lo[1])}")
    elif hi:
        parts.append(f"{'<=' if hi[0] == ']' else '<'} {_num(hi[1])}")
    if "multiple_of" in got:
        parts.append(f"multiple of {_num(got['multiple_of'])}")
    lo_n, hi_n = got.get("min_length"), got.get("max_length")
    if lo_n is not None and hi_n is not None:
        parts.append(f"{lo_n} to {hi_n} items")
    elif hi_n is not None:
        parts.append(f"at most {hi_n} items")
    elif lo_n is not None:
        parts.append(f"at least {lo_n} item{'s' if lo_n != 1 else ''}")
    if "pattern" in got:
        parts.append(f"pattern {got['pattern']}")
    return parts


def _range(ann: Any, meta: list[Any] = ()) -> list[str]:
    inner, more = _unwrap(ann)
    parts = _bounds([*meta, *more])
    if _is_union(inner):
        members = _members(inner)
        literal = [get_origin(_unwrap(a)[0]) is Literal for a in members]
        for a, is_literal in zip(members, literal):
            if not (is_literal and not all(literal)):  # `list of str or "best"`: the type names the word
                parts += _range(a)
    elif get_origin(inner) is Literal:
        parts.append("one of: " + ", ".join(str(v) for v in get_args(inner)))
    elif get_origin(inner) is list:
        parts += [f"each {p}" for p in _range(get_args(inner)[0])]
    elif get_origin(inner) is tuple:
        for a in get_args(inner):
            parts += _range(a)
    elif get_origin(inner) in (dict, Mapping):
        parts += _range(get_args(inner)[1])
    return list(dict.fromkeys(parts))


def _leaf_types(ann: Any) -> Iterator[Any]:
    ann, _ = _unwrap(ann)
    origin = get_origin(ann)
    if _is_union(ann):
        for a in _members(ann):
            yield from _leaf_types(a)
    elif origin in (list, tuple):
        for a in get_args(ann):
            yield from _leaf_types(a)
    elif origin in (dict, Mapping):
        yield from _leaf_types(get_args(ann)[1])
    else:
        yield ann


def _numeric(ann: Any) -> bool:
    return any(t in (int, float) for t in _leaf_types(ann))


def _model_variants(ann: Any, disc: Any = None) -> tuple[list[type[BaseModel]], Any]:
    """The models a field holds (one, a list's items, or a union's members) and its
    discriminator (or None); no models where it holds anything else."""
    ann, meta = _unwrap(ann)
    disc = next((m.name for m in meta if isinstance(m, _Disc)), disc)
    members = _members(ann)
    if len(members) == 1 and members[0] is not ann:   # X | None
        return _model_variants(members[0], disc)
    if get_origin(ann) is list:
        return _model_variants(get_args(ann)[0], disc)
    models = []
    for m in members:
        m, more = _unwrap(m)
        disc = next((x.name for x in more if isinstance(x, _Disc)), disc)
        if not _is_model(m):
            return [], None
        models.append(m)
    return models, disc


def _is_list(ann: Any) -> bool:
    ann, _ = _unwrap(ann)
    return any(get_origin(_unwrap(a)[0]) is list for a in _members(ann))


def described_unit(meaning: str) -> str:
    """The unit a description names: its earliest word of UNIT_WORDS, or ''."""
    m = _UNIT_RE.search(meaning)
    return dict(UNIT_WORDS)[m.group(0)] if m else ""


def _unit(name: str, meaning: str, numeric: bool) -> str:
    if not numeric:
        return ""
    for suffix, unit in SUFFIX_UNITS:
        if name.endswith(suffix):
            return unit
    return described_unit(meaning)


def _yaml(value: Any) -> str:
    text = yaml.safe_dump(value, default_flow_style=True, width=10 ** 6, sort_keys=False, allow_unicode=True)
    return text.removesuffix("\n").removesuffix("\n...").strip()


def _default(fi: FieldInfo) -> str:
    if fi.is_required():
        return "required"
    value = fi.default_factory() if fi.default_factory is not None else fi.default
    if value is None or value is PydanticUndefined:
        return "unset"
    if isinstance(value, BaseModel):
        return "its keys' defaults"
    return _yaml(value)


def _example(path: str, fi: FieldInfo | None, ann: Any, default: str) -> str:
    name = path.rsplit(".", 1)[-1]
    if path in EXAMPLES or f"*.{name}" in EXAMPLES:
        return _yaml(EXAMPLES.get(path, EXAMPLES.get(f"*.{name}")))
    if default not in ("required", "unset", "its keys' defaults", "[]", "{}"):
        return default
    inner, meta = _unwrap(ann)
    members = _members(inner)
    first, more = _unwrap(members[0])
    meta = [*meta, *more, *(fi.metadata if fi is not None else [])]
    if get_origin(first) is Literal:
        return _yaml(get_args(first)[0])
    if first is bool:
        return "true"
    if first in (int, float):
        got = {n: getattr(m, n) for m in meta for n in ("ge", "gt", "le", "lt") if getattr(m, n, None) is not None}
        lo = got.get("ge", got.get("gt", 0))
        value = lo if "ge" in got and lo > 0 else lo + 1
        hi = got.get("le", got.get("lt"))
        if hi is not None and value > hi:
            value = (lo + hi) / 2
        return _num(value)
    return ""


# ---------------------------------------------------------------------------- the walk

def _field_key(path: str, name: str, fi: FieldInfo, ann: Any, when: str) -> Key:
    meaning = (fi.description or "").strip()
    numeric = _numeric(ann) and path not in AS_WRITTEN
    default = _default(fi)
    models, disc = _model_variants(ann, fi.discriminator)
    if path in AS_WRITTEN:
        type_name, rng = AS_WRITTEN[path], ""
    elif models:
        type_name = "list of mappings" if _is_list(ann) else "mapping"
        rng = "; ".join(_range(ann, fi.metadata)) if _is_list(ann) else ""
        if disc is not None:
            tags = [_tag(m, disc) for m in models]
            rng = "; ".join(p for p in (rng, f"{disc}: " + ", ".join(tags)) if p)
    else:
        type_name, rng = _type_name(ann), "; ".join(_range(ann, fi.metadata))
    unit = UNITS.get(path) or _unit(name, meaning, numeric)
    example = "" if models and path not in EXAMPLES else _example(path, fi, ann, default)
    return Key(path=path, type=type_name, default=default, unit=unit, range=rng, meaning=meaning,
               example=example, when=when, numeric=numeric)


def _tag(model: type[BaseModel], disc: Any) -> str:
    fi = model.model_fields[disc]
    return str(get_args(_unwrap(fi.annotation)[0])[0])


class _Walk:
    def __init__(self, section: Section, substitute: Mapping[str, type[BaseModel]]):
        self.section = section
        self.substitute = substitute

    def model(self, model: type[BaseModel], prefix: str, block: Block, first: str | None = None) -> None:
        """`model`'s keys under `prefix` into `block`; `first`: the field to list first (a variant's kind)."""
        fields = sorted(model.model_fields.items(), key=lambda item: item[0] != first)
        for name, fi in fields:
            path = f"{prefix}.{name}" if prefix else name
            self.one(path, name, fi, fi.annotation, block)

    def one(self, path: str, name: str, fi: FieldInfo, ann: Any, block: Block) -> None:
        if path in self.substitute:
            ann = self.substitute[path]
        block.keys.append(_field_key(path, name, fi, ann, block.when))
        if path in AS_WRITTEN:
            return
        models, disc = _model_variants(ann, fi.discriminator)
        if not models:
            return
        inner = f"{path}[]" if _is_list(ann) else path
        if disc is None or len(models) == 1:
            self.model(models[0], inner, block)
            return
        for m in models:
            tag = _tag(m, disc)
            when = ", ".join(w for w in (block.when, f"{inner}.{disc}: {tag}") if w)
            variant = Block(title=f"{inner} ({disc}: {tag})", when=when)
            self.section.blocks.append(variant)
            self.model(m, inner, variant, first=disc)


def collect(experiment: type[BaseModel], workload: type[BaseModel] | None = None,
            schedulers: Mapping[str, type[BaseModel]] | None = None) -> Reference:
    """The reference of `experiment` (emu/config/experiment.py's Experiment), its `workload:`
    section read off `workload` and `schedulers:` off each scheduler's params model."""
    schedulers = dict(schedulers or {})
    general = Section(GENERAL, "keys at the top level of a config", [Block(GENERAL)])
    sections = [general]
    for name, fi in experiment.model_fields.items():
        ann = fi.annotation
        if name == "workload" and workload is not None:
            ann = workload
        models, _ = _model_variants(ann)
        if name == "schedulers" and schedulers:
            sec = Section(name, (fi.description or "").strip())
            key = replace(_field_key(name, name, fi, fi.annotation, ""), type="mapping of scheduler name to mapping")
            sec.blocks.append(Block(name, keys=[key]))
            for sname, model in schedulers.items():
                block = Block(f"{name}.{sname}", when=f"scheduler: {sname}")
                sec.blocks.append(block)
                _Walk(sec, {}).model(model, f"{name}.{sname}", block)
            sections.append(sec)
        elif models and name not in AS_WRITTEN:
            sec = Section(name, (fi.description or "").strip(), [Block(name)])
            _Walk(sec, {name: ann}).one(name, name, fi, ann, sec.blocks[0])
            sections.append(sec)
        else:
            key = _field_key(name, name, fi, ann, "")
            if name == "scheduler" and schedulers:
                key = replace(key, range="one of: " + ", ".join(schedulers), example=next(iter(schedulers)))
            general.blocks[0].keys.append(key)
    sweep = Section(SWEEP, "keys of a sweep or plan file (emu/config/plan.py): `base`, `set` and `name` in a "
                           "sweep file only; `grid`, `zip`, `seeds` and `repeats` in any config", [Block(SWEEP)])
    for key, type_name, default, meaning, example in SWEEP_KEYS:
        numeric = type_name in ("int", "list of int")
        sweep.blocks[0].keys.append(Key(path=key, type=type_name, default=default,
                                        unit=_unit(key, meaning, numeric), range=">= 1" if key == "repeats" else
                                        ("each >= 0" if key == "seeds" else ""), meaning=meaning,
                                        example=_yaml(EXAMPLES[example]), when=SWEEP, numeric=numeric))
    sections.append(sweep)
    return Reference(sections)


def models_of(experiment: type[BaseModel], workload: type[BaseModel] | None = None,
              schedulers: Mapping[str, type[BaseModel]] | None = None) -> list[type[BaseModel]]:
    """Every model reachable from these (the experiment's fields, recursively), each once."""
    seen: list[type[BaseModel]] = []
    todo = [experiment, *([workload] if workload is not None else []), *(schedulers or {}).values()]
    while todo:
        m = todo.pop(0)
        if m in seen:
            continue
        seen.append(m)
        for fi in m.model_fields.values():
            todo += [x for x in _models_in(fi.annotation) if x not in seen]
    return seen


def _models_in(ann: Any) -> Iterator[type[BaseModel]]:
    ann, _ = _unwrap(ann)
    if _is_model(ann):
        yield ann
    for a in get_args(ann):
        if not isinstance(a, (str, int, float, bool)) and a is not type(None):
            yield from _models_in(a)


def missing_descriptions(models: list[type[BaseModel]]) -> list[str]:
    """`Model.field` of every field of these models without a description."""
    return [f"{m.__module__}.{m.__qualname__}.{name}" for m in models for name, fi in m.model_fields.items()
            if not (fi.description or "").strip()]


# ---------------------------------------------------------------------------- finding and rendering

def _canonical(path: str) -> str:
    """A key as a user may write it (`topology.hosts.0.name`, `shaping[].link`) -> `topology.hosts.name`."""
    parts = [p for p in path.replace("[]", "").replace("[", ".").replace("]", "").split(".") if p]
    return ".".join(p for p in parts if not p.isdigit())


def find(ref: Reference, key: str) -> list[Key]:
    """The keys `key` names: the key itself (one per variant that has it), or a section's or
    mapping's keys (`topology`, `topology.heterogeneity`). Raises UnknownKey."""
    want = _canonical(key.strip())
    if not want:
        raise UnknownKey(key, [])
    got = [k for k in ref.keys() if _canonical(k.path) == want or _canonical(k.path).startswith(want + ".")]
    if got:
        return got
    paths = list(dict.fromkeys(k.path for k in ref.keys()))
    by_canonical = {_canonical(p): p for p in paths}
    close = difflib.get_close_matches(want, list(by_canonical), n=5, cutoff=0.6)
    if not close:  # a misspelt last part: the keys that end like it
        last = want.rsplit(".", 1)[-1]
        close = [c for c in by_canonical if difflib.get_close_matches(last, [c.rsplit(".", 1)[-1]], cutoff=0.8)][:5]
    raise UnknownKey(key, [by_canonical[c] for c in close])


def _first_clause(text: str, limit: int = 110) -> str:
    text = " ".join(text.split())
    text = re.split(r"(?<=[a-z)])(?<!e\.g)(?<!i\.e)\. ", text, maxsplit=1)[0]
    return text if len(text) <= limit else text[:limit - 3].rstrip() + "..."


def render_key(k: Key) -> str:
    """What `./inv explain KEY` prints of one key."""
    rows = [("type", k.type), ("default", k.default), ("unit", k.unit or "—"), ("range", k.range or "—"),
            ("meaning", k.meaning or "—"), ("example", k.example or "—")]
    if k.when:
        rows.insert(0, ("in", "a sweep or plan file" if k.when == SWEEP else k.when))
    if k.example and k.when != SWEEP:
        rows.append(("set it", f"--set {k.path.replace('[]', '.0')}={k.example}"))
    return "\n".join([k.path, *(f"  {name + ':':<9}{value}" for name, value in rows)])


def _cell(text: str, code: bool = False) -> str:
    text = " ".join(str(text).split()).replace("|", "\\|")
    if not text:
        return "—"
    return f"`{text}`" if code else text.replace("<", "&lt;")


def render_markdown(ref: Reference, command: str = "./inv explain --write") -> str:
    """docs/config-reference.md: a section per top-level section, a table per block."""
    n = len(ref.keys())
    out = ["# Config reference", "",
           f"Generated from the pydantic models by `{command}`; do not edit it by hand (a unit test "
           f"compares it with the models). {n} keys.", "",
           "A key is a dotted path into the YAML config (`fidelity.window_s`); `[]` stands for any item "
           "of a list (`shaping[].link`; on the command line `--set shaping.0.link=...`). Where a section "
           "has kinds (a discriminated union), each kind has a table of its own. `./inv explain KEY` "
           "prints one key, or a section's keys.", ""]
    out += ["## Contents", ""] + [f"- [{_title(s)}](#{_anchor(_title(s))})" for s in ref.sections] + [""]
    for s in ref.sections:
        out += [f"## {_title(s)}", ""]
        if s.name in (GENERAL, SWEEP):  # the other sections' meaning is their first row's
            out += [s.meaning[0].upper() + s.meaning[1:] + ".", ""]
        for b in s.blocks:
            if not b.keys:
                continue
            if b.title not in (s.name, GENERAL, SWEEP):
                out += [f"### {b.title}", ""]
            out += ["| key | type | default | unit | range | meaning | example |",
                    "|---|---|---|---|---|---|---|"]
            for k in b.keys:
                out.append("| " + " | ".join([_cell(k.path, True), _cell(k.type), _cell(k.default, True),
                                              _cell(k.unit), _cell(k.range, True), _cell(k.meaning),
                                              _cell(k.example, True)]) + " |")
            out.append("")
    return "\n".join(out)


def _title(s: Section) -> str:
    return {GENERAL: "Top-level keys", SWEEP: "Sweep and plan keys"}.get(s.name, f"`{s.name}`")


def _anchor(title: str) -> str:
    return re.sub(r"[^a-z0-9 _-]", "", title.lower()).replace(" ", "-")
