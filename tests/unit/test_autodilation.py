"""`time_dilation: auto` without a network (emu/config/autodilation.py, emu/sweeps/calibrate.py,
emu/sweeps/autodilate.py; docs/scaling.md: Time dilation): the config key and its run id, the
largest k a config allows, the traffic bound per role, the model's prediction and choice, the
retry's k, the costs derived from a calibration's measurements, the cache keyed by the machine's
description, and the dry run's k per point."""
from __future__ import annotations

import copy
import json
import math

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from analysis.capacity import time_dilation as stored_k
from emu.config.autodilation import (
    MARGIN,
    NoDilation,
    RoleRate,
    RoleSample,
    SchedulerCost,
    choose,
    combine,
    cost_at,
    derive,
    link_directions,
    predicted_idle,
    predicted_load,
    retry_k,
    role_rates,
    workers_factor,
)
from emu.config.dilation import wall_plan
from emu.config.experiment import ConfigError
from emu.config.plan import load_plan, set_dotted
from emu.sweeps import autodilate, calibrate, dryrun
from emu.sweeps.calibrate import Sample, intervals
from tasks import _sections
from tests.conftest import REPO
from tests.factories import GOOD, star_spec

AUTO = {
    "name": "a",
    "timeout_s": 100,
    "time_dilation": "auto",
    "topology": {"kind": "star", "hosts": [{"name": "ps", "bw_mbps": 400},
                                           *({"name": f"w{i}", "bw_mbps": 100} for i in range(4))]},
    "roles": {"servers": ["ps"], "workers": ["w0", "w1", "w2", "w3"]},
    "workload": {"model": "cnn", "preset": "small", "compute": "replay", "speedup": 0.5, "iterations": 10,
                 "warmup": 2},
    "scheduler": "fifo",
}


def experiment(tmp_path, cfg=AUTO, **keys):
    cfg = copy.deepcopy(cfg)
    for k, v in keys.items():
        set_dotted(cfg, k.replace("__", "."), v)
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(cfg))
    return load_plan(p, _sections()).experiments[0]


# ---------------------------------------------------------------------------- the config key

def test_auto_is_kept_in_the_resolved_config_and_its_run_id_is_the_configs_own(tmp_path):
    exp = experiment(tmp_path)
    assert exp.time_dilation == "auto" and exp.auto_dilation
    assert exp.resolved()["time_dilation"] == "auto"
    # hashed from the config alone: the same on every machine, whatever k a machine picks
    assert exp.run_id(0) == "cb36e986c59d"
    fixed = [experiment(tmp_path, time_dilation=k).run_id(0) for k in (1, 2, 4)]
    assert len({exp.run_id(0), *fixed}) == 4
    assert not experiment(tmp_path, time_dilation=4).auto_dilation


def test_auto_through_set_and_the_resolved_config_loads_again(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump({**AUTO, "time_dilation": 2}))
    exp = load_plan(p, _sections(), ["time_dilation=auto"]).experiments[0]
    assert exp.auto_dilation
    again = tmp_path / "config.yaml"   # what the runner writes into the run directory
    again.write_text(yaml.safe_dump(exp.resolved(), sort_keys=False))
    assert load_plan(again, _sections()).experiments[0].run_id(0) == exp.run_id(0)


@pytest.mark.parametrize("keys,message", [
    ({"workload": GOOD["workload"]},
     "time_dilation: auto needs workload.compute: replay; the k it picks may be above 1, and real PyTorch compute "
     "runs at the machine's own speed and cannot be slowed down (replay a profile, or set time_dilation: 1)"),
    ({"faults": [{"at_s": 1, "kind": "stop", "target": "worker0", "for_s": 1}]},
     "faults: not supported with time_dilation: auto (set time_dilation: 1, or leave faults out)"),
    ({"time_dilation": "automatic"}, 'time_dilation: must be a number or "auto", got \'automatic\''),
])
def test_what_auto_refuses_names_the_field(tmp_path, keys, message):
    with pytest.raises(ConfigError) as e:
        experiment(tmp_path, {**AUTO, **keys})
    assert str(e.value) == message


def test_the_largest_k_is_what_every_dilated_value_still_allows(tmp_path):
    assert experiment(tmp_path).dilation_k_max == 100
    # replay's speedup / k >= 0.001
    assert experiment(tmp_path, workload__speedup=0.0035).dilation_k_max == 3
    # timeout_s x k <= 7 days
    assert experiment(tmp_path, timeout_s=604_800 / 2.5).dilation_k_max == 2
    # a scheduler's times x k within their models: mercury's startup_us <= 1 s
    assert experiment(tmp_path, scheduler="mercury", schedulers={"mercury": {"startup_us": 300_000}}
                      ).dilation_k_max == 3
    # netem's delay x k <= 60 s
    assert experiment(tmp_path, topology__delay_ms=7_000).dilation_k_max == 8


def test_the_runner_needs_the_chosen_k(tmp_path):
    exp = experiment(tmp_path)
    with pytest.raises(ValueError, match="needs the k chosen"):
        wall_plan(exp)
    wall = wall_plan(exp, 3)
    assert wall.k == 3 and wall.net.rate("ps", "s1") == pytest.approx(400 / 3)


def test_analysis_reads_the_k_an_auto_run_had_from_its_meta(tmp_path):
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"time_dilation": "auto"}))
    assert stored_k(tmp_path) == 1.0   # no meta.json: nothing to go by
    (tmp_path / "meta.json").write_text(json.dumps({"time_dilation": 3.0}))
    assert stored_k(tmp_path) == 3.0
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"time_dilation": 2}))
    assert stored_k(tmp_path) == 2.0   # a fixed k is the config's


# ---------------------------------------------------------------------------- the traffic bound

def test_a_parameter_server_star_moves_what_its_busiest_link_allows():
    net = star_spec(2048, *[64] * 32, names=["ps", *(f"w{i}" for i in range(32))])
    rates = role_rates(net, ["ps"], [f"w{i}" for i in range(32)])
    assert {r.role: r.kind for r in rates}["server0"] == "server"
    by = {r.role: r.gbps for r in rates}
    assert by["server0"] == pytest.approx(2 * 2.048) and by["worker7"] == pytest.approx(2 * 0.064)
    # a slower server: every worker gets its share of it
    net = star_spec(300, *[300] * 4, names=["ps", "w0", "w1", "w2", "w3"])
    by = {r.role: r.gbps for r in role_rates(net, ["ps"], ["w0", "w1", "w2", "w3"])}
    assert by["server0"] == pytest.approx(0.6) and by["worker0"] == pytest.approx(0.15)
    assert link_directions(net) == 10


def test_collective_workers_move_at_the_slowest_workers_rate():
    net = star_spec(100, 100, 40, names=["w0", "w1", "w2"])
    assert [r.gbps for r in role_rates(net, [], ["w0", "w1", "w2"])] == pytest.approx([0.08] * 3)
    assert [r.gbps for r in role_rates(net, [], ["w0"])] == [0.0]   # one worker: nothing to exchange


# ---------------------------------------------------------------------------- the model and the choice

# one rate each: the same cost per Gbit at every rate, so the load is base + traffic / k
COST = SchedulerCost("fifo", cost={"server": [(0.6, 0.5)], "worker": [(0.15, 0.6)]}, harness=0.004, cpus=2)
BASE = 0.1   # the machine's own load, CPUs
RATES = [RoleRate("server0", "server", "ps", 4.096), *(RoleRate(f"worker{i}", "worker", f"w{i}", 0.128)
                                                        for i in range(32))]


def test_the_load_is_base_plus_the_traffic_spread_over_k():
    traffic = 0.5 * 4.096 + 32 * 0.6 * 0.128 + 0.004 * 66   # 4.7696 CPU-s/s at k = 1
    assert predicted_load(COST, RATES, 66, 1, BASE) == pytest.approx(0.1 + traffic)
    assert predicted_load(COST, RATES, 66, 4, BASE) == pytest.approx(0.1 + traffic / 4)
    assert predicted_idle(COST, RATES, 66, 4, 2, BASE) == pytest.approx(1 - (0.1 + traffic / 4) / 2)


def test_the_choice_is_the_smallest_k_that_clears_the_target():
    c = choose(COST, RATES, 66, 0.35, 100, 2, BASE)
    # load <= (1 - 0.45) x 2 = 1.1: 4.7696 / k <= 1.0, so k = 5
    assert c.k == 5 and c.target == pytest.approx(0.35 + MARGIN)
    assert c.idle == pytest.approx(predicted_idle(COST, RATES, 66, 5, 2, BASE)) and c.idle >= c.target
    assert c.idle_below == pytest.approx(predicted_idle(COST, RATES, 66, 4, 2, BASE)) and c.idle_below < c.target
    assert c.reason("fifo") == ("fifo: predicted CPU idle 0.47 at k=5, 0.35 at k=4; target 0.45 (cpu_idle_min + 0.1); "
                                "the machine's own load 0.10 CPUs")
    # the machine's own load takes what the run could have had
    assert choose(COST, RATES, 66, 0.35, 100, 2, 0.5).k == 8   # 4.7696 / k <= 0.6
    quiet = choose(COST, [], 0, 0.35, 100, 2, BASE)
    assert quiet.k == 1 and quiet.idle_below is None


def test_no_k_when_the_limit_or_the_machines_own_load_is_in_the_way():
    with pytest.raises(NoDilation, match="no time dilation up to 4 is predicted"):
        choose(COST, RATES, 66, 0.35, 4, 2, BASE)
    with pytest.raises(NoDilation, match=r"own load without this run, 1\.20 of 2 CPUs"):
        choose(COST, RATES, 66, 0.35, 100, 2, 1.2)


@settings(max_examples=50, deadline=None)
@given(base=st.floats(0, 0.8), server=st.floats(0, 3), worker=st.floats(0, 3), harness=st.floats(0, 0.01),
       idle_min=st.floats(0, 0.5), cpus=st.integers(1, 16))
def test_the_choice_is_minimal_and_sufficient(base, server, worker, harness, idle_min, cpus):
    cost = SchedulerCost("x", cost={"server": [(0.12, server * 2), (0.6, server)],
                                    "worker": [(0.03, worker * 3), (0.15, worker)]}, harness=harness, cpus=cpus,
                         workers={"worker": [(4.0, 1.0), (16.0, 1.5)]})
    try:
        c = choose(cost, RATES, 66, idle_min, 100, cpus, base)
    except NoDilation:
        assert predicted_idle(cost, RATES, 66, 100, cpus, base) < idle_min + MARGIN + 1e-9
        return
    assert predicted_idle(cost, RATES, 66, c.k, cpus, base) >= idle_min + MARGIN - 1e-9
    assert c.k == 1 or predicted_idle(cost, RATES, 66, c.k - 1, cpus, base) < idle_min + MARGIN + 1e-9


def test_a_retry_asks_for_what_the_measured_idle_says():
    # at k = 2 the idle fell to 0.2: 1.6 CPUs busy, 1.5 above base, 3.0 at k = 1; 1.0 spare at 0.45 idle
    assert retry_k(2, 0.2, 0.1, 2, 0.35, 100) == 3
    assert retry_k(2, 0.44, 0.1, 2, 0.35, 100) == 3      # just below the target: at least one more
    assert retry_k(2, 0.0, 0.1, 2, 0.35, 3) == 3          # within the experiment's largest k
    assert retry_k(3, 0.0, 0.1, 2, 0.35, 3) is None       # nothing larger to try


# ---------------------------------------------------------------------------- the costs of a calibration

def _calibration(peak=1.5):
    roles = [RoleSample("server", cpu_s=1.2, moved_bytes=450e6, bound_gbps=0.6),
             *(RoleSample("worker", cpu_s=0.5, moved_bytes=112.5e6, bound_gbps=0.15) for _ in range(4))]
    return roles, derive("fifo", window_s=10.0, roles=roles, harness_s=0.2, uncharged_s=0.9,
                         peak_over_mean=peak, directions=10, cpus=2)


def test_uncharged_kernel_work_goes_to_the_roles_by_their_bytes():
    _, c = _calibration(peak=1.0)
    # the server moved half the bytes: 0.45 of the 0.9 uncharged; over its 0.6 Gbit/s x 10 s bound
    # one point per kind: a role's bound rate, and its cost per Gbit of it
    assert c.cost["server"] == [(0.6, pytest.approx((1.2 + 0.45) / 6.0))]
    assert c.cost["worker"] == [(pytest.approx(0.15), pytest.approx((4 * 0.5 + 0.45) / (4 * 0.15 * 10)))]
    assert c.harness == pytest.approx(0.2 / 10 / 10)
    assert c.info["moved_over_bound"] == pytest.approx(9e8 * 8 / 1e9 / 12.0)
    assert c.info["process_cpu_s_per_gbit_moved"]["server"] == pytest.approx(1.2 / 3.6, abs=1e-4)


def test_the_model_predicts_the_calibrations_own_busiest_second():
    roles, c = _calibration(peak=1.5)
    rates = [RoleRate("server0", "server", "ps", 0.6), *(RoleRate(f"worker{i}", "worker", f"w{i}", 0.15)
                                                          for i in range(4))]
    mean = (1.2 + 4 * 0.5 + 0.2 + 0.9) / 10.0   # CPU-s/s of the run over its window, above base
    assert predicted_load(c, rates, 10, 1, 0.05) == pytest.approx(0.05 + 1.5 * mean)


def test_a_role_costs_more_per_gbit_at_a_lower_rate_as_the_calibration_measured():
    pts = [(0.03, 0.6), (0.15, 0.2)]   # 3 x the cost at 1/5 of the rate: exponent ln 3 / ln 5
    assert cost_at(pts, 0.15) == pytest.approx(0.2) and cost_at(pts, 0.03) == pytest.approx(0.6)
    assert cost_at(pts, 0.6) == pytest.approx(0.2)                       # above the fastest: its cost
    alpha = math.log(3) / math.log(5)
    assert cost_at(pts, 0.06) == pytest.approx(0.2 * (0.15 / 0.06) ** alpha)
    # below the slowest: the same law down to half its rate, then flat
    assert cost_at(pts, 0.02) == pytest.approx(0.6 * 1.5 ** alpha)
    assert cost_at(pts, 0.006) == cost_at(pts, 0.015) == pytest.approx(0.6 * 2 ** alpha)
    # the load (cost x rate) never grows as the rate falls: the exponent is at most 1
    steep = [(0.03, 10.0), (0.15, 0.2)]
    assert cost_at(steep, 0.02) * 0.02 == pytest.approx(cost_at(steep, 0.15) * 0.15)
    # never cheaper at a lower rate (a noisy calibration): the faster point's cost
    assert cost_at([(0.03, 0.1), (0.15, 0.2)], 0.01) == pytest.approx(0.2)
    assert cost_at([(0.15, 0.2)], 0.01) == 0.2 and cost_at([], 1.0) == 0.0


def test_a_ring_costs_more_per_gbit_with_more_workers():
    assert workers_factor([(4.0, 1.0), (16.0, 1.42)], 4) == 1.0
    assert workers_factor([(4.0, 1.0), (16.0, 1.42)], 32) == pytest.approx(1 + 0.42 * 28 / 12)
    assert workers_factor([(4.0, 1.0), (16.0, 0.8)], 32) == 1.0   # never below the calibration's
    assert workers_factor([], 32) == 1.0
    ring = SchedulerCost("ring", {"worker": [(0.15, 0.2)]}, 0.0, 2, workers={"worker": [(4.0, 1.0), (16.0, 2.0)]})
    net = star_spec(*[100] * 32, names=[f"w{i}" for i in range(32)])
    rates = role_rates(net, [], [f"w{i}" for i in range(32)])
    assert predicted_load(ring, rates, 0, 2, 0.0) == pytest.approx(32 * 0.1 * 0.2 * (1 + 28 / 12))


def test_calibration_runs_combine_into_rates_and_a_workers_factor():
    def run(gbps, cost):
        return SchedulerCost("ring", {"worker": [(gbps, cost)]}, 0.001 * gbps, 2, {"window_s": 5.0})

    c = combine([(4, run(0.15, 0.2)), (4, run(0.03, 0.6)), (16, run(0.03, 0.9))])
    assert c.cost == {"worker": [(0.03, 0.6), (0.15, 0.2)]}
    assert c.workers == {"worker": [(4.0, 1.0), (16.0, pytest.approx(1.5))]}
    assert c.harness == pytest.approx(0.00015) and [r["workers"] for r in c.info["runs"]] == [4, 4, 16]
    assert SchedulerCost.from_json(json.loads(json.dumps(c.to_json()))) == c


def _sample(t, roles, harness, procs, busy, irq):
    return Sample(t, roles, harness, procs, busy, irq)


def test_intervals_charge_the_kernel_what_no_process_was_charged():
    samples = [_sample(0.0, {"worker0": 10}, 5, {1: 10, 2: 5, 3: 100}, 1000, 50),
               _sample(0.5, {"worker0": 30}, 8, {1: 30, 2: 8, 3: 110, 4: 7}, 1060, 70),
               # a process ended: its ticks are not the kernel's beyond the interrupts' count
               _sample(1.0, {"worker0": 40}, 9, {1: 40, 2: 9}, 1100, 75)]
    iv = intervals(samples, ["worker0"])
    assert list(iv["t"]) == [0.5, 1.0]
    assert [d["worker0"] for d in iv["roles"]] == [20, 10] and list(iv["harness"]) == [3, 1]
    # 60 busy - (20 + 3 + 10 + 7) = 20 uncharged, all in interrupts (20); then 40 - 11 = 29, capped at 5
    assert list(iv["uncharged"]) == [20, 5]
    assert len(intervals(samples, ["worker0", "server0"])) == 0   # a role not seen: no interval


# ---------------------------------------------------------------------------- the cache

def test_the_cache_directory_and_a_file_per_machine_description(tmp_path, monkeypatch):
    monkeypatch.setenv("SCHEDLAB_CACHE_DIR", str(tmp_path / "c"))
    assert calibrate.cache_dir() == tmp_path / "c"
    monkeypatch.delenv("SCHEDLAB_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert calibrate.cache_dir() == tmp_path / "x" / "schedlab"
    desc = calibrate.describe_machine()
    assert set(desc) >= {"cpu_model", "cpus", "memory_bytes", "kernel", "datapath_sha256"}
    paths = {calibrate.cache_path({**desc, key: "other"}, tmp_path) for key in desc}
    assert len(paths | {calibrate.cache_path(desc, tmp_path)}) == len(desc) + 1   # any field: another file


def test_the_data_paths_digest_follows_its_sources(tmp_path):
    for rel in ("schedulers/ps/fifo.py", "workloads/worker.py", "workloads/tools/x.py", "emu/run/runner.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("x = 1\n")
    d0 = calibrate.datapath_digest(tmp_path)
    (tmp_path / "emu/run/runner.py").write_text("x = 2\n")
    (tmp_path / "workloads/tools/x.py").write_text("x = 2\n")
    assert calibrate.datapath_digest(tmp_path) == d0   # not the data path
    (tmp_path / "schedulers/ps/fifo.py").write_text("x = 2\n")
    assert calibrate.datapath_digest(tmp_path) != d0
    assert len(calibrate.datapath_digest()) == 64


def test_entries_are_kept_per_scheduler_and_read_back(tmp_path):
    path = calibrate.cache_path(calibrate.describe_machine(), tmp_path)
    assert calibrate.load(path) == {}
    fifo = SchedulerCost("fifo", {"server": [(0.6, 0.3)], "worker": [(0.15, 0.4)]}, 0.004, 2, {"window_s": 6.0})
    ring = SchedulerCost("ring", {"worker": [(0.03, 0.5), (0.15, 0.2)]}, 0.003, 2,
                         workers={"worker": [(4.0, 1.0), (16.0, 1.4)]})
    calibrate.store(path, {"m": 1}, "fifo", fifo)
    calibrate.store(path, {"m": 1}, "ring", ring)
    assert calibrate.load(path) == {"fifo": fifo, "ring": ring}
    assert json.loads(path.read_text())["machine"] == {"m": 1}
    path.write_text("{not json")
    assert calibrate.load(path) == {}


@pytest.fixture
def clean_registry(monkeypatch):
    """Plugins register globally: a test that loads one leaves the built-ins as they were."""
    from analysis import catalog
    from schedulers import registry
    from schedulers.registry import plugins

    monkeypatch.setattr(registry, "SCHEDULERS", dict(registry.SCHEDULERS))
    monkeypatch.setattr(registry, "SOURCES", {})
    monkeypatch.setattr(registry, "PLUGIN_SPECS", {})
    monkeypatch.setattr(plugins, "_LOADED", {})
    monkeypatch.setattr(catalog, "_RECORDED", {})
    yield
    catalog.install({})


def test_a_plugins_scheduler_is_calibrated_with_its_code(tmp_path, clean_registry):
    assert calibrate.scheduler_key(experiment(tmp_path)) == "fifo"
    plugin = REPO / "tests" / "data" / "plugins" / "alltoall.py"
    exp = experiment(tmp_path, scheduler="alltoall", roles={"workers": ["ps", "w0", "w1", "w2", "w3"]},
                     plugins=[str(plugin)])
    sha = exp.plugins[0].sha256
    assert calibrate.scheduler_key(exp) == f"alltoall@{sha[:12]}"
    cal = calibrate.calibration_experiment(exp)
    assert cal.scheduler == "alltoall" and cal.plugins[0].path == str(plugin) and not cal.roles.servers


def test_the_calibration_runs_are_small_communication_bound_stars(tmp_path):
    mercury = experiment(tmp_path, scheduler="mercury")
    assert calibrate.CAL_RUNS["ps"] == ((4, 300.0), (4, 60.0))
    ps = calibrate.calibration_experiment(mercury)
    assert ps.scheduler == "mercury" and ps.roles.servers == ["ps"] and len(ps.roles.workers) == 4
    assert {ln.ab_mbps for ln in ps.net.links} == {300.0} and ps.time_dilation == 1
    assert ps.workload["compute"] == "replay" and ps.workload["speedup"] == calibrate.CAL_SPEEDUP
    # about CAL_SECONDS at the bound: the server moves 4 x 5 MB each way per iteration at 300 Mb/s
    bound_s = 4 * calibrate.grad_bytes() * 8 / 300e6
    assert ps.workload["iterations"] - ps.workload["warmup"] == math.ceil(calibrate.CAL_SECONDS / bound_s)
    slow = calibrate.calibration_experiment(mercury, 4, 60.0)
    assert slow.workload["iterations"] - slow.workload["warmup"] == calibrate.MIN_MEASURED
    ring = calibrate.calibration_experiment(experiment(tmp_path, scheduler="ring", roles={"workers": "rest"}), 16, 15)
    assert not ring.roles.servers and len(ring.roles.workers) == 16 and ring.net.rate("w3", "s1") == 15


# ---------------------------------------------------------------------------- the dry run

def _plan(tmp_path):
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump({**AUTO, "zip": {"scheduler": ["fifo", "mercury"]}}))
    return load_plan(p, _sections())


def test_dry_run_says_the_first_run_calibrates(tmp_path, monkeypatch):
    monkeypatch.setenv("SCHEDLAB_CACHE_DIR", str(tmp_path / "cache"))
    plan = _plan(tmp_path)
    pts = dryrun.points(plan, tmp_path / "results", lambda exp: 0.5)
    assert [p.k for p in pts] == ["auto: not calibrated"] * 2 and {p.basis for p in pts} == {"unknown"}
    text = dryrun.render(plan, pts, tmp_path / "results")
    assert "time_dilation auto: this machine is not calibrated yet for fifo, mercury: the first run of each " \
           "calibrates it (a few short runs, as root: about 0:01:20 in all, not in the estimate)" in text
    assert not (tmp_path / "cache").exists()


def test_dry_run_shows_the_k_it_would_pick(tmp_path, monkeypatch):
    monkeypatch.setenv("SCHEDLAB_CACHE_DIR", str(tmp_path / "cache"))
    plan = _plan(tmp_path)
    path = calibrate.cache_path(calibrate.describe_machine())
    # fifo: 0.8 CPU-s per bound Gbit; this star's bound is 0.8 Gbit/s at the server, 0.2 per worker:
    # 0.04 + 1.28 / k CPUs, at most 1.1 for 0.45 idle: k = 2 (idle 0.66), not 1 (0.34)
    calibrate.store(path, calibrate.describe_machine(), "fifo",
                    SchedulerCost("fifo", {"server": [(0.8, 0.8)], "worker": [(0.2, 0.8)]}, 0.0, 2))
    pts = dryrun.points(plan, tmp_path / "results", lambda exp: 0.5, own_load=lambda: 0.04)
    assert [p.k for p in pts] == ["auto: 2 (idle 0.66, 0.34 at 1)", "auto: not calibrated"]
    assert pts[0].run_s == pytest.approx(dryrun.SETUP_S + 0.5 * 10 * 2) and pts[0].basis == "bound"
    text = dryrun.render(plan, pts, tmp_path / "results")
    assert "auto: 2 (idle 0.66, 0.34 at 1)" in text.splitlines()[2]
    assert "not calibrated yet for mercury:" in text
    assert autodilate.planned(plan.experiments[0], lambda: 0.04)[0] == 2.0
    assert autodilate.planned(plan.experiments[0], lambda: 0.5)[0] == 3.0   # a busier machine: a larger k


def test_a_fixed_k_is_shown_and_none_is_left_out(tmp_path):
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump({**AUTO, "time_dilation": 4}))
    plan = load_plan(p, _sections())
    text = dryrun.render(plan, dryrun.points(plan, tmp_path, lambda exp: 0.5), tmp_path)
    assert text.splitlines()[1].split()[3] == "k" and "time_dilation auto" not in text
    p.write_text(yaml.safe_dump({**AUTO, "time_dilation": 1}))
    plan = load_plan(p, _sections())
    assert " k " not in dryrun.render(plan, dryrun.points(plan, tmp_path, lambda exp: 0.5), tmp_path).splitlines()[1]


def test_the_shipped_dilated_example_takes_auto():
    plan = load_plan(REPO / "configs" / "examples" / "dilated32.yaml", _sections(), ["time_dilation=auto"])
    assert all(e.auto_dilation and e.dilation_k_max == 100 for e in plan.experiments)
