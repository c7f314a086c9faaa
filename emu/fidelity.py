"""Is this run trustworthy? A verdict from the monitors, kept in the run's row.

After Handigol et al. (Mininet-HiFi, CoNEXT 2012), an emulation is only believed when
the machine kept up. Three checks, each failing with a reason code (contracts/fidelity.py):

1. `cpu_idle`: the machine's idle fraction, per window of `window_s`, never below
   `cpu_idle_min` (a saturated CPU delays packets and processes, so timings stop being
   the network's).
2. `rate_excess`: no link faster than configured in any window: realized rate <=
   configured x (1 + `rate_tolerance`) (shaping really applied).
3. `saturation`: links with work reach their rate: over the link-counter intervals that a
   queue snapshot proves busy, realized rate >= `saturated_min` x configured (the emulator
   did not fall behind while there was work). A snapshot of B queued bytes taken before an
   interval began proves the link had work until B x 8 / rate after it; an interval is
   proven busy only if that reaches its end, because a shallow queue can drain between two
   samples. Shallow queues therefore leave a run unjudged on this count
   (`fidelity_saturated_s` = 0); a lower `monitor.qdisc_interval_s` proves more.

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


MIN_PROVEN_S = 0.3  # a link is judged on count 3 once this much of its time is proven busy


def _proven_busy(links: pd.DataFrame, qdiscs: pd.DataFrame) -> tuple[float, float, float, float]:
    """Over the link's counter intervals (t[i-1], t[i]] that a queue snapshot proves busy:
    (seconds, bits sent, bits the configured rate allows, start of the first). A snapshot
    lies somewhere in [t - read_s, t]; it counts for an interval only if it surely came
    before the interval's start and surely covers its end."""
    if len(links) < 2 or not len(qdiscs):
        return 0.0, 0.0, 0.0, math.nan
    t = links["t"].to_numpy()
    rate = links["tx_bytes_per_s"].to_numpy() * 8
    conf = links["configured_bps"].to_numpy()
    qt = qdiscs["t"].to_numpy()
    q_from = qt - (qdiscs["read_s"].to_numpy() if "read_s" in qdiscs else 0.0)
    backlog_bits = qdiscs["backlog_bytes"].to_numpy() * 8.0
    busy_s = sent = due = 0.0
    first = math.nan
    for i in range(1, len(t)):
        a, b, c = t[i - 1], t[i], conf[i]
        k = int(np.searchsorted(qt, a, side="right"))  # snapshots finished by a: qt[:k]
        if c <= 0 or k == 0:
            continue
        if max(q_from[j] + backlog_bits[j] / c for j in range(max(0, k - 3), k)) >= b:
            busy_s += b - a
            sent += rate[i] * (b - a)
            due += c * (b - a)
            first = a if math.isnan(first) else first
    return busy_s, sent, due, first


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
    saturated_util_min: float  # lowest share of its rate a link reached while proven busy

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


def _link_checks(links: pd.DataFrame, qdiscs: pd.DataFrame, cfg) -> tuple[float, float, float, list[Finding]]:
    """Per link direction: never above the configured rate in any window, and at least
    saturated_min of it over the intervals a queue snapshot proves busy. Returns (largest
    excess, proven-busy seconds, lowest proven utilisation, findings)."""
    excess_max, worst_excess = 0.0, {}
    sat_min, worst_sat, proven_total = math.inf, {}, 0.0
    for label, g in links.groupby("link"):
        g = g.sort_values("t")
        t = g["t"].to_numpy()
        rate = g["tx_bytes_per_s"].to_numpy() * 8
        conf = g["configured_bps"].to_numpy()
        for w in _windows(t, cfg.window_s):
            r, c = rate[w].mean(), conf[w].mean()
            if c > 0 and r / c - 1 > excess_max:
                excess_max, worst_excess = r / c - 1, {"link": label, "t": float(t[w[0]])}
        q = qdiscs[qdiscs["link"] == label] if len(qdiscs) else qdiscs
        busy_s, sent_bits, due_bits, first = _proven_busy(g, q.sort_values("t"))
        proven_total += busy_s
        if busy_s >= MIN_PROVEN_S and sent_bits / due_bits < sat_min:
            sat_min, worst_sat = sent_bits / due_bits, {"link": label, "from_t": first, "proven_busy_s": busy_s}
    findings = []
    if excess_max > cfg.rate_tolerance:
        e = worst_excess
        findings.append(Finding(Reason.RATE_EXCESS, f"{e['link']} at t={e['t']:.1f} s ran {excess_max:.0%} above "
                                f"its configured rate (> {cfg.rate_tolerance:.0%})",
                                {**e, "excess": excess_max, "tolerance": cfg.rate_tolerance}))
    if sat_min < cfg.saturated_min:
        e = worst_sat
        findings.append(Finding(Reason.SATURATION, f"{e['link']} (from t={e['from_t']:.1f} s, {e['proven_busy_s']:.1f} "
                                f"s proven busy) had queued work but reached only {sat_min:.0%} of its rate "
                                f"(< {cfg.saturated_min:.0%})",
                                {**e, "util": sat_min, "threshold": cfg.saturated_min}))
    return excess_max, proven_total, sat_min, findings


def verdict(links: pd.DataFrame, qdiscs: pd.DataFrame, cpu: pd.DataFrame, cfg) -> Verdict:
    """Judge a run's monitor tables (emu/monitor.py's links, qdiscs and cpu, which the
    runner cuts to the measured iterations when the run completed) by `cfg` (FidelityConfig)."""
    idle_min, cpu_findings = _cpu_check(cpu, cfg)
    excess_max, proven_s, sat_min, link_findings = _link_checks(links, qdiscs, cfg)
    return Verdict(findings=tuple(cpu_findings + link_findings), cpu_idle_min=idle_min,
                   harness_cpu_max=float(cpu["harness_cpu"].max()) if len(cpu) else math.nan,
                   rate_excess_max=excess_max, saturated_s=proven_s,
                   saturated_util_min=sat_min if math.isfinite(sat_min) else math.nan)
