"""Short labels of sweep points (contracts/point_label.py): what the dry run, progress bars and
reports call a point. Only what varies, abbreviated, never raw JSON, at most about 40 characters."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from tqdm import tqdm

from analysis.tables import add_configurations
from contracts.point_label import LIMIT, short_labels
from emu.config.experiment import ConfigError
from emu.config.plan import load_plan
from emu.sweeps.sweep import BAR_DESC, bar_desc, point_columns
from tasks import _sections
from tests.conftest import REPO
from tests.factories import GOOD, dump

CONFIGS = sorted(p for p in (REPO / "configs").rglob("*.yaml") if "ray" not in p.parts)
REPORT_LIMIT = 60  # what a report or dry run may show, clash suffixes included


def test_only_the_keys_that_vary_and_not_those_that_follow_from_them():
    points = [{"scheduler": s, "workload.model": m, "topology.hosts.1.bw_mbps": bw, "topology.hosts.0.bw_mbps": 8 * bw}
              for s in ("fifo", "mercury") for m, bw in (("vgg", 42), ("vgg", 21), ("bert", 42))]
    labels = short_labels(points, host_names=["ps", "w0"])
    assert labels[:3] == ["vgg · w0 42 Mb/s", "vgg · w0 21 Mb/s", "bert · w0 42 Mb/s"]
    assert labels[3:] == labels[:3]  # the scheduler is a treatment, not part of the point


def test_a_zipped_model_and_its_bandwidths_show_the_model_alone():
    points = [{"workload.model": m, "topology.hosts.1.bw_mbps": bw, "topology.hosts.2.bw_mbps": bw}
              for m, bw in (("alexnet", 42), ("vgg", 52))]
    assert short_labels(points) == ["alexnet", "vgg"]


def test_mappings_show_their_kind_and_what_differs_never_json():
    star = {"kind": "star", "count": 6, "bw_mbps": 100}
    points = [{"topology": star}, {"topology": {**star, "heterogeneity": {"kind": "spread", "ratio": 20}}},
              {"topology": {"kind": "racks", "racks": 3}}]
    labels = short_labels(points)
    assert labels == ["star", "star ratio 20", "racks"]
    assert not any("{" in x for x in labels)


def test_lists_of_mappings_show_their_kinds():
    points = [{"faults": []}, {"faults": [{"kind": "stop"}]}, {"faults": [{"kind": "link_down"}] * 3}]
    assert short_labels(points) == ["no faults", "stop", "link_down x3"]


def test_labels_are_cut_to_the_limit_and_stay_distinct():
    points = [{f"a.very_long_key_name_{i}": v for i in range(6)} for v in range(3)]
    points += [{"x": "y" * 100}]
    labels = short_labels(points)
    assert all(len(x) <= LIMIT for x in labels)
    assert len(set(labels)) == len(labels)


def test_a_named_point_shows_its_name(tmp_path):
    dump(tmp_path / "base.yaml", GOOD)
    sweep = dump(tmp_path / "s.yaml", {"base": "base.yaml", "name": "s",
                                       "grid": {"workload.batch_size": {"batch 8": 8, "batch 64": 64}},
                                       "zip": {"point_name": ["slow", "fast"], "topology.hosts.1.bw_mbps": [5, 50]}})
    plan = load_plan(sweep, _sections())
    got = {(e.workload["batch_size"], e.net.rate("w0", "s1"), label)
           for e, label in zip(plan.experiments, plan.labels())}
    assert got == {(8, 5, "batch 8 · slow"), (8, 50, "batch 8 · fast"), (64, 5, "batch 64 · slow"),
                   (64, 50, "batch 64 · fast")}
    plain = dump(tmp_path / "p.yaml", {"base": "base.yaml", "name": "s", "grid": {"workload.batch_size": [8, 64]},
                                       "zip": {"topology.hosts.1.bw_mbps": [5, 50]}})
    # names are not part of the experiment: the run ids are those of the same sweep without them
    assert {e.run_id(0) for e in plan.experiments} == {e.run_id(0) for e in load_plan(plain, _sections()).experiments}


@pytest.mark.parametrize("sweep,message", [
    ({"zip": {"point_name": ["{json}"], "seed": [1]}}, "zip.point_name.0: a point's short name must be text"),
    ({"zip": {"point_name": ["x" * 41], "seed": [1]}}, "zip.point_name.0: a point's short name must be text"),
    ({"grid": {"point_name": ["a"]}}, "grid.point_name: names points of a zip"),
    ({"grid": {"seed": {"": 1}}}, "grid.seed: a point's short name must be text"),
])
def test_bad_names_are_refused_naming_the_field(tmp_path, sweep, message):
    dump(tmp_path / "base.yaml", GOOD)
    path = dump(tmp_path / "s.yaml", {"base": "base.yaml", **sweep})
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("{", r"\{")):
        load_plan(path, _sections())


def _runs(plan) -> pd.DataFrame:
    """A runs table as a sweep of `plan` would store it (its point columns), without running."""
    rows = []
    for i, (exp, point) in enumerate(zip(plan.experiments, plan.points)):
        hosts = exp.resolved()["topology"].get("hosts") or [{"name": h} for h in exp.net.hosts]
        rows.append({"run_id": f"r{i}", "sweep": plan.name, "scheduler": exp.scheduler, "status": "ok",
                     "seed": exp.seed, "topology.hosts": json.dumps(hosts), **point_columns(point)})
    return pd.DataFrame(rows)


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: str(p.relative_to(REPO)))
def test_no_label_of_a_config_in_the_repository_is_long(path: Path):
    plan = load_plan(path, _sections())
    labels = plan.labels()
    assert all(len(x) <= LIMIT for x in labels), max(labels, key=len)
    reported = add_configurations(_runs(plan))["config"]
    assert reported.str.len().max() <= REPORT_LIMIT, reported[reported.str.len().idxmax()]
    assert not reported.str.contains("[{]", regex=True).any()


def test_a_progress_bar_fits_80_columns():
    class Exp:
        scheduler, label = "hierarchical", None
    desc = bar_desc(4999, 5000, Exp(), 2, "x" * LIMIT, repeats=3)
    assert len(desc) <= BAR_DESC
    line = tqdm.format_meter(399, 400, 3599.0, ncols=80, prefix=desc, unit="it")
    assert len(line) <= 80, line
