"""The emulated network of one run: Mininet up, roles launched in hosts, and torn down.

`Testbed` is a context manager. Everything it creates is recorded in the orchestrator's
`StateDir` before or as it is created, and `__exit__` removes it whatever happened, so a
crash, a hang or Ctrl-C leaves no interface, namespace or process behind. If even the
orchestrator dies (kill -9), `./inv clean` finishes the job from the same records.
"""
from __future__ import annotations

import fcntl
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import IO

from mininet.link import Link
from mininet.log import setLogLevel
from mininet.net import Mininet
from mininet.node import Host, Switch
from mininet.nodelib import LinuxBridge

from emu.config.topospec import NetSpec
from emu.testbed import capabilities, cgroups, machine, tc
from emu.testbed.cleanup import StateDir, clean, kill_group, start_time
from emu.testbed.netlink import HtbRates, NetlinkError
from emu.testbed.topology import mininet_topo


class NetworkError(RuntimeError):
    """The network could not be built as configured."""


SHELL_START_S = 30.0  # a node's shell prints its prompt within milliseconds; one that has not by then never will
PROMPT = chr(127)  # Mininet's shells' prompt: the end of each command's output


class Bound:
    """How long the Testbed's current phase (bring-up, teardown) may still wait on a node's
    shell; shared by the Testbed and its nodes. None: no bound."""

    def __init__(self) -> None:
        self.phase, self.seconds, self.until = "", None, None

    def start(self, phase: str, seconds: float | None) -> None:
        self.phase, self.seconds = phase, seconds
        self.until = None if seconds is None else time.monotonic() + seconds


class _Recorded:
    """Mixin: write the node's shell pid to the state dir as soon as the shell exists, and
    never wait on a shell forever. Mininet waits for a shell's prompt and for the end of each
    command with poll() and no timeout, so a shell that died (mnexec failed at once: its error
    is all it printed) or stopped answering would hang bring-up or teardown for good; here the
    wait ends, naming the node and what its shell said, when the shell has exited, when the
    phase's `Bound` has passed, or when a shell has not prompted within SHELL_START_S."""

    def __init__(self, name, state: StateDir, bound: Bound | None = None, **params):
        self._state = state
        self._bound = bound or Bound()
        self._starting = False
        super().__init__(name, **params)

    def _kind(self) -> str:
        return "switch" if isinstance(self, Switch) else "host"

    def startShell(self, *args, **kwargs):  # noqa: N802 (Mininet's name)
        self._starting, self._start_by = True, time.monotonic() + SHELL_START_S
        try:
            super().startShell(*args, **kwargs)
        except BaseException:
            self._abandon_shell()
            raise
        finally:
            self._starting = False

    def _abandon_shell(self) -> None:
        """A shell that never prompted: killed if it still runs, its pty closed (Mininet's
        network does not know the node, so its stop will not)."""
        if self.shell is not None:
            if self.shell.poll() is None:
                kill_group(self.shell.pid, start_time(self.shell.pid))
            self.shell.wait()
        for close in (lambda: self.stdin.close() if self.stdin else os.close(self.master),
                      lambda: os.close(self.slave)):
            try:
                close()
            except (OSError, TypeError):  # not opened yet
                pass
        self.shell = self.stdin = self.stdout = None

    def read(self, size=1024):
        if self._starting:
            return self._read_prompt(size)
        return super().read(size)

    def _readable(self, timeout_ms: int) -> bool:
        """Whether the shell's output can be read. Not Mininet's `pollOut`: it is registered for
        POLLOUT too, so it returns at once whenever the pty can be written."""
        if getattr(self, "_poll_in", None) is None or self._poll_in[0] != self.stdout.fileno():
            poller = select.poll()
            poller.register(self.stdout.fileno(), select.POLLIN | select.POLLPRI)
            self._poll_in = (self.stdout.fileno(), poller)
        return bool(self._poll_in[1].poll(timeout_ms))

    def _read_prompt(self, size: int) -> str:
        """Everything up to the shell's first prompt: Mininet's start-up loop polls without a
        timeout after every read that did not end with it."""
        if self.pid is not None and not getattr(self, "_recorded", False):
            self._state.add_process("host", self.name, self.shell.pid)
            self._recorded = True
        said = ""
        while not said.endswith(PROMPT):
            if self.readbuf or self._readable(100):
                try:
                    said += super().read(size)
                    continue
                except OSError:  # the pty hung up: the shell is gone
                    self.shell.wait()
            rc = self.shell.poll()
            if rc is not None:
                while self._readable(0):
                    try:
                        said += super().read(size)
                    except OSError:
                        break
                how = " ".join(map(str, self.shell.args[:2]))
                raise NetworkError(f"{self._kind()} {self.name} did not start: its shell ({how} bash) exited with "
                                   f"code {rc}" + (f": {_said(said)}" if _said(said) else ", printing nothing"))
            self._past("did not start: its shell printed no prompt", self._start_by, SHELL_START_S,
                       f" (it printed {_said(said)!r})" if _said(said) else "")
        self._starting = False
        return said

    def _past(self, what: str, start_by: float | None = None, start_s: float | None = None, detail: str = ""
              ) -> None:
        """Raises if the phase's bound (or the shell's start-up bound) has passed."""
        now = time.monotonic()
        if self._bound.until is not None and now > self._bound.until:
            raise NetworkError(f"{self._bound.phase} took longer than timeout_s ({self._bound.seconds:g} s): "
                               f"{self._kind()} {self.name} {what}{detail}")
        if start_by is not None and now > start_by:
            raise NetworkError(f"{self._kind()} {self.name} {what} within {start_s:g} s{detail}")

    def waitReadable(self, timeoutms=None):  # noqa: N802 (Mininet's name)
        """Mininet's wait for output, in slices of 0.1 s between which the shell's exit and
        the phase's bound are checked."""
        if self.readbuf or self.shell is None:
            return super().waitReadable(timeoutms)
        end = None if timeoutms is None else time.monotonic() + timeoutms / 1e3
        while True:
            left = 100 if end is None else max(0, min(100, int((end - time.monotonic()) * 1e3)))
            if self._readable(left):
                return self.pollOut.poll(0)  # what Mininet's returns
            if end is not None and time.monotonic() >= end:
                return []
            rc = self.shell.poll()
            if rc is not None:
                raise NetworkError(f"{self._kind()} {self.name}: its shell exited with code {rc} while running "
                                   f"{self.lastCmd!r}")
            self._past(f"did not answer {self.lastCmd!r}")


def _said(text: str) -> str:
    """A shell's output on one line, without its prompt and the pty's carriage returns."""
    return " ".join(text.replace(PROMPT, "").replace("\r", "").split())[:500]


class RecordedHost(_Recorded, Host):
    pass


class RecordedBridge(_Recorded, LinuxBridge):
    """LinuxBridge ignores what brctl prints: a bridge that is not there with all its ports
    after `start` fails the bring-up, with what its commands printed."""

    def start(self, controllers):
        self._said: list[tuple[str, str]] | None = []
        try:
            super().start(controllers)
        finally:
            said, self._said = self._said, None
        # What the commands from `brctl addbr` on printed (the down and delbr before it always fail: no bridge yet)
        first = next((i for i, (words, _) in enumerate(said) if words.startswith("brctl addbr")), len(said))
        said = [f"{words}: {out}" for words, out in said[first:] if out]
        ports = [i for i in self.intfNames() if self.name in i]  # those LinuxBridge adds
        if not Path(f"/sys/class/net/{self.name}/bridge").is_dir():
            problem = f"no bridge {self.name}"
        else:
            loose = [p for p in ports if not Path(f"/sys/class/net/{self.name}/brif/{p}").exists()]
            problem = f"port(s) {', '.join(loose)} not in the bridge" if loose else ""
        if problem:
            raise NetworkError(f"switch {self.name} did not come up: {problem}" + (f" ({'; '.join(said)})"
                                                                                   if said else ""))

    def cmd(self, *args, **kwargs):
        out = super().cmd(*args, **kwargs)
        if getattr(self, "_said", None) is not None:
            self._said.append((" ".join(map(str, args)), _said(out or "")))
        return out


def _joining(procs_files: Sequence[Path]) -> list[str]:
    """A command prefix that writes its own pid to each cgroup.procs file, then execs the rest:
    a role is in its host's group before it runs. Mininet's popen starts roles as children of
    the orchestrator (mnexec -a enters only the namespaces), so the shell's group is not
    inherited; mnexec -g, which Mininet uses instead, knows only v1 paths."""
    script = 'while [ "$1" != -- ]; do echo $$ > "$1" || exit 126; shift; done; shift; exec "$@"'
    return ["sh", "-c", script, "sh", *map(str, procs_files), "--"]


class RecordedCgroupHost(RecordedHost):
    """A host in a CPU cgroup of its own (`host_cpu`, or a host a slow fault throttles), on
    whichever hierarchy the machine has (emu/testbed/cgroups.py). The group is recorded before it is
    created (a kill -9 would leave it), its shell and every process started in it join it,
    and it goes with the network (`StateDir.teardown`). It replaces Mininet's
    CPULimitedHost, which drives v1 only (cgcreate, cgset, mnexec -g); the limit arithmetic
    is the same."""

    def __init__(self, name, state: StateDir, tree: cgroups.CpuTree, **params):
        self._tree = tree
        state.add_cgroup(name, tree.paths(name))
        try:
            tree.create(name, on_change=state.add_cgroup_change)
        except cgroups.CgroupError as e:
            raise NetworkError(f"host {name}: {e}") from None
        super().__init__(name, state=state, **params)

    def startShell(self, *args, **kwargs):  # noqa: N802 (Mininet's name)
        super().startShell(*args, **kwargs)
        try:
            self._tree.add(self.name, self.shell.pid)
        except cgroups.CgroupError as e:
            raise NetworkError(f"host {self.name}: {e}") from None

    def config(self, cpu: float = -1.0, **params):
        """Mininet passes the topology's `cpu` (share of the machine, -1: no limit) here."""
        r = super().config(**params)
        self.set_share(cpu)
        return r

    def set_share(self, share: float) -> None:
        """Limit the host to `share` of the machine's CPU (negative: no limit), read back."""
        want = cgroups.cfs_limit(share)
        try:
            got = self._tree.set_limit(self.name, share)
        except cgroups.CgroupError as e:
            raise NetworkError(f"host {self.name}: {e}") from None
        if got != want:
            raise NetworkError(f"host {self.name}: {self._tree.limit_file} reads quota/period {got}, wanted "
                               f"{want} (share {share:g})")

    def popen(self, *args, **kwargs):
        kwargs.setdefault("mncmd", [*_joining(self._tree.procs_files(self.name)), "mnexec", "-da", str(self.pid)])
        return super().popen(*args, **kwargs)


class Testbed:
    __test__ = False  # not a pytest class, despite the name

    def __init__(self, spec: NetSpec, state: StateDir, host_cpu: dict[str, float] | None = None,
                 tcp_congestion_control: str | None = "cubic", netlink: bool = False,
                 cpu_groups: Sequence[str] = (), timeout_s: float | None = None):
        """tcp_congestion_control: set in every host's namespace (None: inherit the machine's).
        netlink: change rates through netlink sockets in the namespaces (emu/testbed/netlink.py), not
        a `tc class change` process each. cpu_groups: hosts that get a CFS bandwidth cgroup
        without a limit (those not in `host_cpu`), so that `set_cpu` can limit them later (a
        `slow` fault). timeout_s: bounds bring-up, and Mininet's part of teardown (past it,
        teardown removes what is recorded instead), each on its own (None: no bound; a
        node whose shell exits fails either at once)."""
        self.spec = spec
        self.timeout_s = timeout_s
        self._bound = Bound()
        self.state = state
        self.host_cpu = host_cpu or {}
        self.cpu_groups = [h for h in cpu_groups if h not in self.host_cpu]
        self.tcp_congestion_control = tcp_congestion_control
        self.net: Mininet | None = None
        self.roles: dict[str, subprocess.Popen] = {}
        self.aux: dict[str, subprocess.Popen] = {}
        self._logs: list[IO] = []
        self._htb = None
        self._cpu_tree: cgroups.CpuTree | None = None
        if netlink:
            self._htb = HtbRates()

    # ------------------------------------------------------------------ bring-up
    def __enter__(self) -> Testbed:
        try:
            self._start()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _lock(self) -> None:
        """One emulated network per machine at a time: interface names would collide, and
        two runs would share the CPU. A second run waits here; the lock dies with its holder."""
        path = self.state.path.parent / "network.lock"
        self._lockf = open(path, "a+")
        try:
            fcntl.flock(self._lockf, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lockf.seek(0)
            holder = self._lockf.read().strip() or "?"
            print(f"waiting for the run of orchestrator {holder} to release the network ({path})",
                  file=sys.stderr, flush=True)
            fcntl.flock(self._lockf, fcntl.LOCK_EX)
        self._lockf.seek(0)
        last = self._lockf.read().strip()
        self._lockf.seek(0)
        self._lockf.truncate()
        self._lockf.write(str(os.getpid()))
        self._lockf.flush()
        self._clean_after(int(last) if last.isdigit() else None)

    def _clean_after(self, last: int | None) -> None:
        """Holding the lock, no live run has a network up: what is up is a killed run's (a Ray
        node lost mid-run, a kill -9 while this run waited), and its names would be taken. Its
        lock goes with its files, a moment before it is gone: while the last holder still has a
        network recorded, it is dying, and is waited for (10 s at most) before the cleanup."""
        root = self.state.path.parent
        if last and last != os.getpid() and StateDir(root, last).links():
            deadline = time.monotonic() + 10
            while StateDir(root, last).owner_alive() and time.monotonic() < deadline:
                time.sleep(0.1)
        for line in clean(root=root):
            print(f"cleaned up {line}", file=sys.stderr, flush=True)

    def _machine_settings(self) -> None:
        """Machine-wide settings this run needs, each recorded before it is changed (and put
        back by teardown or `./inv clean`). Mininet's own `fixLimits()` would change more of
        them and never restore them, so it is skipped (`Mininet.inited`)."""
        Mininet.inited = True
        machine.raise_process_limits()
        if self.host_cpu or self.cpu_groups:
            # v1 or v2, whichever holds the cpu controller; the harness mounts no hierarchy.
            self._cpu_tree = cgroups.detect().cpu_tree()
            if self._cpu_tree is None:
                why = capabilities.cpu_cgroup_refusal("host_cpu (and slow faults)") or "host_cpu: no cpu cgroup"
                raise NetworkError(f"{why} (./inv doctor; the harness mounts no cgroup hierarchy)")
        for limit in machine.RUN_LIMITS:
            have = machine.read_sysctl(limit.key)
            if have is not None and have.isdigit() and int(have) < limit.at_least:
                self.state.change_sysctl(limit.key, str(limit.at_least))
        cc = self.tcp_congestion_control
        if cc is not None:
            if cc not in capabilities.tcp_congestion_controls():
                raise NetworkError(f"tcp congestion control {cc!r} is not available in this kernel")
            allowed = machine.allowed_with(cc)
            if allowed is not None:
                try:
                    self.state.change_sysctl(machine.ALLOWED_CC, allowed)
                except OSError as e:
                    raise NetworkError(f"allowing tcp congestion control {cc!r} in the hosts' namespaces "
                                       f"({machine.ALLOWED_CC}={allowed}): {e}") from None

    def _start(self) -> None:
        self._lock()
        self._machine_settings()
        setLogLevel("critical")
        # A share of -1 is Mininet's "no limit": the host is in its group from the start.
        shares = {**{h: -1.0 for h in self.cpu_groups}, **self.host_cpu}
        topo = mininet_topo(self.spec, shares, partial(RecordedCgroupHost, state=self.state, tree=self._cpu_tree,
                                                       bound=self._bound))
        # Mininet names interfaces <node>-eth<port>: record every name before it exists,
        # and refuse to touch names that are already taken (another run, or leftovers).
        names = [f"{node}-eth{port}" for node, ports in topo.ports.items() for port in ports]
        names += list(topo.switches())
        taken = [n for n in names if Path(f"/sys/class/net/{n}").exists()]
        if taken:
            raise NetworkError(f"interface {taken[0]} already exists: another run is using this network, or a "
                               f"killed one left it behind (./inv clean)")
        for n in names:
            self.state.add_link(n)
        t0 = time.monotonic()
        self._bound.start("bring-up", self.timeout_s)
        self.net = Mininet(
            topo=topo,
            host=partial(RecordedHost, state=self.state, bound=self._bound),
            switch=partial(RecordedBridge, state=self.state, bound=self._bound),
            controller=None,
            link=Link,
            autoSetMacs=True,
            build=False,
        )
        try:
            self.net.build()
            self.net.start()
        except Exception as e:
            if type(e) is not Exception:  # Mininet's own failures (an interface pair not made) are bare Exceptions
                raise
            raise NetworkError(str(e).strip()) from None
        self._shape()
        self._set_tcp()
        self._bound.start("", None)  # the roles' time is the runner's to bound
        self.bringup_s = time.monotonic() - t0

    def _shape(self) -> None:
        """htb on the egress of both ends of every link, then check the kernel took the rates."""
        for ln in self.spec.links:
            for src, dst, mbps in ((ln.a, ln.b, ln.ab_mbps), (ln.b, ln.a, ln.ba_mbps)):
                dev, ns = self.egress(src, dst)
                try:
                    for cmd in tc.setup_commands(dev, mbps * 1e6, ln.delay_ms, ln.loss_pct, ln.queue_pkts,
                                                  ln.queue_ms):
                        tc.run(cmd, ns)
                    got = tc.class_rate(dev, ns)
                except tc.TcError as e:
                    raise NetworkError(f"shaping {src}->{dst}: {e}") from None
                if got is None or abs(got - mbps * 1e6) > 0.01 * mbps * 1e6:
                    raise NetworkError(f"shaping {src}->{dst}: kernel reports {got} bit/s on {dev}, "
                                       f"configured {mbps:g} Mb/s")

    def _set_tcp(self) -> None:
        """Each host is a network namespace with its own TCP defaults, inherited from the
        machine unless set here: one `sysctl -w` per host, then every value read back."""
        want = dict(machine.HOST_TCP_BUFFERS)
        if self.tcp_congestion_control is not None:
            want["net.ipv4.tcp_congestion_control"] = self.tcp_congestion_control
        for name in self.spec.hosts:
            p = self.net.get(name).popen(["sysctl", "-w", *(f"{k}={v}" for k, v in want.items())],
                                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, text=True, cwd="/")  # see emu/testbed/tc.py
            out = p.communicate(timeout=10)[0].strip()
            got = dict(zip(want, (" ".join(v.split()) for v in self.tcp_setting(name, *want).splitlines())))
            if p.returncode or got != want:
                bad = next(k for k in want if got[k] != want[k])
                raise NetworkError(f"host {name}: setting {bad}={want[bad]} failed: {out or p.returncode}")

    def tcp_setting(self, host: str, *keys: str) -> str:
        """Sysctls as `host`'s namespace sees them (default: its congestion control), one per line."""
        keys = keys or ("net.ipv4.tcp_congestion_control",)
        p = self.net.get(host).popen(["sysctl", "-n", *keys], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                     text=True, cwd="/")
        return p.communicate(timeout=10)[0].strip()

    # ------------------------------------------------------------------ queries
    def ip(self, host: str) -> str:
        return self.net.get(host).IP()

    def pid(self, host: str) -> int:
        """A process in `host`'s network namespace (its shell, alive until teardown)."""
        return self.net.get(host).pid

    def _intf(self, node: str, peer: str):
        n, p = self.net.get(node), self.net.get(peer)
        link = self.net.linksBetween(n, p)[0]
        return link.intf1 if link.intf1.node is n else link.intf2

    def egress(self, src: str, dst: str) -> tuple[str, int | None]:
        """Interface whose egress qdisc shapes src->dst, and the pid of its namespace (None: root)."""
        node = self.net.get(src)
        return self._intf(src, dst).name, (node.pid if node.inNamespace else None)

    def counter(self, src: str, dst: str) -> tuple[str, str]:
        """A root-namespace interface and counter ('tx'|'rx') that count src->dst bytes."""
        if not self.net.get(src).inNamespace:
            return self._intf(src, dst).name, "tx"
        return self._intf(dst, src).name, "rx"

    def set_rate(self, link: tuple[str, str], bps: float) -> None:
        """The htb rate of one link direction (class 5:1 changed in place: its queue is kept)."""
        dev, ns = self.egress(*link)
        if self._htb is not None:
            try:
                self._htb.set(dev, ns, bps)
            except NetlinkError as e:
                raise NetworkError(f"rate of {link[0]}->{link[1]}: {e}") from None
        else:
            tc.run(tc.change_command(dev, bps), ns)

    def prepare_rate(self, link: tuple[str, str]) -> None:
        """Opens what `set_rate` will use for this link direction now, so its first change is
        not late (netlink: the namespace's socket)."""
        if self._htb is not None:
            try:
                self._htb.prepare(*self.egress(*link))
            except NetlinkError as e:
                raise NetworkError(f"rate of {link[0]}->{link[1]}: {e}") from None

    # ------------------------------------------------------------------ faults
    def _link_ends(self, a: str, b: str) -> list[tuple[str, int | None]]:
        """The interfaces of link a-b that `set_link` switches: those in the root namespace
        (a switch's port; both ends of a link between switches), else a's end in its host."""
        ends = [(self._intf(n, p).name, None) for n, p in ((a, b), (b, a)) if not self.net.get(n).inNamespace]
        return ends or [(self._intf(a, b).name, self.net.get(a).pid)]

    def set_link(self, link: tuple[str, str], up: bool) -> None:
        """Take link a-b down, or up again. For a host's link the switch's port goes down,
        which takes the carrier off the host's end (a cable pulled at the switch): nothing
        passes either way, and the host keeps its address, routes and qdiscs. Up again, the
        bridge forwards at once (no STP)."""
        for dev, ns in self._link_ends(*link):
            cmd = ["ip", "link", "set", "dev", dev, "up" if up else "down"]
            r = subprocess.run((["mnexec", "-a", str(ns)] if ns is not None else []) + cmd,
                               capture_output=True, text=True, cwd="/")  # see emu/testbed/tc.py on mnexec -a
            if r.returncode:
                raise NetworkError(f"{' '.join(cmd)}: {r.stderr.strip() or r.returncode}")

    def link_is_up(self, a: str, b: str) -> bool:
        """Whether link a-b carries traffic, from the operstate of its root-namespace end(s)."""
        for dev, ns in self._link_ends(a, b):
            if ns is not None:
                return True   # not visible from here; such links are not built (hosts hang off switches)
            try:
                if Path(f"/sys/class/net/{dev}/operstate").read_text().strip() != "up":
                    return False
            except OSError:
                return False
        return True

    def down_links(self) -> list[str]:
        return [f"{ln.a}-{ln.b}" for ln in self.spec.links if not self.link_is_up(ln.a, ln.b)]

    def set_cpu(self, host: str, share: float | None) -> None:
        """Limit `host` to `share` of the machine's CPU (CFS bandwidth of its cgroup), or with
        None give it back its configured share (`host_cpu`, else none), read back."""
        node = self.net.get(host)
        if not isinstance(node, RecordedCgroupHost):
            raise NetworkError(f"host {host} has no CPU cgroup (it must be in host_cpu or cpu_groups)")
        node.set_share(share if share is not None else self.host_cpu.get(host, -1.0))

    def signal_role(self, role: str, sig: int) -> bool:
        """Send `sig` to the role's process group (it leads its own session); False if the
        role has already exited."""
        p = self.roles.get(role)
        if p is None or p.poll() is not None:
            return False
        try:
            os.killpg(p.pid, sig)
        except ProcessLookupError:
            return False
        return True

    # ------------------------------------------------------------------ roles
    def launch(self, host: str, role: str, argv: Sequence[str], log_dir: Path,
               env: dict[str, str] | None = None, cwd: Path | None = None, aux: bool = False) -> subprocess.Popen:
        """Start `argv` inside `host`'s namespace in its own session (so its group can be killed).

        Roles (servers, workers) must all exit 0 for a run to succeed; `aux` processes (cross
        traffic) are only torn down with the network."""
        out = open(log_dir / f"{role}.out", "wb")
        err = open(log_dir / f"{role}.err", "wb")
        self._logs += [out, err]
        full_env = dict(os.environ)
        full_env.update(env or {})
        # mnexec -d: setsid, so the role leads its own process group; -a: enter host's netns.
        p = self.net.get(host).popen(list(argv), stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                     cwd=str(cwd) if cwd else None, env=full_env)
        self.state.add_process("role", role, p.pid)
        (self.aux if aux else self.roles)[role] = p
        return p

    # ------------------------------------------------------------------ teardown
    def _hang_up_shells(self, wait_s: float = 2.0) -> None:
        """What Mininet's stop does to the shells, for those it did not reach: SIGHUP (a shell
        ignores SIGTERM, so the recorded state's kill would wait out its grace for each), and
        SIGCONT for a stopped one. Each is still this process's unreaped child: its pid is its own."""
        shells = [n.shell for n in self.net.hosts + self.net.switches if n.shell is not None and n.shell.poll() is None]
        for shell in shells:
            for sig in (signal.SIGHUP, signal.SIGCONT):
                try:
                    os.killpg(shell.pid, sig)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + wait_s
        while any(s.poll() is None for s in shells) and time.monotonic() < deadline:
            time.sleep(0.05)

    def __exit__(self, *exc) -> None:
        # A Ctrl-C must not interrupt the teardown half-way; it is held and raised once the
        # network is down (unless the run is already ending for another reason), so a sweep
        # still stops on a Ctrl-C that lands during a teardown.
        held: list[int] = []
        old = signal.signal(signal.SIGINT, lambda signum, frame: held.append(signum))
        try:
            for p in list(self.roles.values()) + list(self.aux.values()):
                if p.poll() is None:
                    kill_group(p.pid, start_time(p.pid))
                try:
                    p.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    pass
            for f in self._logs:
                f.close()
            if self._htb is not None:
                self._htb.close()  # its sockets would keep the hosts' namespaces alive
            if self.net is not None:
                t0 = time.monotonic()
                self._bound.start("teardown", self.timeout_s)
                try:
                    self.net.stop()
                except Exception as e:  # noqa: BLE001 - the recorded state below is the fallback
                    print(f"teardown: {e}; removing what is recorded instead", file=sys.stderr, flush=True)
                    self._hang_up_shells()
                self.teardown_s = time.monotonic() - t0
            self.state.teardown()
            self.state.clear()
            if getattr(self, "_lockf", None) is not None:
                self._lockf.close()  # releases the network lock
        finally:
            signal.signal(signal.SIGINT, old)
        if held and exc[0] is None:
            raise KeyboardInterrupt("signal SIGINT (during teardown)")
