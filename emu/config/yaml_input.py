"""Bounded reading of what a user hands the harness: config and sweep files, `--set` values,
trace files.

Everything is read and parsed here under fixed limits before pydantic or any other code walks
it, so a bad input, however large, nested, aliased or binary, costs well under a second and a
few tens of MB and ends in one `InputError` line, never a traceback, a hang or gigabytes:

- a file is read only if it is a regular file, and at most limit + 1 bytes of it are read
  (a FIFO, /dev/zero or a directory is refused without reading it; contracts/bounded_file.py);
- YAML is composed by PyYAML's composer with two counters: nesting depth (PyYAML composes
  recursively, so a deep file would otherwise end in a RecursionError) and the number of
  nodes once aliases are expanded (counted per anchor, so a billion-leaf alias bomb of a few
  hundred bytes is refused while it is being read, before anything expands it);
- the constructed data may hold only mappings with string keys, lists, strings, booleans,
  null, 64-bit integers and finite floats.

Parsing a config never depends on the machine: these checks look at the input only.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import yaml
from yaml.events import AliasEvent
from yaml.nodes import ScalarNode

from contracts import bounded_file

# A config is a few KB (the largest shipped one is 2 KB; a 1,000-host graph topology is 70 KB).
MAX_FILE_BYTES = 1 << 20
# The deepest field is 7 levels down (shaping[0].schedule.steps[0][1]); a grid of them adds two.
MAX_DEPTH = 32
# YAML nodes (keys included) once aliases are expanded; a 1,000-host graph topology has 12,400
# (composing and constructing 50,000 takes PyYAML about half a second).
MAX_NODES = 50_000
# A 64-bit integer is at most 20 digits (66 characters in binary); longer numerals only cost
# time (PyYAML converts `1:2:3:...` sexagesimal numerals in quadratic time).
MAX_NUMBER_CHARS = 100
# Integers go to numpy, torch and Parquet, which hold 64 bits.
INT_MIN, INT_MAX = -(2 ** 63), 2 ** 63 - 1

_Loader: type = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's parser: 20x faster
_NUMERIC = {"tag:yaml.org,2002:int", "tag:yaml.org,2002:float"}


class InputError(ValueError):
    """Bad input; the text is `where: reason` (where: a file, a field or `--set KEY`)."""

    def __init__(self, where: str, reason: str):
        super().__init__(f"{where}: {reason}" if where else reason)
        self.where, self.reason = where, reason


def shown(path: Path | str) -> str:
    """A path as it can appear in a one-line message: control characters escaped, a long one
    cut in the middle."""
    text = str(path)
    if len(text) > 120:
        text = text[:50] + "..." + text[-50:]
    return text if text.isprintable() else repr(text)[1:-1]


def read_bounded(path: Path, limit: int) -> bytes:
    """The bytes of the regular file `path`, refused if it is larger than `limit`
    (contracts/bounded_file.py: never opens anything but a regular file, never reads more
    than limit + 1 bytes)."""
    try:
        return bounded_file.read(path, limit)
    except bounded_file.Refused as e:
        raise InputError(shown(path), _refusal(e, limit)) from None


def _refusal(e: bounded_file.Refused, limit: int) -> str:
    if e.kind == bounded_file.TOO_LARGE:
        return (f"{e.size} bytes, more than the limit of {_size(limit)}" if e.size is not None
                else f"more than the limit of {_size(limit)}")
    return {bounded_file.MISSING: "no such file",
            bounded_file.BAD_PATH: f"not a valid path ({e.detail})",
            bounded_file.UNREADABLE: f"cannot read ({e.detail})",
            bounded_file.DIRECTORY: "is a directory, not a file",
            bounded_file.NOT_REGULAR: "not a regular file (a device, FIFO or socket)"}[e.kind]


def _size(n: int) -> str:
    return f"{n / (1 << 20):g} MiB" if n >= 1 << 20 else f"{n / 1024:g} KiB"


def decode(data: bytes, where: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(where, f"not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start}; "
                                f"a binary file?)") from None


_BASES = (_Loader,) if issubclass(_Loader, yaml.composer.Composer) else (yaml.composer.Composer, _Loader)


class _Bounded(*_BASES):
    """PyYAML's safe loader whose composer counts depth and expanded nodes as it goes."""

    def __init__(self, text: str):
        _Loader.__init__(self, text)
        yaml.composer.Composer.__init__(self)
        self.depth = 0
        self.nodes = 0             # nodes so far, each alias counted as the size of its anchor
        self.aliased = 0           # how many of them came through aliases
        self.sizes: dict[str, int] = {}  # anchor -> expanded size, once its node is complete

    def _line(self, mark) -> str:
        return f"line {mark.line + 1}: " if mark is not None else ""

    def _count(self, n: int, mark, alias: bool = False) -> None:
        self.nodes += n
        self.aliased += n if alias else 0
        if self.nodes > MAX_NODES:
            bomb = " (an alias bomb?)" if self.aliased > self.nodes // 2 else ""
            raise InputError("", f"{self._line(mark)}more than {MAX_NODES} values once aliases are expanded{bomb}")

    def compose_node(self, parent, index):
        if self.check_event(AliasEvent):
            event = self.peek_event()
            if event.anchor in self.anchors:
                size = self.sizes.get(event.anchor)
                if size is None:
                    raise InputError("", f"{self._line(event.start_mark)}alias *{event.anchor} is used inside "
                                         f"the node it names (a recursive structure)")
                self._count(size, event.start_mark, alias=True)
            return super().compose_node(parent, index)  # also refuses an undefined alias
        event = self.peek_event()
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise InputError("", f"{self._line(event.start_mark)}nested deeper than {MAX_DEPTH} levels")
        before = self.nodes
        self._count(1, event.start_mark)
        node = super().compose_node(parent, index)
        self.depth -= 1
        if event.anchor is not None:
            self.sizes[event.anchor] = self.nodes - before
        if isinstance(node, ScalarNode) and node.tag in _NUMERIC and len(node.value) > MAX_NUMBER_CHARS:
            raise InputError("", f"{self._line(event.start_mark)}a number of {len(node.value)} characters "
                                 f"(at most {MAX_NUMBER_CHARS})")
        return node


class YamlSyntaxError(InputError):
    """The text is not YAML (as opposed to YAML beyond the limits)."""


def parse(text: str, where: str) -> Any:
    """One YAML document, composed under the limits above (callers then run `check_values`).
    Errors read `where: line N: reason`."""
    loader = _Bounded(text)
    try:
        return loader.get_single_data()
    except InputError as e:
        raise InputError(where, e.reason) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f"line {mark.line + 1}: " if mark is not None else ""
        problem = getattr(e, "problem", None) or (str(e).splitlines() or [type(e).__name__])[0]
        raise YamlSyntaxError(where, f"{line}not valid YAML ({problem})") from None
    except RecursionError:  # a long chain of merge keys (<<)
        raise InputError(where, "nested too deeply") from None
    except (ValueError, TypeError, OverflowError) as e:  # from a scalar's constructor
        raise YamlSyntaxError(where, f"not valid YAML ({type(e).__name__}: {e})") from None
    finally:
        loader.dispose()


def load_file(path: Path, limit: int = MAX_FILE_BYTES) -> Any:
    data = read_bounded(path, limit)
    return parse(decode(data, shown(path)), shown(path))


# ---------------------------------------------------------------------------- values

_SCALARS = (str, bool, type(None))
_TYPES = {"bytes": "!!binary value", "datetime": "timestamp", "set": "!!set", "tuple": "!!pairs or !!omap entry"}


def check_values(data: Any, prefix: str = "") -> int:
    """Refuse what no field of a config can hold: non-string keys, non-finite floats, integers
    beyond 64 bits, other YAML types (dates, binary, sets), and nesting deeper than MAX_DEPTH
    (which `--set a.b.c...` could build). Errors name the field: `topology.hosts[1].bw_mbps: ...`.
    Returns the number of values (aliases expanded)."""
    stack: list[tuple[Any, str, int]] = [(data, prefix, 0)]
    seen = 0
    while stack:
        value, where, depth = stack.pop()
        seen += 1
        if seen > 4 * MAX_NODES:  # several files and --set values merged; each was bounded
            raise InputError(prefix or "config", f"more than {4 * MAX_NODES} values")
        if depth >= MAX_DEPTH:
            raise InputError(where, f"nested deeper than {MAX_DEPTH} levels")
        if isinstance(value, dict):
            for k, v in value.items():
                if not isinstance(k, str):
                    hint = " (quote it)" if isinstance(k, (bool, int, float)) or k is None else ""
                    raise InputError(where or "config", f"keys must be strings, got {_short(k)}{hint}")
                stack.append((v, f"{where}.{k}" if where else k, depth + 1))
        elif isinstance(value, list):
            for i, v in enumerate(value):
                stack.append((v, f"{where}[{i}]", depth + 1))
        elif isinstance(value, float):
            if not math.isfinite(value):
                raise InputError(where, f"must be a finite number, got {value}")
        elif isinstance(value, int) and not isinstance(value, bool):
            if not INT_MIN <= value <= INT_MAX:
                raise InputError(where, f"an integer of {value.bit_length()} bits does not fit in 64 bits")
        elif not isinstance(value, _SCALARS):
            what = _TYPES.get(type(value).__name__, type(value).__name__)
            raise InputError(where, f"a YAML {what} cannot be a config value (quote it to make it a string)")
    return seen


def _short(x: Any) -> str:
    text = repr(x)
    return text if len(text) <= 40 else text[:37] + "..."
