"""The per-run fidelity verdict on hand-built monitor tables: each check fails when its
evidence says so, and only then, with its reason code."""
from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from contracts.fidelity import Reason
from emu.config.experiment import FidelityConfig
from emu.testbed.fidelity import verdict

RATE = 40e6  # bit/s
DT = 0.1


def tables(util, backlog_bytes, idle=0.9, seconds=3.0, read_s=0.005, q_dt=DT, q_offset=0.03):
    """One link at RATE sending util x RATE, counters at 10 Hz, its queue sampled every q_dt
    with `backlog_bytes` (a number, or a function of the snapshot's time), and the CPU `idle`."""
    t = np.round(np.arange(DT, seconds + 1e-9, DT), 6)
    links = pd.DataFrame({"link": "a->s1", "t": t, "tx_bytes_per_s": util * RATE / 8, "configured_bps": RATE})
    # Snapshots land between counter reads (the tc monitor's two threads; the netlink monitor
    # reads queues just before counters).
    q_t = np.round(np.arange(DT, seconds + 1e-9, q_dt), 6) - q_offset
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
    assert res["fidelity_saturation_judged_s"] == pytest.approx(res["fidelity_saturated_s"])


def test_a_link_that_falls_behind_with_a_deep_queue_fails():
    # 1 MB queued is 200 ms of this link: every interval is proven busy, yet it sent 70%.
    v = verdict(*tables(util=0.7, backlog_bytes=1_000_000), FidelityConfig())
    assert not v.ok and v.codes == [Reason.SATURATION]
    (f,) = v.findings
    assert "a->s1 (t=" in f.text and "reached only 70% of its rate" in f.text
    assert f.evidence["link"] == "a->s1" and f.evidence["util"] == pytest.approx(0.7)
    assert f.evidence["threshold"] == FidelityConfig().saturated_min
    assert f.evidence["busy_s"] == pytest.approx(f.evidence["backlogged_s"]) and f.evidence["busy_s"] > 0.75
    assert v.saturation_judged_s > 2


def test_a_shallow_queue_proves_nothing():
    # 68 KB drains in 14 ms at 40 Mb/s: the link may have idled between snapshots.
    res = judge(*tables(util=0.57, backlog_bytes=68_000), FidelityConfig())
    assert res["fidelity_ok"], res["fidelity_reasons"]
    assert res["fidelity_saturated_s"] == 0 and math.isnan(res["fidelity_saturated_util_min"])
    assert res["fidelity_saturation_judged_s"] == 0


def test_only_the_proven_intervals_are_judged():
    # A deep queue until t = 1 s, which keeps the link busy 200 ms longer; the mostly idle
    # rest (util 0.2) is not held against it.
    links, qdiscs, cpu = tables(util=0.2, backlog_bytes=lambda t: 1_000_000 if t < 1.0 else 0)
    links.loc[links["t"] <= 1.2, "tx_bytes_per_s"] = 0.96 * RATE / 8
    res = judge(links, qdiscs, cpu, FidelityConfig())
    assert res["fidelity_ok"], res["fidelity_reasons"]
    assert res["fidelity_saturated_s"] == pytest.approx(1.1)  # (0.1, 1.2]: at rate, and queued until 1.167


def test_a_slow_snapshot_is_not_trusted_beyond_what_it_proves():
    # 750 KB is 150 ms of the link less its 15 KB burst; a snapshot 30 ms before an interval
    # must cover 130 ms, which it does only if the tc call that took it was quick. Every
    # other snapshot is empty, so no chain of snapshots helps.
    def every_other(t):
        return 750_000 if round((t + 0.03) * 10) % 2 == 0 else 0
    fast = judge(*tables(util=0.5, backlog_bytes=every_other, read_s=0.0), FidelityConfig())
    slow = judge(*tables(util=0.5, backlog_bytes=every_other, read_s=0.04), FidelityConfig())
    assert not fast["fidelity_ok"] and slow["fidelity_ok"] and slow["fidelity_saturated_s"] == 0
    assert fast["fidelity_saturated_s"] == pytest.approx(1.4)  # every other interval of (0.1, 3.0]


# A default 20 ms queue at 40 Mb/s holds 100 KB; 90 KB proves (90 - 15) KB x 8 / 40 Mb/s = 15 ms.
DEFAULT_QUEUE_SNAPSHOT = 90_000


def test_snapshots_at_100_hz_chain_a_default_queue_into_proven_intervals():
    # Each snapshot covers 15 ms, the next comes 10 ms later: every 100 ms counter interval
    # is proven, and a link that sends 70% of its rate while queued fails.
    fast = verdict(*tables(util=0.7, backlog_bytes=DEFAULT_QUEUE_SNAPSHOT, q_dt=0.01, q_offset=0.0005,
                           read_s=0.0002), FidelityConfig())
    assert fast.codes == [Reason.SATURATION] and fast.saturated_util_min == pytest.approx(0.7)
    assert fast.saturation_judged_s == pytest.approx(2.8)  # (0.2, 3.0]: the first snapshot inside comes at 0.11
    assert fast.findings[0].evidence["backlogged_s"] == pytest.approx(fast.findings[0].evidence["busy_s"])
    # The same queue sampled at 10 Hz proves nothing; at its rate the link passes either way.
    slow = judge(*tables(util=0.7, backlog_bytes=DEFAULT_QUEUE_SNAPSHOT), FidelityConfig())
    assert slow["fidelity_ok"] and slow["fidelity_saturated_s"] == 0
    busy = judge(*tables(util=0.97, backlog_bytes=DEFAULT_QUEUE_SNAPSHOT, q_dt=0.01, q_offset=0.0005,
                         read_s=0.0002), FidelityConfig())
    assert busy["fidelity_ok"] and busy["fidelity_saturation_judged_s"] == pytest.approx(2.9)


def test_an_empty_snapshot_or_a_small_one_breaks_the_chain():
    def holes(size):
        return lambda t: 0 if round((t + 0.0005) * 100) % 10 == 5 else size
    for backlog in (holes(DEFAULT_QUEUE_SNAPSHOT), 20_000):  # 20 KB: within the burst, proves nothing
        res = judge(*tables(util=0.7, backlog_bytes=backlog, q_dt=0.01, q_offset=0.0005, read_s=0.0002),
                    FidelityConfig())
        assert res["fidelity_ok"] and res["fidelity_saturated_s"] == 0, res


def test_a_link_at_its_rate_is_judged_busy_without_a_queue():
    res = judge(*tables(util=0.97, backlog_bytes=0), FidelityConfig())
    assert res["fidelity_ok"] and res["fidelity_saturation_judged_s"] == pytest.approx(2.9)
    assert res["fidelity_saturated_util_min"] == pytest.approx(0.97)


def test_a_short_stall_fails_its_window_however_busy_the_rest():
    # 3 s with a deep queue, at its rate but for 0.5 s at 40% from t = 1.3 s: the second
    # window (t = 1.0-2.0 s) fails, though the run as a whole sent 0.87 of its rate.
    links, qdiscs, cpu = tables(util=0.97, backlog_bytes=1_000_000)
    links.loc[(links["t"] > 1.3) & (links["t"] <= 1.8), "tx_bytes_per_s"] = 0.4 * RATE / 8
    v = verdict(links, qdiscs, cpu, FidelityConfig())
    assert v.codes == [Reason.SATURATION] and 0.6 < v.saturated_util_min < 0.7
    ev = v.findings[0].evidence
    assert ev["from_t"] == pytest.approx(1.0) and ev["to_t"] == pytest.approx(2.0), ev


def test_no_interval_with_a_rate_change_is_judged_nor_proven_by_a_snapshot_at_the_old_rate():
    # 20 Mb/s until t = 1 s, then 40: the queue of 1 MB seen before the change (0.4 s at
    # 20 Mb/s) proves nothing after it, so the link's 50% after the change is not judged.
    links, qdiscs, cpu = tables(util=0.5, backlog_bytes=lambda t: 1_000_000 if t < 1.0 else 0)
    links.loc[links["t"] <= 1.0, "configured_bps"] = RATE / 2
    links.loc[links["t"] <= 1.0, "tx_bytes_per_s"] = 0.99 * RATE / 2 / 8
    res = judge(links, qdiscs, cpu, FidelityConfig())
    assert res["fidelity_ok"], res["fidelity_reasons"]
    assert res["fidelity_saturated_s"] == pytest.approx(0.9)  # (0.1, 1.0] at its rate; (1.0, 1.1] changed
    # A rate that changes every interval is never judged, whatever the queue.
    links["configured_bps"] = np.where(np.arange(len(links)) % 2, RATE, RATE / 2)
    links["tx_bytes_per_s"] = 0.3 * RATE / 8
    res = judge(links, qdiscs.assign(backlog_bytes=5_000_000), cpu, FidelityConfig())
    assert res["fidelity_ok"] and res["fidelity_saturated_s"] == 0


def test_cpu_and_excess_rate_fail_with_their_numbers():
    res = judge(*tables(util=1.2, backlog_bytes=0, idle=0.1), FidelityConfig())
    assert not res["fidelity_ok"]
    assert json.loads(res["fidelity_codes"]) == ["cpu_idle", "rate_excess"]
    assert "CPU idle fell to 10% (< 35%)" in res["fidelity_reasons"]
    assert "ran 20% above its configured rate" in res["fidelity_reasons"]
    cpu, rate = verdict(*tables(util=1.2, backlog_bytes=0, idle=0.1), FidelityConfig()).findings
    assert cpu.evidence == {"idle_min": pytest.approx(0.1), "threshold": 0.35, "window_s": FidelityConfig().window_s}
    assert rate.evidence["link"] == "a->s1" and rate.evidence["excess"] == pytest.approx(0.2)
