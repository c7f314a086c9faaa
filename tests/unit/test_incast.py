"""The Incast section (analysis/incast.py, analysis/report.py): the server-link fraction from a
run's capacity graph, when the section is shown, and its table over a small hand-made frame."""
from __future__ import annotations

import json
import math
from pathlib import Path

import networkx as nx
import numpy as np
import pandas as pd
import pytest

from analysis import incast, report
from contracts.role_spec import Address, RoleSpec, SchedulerChoice
from tests.factories import racks_graph, star_graph

WORKERS = [f"w{i}" for i in range(8)]


def test_server_links_sum_the_directions_into_the_servers_and_out_of_the_workers():
    g, _ = star_graph({**{w: 100 for w in WORKERS}, "ps": 100}, up=[100] * 8 + [50])
    assert incast.server_links(g, WORKERS, ["ps"]) == (100e6, 800e6)      # into ps: s1->ps (down), not ps->s1
    g, hosts = racks_graph([2, 2], 10, 5, extra=[("ps", 0, 40)])
    assert incast.server_links(g, hosts, ["ps"]) == (40e6, 40e6)
    assert incast.server_links(g, hosts, []) == (0.0, 40e6)


def _run_dir(sweep: Path, run_id: str, server_mbps: float | None) -> dict:
    """A run directory with the role spec the fraction is read from, and its row's roles."""
    rates = {**{w: 100 for w in WORKERS}, **({"ps": server_mbps} if server_mbps else {})}
    g, _ = star_graph(rates)
    servers = ["ps"] if server_mbps else []
    d = sweep / run_id / "roles"
    d.mkdir(parents=True)
    spec = RoleSpec(seed=0, servers=[Address(host=s, ip="10.0.0.9", port=1) for s in servers],
                    workers=[Address(host=w, ip="10.0.0.1", port=1) for w in WORKERS],
                    scheduler=SchedulerChoice(name="fifo"), workload={}, out_dir=str(sweep / run_id),
                    topology=nx.node_link_data(g, edges="links"), role="worker", rank=0)
    (d / "worker0.json").write_text(spec.model_dump_json())
    return {"run_id": run_id, "roles.workers": json.dumps(WORKERS), "roles.servers": json.dumps(servers)}


def test_fractions_from_the_runs_role_specs(tmp_path):
    rows = [_run_dir(tmp_path, "a", 100), _run_dir(tmp_path, "b", 800), _run_dir(tmp_path, "c", None),
            {"run_id": "gone", "roles.workers": json.dumps(WORKERS), "roles.servers": json.dumps(["ps"])}]
    r = incast.with_fractions(pd.DataFrame(rows), tmp_path)
    assert r["server_fraction"].tolist()[:2] == [0.125, 1.0] and r["server_in_bps"].iloc[0] == 100e6
    assert r["server_fraction"].iloc[2:].isna().all()   # no server; no role spec


def test_the_section_is_shown_below_the_workers_sum_or_by_name():
    def runs(*fractions):
        return pd.DataFrame({"server_fraction": list(fractions)})

    assert incast.applies(runs(0.125, 0.25, 1.0), "priority8")
    assert not incast.applies(runs(1.0, 2.0), "priority8")                 # never below the sum
    assert not incast.applies(runs(0.5, 0.5), "priority8")                 # not varied
    assert incast.applies(runs(0.5, 0.5), "incast") and incast.applies(runs(2.0), "Incast-e2e")
    assert not incast.applies(runs(np.nan), "incast")                      # no PS run: nothing to show
    assert not incast.applies(pd.DataFrame({"x": [1]}), "incast")


@pytest.mark.parametrize("f, text", [(0.125, "1/8"), (0.25, "1/4"), (1.0, "1"), (2.0, "2"), (0.3, "3/10"),
                                     (0.123456, "0.123"), (np.nan, "–")])
def test_fraction_text(f, text):
    assert incast.fraction_text(f) == text


def _frame() -> pd.DataFrame:
    """Two fractions x two schedulers, fifo twice at 1/8; a failed run, a ring run (no
    servers) and a row from before the TCP counters, which the table leaves out or shows NaN."""
    base = {"status": "ok", "workload.iterations": 10, "fidelity_ok": True}
    rows = [
        dict(config="server 1/8", scheduler="fifo", server_fraction=0.125, server_in_bps=100e6,
             iter_time_median_s=3.0, bound_s=2.0, efficiency=2 / 3, tcp_retrans_segs=400, tcp_timeouts=6,
             server_port_drops=300, queue_drops=310, fidelity_cpu_idle_min=0.4),
        dict(config="server 1/8", scheduler="fifo", server_fraction=0.125, server_in_bps=100e6,
             iter_time_median_s=3.4, bound_s=2.0, efficiency=2 / 3.4, tcp_retrans_segs=600, tcp_timeouts=2,
             server_port_drops=500, queue_drops=500, fidelity_cpu_idle_min=0.3, fidelity_ok=False),
        dict(config="server 1/8", scheduler="mercury", server_fraction=0.125, server_in_bps=100e6,
             iter_time_median_s=2.5, bound_s=2.0, efficiency=0.8, tcp_retrans_segs=50, tcp_timeouts=0,
             server_port_drops=40, fidelity_cpu_idle_min=0.5),
        dict(config="server 1", scheduler="mercury", server_fraction=1.0, server_in_bps=800e6,
             iter_time_median_s=0.5, bound_s=0.45, efficiency=0.9, tcp_retrans_segs=0, tcp_timeouts=0,
             server_port_drops=0, fidelity_cpu_idle_min=0.2),
        dict(config="server 1", scheduler="fifo", server_fraction=1.0, server_in_bps=800e6,
             iter_time_median_s=0.6, bound_s=0.45, efficiency=0.75, tcp_retrans_segs=np.nan, tcp_timeouts=np.nan,
             server_port_drops=np.nan, fidelity_cpu_idle_min=0.25, fidelity_ok=None),
        dict(config="server 1", scheduler="fifo", server_fraction=1.0, status="failed", iter_time_median_s=np.nan),
        dict(config="server 1", scheduler="ring", server_fraction=np.nan, iter_time_median_s=0.3),
    ]
    return pd.DataFrame([{**base, **r} for r in rows])


def test_table_one_row_per_scheduler_and_fraction():
    t = incast.table(_frame(), order=["fifo", "mercury"])
    assert list(zip(t["server_fraction"], t["scheduler"], strict=True)) == \
        [(0.125, "fifo"), (0.125, "mercury"), (1.0, "fifo"), (1.0, "mercury")]
    fifo = t.iloc[0]
    assert fifo["runs"] == 2 and fifo["iter_time_s"] == pytest.approx(3.2) and fifo["bound_s"] == 2.0
    assert fifo["efficiency"] == pytest.approx((2 / 3 + 2 / 3.4) / 2)
    assert fifo["retrans_per_iter"] == 50 and fifo["timeouts"] == 4 and fifo["server_port_drops"] == 400
    assert fifo["other_drops"] == 5   # median of 10 and 0
    assert (fifo["fidelity_passed"], fifo["fidelity_judged"], fifo["cpu_idle_min"]) == (1, 2, 0.3)
    assert fifo["server_mbps"] == 100
    old = t.iloc[2]   # recorded before the counters: NaN, and no verdict
    assert old["runs"] == 1 and math.isnan(old["retrans_per_iter"]) and math.isnan(old["server_port_drops"])
    assert old["fidelity_judged"] == 0
    assert incast.one_config_per_fraction(t)
    assert not incast.one_config_per_fraction(t.assign(config=["a", "b", "c", "c"]))


def test_report_table_and_section(tmp_path):
    shown = report.incast_table(incast.table(_frame(), order=["fifo", "mercury"]))
    assert shown["server link"].tolist() == ["1/8 (100 Mb/s)"] * 2 + ["1 (800 Mb/s)"] * 2
    first, old = shown.iloc[0], shown.iloc[2]
    assert (first["iteration ms"], first["bound ms"], first["eff."], first["retrans./iter."], first["RTOs"],
            first["drops"], first["other drops"], first["fidelity"], first["CPU idle min"]) == \
        ("3200", "2000", "0.63", "50.0", "4", "400", "5", "1/2", "30%")
    assert (old["retrans./iter."], old["drops"], old["other drops"], old["fidelity"]) == ("–", "–", "–", "not judged")

    # the section over run directories: the fraction read from each run's role spec
    rows = []
    for i, (mbps, sched) in enumerate([(100, "fifo"), (100, "mercury"), (800, "fifo"), (800, "mercury")]):
        row = _run_dir(tmp_path, f"r{i}", mbps)
        rows.append({**row, "status": "ok", "config": f"server {mbps}", "scheduler": sched,
                     "workload.iterations": 10, "iter_time_median_s": 1.0, "tcp_retrans_segs": 10.0 * i})
    lines = report._incast(pd.DataFrame(rows), tmp_path, "some sweep")
    text = "\n".join(lines)
    assert lines[0] == "## Incast" and "| 1/8 (100 Mb/s) | fifo | 1 | 1000 |" in text and "configuration" not in text
    assert "| 1 (800 Mb/s) | mercury | 1 | 1000 | – | – | 3.0 |" in text
    same = pd.DataFrame(rows[2:])   # one fraction, a sweep not named incast: no section
    assert report._incast(same, tmp_path, "priority8") == []
