"""A normal user (no root, no network built) lists the tasks and writes a report of committed
results, while a task that builds a network says it needs root. Run as root: it makes the user."""
from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.conftest import REPO, inv
from tests.factories import MINI


def test_a_normal_user_lists_tasks_and_reports_committed_results(tmp_path):
    """As nobody, with the environment already set up (its stamp matches, so nothing is
    installed): --list and a report of the committed results; a run is refused in one line."""
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is not installed")
    reach = subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "test", "-x",
                            str(REPO / "inv")], capture_output=True)
    if reach.returncode != 0:
        pytest.skip(f"{REPO} is not reachable by a normal user here (a parent directory is root's alone)")
    home = Path(tempfile.mkdtemp(prefix="schedlab-nobody-"))   # pytest's tmp_path is root's alone
    try:
        shutil.chown(home, "nobody")
        env = {"HOME": str(home), "MPLCONFIGDIR": str(home)}
        listed = inv("--list", env=env, user="nobody")
        assert listed.returncode == 0 and "report" in listed.stdout, listed.stderr
        out = home / "report"
        rep = inv("report", str(MINI), "--out", str(out), env=env, user="nobody")
        assert rep.returncode == 0, rep.stderr[-2000:]
        assert (out / "report.md").exists() and (out / "speedup.png").exists()
        refused = inv("run", "-c", str(REPO / "configs" / "demo.yaml"), env=env, user="nobody")
        assert refused.returncode == 2
        assert refused.stderr.strip().splitlines() == [
            f"error: ./inv run builds a Mininet network, which needs root: sudo ./inv run -c {REPO}/configs/demo.yaml"]
    finally:
        shutil.rmtree(home)
