"""Repository contracts: CI runs the README's test command, pins are exact; the Vagrantfile: tests/mininet/."""
from __future__ import annotations

import re
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


def test_no_file_cites_an_issue_number():
    """A reader of the repository cannot look up an issue by its number: say what the thing is, or where it
    is measured."""
    try:
        files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                               capture_output=True, text=True, check=True).stdout.split("\n")
    except (OSError, subprocess.CalledProcessError):  # no git (the fresh OS), or a copy without .git
        skip = {".git", ".venv", "results", "__pycache__", ".hypothesis", ".pytest_cache", ".ruff_cache"}
        files = [str(p.relative_to(REPO)) for p in REPO.rglob("*")
                 if p.is_file() and not skip & set(p.relative_to(REPO).parts)]
    pattern = re.compile(r"\bissues? #?\d+", re.I)
    hits = []
    for name in files:
        path = REPO / name
        if not name or name.startswith("results/") or not path.is_file() or path.stat().st_size > 2_000_000:
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        hits += [f"{name}:{i}: {line.strip()[:100]}" for i, line in enumerate(text.splitlines(), 1)
                 if pattern.search(line)]
    assert not hits, "lines citing an issue number:\n" + "\n".join(hits)


@pytest.mark.parametrize("module", ["emu.run.runner", "emu.sweeps.raysweep", "emu.testbed.freshos", "workloads.config",
                                    "workloads.local", "tasks"])
def test_a_modules_repo_is_the_repository_root(module):
    """Roles are launched with cwd and PYTHONPATH at REPO, Ray ships REPO, the fresh OS copies it:
    a module moved one package deeper must still find the root."""
    import importlib

    assert importlib.import_module(module).REPO == REPO
