"""The thread that applies the config's bandwidth schedules (emu/config/shaping.py) on time.

Changes are applied with `tc class change` (the queue is kept) and each is logged with its
planned and actual time.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable

from emu.config.shaping import (
    LinkShaping,
    schedule_events,
)

# ---------------------------------------------------------------------------- runtime

class Shaper:
    """Applies every link's schedule on time, in one thread, and logs what it did.

    `apply(link, bps)` does the actual change (the testbed's `tc class change`); `rates`
    holds the rate now configured on each link, for the monitor and the fidelity check.
    `horizon_s` is in the schedules' own (emulated) seconds; `dilation` stretches them into
    wall-clock time (`schedule_events`), and the log is in wall-clock time.
    """

    def __init__(self, shaping: list[LinkShaping], horizon_s: float,
                 apply: Callable[[tuple[str, str], float], None], rates: dict[tuple[str, str], float],
                 dilation: float = 1.0):
        self.events = schedule_events(shaping, horizon_s, dilation)
        self.apply = apply
        self.rates = rates
        self.log: list[dict] = []
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="shaper", daemon=True)

    def start(self) -> Shaper:
        self.t0 = time.monotonic()
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            for planned, link, bps in self.events:
                if self._stop.wait(max(0.0, self.t0 + planned - time.monotonic())):
                    return
                if self.rates.get(link) == bps:
                    continue
                self.apply(link, bps)
                self.rates[link] = bps
                self.log.append({"link": f"{link[0]}->{link[1]}", "planned_t": planned,
                                 "actual_t": time.monotonic() - self.t0, "rate_bps": bps})
        except BaseException as e:  # noqa: BLE001 - reported by the runner
            self.error = e

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
