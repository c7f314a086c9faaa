"""Shared test fixtures and helpers: repository paths, the root check, the test tiers (by folder), processes a
test starts, and leftover detection."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

IS_ROOT = os.geteuid() == 0
TESTS = Path(__file__).resolve().parent

# Tiers, by folder (markers declared in pyproject.toml): tests/unit (no network, no root), tests/loopback
# (real TCP on 127.0.0.1, role processes, Ray on this machine), tests/mininet (needs root: Mininet networks,
# network namespaces, cgroups, the fresh OS, installing packages). A test in tests/mininet is marked `mininet`
# and `root`; a `root` test is skipped without root. `slow` (about a second or more on the reference machine,
# measured with --durations) is on the tests themselves: `@pytest.mark.slow`, or
# `pytest.param(..., marks=pytest.mark.slow)` for some cases of a parametrized test. `./inv test --fast`
# deselects `mininet`, `root` and `slow`; `./inv test` runs everything.
TIER_MARKERS = {"unit": ("unit",), "loopback": ("loopback",), "mininet": ("mininet", "root")}
NEEDS_ROOT = "needs root (run: sudo ./inv test)"


def tier_of(path: Path) -> str | None:
    """The tier folder a test file is in (None for a file outside tests/<tier>/)."""
    try:
        parts = Path(path).resolve().relative_to(TESTS).parts
    except ValueError:
        return None
    return parts[0] if len(parts) > 1 and parts[0] in TIER_MARKERS else None


@pytest.hookimpl(tryfirst=True)  # before -m deselects by these markers
def pytest_collection_modifyitems(config, items):
    for item in items:
        for name in TIER_MARKERS.get(tier_of(item.path), ()):
            item.add_marker(name)
        if item.get_closest_marker("mininet"):
            item.add_marker(pytest.mark.root)
        if item.get_closest_marker("root") and not IS_ROOT:
            item.add_marker(pytest.mark.skip(reason=NEEDS_ROOT))


@pytest.fixture(autouse=True)
def scheduler_infos():
    """The registry's scheduler descriptions handed to analysis as tasks.py hands them over
    (analysis/catalog.py), for tests that call analysis directly on rows older than their record."""
    from analysis import catalog
    from schedulers.registry import infos

    catalog.install(infos())


def invoke(*args: str, timeout: float = 300, **kw) -> subprocess.CompletedProcess:
    """Run one of tasks.py's tasks the way a user does (without the bootstrap wrapper)."""
    return subprocess.run([sys.executable, "-m", "invoke", "--search-root", str(REPO), *args],
                          capture_output=True, text=True, timeout=timeout, cwd=REPO, **kw)


def wait_for(pred, timeout: float, what: str):
    """pred()'s first truthy value within `timeout` seconds (polled every 0.1 s)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def worker_progress(results: Path, sweep: str, worker: str = "worker1") -> int:
    """The most iterations `worker` has reported in any run of `sweep` under `results`."""
    best = 0
    for p in results.glob(f"{sweep}/*/records/{worker}.progress"):
        try:
            best = max(best, int(p.read_text() or 0))
        except (OSError, ValueError):
            pass
    return best


def _as_from_a_terminal() -> None:
    """SIGINT as a terminal's shell leaves it: a suite started in the background (`cmd &`, where the
    shell ignores SIGINT, and exec keeps what is ignored) would otherwise start runs deaf to Ctrl-C."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def inv(*args: str, env: dict | None = None, user: str | None = None, timeout: float = 300):
    """`./inv ARGS` as a user runs it, through the bootstrap wrapper; `user`: as that user (setpriv)."""
    cmd = [str(REPO / "inv"), *args]
    if user is not None:
        cmd = ["setpriv", f"--reuid={user}", f"--regid={user if user != 'nobody' else 'nogroup'}", "--clear-groups",
               *cmd]
    return subprocess.run(cmd, env={**os.environ, **(env or {})}, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def invoke_popen(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "invoke", "--search-root", str(REPO), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
                            start_new_session=True, preexec_fn=_as_from_a_terminal)


class Procs(list):
    """The processes a test started (see the `procs` fixture): `start` starts one, `add` (or `append`)
    takes one started elsewhere; each is returned."""

    def start(self, *args, **kw) -> subprocess.Popen:
        return self.add(subprocess.Popen(*args, **kw))

    def add(self, p: subprocess.Popen) -> subprocess.Popen:
        try:   # a process started with start_new_session=True leads its own group: the group goes with it
            p.own_group = os.getpgid(p.pid) == p.pid
        except ProcessLookupError:
            p.own_group = False
        super().append(p)
        return p

    def append(self, p: subprocess.Popen) -> None:
        self.add(p)

    def end(self, timeout: float = 10) -> None:
        """Kill what still runs (its whole process group where it leads one) and wait for it."""
        for p in self:
            if p.poll() is not None:
                continue    # reaped: its pid, and so its group's id, may be another process's by now
            try:
                if p.own_group:
                    os.killpg(p.pid, signal.SIGKILL)
                    os.killpg(p.pid, signal.SIGCONT)   # a stopped member takes SIGKILL only once running
                else:
                    p.kill()
            except ProcessLookupError:
                pass
        for p in self:
            try:
                p.wait(timeout)
            finally:
                for stream in (p.stdin, p.stdout, p.stderr):
                    if stream is not None:
                        stream.close()


@pytest.fixture
def procs():
    """Processes a test starts (`procs.start(argv, ...)`, or `procs.add(popen)`): whatever is still running at
    its end is killed, with its process group where it leads one, and waited for. Ask for it after
    `no_leftovers`, so that it ends them before that fixture looks."""
    started = Procs()
    yield started
    started.end()


def interfaces() -> set[str]:
    return set(os.listdir("/sys/class/net"))


def namespaces_pids() -> set[int]:
    """Processes in a network namespace other than ours (Mininet hosts and their roles)."""
    mine = os.readlink("/proc/self/ns/net")
    out = set()
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                if os.readlink(f"/proc/{d}/ns/net") != mine:
                    out.add(int(d))
            except OSError:
                pass
    return out


@pytest.fixture
def no_leftovers():
    """Fails the test if it leaves an interface, a namespaced process or a state record."""
    # v1: a group per host in the cpu (and cpuacct) hierarchy; v2: under the harness's own group
    from emu.testbed.cgroups import V2_PARENT
    root = Path("/sys/fs/cgroup")
    places = [root / "cpu", root / "cpuacct", root / V2_PARENT, root / "unified" / V2_PARENT]
    def cgroups() -> set[str]:
        own = {str(d) for d in places[2:] if d.is_dir()}   # the v2 parent itself goes with the network too
        return own | {str(p) for d in places if d.is_dir() for p in d.iterdir() if p.is_dir()}
    before_if, before_ns, before_cg = interfaces(), namespaces_pids(), cgroups()
    yield
    after_if = interfaces() - before_if
    after_ns = namespaces_pids() - before_ns
    assert not cgroups() - before_cg, f"cgroups left behind: {sorted(cgroups() - before_cg)}"
    state = Path("/run/schedlab")
    records = [p for p in state.glob("*/*.json") if "owner" not in p.name] if state.exists() else []
    assert not after_if, f"interfaces left behind: {sorted(after_if)}"
    assert not after_ns, f"processes left in network namespaces: {sorted(after_ns)}"
    assert not records, f"state records left behind: {records}"
