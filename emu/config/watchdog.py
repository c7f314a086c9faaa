"""`watchdog:` in a config: the stall window and the start-up allowance (emu/run/watchdog.py uses them)."""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

FACTOR = 10.0       # window = FACTOR x median iteration ...
MIN_S = 10.0        # ... at least this ...
MAX_S = 25.0        # ... at most this (named within 30 s of a fault)
STARTUP_S = 120.0   # default start-up allowance


class WatchdogConfig(BaseModel):
    """`watchdog:` in a config. Unset (the default), both values below apply."""
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    stall_s: float | None = Field(
        default=None, ge=1, le=7 * 24 * 3600,
        description="stall window in seconds; unset: 10 x the median iteration, within 10..25 s")
    startup_s: float = Field(
        default=STARTUP_S, ge=1, le=7 * 24 * 3600,
        description="allowance without progress, seconds, before the workers' iterations are timed, and while "
                    "they finish")
