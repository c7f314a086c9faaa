"""Invariants that every result rests on, as properties over small random inputs (hypothesis),
without the network: which iterations are measured, what an iteration's window holds, run
ids, and the analytic bounds. The Mininet tier checks a few of them on real runs
(tests/mininet/test_e2e_mininet.py)."""
from __future__ import annotations

import copy

import networkx as nx
import pandas as pd
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from analysis import bounds
from contracts.iterations import NoMeasuredIteration, first_measured, measured, windows
from emu.config.experiment import ConfigError, validate_experiment
from tasks import _sections
from workloads.config import WorkloadConfig

# Derandomized and without an example database: the same examples on every machine and in CI,
# so a failure is reproducible and the suite never fails by chance; raise max_examples to explore.
settings.register_profile("schedlab", derandomize=True, database=None, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("schedlab")
FAST = settings(max_examples=60)


# ---------------------------------------------------------------------------- measured iterations

@pytest.mark.slow
@FAST
@given(iterations=st.integers(1, 500), warmup=st.integers(0, 600))
def test_a_run_measures_exactly_iterations_minus_warmup_or_is_refused(iterations, warmup):
    if warmup < iterations:
        wl = WorkloadConfig(model="cnn", preset="tiny", iterations=iterations, warmup=warmup)
        mask = [measured(i, wl.warmup, wl.iterations) for i in range(iterations)]
        assert sum(mask) == iterations - warmup and mask == sorted(mask)  # the last ones
        return
    with pytest.raises(ValueError, match=r"workload\.iterations .* workload\.warmup"):
        WorkloadConfig(model="cnn", preset="tiny", iterations=iterations, warmup=warmup)
    with pytest.raises(NoMeasuredIteration):
        first_measured(warmup, iterations)


# ---------------------------------------------------------------------------- an iteration's window

def pipeline(steps: list[tuple[float, float, float]]) -> tuple[list[float], list[float], list[float]]:
    """A one-layer worker on a simulated clock: (compute, communication, pause before the
    step) per iteration. Its gradients leave when backward ends and are applied in the next
    forward pass, as soon as they have arrived (the last: after the loop).
    Returns forward starts, backward ends and the instants the aggregates were applied."""
    t, starts, ends, applied = 0.0, [], [], []
    arrival = None
    for compute, comm, pause in steps:
        t += pause
        starts.append(t)
        if arrival is not None:
            t = max(t, arrival)   # the forward pre-hook waits for the previous iteration's aggregate
            applied.append(t)
        t += compute
        ends.append(t)
        arrival = t + comm
    applied.append(max(t, arrival))
    return starts, ends, applied


STEPS = st.lists(st.tuples(st.floats(1e-4, 1.0), st.floats(0.0, 2.0), st.floats(0.0, 0.1)), min_size=1, max_size=12)


@pytest.mark.slow
@FAST
@given(steps=STEPS)
def test_every_iteration_holds_its_own_communication_and_the_windows_tile_the_run(steps):
    starts, ends, applied = pipeline(steps)
    spans = windows(starts, applied)
    for (start, end), (compute, comm, _), b_end in zip(spans, steps, ends):
        # no iteration is shorter than its compute or its communication: its bound
        assert end - start >= max(compute, comm) - 1e-9
        assert start <= b_end <= end
    for (_, a_end), (b_start, _) in zip(spans, spans[1:]):
        assert a_end == b_start
    assert sum(b - a for a, b in spans) == pytest.approx(applied[-1] - starts[0])


# ---------------------------------------------------------------------------- run ids

def experiment(bws: list[int], scheduler: str, iterations: int, warmup: int, seed: int) -> dict:
    hosts = [{"name": "ps", "bw_mbps": 100}] + [{"name": f"w{i}", "bw_mbps": bw} for i, bw in enumerate(bws)]
    workers = [h["name"] for h in hosts[1:]]
    return {"name": "prop", "seed": seed, "topology": {"kind": "star", "hosts": hosts},
            "roles": {"servers": [] if scheduler == "ring" else ["ps"], "workers": workers},
            "workload": {"model": "cnn", "preset": "tiny", "iterations": iterations, "warmup": warmup},
            "scheduler": scheduler}


CONFIGS = st.builds(experiment, bws=st.lists(st.integers(1, 1000), min_size=2, max_size=3),
                    scheduler=st.sampled_from(["fifo", "bytescheduler", "ring"]),
                    iterations=st.integers(2, 6), warmup=st.integers(0, 1), seed=st.integers(0, 3))


@pytest.mark.slow
@settings(max_examples=40)
@given(a=CONFIGS, b=CONFIGS, ra=st.integers(0, 2), rb=st.integers(0, 2))
def test_run_ids_are_stable_and_equal_exactly_for_equal_resolved_configs_and_repeats(a, b, ra, rb):
    sections = _sections()
    try:
        ea, eb = validate_experiment(a, sections), validate_experiment(b, sections)
    except ConfigError:
        assume(False)
    assert ea.run_id(ra) == validate_experiment(copy.deepcopy(a), sections).run_id(ra)  # stable
    # its resolved config validated again is the same run
    assert validate_experiment(ea.resolved(), sections).run_id(ra) == ea.run_id(ra)
    same = ea.resolved() == eb.resolved() and ra == rb
    assert (ea.run_id(ra) == eb.run_id(rb)) == same


# ---------------------------------------------------------------------------- bounds

def racks(uplinks: list[float], hosts: list[list[float]], server: bool) -> tuple[nx.DiGraph, list[str], list[str]]:
    """A core switch, racks under it with their uplink rates, hosts with their link rates
    (Mb/s, the same both ways); a server host on the core if `server`."""
    g = nx.DiGraph()
    workers = []
    for r, (up, members) in enumerate(zip(uplinks, hosts)):
        for a, b in (("core", f"s{r}"), (f"s{r}", "core")):
            g.add_edge(a, b, capacity=up * 1e6)
        for i, bw in enumerate(members):
            h = f"h{r}_{i}"
            workers.append(h)
            g.add_edge(h, f"s{r}", capacity=bw * 1e6)
            g.add_edge(f"s{r}", h, capacity=bw * 1e6)
    for n in g.nodes:
        g.nodes[n]["kind"] = "switch" if n == "core" or n.startswith("s") else "host"
    servers = []
    if server:
        g.add_edge("ps", "core", capacity=500e6)
        g.add_edge("core", "ps", capacity=500e6)
        g.nodes["ps"]["kind"] = "host"
        servers = ["ps"]
    return g, workers, servers


RATE = st.floats(1.0, 1000.0)
NETWORKS = st.integers(1, 3).flatmap(lambda n: st.tuples(
    st.lists(RATE, min_size=n, max_size=n), st.lists(st.lists(RATE, min_size=1, max_size=3), min_size=n, max_size=n)))
G_BYTES = 4e6
LP_REL = 1e-4   # the forest bound is an LP optimum, exact to the solver's tolerance; the others are closed forms


def all_bounds(g, workers, servers) -> dict[str, float]:
    out = {"cut": bounds.cut_bound_s(g, workers, G_BYTES), "ring": bounds.best_ring_bound_s(g, workers, G_BYTES),
           "forest": bounds.forest_bound_s(g, workers, G_BYTES),
           "hierarchical": bounds.hierarchical_bound_s(g, workers, G_BYTES)}
    if servers:
        out["ps"] = bounds.ps_bound_s(g, workers, servers, G_BYTES)
    return out


@pytest.mark.slow
@settings(max_examples=30)
@given(net=NETWORKS, server=st.booleans(), edge=st.integers(0, 10 ** 6), factor=st.floats(1.0, 20.0))
def test_bounds_never_grow_with_bandwidth_and_none_is_below_the_cut_bound(net, server, edge, factor):
    uplinks, hosts = net
    g, workers, servers = racks(uplinks, hosts, server)
    assume(len(workers) >= 2)
    before = all_bounds(g, workers, servers)
    for model, value in before.items():   # the cut bound holds for every scheme
        assert value >= before["cut"] * (1 - LP_REL), (model, value, before["cut"])
    faster = g.copy()
    u, v = sorted(faster.edges)[edge % faster.number_of_edges()]
    faster.edges[u, v]["capacity"] *= factor
    after = all_bounds(faster, workers, servers)
    for model in before:
        assert after[model] <= before[model] * (1 + LP_REL), (model, (u, v), factor, before[model], after[model])
    doubled = g.copy()
    for a, b in doubled.edges:
        doubled.edges[a, b]["capacity"] *= 2
    for model, value in all_bounds(doubled, workers, servers).items():   # time is bytes over rate
        assert value == pytest.approx(before[model] / 2, rel=LP_REL)


# ---------------------------------------------------------------------------- treatments

SWEEPS = st.fixed_dictionaries({
    "bws": st.lists(st.sampled_from([10, 25, 50, 100]), min_size=1, max_size=2, unique=True),
    "credits": st.lists(st.sampled_from([65536, 262144, 1048576]), min_size=1, max_size=3, unique=True),
    "partitions": st.lists(st.sampled_from([4096, 16384]), min_size=1, max_size=2, unique=True),
    "repeats": st.integers(1, 3)})


@settings(max_examples=25)
@given(sweep=SWEEPS)
def test_treatments_are_the_distinct_resolved_configs_and_only_repeats_pool(sweep):
    """A grid over the network and bytescheduler's tunables, with fifo beside it, as the sweep's
    rows record it: every distinct resolved config (seed and repeat aside) is one treatment,
    and each holds exactly its repeats."""
    from analysis.tables import add_configurations

    rows = []
    for bw in sweep["bws"]:
        settings_ = [("fifo", sweep["credits"][0], sweep["partitions"][0])]
        settings_ += [("bytescheduler", c, p) for c in sweep["credits"] for p in sweep["partitions"]]
        for name, credit, part in settings_:
            for rep in range(sweep["repeats"]):
                row = {"run_id": f"{bw}-{name}-{credit}-{part}-{rep}", "sweep": "grid", "status": "ok",
                       "scheduler": name, "repeat": rep, "seed": rep, "label": None, "roles.servers": '["ps"]',
                       "point.topology.bw_mbps": bw, "point.scheduler": name, "point.seed": rep,
                       "point.schedulers.bytescheduler.credit_numel": credit,
                       "point.schedulers.bytescheduler.partition_numel": part}
                if name == "bytescheduler":
                    row.update({"schedulers.bytescheduler.credit_numel": credit,
                                "schedulers.bytescheduler.partition_numel": part})
                rows.append(row)
    named = add_configurations(pd.DataFrame(rows))
    expected = len(sweep["bws"]) * (1 + len(sweep["credits"]) * len(sweep["partitions"]))
    groups = named.groupby(["config_id", "scheduler"])["run_id"].nunique()
    assert len(groups) == expected == named["treatment_id"].nunique()
    assert set(groups) == {sweep["repeats"]}
    assert named["config_id"].nunique() == len(sweep["bws"])
