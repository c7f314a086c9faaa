"""Is this run trustworthy? A verdict from the monitors, kept in the run's row.

After Handigol et al. (Mininet-HiFi, CoNEXT 2012), an emulation is only believed when
the machine kept up. Three checks, each failing with a reason code (contracts/fidelity.py):

1. `cpu_idle`: the machine's idle fraction, per window of `window_s`, never below
   `cpu_idle_min` (a saturated CPU delays packets and processes, so timings stop being
   the network's).
2. `rate_excess`: no link faster than configured in any window: realized rate <=
   configured x (1 + `rate_tolerance`) (shaping really applied).
3. `saturation`: a link with work reaches its rate: in every window where a link direction
   was busy for at least MIN_PROVEN_S, it sent at least `saturated_min` of the bits its rate
   allowed over its busy counter intervals (the emulator did not fall behind while there was
   work). What it catches: the machine's own links (htb dequeueing, veth delivering into the
   peer's backlog) unable to deliver the configured rate while packets wait.

   A counter interval (t[i-1], t[i]] is busy when it is proven so:
   - by its queue: each snapshot of B queued bytes proves the link had work from the
     snapshot until (B - burst) x 8 / rate after it (htb sends at most its burst above the
     rate), and an interval is proven when these spans, chained snapshot to snapshot, cover
     all of it. A snapshot lies somewhere in [t - read_s, t], so it covers from t on, and its
     span is counted from t - read_s. With queues sampled at 100 Hz (the netlink monitor) a
     default 20 ms queue that stays over about half full proves every interval it spans; at
     10 Hz (the tc monitor) only queues deeper than about 100 ms of their rate prove any;
   - or by what it sent: an interval that carried at least AT_RATE of its rate was busy
     (and passes).
   Intervals in which the configured rate changed are not judged, and a snapshot proves
   nothing past the last counter sample at its rate. `fidelity_saturated_s` is the busy
   link time, summed over link directions; `fidelity_saturation_judged_s` the part of it in
   the windows that were judged.

A run failing the verdict is kept and marked (`fidelity_ok` False, with the reasons as
sentences and as codes).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from contracts.fidelity import COLUMN as CODES_COLUMN
from contracts.fidelity import Reason
from contracts.fidelity import encode as encode_codes
from emu.testbed import tc


def _windows(t: np.ndarray, window_s: float) -> list[np.ndarray]:
    """Index arrays of non-overlapping windows of `window_s` over sample times t."""
    if len(t) == 0:
        return []
    edges = np.arange(t.min(), t.max() + 1e-9, window_s)
    out = []
    for lo in edges:
        idx = np.nonzero((t >= lo) & (t < lo + window_s))[0]
        if len(idx) and (len(edges) == 1 or t[idx].max() - t[idx].min() >= 0.8 * window_s - 1e-9):
            out.append(idx)
    return out


MIN_PROVEN_S = 0.3  # a link direction's window is judged on count 3 once this much of it is busy
AT_RATE = 0.95  # an interval that carried this share of the configured rate was busy


@dataclass(frozen=True)
class Busy:
    """A link direction's counter intervals (t[i-1], t[i]], i = 1..n-1, and which were busy."""
    a: np.ndarray  # start of each interval
    b: np.ndarray  # end
    sent_bits: np.ndarray
    due_bits: np.ndarray  # what the configured rate allowed
    backlogged: np.ndarray  # bool: proven by its queue
    busy: np.ndarray  # bool: backlogged or at rate (and judged at all: no rate change inside)


def _covered(qt: np.ndarray, ends: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Whether each [a, b] lies inside the union of the spans [qt_j, ends_j] (qt sorted)."""
    keep = ends > qt
    qt, ends = qt[keep], ends[keep]
    if not len(qt):
        return np.zeros(len(a), bool)
    reach = np.maximum.accumulate(ends)
    gap = np.nonzero(qt[1:] > reach[:-1])[0]  # a chain ends at each gap
    starts = np.concatenate([qt[:1], qt[gap + 1]])
    stops = np.concatenate([reach[gap], reach[-1:]])
    k = np.searchsorted(starts, a, side="right") - 1
    return (k >= 0) & (stops[np.maximum(k, 0)] >= b)


def busy_intervals(links: pd.DataFrame, qdiscs: pd.DataFrame) -> Busy:
    """The busy intervals of one link direction (`links` and `qdiscs` of that direction,
    sorted by t), proven as the module's docstring says."""
    t = links["t"].to_numpy(float)
    rate = links["tx_bytes_per_s"].to_numpy(float) * 8
    conf = links["configured_bps"].to_numpy(float)
    a, b, c = t[:-1], t[1:], conf[1:]
    dt = b - a
    judged = (conf[:-1] == c) & (c > 0)
    backlogged = np.zeros(len(a), bool)
    if len(qdiscs) and len(t) > 1:
        qt = qdiscs["t"].to_numpy(float)
        q_from = qt - (qdiscs["read_s"].to_numpy(float) if "read_s" in qdiscs else 0.0)
        backlog_bits = qdiscs["backlog_bytes"].to_numpy(float) * 8
        # Spans of equal configured rate: samples s..e (inclusive) saw the same rate, so it
        # held from t[s] to t[e]; a snapshot proves work at that rate only inside them.
        change = np.nonzero(conf[1:] != conf[:-1])[0] + 1
        for s, e in zip(np.concatenate([[0], change]), np.concatenate([change - 1, [len(t) - 1]])):
            rate_s = conf[s]
            if e <= s or rate_s <= 0:
                continue
            lo, hi = np.searchsorted(qt, t[s], side="left"), np.searchsorted(qt, t[e], side="right")
            inside = np.arange(lo, hi)[q_from[lo:hi] >= t[s]]
            burst_bits = tc.burst_bytes(rate_s) * 8
            ends = np.minimum(q_from[inside] + (backlog_bits[inside] - burst_bits) / rate_s, t[e])
            idx = np.arange(s, e)  # intervals (t[i], t[i+1]] inside the span
            backlogged[idx] = _covered(qt[inside], ends, a[idx], b[idx])
    backlogged &= judged
    at_rate = judged & (rate[1:] >= AT_RATE * c)
    return Busy(a, b, rate[1:] * dt, c * dt, backlogged, backlogged | at_rate)


@dataclass(frozen=True)
class Finding:
    """One failed check: its code, the sentence for people, and the numbers behind it."""
    code: Reason
    text: str
    evidence: dict[str, Any]


@dataclass(frozen=True)
class Verdict:
    """The checks' findings (empty: the run passed) and the measures they judged."""
    findings: tuple[Finding, ...]
    cpu_idle_min: float  # lowest window mean of the machine's idle fraction
    harness_cpu_max: float  # the monitors' own CPU share, at most
    rate_excess_max: float  # largest window excess over a configured rate (0.1 = 10%)
    saturated_s: float  # link time proven busy, summed over link directions
    saturation_judged_s: float  # of which in windows the saturation check judged
    saturated_util_min: float  # lowest share of its rate a link reached while busy, over the judged windows

    @property
    def ok(self) -> bool:
        return not self.findings

    @property
    def codes(self) -> list[Reason]:
        return [f.code for f in self.findings]

    def row(self) -> dict[str, Any]:
        """The run row's fidelity columns."""
        return {
            "fidelity_cpu_idle_min": self.cpu_idle_min,
            "harness_cpu_max": self.harness_cpu_max,
            "fidelity_rate_excess_max": self.rate_excess_max,
            "fidelity_saturated_s": self.saturated_s,
            "fidelity_saturation_judged_s": self.saturation_judged_s,
            "fidelity_saturated_util_min": self.saturated_util_min,
            "fidelity_ok": self.ok,
            "fidelity_reasons": "; ".join(f.text for f in self.findings),
            CODES_COLUMN: encode_codes(self.codes),
        }


def _cpu_check(cpu: pd.DataFrame, cfg) -> tuple[float, list[Finding]]:
    """(lowest window mean of the idle fraction, a finding if it is below cpu_idle_min)."""
    if not len(cpu):
        return math.nan, []
    t = cpu["t"].to_numpy()
    vals = [cpu["cpu_idle"].to_numpy()[w].mean() for w in _windows(t, cfg.window_s)]
    if not vals:
        return math.nan, []
    idle_min = float(min(vals))
    if idle_min >= cfg.cpu_idle_min:
        return idle_min, []
    text = f"CPU idle fell to {idle_min:.0%} (< {cfg.cpu_idle_min:.0%}) in a {cfg.window_s:g} s window"
    return idle_min, [Finding(Reason.CPU_IDLE, text, {"idle_min": idle_min, "threshold": cfg.cpu_idle_min,
                                                      "window_s": cfg.window_s})]


def _link_checks(links: pd.DataFrame, qdiscs: pd.DataFrame, cfg
                 ) -> tuple[float, float, float, float, list[Finding]]:
    """Per link direction: never above the configured rate in any window, and in each window
    busy for at least MIN_PROVEN_S, at least saturated_min of the rate over its busy
    intervals. Returns (largest excess, busy seconds, judged seconds, lowest judged
    utilisation, findings)."""
    excess_max, worst_excess = 0.0, {}
    sat_min, worst_sat, busy_total, judged_total = math.inf, {}, 0.0, 0.0
    by_link = dict(tuple(qdiscs.groupby("link"))) if len(qdiscs) else {}
    for label, g in links.groupby("link"):
        g = g.sort_values("t")
        t = g["t"].to_numpy()
        rate = g["tx_bytes_per_s"].to_numpy() * 8
        conf = g["configured_bps"].to_numpy()
        for w in _windows(t, cfg.window_s):
            r, c = rate[w].mean(), conf[w].mean()
            if c > 0 and r / c - 1 > excess_max:
                excess_max, worst_excess = r / c - 1, {"link": label, "t": float(t[w[0]])}
        if len(t) < 2:
            continue
        q = by_link.get(label)
        bz = busy_intervals(g, q.sort_values("t") if q is not None else qdiscs.iloc[:0])
        dt = bz.b - bz.a
        busy_total += float(dt[bz.busy].sum())
        # Windows of window_s from the link's first sample; an interval belongs to the one its end falls in.
        win = np.floor((bz.b - t[0]) / cfg.window_s).astype(int)
        nwin = int(win.max()) + 1
        busy_s = np.bincount(win, dt * bz.busy, nwin)
        backlogged_s = np.bincount(win, dt * bz.backlogged, nwin)
        sent = np.bincount(win, bz.sent_bits * bz.busy, nwin)
        due = np.bincount(win, bz.due_bits * bz.busy, nwin)
        for k in np.nonzero(busy_s >= MIN_PROVEN_S)[0]:
            judged_total += float(busy_s[k])
            util = float(sent[k] / due[k])
            if util < sat_min:
                in_k = bz.busy & (win == k)
                sat_min, worst_sat = util, {"link": label, "from_t": float(bz.a[in_k].min()),
                                            "to_t": float(bz.b[in_k].max()), "busy_s": float(busy_s[k]),
                                            "backlogged_s": float(backlogged_s[k])}
    findings = []
    if excess_max > cfg.rate_tolerance:
        e = worst_excess
        findings.append(Finding(Reason.RATE_EXCESS, f"{e['link']} at t={e['t']:.1f} s ran {excess_max:.0%} above "
                                f"its configured rate (> {cfg.rate_tolerance:.0%})",
                                {**e, "excess": excess_max, "tolerance": cfg.rate_tolerance}))
    if sat_min < cfg.saturated_min:
        e = worst_sat
        findings.append(Finding(Reason.SATURATION, f"{e['link']} (t={e['from_t']:.1f}-{e['to_t']:.1f} s: "
                                f"{e['busy_s']:.2f} s busy, {e['backlogged_s']:.2f} s of it with its queue proven "
                                f"non-empty) had queued work but reached only {sat_min:.0%} of its rate "
                                f"(< {cfg.saturated_min:.0%})",
                                {**e, "util": sat_min, "threshold": cfg.saturated_min}))
    return excess_max, busy_total, judged_total, sat_min, findings


def verdict(links: pd.DataFrame, qdiscs: pd.DataFrame, cpu: pd.DataFrame, cfg) -> Verdict:
    """Judge a run's monitor tables (emu/testbed/monitor.py's links, qdiscs and cpu, which the
    runner cuts to the measured iterations when the run completed) by `cfg` (FidelityConfig)."""
    idle_min, cpu_findings = _cpu_check(cpu, cfg)
    excess_max, busy_s, judged_s, sat_min, link_findings = _link_checks(links, qdiscs, cfg)
    return Verdict(findings=tuple(cpu_findings + link_findings), cpu_idle_min=idle_min,
                   harness_cpu_max=float(cpu["harness_cpu"].max()) if len(cpu) else math.nan,
                   rate_excess_max=excess_max, saturated_s=busy_s,
                   saturation_judged_s=judged_s,
                   saturated_util_min=sat_min if math.isfinite(sat_min) else math.nan)
