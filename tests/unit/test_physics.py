"""The physics checks of the verdict (analysis/physics.py) on the committed mini result set:
a run made to look faster than its links allow (its capacity graph's rates divided, so its
bound lies above what it measured) or to carry fewer bytes than its gradients (its link
counters scaled down) fails with the code and the figures; the honest runs pass; the report
lists a failing run apart and leaves it out of its means. Each test alters a copy."""
from __future__ import annotations

import json
import re
import shutil

import pandas as pd
import pytest

from analysis import bounds, fidelity, physics, report
from analysis.tables import load_runs
from contracts.fidelity import decode
from tests.conftest import REPO

MINI = REPO / "tests" / "data" / "results" / "mini"
RUN = "756ac12fa397"  # bytescheduler, median iteration 139.5 ms, parameter_server bound 91.6 ms (efficiency 0.657)


@pytest.fixture
def sweep(tmp_path):
    dst = tmp_path / "mini"
    shutil.copytree(MINI, dst)
    bounds._graph.cache_clear()  # keyed by the run directory, whose roles the tests rewrite
    yield dst
    bounds._graph.cache_clear()


def scale_rates(run_dir, factor: float) -> None:
    """Every role's capacity graph (roles/*.json, what load_graph reads) with its rates x factor."""
    for path in (run_dir / "roles").glob("*.json"):
        spec = json.loads(path.read_text())
        for link in spec["topology"]["links"]:
            link["capacity"] *= factor
        path.write_text(json.dumps(spec, indent=1))
    bounds._graph.cache_clear()


def scale_bytes(run_dir, factor: float, links: tuple[str, ...] | None = None) -> None:
    path = run_dir / "links.parquet"
    df = pd.read_parquet(path)
    hit = df["link"].isin(links) if links else slice(None)
    df.loc[hit, "tx_bytes_per_s"] *= factor
    df.to_parquet(path)


def honest_reason(run) -> str:
    return load_runs(MINI).set_index("run_id").loc[run.name, "fidelity_reasons"]


def judged(sweep_dir) -> pd.DataFrame:
    return bounds.annotate(load_runs(sweep_dir), sweep_dir).set_index("run_id")


def test_honest_runs_pass_both_checks_and_keep_the_monitors_verdict():
    runs = judged(MINI)
    stored = load_runs(MINI).set_index("run_id")
    assert (runs["physics_ok"] == True).all() and (runs["physics_reasons"] == "").all()  # noqa: E712
    assert (runs["physics_unjudged"] == "").all()
    assert runs["physics_bytes_min"].between(1.0, 1.01).all()  # frames: a little more than G per iteration
    assert runs["efficiency"].max() < 0.7 and runs["cut_efficiency"].max() < 0.7
    assert (runs["fidelity_ok"] == stored["fidelity_ok"]).all()  # CPU idle failed them all, and only that
    assert (runs["fidelity_reasons"] == stored["fidelity_reasons"]).all()
    assert runs["fidelity_codes"].map(decode).tolist() == [["cpu_idle"]] * len(runs)


def test_a_run_whose_bound_lies_above_its_measured_iteration_fails_with_the_figures(sweep):
    honest = judged(sweep).loc[RUN]
    scale_rates(sweep / RUN, 1 / 20)  # a bound computed on a twentieth of the rates: 20x the time
    runs = judged(sweep)
    run = runs.loc[RUN]
    assert run["efficiency"] == pytest.approx(20 * honest["efficiency"], rel=1e-9)  # 13.1
    measured, bound = run["iter_time_median_s"] * 1e3, run["bound_s"] * 1e3
    sentence = f"median iteration {measured:.1f} ms is below its parameter_server bound {bound:.1f} ms " \
               f"(efficiency {run['efficiency']:.3g} > 1.05)"
    assert sentence == \
        "median iteration 139.5 ms is below its parameter_server bound 1831.8 ms (efficiency 13.1 > 1.05)"
    cut = f"median iteration {measured:.1f} ms is below its cut bound {bound:.1f} ms " \
          f"(cut efficiency {run['cut_efficiency']:.3g} > 1.05)"
    assert run["physics_ok"] == False and run["fidelity_ok"] == False  # noqa: E712
    assert run["physics_reasons"] == f"{sentence}; {cut}"
    assert run["fidelity_reasons"] == f"{honest['fidelity_reasons']}; {sentence}; {cut}"
    assert decode(run["fidelity_codes"]) == ["cpu_idle", "below_bound", "below_bound"]
    assert (runs.drop(index=RUN)["physics_ok"] == True).all()  # noqa: E712 - the others are untouched
    # the summary counts it under its own line
    s = fidelity.summary(runs.reset_index())
    counts = dict(zip(s["reasons"]["category"], s["reasons"]["runs"], strict=True))
    assert counts[fidelity.CATEGORIES["below_bound"]] == 1 and counts[fidelity.CATEGORIES["cpu_idle"]] == 8


def test_a_bound_far_below_the_measured_iteration_passes(sweep):
    scale_rates(sweep / RUN, 20)  # twenty times the rates: the bound is the compute, 19 ms
    run = judged(sweep).loc[RUN]
    assert run["efficiency"] < 0.2 and run["physics_ok"] == True  # noqa: E712


@pytest.mark.parametrize("efficiency, tolerance, ok", [(1.03, None, True), (1.08, None, False), (1.08, 0.1, True)])
def test_below_bound_allows_the_runs_own_rate_tolerance(sweep, efficiency, tolerance, ok):
    honest = judged(sweep).loc[RUN, "efficiency"]
    scale_rates(sweep / RUN, honest / efficiency)  # the communication bound decides: efficiency scales with 1/rate
    runs = load_runs(sweep)
    if tolerance is not None:
        runs["fidelity.rate_tolerance"] = tolerance
    run = bounds.annotate(runs, sweep).set_index("run_id").loc[RUN]
    assert run["efficiency"] == pytest.approx(efficiency, rel=1e-9)
    assert run["physics_ok"] == ok
    if not ok:
        assert "(efficiency 1.08 > 1.05)" in run["physics_reasons"]


def test_links_that_carried_less_than_the_gradients_fail_with_too_few_bytes(sweep):
    scale_bytes(sweep / RUN, 0.5)
    run = judged(sweep).loc[RUN]
    assert run["physics_ok"] == False and run["fidelity_ok"] == False  # noqa: E712
    assert decode(run["fidelity_codes"]) == ["cpu_idle", "too_few_bytes"]
    assert run["physics_bytes_min"] == pytest.approx(0.5028, abs=1e-3)
    m = re.fullmatch(r"(w[01]) (sent|received) ([\d.]+) kB per iteration over (\S+), below G = 547\.5 kB "
                     r"\(4 bytes x 136,874 parameters, at least 0\.95 G counting frames, over 12 iterations\), "
                     r"and 3 other worker host direction\(s\) short too", run["physics_reasons"])
    assert m, run["physics_reasons"]
    assert float(m[3]) == pytest.approx(0.5028 * 547.496, abs=0.1)  # 275.3 kB
    assert m[4] == (f"{m[1]}->s1" if m[2] == "sent" else f"s1->{m[1]}")
    assert fidelity.findings(run) == [("cpu_idle", honest_reason(run)), ("too_few_bytes", run["physics_reasons"])]


def test_one_short_direction_is_named(sweep):
    scale_bytes(sweep / RUN, 0.9, links=("s1->w1",))  # 0.9 of G: 5% more would pass
    run = judged(sweep).loc[RUN]
    assert run["physics_reasons"].startswith("w1 received 495.8 kB")
    assert "over s1->w1, below G = 547.5 kB" in run["physics_reasons"] and "other" not in run["physics_reasons"]
    scale_bytes(sweep / RUN, 0.96 / 0.9, links=("s1->w1",))  # 0.96 x 1.005 G: within the tolerance
    assert judged(sweep).loc[RUN, "physics_ok"] == True  # noqa: E712


def test_a_run_without_links_parquet_is_not_judged_on_bytes_and_says_so(sweep):
    (sweep / RUN / "links.parquet").unlink()
    run = judged(sweep).loc[RUN]
    assert run["physics_ok"] == True and run["physics_unjudged"] == "too_few_bytes: no links.parquet"  # noqa: E712
    assert pd.isna(run["physics_bytes_min"])


def test_applying_again_replaces_the_physics_findings_and_restores_the_monitors_verdict(sweep):
    runs = load_runs(sweep)
    runs["fidelity_ok"], runs["fidelity_reasons"] = True, ""  # monitors passed every run
    scale_rates(sweep / RUN, 1 / 20)
    once = bounds.annotate(runs, sweep)
    twice = physics.apply(once, sweep)
    pd.testing.assert_frame_equal(once, twice)
    assert decode(once.set_index("run_id").loc[RUN, "fidelity_codes"]) == ["below_bound", "below_bound"]
    scale_rates(sweep / RUN, 20)  # the bug fixed, the sweep annotated again
    fixed = bounds.annotate(twice, sweep).set_index("run_id").loc[RUN]
    assert fixed["fidelity_ok"] == True and fixed["fidelity_reasons"] == ""  # noqa: E712
    assert decode(fixed["fidelity_codes"]) == []


@pytest.mark.slow
def test_the_report_lists_a_run_that_breaks_physics_instead_of_averaging_it(sweep, monkeypatch):
    monkeypatch.setattr(report, "FIGURES", [])  # the figures are another test's; this one reads the text
    honest = report.write_report(sweep, sweep / "honest").read_text()
    assert "## Runs that break physics" not in honest
    scale_rates(sweep / RUN, 1 / 20)
    md = report.write_report(sweep, sweep / "report").read_text()
    section = md.split("## Runs that break physics")[1].split("\n## ")[0]
    assert f"| {RUN} | bytescheduler |" in section
    assert "median iteration 139.5 ms is below its parameter_server bound 1831.8 ms (efficiency 13.1 > 1.05)" in section
    summary = md.split("## Summary")[1].split("\n## ")[0]
    config = load_runs(sweep).set_index("run_id")
    partner = "0b7b2e38f429"  # the other bytescheduler run of that configuration
    assert config.loc[RUN, "point.topology.hosts.2.bw_mbps"] == config.loc[partner, "point.topology.hosts.2.bw_mbps"]
    rows = [line for line in summary.splitlines() if "| bytescheduler |" in line]
    before = [line for line in honest.split("## Summary")[1].split("\n## ")[0].splitlines()
              if "| bytescheduler |" in line]
    assert sorted(int(r.split(" | ")[2]) for r in rows) == [1, 2]  # that configuration's mean is of one run
    assert sorted(int(r.split(" | ")[2]) for r in before) == [2, 2]
    assert "1 run(s) that break physics are left out" in summary
    assert "13.1" not in summary and "13.1" not in md.split("## Bounds")[1].split("\n## ")[0]
    fid = md.split("## Fidelity")[1].split("\n## ")[0]
    assert fidelity.CATEGORIES["below_bound"] in fid
