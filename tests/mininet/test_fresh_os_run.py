"""`./inv fresh-os` end to end, as root: the README's commands pass on a freshly installed Debian 12
(emu/testbed/freshos.py).

The test takes minutes (the root file system, the set-up, the demo and the fast tier): it is in
the root tier and marked slow, so `./inv test --fast` leaves it out.
"""
from __future__ import annotations

import os
import re
import subprocess
import time

import pytest

from emu.testbed import freshos
from tests.conftest import REPO


def _leftover_roots() -> set[str]:
    return {p.name for p in freshos.WORK.glob("schedlab-fresh-os-*")}


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get(freshos.MARKER) == "1", reason="already inside a fresh OS")
def test_fresh_os_runs_the_demo_the_doctor_and_the_fast_tier(no_leftovers):
    before = _leftover_roots()
    t0 = time.monotonic()
    r = subprocess.run([str(REPO / "inv"), "fresh-os"], capture_output=True, text=True, timeout=3600, cwd=REPO)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-6000:]
    assert re.search(r"fresh-os: demo: ok in [\d.]+ s, set-up [\d.]+ s of it", out), out[-3000:]
    assert re.search(r"fresh-os: doctor: ok in [\d.]+ s", out), out[-3000:]
    assert re.search(r"fresh-os: fast tier: ok in [\d.]+ s", out), out[-3000:]
    assert "fresh-os wall times: build" in r.stdout, r.stdout[-2000:]
    assert _leftover_roots() == before, "the unpacked root file system was not removed"
    mounts = subprocess.run(["findmnt", "-rn", "-o", "TARGET"], capture_output=True, text=True).stdout
    assert "schedlab-fresh-os-" not in mounts, mounts
    print(f"fresh-os took {time.monotonic() - t0:.0f} s")
