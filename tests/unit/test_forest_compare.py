"""Predicted against measured forest/baseline ratios (analysis/forest_compare.py) on a
synthetic sweep: two networks, the forest and two baselines on each."""
from __future__ import annotations

import pandas as pd
import pytest
import yaml

from analysis import forest_compare


def _sweep(tmp_path):
    rows = []
    nets = {"a": {"kind": "star", "count": 4, "bw_mbps": 100, "heterogeneity": None},
            "b": {"kind": "star", "count": 4, "bw_mbps": 100, "heterogeneity": {"kind": "spread", "ratio": 20.0}}}
    runs = [  # network, scheduler, extra columns, bound_s, measured iteration
        ("a", "forest", {}, 0.10, 0.125), ("a", "ring", {"schedulers.ring.order": "given"}, 0.10, 0.11),
        ("a", "fifo", {"roles.servers": '["h0"]'}, 0.30, 0.50),
        ("b", "forest", {}, 0.50, 0.60), ("b", "ring", {"schedulers.ring.order": "topology"}, 2.50, 2.70),
        ("b", "gloo", {"ring_rank_order_bound_s": 3.0}, 2.5, 3.3)]
    for k, (net, sched, extra, bound, measured) in enumerate(runs):
        run_id = f"r{k}"
        (tmp_path / run_id).mkdir()
        cfg = {"name": "s", "seed": 0, "scheduler": sched, "roles": {"workers": ["h0", "h1"]},
               "topology": nets[net], "cross_traffic": []}
        (tmp_path / run_id / "config.yaml").write_text(yaml.safe_dump(cfg))
        rows.append({"run_id": run_id, "status": "ok", "scheduler": sched, "bound_s": bound,
                     "iter_time_median_s": measured, "iter_time_mean_s": measured, "efficiency_basis": "median",
                     "compute_median_s": 0.01, "ring_rank_order_bound_s": float("nan"), **extra})
    return pd.DataFrame(rows)


def test_ratios_per_network_and_baseline(tmp_path):
    table = forest_compare.compare(_sweep(tmp_path), tmp_path).set_index(["network", "baseline"])
    assert sorted(table.index.get_level_values(0).unique()) == ["star", "star heterogeneity=spread(ratio=20)"]
    fifo = table.loc[("star", "fifo (server on h0)")]
    assert fifo["predicted"] == pytest.approx(3.0) and fifo["measured"] == pytest.approx(4.0)
    assert fifo["agreement"] == pytest.approx(4 / 3) and fifo["forest_efficiency"] == pytest.approx(0.8)
    ring = table.loc[("star", "ring (order given)")]
    assert ring["measured"] == pytest.approx(0.88)
    gloo = table.loc[("star heterogeneity=spread(ratio=20)", "gloo")]   # judged on its rank order's ring
    assert gloo["predicted"] == pytest.approx(6.0) and gloo["measured"] == pytest.approx(5.5)


def test_headline_takes_the_fastest_baseline_per_network(tmp_path):
    top = forest_compare.headline(forest_compare.compare(_sweep(tmp_path), tmp_path))
    assert top["ring_allreduce"] == pytest.approx(5.5) and "gloo" in top["ring_allreduce_where"]
    assert top["best"] == pytest.approx(4.5) and "ring (order topology)" in top["best_where"]
    assert top["largest"] == pytest.approx(5.5)


def test_no_forest_no_rows(tmp_path):
    runs = _sweep(tmp_path)
    assert forest_compare.compare(runs[runs["scheduler"] != "forest"], tmp_path).empty


def test_a_forest_run_slower_in_wall_clock_is_on_the_same_network(tmp_path):
    """Time dilation is how the emulation ran, not the network: results are in emulated time."""
    runs = _sweep(tmp_path)
    cfg = yaml.safe_load((tmp_path / "r0" / "config.yaml").read_text())
    (tmp_path / "r0" / "config.yaml").write_text(yaml.safe_dump({**cfg, "time_dilation": 16}))
    table = forest_compare.compare(runs, tmp_path).set_index(["network", "baseline"])
    assert table.loc[("star", "fifo (server on h0)"), "measured"] == pytest.approx(4.0)


def test_a_label_tells_two_rings_of_one_network_apart(tmp_path):
    runs = _sweep(tmp_path)
    extra = runs[runs["run_id"] == "r1"].assign(run_id="r9", label="ranks by rack", iter_time_median_s=0.2)
    (tmp_path / "r9").mkdir()
    cfg = yaml.safe_load((tmp_path / "r1" / "config.yaml").read_text())
    (tmp_path / "r9" / "config.yaml").write_text(yaml.safe_dump({**cfg, "label": "ranks by rack"}))
    table = forest_compare.compare(pd.concat([runs, extra], ignore_index=True), tmp_path)
    star = table[table["network"] == "star"].set_index("baseline")
    assert star.loc["ring (order given)", "measured"] == pytest.approx(0.88)
    assert star.loc["ring (order given, ranks by rack)", "measured"] == pytest.approx(1.6)
