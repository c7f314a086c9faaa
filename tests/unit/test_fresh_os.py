"""`./inv fresh-os`: the README's commands pass on a freshly installed Debian 12 (emu/testbed/freshos.py).

The end-to-end test (tests/mininet/test_fresh_os_run.py) takes minutes (the root file system,
the set-up, the demo and the fast tier): it is in the root tier and marked slow, so
`./inv test --fast` leaves it out.
"""
from __future__ import annotations

import os
import re

from emu.testbed import freshos
from tests.conftest import REPO

HOST = {"PIP_FIND_LINKS": "/opt/wheels", "PIP_CONFIG_FILE": "/etc/pip.conf", "PIP_CONSTRAINT": "/etc/c.txt",
        "PIP_CERT": "/etc/ssl/certs/ca-certificates.crt", "HTTPS_PROXY": "http://proxy:3128", "no_proxy": "localhost",
        "VIRTUAL_ENV": "/work/main/.venv", "PYTHONPATH": "/work/main", "SCHEDLAB_VENV": "/elsewhere"}


def test_inside_gets_the_networks_settings_and_not_this_machines_pip_configuration():
    env = freshos.inside_env(HOST, wheels=freshos.WHEELS)
    assert env["PIP_CONFIG_FILE"] == os.devnull
    assert "PIP_FIND_LINKS" not in env and "PIP_CONSTRAINT" not in env
    assert env["PIP_CERT"] == HOST["PIP_CERT"] and env["HTTPS_PROXY"] == HOST["HTTPS_PROXY"]
    assert env["no_proxy"] == "localhost"
    assert not {"VIRTUAL_ENV", "PYTHONPATH", "SCHEDLAB_VENV"} & set(env)
    assert env["SCHEDLAB_TORCH_INDEX"] == str(freshos.WHEELS) and env["HOME"] == "/root"


def test_the_cached_root_file_system_is_keyed_by_what_it_is_built_from():
    assert freshos.cache_key(("python3",)) == freshos.cache_key(["python3"])
    assert freshos.cache_key(("python3",)) != freshos.cache_key(("python3", "git"))
    argv = freshos.mmdebstrap_argv(freshos.CACHE / "x.tar")
    assert argv[:2] == ["mmdebstrap", "--variant=minbase"] and argv[-2:] == ["bookworm", str(freshos.CACHE / "x.tar")]


def test_the_steps_are_the_readmes_commands():
    readme = (REPO / "README.md").read_text()
    quick = readme[readme.index("## Quick start"):readme.index("## What the demo shows")]
    first, second = re.findall(r"^\./inv \w+$", quick, re.M)[:2]
    doctor = ["./inv", "doctor"]   # between them: the machine check the README points to
    assert [s.argv for s in freshos.steps()] == [first.split(), doctor, second.split() + ["--fast"]]
    assert [s.argv for s in freshos.steps(full=True)] == [first.split(), doctor, second.split()]


def test_a_run_on_a_machine_without_git_records_an_unknown_version(tmp_path, monkeypatch):
    """The tree inside is an archive and the fresh machine has no git (nor would a user's who
    downloaded one): meta.json says the version is unknown instead of the run failing."""
    from emu.run.runner import environment

    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("SCHEDLAB_GIT_SHA", raising=False)
    env = environment()
    assert env["git_sha"] is None and env["git_dirty"] is False


