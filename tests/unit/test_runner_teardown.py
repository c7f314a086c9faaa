"""runner._execute's helpers stop in reverse order of starting, however far the start got,
and in the order they always stopped in once all are running (faults first, then the
shaper before the cross traffic, the monitor last).

The testbed and the monitor and cross-traffic threads are stand-ins that log what is done
to them (the real ones need root and Mininet: tests/mininet/test_e2e_mininet.py); the
shaper and the faults are the real ones, with nothing scheduled, their stops logged.
"""
from __future__ import annotations

import os

import pandas as pd
import pytest

from emu.run import runner
from tests.loopback_roles import replay_job


class Bed:
    """The part of Testbed that _execute calls; `fail` names a role whose launch fails."""

    def __init__(self, log: list[str], fail: str | None = None):
        self.log, self.fail, self.roles = log, fail, {}

    def launch(self, host, name, argv, log_dir, **kw):
        self.log.append(f"launch {name}")
        if name == self.fail:
            raise RuntimeError(f"cannot launch {name}")

    def ip(self, host):
        return "127.0.0.1"

    def pid(self, host):
        return os.getpid()   # a process in this namespace: its TCP counters are real ones

    def counter(self, a, b):
        return lambda: 0

    def egress(self, a, b):
        return None

    def prepare_rate(self, link): ...
    def set_rate(self, link, bps): ...
    def set_link(self, link, up): ...
    def set_cpu(self, host, share): ...
    def signal_role(self, role, sig): return True


@pytest.fixture
def log(monkeypatch) -> list[str]:
    out: list[str] = []

    class Monitor:
        t0_wall = 1234.5

        def __init__(self, **kw): ...

        def start(self):
            out.append("monitor start")
            return self

        def stop(self):
            out.append("monitor stop")
            return (pd.DataFrame(columns=["link", "t", "tx_bytes_per_s", "configured_bps"]),
                    pd.DataFrame(columns=["link", "t", "read_s", "backlog_bytes", "drops"]),
                    pd.DataFrame(columns=["t", "cpu_idle", "harness_cpu"]))

    class CrossTraffic:
        error = None

        def __init__(self, *a, **kw): ...

        def start(self):
            out.append("cross start")
            if "no iperf3" in out:
                raise RuntimeError("iperf3: not found")
            return self

        def stop(self):
            out.append("cross stop")

        def summary(self):
            return []

    def logged(cls, what):
        class Logged(cls):
            def stop(self):
                out.append(what)
                super().stop()
        return Logged

    monkeypatch.setattr(runner, "Monitor", Monitor)
    monkeypatch.setattr(runner, "CrossTraffic", CrossTraffic)
    monkeypatch.setattr(runner, "Shaper", logged(runner.Shaper, "shaper stop"))
    monkeypatch.setattr(runner, "Faults", logged(runner.Faults, "faults stop"))
    return out


def stops(log: list[str]) -> list[str]:
    """Each helper's first stop, in order (the shaper is stopped twice, the second a no-op)."""
    return list(dict.fromkeys(x for x in log if x.endswith(" stop")))


def execute(tmp_path, bed, exp=None):
    for d in ("logs", "records", "roles"):
        (tmp_path / d).mkdir(exist_ok=True)
    tables: dict = {}
    row: dict = {"monitor_backend": "tc"}
    try:
        return runner._execute(bed, exp or replay_job(), tmp_path, tables, row, lambda n: None), tables, row
    except Exception as e:  # noqa: BLE001 - the test inspects it with what was left behind
        return e, tables, row


def test_a_helper_that_fails_to_start_stops_those_started_before(tmp_path, log):
    log.append("no iperf3")
    err, tables, row = execute(tmp_path, Bed(log))
    assert str(err) == "iperf3: not found"
    assert log[1:] == ["monitor start", "cross start", "shaper stop", "monitor stop"]   # before: none stopped
    assert list(tables) == ["links", "qdiscs", "cpu", "shaping"] and "cross_traffic" not in row


def test_a_failed_launch_stops_everything_faults_first(tmp_path, log):
    exp = replay_job(faults=[{"at_s": 30, "kind": "stop", "target": "worker0", "for_s": 1}])
    err, tables, row = execute(tmp_path, Bed(log, fail="worker0"), exp)
    assert str(err) == "cannot launch worker0"
    assert log[:4] == ["monitor start", "cross start", "launch server0", "launch worker0"]
    assert stops(log) == ["faults stop", "shaper stop", "cross stop", "monitor stop"]
    assert list(tables) == ["tcp", "faults", "links", "qdiscs", "cpu", "shaping"]   # TCP read at the roles' end
    assert tables["faults"]["actual_start_s"].isna().all()           # never began: nothing to undo
    assert row["cross_traffic"] == "" and "stall_max_s" not in row    # no watchdog yet


def test_a_run_that_ends_stops_everything_in_the_same_order(tmp_path, log):
    t0_wall, tables, row = execute(tmp_path, Bed(log))
    assert t0_wall == 1234.5
    assert stops(log) == ["faults stop", "shaper stop", "cross stop", "monitor stop"]
    assert list(tables) == ["tcp", "links", "qdiscs", "cpu", "shaping"]
    tcp = tables["tcp"]   # every host of the network, what its namespace's TCP counted meanwhile
    assert sorted(tcp["host"]) == sorted(replay_job().net.hosts) and (tcp.drop(columns="host") >= 0).all().all()
    assert row["tcp_retrans_segs"] >= 0 and row["tcp_out_segs"] >= 0
    assert list(row)[-4:] == ["stall_window_s", "stall_window_basis", "stall_max_s", "cross_traffic"]
    assert "roles_t0_wall" in row and "failed_at_s" not in row
