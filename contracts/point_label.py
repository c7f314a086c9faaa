"""Short labels for the points of a sweep, shared by the dry run, the progress bars and reports.

A label names a point among its sweep's points, so it shows only what varies, abbreviated
(`vgg · w0 42 Mb/s`), never raw JSON, and fits about 40 characters: reports put it in every
table row and figure title, and a progress bar in an 80-column terminal holds about 40
characters beside its counters. A key whose values follow from keys already shown (the zipped
bandwidths of one model, the workers of one topology) is left out; the full point goes in a
legend table once. A point named in its sweep file (`point_name`) shows that name.
"""
from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from typing import Any

POINT_NAME = "point_name"  # a zip list, or the names of a grid key's values (emu/config/plan.py)
LIMIT = 40
SEP = " · "
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9 _.,:;=+/()%-]{0,39}$"
# Keys that tell treatments apart (scheduler, its tunables, seed...), not points: never in a label.
_TREATMENT = ("scheduler", "seed", "schedulers", "roles.servers", "label", "plugins", POINT_NAME)
_UNITS = (("_mbps", " Mb/s"), ("_ms", " ms"), ("_us", " us"), ("_bytes", " B"), ("_numel", ""), ("_s", " s"))
_KNOWN = {"workload.model": "", "workload.preset": "", "workload.speedup": "speed-up", "workload.batch_size": "batch",
          "topology.count": "hosts", "roles.workers": "workers", "workload.compute": "", "topology.kind": "",
          "time_dilation": "k", "topology.heterogeneity.count": "slow hosts", "topology.heterogeneity.ratio": "spread",
          "topology.heterogeneity.sigma": "sigma", "topology.heterogeneity.factor": "slow x",
          "topology.host_spread": "host spread", "topology.uplink_spread": "uplink spread",
          "topology.wan_spread": "WAN spread", "topology.wan_mbps": "WAN", "topology.bw_mbps": "links"}


def is_treatment(key: str) -> bool:
    return key in _TREATMENT or key.startswith("schedulers.")


def _number(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


def _unit(leaf: str) -> tuple[str, str]:
    """(name without its unit suffix, the unit as shown after a value)."""
    for suffix, unit in _UNITS:
        if leaf.endswith(suffix):
            return leaf[: -len(suffix)], unit
    return leaf, ""


def _key_name(key: str, host_names: Sequence[str] | None) -> tuple[str, str]:
    """(short name shown before the value, unit shown after it) of a dotted key."""
    if key in _KNOWN:
        return _KNOWN[key], _unit(key.rsplit(".", 1)[-1])[1]
    m = re.fullmatch(r"topology\.hosts\.(\d+)\.(\w+)", key)
    if m:
        i, leaf = int(m.group(1)), m.group(2)
        host = host_names[i] if host_names is not None and i < len(host_names) else f"h{i}"
        name, unit = _unit(leaf)
        return (host if name == "bw" else f"{host} {name.replace('_', ' ')}"), unit
    name, unit = _unit(key.rsplit(".", 1)[-1])
    return name.replace("_", " "), unit


def _leaves(v: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(v, dict):
        out: dict[str, Any] = {}
        for k, x in v.items():
            out.update(_leaves(x, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: v}


def _listed(name: str, values: list[Any]) -> list[str] | None:
    """Lists of mappings (faults, cross traffic, shaping) as their kinds, or how many; None otherwise."""
    if not all(isinstance(v, list) and all(isinstance(x, dict) for x in v) for v in values):
        return None
    out = []
    for v in values:
        kinds = [str(x["kind"]) for x in v if "kind" in x]
        if not v:
            out.append(f"no {name}")
        elif len(kinds) == len(v):
            out.append("+".join(f"{k} x{kinds.count(k)}" if kinds.count(k) > 1 else k for k in dict.fromkeys(kinds)))
        else:
            out.append(f"{name} x{len(v)}")
    return out


def _structured(values: list[Any]) -> list[str]:
    """Mappings (a topology, a heterogeneity) as their `kind` and the leaves that differ
    between the values of the same kind; lists as their length."""
    flat = [_leaves(v) if isinstance(v, dict) else {} for v in values]
    out = []
    for v, leaves in zip(values, flat):
        if isinstance(v, list):
            out.append(f"{len(v)} items")
            continue
        if not isinstance(v, dict):
            out.append(_number(v))
            continue
        kind = leaves.get("kind")
        peers = [f for f in flat if f.get("kind") == kind]
        parts = [str(kind)] if kind is not None else []
        for leaf in sorted({k for f in peers for k in f}):
            if leaf == "kind" or len({json.dumps(f.get(leaf), sort_keys=True, default=str) for f in peers}) < 2:
                continue
            if leaf in leaves and not isinstance(leaves[leaf], (dict, list)) and not leaf.endswith("kind"):
                name, unit = _unit(leaf.rsplit(".", 1)[-1])
                parts.append(f"{name.replace('_', ' ')} {_number(leaves[leaf])}{unit}")
        out.append(" ".join(parts) or "default")
    return out


def _text(key: str, values: list[Any], host_names: Sequence[str] | None) -> list[str]:
    """Each point's value of one key, as shown in a label."""
    if key == "roles.workers" and all(isinstance(v, list) for v in values):
        return [f"{len(v)} workers" for v in values]
    name, unit = _key_name(key, host_names)
    listed = _listed(name, values)
    if listed is not None:
        return listed
    if any(isinstance(v, (dict, list)) for v in values):
        return _structured(values)
    return [f"{name} {_number(v)}{unit}".strip() if v is not None else f"{name} -".strip() for v in values]


def _canon(v: Any) -> str:
    return json.dumps(v, sort_keys=True, default=str)


def varying_keys(points: Sequence[dict[str, Any]]) -> list[str]:
    """The points' keys (in order of first appearance) whose values differ, treatments left out."""
    keys = list(dict.fromkeys(k for p in points for k in p))
    return [k for k in keys if not is_treatment(k) and len({_canon(p.get(k)) for p in points}) > 1]


def _determined(key: str, shown: list[str], points: Sequence[dict[str, Any]]) -> bool:
    """Whether `key`'s value follows from the values of the keys already shown."""
    seen: dict[str, str] = {}
    for p in points:
        ident = _canon([p.get(k) for k in shown])
        if seen.setdefault(ident, _canon(p.get(key))) != _canon(p.get(key)):
            return False
    return True


def _fit(parts: list[str], limit: int) -> str:
    text = ""
    for part in parts:
        nxt = part if not text else text + SEP + part
        if len(nxt) > limit:
            break
        text = nxt
    if not text and parts:  # the first part alone is too long
        text = parts[0][: limit - 1] + "…"
    return text


def short_labels(points: Sequence[dict[str, Any]], host_names: Sequence[str] | None = None,
                 limit: int = LIMIT) -> list[str]:
    """One label per point, at most `limit` characters, the same for equal points and (with a
    ` #n` suffix where abbreviation made them equal) different for different ones."""
    keys = varying_keys(points)
    shown: list[str] = []
    for k in keys:
        if not _determined(k, shown, points):
            shown.append(k)
    columns = {k: _text(k, [p.get(k) for p in points], host_names) for k in shown}
    labels = []
    for i, p in enumerate(points):
        name = p.get(POINT_NAME)
        labels.append(_fit([str(name)], limit) if name else _fit([columns[k][i] for k in shown], limit))
    return _disambiguate(labels, [_canon({k: p.get(k) for k in keys}) for p in points], limit)


def _disambiguate(labels: list[str], idents: list[str], limit: int) -> list[str]:
    """Equal labels of different points get `#1`, `#2`... in order of first appearance."""
    owners: dict[str, list[str]] = {}
    for label, ident in zip(labels, idents):
        if ident not in owners.setdefault(label, []):
            owners[label].append(ident)
    out = []
    for label, ident in zip(labels, idents):
        if len(owners[label]) > 1:
            tag = f" #{owners[label].index(ident) + 1}"
            label = label[: limit - len(tag)] + tag
        out.append(label)
    return out


def point_from_columns(row: dict[str, Any], parse: Callable[[Any], Any] | None = None) -> dict[str, Any]:
    """A stored row's grid point (its `point.<key>` columns; lists and dicts stored as JSON text)."""
    out = {}
    for col, v in row.items():
        if not col.startswith("point."):
            continue
        if parse is not None:
            v = parse(v)
        elif isinstance(v, str) and v[:1] in "[{":
            try:
                v = json.loads(v)
            except ValueError:
                pass
        out[col[len("point."):]] = None if isinstance(v, float) and v != v else v  # NaN: not in this run's point
    return out
