"""The incast meter (schedulers/ps/share.py): when it turns pacing on, the share it gives each
worker, how a drop while paced lowers it, and the socket calls it relies on."""
from __future__ import annotations

import socket

import pytest

from schedulers.ps import share
from schedulers.ps.fifo import FIFOParams
from schedulers.ps.mercury import MercuryParams
from schedulers.transport import connection

DT = share.METER_S * 1.5   # a window comfortably over METER_S


def windows(meter: share.InboundMeter, rates_and_drops) -> list:
    """One window per (bytes/s, packets dropped before the server in it, or None where the
    kernel does not count them); the shares the meter sends, one per window."""
    sent, t, ooo = [], 0.0, 0
    meter.tick(t, ooo)
    for rate, drops in rates_and_drops:
        meter.received(int(rate * DT))
        t += DT
        ooo = None if drops is None else ooo + drops
        sent.append(meter.tick(t, ooo))
    return sent


def test_no_share_until_a_drop_then_the_largest_rate_over_the_workers():
    sent = windows(share.InboundMeter(8), [(30e6, 0), (50e6, 0), (40e6, 0), (45e6, 3)])
    assert sent[:3] == [None, None, None]                       # no drop: nothing paced, whatever the rate
    assert sent[3] == pytest.approx(50e6 / 8, rel=1e-3)          # the largest window's rate, not the last's


def test_a_drop_while_paced_lowers_the_share():
    sent = windows(share.InboundMeter(4), [(40e6, 1), (38e6, 0), (38e6, 2)])
    assert sent[0] == pytest.approx(10e6, rel=1e-3)
    assert sent[1] is None                                       # paced, no drop: as it was
    assert sent[2] == pytest.approx(10e6 * share.DECREASE, rel=1e-3)


def test_a_share_that_barely_moves_is_not_sent_again():
    sent = windows(share.InboundMeter(4), [(40e6, 1), (40.4e6, 0)])
    assert sent == [pytest.approx(10e6, rel=1e-3), None]         # 1% more: under MIN_CHANGE


def test_without_the_kernel_counter_nothing_is_paced():
    assert windows(share.InboundMeter(2), [(50e6, None), (60e6, None)]) == [None, None]


def test_a_window_shorter_than_meter_s_waits():
    meter = share.InboundMeter(2)
    meter.tick(0.0, 0)
    meter.received(1000)
    assert meter.tick(share.METER_S / 2, 5) is None
    assert not meter.due(share.METER_S / 2) and meter.due(share.METER_S)


def test_the_socket_calls_on_a_real_connection():
    with socket.create_server(("127.0.0.1", 0)) as srv:
        a = socket.create_connection(srv.getsockname())
        b, _ = srv.accept()
        try:
            connection.pace(a, 1_000_000)
            assert a.getsockopt(socket.SOL_SOCKET, connection.SO_MAX_PACING_RATE) == 1_000_000
            assert share.out_of_order(b) in (0, None)   # nothing lost on loopback
        finally:
            a.close()
            b.close()


def test_only_mercury_paces_by_default_and_the_default_stays_out_of_run_ids():
    assert MercuryParams().pace_to_share and not FIFOParams().pace_to_share
    assert "pace_to_share" not in MercuryParams().model_dump() and "pace_to_share" not in FIFOParams().model_dump()
    assert MercuryParams(pace_to_share=False).model_dump()["pace_to_share"] is False
    assert FIFOParams(pace_to_share=True).model_dump()["pace_to_share"] is True
