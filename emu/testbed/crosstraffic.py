"""Cross traffic at run time: the iperf3 ends of each configured flow (emu/config/crosstraffic.py).

Each flow gets its own iperf3 server port; both ends are launched as auxiliary processes of
the testbed, so they are recorded and torn down with the network. What each flow achieved
(iperf3's JSON) is summarised into the run.
"""
from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

from emu.config.crosstraffic import Flow

BASE_PORT = 5201
INTERRUPT_WAIT_S = 3.0   # for the interrupted clients to write their results




def client_argv(flow: Flow, dst_ip: str, port: int, duration_s: float) -> list[str]:
    argv = ["iperf3", "-c", dst_ip, "-p", str(port), "-t", f"{max(duration_s, 1):.0f}", "-J",
            "-P", str(flow.parallel), "--connect-timeout", "5000"]
    if flow.protocol == "udp":
        argv.append("-u")
    if flow.rate_mbps is not None:
        argv += ["-b", f"{flow.rate_mbps / flow.parallel:.6g}M"]
    return argv


def server_argv(port: int) -> list[str]:
    return ["iperf3", "-s", "-p", str(port), "-1"]


class CrossTraffic:
    """Starts each flow at its time in a background thread; `summary()` reads the results."""

    def __init__(self, flows: list[Flow], horizon_s: float, ip: Callable[[str], str],
                 launch: Callable[[str, str, list[str]], subprocess.Popen | None], log_dir: Path):
        self.flows = flows
        self.horizon_s = horizon_s
        self.ip = ip
        self.launch = launch
        self.log_dir = log_dir
        self.started: list[int] = []
        self.clients: list = []          # the iperf3 clients' processes (Popen), as launched
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cross-traffic", daemon=True)

    def start(self) -> CrossTraffic:
        for i, f in enumerate(self.flows):
            self.launch(f.dst, f"xserver{i}", server_argv(BASE_PORT + i))
        self.t0 = time.monotonic()
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            time.sleep(0.3)  # let the iperf3 servers bind
            for i, f in sorted(enumerate(self.flows), key=lambda x: x[1].start_s):
                if self._stop.wait(max(0.0, self.t0 + f.start_s - time.monotonic())):
                    return
                end = min(f.stop_s, self.horizon_s) if f.stop_s is not None else self.horizon_s
                p = self.launch(f.src, f"xflow{i}", client_argv(f, self.ip(f.dst), BASE_PORT + i, end - f.start_s))
                if p is not None:
                    self.clients.append(p)
                self.started.append(i)
        except BaseException as e:  # noqa: BLE001
            self.error = e

    def stop(self) -> None:
        """Stop starting flows, and interrupt the clients still running: iperf3 writes its JSON
        (what the flow achieved so far) on SIGINT, where a kill at teardown would leave none,
        and a flow that lasts the whole run would report no rate."""
        self._stop.set()
        self._thread.join(5)
        running = [p for p in self.clients if p.poll() is None]
        for p in running:
            p.send_signal(signal.SIGINT)
        deadline = time.monotonic() + INTERRUPT_WAIT_S
        for p in running:
            try:
                p.wait(max(deadline - time.monotonic(), 0.01))
            except subprocess.TimeoutExpired:
                pass   # torn down with the network

    def summary(self) -> list[dict]:
        out = []
        for i, f in enumerate(self.flows):
            row = {"flow": i, "src": f.src, "dst": f.dst, "protocol": f.protocol, "started": i in self.started,
                   "mbps": None}
            try:
                res = json.loads((self.log_dir / f"xflow{i}.out").read_text())
                end = res.get("end", {})
                # what the receiver got; a client interrupted at the end of the run never hears
                # it (0 there), and then what it sent stands in (a UDP flow's loss unknown)
                rates = [(end.get(k) or {}).get("bits_per_second", 0) for k in ("sum_received", "sum_sent", "sum")]
                row["mbps"] = next((r / 1e6 for r in rates if r > 0), None)
            except (OSError, ValueError):
                pass
            out.append(row)
        return out
