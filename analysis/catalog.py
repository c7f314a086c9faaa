"""What analysis knows about each scheduler (contracts/scheduler_info.py), without its code.

Analysis may not import schedulers/, so it reads the schedulers' descriptions from two places:
what each run recorded (its row's `scheduler_metadata`, written by emu/run/runner.py), and the
registry's descriptions, which the caller hands over (`install`; tasks.py does it before any
analysis) for rows written before runs recorded theirs. A row's own record decides for that
row (its bound model, its family); for what concerns every figure of a report alike (the
order and colour of schedulers, the default baseline, claims, report sections) the handed-over
descriptions come first and the recorded ones fill in schedulers the registry no longer has.
One catalogue per process, so that every figure of a report agrees.
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from functools import lru_cache

import pandas as pd

from contracts.scheduler_info import COLUMN, SchedulerInfo

_INSTALLED: dict[str, SchedulerInfo] = {}
_RECORDED: dict[str, SchedulerInfo] = {}


def install(infos: Mapping[str, SchedulerInfo]) -> None:
    """Hand over the registry's descriptions (replacing any handed over before)."""
    _INSTALLED.clear()
    _INSTALLED.update(infos)


def infos() -> dict[str, SchedulerInfo]:
    """Every scheduler known: handed over, then recorded by runs read so far, by display order."""
    known = {**_RECORDED, **_INSTALLED}
    return dict(sorted(known.items(), key=lambda kv: (kv[1].display_order, kv[0])))


def info(name: str) -> SchedulerInfo | None:
    return _INSTALLED.get(name) or _RECORDED.get(name)


@lru_cache(maxsize=256)
def _parse(text: str) -> SchedulerInfo:
    return SchedulerInfo.model_validate_json(text)


def _recorded(cell) -> SchedulerInfo | None:
    return _parse(cell) if isinstance(cell, str) and cell else None


def of_run(run) -> SchedulerInfo | None:
    """The description of a run's scheduler: the one it recorded, else the handed-over one of
    its registry name (`scheduler_name`, or `scheduler` in rows not named by tables.variant_names)."""
    own = _recorded(run.get(COLUMN))
    if own is not None:
        return own
    name = run.get("scheduler_name")
    return info(name if isinstance(name, str) and name else run.get("scheduler"))


def fill(runs: pd.DataFrame) -> pd.DataFrame:
    """`runs` with every row's description in COLUMN: a row without one gets the handed-over
    description of its scheduler (None where none is known); the recorded ones are learnt."""
    cells = runs[COLUMN] if COLUMN in runs else pd.Series(None, index=runs.index, dtype=object)
    for cell in cells.dropna().unique():
        own = _recorded(cell)
        if own is not None:
            _RECORDED.setdefault(own.name, own)
    names = runs["scheduler_name"] if "scheduler_name" in runs else runs["scheduler"]
    filled = [cell if _recorded(cell) is not None else _json(info(name)) for cell, name in zip(cells, names)]
    return runs.assign(**{COLUMN: pd.Series(filled, index=runs.index, dtype=object)})


def _json(i: SchedulerInfo | None) -> str | None:
    return None if i is None else json.dumps(i.model_dump(mode="json"))


def declared_baseline() -> str | None:
    """The scheduler declared the default baseline of speedups, None where none is known."""
    return next((n for n, i in infos().items() if i.baseline), None)


def baseline() -> str:
    """The scheduler declared the default baseline of speedups (LookupError where none is known)."""
    name = declared_baseline()
    if name is None:
        raise LookupError("no scheduler is declared the baseline: pass one (baseline=...), or hand over the "
                          "registry's descriptions (analysis.catalog.install; tasks.py does)")
    return name


def colour_slots() -> dict[str, int]:
    """Each known scheduler's colour index (analysis/plots.py): its declared display_order, unless a
    scheduler before it took that order (a built-in before a plugin, then by name); those that
    clash take the indices after every declared order, in (order, name) order. So a plugin that
    declares a built-in's order still gets a colour of its own, the same in every figure."""
    ranked = sorted(infos().items(), key=lambda kv: (kv[1].display_order, kv[1].plugin is not None, kv[0]))
    slots: dict[str, int] = {}
    clashed: list[str] = []
    for name, i in ranked:
        if i.display_order in slots.values():
            clashed.append(name)
        else:
            slots[name] = i.display_order
    after = max(slots.values(), default=-1) + 1
    slots.update({name: after + k for k, name in enumerate(clashed)})
    return slots


def by_display_name(display: str) -> SchedulerInfo | None:
    return next((i for i in infos().values() if i.display_name == display), None)


def display_name(name: str) -> str:
    """How tables and figures name a scheduler (its registry name where it is not known)."""
    known = info(name)
    return name if known is None else known.display_name


def with_section(section: str) -> list[str]:
    """The schedulers whose report sections include `section`, in display order."""
    return [n for n, i in infos().items() if section in i.report_sections]


def in_claim(claim: str, role: str) -> list[str]:
    """The schedulers that declare `role` ("claimed" or "baseline") in paper claim `claim`, in display order."""
    return [n for n, i in infos().items() if i.claims.get(claim) == role]


def with_bound_model(model: str) -> list[str]:
    """The schedulers that declare bound model `model`, in display order."""
    return [n for n, i in infos().items() if i.bound_model == model]
