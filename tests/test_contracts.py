"""The shared contracts: role specs read old run directories and are written as before, one
rule for the measured iterations, and contracts/ stays a leaf package."""
from __future__ import annotations

import ast
import sys

import numpy as np
import pandas as pd
import pytest
import yaml
from pydantic import ValidationError

from contracts.iterations import first_measured, measured
from contracts.role_spec import Address, RoleSpec, role_specs
from tests.conftest import REPO

MINI = REPO / "tests" / "data" / "results" / "mini"
ROLE_FILES = sorted(MINI.glob("*/roles/*.json"))


@pytest.mark.parametrize("path", ROLE_FILES, ids=lambda p: f"{p.parents[1].name}/{p.stem}")
def test_committed_role_specs_read_and_write_back_unchanged(path):
    text = path.read_text()
    spec = RoleSpec.model_validate_json(text)
    assert spec.name == path.stem and spec.to_json() == text


def test_the_runner_writes_what_a_committed_run_holds():
    """emu/runner.py's specs for the mini run's config are its roles/*.json, byte for byte."""
    from emu.config import validate_experiment
    from emu.runner import role_specs as runner_specs
    from tasks import _sections

    run_dir = next(p for p in sorted(MINI.iterdir()) if p.is_dir())
    old = {p.stem: RoleSpec.model_validate_json(p.read_text()) for p in (run_dir / "roles").glob("*.json")}
    exp = validate_experiment(yaml.safe_load((run_dir / "config.yaml").read_text()), _sections())
    ips = {a.host: a.ip for s in old.values() for a in s.servers + s.workers}
    written = runner_specs(exp, ips, next(iter(old.values())).out_dir)
    assert sorted(name for name, _, _ in written) == sorted(old)
    for name, host, spec in written:
        assert host == spec.address.host
        assert spec.to_json() == (run_dir / "roles" / f"{name}.json").read_text()


def test_role_specs_one_per_role_servers_first():
    srv = [Address(host="ps", ip="10.0.0.1", port=29500)]
    wrk = [Address(host=f"w{i}", ip=f"10.0.0.{i + 2}", port=29600 + i) for i in range(2)]
    specs = role_specs(srv, wrk, seed=3, scheduler="fifo", params={}, workload={"iterations": 2}, out_dir="/r")
    assert [(s.name, s.module, s.iface) for s in specs] == [
        ("server0", "schedulers.server", "ps-eth0"), ("worker0", "workloads.worker", "w0-eth0"),
        ("worker1", "workloads.worker", "w1-eth0")]
    assert specs[2].address == wrk[1] and specs[0].topology is None and not specs[0].trace
    lo = role_specs([], wrk, seed=0, scheduler="ring", params={}, workload={}, out_dir="/r", iface="lo")
    assert {s.iface for s in lo} == {"lo"} and [s.role for s in lo] == ["worker", "worker"]


def test_a_spec_that_names_no_such_role_or_field_is_refused():
    spec = RoleSpec.model_validate_json(ROLE_FILES[0].read_text())
    data = spec.model_dump(mode="json")
    with pytest.raises(ValidationError, match="rank 5"):
        RoleSpec.model_validate({**data, "rank": 5})
    with pytest.raises(ValidationError, match="extra"):
        RoleSpec.model_validate({**data, "worker_port": 1})


@pytest.mark.parametrize("warmup,iterations,first", [(2, 12, 2), (0, 5, 0), (11, 12, 11), (12, 12, 11),
                                                     (40, 3, 2), (3, 1, 0)])
def test_warmup_is_left_out_but_the_last_iteration_always_measured(warmup, iterations, first):
    assert first_measured(warmup, iterations) == first
    its = np.arange(iterations)
    assert list(its[measured(its, warmup, iterations)]) == list(range(first, iterations))
    s = pd.Series(its)
    assert s[measured(s, warmup, iterations)].tolist() == list(range(first, iterations))
    assert measured(iterations - 1, warmup, iterations) is True


def test_contracts_import_only_the_standard_library_and_pydantic():
    for path in (REPO / "contracts").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                assert top in sys.stdlib_module_names or top in ("pydantic", "contracts"), f"{path.name}: {name}"
