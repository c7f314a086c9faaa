"""The progress watchdog on loopback: the role side's report counts the bytes of real TCP
connections on 127.0.0.1 (schedulers/core/progress.py), and the runner's loop over a real job
survives a short pause and names a stopped worker. The decisions on hand-made reports are in
tests/unit/test_watchdog.py."""
from __future__ import annotations

import os
import signal
import socket
import time

import pytest

from contracts import progress as contract
from emu.run.watchdog import proc_state
from schedulers.core.progress import ProgressReporter, tcp_connections


def test_reporter_counts_the_bytes_of_each_real_connection(tmp_path):
    lsock = socket.create_server(("127.0.0.1", 0))
    a = socket.create_connection(lsock.getsockname())
    b, _ = lsock.accept()
    try:
        a.sendall(b"x" * 300_000)
        got = 0
        while got < 300_000:
            got += len(b.recv(1 << 16))
        b.sendall(b"y" * 1000)
        a.recv(1000)
        time.sleep(0.05)   # the last ACKs
        rep = ProgressReporter(tmp_path, "worker0")
        rep.iteration(1, 0.5)
        for i in range(2, 6):
            rep.iteration(i, 0.1 * i)
        rep.write()
        back = contract.read(contract.path(tmp_path, "worker0"))
        assert back is not None and back.phase == "training" and back.iterations == 5
        assert back.iteration_median_s == pytest.approx(0.35)       # the first iteration left out
        mine = {c.local: c for c in back.conns}
        ca, cb = mine[f"127.0.0.1:{a.getsockname()[1]}"], mine[f"127.0.0.1:{b.getsockname()[1]}"]
        assert ca.peer == f"127.0.0.1:{b.getsockname()[1]}" and ca.state == 1
        # the kernel counts the connecting side's SYN as one acknowledged byte
        assert ca.sent_bytes in (300_000, 300_001) and ca.received_bytes == 1000
        assert cb.sent_bytes in (1000, 1001) and cb.received_bytes == 300_000
        assert not any(c.local == f"127.0.0.1:{lsock.getsockname()[1]}" and c.peer.endswith(":0")
                       for c in back.conns)                            # the listening socket is no connection
        assert a.gettimeout() is None and b.gettimeout() is None       # reading them changed nothing
    finally:
        for s in (a, b, lsock):
            s.close()
    assert all(c.local != ca.local for c in tcp_connections())        # closed: gone from the next report


@pytest.mark.slow
def test_runner_survives_a_short_pause_and_names_a_stopped_worker_of_a_real_job(tmp_path):
    """A real job on loopback (a server and two replay workers, as the orchestrator launches
    them): a pause shorter than the window is survived and seen as a gap; a stop that lasts
    is named, with the worker's state, within the window."""
    import threading

    from emu.run.runner import RunFailed, _evidence, _wait_for_roles, _watchdog
    from tests.loopback_roles import iterations, launched, replay_job

    exp = replay_job(watchdog={"stall_s": 3})
    marks: dict[str, float] = {}
    with launched(tmp_path, exp) as (bed, roles, rec, logs):
        def after(n):
            deadline = time.monotonic() + 60
            while iterations(rec) < n and time.monotonic() < deadline:
                time.sleep(0.05)

        def drive():
            after(30)
            pid = bed.roles["worker0"].pid
            marks["pause"] = time.monotonic()
            os.killpg(pid, signal.SIGSTOP)
            time.sleep(1.5)
            os.killpg(pid, signal.SIGCONT)
            marks["resume"] = time.monotonic()
            after(iterations(rec) + 30)
            marks["stop"] = time.monotonic()
            os.killpg(pid, signal.SIGSTOP)

        wd = _watchdog(exp, roles, {"ps": "127.0.0.1"}, rec, time.monotonic())
        threading.Thread(target=drive, daemon=True).start()
        with pytest.raises(RunFailed) as failed:
            _wait_for_roles(bed, roles, exp, logs, rec, lambda n: None, watchdog=wd,
                            evidence=lambda st: _evidence(bed, st))
        named_at = time.monotonic()
    text = str(failed.value)
    assert "stop" in marks, text                                  # the pause was survived
    assert 3 <= named_at - marks["stop"] <= 3 + 2.5, (named_at - marks["stop"], text)
    assert text.startswith("stalled: worker0 on w0 made no progress for "), text
    assert "(stall window 3 s, set by watchdog.stall_s)" in text and "is stopped (SIGSTOP)" in text
    assert "others waiting: " in text and "worker1 on w1 (at " in text
    assert 1.0 <= wd.longest_gap(marks["pause"], marks["resume"], named_at) <= 3.0
    assert all(proc_state(p.pid) is None for p in bed.roles.values())
