"""The check's one Mininet run: the demo network (configs/demo.yaml) with the scheduler swapped in.

It goes through the normal run path (load_plan, preflight, run_plan, bounds), so the run is
a row like any other, in `results/<root>/check-<name>/`; its row gives the fidelity verdict
and, where the scheduler declares a bound model, the efficiency ("no bound" otherwise). A
collective scheduler keeps the demo's workers and drops its server. The workers replay the
demo model's compute profile (profiles/cnn-small.json) instead of training: the verdict then
judges the scheduler's own use of the CPU, not two trainings sharing this machine's cores.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import yaml

from analysis import catalog
from analysis.bounds import annotate
from conformance.checks import Row
from emu.config.experiment import ConfigError, Sections
from emu.config.plan import load_plan, read_yaml
from emu.run.results import update_runs
from emu.sweeps.sweep import run_plan
from emu.testbed import preflight
from schedulers import registry
from workloads.local import REPO

DEMO = REPO / "configs" / "demo.yaml"


def config(name: str, extra: dict | None = None) -> dict:
    """The demo config for scheduler `name` alone; `extra`: top-level keys to add (`plugins`)."""
    raw = read_yaml(DEMO)
    raw.pop("grid", None)
    raw.update(name=f"check-{name}", scheduler=name, **(extra or {}))
    raw["workload"] = {**raw["workload"], "compute": "replay"}
    if not registry.SCHEDULERS[name].Params.requires_servers:
        raw["roles"] = {"servers": [], "workers": raw["roles"]["workers"]}
    return raw


def run(name: str, results: Path, sections: Callable[[], Sections], plugins: list[str] = ()) -> list[Row]:
    """Run the demo with `name` into `results`; the verdict's and the efficiency's rows.
    `sections`: what validates a config (tasks.py's, which loads a config's `plugins:`);
    `plugins`: absolute paths, the config's `plugins:` (so the roles in the hosts load them)."""
    results.mkdir(parents=True, exist_ok=True)
    path = results / f"check-{name}.yaml"
    path.write_text(yaml.safe_dump(config(name, {"plugins": list(plugins)} if plugins else None), sort_keys=False))
    try:
        plan = load_plan(path, sections())
        preflight.check(plan)
        rows = run_plan(plan, results, force=True)
    except ConfigError as e:
        return [Row("mininet run", "-", False, f"the demo config with {name}: {e}")]
    sweep_dir = results / plan.name
    catalog.install(registry.infos())
    update_runs(sweep_dir, lambda runs: annotate(runs, sweep_dir))
    row = pd.read_parquet(sweep_dir / "runs.parquet").set_index("run_id").loc[rows[-1]["run_id"]]
    return judge(row, sweep_dir)


def judge(row: pd.Series, sweep_dir: Path) -> list[Row]:
    """The run's status and fidelity verdict as one row, its efficiency (or "no bound") as another."""
    if row["status"] != "ok":
        return [Row("mininet run", row["status"], False, f"{row.get('reason', '')} ({sweep_dir})")]
    median = row["iter_time_median_s"] * 1e3
    ok = bool(row.get("fidelity_ok", False))
    verdict = Row("mininet run", f"{median:.0f} ms median, fidelity {'ok' if ok else 'failed'}", ok,
                  "" if ok else str(row.get("fidelity_reasons", "")))
    eff = row.get("efficiency", math.nan)
    if eff is None or not math.isfinite(eff):
        return [verdict, Row("efficiency", "no bound", True, str(row.get("bound_capacity") or ""))]
    return [verdict, Row("efficiency", f"{eff:.2f} of the {row['bound_model']} bound", True)]
