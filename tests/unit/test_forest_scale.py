"""The forest's predicted speed-up over each baseline and its two factors
(analysis/forest_scale.py), on networks whose ratios have closed forms."""
from __future__ import annotations

import pandas as pd
import pytest

from analysis.bounds import best_ring_bound_s, forest_bound_s, hierarchical_bound_s, ps_bound_s, ring_bound_s
from analysis.forest_scale import HIERARCHICAL, PAPER_BEST, cap_text, largest, predict
from tests.factories import racks_graph, star_graph


def _interleaved(hosts: list[str]) -> list[str]:
    half = len(hosts) // 2
    return [h for pair in zip(hosts[:half], hosts[half:]) for h in pair]


def test_ring_in_interleaved_order_crosses_the_uplink_n_minus_1_times():
    # 2 racks of 4 at 100 Mb/s, 20 Mb/s uplinks (20:1): the forest is held by an uplink's cut (20
    # Mb/s; its host links would allow 8 x 100 / 14). Ranks alternate between the racks, so each of
    # the 8 ring hops crosses an uplink: 4 hops x 2(8-1)/8 = 7 gradients on it, where a tree puts 1.
    g, hosts = racks_graph([4, 4], 100, 20)
    workers = _interleaved(hosts)
    t = predict(g, workers, "r0h0").set_index("baseline")
    given = t.loc["ring (order given)"]
    assert given["predicted"] == pytest.approx(7.0, rel=1e-6)
    assert given["bottleneck_gradients"] == pytest.approx(7.0) and given["pattern_cap"] == pytest.approx(7.0)
    assert given["held_by"] == "cut" and given["forest_of_bottleneck"] == pytest.approx(1.0, rel=1e-6)
    assert t.loc["ring (order topology)", "predicted"] == pytest.approx(2 * 7 / 8, rel=1e-6)
    assert t.loc["parameter server (best host)", "predicted"] == pytest.approx(4.0, rel=1e-6)  # 4 workers across
    assert t.loc[HIERARCHICAL, "predicted"] == pytest.approx(1.0, rel=1e-6)  # its leaders' ring: 1 per uplink
    # the same ratios as the bounds the report uses, over the forest's LP
    forest = forest_bound_s(g, workers, 1.0)
    assert given["predicted"] == pytest.approx(ring_bound_s(g, workers, 1.0) / forest, rel=1e-9)
    assert t.loc["ring (order topology)", "predicted"] == pytest.approx(best_ring_bound_s(g, workers, 1.0) / forest)
    assert t.loc[HIERARCHICAL, "predicted"] == pytest.approx(hierarchical_bound_s(g, workers, 1.0) / forest)
    assert t.loc["parameter server (best host)", "predicted"] == pytest.approx(
        ps_bound_s(g, workers, ["r0h0"], 1.0) / forest)
    assert "7.00 gradients on" in cap_text(given) and "the cut at" in cap_text(given)


def test_one_server_on_a_homogeneous_star_is_n_over_2():
    # 6 hosts at 100 Mb/s: the server's link carries 5 gradients; the trees' degrees hold the forest
    # at 6 x 100 / (2 x 5) = 60 Mb/s, 0.6 of a host link: 5 x 0.6 = 3 = N / 2.
    g, workers = star_graph([100] * 6)
    t = predict(g, workers, "h0").set_index("baseline")
    ps = t.loc["parameter server (best host)"]
    assert ps["predicted"] == pytest.approx(3.0, rel=1e-6) and ps["bottleneck_gradients"] == pytest.approx(5.0)
    assert ps["held_by"] == "tree packing" and ps["forest_of_cut"] == pytest.approx(0.6, rel=1e-6)
    assert "tree packing" in cap_text(ps)
    # one switch: hierarchical is one group, a server on rank 0's host
    assert t.loc[HIERARCHICAL, "predicted"] == pytest.approx(3.0, rel=1e-6)
    assert t.loc["ring (order given)", "predicted"] == pytest.approx(t.loc["ring (order topology)", "predicted"])


def test_a_given_forest_rate_is_used_and_never_exceeds_the_pattern_cap():
    g, hosts = racks_graph([3, 3, 2], 100, [60, 30, 10])
    workers = _interleaved(hosts[:6]) + hosts[6:]
    t = predict(g, workers, "r0h0")
    assert (t["predicted"] <= t["pattern_cap"] * (1 + 1e-9)).all()
    assert (t["forest_of_bottleneck"] <= 1 + 1e-9).all()
    half = predict(g, workers, "r0h0", forest_bps=t["forest_bps"].iloc[0] / 2)
    assert half["predicted"].to_numpy() == pytest.approx(t["predicted"].to_numpy() / 2)


def test_largest_per_baseline_says_whether_it_reaches_the_paper():
    table = pd.DataFrame({"baseline": ["a", "a", "b"], "predicted": [3.0, 19.0, 1.5], "workers": [16, 20, 16]})
    top = largest(table).set_index("baseline")
    assert top.loc["a", "workers"] == 20 and bool(top.loc["a", "reaches_paper"]) and PAPER_BEST == 18.3
    assert not bool(top.loc["b", "reaches_paper"])
