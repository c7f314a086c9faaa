"""Is this run trustworthy? A verdict from the monitors, kept in the run's row.

After Handigol et al. (Mininet-HiFi, CoNEXT 2012), an emulation is only believed when
the machine kept up. Three checks over sliding windows of `window_s`:

1. CPU: the machine's idle fraction never below `cpu_idle_min` (a saturated CPU delays
   packets and processes, so timings stop being the network's).
2. No link faster than configured: realized rate <= configured x (1 + `rate_tolerance`)
   (shaping really applied).
3. Saturated links reach their rate: in a window where the link's shaping queue was
   backlogged in every qdisc sample, realized rate >= `saturated_min` x configured (the
   emulator did not fall behind while there was work).

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


def verdict(links: pd.DataFrame, qdiscs: pd.DataFrame, cpu: pd.DataFrame, cfg, interval_s: float) -> dict[str, Any]:
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

    # 2 and 3, per link direction
    excess_max, sat_min, sat_windows = 0.0, math.inf, 0
    worst_excess, worst_sat = "", ""
    for label, g in links.groupby("link"):
        g = g.sort_values("t")
        t = g["t"].to_numpy()
        rate = g["tx_bytes_per_s"].to_numpy() * 8
        conf = g["configured_bps"].to_numpy()
        q = qdiscs[qdiscs["link"] == label].sort_values("t") if len(qdiscs) else qdiscs
        for w in _windows(t, cfg.window_s):
            r, c = rate[w].mean(), conf[w].mean()
            if c <= 0:
                continue
            ratio = r / c
            if ratio - 1 > excess_max:
                excess_max, worst_excess = ratio - 1, f"{label} at t={t[w[0]]:.1f} s"
            if len(q):
                lo, hi = t[w[0]] - interval_s, t[w[-1]]
                qw = q[(q["t"] >= lo) & (q["t"] <= hi)]
                if len(qw) >= 2 and (qw["backlog_bytes"] > 0).all():
                    sat_windows += 1
                    if ratio < sat_min:
                        sat_min, worst_sat = ratio, f"{label} at t={t[w[0]]:.1f} s"
    if excess_max > cfg.rate_tolerance:
        reasons.append(f"{worst_excess} ran {excess_max:.0%} above its configured rate (> {cfg.rate_tolerance:.0%})")
    if sat_windows and sat_min < cfg.saturated_min:
        reasons.append(f"{worst_sat} was backlogged but reached only {sat_min:.0%} of its rate "
                       f"(< {cfg.saturated_min:.0%})")
    res["fidelity_rate_excess_max"] = excess_max
    res["fidelity_saturated_windows"] = sat_windows
    res["fidelity_saturated_util_min"] = sat_min if sat_windows else math.nan
    res["fidelity_ok"] = not reasons
    res["fidelity_reasons"] = "; ".join(reasons)
    return res
