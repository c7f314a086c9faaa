"""The emulated network of one run: Mininet up, roles launched in hosts, and torn down.

`Testbed` is a context manager. Everything it creates is recorded in the orchestrator's
`StateDir` before or as it is created, and `__exit__` removes it whatever happened, so a
crash, a hang or Ctrl-C leaves no interface, namespace or process behind. If even the
orchestrator dies (kill -9), `./inv clean` finishes the job from the same records.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from functools import partial
from pathlib import Path
from typing import IO, Sequence

from mininet.link import TCLink
from mininet.log import setLogLevel
from mininet.net import Mininet
from mininet.node import Host
from mininet.nodelib import LinuxBridge

from emu.cleanup import StateDir, kill_group, start_time
from emu.config import StarTopology
from emu.topology import mininet_topo


class NetworkError(RuntimeError):
    """The network could not be built as configured."""


class _Recorded:
    """Mixin: write the node's shell pid to the state dir as soon as the shell exists."""

    def __init__(self, name, state: StateDir, **params):
        self._state = state
        super().__init__(name, **params)

    def startShell(self, *args, **kwargs):  # noqa: N802 (Mininet's name)
        super().startShell(*args, **kwargs)
        self._state.add_process("host", self.name, self.shell.pid)


class RecordedHost(_Recorded, Host):
    pass


class RecordedBridge(_Recorded, LinuxBridge):
    pass


class Testbed:
    def __init__(self, spec: StarTopology, state: StateDir):
        self.spec = spec
        self.state = state
        self.net: Mininet | None = None
        self.roles: dict[str, subprocess.Popen] = {}
        self._logs: list[IO] = []

    # ------------------------------------------------------------------ bring-up
    def __enter__(self) -> "Testbed":
        try:
            self._start()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _start(self) -> None:
        setLogLevel("critical")  # htb "quantum is big" noise; shaping is verified below
        topo = mininet_topo(self.spec)
        # Record every interface name before it exists: Mininet names them <node>-eth<port>.
        for node, ports in topo.ports.items():
            for port in ports:
                self.state.add_link(f"{node}-eth{port}")
        for sw in topo.switches():
            self.state.add_link(sw)
        t0 = time.monotonic()
        self.net = Mininet(
            topo=topo,
            host=partial(RecordedHost, state=self.state),
            switch=partial(RecordedBridge, state=self.state),
            controller=None,
            link=TCLink,
            autoSetMacs=True,
            build=False,
        )
        self.net.build()
        self.net.start()
        self.bringup_s = time.monotonic() - t0
        self._verify_shaping()

    def _verify_shaping(self) -> None:
        """TCIntf can fail and only print; check that each link really has its htb rate."""
        for h in self.spec.hosts:
            host = self.net.get(h.name)
            for node, intf in ((host, host.defaultIntf()), (self.switch, self.switch_intf(h.name))):
                out = node.cmd("tc", "class", "show", "dev", intf.name)
                m = re.search(r"htb \S+ root .*?rate (\d+(?:\.\d+)?)([KMG]?)bit", out)
                if not m:
                    raise NetworkError(f"topology.hosts[{h.name}]: no htb shaping on {intf.name}: {out.strip()!r}")
                rate = float(m.group(1)) * {"": 1, "K": 1e3, "M": 1e6, "G": 1e9}[m.group(2)]
                if abs(rate - h.bw_mbps * 1e6) > 0.01 * h.bw_mbps * 1e6:
                    raise NetworkError(f"{intf.name}: htb rate {rate:.0f} bit/s, configured {h.bw_mbps} Mb/s")

    # ------------------------------------------------------------------ queries
    @property
    def switch(self):
        return self.net.get(self.spec.switch)

    def ip(self, host: str) -> str:
        return self.net.get(host).IP()

    def switch_intf(self, host: str):
        """The switch-side interface of `host`'s link (lives in the root namespace)."""
        link = self.net.linksBetween(self.net.get(host), self.switch)[0]
        return link.intf2 if link.intf2.node is self.switch else link.intf1

    # ------------------------------------------------------------------ roles
    def launch(self, host: str, role: str, argv: Sequence[str], log_dir: Path,
               env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.Popen:
        """Start `argv` inside `host`'s namespace in its own session (so its group can be killed)."""
        out = open(log_dir / f"{role}.out", "wb")
        err = open(log_dir / f"{role}.err", "wb")
        self._logs += [out, err]
        full_env = dict(os.environ)
        full_env.update(env or {})
        # mnexec -d: setsid, so the role leads its own process group; -a: enter host's netns.
        p = self.net.get(host).popen(list(argv), stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                     cwd=str(cwd) if cwd else None, env=full_env)
        self.state.add_process("role", role, p.pid)
        self.roles[role] = p
        return p

    # ------------------------------------------------------------------ teardown
    def __exit__(self, *exc) -> None:
        # A second Ctrl-C must not interrupt the teardown half-way.
        old = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            for p in self.roles.values():
                if p.poll() is None:
                    kill_group(p.pid, start_time(p.pid))
                try:
                    p.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    pass
            for f in self._logs:
                f.close()
            if self.net is not None:
                t0 = time.monotonic()
                try:
                    self.net.stop()
                except Exception:  # noqa: BLE001 - the recorded state below is the fallback
                    pass
                self.teardown_s = time.monotonic() - t0
            self.state.teardown()
            self.state.clear()
        finally:
            signal.signal(signal.SIGINT, old)
