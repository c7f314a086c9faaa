"""What a user's machine meets before any experiment: `./inv` refuses an unsupported Python in one
line before any set-up, an unreachable index for torch's CPU build is one line within seconds,
and (tests/mininet/test_install_normal_user.py) a normal user (no root, no network built) lists
the tasks and writes a report of committed results, while a task that builds a network says it
needs root."""
from __future__ import annotations

import os
import subprocess
import time

import pytest

from tests.conftest import REPO, inv


def test_an_unsupported_python_is_one_line_before_any_set_up(tmp_path):
    fake = tmp_path / "python3"
    fake.write_text("#!/bin/sh\nif [ \"$1\" = -c ]; then case \"$2\" in *print*) echo 3.10; exit 0;; esac; "
                    "exit 1; fi\nexit 1\n")
    fake.chmod(0o755)
    venv = tmp_path / "venv"
    r = inv("--list", env={"SCHEDLAB_PYTHON": str(fake), "SCHEDLAB_VENV": str(venv)})
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: schedlab needs Python >=3.11,<3.12"), r.stderr
    assert "found 3.10" in lines[0]
    assert not venv.exists()  # nothing was set up


@pytest.mark.slow
def test_an_unreachable_torch_index_is_one_line_within_seconds(tmp_path):
    """A fresh environment whose pip has no configuration of its own, torch's index on a
    closed loopback port: set-up stops at torch with one line naming the index."""
    venv = tmp_path / "venv"
    env = {"SCHEDLAB_VENV": str(venv), "PIP_CONFIG_FILE": os.devnull, "PIP_FIND_LINKS": "",
           "SCHEDLAB_TORCH_INDEX": "http://127.0.0.1:9/simple"}
    t0 = time.monotonic()
    r = subprocess.run([str(REPO / "scripts" / "setup.sh"), "--venv-only"], env={**os.environ, **env},
                       capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    took = time.monotonic() - t0
    assert r.returncode == 1
    said = [ln for ln in r.stderr.splitlines() if ln.startswith("setup:")]
    assert said[-1].startswith("setup: the index for torch's CPU build (torch==") and "127.0.0.1:9" in said[-1], \
        r.stderr
    assert "SCHEDLAB_TORCH_INDEX" in said[-1]
    assert took < 60, took   # seconds, not minutes of retries (most of it is making the venv)


