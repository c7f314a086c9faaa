"""Shared test helpers: repository paths, the root check, and leftover detection."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

IS_ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not IS_ROOT, reason="end-to-end Mininet tests need root (run: sudo ./inv test)")


def invoke(*args: str, timeout: float = 300, **kw) -> subprocess.CompletedProcess:
    """Run one of tasks.py's tasks the way a user does (without the bootstrap wrapper)."""
    return subprocess.run([sys.executable, "-m", "invoke", "--search-root", str(REPO), *args],
                          capture_output=True, text=True, timeout=timeout, cwd=REPO, **kw)


def invoke_popen(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "invoke", "--search-root", str(REPO), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
                            start_new_session=True)


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
    cpu_cg = Path("/sys/fs/cgroup/cpu")
    cgroups = lambda: {p.name for p in cpu_cg.iterdir() if p.is_dir()} if cpu_cg.is_dir() else set()  # noqa: E731
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
