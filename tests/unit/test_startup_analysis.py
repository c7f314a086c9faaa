"""The start-up cost analysis (analysis/startup.py, plots.startup_plot, the report's section)
on a made-up sweep whose answer is known, and the sweep file that feeds it."""
from __future__ import annotations

import math
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from analysis import plots, startup
from analysis.report import _startup, startup_table, write_report
from analysis.speedup import load_comparison
from analysis.tables import load_runs
from emu.config.plan import load_plan
from tasks import _sections
from tests.conftest import REPO
from tests.factories import MINI, is_png

COSTS = (0.0, 1000.0, 5000.0)                      # startup_us
PARTS = {4096: (0.30, 600), 65536: (0.33, 120), 1048576: (0.45, 64)}  # partition: (time at no cost, messages)
LEVELS = {"fifo": (0.50, 64), "mercury": (0.28, 32)}


def true_time(name: str, part: int | None, cost: float) -> float:
    base, msgs = PARTS[part] if name == "bytescheduler" else LEVELS[name]
    return base + msgs * cost / 1e6


def made_up(costs=COSTS, iterations: int = 10, workers: int = 2, noise: float = 0.01,
            seed: int = 0) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Runs and iterations as load_runs and load_iterations give them: one run per scheduler,
    cost and (bytescheduler) partition, its scheduler's resolved tunables as columns (a zero
    cost left out, as the resolved config leaves it), labelled as priority_startup.yaml does."""
    rng = np.random.default_rng(seed)
    runs, iters = [], []
    settings = [("fifo", None), *(("bytescheduler", p) for p in PARTS), ("mercury", None)]
    for cost in costs:
        for name, part in settings:
            rid = f"{name}-{part}-{cost:g}"
            label = ", ".join(x for x in (f"partition {part}" if part else "",
                                          f"startup {cost / 1e3:g} ms" if cost else "") if x)
            row = {"run_id": rid, "sweep": "made-up", "scheduler": f"{name} ({label})" if label else name,
                   "scheduler_name": name, "repeat": 0, "seed": 0, "status": "ok", "label": label or None,
                   "roles.workers": '["w0", "w1"]', "roles.servers": '["ps"]', "workload.model": "vgg",
                   "workload.preset": "small", "workload.warmup": 2, "workload.iterations": iterations,
                   "num_params": 1254618, "topology.kind": "star", "network": "star",
                   "point.scheduler": name, "point.label": label or None}
            for s in ("fifo", "bytescheduler", "mercury"):
                row[f"point.schedulers.{s}.startup_us"] = cost
            if cost:
                row[f"schedulers.{name}.startup_us"] = cost
            if part:
                row["schedulers.bytescheduler.partition_numel"] = part
            runs.append(row)
            clock = 0.0
            for it in range(iterations):
                d = true_time(name, part, cost) * rng.lognormal(0, noise)
                for rank in range(workers):
                    iters.append({"run_id": rid, "rank": rank, "iteration": it, "start": clock, "end": clock + d})
                clock += d
    return pd.DataFrame(runs), pd.DataFrame(iters)


def measured(iters: pd.DataFrame) -> pd.DataFrame:
    return iters[iters["iteration"] >= 2].reset_index(drop=True)  # warm-up 2


def write_made_up(root: Path) -> Path:
    """The made-up sweep on disk, as `./inv sweep` lays out what the figure reads."""
    runs, iters = made_up()
    sweep = root / "made-up"
    for rid, mine in iters.groupby("run_id"):
        (sweep / rid).mkdir(parents=True)
        mine.to_parquet(sweep / rid / "iterations.parquet")
    runs.assign(scheduler=runs["scheduler_name"]).drop(columns=["scheduler_name"]).to_parquet(sweep / "runs.parquet")
    return sweep


def test_summary_finds_the_best_partition_per_cost_and_mercurys_speedup():
    runs, iters = made_up()
    assert startup.varies(runs)
    table = startup.summary(runs, measured(iters), n_resamples=999).set_index("startup_us")
    assert table.index.tolist() == list(COSTS)
    assert table["best_partition"].tolist() == [4096, 65536, 1048576]  # the best partition grows with the cost
    for cost, row in table.iterrows():
        best = min(true_time("bytescheduler", p, cost) for p in PARTS)
        mercury = true_time("mercury", None, cost)
        assert row["bytescheduler_best_s"] == pytest.approx(best, rel=0.02)
        assert row["mercury_s"] == pytest.approx(mercury, rel=0.02)
        assert row["fifo_s"] == pytest.approx(true_time("fifo", None, cost), rel=0.02)
        assert math.isnan(row["p3_s"])  # no p3 run
        assert row["largest_partition"] == 1048576
        assert row["partitioning_gain"] == pytest.approx(true_time("bytescheduler", 1048576, cost) / best, rel=0.03)
        assert row["ci_low"] <= row["mercury_over_best"] <= row["ci_high"]
        assert row["mercury_over_best"] == pytest.approx(best / mercury, rel=0.03)
        assert row["unit"] == "iterations"  # one run per setting
    shown = startup_table(table.reset_index())
    assert "configuration" not in shown and "p3 (ms)" not in shown  # one configuration, no p3
    assert shown["best bytescheduler partition"].tolist() == ["4,096", "65,536", "1,048,576"]
    assert shown["start-up (ms)"].tolist() == ["0", "1", "5"]


def test_runs_are_grouped_by_their_own_cost_and_partition_not_by_label():
    """A zero cost is absent from the resolved config (read as 0); labels do not split groups."""
    runs, iters = made_up()
    runs["scheduler"] = runs["scheduler_name"]  # no labels: the settings still come apart
    t = startup.times(runs, measured(iters), n_resamples=99)
    assert len(t) == len(COSTS) * (len(PARTS) + 2) and set(t["runs"]) == {1}
    assert t.loc[t["scheduler"] != "bytescheduler", "partition_numel"].isna().all()
    bs = t[t["scheduler"] == "bytescheduler"]
    assert sorted(zip(bs["startup_us"], bs["partition_numel"])) == sorted((c, p) for c in COSTS for p in PARTS)


def test_a_sweep_without_both_costs_and_partitions_has_no_startup_section(tmp_path):
    assert not startup.varies(made_up(costs=(1000.0,))[0])  # one cost
    runs = made_up()[0]
    assert not startup.varies(runs[~runs["scheduler_name"].eq("bytescheduler")])  # no partitions
    with pytest.raises(plots.Skipped):
        plots.startup_plot(MINI, out=tmp_path / "s.png")
    mini_runs, mini_iters = load_comparison(MINI)
    assert _startup(mini_runs, mini_iters, MINI, tmp_path) == []


@pytest.mark.slow
def test_startup_figure_and_report_section(tmp_path):
    sweep = write_made_up(tmp_path)
    out = plots.startup_plot(sweep, out=tmp_path / "startup.png", formats=("png", "pdf"))
    assert out == tmp_path / "startup.png" and is_png(out)
    assert (tmp_path / "startup.pdf").read_bytes()[:4] == b"%PDF"
    runs, iters = load_comparison(sweep)
    md = "\n".join(_startup(runs, iters, sweep, tmp_path / "rep"))
    assert md.startswith("## Start-up cost: partitioning against Mercury")
    assert "| start-up (ms) | best bytescheduler partition |" in md
    assert "| 5 | 1,048,576 |" in md and "| 0 | 4,096 |" in md
    assert "![Start-up cost](startup.png)" in md and is_png(tmp_path / "rep" / "startup.png")


def test_the_startup_sweep_file():
    """24 runs with distinct ids; each run's own scheduler carries the cost its label names."""
    plan = load_plan(REPO / "configs" / "sweeps" / "priority_startup.yaml", _sections())
    ids = [e.run_id(0) for e in plan.experiments]
    assert plan.name == "priority-startup" and plan.repeats == 1 and len(ids) == 24 == len(set(ids))
    seen, variants = set(), set()
    for e in plan.experiments:
        own = e.resolved()["schedulers"][e.scheduler]
        cost = own.get("startup_us", 0)
        assert (f"startup {cost / 1e3:g} ms" in (e.label or "")) == bool(cost)
        part = own.get("partition_numel")
        if e.scheduler == "bytescheduler":
            assert own["credit_numel"] == 4 * part
            assert (f"partition {part}" in (e.label or "")) == (bool(cost) or part != 16384)
        seen.add((e.scheduler, cost, part))
        variants.add((e.scheduler, e.label))
        assert e.workload["model"] == "vgg" and e.workload["iterations"] == 8 and e.workload["warmup"] == 2
        assert [h.bw_mbps for h in e.topology.hosts] == [424, 106, 106, 106, 106]
    assert len(seen) == len(variants) == 24  # every setting is a variant of its own in the report


@pytest.mark.slow
def test_report_has_the_startup_section(tmp_path):
    """The whole report of the made-up sweep (role specs, links and config borrowed from a
    mini run): the generic sections take the labelled variants, and the section is in."""
    sweep = write_made_up(tmp_path)
    # a 50 Mb/s run: its links, gradient size and iteration count are what the physics checks
    # see, and the made-up times must not beat them
    donor = MINI / "05868d9c075f"
    spec = yaml.safe_load((donor / "config.yaml").read_text())
    runs = pd.read_parquet(sweep / "runs.parquet")
    for i, run in runs.iterrows():
        d = sweep / run["run_id"]
        shutil.copytree(donor / "roles", d / "roles")
        shutil.copy(donor / "links.parquet", d / "links.parquet")
        own = {k.split(".", 2)[2]: v for k, v in run.items()
               if k.startswith(f"schedulers.{run['scheduler']}.") and pd.notna(v)}
        (d / "config.yaml").write_text(yaml.safe_dump(
            {**spec, "name": "made-up", "scheduler": run["scheduler"], "schedulers": {run["scheduler"]: own},
             **({"label": run["label"]} if run["label"] else {})}))
        its = pd.read_parquet(d / "iterations.parquet")
        its = its.assign(compute_s=0.02, wait_s=its["end"] - its["start"] - 0.02)
        its.to_parquet(d / "iterations.parquet")
        t = (its["end"] - its["start"]).median()
        runs.loc[i, ["iter_time_median_s", "wait_median_s", "compute_median_s"]] = [t, t - 0.02, 0.02]
    donor_row = load_runs(MINI).set_index("run_id").loc[donor.name]
    for col in ("workload.batch_size", "num_tensors", "num_params", "workload.iterations", "topology.hosts",
                "compute_mode"):
        runs[col] = donor_row[col]
    runs.assign(shaping="[]", fidelity_ok=True, fidelity_reasons="", reason="").to_parquet(sweep / "runs.parquet")
    md = write_report(sweep).read_text()
    assert "| star | bytescheduler (partition 4096, startup 5 ms) | 1 |" in md
    assert "## Start-up cost: partitioning against Mercury" in md and "| 5 | 1,048,576 |" in md
    assert is_png(sweep / "report" / "startup.png")
