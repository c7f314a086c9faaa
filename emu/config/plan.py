"""Plans: a config or sweep file, plus `--set` overrides, expanded into the experiments it
asks for (grid, zip, seeds, repeats).

Expansion is kept apart from the experiment model (emu/config/experiment.py) because it is about files
and counting, not about what one experiment means: a sweep file names a base config and what
to vary, and the product of a few short lists can be astronomically large. So every limit is
checked on the counts before anything is expanded, and each grid point is validated as it is
made, with the point named in its error (the same config may be valid at another point).
"""
from __future__ import annotations

import copy
import itertools
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from contracts.point_label import NAME_PATTERN, POINT_NAME, short_labels
from emu.config import yaml_input
from emu.config.errors import quote
from emu.config.experiment import ConfigError, Experiment, Sections, validate_experiment
from emu.config.yaml_input import MAX_DEPTH, MAX_FILE_BYTES, InputError, YamlSyntaxError

# Every experiment of a plan (a shard's too) is validated and held before the first run
# starts, at about 0.1 ms and 10 KB each; 5,000 runs of tens of seconds are days of one machine.
MAX_RUNS = 5_000
# All experiments of a plan together, in config values plus ten per host and link of each
# experiment's network (a host or link costs about ten values to validate): about 0.5 s.
MAX_PLAN_SIZE = 1_000_000

_EXPANDED = ("grid", "zip", "seeds", "repeats")
_PLAN_KEYS = ("base", "set", *_EXPANDED)


@dataclass(frozen=True)
class Plan:
    """What a config file asks for: the experiments of its grid, each repeated."""

    name: str
    experiments: list[Experiment]
    repeats: int
    source: Path
    points: list[dict[str, Any]] = field(default_factory=list)  # the grid/zip values of each experiment
    base_dir: Path | None = None  # where the experiments' relative paths (trace files) start

    @property
    def paths_from(self) -> Path:
        """The directory relative paths start from, to validate a variant of an experiment."""
        return self.base_dir if self.base_dir is not None else self.source.parent

    def labels(self) -> list[str]:
        """Each experiment's short label among the plan's points (contracts/point_label.py)."""
        hosts = self.experiments[0].resolved().get("topology", {}).get("hosts") or []
        names = [h.get("name") for h in hosts if isinstance(h, dict)]
        return short_labels(self.points, names or None)

    def __post_init__(self) -> None:
        if not self.points:  # no grid: one empty point per experiment
            object.__setattr__(self, "points", [{} for _ in self.experiments])


def at_point(err: ConfigError, point: dict[str, Any]) -> ConfigError:
    """`err` about one grid point, naming the point; unchanged for a plan without a grid."""
    if not point:
        return err
    where = ", ".join(f"{k}={quote(v)}" for k, v in point.items())
    return ConfigError(f"{err} (grid point {where})")


def read_yaml(path: Path) -> dict[str, Any]:
    """A config or sweep file, read and parsed within the limits of emu/config/yaml_input.py."""
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
        raise ConfigError(f"{quote(key)}: a dotted key must be a string")
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
        raise ConfigError(f"--set {quote(text)}: expected key=value")
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


def _from_base(sweep: dict[str, Any], base_dir: Path) -> tuple[dict[str, Any], Path]:
    """A sweep file (`base`, `set`, `name` and its own grid) resolved into the config it
    describes, and the directory its relative paths start from."""
    base = sweep.pop("base")
    if not isinstance(base, str):
        raise ConfigError("base: must be the path of a config file")
    base_path = base_dir / base
    updates = sweep.pop("set", None) or {}
    plan_keys = {k: sweep.pop(k) for k in _EXPANDED if k in sweep}
    if not isinstance(updates, dict):
        raise ConfigError("set: must be a mapping of config keys to values")
    name = sweep.pop("name", None)
    if sweep:
        raise ConfigError(f"{next(iter(sweep))}: unknown key in a sweep file (known: name, "
                          f"{', '.join(_PLAN_KEYS)})")
    raw = read_yaml(base_path)
    for k in _EXPANDED:
        raw.pop(k, None)  # the sweep file's own plan replaces the base's
    raw.update(plan_keys)
    for k, v in updates.items():
        set_dotted(raw, k, v)
    if name is not None:
        raw["name"] = name
    return raw, base_path.parent


def _listing(raw: dict, key: str) -> dict[str, list]:
    value = raw.pop(key, None) or {}
    if not isinstance(value, dict):
        raise ConfigError(f"{key}: must be a mapping of config keys to lists of values")
    for k, vals in value.items():
        if key == "grid" and isinstance(vals, dict) and vals:
            continue  # names -> values (_named_values)
        if not isinstance(vals, list) or not vals:
            raise ConfigError(f"{key}.{k}: must be a non-empty list of values"
                              + (" (or a mapping of short names to values)" if key == "grid" else ""))
    return value


def _check_name(name: Any, where: str) -> str:
    if not isinstance(name, str) or not re.fullmatch(NAME_PATTERN, name):
        raise ConfigError(f"{where}: a point's short name must be text of 1-40 letters, digits, spaces and "
                          f"_.,:;=+/()%- starting with a letter or digit, got {quote(name)}")
    return name


def _named_values(grid: dict[str, Any]) -> dict[str, list[str]]:
    """Grid keys given as `{short name: value}`: their values into the grid as a list, their names returned."""
    if POINT_NAME in grid:
        raise ConfigError(f"grid.{POINT_NAME}: names points of a zip; in a grid, give a key's values names "
                          f"instead (grid: {{topology: {{star: ..., racks: ...}}}})")
    names = {}
    for k, vals in grid.items():
        if isinstance(vals, dict):
            names[k] = [_check_name(n, f"grid.{k}") for n in vals]
            grid[k] = list(vals.values())
    return names


def _take_plan_keys(raw: dict[str, Any]) -> tuple[dict[str, list], dict[str, list], int, dict[str, list[str]]]:
    """grid (seeds included), zip, repeats and the short names of grid values, taken out of the config."""
    grid = _listing(raw, "grid")
    names = _named_values(grid)
    zipped = _listing(raw, "zip")
    for i, n in enumerate(zipped.get(POINT_NAME, [])):
        _check_name(n, f"zip.{POINT_NAME}.{i}")
    seeds = raw.pop("seeds", None)
    if seeds is not None:
        if not isinstance(seeds, list) or not seeds or not all(isinstance(x, int) and x >= 0 for x in seeds):
            raise ConfigError(f"seeds: must be a non-empty list of integers >= 0, got {quote(seeds)}")
        grid["seed"] = seeds
    repeats = raw.pop("repeats", 1)
    if not isinstance(repeats, int) or isinstance(repeats, bool) or repeats < 1:
        raise ConfigError(f"repeats: must be an integer >= 1, got {quote(repeats)}")
    lengths = {k: len(v) for k, v in zipped.items()}
    if len(set(lengths.values())) > 1:
        raise ConfigError("zip: lists must have equal lengths (" +
                          ", ".join(f"{k} has {n}" for k, n in lengths.items()) + ")")
    return grid, zipped, repeats, names


def _count(raw: dict[str, Any], grid: dict[str, list], zipped: dict[str, list], repeats: int) -> tuple[int, int]:
    """(grid points, values per experiment), refused beyond the limits before anything is expanded."""
    # Counted, not expanded: 10 lists of 10 values are 10^10 points.
    zip_len = max((len(v) for v in zipped.values()), default=1)
    runs = math.prod(len(v) for v in grid.values()) * zip_len * repeats
    if runs > MAX_RUNS:
        sizes = ", ".join([f"{k}: {len(v)}" for k, v in grid.items()] +
                          ([f"zip: {zip_len}"] if zipped else []) +
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
    return points_total, values


def _expand(raw: dict[str, Any], grid: dict[str, list], zipped: dict[str, list], sections: Sections,
            base_dir: Path, values: int, points_total: int, names: dict[str, list[str]]
            ) -> tuple[list[Experiment], list[dict[str, Any]]]:
    """Each grid point (Cartesian product of grid, times the zip) validated as it is made. A
    point's short name (`point_name`: the zip's, and the names of its grid values) is in the
    point, not in the experiment, so naming points changes no run id."""
    zip_points = [dict(zip(zipped, vals, strict=True)) for vals in zip(*zipped.values(), strict=True)] \
        if zipped else [{}]
    experiments: list[Experiment] = []
    points: list[dict[str, Any]] = []
    keys = list(grid)
    size = 0
    traces: dict = {}
    for combo in itertools.product(*(range(len(grid[k])) for k in keys)):
        for zp in zip_points:
            point = {**{k: grid[k][i] for k, i in zip(keys, combo, strict=True)}, **zp}
            named = [names[k][i] for k, i in zip(keys, combo, strict=True) if k in names]
            named += [zp[POINT_NAME]] if POINT_NAME in zp else []
            point.pop(POINT_NAME, None)
            variant = dict(raw)
            for k, v in point.items():
                set_dotted(variant, k, v, copy_path=True)
            if named:
                point[POINT_NAME] = " · ".join(named)
            try:
                experiments.append(validate_experiment(variant, sections, base_dir, traces))
            except ConfigError as e:
                raise at_point(e, point) from None
            points.append(point)
            net = experiments[-1].net
            size += values + 10 * (len(net.hosts) + len(net.links))
            if size > MAX_PLAN_SIZE:
                raise ConfigError(f"grid: {points_total} experiments of {values} values and {len(net.hosts)} "
                                  f"hosts each; a plan holds at most {MAX_PLAN_SIZE} values in all, counting "
                                  f"ten per host and link (split the sweep into several files)")
    return experiments, points


def load_plan(path: str | Path, sections: Sections, overrides: list[str] = ()) -> Plan:
    """Read a config or sweep file into the experiments it describes.

    The experiment is either the file itself or, with `base: FILE` (relative to this file),
    another config file, updated by `set: {dotted.key: value}`. On top of it:
    - `grid`: dotted keys -> lists of values; their Cartesian product is run;
    - `zip`: dotted keys -> lists of equal length, taken together (one point per index);
      `point_name` in a zip names its points (reports, progress and dry runs show the name);
    - a grid key given as a mapping `{short name: value}` names its values the same way;
    - `seeds`: a list of seeds (a grid over `seed`);
    - `repeats`: how often each point runs (default 1); each repeat has its own run_id.
    `overrides` (`key=value`, from --set) apply to the experiment before the grid.

    Parsing looks at the input only, never at the machine: what this kernel can emulate is
    checked afterwards, by emu/testbed/preflight.py.
    """
    path = Path(path)
    raw = read_yaml(path)
    base_dir = path.parent
    if "base" in raw:
        raw, base_dir = _from_base(raw, base_dir)
    for text in overrides:
        k, v = parse_override(text)
        set_dotted(raw, k, v)
    grid, zipped, repeats, names = _take_plan_keys(raw)
    points_total, values = _count(raw, grid, zipped, repeats)
    experiments, points = _expand(raw, grid, zipped, sections, base_dir, values, points_total, names)
    return Plan(name=experiments[0].name, experiments=experiments, repeats=repeats, source=path, points=points,
                base_dir=base_dir)
