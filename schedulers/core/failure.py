"""The first failure of a role, shared by all its threads (ps, ring, forest, gloo).

A scheduler learns of failures in several threads at once: receive loops, outboxes, the
caller's push and wait. Only the first names the peer that really failed; what follows is
fallout (connections we closed ourselves, peers relaying our ABORT). So the first reason is
kept, every waiter is woken, and every later call raises it as a `CommError`.

The error reaches the caller only once the peers have been told (`fail`'s `tell`, which
sends the ABORTs): a training process that gets it often exits at once, and an exit while
a receive thread is still sending the ABORTs closes those connections unannounced, so the
peers name us (reset, or closed) instead of the peer that really failed.
"""
from __future__ import annotations

import threading
from collections.abc import Callable

from schedulers.core.base import CommError

# The longest the error waits for the peers to be told: telling takes ABORT_LOCK_S a
# connection at most (schedulers/transport/connection.py), a scheduler's few in turn.
TELL_S = 3.0


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
        self._teller: int | None = None         # the thread telling the peers, until it is done

    @property
    def failed(self) -> bool:
        return self.reason is not None

    def fail(self, reason: str, tell: Callable[[str], None] | None = None) -> bool:
        """Keep `reason` if it is the first failure and the role is not closing; wake every
        waiter either way. True when it was kept: then `tell(reason)` tells the peers, here,
        and until it returns `error` (so `check`) and `told` wait (TELL_S at most)."""
        with self.cv:
            first = self.reason is None and not self.closing
            if first:
                self.reason = reason
                if tell is not None:
                    self._teller = threading.get_ident()
            self.cv.notify_all()
        if first and tell is not None:
            try:
                tell(reason)
            finally:
                with self.cv:
                    self._teller = None
                    self.cv.notify_all()
        return first

    def told(self, timeout: float = TELL_S) -> None:
        """Wait until the peers have been told of the kept failure (at once if nobody is
        telling them, or if this thread is the one that does)."""
        with self.cv:
            if self._teller is not None and self._teller != threading.get_ident():
                self.cv.wait_for(lambda: self._teller is None, timeout)

    def amend(self, reason: str) -> None:
        """Replace the kept reason by a fuller one (gloo, once it has found which peer died)."""
        with self.cv:
            self.reason = reason
            self.cv.notify_all()

    def error(self, fallback: str | None = None) -> CommError:
        """The error to raise: the kept reason, or `fallback` when none was kept; once the
        peers have been told (`told`)."""
        self.told()
        reason = self.reason if fallback is None else (self.reason or fallback)
        return CommError(reason if self._who is None else f"{self._who}: {reason}")

    def check(self) -> None:
        """Raise the kept failure, if there is one."""
        if self.reason is not None:
            raise self.error()
