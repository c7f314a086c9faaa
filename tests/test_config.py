"""Config validation: every bad input is one line naming the field, exit 2, nothing created."""
from __future__ import annotations

import copy

import pytest
import yaml

from emu.config import ConfigError, load_plan, set_dotted
from schedulers import registry
from workloads.config import MODELS
from tasks import _sections
from tests.conftest import REPO, invoke

GOOD = {
    "name": "t",
    "topology": {"kind": "star", "hosts": [{"name": "ps", "bw_mbps": 100}, {"name": "w0", "bw_mbps": 10},
                                           {"name": "w1", "bw_mbps": 10}]},
    "roles": {"servers": ["ps"], "workers": ["w0", "w1"]},
    "workload": {"model": "cnn", "preset": "tiny", "iterations": 3},
    "scheduler": "fifo",
}


def write(tmp_path, cfg, name="c.yaml"):
    p = tmp_path / name
    p.write_text(yaml.safe_dump(cfg))
    return p


def variant(key, value):
    cfg = copy.deepcopy(GOOD)
    set_dotted(cfg, key, value)
    return cfg


BAD = [
    (variant("topology.hosts.1.bw_mbps", -5), "topology.hosts[1].bw_mbps: must be > 0"),
    (variant("topology.hosts.1.bw_mbps", "fast"), "topology.hosts[1].bw_mbps: must be a number, got 'fast'"),
    (variant("topology.hosts.2.name", "w0"), "topology.hosts[2].name: host name 'w0' is used twice"),
    (variant("topology.hosts.0.colour", "red"), "topology.hosts[0].colour: unknown key"),
    (variant("topology.queue_ms", 0), "topology.queue_ms: must be > 0"),
    (variant("bogus", 1), "bogus: unknown key"),
    (variant("topology.kind", "ring"), "topology.kind: unknown kind 'ring' (known: star, racks, graph)"),
    (variant("roles.workers.1", "w9"), "roles.workers[1]: 'w9' is not a host of the topology"),
    (variant("workload.iterations", 0), "workload.iterations: must be > 0"),
    (variant("workload.batch_size", 2.5), "workload.batch_size: must be an integer, got 2.5"),
    (variant("workload.model", "gpt9"), "workload.model: must be one of {models}, got 'gpt9'"),
    (variant("workload.lr_typo", 1), "workload.lr_typo: unknown key"),
    (variant("scheduler", "magic"), "scheduler: unknown scheduler 'magic' (known: {schedulers})"),
    (variant("schedulers.bytescheduler.credit_numel", -1), "schedulers.bytescheduler.credit_numel: must be > 0"),
    (variant("schedulers.fifo.window", 3), "schedulers.fifo.window: unknown key"),
    (variant("grid", {"scheduler": []}), "grid.scheduler: must be a non-empty list of values"),
    (variant("grid", {"workload.iterations": [2, -1]}),
     "workload.iterations: must be > 0 (grid point workload.iterations=-1)"),
    (variant("repeats", 0), "repeats: must be an integer >= 1, got 0"),
    (variant("roles.servers", []), "roles.servers: scheduler 'fifo' needs at least one parameter server"),
]


@pytest.mark.parametrize("cfg,message", BAD, ids=[m.split(":")[0] for _, m in BAD])
def test_bad_config_names_the_field(tmp_path, cfg, message):
    with pytest.raises(ConfigError) as e:
        load_plan(write(tmp_path, cfg), _sections())
    # The lists of known models and schedulers grow; the message must list them all.
    names = [repr(m) for m in MODELS]
    models = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]
    assert str(e.value) == message.format(models=models, schedulers=", ".join(sorted(registry.SCHEDULERS)))


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match=r"nope\.yaml: no such file"):
        load_plan(tmp_path / "nope.yaml", _sections())


def test_not_yaml(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("name: [unclosed\n")
    with pytest.raises(ConfigError, match=r"c\.yaml: line \d+: not valid YAML"):
        load_plan(p, _sections())


def test_defaults_and_grid(tmp_path):
    cfg = variant("grid", {"scheduler": ["fifo", "bytescheduler"]})
    plan = load_plan(write(tmp_path, cfg), _sections(), overrides=["workload.iterations=7"])
    assert [e.scheduler for e in plan.experiments] == ["fifo", "bytescheduler"]
    bs = plan.experiments[1]
    assert bs.scheduler_params == {"partition_numel": 1_000_000, "credit_numel": 4_000_000}
    assert bs.workload["iterations"] == 7 and bs.workload["batch_size"] == 32
    # run ids: stable, distinct per experiment and per repeat
    assert bs.run_id(0) == load_plan(write(tmp_path, cfg), _sections(), ["workload.iterations=7"]) \
        .experiments[1].run_id(0)
    assert len({e.run_id(r) for e in plan.experiments for r in (0, 1)}) == 4


def test_unrelated_scheduler_section_does_not_change_run_id(tmp_path):
    a = load_plan(write(tmp_path, GOOD), _sections()).experiments[0]
    b = load_plan(write(tmp_path, variant("schedulers.bytescheduler.credit_numel", 5)), _sections()).experiments[0]
    assert a.run_id(0) == b.run_id(0)


def test_bad_override(tmp_path):
    with pytest.raises(ConfigError, match=r"--set 'iterations': expected key=value"):
        load_plan(write(tmp_path, GOOD), _sections(), overrides=["iterations"])


@pytest.mark.parametrize("cfg,message", [BAD[0], BAD[2], BAD[4]], ids=["negative-bw", "dup-host", "unknown-key"])
def test_cli_bad_config_one_line_exit_2_nothing_created(tmp_path, cfg, message):
    results = tmp_path / "results"
    r = invoke("run", str(write(tmp_path, cfg)), "--results", str(results), timeout=60)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip() == f"error: {message}"
    assert "Traceback" not in r.stdout + r.stderr
    assert not results.exists()


def test_cli_missing_file(tmp_path):
    r = invoke("run", str(tmp_path / "missing.yaml"), "--results", str(tmp_path / "r"), timeout=60)
    assert r.returncode == 2
    assert r.stderr.strip() == f"error: {tmp_path / 'missing.yaml'}: no such file"
    assert not (tmp_path / "r").exists()


def test_demo_config_is_valid():
    plan = load_plan(REPO / "configs" / "demo.yaml", _sections())
    assert {e.scheduler for e in plan.experiments} == {"fifo", "bytescheduler"}
    rates = [h.bw_mbps for h in plan.experiments[0].topology.hosts]
    assert len(set(rates)) == len(rates), "the demo's links must differ per host"


@pytest.mark.parametrize("path", sorted(p.relative_to(REPO) for p in (REPO / "configs").rglob("*.yaml")), ids=str)
def test_every_shipped_config_is_valid(path):
    plan = load_plan(REPO / path, _sections())
    assert plan.experiments


def test_run_id_ignores_unused_optional_features(tmp_path):
    """A harness version that adds an optional feature must not re-run finished sweeps."""
    plain = load_plan(write(tmp_path, GOOD), _sections()).experiments[0]
    explicit = load_plan(write(tmp_path, {**GOOD, "host_cpu": {}, "shaping": [], "cross_traffic": []}),
                         _sections()).experiments[0]
    changed = load_plan(write(tmp_path, {**GOOD, "host_cpu": {"w0": 0.5}}), _sections()).experiments[0]
    assert plain.run_id(0) == explicit.run_id(0) != changed.run_id(0)


def test_congestion_control_defaults_to_cubic_and_must_exist(tmp_path):
    exp = load_plan(write(tmp_path, GOOD), _sections()).experiments[0]
    assert exp.tcp.congestion_control == "cubic" and exp.resolved()["tcp"] == {"congestion_control": "cubic"}
    reno = load_plan(write(tmp_path, variant("tcp.congestion_control", "reno")), _sections()).experiments[0]
    assert reno.run_id(0) != exp.run_id(0)
    with pytest.raises(ConfigError) as e:
        load_plan(write(tmp_path, variant("tcp.congestion_control", "nosuchcc")), _sections())
    assert str(e.value).startswith("tcp.congestion_control: 'nosuchcc' is not available in this kernel ("), e.value
    assert "cubic" in str(e.value)
