"""Priority inversion per frame (schedulers/transport/txstamps.py): the bookkeeping on a
synthetic sequence, then real transmit stamps over TCP on 127.0.0.1 against a slow reader.
Relations only, no speeds: the machine may be loaded."""
from __future__ import annotations

import math
import socket
import struct
import threading
import time

import numpy as np
import pandas as pd
import pytest

from analysis.tables import load_tx_frames
from contracts.tx_frames import summary
from emu.run.runner import collect_tx_frames, tx_summary
from schedulers.core.base import TensorSpec
from schedulers.transport.connection import HEADER, Connection, Kind, Outbox
from schedulers.transport.txstamps import FLAGS, SO_TIMESTAMPING, FrameLog, TxStamps, merge, save
from tests.factories import synthetic_profile
from tests.loopback_jobs import Servers, create

KiB = 1024
H = HEADER.size


def frame(log: FrameLog, order, ready: float, kind=Kind.PUSH, key=0, chunk=0, nbytes=1000):
    """put at `ready` (returns the frame and its identity for `pick`)."""
    return log.ready(order, now=ready), (kind, key, chunk, 0, 0, nbytes)


def pick(log: FrameLog, f, at: float) -> int:
    """picked and written at `at`; returns the offset of its last byte."""
    rec, ident = f
    log.popped(rec, *ident)
    log.writing(rec, now=at)
    return rec.end - 1


def rows(log: FrameLog) -> pd.DataFrame:
    return pd.DataFrame(log.columns()).set_index("key")


def test_inversion_on_a_synthetic_sequence():
    log = FrameLog(peer=3)
    q1 = frame(log, 5, 0.0, key=1)
    q2 = frame(log, 5, 0.0, key=2)
    end_q1, end_q2 = pick(log, q1, 0.0), pick(log, q2, 0.1)
    pull = frame(log, 7, 0.2, kind=Kind.PULL, key=90, nbytes=0)   # worse, no payload: blocks, not reported
    end_pull = pick(log, pull, 0.2)
    p = frame(log, 1, 1.0, key=3)     # urgent: behind q1, q2 and the PULL
    r = frame(log, 3, 1.2, key=4)     # less urgent than p, more than the others
    s = frame(log, 9, 1.3, key=5)     # worse than all: nothing worse ahead of it
    log.stamped(end_q1, 1.5)
    end_p, end_r, end_s = pick(log, p, 2.0), pick(log, r, 2.1), pick(log, s, 2.2)
    log.stamped(end_pull, 2.5)        # q2's own stamp was lost (merged): this one completes it too
    log.stamped(end_p - 7, 2.9)       # inside p: completes nothing
    assert log.pending == 3
    log.stamped(end_p, 3.0)
    log.stamped(end_r, 3.2)
    log.finish()                      # s never stamped
    df = rows(log)
    assert list(df.index) == [1, 2, 3, 4, 5] and (df["peer"] == 3).all()   # the PULL is not reported
    assert df.loc[1, "inversion_s"] == 0 and df.loc[2, "inversion_s"] == 0  # equal orders: no inversion
    assert math.isclose(df.loc[3, "inversion_s"], 2.5 - 1.0)  # the PULL (7) left last of those worse
    assert math.isclose(df.loc[4, "inversion_s"], 2.5 - 1.2)  # waiting behind p (better) does not count
    assert df.loc[5, "inversion_s"] == 0
    assert df.loc[2, "last_byte_t"] == 2.5 and df.loc[3, "last_byte_t"] == 3.0
    assert df.loc[3, "first_byte_t"] == 2.5 and df.loc[4, "first_byte_t"] == 3.0   # after the frame before
    assert df.loc[1, "first_byte_t"] == 0.0 and df.loc[2, "first_byte_t"] == 1.5   # q1's stamp came before
    assert math.isnan(df.loc[5, "last_byte_t"]) and log.unstamped == 1
    assert df.loc[3, "bytes"] == 1000 and df.loc[3, "ready_t"] == 1.0
    assert end_q2 == 2 * (H + 1000) - 1 and end_s == end_r + H + 1000   # offsets count headers too

    # A frame put after the worse ones left has nothing ahead; one put while they were
    # queued but stamped later still gets its wait.
    log2 = FrameLog()
    a = frame(log2, 5, 0.0, key=1)
    end_a = pick(log2, a, 0.0)
    b = frame(log2, 1, 0.5, key=2)        # put while a is queued...
    log2.stamped(end_a, 0.7)              # ...a's stamp read only now
    c = frame(log2, 1, 0.8, key=3)        # put after a left
    end_c = pick(log2, b, 0.9) and pick(log2, c, 0.9)
    log2.stamped(end_c, 1.0)
    df2 = rows(log2)
    assert math.isclose(df2.loc[2, "inversion_s"], 0.2) and df2.loc[3, "inversion_s"] == 0

    figs = summary(np.array([0.0, 0.0, 1.5, 1.3, np.nan]))
    assert figs["data_frames"] == 5 and figs["inversion_frames"] == 2 and figs["inversion_unknown"] == 1
    assert figs["inversion_max_s"] == 1.5 and figs["inversion_p50_s"] == 0.65


def test_offsets_wrap_at_four_gib():
    log = FrameLog()
    log.skip(2**32 - 2000)                # the kernel's offsets are 32-bit
    a, b = frame(log, 5, 0.0, key=1), frame(log, 5, 0.0, key=2)
    end_a, end_b = pick(log, a, 0.0), pick(log, b, 0.0)
    assert end_a < 2**32 <= end_b
    log.stamped(end_a & 0xFFFFFFFF, 1.0)
    assert log.pending == 1
    log.stamped(end_b & 0xFFFFFFFF, 2.0)
    assert log.pending == 0 and list(rows(log)["last_byte_t"]) == [1.0, 2.0]


def stalled_pair(first_bytes: int):
    """(sender Connection, reader): the reader takes `first_bytes`, then stops reading (its
    small buffer fills, so the sender's bytes wait unsent in the sender's kernel) until
    `reader.go` is set, then reads the rest slowly (8 KiB per millisecond at most)."""
    lsock = socket.create_server(("127.0.0.1", 0))
    lsock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 32 * KiB)
    sender = Connection(socket.create_connection(lsock.getsockname()), "reader", notsent_lowat=32 * KiB)
    sock, _ = lsock.accept()
    lsock.close()
    reader = threading.Thread(target=_read, args=(sock, first_bytes), daemon=True)
    reader.stalled, reader.go = threading.Event(), threading.Event()
    reader.start()
    return sender, reader


def _read(sock: socket.socket, first_bytes: int) -> None:
    me, buf, got = threading.current_thread(), bytearray(8 * KiB), 0
    while got < first_bytes:
        got += sock.recv_into(buf, min(len(buf), first_bytes - got))
    me.stalled.set()
    me.go.wait(30)
    while sock.recv_into(buf):
        time.sleep(0.001)
    sock.close()


def notsent_bytes(conn: Connection) -> int:
    return struct.unpack_from("=I", conn.sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 232), 144)[0]


def test_urgent_frame_behind_a_bulk_stream_waits_for_the_bytes_ahead():
    """Low-priority frames fill the kernel's queue towards a reader that stalls; an urgent
    frame put then goes next, but waits for the bulk bytes already handed to the kernel.
    Timing-free: the urgent frame is put only once the kernel holds unsent bulk bytes."""
    sender, reader = stalled_pair(64 * KiB)
    stamps = TxStamps(sender.sock, peer=0)
    ob = Outbox(sender, lambda e: None, stamps=stamps)
    bulk = np.zeros(4 * KiB, np.float32)   # 16 KiB
    ob.put_many([((1, c), Kind.PUSH, 1, c, 0, bulk, 1, None) for c in range(60)])   # ~1 MB
    assert reader.stalled.wait(30)
    deadline = time.monotonic() + 30
    for _ in range(2):   # twice, 20 ms apart: the reader's window is closed, not just late
        while not notsent_bytes(sender):
            assert time.monotonic() < deadline, "the kernel never held unsent bytes"
            time.sleep(0.001)
        time.sleep(0.02)
    ob.put((0, 0), Kind.PUSH, 0, 0, 0, np.zeros(1024, np.float32), priority=0)
    reader.go.set()
    ob.close()
    sender.close()
    df = pd.DataFrame(stamps.columns())    # rows in the order the frames were written
    assert len(df) == 61 and stamps.unstamped == 0 and stamps.stamps > 0
    u = int(np.flatnonzero(df["key"] == 0)[0])
    urgent, ahead, behind = df.iloc[u], df.iloc[:u], df.iloc[u + 1:]
    assert len(ahead) and len(behind)      # it overtook the bulk frames not picked yet
    assert urgent["inversion_s"] > 0
    # it waited until the last bulk byte ahead of it left: no longer than until its own
    # first byte could go
    assert math.isclose(urgent["ready_t"] + urgent["inversion_s"], ahead["last_byte_t"].max(), abs_tol=1e-6)
    assert urgent["inversion_s"] <= urgent["first_byte_t"] - urgent["ready_t"] + 1e-6
    assert urgent["first_byte_t"] <= urgent["last_byte_t"]
    assert (df.drop(index=u)["inversion_s"] == 0).all()   # one priority: nothing worse ahead
    assert (np.diff(df["last_byte_t"].to_numpy()) >= 0).all()   # bytes leave in order


def test_stamps_only_when_traced(tmp_path):
    """A PS worker and server always ask the kernel for stamps (their outboxes bound the
    host's queue with them) but keep rows only when traced. trace: true gets
    one row per PUSH, saved and collected as the run's tx_frames table with its row figures."""
    for trace in (False, True):
        servers = Servers(1, 1, trace=trace)
        sched = create("mercury", 0, 1, servers.endpoints, {"packet_bytes": 4 * KiB}, trace=trace)
        sched.start([TensorSpec(0, "a", 4096, 1), TensorSpec(1, "b", 1024, 0)])
        for it in range(2):
            sched.push(0, np.ones(4096, np.float32), it)
            sched.push(1, np.ones(1024, np.float32), it)
            sched.wait(0, it), sched.wait(1, it)
        flags = sched.conns[0].sock.getsockopt(socket.SOL_SOCKET, SO_TIMESTAMPING)
        sched.close()
        servers.join()
        assert flags == FLAGS and sched.peers[0].stamps is not None and bool(sched.stamps) is trace
        assert sched.peers[0].host_queue_s is not None
        assert bool(servers.ps[0].stamps) is trace
        if not trace:
            assert sched.tables() == {} and "tx" not in sched.info()
            continue
        cols = sched.tables()["tx_frames"]
        assert len(cols["key"]) == 2 * (4 + 1) and not np.isnan(cols["last_byte_t"]).any()
        assert sched.info()["tx"]["data_frames"] == 10
        assert (cols["first_byte_t"] >= cols["ready_t"]).all() and (cols["inversion_s"] >= 0).all()
        server_cols = merge(servers.ps[0].stamps)   # RESULTs
        assert len(server_cols["key"]) == 10
        save(tmp_path / "worker0.tx_frames.npz", cols)
        save(tmp_path / "server0.tx_frames.npz", server_cols)
        tx = collect_tx_frames(tmp_path)
        assert list(tx.columns[:3]) == ["role", "rank", "peer"] and len(tx) == 20
        row = tx_summary(tx)
        assert row["data_frames"] == 10 and row["server_data_frames"] == 10
        assert 0 <= row["inversion_p50_s"] <= row["inversion_p99_s"] <= row["inversion_max_s"]


@pytest.mark.slow
def test_traced_job_writes_the_table_and_the_row_figures(tmp_path):
    """Role processes (workloads/local.py): each worker and the server writes its
    `<role><rank>.tx_frames.npz`; the runner's `_collect` makes them one table."""
    from emu.run.runner import _collect
    from schedulers.registry import SCHEDULERS
    from workloads import profile_file
    from workloads.local import run_job

    profile = synthetic_profile([(0.002, [(20_000, 0.002)]), (0.002, [(30_000, 0.002), (500, 0.001)])])
    path = tmp_path / "profile.json"
    profile_file.save(profile, path)
    wl = {"model": profile.model, "preset": profile.preset, "compute": "replay", "profile": str(path),
          "batch_size": profile.batch_size, "iterations": 3}
    out = tmp_path / "job"
    recs = run_job(wl, out, workers=2, scheduler="mercury", params={"packet_bytes": 16 * KiB}, timeout_s=120,
                   trace=True)
    assert SCHEDULERS["mercury"].Params.requires_servers
    for spec in out.glob("*.spec.json"):   # the loopback runner keeps the specs beside the records
        spec.unlink()
    _, summaries, tables = _collect(out, 2)
    tx = tables["tx_frames"]
    packets = 3 * sum(-(-4 * n // (16 * KiB)) for n in (20_000, 30_000, 500))   # per worker
    # each worker pushes every packet; the server returns each average to both
    assert tx.groupby(["role", "rank"]).size().to_dict() == {("server", 0): 2 * packets, ("worker", 0): packets,
                                                             ("worker", 1): packets}
    assert not tx["last_byte_t"].isna().any()
    row = tx_summary(tx)
    assert row["data_frames"] == 2 * packets and row["server_data_frames"] == 2 * packets
    assert recs[0]["summary"]["scheduler_info"]["tx"]["data_frames"] == packets
    (tmp_path / "run").mkdir()
    tx.assign(run_id="run").to_parquet(tmp_path / "run" / "tx_frames.parquet")
    assert len(load_tx_frames(tmp_path, "run", "server")) == 2 * packets
    assert load_tx_frames(tmp_path, "other") is None


def test_host_bytes_follow_the_stamps():
    """The bytes written that have not left the host: every frame picked adds its bytes, a
    stamp removes every frame it completes (a lost stamp's frame goes with the next one)."""
    log = FrameLog(record=False)
    a, b, c = (frame(log, 1, 0.0, key=k, nbytes=1000) for k in range(3))
    end_a, _, end_c = pick(log, a, 0.0), pick(log, b, 0.0), pick(log, c, 0.0)
    assert log.host_bytes() == 3 * (H + 1000)
    log.stamped(end_a, 0.1)
    assert log.host_bytes() == 2 * (H + 1000)
    log.stamped(end_c, 0.2)   # b's stamp was lost: c's completes it too
    assert log.host_bytes() == 0 and log.pending == 0
    assert len(log.columns()["key"]) == 0   # record=False keeps no rows


def test_wait_host_below_returns_once_the_bytes_are_out_or_gives_up():
    """A reader that keeps up: the bytes leave (to `lo`) and the wait ends with nothing in
    the host. A reader whose window is closed: the bytes stay, and the wait gives up at its
    timeout (False) instead of holding the outbox."""
    sender, reader = stalled_pair(16 * KiB + H)   # takes the first frame, then stalls
    stamps = TxStamps(sender.sock, peer=0, record=False)
    data = np.zeros(4 * KiB, np.float32)
    f = stamps.ready((1,))
    stamps.popped(f, Kind.PUSH, 1, 0, 0, 1, data.nbytes)
    sender.send(Kind.PUSH, 1, 0, 0, data)
    assert stamps.wait_host_below(0, 30) and stamps.host_bytes() == 0
    assert reader.stalled.wait(30)
    deadline = time.monotonic() + 30
    while not notsent_bytes(sender):   # fill until the kernel holds unsent bytes
        f = stamps.ready((1,))
        stamps.popped(f, Kind.PUSH, 1, 0, 0, 1, data.nbytes)
        sender.send(Kind.PUSH, 1, 0, 0, data)
        assert time.monotonic() < deadline, "the kernel never held unsent bytes"
        time.sleep(0.005)
    assert not stamps.wait_host_below(0, 0.05) and stamps.host_bytes() > 0
    reader.go.set()
    assert stamps.wait_host_below(0, 30) and stamps.host_bytes() == 0
    sender.close()
