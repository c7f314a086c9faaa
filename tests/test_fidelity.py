"""The per-run fidelity verdict on hand-built monitor tables: each check fails when its
evidence says so, and only then, with its reason code."""
from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from contracts.fidelity import Reason
from emu.config import FidelityConfig
from emu.fidelity import verdict

RATE = 40e6  # bit/s
DT = 0.1


def tables(util, backlog_bytes, idle=0.9, seconds=3.0, read_s=0.005):
    """One link at RATE sending util x RATE, its queue sampled at the same 10 Hz with
    `backlog_bytes` (a number, or a function of t), and the CPU `idle`."""
    t = np.round(np.arange(DT, seconds + 1e-9, DT), 6)
    links = pd.DataFrame({"link": "a->s1", "t": t, "tx_bytes_per_s": util * RATE / 8, "configured_bps": RATE})
    q_t = t - 0.03  # snapshots land between counter reads, as the two monitor threads do
    b = [backlog_bytes(x) if callable(backlog_bytes) else backlog_bytes for x in q_t]
    qdiscs = pd.DataFrame({"link": "a->s1", "t": q_t, "read_s": read_s, "backlog_bytes": b, "drops": 0})
    cpu = pd.DataFrame({"t": t, "cpu_idle": idle, "harness_cpu": 0.05})
    return links, qdiscs, cpu


def judge(*args) -> dict:
    """The verdict as the run's row columns, checked against its typed result."""
    v = verdict(*args)
    row = v.row()
    assert row["fidelity_ok"] == v.ok == (not v.findings)
    assert json.loads(row["fidelity_codes"]) == [f.code.value for f in v.findings]
    assert row["fidelity_reasons"] == "; ".join(f.text for f in v.findings)
    return row


def test_a_clean_run_passes():
    res = judge(*tables(util=0.97, backlog_bytes=1_000_000), FidelityConfig())
    assert res["fidelity_ok"], res["fidelity_reasons"]
    assert res["fidelity_codes"] == "[]"
    assert res["fidelity_saturated_s"] > 2 and 0.96 < res["fidelity_saturated_util_min"] < 0.98


def test_a_link_that_falls_behind_with_a_deep_queue_fails():
    # 1 MB queued is 200 ms of this link: every interval is proven busy, yet it sent 70%.
    v = verdict(*tables(util=0.7, backlog_bytes=1_000_000), FidelityConfig())
    assert not v.ok and v.codes == [Reason.SATURATION]
    (f,) = v.findings
    assert "a->s1 (from t=" in f.text and "reached only 70% of its rate" in f.text
    assert f.evidence["link"] == "a->s1" and f.evidence["util"] == pytest.approx(0.7)
    assert f.evidence["threshold"] == FidelityConfig().saturated_min and f.evidence["proven_busy_s"] > 2


def test_a_shallow_queue_proves_nothing():
    # 68 KB drains in 14 ms at 40 Mb/s: the link may have idled between snapshots.
    res = judge(*tables(util=0.57, backlog_bytes=68_000), FidelityConfig())
    assert res["fidelity_ok"], res["fidelity_reasons"]
    assert res["fidelity_saturated_s"] == 0 and math.isnan(res["fidelity_saturated_util_min"])


def test_only_the_proven_intervals_are_judged():
    # A deep queue until t = 1 s, which keeps the link busy 200 ms longer; the mostly idle
    # rest (util 0.2) is not held against it.
    links, qdiscs, cpu = tables(util=0.2, backlog_bytes=lambda t: 1_000_000 if t < 1.0 else 0)
    links.loc[links["t"] <= 1.2, "tx_bytes_per_s"] = 0.95 * RATE / 8
    res = judge(links, qdiscs, cpu, FidelityConfig())
    assert res["fidelity_ok"], res["fidelity_reasons"]
    assert 0.5 < res["fidelity_saturated_s"] < 1.1


def test_a_slow_snapshot_is_not_trusted_beyond_what_it_proves():
    # 750 KB is 150 ms of the link; a snapshot 30 ms before an interval must cover 130 ms,
    # which it does only if the tc call that took it was quick.
    fast = judge(*tables(util=0.5, backlog_bytes=750_000, read_s=0.0), FidelityConfig())
    slow = judge(*tables(util=0.5, backlog_bytes=750_000, read_s=0.04), FidelityConfig())
    assert not fast["fidelity_ok"] and slow["fidelity_ok"] and slow["fidelity_saturated_s"] == 0


def test_cpu_and_excess_rate_fail_with_their_numbers():
    res = judge(*tables(util=1.2, backlog_bytes=0, idle=0.1), FidelityConfig())
    assert not res["fidelity_ok"]
    assert json.loads(res["fidelity_codes"]) == ["cpu_idle", "rate_excess"]
    assert "CPU idle fell to 10% (< 35%)" in res["fidelity_reasons"]
    assert "ran 20% above its configured rate" in res["fidelity_reasons"]
    cpu, rate = verdict(*tables(util=1.2, backlog_bytes=0, idle=0.1), FidelityConfig()).findings
    assert cpu.evidence == {"idle_min": pytest.approx(0.1), "threshold": 0.35, "window_s": FidelityConfig().window_s}
    assert rate.evidence["link"] == "a->s1" and rate.evidence["excess"] == pytest.approx(0.2)
