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

from contracts.iterations import NoMeasuredIteration, first_measured, measured, windows
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
    """emu/run/runner.py's specs for the mini run's config are its roles/*.json, byte for byte."""
    from emu.config.experiment import validate_experiment
    from emu.run.runner import role_specs as runner_specs
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
        ("server0", "workloads.server", "ps-eth0"), ("worker0", "workloads.worker", "w0-eth0"),
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


@pytest.mark.parametrize("warmup,iterations", [(2, 12), (0, 5), (11, 12), (0, 1)])
def test_warmup_is_left_out_and_every_other_iteration_measured(warmup, iterations):
    assert first_measured(warmup, iterations) == warmup
    its = np.arange(iterations)
    assert list(its[measured(its, warmup, iterations)]) == list(range(warmup, iterations))
    s = pd.Series(its)
    assert s[measured(s, warmup, iterations)].tolist() == list(range(warmup, iterations))
    assert int(measured(s, warmup, iterations).sum()) == iterations - warmup


@pytest.mark.parametrize("warmup,iterations", [(12, 12), (40, 3), (1, 1), (-1, 3)])
def test_a_run_that_would_measure_no_iteration_is_refused(warmup, iterations):
    with pytest.raises(NoMeasuredIteration, match=f"warmup \\({warmup}\\).*iterations \\({iterations}\\)"):
        first_measured(warmup, iterations)


def test_iteration_windows_tile_the_run_and_end_when_the_aggregates_are_applied():
    # forward passes at 0, 10, 20; aggregates of iteration 0 applied at 13 (during forward 1),
    # of 1 at 22, of the last after the loop at 31
    assert windows([0.0, 10.0, 20.0], [13.0, 22.0, 31.0]) == [(0.0, 13.0), (13.0, 22.0), (22.0, 31.0)]
    with pytest.raises(ValueError, match="2 forward passes but 1"):
        windows([0.0, 1.0], [2.0])
    with pytest.raises(ValueError, match="iteration 1: applied at 1.0 before it began at 2.0"):
        windows([0.0, 1.0], [2.0, 1.0])


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
