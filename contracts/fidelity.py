"""The reason codes of the fidelity verdict: what emu/testbed/fidelity.py writes into a run's row
(`fidelity_codes`) and analysis counts, so the two share names rather than sentences.

A row's `fidelity_codes` is JSON text of a list (as every list cell of a row is), one code
per failed check, in the order of the "; "-separated sentences of `fidelity_reasons`. The
monitors' codes are written by emu at run time; the physics codes by analysis/physics.py when
the bounds are computed, appended after them.
"""
from __future__ import annotations

import json
from enum import StrEnum

COLUMN = "fidelity_codes"


class Reason(StrEnum):
    CPU_IDLE = "cpu_idle"  # the machine's CPU idle fell below cpu_idle_min in a window
    RATE_EXCESS = "rate_excess"  # a link sent faster than configured (shaping leaked)
    SATURATION = "saturation"  # a link proven busy delivered less than saturated_min of its rate
    # analysis/physics.py, applied with the bounds (analysis judges them; emu cannot)
    BELOW_BOUND = "below_bound"  # the measured iteration beat a lower bound by more than rate_tolerance
    TOO_FEW_BYTES = "too_few_bytes"  # a worker host's links carried less than G per iteration one way


def encode(codes: list[Reason]) -> str:
    return json.dumps([Reason(c).value for c in codes])


def decode(cell: str) -> list[str | None]:
    """The codes of one row's cell (unknown codes are kept as text, for newer rows; null, a
    sentence of a row older than the codes that no code matched, as None)."""
    return [None if c is None else str(c) for c in json.loads(cell)]
