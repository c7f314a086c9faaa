"""Time dilation (emu/config/dilation.py; docs/scaling.md: Time dilation), without a network: the config key
and its refusals, the wall-clock plan a dilated experiment runs (rates / k, times x k), the
conversion of what it measured back to emulated time, run ids of undilated configs as they
were, and the bound of a dilated run equal to the undilated one's."""
from __future__ import annotations

import copy
import json

import numpy as np
import pandas as pd
import pytest
import yaml

from analysis.bounds import load_graph, run_bounds
from contracts.role_spec import RoleSpec
from emu.config.dilation import (
    TABLES,
    cross_to_emulated,
    dilate_params,
    rates_to_emulated,
    summary_to_emulated,
    table_to_emulated,
    wall_plan,
)
from emu.config.experiment import ConfigError
from emu.config.plan import load_plan, set_dotted
from emu.run.results import flatten
from emu.run.runner import _net_summary, role_specs, summarize
from emu.testbed import tc
from emu.testbed.crosstraffic import client_argv
from emu.testbed.shaping import Shaper
from tasks import _sections
from tests.conftest import REPO, invoke
from tests.factories import GOOD
from workloads.config import WorkloadConfig

K = 4.0          # a power of two: every conversion below is exact in floating point
ORIGIN = 1_000.0  # the monitors' t = 0 as wall-clock time, the instant both clocks share

BASE = {
    "name": "d",
    "timeout_s": 100,
    "topology": {"kind": "star", "queue_ms": 20,
                 "hosts": [{"name": "ps", "bw_mbps": 400}, *({"name": f"w{i}", "bw_mbps": 100} for i in range(4)),
                           {"name": "t0", "bw_mbps": 100}]},
    "roles": {"servers": ["ps"], "workers": ["w0", "w1", "w2", "w3"]},
    "workload": {"model": "cnn", "preset": "small", "compute": "replay", "speedup": 0.5, "iterations": 10,
                 "warmup": 2},
    "scheduler": "mercury",
    "schedulers": {"mercury": {"startup_us": 100}},
    "shaping": [
        {"link": ["w0", "s1"], "schedule": {"kind": "square", "period_s": 4, "high_mbps": 100, "low_mbps": 20}},
        {"link": ["s1", "w1"], "schedule": {"kind": "steps", "steps": [[0, 100], [3, 50]]}},
    ],
    "cross_traffic": [{"src": "t0", "dst": "w2", "protocol": "udp", "rate_mbps": 40, "start_s": 1, "stop_s": 6}],
    "monitor": {"interval_s": 0.1, "qdisc_interval_s": 0.05},
}


def experiment(tmp_path, cfg=None, *sets):
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(cfg or BASE))
    return load_plan(p, _sections(), list(sets)).experiments[0]


def variant(cfg, **keys):
    cfg = copy.deepcopy(cfg)
    for k, v in keys.items():
        set_dotted(cfg, k.replace("__", "."), v)
    return cfg


# ---------------------------------------------------------------------------- the config key

def test_default_is_1_and_left_out_of_the_resolved_config(tmp_path):
    plain = experiment(tmp_path)
    explicit = experiment(tmp_path, variant(BASE, time_dilation=1))
    dilated = experiment(tmp_path, variant(BASE, time_dilation=2))
    assert plain.time_dilation == explicit.time_dilation == 1.0
    assert "time_dilation" not in plain.resolved() and "time_dilation" not in explicit.resolved()
    assert plain.run_id(0) == explicit.run_id(0) != dilated.run_id(0)
    assert dilated.resolved()["time_dilation"] == 2.0
    # config.yaml of a dilated run reads back as the same experiment
    assert experiment(tmp_path, dilated.resolved()).run_id(0) == dilated.run_id(0)


def test_run_ids_of_undilated_configs_are_unchanged(tmp_path):
    """Recorded by runs before time_dilation existed (reference8: results of its 64 Mb/s sweep):
    finished sweeps still resume."""
    assert experiment(tmp_path, GOOD).run_id(0) == "41845a3d4548"
    ref8 = load_plan(REPO / "configs" / "sweeps" / "reference8.yaml", _sections())
    ids = {e.scheduler: e.run_id(0) for e in ref8.experiments}
    assert (ids["fifo"], ids["mercury"], ids["gloo"]) == ("bc4c3abc3279", "6908f35c2f45", "0f083a6dc4a6")
    tv = load_plan(REPO / "configs" / "examples" / "time_varying.yaml", _sections())
    assert tv.experiments[0].run_id(0) == "14aa44fd7f17"
    ct = load_plan(REPO / "configs" / "examples" / "cross_traffic.yaml", _sections())
    assert [e.run_id(0) for e in ct.experiments] == ["7b12b908d2c5", "ba8494c6d422"]


BAD = [
    (variant(BASE, time_dilation=0.5), "time_dilation: must be >= 1"),
    (variant(BASE, time_dilation="fast"), "time_dilation: must be a number or \"auto\", got 'fast'"),
    (variant(BASE, time_dilation=True), 'time_dilation: must be a number or "auto", got True'),
    (variant(BASE, time_dilation=[2]), 'time_dilation: must be a number or "auto", got [2]'),
    (variant(BASE, time_dilation=1e9), "time_dilation: must be <= 100"),
    (variant(BASE, time_dilation="Auto"), 'time_dilation: must be a number or "auto", got \'Auto\''),
    (variant(BASE, time_dilation=float("inf")), "time_dilation: must be a finite number, got inf"),
    (variant(BASE, time_dilation=2, timeout_s=604_800),
     "time_dilation: timeout_s (604800 s) x 2 is 1209600 s of wall clock; at most 604800 (7 days): shorten "
     "timeout_s or lower time_dilation"),
    (variant(GOOD, time_dilation=2),
     "time_dilation: 2 needs workload.compute: replay; real PyTorch compute runs at the machine's own speed and "
     "cannot be slowed down 2 times (replay a profile, or set time_dilation: 1)"),
    (variant(BASE, time_dilation=4, workload__speedup=0.002),
     "time_dilation: 4 replays compute 4 times slower (speedup / 4), and workload.speedup: must be >= 0.001"),
    (variant(BASE, time_dilation=4, schedulers__mercury__startup_us=500_000),
     "time_dilation: 4 x schedulers.mercury.startup_us: must be <= 1000000 (a scheduler's times are multiplied "
     "by time_dilation)"),
    (variant(BASE, time_dilation=4, scheduler="forest", roles__servers=[], schedulers={"forest": {"probe_s": 5}}),
     "time_dilation: 4 x schedulers.forest.probe_s: must be <= 10 (a scheduler's times are multiplied by "
     "time_dilation)"),
]


@pytest.mark.parametrize("cfg,message", BAD, ids=[f"{i}-{m[15:40]}" for i, (_, m) in enumerate(BAD)])
def test_bad_time_dilation_names_the_field(tmp_path, cfg, message):
    with pytest.raises(ConfigError) as e:
        experiment(tmp_path, cfg)
    assert str(e.value) == message


@pytest.mark.slow
def test_cli_refuses_real_compute_dilated_one_line_exit_2(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(variant(GOOD, time_dilation=2)))
    r = invoke("run", str(path), "--results", str(tmp_path / "results"), timeout=60)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().startswith("error: time_dilation: 2 needs workload.compute: replay;")
    assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "results").exists()


def test_shipped_dilated_example(tmp_path):
    plan = load_plan(REPO / "configs" / "examples" / "dilated32.yaml", _sections())
    exp = plan.experiments[0]
    assert exp.time_dilation == 4 and len(exp.roles.workers) == 32 and exp.roles.servers == ["ps"]
    assert {e.scheduler for e in plan.experiments} == {"fifo", "mercury", "ring", "gloo"}
    assert all(len(e.roles.workers) == 32 for e in plan.experiments)
    wall = wall_plan(exp)
    # the server's link on the testbed at most what a parameter server's CPU carries here
    assert exp.net.rate("ps", "s1") == 2048 and wall.net.rate("ps", "s1") == 512


# ---------------------------------------------------------------------------- the run in wall-clock time

def test_wall_plan_divides_rates_and_multiplies_times(tmp_path):
    plain, exp = experiment(tmp_path), experiment(tmp_path, None, f"time_dilation={K}")
    one, wall = wall_plan(plain), wall_plan(exp)
    assert one.k == 1 and one.net is plain.net and one.timeout_s == 100 and one.connect_timeout_s == 60
    assert exp.net.rate("ps", "s1") == 400            # the experiment itself stays in emulated units
    for ln, orig in zip(wall.net.links, plain.net.links, strict=True):
        assert (ln.a, ln.b) == (orig.a, orig.b)
        assert (ln.ab_mbps, ln.ba_mbps) == (orig.ab_mbps / K, orig.ba_mbps / K)
        assert ln.queue_ms == orig.queue_ms * K        # in bytes the queue stays the same
        assert tc.queue_bytes(ln.ab_mbps * 1e6, ln.queue_ms) == tc.queue_bytes(orig.ab_mbps * 1e6, orig.queue_ms)
    # shaping: the same changes, K times later and K times lower
    assert wall.shaping_events == [(t * K, link, bps / K) for t, link, bps in one.shaping_events]
    assert (8.0, ("w0", "s1"), 5e6) in wall.shaping_events and (12.0, ("s1", "w1"), 12.5e6) in wall.shaping_events
    assert Shaper(exp.shaping, exp.timeout_s, lambda *a: None, {}, dilation=K).events == wall.shaping_events
    assert Shaper(plain.shaping, plain.timeout_s, lambda *a: None, {}).events == one.shaping_events
    # cross traffic: rate / K, start and stop x K; iperf3 is told the wall-clock values
    f = wall.flows[0]
    assert (f.rate_mbps, f.start_s, f.stop_s, f.src, f.protocol) == (10, 4, 24, "t0", "udp")
    argv = client_argv(f, "10.0.0.9", 5201, f.stop_s - f.start_s)
    assert argv[argv.index("-t") + 1] == "20" and argv[argv.index("-b") + 1] == "10M"
    # timeouts and the monitors' intervals
    assert (wall.timeout_s, wall.connect_timeout_s, wall.roles_grace_s) == (400, 240, 60)
    assert (one.dead_peer_s, wall.dead_peer_s) == (30, 30 * K)
    assert (wall.monitor_interval_s, wall.qdisc_interval_s) == (0.4, 0.2)
    # replayed compute K times slower; the scheduler's times x K, its other tunables as they are
    assert wall.workload == {**exp.workload, "speedup": 0.5 / K}
    assert wall.scheduler_params == {**exp.scheduler_params, "startup_us": 100 * K}
    assert one.workload == plain.workload and one.scheduler_params == plain.scheduler_params


def test_a_time_tunable_at_its_default_is_dilated_too(tmp_path):
    """forest leaves chunk_ms and replan_probe_s out of its dump at their defaults (run ids stay);
    dilated, they are still times x K, as when the config sets them to the same values."""
    forest = variant(BASE, scheduler="forest", roles__servers=[], schedulers={})
    left_out = experiment(tmp_path, forest, f"time_dilation={K}")
    assert "chunk_ms" not in left_out.scheduler_params
    params = wall_plan(left_out).scheduler_params
    assert (params["chunk_ms"], params["replan_probe_s"], params["probe_s"]) == (8.0 * K, 0.1 * K, 0.25 * K)
    set_ = experiment(tmp_path, variant(forest, schedulers={"forest": {"chunk_ms": 8.0, "replan_probe_s": 0.1}}),
                      f"time_dilation={K}")
    assert wall_plan(set_).scheduler_params == params
    assert wall_plan(experiment(tmp_path, forest)).scheduler_params == experiment(tmp_path, forest).scheduler_params


def test_roles_get_the_wall_clock_plan_and_never_k(tmp_path):
    plain, exp = experiment(tmp_path), experiment(tmp_path, None, f"time_dilation={K}")
    ips = {h: f"10.0.0.{i + 1}" for i, h in enumerate(exp.net.hosts)}
    base = {name: spec for name, _, spec in role_specs(plain, ips, tmp_path)}
    specs = {name: spec for name, _, spec in role_specs(exp, ips, tmp_path)}
    assert base["worker0"].connect_timeout_s == 60 and base["worker0"].workload == plain.workload
    w = specs["worker0"]
    assert w.connect_timeout_s == 60 * K
    # a silent peer is declared dead after the transport's 30 s x K: the links run K times slower
    assert base["worker0"].dead_peer_s == 30 and w.dead_peer_s == specs["server0"].dead_peer_s == 30 * K
    assert "dead_peer_s" not in base["worker0"].to_json() and json.loads(w.to_json())["dead_peer_s"] == 30 * K
    assert RoleSpec.model_validate_json(w.to_json()) == w
    assert w.workload["speedup"] == 0.5 / K and WorkloadConfig.model_validate(w.workload).speedup == 0.5 / K
    assert w.scheduler.params["startup_us"] == 100 * K and w.scheduler.params["packet_bytes"] == 16384
    caps = {(e["source"], e["target"]): e["capacity"] for e in w.topology["links"]}
    assert caps[("ps", "s1")] == 100e6 and caps[("s1", "w0")] == 25e6
    assert "time_dilation" not in w.to_json()


def test_dilate_params_scales_only_times():
    params = {"probe_s": 0.5, "timeout_s": 300, "startup_us": 0, "delay_ms": 2, "replan_threshold": 0.25,
              "bucket_mb": 25, "chunk_kb": 256, "packet_bytes": 16384, "priority": True, "bandwidth": "measured"}
    assert dilate_params(params, 2) == {**params, "probe_s": 1.0, "timeout_s": 600, "startup_us": 0, "delay_ms": 4}
    assert dilate_params(params, 1) == params


# ---------------------------------------------------------------------------- results in emulated time

def _emulated_tables() -> dict[str, pd.DataFrame]:
    """One table of each kind, as it would be recorded undilated (columns by emu/config/dilation.py TABLES)."""
    rng = np.random.default_rng(0)
    out = {}
    for name, units in TABLES.items():
        n = 12
        df = pd.DataFrame({"rank": np.arange(n) % 2, "bytes": rng.integers(1, 10_000, n).astype(float)})
        for col in units.instants:
            df[col] = ORIGIN + 0.5 + np.arange(n) * 0.25
        for col in units.durations:
            df[col] = rng.uniform(0, 1, n)
        for col in units.rates:
            df[col] = rng.uniform(1e6, 1e8, n)
        out[name] = df
    return out


def _as_wall(name: str, df: pd.DataFrame, k: float) -> pd.DataFrame:
    """What a run dilated k times records of the same experiment."""
    units, out = TABLES[name], df.copy()
    for col in [c for c in units.instants if c in out]:
        out[col] = ORIGIN + (out[col] - ORIGIN) * k
    for col in units.durations:
        out[col] = out[col] * k
    for col in units.rates:
        out[col] = out[col] / k
    return out


def test_every_table_is_converted_to_emulated_time():
    for name, emulated in _emulated_tables().items():
        wall = _as_wall(name, emulated, K)
        if TABLES[name].instants or TABLES[name].durations:
            assert not wall.equals(emulated)
        pd.testing.assert_frame_equal(table_to_emulated(name, wall, K, ORIGIN), emulated)
        assert table_to_emulated(name, emulated, 1.0, ORIGIN) is emulated   # k = 1: untouched
    its = table_to_emulated("iterations", pd.DataFrame({"start": [ORIGIN + 8.0], "end": [ORIGIN + 10.0],
                                                        "compute_s": [0.4], "wait_s": [1.6], "samples_per_s": [16.0],
                                                        "loss": [2.0]}), K, ORIGIN)
    assert its.iloc[0].to_dict() == {"start": ORIGIN + 2.0, "end": ORIGIN + 2.5, "compute_s": 0.1, "wait_s": 0.4,
                                     "samples_per_s": 64.0, "loss": 2.0}
    with pytest.raises(ValueError, match="origin"):
        table_to_emulated("events", _emulated_tables()["events"], K)
    assert table_to_emulated("links", _emulated_tables()["links"], K) is not None   # relative times: no origin


def test_summaries_and_row_values_in_emulated_time():
    summary = {"final_wait_s": 0.8, "replay_max_late_s": 0.04, "speedup": 0.5 / K, "checksum": "c",
               "scheduler_info": {"startup_waited_s": 2.0}}
    assert summary_to_emulated(summary, K) == {**summary, "final_wait_s": 0.2, "replay_max_late_s": 0.01,
                                               "speedup": 0.5}
    assert summary_to_emulated(summary, 1) is summary
    assert cross_to_emulated([{"flow": 0, "mbps": 10.0}, {"flow": 1, "mbps": None}], K) == \
        [{"flow": 0, "mbps": 40.0}, {"flow": 1, "mbps": None}]
    assert rates_to_emulated({"plan_rate_bps": 25e6, "plan_of_optimum": 0.9}, K) == \
        {"plan_rate_bps": 100e6, "plan_of_optimum": 0.9}


def _iterations(workers: int = 4, iterations: int = 10) -> pd.DataFrame:
    rows = []
    for rank in range(workers):
        for it in range(iterations):
            start = ORIGIN + 0.5 + 0.625 * it + 0.001 * rank
            rows.append({"rank": rank, "iteration": it, "start": start, "end": start + 0.5 + 0.0625 * (it % 3),
                         "compute_s": 0.0625, "wait_s": 0.4375 + 0.0625 * (it % 3), "loss": np.nan,
                         "accuracy": np.nan, "samples_per_s": 64.0})
    return pd.DataFrame(rows)


def _monitor_tables(exp, until: float = 8.0) -> dict[str, pd.DataFrame]:
    """links, qdiscs, cpu and shaping at 10 Hz in emulated time: every direction at its
    configured rate (w0 -> s1 stepping to 20 Mb/s at 3.05 s), sending 0.9 of it."""
    ts = np.arange(1, int(until * 10) + 1) / 10
    links, qdiscs = [], []
    for ln in exp.net.links:
        for a, b, mbps in ((ln.a, ln.b, ln.ab_mbps), (ln.b, ln.a, ln.ba_mbps)):
            for t in ts:
                conf = (20.0 if (a, b) == ("w0", "s1") and t >= 3.05 else mbps) * 1e6
                links.append({"link": f"{a}->{b}", "t": t, "tx_bytes_per_s": 0.9 * conf / 8, "configured_bps": conf})
                qdiscs.append({"link": f"{a}->{b}", "t": t, "read_s": 0.002, "backlog_bytes": 70_000, "drops": 0})
    cpu = pd.DataFrame({"t": ts, "cpu_idle": 0.5 + 0.1 * np.sin(ts), "harness_cpu": 0.05})
    shaping = pd.DataFrame([{"link": "w0->s1", "planned_t": 3.0, "actual_t": 3.05, "rate_bps": 20e6}])
    return {"links": pd.DataFrame(links), "qdiscs": pd.DataFrame(qdiscs), "cpu": cpu, "shaping": shaping}


def test_a_dilated_runs_figures_equal_the_undilated_ones(tmp_path):
    """The same measurements recorded at k = 4 and converted give the row's metrics and
    fidelity verdict of k = 1."""
    exp = experiment(tmp_path, None, f"time_dilation={K}")
    its = _iterations()
    wall_its = _as_wall("iterations", its, K)
    summaries = [{"checksum": "c", "compute_mode": "replay", "speedup": 0.5 / K, "num_params": 1000,
                  "num_tensors": 4, "peak_rss_bytes": 1}] * 4
    got = summarize(exp, table_to_emulated("iterations", wall_its, K, ORIGIN),
                    [summary_to_emulated(s, K) for s in summaries])
    want = summarize(exp, its, [{**s, "speedup": 0.5} for s in summaries])
    assert got == pytest.approx(want, nan_ok=True)
    assert got["iter_time_median_s"] == pytest.approx(0.5625) and got["speedup"] == 0.5
    emulated = _monitor_tables(exp)
    converted = {name: table_to_emulated(name, _as_wall(name, df, K), K) for name, df in emulated.items()}
    window = (its["start"].min() - ORIGIN, its["end"].max() - ORIGIN)
    assert _net_summary(exp, converted, window) == pytest.approx(_net_summary(exp, emulated, window), nan_ok=True)


# ---------------------------------------------------------------------------- bounds

def _run_dir(root, exp, its: pd.DataFrame, tables: dict[str, pd.DataFrame], cross: list[dict]) -> tuple:
    """A run directory as the runner leaves it (roles, config.yaml, tables) and its row."""
    d = root / exp.run_id(0)
    (d / "roles").mkdir(parents=True)
    ips = {h: f"10.0.0.{i + 1}" for i, h in enumerate(exp.net.hosts)}
    for name, _, spec in role_specs(exp, ips, d / "records"):
        (d / "roles" / f"{name}.json").write_text(spec.to_json())
    (d / "config.yaml").write_text(yaml.safe_dump(exp.resolved(), sort_keys=False))
    its.to_parquet(d / "iterations.parquet")
    tables["links"].to_parquet(d / "links.parquet")
    t = its["end"] - its["start"]
    row = pd.Series({**flatten(exp.resolved()), "time_dilation": exp.time_dilation, "run_id": exp.run_id(0),
                     "status": "ok", "num_params": 250_000, "compute_median_s": 0.05,
                     "iter_time_median_s": float(t.median()), "iter_time_mean_s": float(t.mean()),
                     "monitor_t0_wall": ORIGIN, "cross_traffic": json.dumps(cross)})
    return d, row


def test_the_bound_of_a_dilated_run_equals_the_undilated_one(tmp_path):
    """The same run recorded at k = 1 and at k = 4 (shaped, with a tenant's flow): the same
    capacity graph, window, available capacity and every bound column."""
    plain, dilated = experiment(tmp_path), experiment(tmp_path, None, f"time_dilation={K}")
    its, monitor = _iterations(), _monitor_tables(plain)
    flow = {"flow": 0, "src": "t0", "dst": "w2", "protocol": "udp", "started": True}
    d1, row1 = _run_dir(tmp_path / "a", plain, its, monitor, [{**flow, "mbps": 40.0}])
    d4, row4 = _run_dir(tmp_path / "b", dilated,
                        table_to_emulated("iterations", _as_wall("iterations", its, K), K, ORIGIN),
                        {name: table_to_emulated(name, _as_wall(name, df, K), K) for name, df in monitor.items()},
                        cross_to_emulated([{**flow, "mbps": 40.0 / K}], K))
    spec = json.loads(next((d4 / "roles").glob("worker0.json")).read_text())
    assert {e["capacity"] for e in spec["topology"]["links"] if e["source"] == "ps"} == {100e6}  # what roles got
    g1, g4 = load_graph(d1), load_graph(d4)
    assert {e: g1.edges[e]["capacity"] for e in g1.edges} == {e: g4.edges[e]["capacity"] for e in g4.edges}
    b1, b4 = run_bounds(row1, d1), run_bounds(row4, d4)
    assert b1["bound_capacity"] == b4["bound_capacity"] == "available"
    assert b1["efficiency_basis"] == b4["efficiency_basis"] == "mean"   # the step and the flow are in the window
    assert b4 == pytest.approx(b1)
    assert b1["bound_configured_s"] < b1["comm_bound_s"]                 # the step and the flow cost capacity
