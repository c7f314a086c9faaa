"""Is this run trustworthy? A verdict from the monitors, kept in the run's row.

After Handigol et al. (Mininet-HiFi, CoNEXT 2012), an emulation is only believed when
the machine kept up. Three checks over sliding windows of `window_s`:

1. CPU: the machine's idle fraction never below `cpu_idle_min` (a saturated CPU delays
   packets and processes, so timings stop being the network's).
2. No link faster than configured: realized rate <= configured x (1 + `rate_tolerance`)
   (shaping really applied).
3. Links with work reach their rate: over the link-counter intervals that a queue
   snapshot proves busy, realized rate >= `saturated_min` x configured (the emulator did
   not fall behind while there was work). A snapshot of B queued bytes taken before an
   interval began proves the link had work until B x 8 / rate after it; an interval is
   proven busy only if that reaches its end. Any backlog > 0 at 10 Hz samples is no proof:
   at 37 Mb/s a 68 KB queue drains in 15 ms, and a check that trusted it failed 26 of the
   60 `priority` runs at 78-89% "utilisation" with the CPU at least 54% idle. Shallow
   queues therefore leave a run unjudged on this count (`fidelity_saturated_s` = 0);
   a lower `monitor.qdisc_interval_s` proves more.

A run failing the verdict is kept and marked (`fidelity_ok` False, with the reasons).
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd


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


def verdict(links: pd.DataFrame, qdiscs: pd.DataFrame, cpu: pd.DataFrame, cfg) -> dict[str, Any]:
    reasons: list[str] = []
    res: dict[str, Any] = {}

    # 1. CPU idle per window
    idle_min = math.nan
    if len(cpu):
        t = cpu["t"].to_numpy()
        vals = [cpu["cpu_idle"].to_numpy()[w].mean() for w in _windows(t, cfg.window_s)]
        idle_min = float(min(vals)) if vals else math.nan
        if vals and idle_min < cfg.cpu_idle_min:
            reasons.append(f"CPU idle fell to {idle_min:.0%} (< {cfg.cpu_idle_min:.0%}) in a {cfg.window_s:g} s window")
    res["fidelity_cpu_idle_min"] = idle_min
    res["harness_cpu_max"] = float(cpu["harness_cpu"].max()) if len(cpu) else math.nan

    # 2 and 3, per link direction: never above the configured rate in any window, and at
    # least saturated_min of it over the intervals a queue snapshot proves busy
    excess_max, worst_excess = 0.0, ""
    sat_min, worst_sat, proven_total = math.inf, "", 0.0
    for label, g in links.groupby("link"):
        g = g.sort_values("t")
        t = g["t"].to_numpy()
        rate = g["tx_bytes_per_s"].to_numpy() * 8
        conf = g["configured_bps"].to_numpy()
        for w in _windows(t, cfg.window_s):
            r, c = rate[w].mean(), conf[w].mean()
            if c > 0 and r / c - 1 > excess_max:
                excess_max, worst_excess = r / c - 1, f"{label} at t={t[w[0]]:.1f} s"
        q = qdiscs[qdiscs["link"] == label] if len(qdiscs) else qdiscs
        busy_s, sent_bits, due_bits, first = _proven_busy(g, q.sort_values("t"))
        proven_total += busy_s
        if busy_s >= MIN_PROVEN_S and sent_bits / due_bits < sat_min:
            sat_min, worst_sat = sent_bits / due_bits, f"{label} (from t={first:.1f} s, {busy_s:.1f} s proven busy)"
    if excess_max > cfg.rate_tolerance:
        reasons.append(f"{worst_excess} ran {excess_max:.0%} above its configured rate (> {cfg.rate_tolerance:.0%})")
    if sat_min < cfg.saturated_min:
        reasons.append(f"{worst_sat} had queued work but reached only {sat_min:.0%} of its rate "
                       f"(< {cfg.saturated_min:.0%})")
    res["fidelity_rate_excess_max"] = excess_max
    res["fidelity_saturated_s"] = proven_total
    res["fidelity_saturated_util_min"] = sat_min if math.isfinite(sat_min) else math.nan
    res["fidelity_ok"] = not reasons
    res["fidelity_reasons"] = "; ".join(reasons)
    return res
