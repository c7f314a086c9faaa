"""Link monitor: byte rates of every host link, sampled from kernel counters at 10 Hz.

The switch-side end of each link lives in the root namespace, so its counters are read
from /sys without entering any host: its rx is the host's upload, its tx the download.
"""
from __future__ import annotations

import threading
import time
from pathlib import Path

import pandas as pd


class LinkMonitor:
    def __init__(self, links: dict[str, tuple[str, str, float]], interval_s: float = 0.1):
        """links: label -> (root-namespace interface, 'rx'|'tx', configured bit/s)."""
        self.links = links
        self.interval_s = interval_s
        self.rows: list[tuple[str, float, float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="link-monitor", daemon=True)

    def _read(self, intf: str, direction: str) -> int:
        try:
            return int(Path(f"/sys/class/net/{intf}/statistics/{direction}_bytes").read_text())
        except (OSError, ValueError):
            return 0

    def _run(self) -> None:
        t0 = time.monotonic()
        last = {k: self._read(i, d) for k, (i, d, _) in self.links.items()}
        last_t = t0
        while not self._stop.wait(self.interval_s):
            now = time.monotonic()
            dt = now - last_t
            for label, (intf, direction, bps) in self.links.items():
                cur = self._read(intf, direction)
                self.rows.append((label, now - t0, (cur - last[label]) / dt, bps))
                last[label] = cur
            last_t = now

    def start(self) -> "LinkMonitor":
        self._thread.start()
        return self

    def stop(self) -> pd.DataFrame:
        self._stop.set()
        self._thread.join(2)
        return pd.DataFrame(self.rows, columns=["link", "t", "tx_bytes_per_s", "configured_bps"])
