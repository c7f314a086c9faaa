"""`./inv trace` on a real traced run: two workers and a server on Mininet, a short pause of
one worker injected, then the run's trace.json checked against the run's own tables (slices,
counters and instants per kind, the first iteration's time) and against the Trace Event
Format's required fields."""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest
import yaml

from tests.conftest import inv, invoke
from tests.factories import experiment, star_topology

# Replayed compute (no torch to import): training starts within seconds; 40 iterations of the
# small CNN over 100 Mb/s links take about 5 s, past the pause at 1 s.
CFG = experiment(name="trace-e2e", timeout_s=180, trace=True, topology=star_topology(ps=100, w0=100, w1=100),
                 workload={"model": "cnn", "preset": "small", "compute": "replay", "iterations": 40, "warmup": 2},
                 faults=[{"at_s": 1.0, "kind": "stop", "target": "worker0", "for_s": 0.5}])
REQUIRED = {"X": {"name", "ph", "ts", "dur", "pid", "tid"}, "C": {"name", "ph", "ts", "pid", "args"},
            "i": {"name", "ph", "ts", "pid", "tid", "s"}, "M": {"name", "ph", "pid", "args"}}


@pytest.mark.slow
def test_a_traced_run_becomes_a_trace_matching_its_tables(tmp_path, no_leftovers):
    results = tmp_path / "results"
    cfg = tmp_path / "trace.yaml"
    cfg.write_text(yaml.safe_dump(CFG))
    r = invoke("run", str(cfg), "--results", str(results), timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    row = pd.read_parquet(results / CFG["name"] / "runs.parquet").iloc[0]
    assert row["status"] == "ok", row["reason"]
    run_dir = results / CFG["name"] / row["run_id"]

    t = inv("trace", str(run_dir), timeout=120)
    assert t.returncode == 0, t.stderr[-2000:]
    path = run_dir / "trace.json"
    assert t.stdout.startswith(f"trace: {path} ("), t.stdout
    print(t.stdout)
    trace = json.loads(path.read_text())
    events = trace["traceEvents"]

    named = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    for e in events:
        assert REQUIRED[e["ph"]] <= set(e), e
        assert type(e["pid"]) is int and e["pid"] in named, e
        assert e["ph"] == "M" or e["ts"] >= 0, e
    assert {"worker0 (w0)", "worker1 (w1)", "server0 (ps)", "network"} <= set(named.values()), named

    def count(ph: str) -> Counter:
        return Counter(e["cat"] for e in events if e["ph"] == ph)

    its = pd.read_parquet(run_dir / "iterations.parquet")
    layers = pd.read_parquet(run_dir / "layers.parquet")
    ev = pd.read_parquet(run_dir / "events.parquet")
    faults = pd.read_parquet(run_dir / "faults.parquet")
    w = ev[ev["role"] == "worker"]
    pushes = w.groupby(["rank", "key", "iteration"]).ngroups
    assert count("X") == Counter({"iteration": len(its), "forward": len(its), "backward": len(its),
                                  "wait": len(layers), "layer forward": len(layers),
                                  "layer backward": len(layers), "push": int(pushes)})
    assert count("C") == Counter({"utilisation": len(pd.read_parquet(run_dir / "links.parquet")),
                                  "queue": len(pd.read_parquet(run_dir / "qdiscs.parquet"))})
    began, ended = faults["actual_start_s"].notna().sum(), faults["actual_end_s"].notna().sum()
    assert began == 1, faults.to_dict("records")
    assert count("i") == Counter({**ev["event"].value_counts().to_dict(), "fault": int(began),
                                  "fault end": int(ended)})
    pid = {name: p for p, name in named.items()}
    for rank in (0, 1):
        mine = [e for e in events if e["ph"] == "i" and e["pid"] == pid[f"worker{rank} (w{rank})"]]
        assert len(mine) == int((w["rank"] == rank).sum())
    t0 = row["monitor_t0_wall"]
    first = min(e["ts"] for e in events if e.get("cat") == "iteration")
    assert first == pytest.approx((its["start"].min() - t0) * 1e6, abs=1)
    fault = next(e for e in events if e.get("cat") == "fault")
    assert fault["ts"] == pytest.approx((row["roles_t0_wall"] + faults["actual_start_s"].iloc[0] - t0) * 1e6, abs=1)
    assert Path(path).stat().st_size > 1000
