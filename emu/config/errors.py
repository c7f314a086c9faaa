"""pydantic's validation errors reworded as the one line a user sees: `field.path: reason`.

pydantic reports a location tuple and a type code in its own words ("Input should be greater
than 0"); a user needs the field as they wrote it in the YAML (`topology.hosts[1].bw_mbps`)
and a short reason, with any value they gave quoted short enough to stay on one line (it
may be a 1 MB string). Kept apart from the models so that the wording can change without
touching the schema, and the schema without the wording.
"""
from __future__ import annotations

import re
from typing import Any

from pydantic import ValidationError

from emu.config.topospec import HETEROGENEITY_KINDS, ONE_OR_EACH_FIELDS, ONE_OR_EACH_TAGS, TOPOLOGY_KINDS


def _num(x: Any) -> str:
    """A bound as the user would write it: 1000000, not 1e+06."""
    if isinstance(x, float):
        return str(int(x)) if x.is_integer() and abs(x) < 1e15 else f"{x:g}"
    return str(x)


def quote(x: Any) -> str:
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
    "finite_number": lambda e: f"must be a finite number, got {quote(e['input'])}",
    "int_type": lambda e: f"must be an integer, got {quote(e['input'])}",
    "int_parsing": lambda e: f"must be an integer, got {quote(e['input'])}",
    "int_from_float": lambda e: f"must be an integer, got {quote(e['input'])}",
    "float_type": lambda e: f"must be a number, got {quote(e['input'])}",
    "float_parsing": lambda e: f"must be a number, got {quote(e['input'])}",
    "string_type": lambda e: f"must be a string, got {quote(e['input'])}",
    "list_type": lambda e: f"must be a list, got {quote(e['input'])}",
    "tuple_type": lambda e: f"must be a list, got {quote(e['input'])}",
    "dict_type": lambda e: f"must be a mapping, got {quote(e['input'])}",
    "model_type": lambda e: f"must be a mapping, got {quote(e['input'])}",
    "bool_type": lambda e: f"must be true or false, got {quote(e['input'])}",
    "bool_parsing": lambda e: f"must be true or false, got {quote(e['input'])}",
    "string_pattern_mismatch": lambda e: f"{quote(e['input'])} must match {e['ctx']['pattern']}",
    "literal_error": lambda e: f"must be one of {e['ctx']['expected']}, got {quote(e['input'])}",
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
_TAGS = set(TOPOLOGY_KINDS) | {"steps", "square", "onoff", "mahimahi", "csv"} | set(HETEROGENEITY_KINDS) \
    | set(ONE_OR_EACH_TAGS)
_UNIONS = {"topology", "schedule", "heterogeneity", *ONE_OR_EACH_FIELDS}  # fields whose value is a tagged union
# A model validator's message that already starts with the whole path of its field.
_FULL_PATHS = ("roles.", "topology", "workload.", "schedulers.", "shaping[", "cross_traffic[", "faults[")


def _location(raw: tuple) -> tuple:
    """The location as the user wrote it: tagged unions put the tag in loc
    (topology.star.hosts...) and validators their function name; neither means anything to the user."""
    loc: tuple = ()
    for i, p in enumerate(raw):
        is_tag = isinstance(p, str) and p in _TAGS and i and raw[i - 1] in _UNIONS
        if isinstance(p, str) and p.startswith("function-") or is_tag:
            continue
        loc += (p,)
    return loc


def describe(err: ValidationError, prefix: str = "") -> str:
    """First error of a ValidationError as `field.path: reason`."""
    e = err.errors()[0]
    loc = _location(e["loc"])
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
    if msg.startswith(_FULL_PATHS):
        return msg
    # A validator may have put a sub-path in front of its message: "[1].name: ...", "hosts[2].name: ..."
    m = _SUBPATH.match(msg)
    if m:
        sub, msg = m.group(1), m.group(2)
        base = _path(prefix, loc)
        joiner = "" if sub.startswith("[") or not base else "."
        return f"{base}{joiner}{sub.lstrip('.')}: {msg}"
    return f"{_path(prefix, loc)}: {msg}" if loc or prefix else msg
