"""The progress watchdog: a run whose roles stop moving fails within a stall window, and its
reason names who stalled, where, how far it had got, and what the others were waiting on.

Without it a stalled role (SIGSTOP, a hung process, a link that went down) was caught only
by `timeout_s`, minutes later, with a reason that named nobody. Every role rewrites a
progress report (contracts/progress.py: iterations, bytes per connection from the kernel)
twice a second; `Watchdog` reads them and keeps, per role, when its report last changed.

A run is stalled when no worker has completed an iteration for the stall window *and* some
live role has made no progress for as long. The job condition keeps a role that merely has
nothing to do (a server holding no keys) from failing a run that trains.

The window is derived from the run: 10 x the median iteration (the slowest worker's median
of its recent iterations), within 10..25 s, so a 5 s pause is survived and a stall is named
within 30 s of the fault (25 s plus the reports' and the polling's half seconds).
`watchdog.stall_s` sets it instead. Start-up (imports, building the model, connecting, the
first iteration) and the final evaluation move no bytes for long stretches and have no
iteration time yet, so while any worker is in either, or no median exists, the window is
the start-up allowance `watchdog.startup_s` (default 120 s; connecting and rendezvous have
their own 60 s bounds inside it).

Which role is named: among those past the window, a stopped process first (state T in
/proc), then one that has stopped reporting, then one cut off (on a link that is down, or
retransmitting unanswered), then the longest without progress. The
evidence (process states, links that are down, injected faults in force) is gathered by the
runner when a stall is found and handed to `reason`, which is a pure function, as is the
rest of the decision, so tests drive it with hand-made reports and clocks.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from contracts.progress import STALE_S, RoleProgress
from emu.config.watchdog import FACTOR, MAX_S, MIN_S, WatchdogConfig

READ_S = 0.5        # reports are read at most this often (they are written every 0.5 s)
GAP_MIN_S = 1.0     # shorter gaps without progress are not kept (observation granularity)
MAX_GAPS = 10_000
MAX_WAITING = 6     # roles listed in "others waiting"


@dataclass(frozen=True)
class Window:
    seconds: float
    basis: str          # how it was chosen, for the reason and the row
    startup: bool = False

    def describe(self) -> str:
        return f"stall window {self.seconds:g} s, {self.basis}"


def derive_window(cfg: WatchdogConfig, medians: Iterable[float | None], starting: bool, k: float = 1.0) -> Window:
    """The stall window now, in wall-clock seconds: the start-up allowance while `starting`
    or before any median iteration is known, else `stall_s` if set, else FACTOR x the largest
    median within MIN_S..MAX_S (the slowest worker sets the pace of a lock-step job). Under
    `time_dilation: k` (medians are wall clock) every configured time and bound is k x."""
    known = [m for m in medians if m is not None]
    dil = f" x time_dilation {k:g}" if k != 1 else ""
    if starting or not known:
        return Window(cfg.startup_s * k, f"start-up allowance (watchdog.startup_s{dil})", startup=True)
    if cfg.stall_s is not None:
        return Window(cfg.stall_s * k, f"set by watchdog.stall_s{dil}")
    m = max(known)
    return Window(round(min(max(FACTOR * m, MIN_S * k), MAX_S * k), 1),
                  f"{FACTOR:g} x median iteration {m:.3g} s, within {MIN_S * k:g}..{MAX_S * k:g} s")


@dataclass
class _Track:
    since: float                    # monotonic time its report last changed (or launch)
    key: tuple | None = None
    report: RoleProgress | None = None


@dataclass(frozen=True)
class Stall:
    """A stall found by `Watchdog.check`: the roles past the window and every live role's
    time without progress, at monotonic time `at`."""
    at: float
    window: Window
    candidates: tuple[str, ...]
    idle: dict[str, float]
    reports: dict[str, RoleProgress | None]


@dataclass
class Evidence:
    """What the runner sees when a stall is found."""
    wall_now: float
    proc_state: dict[str, str | None] = field(default_factory=dict)   # role -> /proc state letter
    down_links: list[str] = field(default_factory=list)               # "w1-s1"
    faults: list[str] = field(default_factory=list)                   # injected faults in force


@dataclass(frozen=True)
class Peers:
    """Names for the addresses in connection reports: a listening address is its role; any
    other address is named by its host (the role there, if only one role is)."""
    host_of: dict[str, str]                         # role -> host
    listen: dict[str, str] = field(default_factory=dict)   # "ip:port" -> role
    ip_host: dict[str, str] = field(default_factory=dict)  # ip -> host

    def name(self, addr: str, me: str | None = None) -> str:
        if addr in self.listen:
            return self.listen[addr]
        host = self.ip_host.get(addr.rsplit(":", 1)[0])
        if host is None:
            return addr
        there = [r for r, h in self.host_of.items() if h == host and r != me]
        return there[0] if len(there) == 1 else f"a role on {host}"


class Watchdog:
    """Tracks each role's progress from its reports; `check` says whether the run stalled.

    `read(role)` returns the role's latest report (None: none yet). Times are monotonic
    seconds of the orchestrator, so roles' clocks never matter."""

    def __init__(self, cfg: WatchdogConfig | None, peers: Peers, iterations: int, now: float,
                 read: Callable[[str], RoleProgress | None] | None = None, time_dilation: float = 1.0):
        self.cfg = cfg or WatchdogConfig()
        self.k = time_dilation
        self.peers = peers
        self.iterations = iterations
        self.read = read
        self.tracks = {r: _Track(since=now) for r in peers.host_of}
        self.job_since = now          # when a worker last completed an iteration
        self.window_now = derive_window(self.cfg, [], True, self.k)
        self.training_since: float | None = None   # when the window was first derived
        self.gaps: list[tuple[str, float, float]] = []   # (role, start, end), GAP_MIN_S or longer
        self._read_at = -float("inf")

    # ------------------------------------------------------------------ tracking
    def observe(self, now: float, reports: dict[str, RoleProgress | None]) -> None:
        for role, rep in reports.items():
            tr = self.tracks.get(role)
            if tr is None or rep is None:
                continue
            key = rep.key()
            if key != tr.key:
                if role.startswith("worker") and (tr.report is None or rep.iterations > tr.report.iterations):
                    self.job_since = now
                if now - tr.since >= GAP_MIN_S and len(self.gaps) < MAX_GAPS:
                    self.gaps.append((role, tr.since, now))
                tr.key, tr.since = key, now
            tr.report = rep

    def window(self, live: Iterable[str]) -> Window:
        workers = [self.tracks[r].report for r in live if r.startswith("worker")]
        starting = any(rep is None or rep.phase in ("starting", "finishing") for rep in workers)
        return derive_window(self.cfg, [rep.iteration_median_s for rep in workers if rep is not None], starting,
                             self.k)

    def check(self, now: float, live: Iterable[str]) -> Stall | None:
        """A stall, if no worker completed an iteration for the window and some live role made
        no progress for as long. Nothing while no worker is live (the runner's rule for roles
        that outlive the workers applies then)."""
        live = [r for r in live if r in self.tracks]
        if not any(r.startswith("worker") for r in live):
            return None
        w = self.window(live)
        self.window_now = w
        if not w.startup and self.training_since is None:
            self.training_since = now
        if now - self.job_since < w.seconds:
            return None
        idle = {r: now - self.tracks[r].since for r in live}
        cands = tuple(r for r in live if idle[r] >= w.seconds)
        if not cands:
            return None
        return Stall(at=now, window=w, candidates=cands, idle=idle,
                     reports={r: self.tracks[r].report for r in live})

    def poll(self, now: float, live: Iterable[str]) -> Stall | None:
        """Read the live roles' reports (at most every READ_S) and check."""
        live = list(live)
        if self.read is not None and now - self._read_at >= READ_S:
            self._read_at = now
            self.observe(now, {r: self.read(r) for r in live})
        return self.check(now, live)

    # ------------------------------------------------------------------ what it saw
    def longest_gap(self, start: float, end: float, now: float) -> float:
        """The longest time any role went without progress in a gap that overlaps [start, end]
        (gaps still open count up to `now`); 0 if none of GAP_MIN_S or more."""
        spans = [(s, e) for _, s, e in self.gaps]
        spans += [(tr.since, now) for tr in self.tracks.values() if now - tr.since >= GAP_MIN_S]
        return max((e - s for s, e in spans if s <= end and e >= start), default=0.0)

    def summary(self, now: float) -> dict:
        """Row columns: the window in force at the end, and the longest time without progress
        of any role once training had begun (start-up gaps are not counted)."""
        longest = 0.0
        if self.training_since is not None:
            longest = self.longest_gap(self.training_since, now, now)
        return {"stall_window_s": self.window_now.seconds, "stall_window_basis": self.window_now.basis,
                "stall_max_s": longest}


# ---------------------------------------------------------------------- the reason

def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


def _stopped(state: str | None) -> bool:
    return state in ("T", "t")


def culprit(stall: Stall, ev: Evidence, peers: Peers) -> str:
    """The role to name: a stopped process first, then one not reporting, then one cut off
    (its host on a link that is down, or retransmitting unanswered), then the longest
    without progress; workers before servers, then by name."""
    cut_hosts = {end for link in ev.down_links for end in link.split("-", 1)}

    def stale(r: str) -> bool:
        rep = stall.reports.get(r)
        return rep is None or ev.wall_now - rep.t >= STALE_S

    def cut_off(r: str) -> bool:
        rep = stall.reports.get(r)
        return peers.host_of.get(r) in cut_hosts or (rep is not None and any(c.backoff for c in rep.conns))

    return min(stall.candidates, key=lambda r: (not _stopped(ev.proc_state.get(r)), not stale(r), not cut_off(r),
                                                -round(stall.idle[r], 1), r.startswith("server"), r))


def _where(role: str, rep: RoleProgress | None, peers: Peers, iterations: int) -> str:
    at = f" (at {rep.iterations}/{iterations})" if rep is not None and role.startswith("worker") else ""
    return f"{role} on {peers.host_of.get(role, '?')}{at}"


def waiting_on(role: str, rep: RoleProgress | None, peers: Peers, wall_now: float) -> str:
    """What `role` was waiting on, from its last report: a connection retransmitting
    unanswered data first, else the one that has received nothing for longest."""
    if rep is None:
        return "no report yet"
    age = max(wall_now - rep.t, 0.0)
    if age >= STALE_S:
        return f"not reporting for {age:.1f} s"
    if not rep.conns:
        return "not connected"
    stuck = [c for c in rep.conns if c.backoff > 0]
    if stuck:
        c = max(stuck, key=lambda c: (c.backoff, c.unacked))
        return (f"retransmitting to {peers.name(c.peer, role)} ({c.unacked} segment(s) unacknowledged, "
                f"backoff {c.backoff})")
    c = max(rep.conns, key=lambda c: c.idle_recv_s)
    return f"on {peers.name(c.peer, role)}: nothing received for {c.idle_recv_s + age:.1f} s"


def reason(stall: Stall, ev: Evidence, peers: Peers, iterations: int) -> tuple[str, str]:
    """(the role named, the run's reason): what is known to be wrong (links down, faults in
    force), the stalled role with its host, state and last progress, and what each other
    live role was waiting on."""
    role = culprit(stall, ev, peers)
    rep = stall.reports.get(role)
    parts = []
    if ev.down_links:
        parts.append(f"link{'s' if len(ev.down_links) > 1 else ''} {', '.join(ev.down_links)} "
                     f"{'are' if len(ev.down_links) > 1 else 'is'} down")
    if ev.faults:
        parts.append(f"fault{'s' if len(ev.faults) > 1 else ''} {'; '.join(ev.faults)} in force")
    state = ev.proc_state.get(role)
    me = (f"{role} on {peers.host_of.get(role, '?')} made no progress for {stall.idle[role]:.1f} s "
          f"({stall.window.describe()})")
    if _stopped(state):
        me += ", and is stopped (SIGSTOP)"
    elif rep is not None and ev.wall_now - rep.t >= STALE_S:
        me += f", and has not reported for {ev.wall_now - rep.t:.1f} s (hung?)"
    parts.append(me)
    if rep is None:
        parts.append("it never reported progress")
    else:
        it = f"iteration {rep.iterations}/{iterations}, " if role.startswith("worker") else ""
        last = (f"last progress: {it}{_mb(rep.sent_bytes)} sent, {_mb(rep.received_bytes)} received "
                f"on {len(rep.conns)} connection(s), phase {rep.phase}")
        own = [c for c in rep.conns if c.backoff > 0]
        if own:
            last += "; " + waiting_on(role, rep, peers, rep.t)
        parts.append(last)
    others = [r for r in stall.reports if r != role]
    if others:
        def what(r: str) -> str:
            if _stopped(ev.proc_state.get(r)):
                return "is stopped (SIGSTOP)"
            return waiting_on(r, stall.reports[r], peers, ev.wall_now)

        shown = [f"{_where(r, stall.reports[r], peers, iterations)} {what(r)}" for r in others[:MAX_WAITING]]
        more = f"; and {len(others) - MAX_WAITING} more" if len(others) > MAX_WAITING else ""
        parts.append("others waiting: " + "; ".join(shown) + more)
    return role, "stalled: " + "; ".join(parts)


def proc_state(pid: int) -> str | None:
    """The kernel's state letter of `pid` (R, S, D, T stopped, t traced, Z), None if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[0]
