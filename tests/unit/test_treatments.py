"""Treatments: within a configuration every distinct resolved config of a scheduler (seed and
repeat index aside) is a variant of its own (analysis/tables.variant_names), so a swept
tunable or parameter-server set gives a row per value in the speedups, the report's summary
and the figures' colours, and only repeats of one resolved config are pooled."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import yaml

from analysis import plots
from analysis.report import _setup, summary
from analysis.speedup import baseline_variant, load_comparison, speedups
from analysis.tables import add_configurations, config_facts
from schedulers.registry import infos

KEY = "schedulers.bytescheduler.credit_numel"
TRUE = {"fifo": 1.0, 65536: 0.8, 262144: 0.6}  # iteration time (s): fifo, bytescheduler per credit
COMMON = {"sweep": "credit", "status": "ok", "roles.workers": '["w0", "w1"]', "workload.model": "cnn",
          "workload.preset": "small", "workload.batch_size": 32, "workload.iterations": 12, "workload.warmup": 2,
          "num_params": 1000, "num_tensors": 4, "compute_mode": "replay", "topology.kind": "star",
          "network": "star", "num_workers": 2, "wait_median_s": 0.1, "efficiency": np.nan}


def credit_sweep(repeats: int = 2, label_256k: str | None = None, iterations: int = 12, seed: int = 0,
                 fifo_settings: tuple[dict, ...] = ({},)) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Runs and iterations of `grid: {scheduler: [fifo, bytescheduler], credit_numel: [65536,
    262144]}` with `repeats` repeats, as the sweep leaves them: fifo runs once per repeat (its
    resolved config ignores bytescheduler's credit), each run's own tunables as row columns.
    `fifo_settings`: fifo's own treatments (extra row columns each), to make fifo vary too."""
    rng = np.random.default_rng(seed)
    settings = [("fifo", None, extra) for extra in fifo_settings] + [("bytescheduler", c, {}) for c in (65536, 262144)]
    runs, iters = [], []
    for k, (name, credit, extra) in enumerate(settings):
        for rep in range(repeats):
            rid = f"{name}-{credit}-{k}-{rep}"
            label = label_256k if credit == 262144 else None
            row = {**COMMON, "run_id": rid, "scheduler": name, "repeat": rep, "seed": rep, "label": label,
                   "roles.servers": '["ps"]', "point.scheduler": name, f"point.{KEY}": credit or 65536,
                   "point.seed": rep, **extra}
            if credit:
                row.update({KEY: credit, "schedulers.bytescheduler.partition_numel": 16384})
            t = TRUE[credit or "fifo"] * (1 + 0.2 * k if name == "fifo" else 1)
            clock = 0.0
            for it in range(iterations):
                d = t * rng.lognormal(0, 0.02)
                for rank in range(2):
                    iters.append({"run_id": rid, "rank": rank, "iteration": it, "start": clock, "end": clock + d})
                clock += d
            row["iter_time_median_s"] = t
            runs.append(row)
    iters = pd.DataFrame(iters)
    return pd.DataFrame(runs), iters[iters["iteration"] >= 2].reset_index(drop=True)


def test_a_swept_tunable_is_two_variants_each_pooled_over_its_own_repeats():
    runs, iters = credit_sweep()
    table = speedups(runs, iters, n_resamples=999).set_index("scheduler")
    assert sorted(table.index) == ["bytescheduler credit 256k", "bytescheduler credit 64k"]
    assert set(table["runs"]) == {2} and set(table["runs_baseline"]) == {2} and set(table["baseline"]) == {"fifo"}
    assert table.loc["bytescheduler credit 64k", "speedup"] == pytest.approx(1.0 / 0.8, rel=0.03)
    assert table.loc["bytescheduler credit 256k", "speedup"] == pytest.approx(1.0 / 0.6, rel=0.03)
    named = add_configurations(runs)
    assert set(named["scheduler_name"]) == {"fifo", "bytescheduler"}
    shown = summary(named, iters, "fifo").set_index("scheduler")
    assert list(shown.index) == ["fifo", "bytescheduler credit 64k", "bytescheduler credit 256k"]
    assert set(shown["runs"]) == {2}
    assert shown.loc["fifo", "speedup over fifo (95% CI)"] == "1 (baseline)"
    assert shown.loc["bytescheduler credit 256k", "speedup over fifo (95% CI)"].startswith("1.6")


def test_repeats_of_one_resolved_config_pool_and_treatments_count_resolved_configs(tmp_path):
    """On disk, from each run's config.yaml: seeds and repeats pool, every other difference
    (here also a section of a scheduler the run does not use, which changes nothing) does not."""
    runs, iters = credit_sweep(repeats=3)
    base = {"name": "credit", "topology": {"kind": "star", "bw_mbps": 100.0}, "roles": {"servers": ["ps"],
            "workers": ["w0", "w1"]}, "workload": {"model": "cnn", "iterations": 12, "warmup": 2}}
    resolved = []
    for _, run in runs.iterrows():
        own = {"partition_numel": 16384, "credit_numel": int(run[KEY])} if run["scheduler"] == "bytescheduler" else {}
        cfg = {**base, "seed": int(run["seed"]), "scheduler": run["scheduler"],
               "schedulers": {run["scheduler"]: own, **({"p3": {"slice_numel": 4096}} if run["repeat"] == 1 else {})}}
        (tmp_path / run["run_id"]).mkdir()
        (tmp_path / run["run_id"] / "config.yaml").write_text(yaml.safe_dump(cfg))
        iters[iters["run_id"] == run["run_id"]].to_parquet(tmp_path / run["run_id"] / "iterations.parquet")
        resolved.append(json.dumps({**cfg, "seed": None, "schedulers": {run["scheduler"]: own}}, sort_keys=True))
    runs.to_parquet(tmp_path / "runs.parquet")
    loaded, its = load_comparison(tmp_path)
    assert loaded["treatment_id"].nunique() == len(set(resolved)) == 3
    assert (loaded.groupby("treatment_id")["seed"].nunique() == 3).all()  # the repeats of each pool
    assert loaded.groupby("treatment_id")["scheduler"].nunique().eq(1).all()
    assert sorted(loaded["scheduler"].unique()) == ["bytescheduler credit 256k", "bytescheduler credit 64k", "fifo"]
    table = speedups(loaded, its, n_resamples=99)
    assert len(table) == 2 and set(table["runs"]) == {3}
    # without the config files the rows say the same
    rows = add_configurations(runs)
    assert rows.groupby("treatment_id")["run_id"].apply(set).map(sorted).sort_values().tolist() == \
        loaded.groupby("treatment_id")["run_id"].apply(set).map(sorted).sort_values().tolist()


def test_a_label_names_its_variant():
    runs, iters = credit_sweep(label_256k="tuned")
    table = speedups(runs, iters, n_resamples=99)
    assert sorted(table["scheduler"]) == ["bytescheduler", "bytescheduler (tuned)"]  # one unlabelled: plain
    assert set(table["runs"]) == {2}
    assert set(add_configurations(runs)["scheduler"]) == {"fifo", "bytescheduler", "bytescheduler (tuned)"}


def test_fifo_stays_the_baseline_and_is_not_guessed_among_variants():
    startup = {"schedulers.fifo.startup_us": 1000.0, "point.schedulers.fifo.startup_us": 1000.0}
    # a labelled variant of fifo beside the plain one: the plain one is the baseline
    runs, iters = credit_sweep(fifo_settings=({}, {**startup, "label": "startup 1 ms"}))
    table = speedups(runs, iters, n_resamples=99)
    assert set(table["baseline"]) == {"fifo"}
    assert sorted(table["scheduler"]) == ["bytescheduler credit 256k", "bytescheduler credit 64k",
                                          "fifo (startup 1 ms)"]
    assert table.set_index("scheduler").loc["fifo (startup 1 ms)", "speedup"] == pytest.approx(1 / 1.2, rel=0.03)
    # two unlabelled fifos: both named by what differs, and neither is guessed to be the baseline
    runs, iters = credit_sweep(fifo_settings=({"point.schedulers.fifo.startup_us": 0.0}, startup))
    named = add_configurations(runs)
    assert set(named.loc[named["scheduler_name"] == "fifo", "scheduler"]) == {"fifo startup 0 us",
                                                                              "fifo startup 1 ms"}
    with pytest.raises(ValueError, match="'fifo startup 0 us', 'fifo startup 1 ms'"):
        speedups(named, iters, n_resamples=99)
    table = speedups(named, iters, baseline="fifo startup 0 us", n_resamples=99)  # named: it is the baseline
    assert len(table) == 3 and set(table["baseline"]) == {"fifo startup 0 us"}
    # fifo on one server and on two
    runs, iters = credit_sweep(fifo_settings=({}, {"roles.servers": '["ps", "ps2"]'}))
    named = add_configurations(runs)
    assert set(named.loc[named["scheduler_name"] == "fifo", "scheduler"]) == {"fifo 1 PS", "fifo 2 PS"}
    with pytest.raises(ValueError, match="'fifo 1 PS', 'fifo 2 PS'"):
        speedups(named, iters, n_resamples=99)
    assert baseline_variant(named, "fifo 2 PS") == "fifo 2 PS"


def test_swept_servers_are_variants_and_setup_names_every_swept_key():
    runs, iters = credit_sweep()
    bs = runs["scheduler"] == "bytescheduler"
    runs.loc[bs & (runs[KEY] == 262144), "roles.servers"] = '["ps", "ps2"]'
    runs["point.roles.servers"] = runs["roles.servers"]
    named = add_configurations(runs)
    assert set(named.loc[bs, "scheduler"]) == {"bytescheduler credit 64k, 1 PS", "bytescheduler credit 256k, 2 PS"}
    lines = "\n".join(_setup(named, named, config_facts(named)))
    assert f"(`{KEY}`) = 65536, 262144; each value a scheduler variant of its own" in lines
    assert '(`roles.servers`) = ["ps"], ["ps", "ps2"]' in lines
    assert "servers: per scheduler variant (swept)" in lines
    assert "bytescheduler credit 64k, 1 PS, bytescheduler credit 256k, 2 PS" in lines  # the Schedulers line


def test_variants_are_ordered_by_value_and_coloured_apart():
    names = ["bytescheduler credit 1M", "fifo", "bytescheduler credit 256k", "p3", "bytescheduler credit 64k",
             "bytescheduler (tuned)", "bytescheduler"]
    order = plots.scheduler_order(names)
    assert order == ["fifo", "bytescheduler", "bytescheduler (tuned)", "bytescheduler credit 64k",
                     "bytescheduler credit 256k", "bytescheduler credit 1M", "p3"]
    colours = {n: tuple(round(x, 4) for x in plots._colour(n, names)) for n in names}
    assert len(set(colours.values())) == len(names)  # each its own
    assert colours["fifo"] == tuple(round(x, 4) for x in plots._colour("fifo"))  # a scheduler keeps its colour
    # without the company, a variant is still a shade of its own scheduler, not another's colour
    assert plots._colour("bytescheduler credit 64k") not in [plots._colour(s) for s in infos() if s != "bytescheduler"]
