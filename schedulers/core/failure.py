"""The first failure of a role, shared by all its threads (ps, ring, forest, gloo).

A scheduler learns of failures in several threads at once: receive loops, outboxes, the
caller's push and wait. Only the first names the peer that really failed; what follows is
fallout (connections we closed ourselves, peers relaying our ABORT). So the first reason is
kept, every waiter is woken, and every later call raises it as a `CommError`.
"""
from __future__ import annotations

import threading

from schedulers.core.base import CommError


class Failure:
    """`cv` is also the scheduler's own lock and condition, so whatever waits for progress
    wakes on a failure too (`lock` is its lock: `with lock:` is a C call, `with cv:` a Python
    one, which a per-frame path notices). Set `closing` (holding `cv`) when the role closes on purpose:
    from then on a peer that hangs up is expected, and nothing more is kept."""

    def __init__(self, who: str | None = None):
        """who: prefixed to the message ("worker 3: ..."); None for none."""
        self.lock = threading.RLock()           # cv's lock, for a hot path that need not wait or notify
        self.cv = threading.Condition(self.lock)
        self.reason: str | None = None
        self.closing = False
        self._who = who

    @property
    def failed(self) -> bool:
        return self.reason is not None

    def fail(self, reason: str) -> bool:
        """Keep `reason` if it is the first failure and the role is not closing; wake every
        waiter either way. True when it was kept: the caller then tells its peers."""
        with self.cv:
            first = self.reason is None and not self.closing
            if first:
                self.reason = reason
            self.cv.notify_all()
        return first

    def amend(self, reason: str) -> None:
        """Replace the kept reason by a fuller one (gloo, once it has found which peer died)."""
        with self.cv:
            self.reason = reason
            self.cv.notify_all()

    def error(self, fallback: str | None = None) -> CommError:
        """The error to raise: the kept reason, or `fallback` when none was kept."""
        reason = self.reason if fallback is None else (self.reason or fallback)
        return CommError(reason if self._who is None else f"{self._who}: {reason}")

    def check(self) -> None:
        """Raise the kept failure, if there is one."""
        if self.reason is not None:
            raise self.error()
