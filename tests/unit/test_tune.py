"""`./inv tune` (emu/sweeps/tune.py) without Mininet: the study with a stand-in for "run one
experiment", its records and resumption, the CLI's refusals, and how a sweep and the report
use the tuned values."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from analysis.report import summary
from analysis.speedup import load_comparison, speedups
from analysis.tables import load_runs
from emu.config.experiment import ConfigError
from emu.config.plan import load_plan
from emu.run.results import read_runs, record_run
from emu.sweeps.tune import prepare, to_coords, to_params, tune
from schedulers.registry import SCHEDULERS
from tasks import _sections
from tests.conftest import invoke
from tests.factories import experiment, star_topology

CONFIG = experiment(name="tunecfg", seed=0, timeout_s=60, topology=star_topology(ps=100, w0=50, w1=25),
                    workload={"model": "cnn", "preset": "tiny", "batch_size": 8, "iterations": 6, "warmup": 1},
                    schedulers={"bytescheduler": {"partition_numel": 16384, "credit_numel": 65536}})
OPTIMUM = {"partition_numel": 50_000, "credit_ratio": 3.0}


def write_config(tmp_path: Path, cfg: dict = CONFIG, name: str = "cfg.yaml") -> Path:
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(cfg))
    return path


def synthetic_time(params: dict) -> float:
    """A made-up median iteration: 100 ms at the optimum, more the further (in log) from it."""
    if "slice_numel" in params:
        return 0.1 + 0.01 * math.log(params["slice_numel"] / 20_000) ** 2
    p, ratio = params["partition_numel"], params["credit_numel"] / params["partition_numel"]
    return (0.1 + 0.01 * math.log(p / OPTIMUM["partition_numel"]) ** 2
            + 0.01 * math.log(ratio / OPTIMUM["credit_ratio"]) ** 2)


class StandIn:
    """Runs "an experiment": records the row `run_one` would, with the synthetic time as its median."""

    def __init__(self, fail_when=lambda params: False, interrupt_at: int | None = None):
        self.calls: list[dict] = []
        self.fail_when, self.interrupt_at = fail_when, interrupt_at

    def __call__(self, exp, results_root: Path, point: dict) -> dict:
        params = exp.scheduler_params
        self.calls.append(params)
        if self.interrupt_at is not None and len(self.calls) == self.interrupt_at:
            raise KeyboardInterrupt
        failed = self.fail_when(params)
        row = {"run_id": exp.run_id(0), "sweep": exp.name, "repeat": 0, "scheduler": exp.scheduler,
               "status": "failed" if failed else "ok", "reason": "timed out" if failed else "",
               "iter_time_median_s": math.nan if failed else synthetic_time(params), "wall_s": 0.5,
               "fidelity_ok": True, **{f"point.{k}": v for k, v in point.items()}}
        record_run(results_root / exp.name, row)
        return row


def spec_for(tmp_path: Path, budget: int, scheduler: str = "bytescheduler", **kw):
    return prepare(write_config(tmp_path), scheduler, budget, _sections(), name=kw.pop("name", "t"),
                   results_root=tmp_path / "results", **kw)


# ---------------------------------------------------------------------------- the search

def test_search_space_round_trips_and_keeps_credit_at_least_one_partition():
    bs, p3 = SCHEDULERS["bytescheduler"].tuning, SCHEDULERS["p3"].tuning   # the classes' search spaces
    assert to_params(bs, {"partition_numel": 16384, "credit_ratio": 4.0}) == \
        {"partition_numel": 16384, "credit_numel": 65536}
    assert to_coords(bs, {"partition_numel": 16384, "credit_numel": 65536}) == \
        {"partition_numel": 16384, "credit_ratio": 4.0}
    assert to_coords(bs, {"partition_numel": 1_000_000, "credit_numel": 500_000}) is None  # ratio < 1
    assert to_coords(bs, {"partition_numel": 10, "credit_numel": 40}) is None               # too small
    assert to_coords(p3, {"slice_numel": 40_000}) == {"slice_numel": 40_000}
    for d in bs:
        assert d.low < d.high
    p = to_params(bs, {"partition_numel": 1000, "credit_ratio": 1.0001})
    assert p["credit_numel"] >= p["partition_numel"]


@pytest.mark.parametrize("sampler,budget", [("tpe", 40), ("gp", 20)])
@pytest.mark.slow
def test_study_finds_the_optimum_of_a_synthetic_function_within_the_budget(tmp_path, sampler, budget):
    run = StandIn()
    rec = tune(spec_for(tmp_path, budget, sampler=sampler), tmp_path / "results", run=run, log=lambda s: None)
    assert len(run.calls) == budget and rec["cost"]["trials"] == budget
    best = rec["best"]["params"]
    assert rec["best"]["objective"] < 0.1 + 0.002, rec["best"]     # within ~5% of the optimum's log-distance
    assert 0.6 < best["partition_numel"] / OPTIMUM["partition_numel"] < 1.6
    assert 1.5 < best["credit_numel"] / best["partition_numel"] < 6
    # the first trial is the config's own values, so the tune measures what it improves on
    first = rec["trials"][0]
    assert first["origin"] == "config" and first["params"] == {"partition_numel": 16384, "credit_numel": 65536}
    assert rec["config_values"]["objective"] == pytest.approx(synthetic_time(first["params"]))
    assert rec["best"]["objective"] < rec["config_values"]["objective"]


@pytest.mark.slow
def test_p3_slice_is_tuned_too(tmp_path):
    rec = tune(spec_for(tmp_path, 20, scheduler="p3"), tmp_path / "results", run=StandIn(), log=lambda s: None)
    assert set(rec["best"]["params"]) == {"slice_numel"}
    assert 10_000 < rec["best"]["params"]["slice_numel"] < 40_000
    assert rec["config_values"]["params"] == {"slice_numel": 40_000}   # P3's default, the config has no p3 section


@pytest.mark.slow
def test_same_seed_same_trials_and_resuming_does_not_repeat_finished_trials(tmp_path):
    whole = tune(spec_for(tmp_path / "a", 12), tmp_path / "a" / "results", run=StandIn(), log=lambda s: None)
    first, second = StandIn(), StandIn()
    root = tmp_path / "b" / "results"
    tune(spec_for(tmp_path / "b", 7), root, run=first, log=lambda s: None)
    again = StandIn()
    tune(spec_for(tmp_path / "b", 7), root, run=again, log=lambda s: None)
    assert again.calls == [], "the same budget again: nothing to run"
    rec = tune(spec_for(tmp_path / "b", 12), root, run=second, log=lambda s: None)   # a larger budget extends it
    assert len(first.calls) == 7 and len(second.calls) == 5
    assert [t["params"] for t in rec["trials"]] == [t["params"] for t in whole["trials"]], \
        "a tune extended in two calls proposes what one call does"
    assert rec["cost"]["runs"] == 12 and rec["cost"]["trials"] == 12
    runs = read_runs(root / "t")
    assert len(runs) == 12 and set(runs["status"]) == {"ok"}
    assert sorted(runs["run_id"]) == sorted(t["run_id"] for t in rec["trials"])


@pytest.mark.slow
def test_an_interrupted_trial_runs_again_first_on_resume(tmp_path):
    root = tmp_path / "results"
    stop = StandIn(interrupt_at=3)
    with pytest.raises(KeyboardInterrupt):
        tune(spec_for(tmp_path, 6), root, run=stop, log=lambda s: None)
    rec = json.loads((root / "t" / "tuned.json").read_text())
    assert [t["status"] for t in rec["trials"]] == ["ok", "ok", "interrupted"]
    rest = StandIn()
    rec = tune(spec_for(tmp_path, 6), root, run=rest, log=lambda s: None)
    assert rest.calls[0] == stop.calls[2], "the interrupted trial's tunables run first"
    assert len(rest.calls) == 4 and rec["cost"]["trials"] == 6
    assert [t["status"] for t in rec["trials"]].count("interrupted") == 1
    assert rec["cost"]["runs"] == 7, "the interrupted run cost a run too"


@pytest.mark.slow
def test_a_failed_run_is_a_failed_trial_and_a_measured_proposal_is_reused(tmp_path):
    root = tmp_path / "results"
    run = StandIn(fail_when=lambda p: p["partition_numel"] > 1_000_000)
    rec = tune(spec_for(tmp_path, 15), root, run=run, log=lambda s: None)
    failed = [t for t in rec["trials"] if t["status"] == "failed"]
    assert all(t["objective"] is None and t["reason"] == "timed out" for t in failed)
    assert rec["best"]["params"]["partition_numel"] <= 1_000_000
    # A proposal whose run already completed reuses its row: pre-record the best one's run
    # under another tune's name so that its first proposal (the config's values) is measured.
    other = spec_for(tmp_path, 1, name="t2")
    record_run(root / "t2", {"run_id": other.experiment({"partition_numel": 16384, "credit_numel": 65536}).run_id(0),
                             "sweep": "t2", "repeat": 0, "status": "ok", "reason": "", "iter_time_median_s": 0.5,
                             "wall_s": 3.0})
    fresh = StandIn()
    rec2 = tune(other, root, run=fresh, log=lambda s: None)
    assert fresh.calls == [] and rec2["trials"][0]["reused"] is True and rec2["best"]["objective"] == 0.5
    assert rec2["cost"] == {"trials": 1, "runs": 0, "run_wall_s": 0.0, "wall_s": pytest.approx(rec2["cost"]["wall_s"])}


@pytest.mark.slow
def test_tuned_json_and_tuned_yaml(tmp_path):
    root = tmp_path / "results"
    rec = tune(spec_for(tmp_path, 8, seed=3), root, run=StandIn(), log=lambda s: None)
    stored = json.loads((root / "t" / "tuned.json").read_text())
    assert stored["best"] == rec["best"] and stored["scheduler"] == "bytescheduler"
    assert stored["library"]["name"] == "optuna" and stored["library"]["sampler"] == "TPESampler"
    assert stored["library"]["seed"] == 3 and stored["library"]["version"]
    assert set(stored["search_space"]) == {"partition_numel", "credit_ratio"}
    assert stored["cost"]["trials"] == 8 and stored["cost"]["runs"] == 8
    assert stored["cost"]["run_wall_s"] == pytest.approx(4.0) and stored["cost"]["wall_s"] > 0
    assert len(stored["trials"]) == 8
    for t in stored["trials"]:
        assert set(t) >= {"trial", "params", "objective", "run_id", "status"} and t["status"] == "ok"
        assert t["fidelity_ok"] is True and t["reused"] is False
    assert stored["setting"]["network"] == "ps-s1 100, w0-s1 50, w1-s1 25 Mb/s"
    assert stored["setting"]["workload"]["iterations"] == 6
    assert (root / "t" / "study.db").exists()
    # every trial is a normal row, its tunables as point columns
    runs = read_runs(root / "t")
    assert set(runs["point.schedulers.bytescheduler.partition_numel"]) == \
        {t["params"]["partition_numel"] for t in stored["trials"]}

    text = (root / "t" / "tuned.yaml").read_text()
    fragment = yaml.safe_load(text)
    assert fragment == {"schedulers.bytescheduler": rec["best"]["params"]}
    # ...which a sweep file takes in its set: (with a label for the report), or --set takes as printed
    sweep = tmp_path / "tuned_sweep.yaml"
    sweep.write_text("base: cfg.yaml\nname: tuned\ngrid: {scheduler: [bytescheduler]}\nset:\n  label: tuned\n"
                     + "".join(f"  {ln}\n" for ln in text.splitlines() if not ln.startswith("#")))
    (exp,) = load_plan(sweep, _sections()).experiments
    assert exp.scheduler_params == rec["best"]["params"] and exp.label == "tuned"
    flag = next(ln for ln in text.splitlines() if "--set" in ln).split('--set "', 1)[1].rstrip('"')
    (fifo, bs) = load_plan(write_config(tmp_path), _sections(), [flag, "grid.scheduler=[fifo, bytescheduler]"]) \
        .experiments
    assert bs.scheduler_params == rec["best"]["params"]


@pytest.mark.slow
def test_a_study_of_another_setting_is_refused(tmp_path):
    tune(spec_for(tmp_path, 2), tmp_path / "results", run=StandIn(), log=lambda s: None)
    with pytest.raises(ConfigError, match=r"study.db: holds a tune of another setting"):
        spec_for(tmp_path, 2, seed=1)
    other = dict(CONFIG, topology={**CONFIG["topology"], "hosts": [{"name": "ps", "bw_mbps": 100},
                                                                     {"name": "w0", "bw_mbps": 50},
                                                                     {"name": "w1", "bw_mbps": 10}]})
    with pytest.raises(ConfigError, match=r"holds a tune of another setting"):
        prepare(write_config(tmp_path, other), "bytescheduler", 2, _sections(), name="t",
                results_root=tmp_path / "results")


# ---------------------------------------------------------------------------- choosing the setting

def test_a_grid_needs_a_point_and_schedulers_collapse(tmp_path):
    cfg = dict(CONFIG, grid={"scheduler": ["fifo", "bytescheduler", "p3"],
                             "topology.hosts.2.bw_mbps": [25, 10]})
    path = write_config(tmp_path, cfg)
    with pytest.raises(ConfigError, match=r"2 network settings; tune one at a time with --point 0 to 1, in the "
                                          r"order of its grid and zip \(0: topology.hosts.2.bw_mbps=25; ...\)"):
        prepare(path, "bytescheduler", 3, _sections())
    spec = prepare(path, "bytescheduler", 3, _sections(), point="1")
    assert spec.name == "tunecfg-tune-bytescheduler-1" and spec.setting == {"topology.hosts.2.bw_mbps": 10}
    assert spec.base.scheduler == "bytescheduler"
    assert {k: spec.base.scheduler_params[k] for k in ("partition_numel", "credit_numel")} == \
        {"partition_numel": 16384, "credit_numel": 65536}
    with pytest.raises(ConfigError, match=r"--point 2: .* has 2 network setting\(s\), 0 to 1"):
        prepare(path, "bytescheduler", 3, _sections(), point=2)


@pytest.mark.parametrize("scheduler,budget,extra,message", [
    ("bytescheduler", 0, {}, "--budget 0: must be from 1 to 1000"),
    ("bytescheduler", "many", {}, "--budget 'many': must be an integer"),
    ("magic", 5, {}, "--scheduler 'magic': unknown scheduler (known: "),
    ("fifo", 5, {}, "--scheduler fifo: has no tunables to tune (tunable: bytescheduler, p3)"),
    ("bytescheduler", 5, {"sampler": "cmaes"}, "--sampler 'cmaes': unknown sampler (known: tpe, gp)"),
    ("bytescheduler", 5, {"max_minutes": "0"}, "--max-minutes '0': must be > 0"),
    ("bytescheduler", 5, {"overrides": ["scheduler=ring", "roles.servers=[]"]},
     "roles.servers: scheduler 'bytescheduler' needs at least one parameter server"),
])
def test_bad_requests_are_one_config_error(tmp_path, scheduler, budget, extra, message):
    overrides = extra.pop("overrides", [])
    with pytest.raises(ConfigError) as e:
        prepare(write_config(tmp_path), scheduler, budget, _sections(), overrides, results_root=tmp_path / "r", **extra)
    assert str(e.value).startswith(message), str(e.value)
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("args,message", [
    (["--scheduler", "bytescheduler", "--budget", "0"], "error: --budget 0: must be from 1 to 1000"),
    (["--scheduler", "magic", "--budget", "5"], "error: --scheduler 'magic': unknown scheduler (known: "),
    (["--scheduler", "fifo", "--budget", "5"],
     "error: --scheduler fifo: has no tunables to tune (tunable: bytescheduler, p3)"),
], ids=["budget-0", "unknown-scheduler", "no-tunables"])
@pytest.mark.slow
def test_cli_refuses_bad_input_with_one_line_exit_2_nothing_created(tmp_path, args, message):
    results = tmp_path / "results"
    r = invoke("tune", str(write_config(tmp_path)), *args, "--results", str(results), timeout=60)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().startswith(message) and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "Traceback" not in r.stdout + r.stderr
    assert not results.exists()


# ---------------------------------------------------------------------------- default and tuned side by side

def test_labelled_runs_are_their_own_scheduler_in_the_same_configuration(tmp_path):
    """A sweep that runs bytescheduler twice, with its config's and with tuned tunables (label:
    tuned), reports them side by side: one configuration, two schedulers."""
    rng = np.random.default_rng(0)
    rows = []
    for bw in (10, 50):
        for sched, label, t in (("fifo", None, 1.0), ("bytescheduler", None, 0.8), ("bytescheduler", "tuned", 0.6)):
            rid = f"{sched}-{label}-{bw}"
            rows.append({"run_id": rid, "sweep": "s", "scheduler": sched, "label": label, "repeat": 0, "seed": 0,
                         "status": "ok", "point.topology.bw_mbps": bw, "point.scheduler": sched,
                         "roles.workers": '["w0", "w1"]', "workload.warmup": 1, "workload.iterations": 20,
                         "iter_time_median_s": t * 10 / bw, "wait_median_s": t * 5 / bw, "efficiency": 0.5,
                         "fidelity_ok": True})
            d = tmp_path / rid
            d.mkdir()
            times = t * 10 / bw * rng.lognormal(0, 0.02, 20)
            start = np.concatenate([[0], np.cumsum(times)[:-1]])
            pd.DataFrame({"run_id": rid, "rank": 0, "iteration": range(20), "start": start, "end": start + times}) \
                .to_parquet(d / "iterations.parquet")
    pd.DataFrame(rows).to_parquet(tmp_path / "runs.parquet")

    runs = load_runs(tmp_path)
    assert sorted(set(runs["scheduler"])) == ["bytescheduler", "bytescheduler (tuned)", "fifo"]
    assert set(runs["scheduler_name"]) == {"fifo", "bytescheduler"}
    runs, its = load_comparison(tmp_path)
    assert runs.groupby("config_id")["scheduler"].nunique().tolist() == [3, 3], "label is not a configuration"
    sp = speedups(runs, its).set_index(["config", "scheduler"])["speedup"]
    assert sp.loc[("links 10 Mb/s", "bytescheduler (tuned)")] == pytest.approx(1 / 0.6, rel=0.05)
    over_default = speedups(runs, its, baseline="bytescheduler").set_index("scheduler")["speedup"]
    assert over_default.loc["bytescheduler (tuned)"].tolist() == pytest.approx([0.8 / 0.6] * 2, rel=0.05)
    table = summary(runs, its, "fifo")
    assert table["scheduler"].tolist() == ["fifo", "bytescheduler", "bytescheduler (tuned)"] * 2


def test_label_is_left_out_of_run_ids_until_set(tmp_path):
    a = load_plan(write_config(tmp_path), _sections()).experiments[0]
    b = load_plan(write_config(tmp_path), _sections(), ["label=tuned"]).experiments[0]
    assert a.label is None and b.label == "tuned" and a.run_id(0) != b.run_id(0)
    assert "label" not in json.dumps({k: v for k, v in a.resolved().items() if v is not None})
    with pytest.raises(ConfigError, match=r"^label: "):
        load_plan(write_config(tmp_path), _sections(), ["label=-bad"])


@pytest.mark.slow
def test_the_task_runs_each_trial_through_run_plan(tmp_path, monkeypatch, capsys):
    """`./inv tune` end to end with `run_plan` (which would start Mininet) stood in for."""
    from invoke import Context

    import emu.sweeps.sweep
    import emu.testbed.preflight
    import tasks

    plans = []
    stand_in = StandIn()

    def run_plan(plan, results_root, force=False, shard=None):
        plans.append(plan)
        return [stand_in(plan.experiments[0], results_root, plan.points[0])]

    monkeypatch.setattr(emu.sweeps.sweep, "run_plan", run_plan)
    monkeypatch.setattr(emu.testbed.preflight, "check", lambda plan: None)
    monkeypatch.setattr(tasks, "_need_root", lambda what: None)
    results = tmp_path / "results"
    tasks.tune(Context(), str(write_config(tmp_path)), scheduler="bytescheduler", budget="4", results=str(results),
               name="cli")
    assert len(plans) == 4 and all(len(p.experiments) == 1 and p.repeats == 1 for p in plans)
    assert plans[0].points == [{"schedulers.bytescheduler.partition_numel": 16384,
                                "schedulers.bytescheduler.credit_numel": 65536}]
    rec = json.loads((results / "cli" / "tuned.json").read_text())
    out = capsys.readouterr()
    assert "best of 4 trials: partition_numel=" in out.out and "tuned.yaml" in out.out
    assert out.err.count("tune: trial ") == 4
    assert rec["cost"]["runs"] == 4 and (results / "cli" / "tuned.yaml").exists()
