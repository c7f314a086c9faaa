"""The Vagrantfile validates (installs vagrant where it is missing, so it needs root)."""
from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from tests.conftest import REPO


def apt_install(package: str) -> None:
    """Debian's package without its recommends (for vagrant they are libvirt and qemu: minutes, not seconds);
    the package lists are refreshed only when apt does not know the package."""
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    cmd = ["apt-get", "install", "-y", "-q", "--no-install-recommends", package]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    if r.returncode != 0 and "Unable to locate package" in r.stderr:
        subprocess.run(["apt-get", "update", "-q"], capture_output=True, text=True, env=env, timeout=600)
        r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, f"apt-get install {package} failed:\n{r.stdout[-2000:]}{r.stderr[-2000:]}"


@pytest.mark.slow
def test_vagrantfile_syntax(tmp_path):
    """`vagrant validate --ignore-provider` checks the whole configuration without VirtualBox or libvirt
    (neither can run a VM on the reference machine). It runs on a copy, since it leaves a .vagrant/ beside the
    Vagrantfile."""
    if shutil.which("vagrant") is None:
        apt_install("vagrant")
    shutil.copy(REPO / "Vagrantfile", tmp_path / "Vagrantfile")
    env = {**os.environ, "VAGRANT_HOME": str(tmp_path / "vagrant.d"), "VAGRANT_CHECKPOINT_DISABLE": "1"}
    r = subprocess.run(["vagrant", "validate", "--ignore-provider"], cwd=tmp_path, capture_output=True, text=True,
                       env=env, timeout=120)
    assert r.returncode == 0 and "validated successfully" in r.stdout, r.stdout + r.stderr
