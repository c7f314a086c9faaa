"""When the forest plans, on what bandwidth, and how all workers switch together.

Worker 0 coordinates. Every plan comes from a probe (`bandwidth.py`) run at an iteration
boundary, when no gradient is in flight anywhere:

1. Worker 0 decides, when it has the averages of iteration i, whether iteration i + 2
   starts with a probe, and tells every worker (a NOTE). Nobody can push i + 2 before
   worker 0 has pushed i + 1, which it does only after deciding, so a NOTE is never late.
2. At its first push of a probed iteration every worker says READY: it has every average
   of the iteration before, so once all are READY no gradient byte is in flight. Worker 0
   says GO; all run the probe rounds; each reports its flows' goodput; worker 0 estimates
   the links' capacities, plans, and sends the PLAN (the plan and why it was made); every
   worker installs the same plan (parsed from the same JSON) and pushes on.

Start-up runs the same probe before iteration 0, with every round (bandwidth.py).

Which rounds a re-plan runs. The fan rounds, one per worker, are most of the probe (9 of 11
rounds for 9 workers) and read only the workers' own links; the links between switches, where
a concurrent job or a switched route changes the bandwidth, are saturated by the first two
rounds (all-to-all, ring). With `replan_rounds: shared` (the default) a re-plan runs those two
and keeps the workers' own links at their last full estimate: a 1.1 s probe of 0.1 s rounds
becomes 0.3 s for 9 workers. On racks whose uplink a tenant's UDP took 50 of 75 Mb/s, mid-run,
this is what separated the run from 0.8 of the optimum averaged over it (the probe was 7% of
the run; docs/reproducing.md, forest-replan). A change of a worker's own link is then missed by
the re-plan, so it fires again: a re-plan due while the plan of a shared probe has not yet
run three steady iterations (it could not run at its rate) probes every link, and so does every
re-plan where no link on the workers' paths is shared (a star: nothing else to re-read).

Trigger. Worker 0 times each iteration's all-reduce (its first push to its last average).
The median of the last 5 iterations under a plan (from its third: the first two after a
re-plan ran at 0.45 and 0.42 s where the plan settled at 0.32, and a reference taken from
them re-planned again on the plan's own speed-up) is its reference, so slow drift is
followed. Two iterations in a row slower than (1 + threshold) times the reference, or both
faster than reference / (1 + threshold), each also by at least MIN_CHANGE_S and by 3 median
absolute deviations of the reference, mean the bandwidth changed: iteration i + 2 re-probes
and re-plans, the third iteration after the change. So do two iterations in a row slower
than twice the plan's own prediction (the gradient over the plan's rate, or the backward
pass if that is longer): a change that came during the probe (whose estimate comes from
readings over all its rounds) leaves a plan that cannot run at its rate, and a
reference taken under it would hide that. One iteration is not enough: at 15 Mb/s the
all-reduce time varies by +-20% between iterations, and a single-iteration trigger
re-probed three times in 60 iterations on noise alone, at 5.7 s a probe (0.5 s rounds with
gaps then; now 2.75 s for 9 workers at start-up, in the warm-up, and 0.3 s for a re-plan of
the shared links, whose 0.1 s rounds the job waits for mid-run). The default threshold, 0.25,
keeps apart what these runs showed as noise (two iterations at 1.17x, after which the re-probe found the same
rates) from the changes they were built for (3.4x after a tenant's arrival). A change that
does not move the all-reduce time (a link no tree is limited by got faster) goes unnoticed.

"""
from __future__ import annotations

import dataclasses
import json
import statistics
import threading
import time
from typing import Any

import numpy as np

from schedulers.api import CommError
from schedulers.collective.bandwidth import Pair, estimate, probe_rounds, shared_links, with_capacities
from schedulers.collective.forest_plan import ForestPlan, plan_forest
from schedulers.core.linkmodel import LinkModel
from schedulers.transport.connection import Kind

PROBE_FRAME = np.zeros(16_384, np.float32)   # 64 KiB of filler
SETTLE_ITERATIONS = 2       # the first iterations under a new plan are left out of its reference
REFERENCE_ITERATIONS = 3    # iterations in the reference before it is trusted
REFERENCE_WINDOW = 5        # the reference: median all-reduce time of its last this many iterations
MIN_CHANGE_S = 0.02         # a smaller change of the all-reduce time cannot repay a probe of seconds
PLAN_EFFICIENCY_MIN = 0.5   # an all-reduce slower than twice the plan's prediction: the plan is wrong
FULL, SHARED = "all", "shared"   # a probe of every round, or of the rounds that saturate shared links
_ORDER = (-1,)              # probe frames go before any gradient
_CTRL_ORDER = (-2,)         # and control messages before probe frames


class Replanner:
    """The coordination above, for one worker. `forest` provides outboxes, conns, rank, n,
    the failure and its lock; the Replanner calls `forest.install(plan, record)`."""

    def __init__(self, forest, graph: dict[str, Any], nodes: list[str], model: LinkModel,
                 probe_s: tuple[float, float], threshold: float, epsilon: float, assumed: bool,
                 fan_rounds: int = 1, replan_rounds: str = SHARED):
        """probe_s: a probe round's length at start-up and when re-planning; assumed: no
        capacity graph was given, `graph` is a star of one link per worker; fan_rounds: how
        many times the start-up probe runs its fan rounds (a full re-plan's, once);
        replan_rounds: "shared" or "all", which rounds a re-plan runs (above)."""
        self.f = forest
        self.assumed = assumed
        self.graph, self.nodes, self.model = graph, nodes, model
        (self.probe_s, self.replan_probe_s), self.threshold, self.epsilon = probe_s, threshold, epsilon
        self.fan_rounds = fan_rounds
        shared = shared_links(model, nodes) if model is not None else np.zeros(0, bool)
        self.own_links = ~shared                 # kept at the last full estimate by a shared probe
        self.shared_replans = replan_rounds == SHARED and bool(shared.any())
        self.capacity: np.ndarray | None = None  # worker 0: the estimate the current plan was made on
        self.plan_probe = FULL                   # the probe the current plan came from
        self.inbox: dict[tuple[str, int, int], dict] = {}
        self.decided: dict[int, tuple[str, bool]] = {}  # worker 0: iteration -> (why it probes, "" = not; full?)
        self.first_push: dict[int, float] = {}
        self.last_push: dict[int, float] = {}
        self.windows: list[float] = []           # all-reduce times under the current plan
        self.installed_at = 0                    # the iteration the current plan started with
        self.epoch = 0
        self.busy: int | None = None             # the iteration being re-planned for, until installed
        self.outside: tuple[int, int] = (0, -1)  # worker 0: the last iteration's side of the band, and which
        self.trace: list[list] = []              # worker 0: [iteration, plan epoch, all-reduce s] of each
        self.gradient_bits = 0.0                 # set by the forest at start: 32 x the parameters

    # ------------------------------------------------------------------ messages
    def send(self, peer: int, msg: dict) -> None:
        body = np.frombuffer(json.dumps(msg).encode(), np.uint8)
        self.f.outboxes[peer].put(_CTRL_ORDER, Kind.CTRL, 0, 0, max(msg.get("it", 0), 0), body)

    def on_message(self, sender: int, msg: dict) -> None:
        """From a receive thread, lock held."""
        self.inbox[(msg["t"], msg["it"], sender)] = msg
        self.f._cv.notify_all()

    def _await(self, kind: str, it: int, senders: list[int]) -> list[dict]:
        with self.f._cv:
            while not all((kind, it, s) in self.inbox for s in senders):
                self.f._failure.check()
                self.f._cv.wait(1.0)
            return [self.inbox.pop((kind, it, s)) for s in senders]

    # ------------------------------------------------------------------ per iteration
    def enter(self, it: int) -> None:
        """Before the first push of iteration `it` (lock not held): probe and re-plan if due."""
        others = [p for p in range(self.f.n) if p != self.f.rank]
        why, full = "", True
        if it == 0:
            why = "start-up: no plan yet"
        elif self.f.rank == 0:
            with self.f._cv:
                why, full = self.decided.pop(it, ("", True))
        elif it >= 2:
            note = self._await("note", it, [0])[0]
            why, full = note["why"], note["full"]
        if why:
            self._replan(it, why, full, others)
        if self.f.rank == 0:
            with self.f._cv:
                self.first_push[it] = time.monotonic()

    def iteration_done(self, it: int) -> None:
        """Worker 0, lock held: iteration `it` is averaged here. Decide whether it + 2 probes."""
        if self.f.rank != 0:
            return
        started = self.first_push.pop(it, None)
        backward = self.last_push.pop(it, 0.0) - (started or 0.0)
        why = ""
        if started is not None and it >= 1 and not self.decided.get(it + 1, ("", True))[0]:
            window = time.monotonic() - started
            self.trace.append([it, self.epoch, window])
            side, text = self._outside(window, backward)
            if side and side == self.outside[0]:
                why = f"iterations {self.outside[1]} and {it}: {text}"
            elif not side and it >= self.installed_at + SETTLE_ITERATIONS:
                self.windows.append(window)
            self.outside = (side, it)
        full = self.full_probe_due() if why else True
        self.decided[it + 2] = (why, full)
        for p in range(1, self.f.n):
            self.send(p, {"t": "note", "it": it + 2, "why": why, "full": full})

    def full_probe_due(self) -> bool:
        """Whether a re-plan decided now probes every link (see the module docstring)."""
        return not self.shared_replans or (self.plan_probe == SHARED and len(self.windows) < REFERENCE_ITERATIONS)

    def pushed(self, it: int) -> None:
        """Worker 0, lock held: a gradient of `it` was pushed (the last one ends the backward pass)."""
        if self.f.rank == 0:
            self.last_push[it] = time.monotonic()

    def _outside(self, window: float, backward: float) -> tuple[int, str]:
        """(+1 or -1, why) when `window` is slower or faster than the plan's reference by more
        than the threshold, by MIN_CHANGE_S and by 3 median absolute deviations of the
        reference, or (+1, why) when it is under PLAN_EFFICIENCY_MIN of what the plan predicts
        (the longer of G over the plan's rate and the backward pass that pushes G: a plan made
        on a probe that a change overtook); else (0, "")."""
        predicted = max(self.gradient_bits / self.f._plan.rate, backward) if self.f._plan is not None else 0.0
        if predicted > 0 and window > predicted / PLAN_EFFICIENCY_MIN and window - predicted >= MIN_CHANGE_S:
            return 1, f"all-reduce {window / predicted:.1f}x the plan's prediction"
        if len(self.windows) < REFERENCE_ITERATIONS:
            return 0, ""
        ref_windows = self.windows[-REFERENCE_WINDOW:]
        ref = statistics.median(ref_windows)
        spread = 3 * statistics.median(abs(w - ref) for w in ref_windows)
        ratio = window / ref
        if abs(window - ref) < max(MIN_CHANGE_S, spread):
            return 0, ""
        why = f"all-reduce {ratio:.2f}x the median of this plan's last iterations"
        return (1, why) if ratio > 1 + self.threshold else (-1, why) if ratio < 1 / (1 + self.threshold) else (0, "")

    # ------------------------------------------------------------------ the probe and the plan
    def hold(self, it: int) -> None:
        """From a receive thread: a gradient of iteration `it` waits while that iteration's plan
        is being made here (a peer that already has it may send first; TCP holds the rest).
        Called only while `busy` is set: it is set before our READY, and no frame of the new
        plan can come before every READY, so reading it unlocked first is enough."""
        with self.f._cv:
            while self.busy is not None and it >= self.busy:
                self.f._failure.check()
                self.f._cv.wait(1.0)

    def _replan(self, it: int, why: str, full: bool, others: list[int]) -> None:
        t0 = time.time()
        with self.f._cv:
            self.busy = it
        if self.f.rank == 0:
            self._await("ready", it, others)
            for p in others:
                self.send(p, {"t": "go", "it": it})
        else:
            self.send(0, {"t": "ready", "it": it})
            self._await("go", it, [0])
        with self.f._cv:
            self.f.unpace()   # the probe measures the links, not the plan's caps
        go = time.time()
        mine = self._probe(it, full)
        rounds_end = time.time()
        if self.f.rank != 0:
            self.send(0, {"t": "report", "it": it, "rates": mine})
            msg = self._await("plan", it, [0])[0]
        else:
            reports = [mine] + [m["rates"] for m in self._await("report", it, others)]
            msg = self._plan(it, why, full, reports, t0, go, rounds_end)
            for p in others:
                self.send(p, msg)
            msg = json.loads(json.dumps(msg))    # what the others parse, to the last bit
        with self.f._cv:
            self.windows, self.outside, self.installed_at = [], (0, -1), it
            self.epoch = msg["record"]["epoch"]
            self.plan_probe = msg["record"]["probe"]
            self.f.install(ForestPlan.from_dict(msg["plan"]), msg["record"])
            self.busy = None
            self.f._cv.notify_all()

    def _plan(self, it: int, why: str, full: bool, reports: list[list], t0: float, go: float,
              rounds_end: float) -> dict:
        """t0, go, rounds_end: when the re-plan began, when GO came, when the probe's rounds ended."""
        rounds: list[dict[Pair, float]] = [{} for _ in self._rounds(it, full)]
        for receiver, rates in enumerate(reports):    # reports[k]: what worker k received
            for r, src, bps in rates:
                rounds[r][(src, receiver)] = bps
        capacity = estimate(self.model, rounds)
        if not full:    # the workers' own links as the last full probe read them
            capacity = np.where(self.own_links, self.capacity, capacity)
        self.capacity = capacity
        probed = time.time()
        plan = plan_forest(with_capacities(self.graph, self.model, capacity), self.nodes, self.epsilon)
        plan = dataclasses.replace(plan, assumed_topology=self.assumed)
        record = {"epoch": self.epoch + (it > 0), "iteration": it, "time": t0, "reason": why,
                  "probe": FULL if full else SHARED, "rounds": len(rounds),
                  "probe_s": probed - t0, "plan_s": time.time() - probed,
                  "ready_s": go - t0, "rounds_s": rounds_end - go,
                  "rate_bps": plan.rate, "optimum_bps": plan.optimum, "trees": len(plan.trees),
                  "capacity_bps": {f"{u}>{v}": float(c) for (u, v), c in zip(self.model.links, capacity,
                                                                               strict=True)}}
        return {"t": "plan", "it": it, "plan": plan.to_dict(), "record": record}

    def _probe(self, it: int, full: bool) -> list[list]:
        """Run every round from now; return [round, sender, bit/s] of what reached us from each
        peer in each round's measuring window (bytes_arrived; any peer, in the round or not:
        bytes of an earlier round still draining load the links too)."""
        start, out = time.monotonic(), []
        length = self.replan_probe_s if it > 0 else self.probe_s
        rounds = self._rounds(it, full)
        for r, flows in enumerate(rounds):
            dests = [j for i, j in flows if i == self.f.rank]
            begin = start + r * length
            _sleep_until(begin)
            out += [[r, j, bps] for j, bps in self._round(r, it, dests, begin, length).items() if bps > 0]
        _sleep_until(start + len(rounds) * length)
        return out

    def _rounds(self, it: int, full: bool) -> list[list[Pair]]:
        """The probe's rounds: start-up's repeats the fans `fan_rounds` times, a full re-plan's
        runs them once, a shared one none (all-to-all and the ring)."""
        return probe_rounds(self.f.n, self.fan_rounds if it == 0 else 1 if full else 0)

    def _round(self, r: int, it: int, dests: list[int], begin: float, length: float) -> dict[int, float]:
        stop = begin + length
        skip = begin + length / 3                # past slow start after the idle gap
        for j in dests:
            self._keep_sending(j, r, it, stop)
        _sleep_until(skip)
        peers = list(self.f.conns)
        before = {j: (self._arrived(j), time.monotonic()) for j in peers}
        _sleep_until(stop)
        for j in dests:    # what is still queued would only load the next round
            self.f.outboxes[j].drop(Kind.PROBE)
        rates = {}
        for j in peers:
            got0, t_a = before[j]
            got1, t_b = self._arrived(j), time.monotonic()
            if got0 is None or got1 is None:
                raise CommError("this kernel does not report the data segments a connection received "
                                "(TCP_INFO, Linux 4.6+); use forest with bandwidth: configured")
            rates[j] = (got1 - got0) * 8 / (t_b - t_a)
        self.f._failure.check()
        return rates

    def _arrived(self, peer: int) -> int | None:
        """The connection's bytes_arrived; on a connection already closed, the failure recorded
        for it (which names the worker that failed) where there is one."""
        try:
            return self.f.conns[peer].bytes_arrived()
        except CommError:
            self.f._failure.check()
            raise

    def _keep_sending(self, peer: int, r: int, it: int, stop: float) -> None:
        """Two probe frames queued at all times until `stop`: each one sent queues the next."""
        ob = self.f.outboxes[peer]

        def sent():
            if time.monotonic() < stop:
                ob.put(_ORDER, Kind.PROBE, r, 0, it, PROBE_FRAME, on_sent=sent)
        for _ in range(2):
            ob.put(_ORDER, Kind.PROBE, r, 0, it, PROBE_FRAME, on_sent=sent)


def _sleep_until(t: float) -> None:
    delay = t - time.monotonic()
    if delay > 0:
        threading.Event().wait(delay)
