"""Repository hygiene: ruff finds nothing, the lock covers pyproject.toml, tests sit in their tiers' folders.

ruff's rules and exclusions are in pyproject.toml ([tool.ruff]); `python -m ruff check .`
shows the same findings, and `--fix` repairs those marked [*].
"""
from __future__ import annotations

import ast
import importlib.util
import re
import subprocess
import sys
import tomllib

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.conftest import REPO


def test_ruff_finds_nothing():
    assert importlib.util.find_spec("ruff"), "ruff is not installed here: ./inv installs requirements.txt into .venv"
    r = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format=concise", "."],
                       cwd=REPO, capture_output=True, text=True, timeout=120)
    if r.returncode:
        pytest.fail(f"ruff check . (settings: pyproject.toml):\n{r.stdout}{r.stderr}", pytrace=False)


# Optional groups with a lock of their own (installed on demand, e.g. by the first --ray).
OWN_LOCK = {"ray": "requirements-ray.txt", "jupyter": "requirements-jupyter.txt"}


def locked(name: str = "requirements.txt") -> dict[str, str]:
    pins = {}
    for line in (REPO / name).read_text().splitlines():
        m = re.match(r"([A-Za-z0-9_.\-]+)==(\S+)", line)
        if m:
            pins[canonicalize_name(m[1])] = m[2]
    return pins


def test_lock_pins_every_direct_dependency_within_its_range():
    """requirements.txt is compiled from pyproject.toml (the command is in its header): a
    dependency added or changed there without compiling again is caught here. A group in
    OWN_LOCK is checked against its own lock instead."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    direct = [(d, "requirements.txt") for d in project["dependencies"]]
    direct += [(d, OWN_LOCK.get(group, "requirements.txt"))
               for group, deps in project["optional-dependencies"].items() for d in deps]
    problems = []
    for text, lock in direct:
        req = Requirement(text)
        version = locked(lock).get(canonicalize_name(req.name))
        if version is None:
            problems.append(f"{req.name}: not in {lock}")
        elif not req.specifier.contains(version, prereleases=True):
            problems.append(f"{req.name}=={version} in {lock} is outside pyproject.toml's {req.specifier}")
    assert not problems, "compile the lock again (command in its header):\n" + "\n".join(problems)


def test_optional_locks_agree_with_the_main_lock():
    """requirements-ray.txt is compiled with requirements.txt as a constraint: installing it
    into the environment never moves a package the harness runs on."""
    main = locked()
    for lock in OWN_LOCK.values():
        header = (REPO / lock).read_text().split("\n\n")[0]
        assert "--constraint=requirements.txt" in header, f"{lock}: not compiled against requirements.txt"
        moved = {n: (v, main[n]) for n, v in locked(lock).items() if n in main and main[n] != v}
        assert not moved, f"{lock} pins differently from requirements.txt: {moved}"


def test_each_optional_lock_is_compiled_from_its_own_extra():
    """An optional lock's header command compiles exactly its group (--extra=GROUP, no other
    extra) into that file, and the lock pins every package of the group: a lock compiled from
    another extra, or with dev's packages in it, would install what ./inv notebook or --ray
    never asked for."""
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for group, lock in OWN_LOCK.items():
        command = next(line for line in (REPO / lock).read_text().splitlines() if "pip-compile --" in line)
        assert re.findall(r"--extra=(\S+)", command) == [group], f"{lock}: {command}"
        assert f"--output-file={lock}" in command, f"{lock}: {command}"
        pins = locked(lock)
        missing = [d for d in extras[group] if canonicalize_name(Requirement(d).name) not in pins]
        assert not missing, f"{lock} lacks {missing}"
        others = {canonicalize_name(Requirement(d).name) for g, ds in extras.items() if g != group for d in ds}
        assert not others & (pins.keys() - locked().keys()), f"{lock} pins another group's packages"


def test_lock_has_the_cpu_torch_and_no_cuda_packages():
    pins = locked()
    assert pins["torch"].endswith("+cpu"), pins["torch"]
    cuda = sorted(n for n in pins if n.startswith(("nvidia-", "triton", "cuda")))
    assert not cuda, f"CUDA packages in the lock (was it compiled where only the CUDA torch was found?): {cuda}"


def test_tiers_are_folders_and_no_test_module_imports_another():
    """Every test module sits in a tier's folder (tests/conftest.py marks it from there); `slow` is on the
    tests themselves, not in a list of node ids; test modules share helpers through tests/factories.py and the
    other modules at the top of tests/, never by importing another test module."""
    tests = REPO / "tests"
    stray = [str(p.relative_to(REPO)) for p in tests.rglob("test_*.py")
             if p.parent.name not in ("unit", "loopback", "mininet") and "data" not in p.relative_to(tests).parts]
    assert not stray, f"test modules outside tests/unit, tests/loopback and tests/mininet: {stray}"
    ids = re.findall(r"tests/[\w/]+\.py::\w+", (tests / "conftest.py").read_text())
    assert not ids, f"tests/conftest.py names tests by id (mark them instead): {ids}"
    imports = []
    for p in tests.rglob("*.py"):
        for node in ast.walk(ast.parse(p.read_text())):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else \
                [a.name for a in node.names] if isinstance(node, ast.Import) else []
            imports += [f"{p.relative_to(REPO)}: {n}" for n in names if re.search(r"(^|\.)test_\w+$", n)]
    assert not imports, f"test modules imported by other modules: {imports}"
