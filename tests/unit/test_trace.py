"""analysis/trace.py and `./inv trace` over a made-up run directory written the way the runner
writes one: the roles' records (`records/worker<r>.json`, `records/server<r>.json`) turned into
tables by the runner's own `_collect`, every table and the row written by emu/run/results.py,
the monitor's and the faults' tables in their columns. The trace is checked against the Trace
Event Format (fields per ph, numbers, every pid and thread named) and against those tables
(counts per kind, first and last times)."""
from __future__ import annotations

import json
import math
from collections import Counter, defaultdict
from pathlib import Path

import pandas as pd
import pytest
from invoke import Context, Exit

import tasks
from analysis.trace import NoRun, NoTrace, build_trace, counts, span_us, write_trace
from emu.run import runner
from emu.run.faults import COLUMNS as FAULT_COLUMNS
from emu.run.results import record_run, write_parquet

T0 = 1_700_000_000.0     # the monitors' t = 0 (wall clock)
ROLES_T0 = T0 + 0.5      # roles launched
LAYERS = [("conv", [0, 1]), ("fc", [2])]   # name, keys (forward order)
ITERS, WORKERS = 4, 2
LINKS = ["w0->s1", "s1->w0", "w1->s1", "s1->w1", "ps->s1", "s1->ps"]


def _worker_record(rank: int) -> dict:
    """What workloads/worker.py writes: iterations, layers, summary, events (what, key, chunk, it, t)."""
    iterations, layers, events = [], [], []
    t = T0 + 1.0 + 0.01 * rank
    for it in range(ITERS):
        fwd = t + 0.002                        # the iteration's window starts before its forward pass
        wait_prev = 0.0 if it == 0 else 0.004 * len(LAYERS)
        fwd_s, bwd_s = [0.003, 0.002], [0.001, 0.002]
        bwd_end = fwd + wait_prev + sum(fwd_s) + sum(bwd_s) + 0.001
        end = bwd_end + 0.05
        iterations.append({"rank": rank, "iteration": it, "start": t, "end": end, "compute_s": 0.01,
                           "wait_s": 0.008, "forward_start": fwd, "backward_end": bwd_end,
                           "loss": float("nan") if it == 0 else 2.0, "accuracy": 0.1, "samples_per_s": 640.0})
        for i, (name, keys) in enumerate(LAYERS):
            layers.append({"rank": rank, "iteration": it, "layer": i, "name": name, "wait_s": 0.004,
                           "forward_s": fwd_s[i], "backward_s": bwd_s[i]})
            for k in keys:
                for chunk in (0, 1):
                    events.append(["send", k, chunk, it, bwd_end - 0.001 * (k + 1) + 0.0001 * chunk])
                    events.append(["recv", k, chunk, it, end - 0.01 + 0.001 * k + 0.0001 * chunk])
        t = end
    return {"summary": {"rank": rank, "checksum": "x", "compute_mode": "real"}, "iterations": iterations,
            "layers": layers, "events": events}


def _server_record() -> dict:
    events = []
    for it in range(ITERS):
        for k in range(3):
            base = T0 + 1.1 + 0.07 * it + 0.001 * k
            events += [["recv", k, 0, it, base], ["recv", k, 0, it, base + 0.0002],
                       ["send", k, 0, it, base + 0.003], ["done", k, 0, it, base + 0.004]]
    return {"events": events}


FAULTS = pd.DataFrame([
    {"fault": 0, "kind": "stop", "target": "worker0", "host": "w0", "cpu": math.nan, "planned_start_s": 0.6,
     "actual_start_s": 0.61, "planned_end_s": 0.7, "actual_end_s": 0.71, "ended": "on time", "note": "",
     "stall_max_s": 0.1, "reason_after_s": math.nan, "cost_s": 0.05},
    {"fault": 1, "kind": "link_down", "target": "w1-s1", "host": "", "cpu": math.nan, "planned_start_s": 0.8,
     "actual_start_s": 0.8, "planned_end_s": math.nan, "actual_end_s": math.nan, "ended": "", "note": "",
     "stall_max_s": math.nan, "reason_after_s": math.nan, "cost_s": math.nan},
], columns=[*FAULT_COLUMNS, "stall_max_s", "reason_after_s", "cost_s"])
PLANS = [{"epoch": 0, "iteration": 0, "time": T0 + 1.0, "reason": "start", "probe_s": 0.1, "plan_s": 0.01},
         {"epoch": 1, "iteration": 2, "time": T0 + 1.15, "reason": "rates changed", "probe_s": 0.1, "plan_s": 0.01}]


def make_run(root: Path, run_id: str = "abc123", traced: bool = True, k: float = 1.0) -> Path:
    """A run directory under root/sweep as emu/run/runner.py leaves an ok run."""
    sweep = root / "sweep"
    run_dir = sweep / run_id
    rec = run_dir / "records"
    rec.mkdir(parents=True)
    for r in range(WORKERS):
        rec_r = _worker_record(r)
        if not traced:
            rec_r["events"] = []
        (rec / f"worker{r}.json").write_text(json.dumps(rec_r))
    if traced:
        (rec / "server0.json").write_text(json.dumps(_server_record()))
    iters, _, long_tables = runner._collect(rec, WORKERS)
    tables = {"iterations": iters, **long_tables}
    if not traced:
        tables.pop("events")   # an untraced run's events table is empty: not written
    t = [0.1 * i for i in range(1, 25)]
    tables["links"] = pd.DataFrame([{"link": ln, "t": x, "tx_bytes_per_s": 1e6 * (i % 3), "configured_bps": 1e7}
                                    for i, x in enumerate(t) for ln in LINKS],
                                   columns=["link", "t", "tx_bytes_per_s", "configured_bps"])
    tables["qdiscs"] = pd.DataFrame([{"link": ln, "t": x + 0.003, "read_s": 1e-4, "backlog_bytes": 1500 * (i % 4),
                                      "drops": 0} for i, x in enumerate(t) for ln in LINKS[::2]],
                                    columns=["link", "t", "read_s", "backlog_bytes", "drops"])
    tables["faults"] = FAULTS
    for name, df in tables.items():   # as the runner's finally writes them
        if len(df):
            write_parquet(df.assign(run_id=run_id)[["run_id", *df.columns]], run_dir / f"{name}.parquet")
    (run_dir / "scheduler_info.json").write_text(json.dumps({"plans": PLANS}))
    record_run(sweep, {"run_id": run_id, "sweep": "sweep", "status": "ok", "reason": "", "scheduler": "forest",
                       "trace": traced, "roles.workers": json.dumps(["w0", "w1"]), "roles.servers": json.dumps(["ps"]),
                       "monitor_t0_wall": T0, "roles_t0_wall": ROLES_T0, "time_dilation": k})
    return run_dir


@pytest.fixture
def run(tmp_path) -> Path:
    return make_run(tmp_path)


def us(x: float) -> float:
    """A wall-clock instant on the trace's axis."""
    return (x - T0) * 1e6


def _events(trace, ph=None, cat=None):
    return [e for e in trace["traceEvents"] if (ph is None or e["ph"] == ph) and (cat is None or e.get("cat") == cat)]


REQUIRED = {"X": {"name", "ph", "ts", "dur", "pid", "tid"}, "C": {"name", "ph", "ts", "pid", "args"},
            "i": {"name", "ph", "ts", "pid", "tid", "s"}, "M": {"name", "ph", "pid", "args"}}


def test_the_trace_is_trace_event_format(run):
    trace = json.loads(json.dumps(build_trace(run), allow_nan=False))   # plain JSON, no NaN
    assert trace["displayTimeUnit"] == "ms" and isinstance(trace["traceEvents"], list)
    named_pids, named_threads, used_pids, used_threads = set(), set(), set(), set()
    for e in trace["traceEvents"]:
        assert REQUIRED[e["ph"]] <= set(e), e
        assert type(e["pid"]) is int and ("tid" not in e or type(e["tid"]) is int), e
        if e["ph"] == "M":
            assert e["name"] in ("process_name", "thread_name", "process_sort_index", "thread_sort_index"), e
            if e["name"] == "process_name":
                named_pids.add(e["pid"])
            elif e["name"] == "thread_name":
                named_threads.add((e["pid"], e["tid"]))
            continue
        assert isinstance(e["ts"], (int, float)) and e["ts"] >= 0, e
        used_pids.add(e["pid"])
        if e["ph"] == "X":
            assert isinstance(e["dur"], (int, float)) and e["dur"] >= 0, e
        if e["ph"] == "i":
            assert e["s"] in ("g", "p", "t"), e
        if e["ph"] == "C":
            assert e["args"] and all(isinstance(v, (int, float)) for v in e["args"].values()), e
        if e["ph"] in ("X", "i"):
            used_threads.add((e["pid"], e["tid"]))
    assert used_pids <= named_pids and used_threads <= named_threads
    names = {e["args"]["name"] for e in _events(trace, "M") if e["name"] == "process_name"}
    assert {"worker0 (w0)", "worker1 (w1)", "server0 (ps)", "network"} <= names, names


def test_counts_match_the_tables(run):
    trace = build_trace(run)
    c = counts(trace)
    its = pd.read_parquet(run / "iterations.parquet")
    layers = pd.read_parquet(run / "layers.parquet")
    ev = pd.read_parquet(run / "events.parquet")
    worker_ev = ev[ev["role"] == "worker"]
    pushes = worker_ev.groupby(["rank", "key", "iteration"]).ngroups
    assert c["slices"] == Counter({"iteration": len(its), "forward": len(its), "backward": len(its),
                                   "wait": len(layers), "layer forward": len(layers), "layer backward": len(layers),
                                   "push": pushes})
    assert c["counters"] == Counter({"utilisation": len(pd.read_parquet(run / "links.parquet")),
                                     "queue": len(pd.read_parquet(run / "qdiscs.parquet"))})
    assert c["instants"] == Counter({**ev["event"].value_counts().to_dict(), "fault": 2, "fault end": 1,
                                     "plan": len(PLANS)})
    # per worker: its own events, on its own process
    pid = {e["args"]["name"]: e["pid"] for e in _events(trace, "M") if e["name"] == "process_name"}
    for r in range(WORKERS):
        mine = [e for e in _events(trace, "i") if e["pid"] == pid[f"worker{r} (w{r})"]]
        assert len(mine) == (ev["rank"].eq(r) & ev["role"].eq("worker")).sum()
        assert {e["tid"] for e in mine} == {100 + k for k in worker_ev["key"]}   # a thread per tensor
    per_link = Counter(e["name"] for e in _events(trace, "C", "utilisation"))
    assert per_link == Counter({f"{ln} utilisation": 24 for ln in LINKS})


def test_times_match_the_tables(run):
    trace = build_trace(run)
    its = pd.read_parquet(run / "iterations.parquet")
    ev = pd.read_parquet(run / "events.parquet")
    links = pd.read_parquet(run / "links.parquet")
    qd = pd.read_parquet(run / "qdiscs.parquet")

    def first_last(cat):
        xs = _events(trace, cat=cat)
        return min(e["ts"] for e in xs), max(e["ts"] + e.get("dur", 0) for e in xs)

    assert first_last("iteration") == pytest.approx((us(its["start"].min()), us(its["end"].max())), abs=0.5)
    assert first_last("forward")[0] == pytest.approx(us(its["forward_start"].min()), abs=0.5)
    assert first_last("backward")[1] == pytest.approx(us(its["backward_end"].max()), abs=0.5)
    w = ev[ev["role"] == "worker"]
    assert first_last("push") == pytest.approx((us(w.loc[w["event"] == "send", "t"].min()),
                                                us(w.loc[w["event"] == "recv", "t"].max())), abs=0.5)
    done = ev.loc[ev["event"] == "done", "t"]
    assert first_last("done") == pytest.approx((us(done.min()), us(done.max())), abs=0.5)
    assert first_last("utilisation") == pytest.approx((links["t"].min() * 1e6, links["t"].max() * 1e6), abs=0.5)
    assert first_last("queue") == pytest.approx((qd["t"].min() * 1e6, qd["t"].max() * 1e6), abs=0.5)
    faults = sorted(e["ts"] for e in _events(trace, cat="fault"))
    assert faults == pytest.approx([us(ROLES_T0 + 0.61), us(ROLES_T0 + 0.8)], abs=0.5)
    assert [e["ts"] for e in _events(trace, cat="plan")] == pytest.approx([us(p["time"]) for p in PLANS], abs=0.5)
    assert all(e["s"] == "g" for e in _events(trace, cat="fault") + _events(trace, cat="plan"))
    # a counter's value: achieved rate over the configured one
    sample = next(e for e in _events(trace, cat="utilisation") if e["args"]["%"] > 0)
    assert sample["args"]["%"] == pytest.approx(100 * 1e6 * 8 / 1e7 * round(sample["args"]["%"] / 80))
    assert span_us(trace) == (0.1e6, pytest.approx(max(us(its["end"].max()), qd["t"].max() * 1e6), abs=0.5))


def test_slices_of_one_thread_do_not_overlap_and_layers_stay_in_their_step(run):
    """What a viewer needs to stack them: on each thread slices follow one another; a step's
    per-layer forwards and backwards lie within its forward and backward slices."""
    trace = build_trace(run)
    by_thread = defaultdict(list)
    for e in _events(trace, "X"):
        by_thread[(e["pid"], e["tid"])].append(e)
    for xs in by_thread.values():
        xs.sort(key=lambda e: e["ts"])
        for a, b in zip(xs, xs[1:]):
            assert b["ts"] >= a["ts"] + a["dur"] - 0.01, (a, b)
    for step in _events(trace, "X", "forward") + _events(trace, "X", "backward"):
        inner = [e for e in _events(trace, "X", f"layer {step['cat']}")
                 if e["pid"] == step["pid"] and e["args"]["iteration"] == step["args"]["iteration"]]
        assert len(inner) == len(LAYERS)
        assert all(step["ts"] - 0.01 <= e["ts"] and e["ts"] + e["dur"] <= step["ts"] + step["dur"] + 0.01
                   for e in inner), (step, inner)


def test_wall_clock_records_follow_time_dilation(tmp_path):
    """The forest's plan records are the scheduler's, in the wall clock (so would faults be; a
    config refuses them with time dilation): under time dilation k their instants are mapped
    around the monitors' t = 0 as the runner maps the other tables."""
    trace = build_trace(make_run(tmp_path, k=4.0))
    plans = [e["ts"] for e in _events(trace, cat="plan")]
    assert plans == pytest.approx([us(p["time"]) / 4 for p in PLANS], abs=0.5)
    # ... and the probe's and the planner's durations too (0.1 s of the roles' clock: 0.025 s emulated)
    args = [e["args"] for e in _events(trace, cat="plan")]
    assert [v for a in args for v in (a["probe_s"], a["plan_s"])] == pytest.approx([0.025, 0.0025] * 2)
    faults = sorted(e["ts"] for e in _events(trace, cat="fault"))
    assert faults == pytest.approx([us(ROLES_T0 + 0.61) / 4, us(ROLES_T0 + 0.8) / 4], abs=0.5)
    assert trace["otherData"]["time_dilation"] == 4.0


def test_missing_unknown_and_untraced_runs_are_refused(tmp_path, run):
    with pytest.raises(NoRun, match="no such run directory"):
        build_trace(tmp_path / "nowhere" / "x")
    (run.parent / "zzz").mkdir()
    with pytest.raises(NoRun, match="no run 'zzz'"):
        build_trace(run.parent / "zzz")
    with pytest.raises(NoTrace, match=r"not traced; set `trace: true` in its config"):
        build_trace(make_run(tmp_path / "plain", traced=False))


def test_the_task_writes_the_trace_and_says_what_is_in_it(tmp_path, run, capsys):
    tasks.trace(Context(), str(run))
    out = capsys.readouterr().out
    path = run / "trace.json"
    assert out.startswith(f"trace: {path} (") and f"{path.stat().st_size} bytes" in out, out
    assert "slices: iteration 8, forward 8, backward 8" in out and "counters: utilisation 144, queue 72" in out, out
    assert "send 60" in out and "fault 2" in out and "plan 2" in out, out
    assert json.loads(path.read_text())["traceEvents"]
    other = tmp_path / "elsewhere.json"
    tasks.trace(Context(), str(run), out=str(other))
    assert other.exists() and str(other) in capsys.readouterr().out


@pytest.mark.parametrize("case", ["missing", "unknown", "untraced"])
def test_the_task_says_error_and_exits_2(tmp_path, case):
    run_dir = {"missing": lambda: tmp_path / "results" / "s" / "nope",
               "unknown": lambda: make_run(tmp_path).parent / "not-a-run",
               "untraced": lambda: make_run(tmp_path, traced=False)}[case]()
    if case == "unknown":
        run_dir.mkdir()
    with pytest.raises(Exit) as e:
        tasks.trace(Context(), str(run_dir))
    assert e.value.code == 2
    message = str(e.value.message)
    assert message.startswith("error: ") and "\n" not in message, message
    if case == "untraced":
        assert "trace: true" in message


def test_write_trace_replaces_the_file(tmp_path, run):
    path = write_trace(build_trace(run), tmp_path / "t.json")
    assert json.loads(path.read_text())["otherData"]["run_id"] == run.name
    assert [p.name for p in tmp_path.iterdir()] == ["t.json"] or not list(tmp_path.glob(".t.json.tmp*"))


def test_a_push_overlapping_its_keys_previous_one_goes_on_a_lane_of_its_own(run):
    """A forest relays partial sums of the next iteration while the last one's averages still go
    down: such a push is stacked on a second thread of its key, so that no two slices of one
    thread overlap, and none is lost."""
    ev = pd.read_parquet(run / "events.parquet")
    mine = (ev["rank"] == 0) & (ev["role"] == "worker") & (ev["key"] == 0)
    last_recv = ev.loc[mine & (ev["iteration"] == 0) & (ev["event"] == "recv"), "t"].max()
    early = mine & (ev["iteration"] == 1) & (ev["event"] == "send") & (ev["chunk"] == 0)
    ev.loc[early, "t"] = last_recv - 0.001
    write_parquet(ev, run / "events.parquet")
    trace = build_trace(run)
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in _events(trace, "M") if e["name"] == "thread_name"}
    pushes = _events(trace, "X", "push")
    assert len(pushes) == ev[ev["role"] == "worker"].groupby(["rank", "key", "iteration"]).ngroups
    on = [threads[(e["pid"], e["tid"])] for e in pushes]
    lanes = [name for name, e in zip(on, pushes) if name != f"key {e['args']['key']}"]
    assert lanes == ["key 0 (2)"]
    by_thread = defaultdict(list)
    for e in pushes:
        by_thread[(e["pid"], e["tid"])].append(e)
    for xs in by_thread.values():
        xs.sort(key=lambda e: e["ts"])
        assert all(b["ts"] >= a["ts"] + a["dur"] - 0.01 for a, b in zip(xs, xs[1:]))
