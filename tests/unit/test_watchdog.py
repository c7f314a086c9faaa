"""The progress watchdog's decisions on hand-made reports and clocks (emu/run/watchdog.py), and
the role side's report of a real stopped process (schedulers/core/progress.py); on real sockets:
tests/loopback/test_watchdog_loopback.py."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from contracts import progress as contract
from contracts.progress import ConnProgress, RoleProgress
from emu.config.watchdog import MAX_S, MIN_S, WatchdogConfig
from emu.run.watchdog import Evidence, Peers, Watchdog, culprit, derive_window, proc_state, reason
from schedulers.core.progress import ProgressReporter
from tests.conftest import REPO

PEERS = Peers(host_of={"server0": "ps", "worker0": "w0", "worker1": "w1"},
              listen={"10.0.0.1:29500": "server0", "10.0.0.2:29600": "worker0", "10.0.0.3:29601": "worker1"},
              ip_host={"10.0.0.1": "ps", "10.0.0.2": "w0", "10.0.0.3": "w1"})
ROLES = ["server0", "worker0", "worker1"]


def conn(local, peer, sent=0, received=0, idle_recv=0.0, backoff=0, unacked=0):
    return ConnProgress(local=local, peer=peer, state=1, sent_bytes=sent, received_bytes=received,
                        idle_recv_s=idle_recv, backoff=backoff, unacked=unacked)


def worker(rank, it, t, median=0.2, phase="training", sent=None, idle_recv=0.0, backoff=0):
    b = it * 1000 if sent is None else sent
    ip = f"10.0.0.{rank + 2}"
    return RoleProgress(role=f"worker{rank}", pid=100 + rank, t=t, phase=phase, iterations=it,
                        iteration_median_s=median,
                        conns=[conn(f"{ip}:40000", "10.0.0.1:29500", b, b, idle_recv, backoff, 3 if backoff else 0)])


def server(t, received, idle_recv=(0.0, 0.0)):
    return RoleProgress(role="server0", pid=99, t=t, phase="serving",
                        conns=[conn("10.0.0.1:29500", "10.0.0.2:40000", received, received, idle_recv[0]),
                               conn("10.0.0.1:29500", "10.0.0.3:40000", received, received, idle_recv[1])])


# ---------------------------------------------------------------- the window

def test_window_is_derived_from_the_median_iteration_and_clamped():
    cfg = WatchdogConfig()
    assert derive_window(cfg, [0.05], False).seconds == MIN_S          # 0.5 s -> at least 10 s
    assert derive_window(cfg, [1.5, 0.9], False).seconds == 15          # the slowest worker's median
    assert derive_window(cfg, [7.0], False).seconds == MAX_S            # at most 25 s
    w = derive_window(cfg, [0.3], False)
    assert "10 x median iteration 0.3 s" in w.describe() and not w.startup


def test_window_is_the_startup_allowance_until_iterations_are_timed():
    cfg = WatchdogConfig(startup_s=90)
    assert derive_window(cfg, [], False).seconds == 90
    assert derive_window(cfg, [None, None], False).startup
    assert derive_window(cfg, [0.2], True).seconds == 90       # a worker still starting or finishing
    assert derive_window(WatchdogConfig(stall_s=4), [0.2], False).seconds == 4
    assert derive_window(WatchdogConfig(stall_s=4), [0.2], True).seconds == STARTUP_DEFAULT


STARTUP_DEFAULT = WatchdogConfig().startup_s


# ---------------------------------------------------------------- stalls

def run_until(wd, reports_at, t_end, step=0.5, live=ROLES):
    """Feed wd the reports of each time step; return the first stall and its time."""
    t = 0.0
    while t <= t_end:
        wd.observe(t, reports_at(t))
        stall = wd.check(t, live)
        if stall is not None:
            return stall
        t += step
    return None


def test_a_stopped_worker_is_found_after_the_window_and_not_before():
    """worker0 stops at t = 20 (its report freezes); worker1 and the server wait on it."""
    wd = Watchdog(None, PEERS, 200, now=0.0)

    def reports(t):
        frozen = min(t, 20.0)
        it = int(frozen / 0.2)
        return {"worker0": worker(0, it, 1000 + frozen), "worker1": worker(1, it + 1, 1000 + t, sent=it * 1000),
                "server0": server(1000 + t, it * 1000)}

    stall = run_until(wd, reports, 60)
    assert stall is not None
    assert 30.0 <= stall.at <= 31.0                   # 20 s + the derived 10 s window
    assert set(stall.candidates) == set(ROLES)        # everyone is flat by then
    ev = Evidence(wall_now=1000 + stall.at, proc_state={"worker0": "T", "worker1": "S", "server0": "S"})
    assert culprit(stall, ev, PEERS) == "worker0"


def test_a_job_that_trains_is_not_stalled_by_an_idle_role():
    """A server with nothing to do (no keys) makes no progress, but the workers do."""
    wd = Watchdog(None, PEERS, 10_000, now=0.0)

    def reports(t):
        it = int(t / 0.2) + 5
        return {"worker0": worker(0, it, t), "worker1": worker(1, it, t), "server0": server(0.0, 0)}

    assert run_until(wd, reports, 120) is None


def test_startup_has_its_own_allowance():
    """No report at all for a while is start-up; only the allowance ends it."""
    wd = Watchdog(WatchdogConfig(startup_s=60), PEERS, 200, now=0.0)
    stall = run_until(wd, lambda t: {}, 100)
    assert stall is not None and 60 <= stall.at <= 61 and stall.window.startup
    role, text = reason(stall, Evidence(wall_now=stall.at), PEERS, 200)
    assert role == "worker0"        # workers before servers when nothing else tells them apart
    assert "start-up allowance" in text and "it never reported progress" in text


def test_the_final_evaluation_is_not_a_stall():
    """A worker out of its loop (phase finishing) moves no bytes; the window is the allowance then."""
    wd = Watchdog(None, PEERS, 50, now=0.0)

    def reports(t):
        if t < 10:
            it = int(t / 0.2)
            return {"worker0": worker(0, it, t), "worker1": worker(1, it, t), "server0": server(t, it)}
        return {"worker0": worker(0, 50, t, phase="finishing"), "worker1": worker(1, 50, t, phase="finishing"),
                "server0": server(t, 50)}

    assert run_until(wd, reports, 100) is None


def test_the_window_in_force_and_the_longest_gap_are_summarised():
    wd = Watchdog(None, PEERS, 10_000, now=0.0)

    def reports(t):
        frozen = t if not 20 <= t < 24 else 20.0        # a 4 s pause of everyone
        it = int(frozen / 0.2)
        return {"worker0": worker(0, it, t), "worker1": worker(1, it, t), "server0": server(t, it)}

    assert run_until(wd, reports, 40) is None
    s = wd.summary(40.0)
    assert s["stall_window_s"] == MIN_S and 3.5 <= s["stall_max_s"] <= 4.5
    assert 3.5 <= wd.longest_gap(21, 22, 40.0) <= 4.5 and wd.longest_gap(30, 35, 40.0) == 0


# ---------------------------------------------------------------- the reason

def stall_of_worker0():
    wd = Watchdog(None, PEERS, 200, now=0.0)

    def reports(t):
        frozen = min(t, 20.0)
        it = int(frozen / 0.2)
        return {"worker0": worker(0, it, 1000 + frozen),
                "worker1": worker(1, it + 1, 1000 + t, sent=it * 1000, idle_recv=t - frozen),
                "server0": server(1000 + t, it * 1000, idle_recv=(t - frozen, 0.1))}

    return run_until(wd, reports, 60)


def test_reason_names_the_stalled_role_its_host_progress_and_what_others_wait_on():
    stall = stall_of_worker0()
    ev = Evidence(wall_now=1000 + stall.at, proc_state={"worker0": "T", "worker1": "S", "server0": "S"})
    role, text = reason(stall, ev, PEERS, 200)
    assert role == "worker0"
    assert text.startswith("stalled: worker0 on w0 made no progress for 1"), text
    assert "(stall window 10 s, 10 x median iteration 0.2 s, within 10..25 s)" in text
    assert "is stopped (SIGSTOP)" in text
    assert "last progress: iteration 100/200, 0.1 MB sent" in text
    assert "worker1 on w1 (at 101/200) on server0: nothing received for 1" in text
    assert "server0 on ps on worker0: nothing received for 1" in text


def test_reason_without_process_state_still_finds_the_role_that_stopped_reporting():
    stall = stall_of_worker0()
    role, text = reason(stall, Evidence(wall_now=1000 + stall.at), PEERS, 200)
    assert role == "worker0" and "has not reported for" in text


def test_reason_leads_with_a_down_link_and_a_fault_and_shows_retransmissions():
    wd = Watchdog(None, PEERS, 200, now=0.0)

    def reports(t):
        frozen = min(t, 20.0)
        it = int(frozen / 0.2)
        cut = t > 20
        return {"worker0": worker(0, it, 1000 + t, idle_recv=t - frozen),
                "worker1": worker(1, it, 1000 + t, backoff=5 if cut else 0, idle_recv=t - frozen),
                "server0": server(1000 + t, it * 1000, idle_recv=(0.2, t - frozen))}

    stall = run_until(wd, reports, 60)
    ev = Evidence(wall_now=1000 + stall.at, down_links=["w1-s1"],
                  faults=["faults[0] (link_down w1-s1 at 20 s for 60 s)"])
    role, text = reason(stall, ev, PEERS, 200)
    assert role == "worker1"        # its host is on the link that is down
    assert text.startswith("stalled: link w1-s1 is down; fault faults[0] (link_down w1-s1 at 20 s for 60 s) "
                           "in force; worker1 on w1 made no progress for "), text
    assert "retransmitting to server0 (3 segment(s) unacknowledged, backoff 5)" in text
    # without the link's state, its retransmissions single it out
    assert reason(stall, Evidence(wall_now=1000 + stall.at), PEERS, 200)[0] == "worker1"


def test_peers_are_named_by_listening_address_else_by_host():
    assert PEERS.name("10.0.0.1:29500") == "server0"
    assert PEERS.name("10.0.0.2:51234", me="server0") == "worker0"
    shared = Peers(host_of={"server0": "ps", "worker0": "ps", "worker1": "w1"}, ip_host={"10.0.0.1": "ps"})
    assert shared.name("10.0.0.1:51234", me="worker1") == "a role on ps"
    assert shared.name("10.0.0.1:51234", me="server0") == "worker0"
    assert PEERS.name("192.168.9.9:80") == "192.168.9.9:80"


# ---------------------------------------------------------------- the role side, for real


@pytest.mark.slow
def test_a_stopped_role_stops_reporting_and_shows_as_stopped(tmp_path, procs):
    code = ("import sys, time\nfrom schedulers.core.progress import ProgressReporter\n"
            "r = ProgressReporter(sys.argv[1], 'worker0', interval_s=0.1).start()\n"
            "print('up', flush=True)\ntime.sleep(60)\n")
    p = procs.start([sys.executable, "-c", code, str(tmp_path)], cwd=REPO, stdout=subprocess.PIPE,
                    env={**os.environ, "PYTHONPATH": str(REPO)})
    path = contract.path(tmp_path, "worker0")
    assert p.stdout.readline().strip() == b"up"
    time.sleep(0.3)
    os.kill(p.pid, signal.SIGSTOP)
    deadline = time.monotonic() + 5
    while proc_state(p.pid) != "T" and time.monotonic() < deadline:
        time.sleep(0.01)
    assert proc_state(p.pid) == "T"
    time.sleep(0.15)   # a write in flight when it stopped is done
    seq = json.loads(path.read_text())["seq"]
    time.sleep(0.5)
    assert json.loads(path.read_text())["seq"] == seq        # frozen while stopped
    os.kill(p.pid, signal.SIGCONT)
    time.sleep(0.5)
    assert json.loads(path.read_text())["seq"] > seq
    assert proc_state(p.pid) in ("S", "R")
    p.kill()
    p.wait()
    assert proc_state(p.pid) is None


# ---------------------------------------------------------------- the runner's loop, real roles


def test_collecting_records_skips_the_progress_reports(tmp_path):
    """records/ holds <role>.progress.json beside the roles' records; they are no records."""
    from emu.run.runner import _collect

    it = {"rank": 0, "iteration": 0, "start": 1.0, "end": 2.0, "compute_s": 0.5, "wait_s": 0.5, "loss": 1.0,
          "accuracy": 0.5, "samples_per_s": 10.0}
    (tmp_path / "worker0.json").write_text(json.dumps({"iterations": [it], "summary": {"checksum": "x"},
                                                       "events": [], "layers": []}))
    (tmp_path / "server0.json").write_text(json.dumps({"events": [["recv", 1, 0, 0, 1.5]]}))
    for role in ("worker0", "server0"):
        ProgressReporter(tmp_path, role).write()
    iters, summaries, tables = _collect(tmp_path, 1)
    assert len(iters) == 1 and summaries == [{"checksum": "x"}]
    assert tables["events"][["role", "rank"]].values.tolist() == [["server", 0]]
