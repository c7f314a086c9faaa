"""One run, one executor (emu/run/claims.py): a claim is exclusive, names its holder, dies with
its process (kill -9 included) and is taken over (the Ray driver's use: tests/unit/test_raysweep.py)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from emu.run.claims import Claim, Holder, claim_path, try_claim
from tests.conftest import REPO


def test_a_claim_is_exclusive_names_its_holder_and_goes_with_its_file(tmp_path):
    mine = try_claim(tmp_path, "r1")
    assert isinstance(mine, Claim) and mine.left is None
    other = try_claim(tmp_path, "r1")   # another open file: flock treats it as another holder
    assert isinstance(other, Holder) and other.pid == os.getpid() and other.started
    assert f"pid {os.getpid()}" in other.describe()
    assert isinstance(try_claim(tmp_path, "r2"), Claim)   # claims are per run
    mine.release()
    assert not claim_path(tmp_path, "r1").exists()   # let go normally: nothing is left to take over
    again = try_claim(tmp_path, "r1")
    assert isinstance(again, Claim) and again.left is None
    again.release()


def test_waiting_for_a_claim_returns_once_its_holder_lets_go(tmp_path):
    held = try_claim(tmp_path, "r1")
    threading.Timer(0.3, held.release).start()
    t0 = time.monotonic()
    with try_claim(tmp_path, "r1", wait=True) as got:
        assert isinstance(got, Claim) and got.left is None and time.monotonic() - t0 >= 0.25
        assert isinstance(try_claim(tmp_path, "r1"), Holder)


def test_the_claim_of_a_process_killed_with_kill_9_is_taken_over(tmp_path):
    code = ("import sys, time; from pathlib import Path; from emu.run.claims import try_claim; "
            "c = try_claim(Path(sys.argv[1]), 'r1'); print('held', flush=True); time.sleep(60)")
    child = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], cwd=REPO, stdout=subprocess.PIPE,
                             text=True)
    try:
        assert child.stdout.readline().strip() == "held"
        holder = try_claim(tmp_path, "r1")
        assert isinstance(holder, Holder) and holder.pid == child.pid
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(10)
        child.stdout.close()
    got = try_claim(tmp_path, "r1")   # the kernel let go of the dead process's lock
    assert isinstance(got, Claim) and got.left is not None and got.left.pid == child.pid
    got.release()


def test_a_claim_in_a_read_only_or_removed_directory_is_one_results_error(tmp_path):
    from emu.run.results import ResultsError

    with pytest.raises(ResultsError, match=r"No such file or directory \(ENOENT\)"):
        try_claim(tmp_path / "gone", "r1")
