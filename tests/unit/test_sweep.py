"""Sweep files (base, set, grid, zip, seeds, repeats), shards and merging (kill -9 and resume: tests/mininet/)."""
from __future__ import annotations

import pandas as pd
import pytest
import yaml

from emu.config.experiment import ConfigError
from emu.config.plan import load_plan
from emu.run.results import merge, record_run
from emu.sweeps import sweep as sweep_module
from emu.sweeps.sweep import shard_of, unique_runs
from tasks import _sections
from tests.conftest import REPO, invoke
from tests.factories import GOOD, dump


def test_base_set_grid_zip_seeds(tmp_path):
    dump(tmp_path / "base.yaml", {**GOOD, "grid": {"scheduler": ["fifo"]}})
    sweep = dump(tmp_path / "sweep.yaml", {
        "base": "base.yaml", "name": "s", "set": {"workload.iterations": 4},
        "grid": {"scheduler": ["fifo", "bytescheduler"]},
        "zip": {"workload.batch_size": [8, 16, 32], "topology.hosts.1.bw_mbps": [5, 10, 20]},
        "seeds": [0, 1], "repeats": 3})
    plan = load_plan(sweep, _sections())
    assert plan.name == "s" and plan.repeats == 3
    assert len(plan.experiments) == 2 * 2 * 3  # scheduler x seed x zip
    pairs = {(e.workload["batch_size"], e.net.rate("w0", "s1")) for e in plan.experiments}
    assert pairs == {(8, 5), (16, 10), (32, 20)}
    assert {e.workload["iterations"] for e in plan.experiments} == {4}
    ids = [e.run_id(r) for e in plan.experiments for r in range(3)]
    assert len(set(ids)) == 36


@pytest.mark.parametrize("sweep,message", [
    ({"base": "base.yaml", "zip": {"seed": [1, 2], "workload.batch_size": [8]}},
     "zip: lists must have equal lengths (seed has 2, workload.batch_size has 1)"),
    ({"base": "base.yaml", "gird": {"seed": [1]}}, "gird: unknown key in a sweep file"),
    ({"base": "base.yaml", "grid": {"seed": []}}, "grid.seed: must be a non-empty list of values"),
    ({"base": "base.yaml", "grid": {"workload.batch_size": ["big"]}},
     "workload.batch_size: must be an integer, got 'big' (grid point workload.batch_size='big')"),
    ({"base": "base.yaml", "seeds": [-1]}, "seeds: must be a non-empty list of integers >= 0, got [-1]"),
    ({"base": "missing.yaml"}, "missing.yaml: no such file"),
    # hostile sweep files: refused before anything is expanded
    ({"base": "/dev/zero"}, "/dev/zero: not a regular file (a device, FIFO or socket)"),
    ({"base": "."}, ": is a directory, not a file"),
    ({"base": "base.yaml", "set": {"workload.lr": float("inf")}}, "set.workload.lr: must be a finite number, got inf"),
    ({"base": "base.yaml", "set": {1: 2}}, "set: keys must be strings, got 1 (quote it)"),
    ({"base": "base.yaml", "set": {".".join(["a"] * 40): 1}}, "a key of more than 32 levels"),
    ({"base": "base.yaml", "grid": {f"workload.x{i}": list(range(10)) for i in range(10)}},
     "grid: 10000000000 runs (workload.x0: 10, workload.x1: 10, workload.x2: 10, workload.x3: 10, workload.x4: 10, "
     "workload.x5: 10, workload.x6: 10, workload.x7: 10, workload.x8: 10, workload.x9: 10); a plan has at most 5000"),
    ({"base": "base.yaml", "seeds": list(range(100)), "zip": {"workload.batch_size": list(range(1, 101))},
      "repeats": 2}, "grid: 20000 runs (seed: 100, zip: 100, repeats: 2); a plan has at most 5000"),
])
def test_bad_sweep_files(tmp_path, sweep, message):
    dump(tmp_path / "base.yaml", GOOD)
    with pytest.raises(ConfigError) as e:
        load_plan(dump(tmp_path / "sweep.yaml", sweep), _sections())
    assert message in str(e.value)


def test_sweep_base_is_read_bounded(tmp_path):
    """The base file gets the same limits as the sweep file: an alias bomb stops while read."""
    bomb = "".join(f"  a{i}: &a{i} [" + ", ".join([f"*a{i - 1}" if i else "x"] * 10) + "]\n" for i in range(10))
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(GOOD) + "x:\n" + bomb)
    with pytest.raises(ConfigError) as e:
        load_plan(dump(tmp_path / "sweep.yaml", {"base": "base.yaml"}), _sections())
    assert str(e.value).startswith(f"{tmp_path / 'base.yaml'}: line ")
    assert str(e.value).endswith(": more than 50000 values once aliases are expanded (an alias bomb?)")


def test_grid_points_share_the_base_config(tmp_path):
    """Each grid point copies only what it changes: the base is not copied per point, and a
    point never leaks into the next."""
    plan = load_plan(dump(tmp_path / "g.yaml", {**GOOD, "grid": {
        "topology.hosts.1.bw_mbps": [5, 7], "workload.batch_size": [8, 16]}}), _sections())
    assert [(e.net.rate("w0", "s1"), e.workload["batch_size"]) for e in plan.experiments] == \
        [(5, 8), (5, 16), (7, 8), (7, 16)]
    assert {e.net.rate("w1", "s1") for e in plan.experiments} == {10}


@pytest.mark.slow
def test_cli_bad_sweep_exit_2_nothing_run(tmp_path):
    dump(tmp_path / "base.yaml", GOOD)
    r = invoke("sweep", str(dump(tmp_path / "s.yaml", {"base": "base.yaml", "grid": {}, "zip": {"a": 1}})),
               "--results", str(tmp_path / "r"), timeout=60)
    assert r.returncode == 2 and r.stderr.strip() == "error: zip.a: must be a non-empty list of values"
    assert not (tmp_path / "r").exists()
    r = invoke("sweep", str(tmp_path / "base.yaml"), "--shard", "4/4", "--results", str(tmp_path / "r"), timeout=60)
    assert r.returncode == 2 and r.stderr.strip() == "error: --shard '4/4': need 0 <= i < n"


def test_grid_points_that_are_one_experiment_run_once(tmp_path, capsys):
    """fifo ignores mercury's packet size, so a grid over both has 3 experiments, not 4."""
    plan = load_plan(dump(tmp_path / "g.yaml", {**GOOD, "grid": {
        "scheduler": ["fifo", "mercury"], "schedulers.mercury.packet_bytes": [4096, 16384]}}), _sections())
    todo = [(e, 0, p) for e, p in zip(plan.experiments, plan.points, strict=True)]
    kept = unique_runs(todo)
    assert [(e.scheduler, e.scheduler_params) for e, _, _ in kept] == [
        ("fifo", {}), ("mercury", {"packet_bytes": 4096}), ("mercury", {"packet_bytes": 16384})]
    assert "the same experiment as" in capsys.readouterr().err


def test_run_plan_checks_the_machine_before_anything(tmp_path, monkeypatch):
    """Library users of run_plan get preflight too: a plan this kernel cannot run is refused
    before cleanup, the state directory or any run."""
    plan = load_plan(dump(tmp_path / "c.yaml", {**GOOD, "tcp": {"congestion_control": "nosuchcc"}}), _sections())
    for name in ("completed", "clean", "StateDir", "run_one"):
        monkeypatch.setattr(sweep_module, name, lambda *a, _n=name, **k: pytest.fail(f"{_n} before preflight"))
    with pytest.raises(ConfigError, match=r"^tcp\.congestion_control: 'nosuchcc' is not available in this kernel"):
        sweep_module.run_plan(plan, tmp_path / "results")
    assert not (tmp_path / "results").exists()


def test_shards_are_disjoint_and_complete():
    todo = list(range(23))
    shards = [shard_of(todo, (i, 4)) for i in range(4)]
    assert sorted(x for s in shards for x in s) == todo
    assert shard_of(todo, None) == todo


def test_merge_concatenates_and_prefers_ok(tmp_path):
    a, b, into = tmp_path / "a", tmp_path / "b", tmp_path / "into"
    record_run(a, {"run_id": "r1", "status": "ok", "x": 1.0})
    record_run(a, {"run_id": "r2", "status": "failed", "x": 2.0})
    record_run(b, {"run_id": "r2", "status": "ok", "x": 3.0})
    (a / "r1").mkdir()
    (a / "r1" / "iterations.parquet").write_text("x")
    assert merge([a, b], into) == 2
    runs = pd.read_parquet(into / "runs.parquet").set_index("run_id")
    assert runs.loc["r2", "status"] == "ok" and runs.loc["r2", "x"] == 3.0
    assert (into / "r1" / "iterations.parquet").exists()


def test_a_plan_parses_each_trace_file_once(tmp_path, monkeypatch):
    """Five grid points share the time-varying example's two traces: each is parsed once per
    plan (the model is validated twice per experiment), not once per validation."""
    from emu.config.shaping import CsvTrace, Mahimahi

    calls = []
    for cls in (Mahimahi, CsvTrace):
        original = cls._parse
        monkeypatch.setattr(cls, "_parse", lambda self, text, _o=original: calls.append(1) or _o(self, text))
    sweep = tmp_path / "s.yaml"
    sweep.write_text(yaml.safe_dump({"base": str(REPO / "configs" / "examples" / "time_varying.yaml"),
                                     "seeds": [0, 1, 2, 3, 4]}))
    assert len(load_plan(sweep, _sections()).experiments) == 5
    assert len(calls) == 2
