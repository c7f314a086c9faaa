"""iperf3 between two hosts of a running testbed: the reference for what a link delivers."""
from __future__ import annotations

import json
import time
from pathlib import Path

from emu.testbed.network import Testbed


def iperf(tb: Testbed, src: str, dst: str, log_dir: Path, seconds: float = 3.0, port: int = 5301,
          udp_mbps: float | None = None) -> float:
    """Goodput in Mb/s that `dst` received from `src` (TCP, or UDP at `udp_mbps`)."""
    tag = f"iperf-{src}-{dst}-{port}"
    server = tb.launch(dst, f"{tag}-s", ["iperf3", "-s", "-p", str(port), "-1"], log_dir, aux=True)
    time.sleep(0.3)
    argv = ["iperf3", "-c", tb.ip(dst), "-p", str(port), "-t", f"{seconds:g}", "-J", "--connect-timeout", "3000"]
    if udp_mbps:
        argv += ["-u", "-b", f"{udp_mbps:g}M"]
    client = tb.launch(src, f"{tag}-c", argv, log_dir, aux=True)
    client.wait(seconds + 15)
    server.wait(5)
    res = json.loads((log_dir / f"{tag}-c.out").read_text())
    if "error" in res:
        raise RuntimeError(f"iperf3 {src}->{dst}: {res['error']}")
    end = res["end"]
    s = end.get("sum_received") or end["sum"]
    return s["bits_per_second"] / 1e6
