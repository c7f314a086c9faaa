"""Repository contracts: CI runs the README's test command, pins are exact, Vagrantfile parses."""
from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from tests.conftest import REPO


def quick_start_commands() -> list[str]:
    readme = (REPO / "README.md").read_text()
    section = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```\n(.*?)```", section, re.S).group(1)
    return [line.strip() for line in block.splitlines() if line.strip()]


def test_readme_has_two_commands_and_ci_runs_the_test_one():
    cmds = quick_start_commands()
    assert len(cmds) == 2, cmds
    ci = [ln.strip() for ln in (REPO / ".ci" / "run").read_text().splitlines()
          if ln.strip() and not ln.startswith("#") and not ln.startswith(("set ", "cd "))]
    assert cmds[1] in ci, (cmds, ci)


def test_requirements_are_pinned():
    for line in (REPO / "requirements.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            assert re.fullmatch(r"[A-Za-z0-9_.\-\[\]]+==[0-9][^\s;]*", line), f"not pinned exactly: {line}"


@pytest.mark.skipif(not (shutil.which("vagrant") or shutil.which("ruby")), reason="neither vagrant nor ruby here")
def test_vagrantfile_syntax():
    if shutil.which("vagrant"):
        r = subprocess.run(["vagrant", "validate"], cwd=REPO, capture_output=True, text=True)
    else:
        r = subprocess.run(["ruby", "-c", "Vagrantfile"], cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
