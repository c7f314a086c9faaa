"""Cross-traffic bookkeeping without a network: what a flow's iperf3 JSON says it achieved,
and that stopping interrupts the clients still running (so they write that JSON)."""
from __future__ import annotations

import json
import subprocess
import sys

from emu.config.crosstraffic import Flow
from emu.testbed.crosstraffic import CrossTraffic


def _cross(tmp_path, flows, launch=None):
    return CrossTraffic(flows, 10, lambda h: "10.0.0.1", launch or (lambda *a: None), tmp_path)


def test_rate_is_what_was_received_else_what_was_sent(tmp_path):
    flows = [Flow(src="a", dst="b"), Flow(src="a", dst="c", protocol="udp", rate_mbps=50), Flow(src="a", dst="d")]
    ends = [{"sum_received": {"bits_per_second": 40e6}, "sum_sent": {"bits_per_second": 45e6}},
            {"sum_received": {"bits_per_second": 0}, "sum_sent": {"bits_per_second": 50e6}},  # interrupted
            None]
    for i, end in enumerate(ends):
        if end is not None:
            (tmp_path / f"xflow{i}.out").write_text(json.dumps({"end": end}))
    assert [r["mbps"] for r in _cross(tmp_path, flows).summary()] == [40.0, 50.0, None]


def test_stop_interrupts_running_clients_and_waits_for_them(tmp_path, procs):
    """A stand-in client that writes its result on SIGINT, as iperf3 -J does."""
    code = ("import signal, sys, time\n"
            "def out(*_):\n    open(sys.argv[1], 'w').write('interrupted'); sys.exit(1)\n"
            "signal.signal(signal.SIGINT, out)\nprint('ready', flush=True)\ntime.sleep(60)\n")
    started = []

    def launch(host, name, argv):
        if not name.startswith("xflow"):
            return None
        p = procs.start([sys.executable, "-c", code, str(tmp_path / f"{name}.out")], stdout=subprocess.PIPE)
        p.stdout.readline()              # its handler is installed
        started.append(p)
        return p

    cross = _cross(tmp_path, [Flow(src="a", dst="b")], launch).start()
    cross._thread.join(5)                # the flow has been launched
    cross.stop()
    assert started and started[0].poll() is not None and started[0].returncode == 1
    assert (tmp_path / "xflow0.out").read_text() == "interrupted"
