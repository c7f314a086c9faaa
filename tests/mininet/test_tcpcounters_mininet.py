"""TCP counters and the server port's drops of a real run (emu/testbed/tcpcounters.py): four
workers at 100 Mb/s push into a server behind a 25 Mb/s link whose queue holds 64 KB (20 ms of
25 Mb/s is less: the floor), so the switch's port toward the server overflows (incast), drops
packets, and the workers' TCP retransmits them."""
from __future__ import annotations

import pandas as pd
import pytest
import yaml

from emu.testbed.tcpcounters import COUNTERS
from tests.conftest import invoke
from tests.factories import experiment, star_topology

# Replayed compute (no torch to import); 12 iterations of the small CNN's 0.55 MB of gradients
# per worker: 2.2 MB into 25 Mb/s, about 0.7 s an iteration.
CFG = experiment(name="incast-e2e", timeout_s=180, topology=star_topology(ps=25, w0=100, w1=100, w2=100, w3=100),
                 roles={"servers": ["ps"], "workers": ["w0", "w1", "w2", "w3"]},
                 workload={"model": "cnn", "preset": "small", "compute": "replay", "iterations": 12, "warmup": 2})


@pytest.mark.slow
def test_an_overloaded_server_port_drops_and_the_workers_retransmit(tmp_path, no_leftovers):
    results = tmp_path / "results"
    cfg = tmp_path / "incast.yaml"
    cfg.write_text(yaml.safe_dump(CFG))
    r = invoke("run", str(cfg), "--results", str(results), timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    row = pd.read_parquet(results / CFG["name"] / "runs.parquet").iloc[0]
    assert row["status"] == "ok", row["reason"]
    run_dir = results / CFG["name"] / row["run_id"]

    tcp = pd.read_parquet(run_dir / "tcp.parquet").set_index("host")
    print(tcp.to_string(), f"\nserver_port_drops {row['server_port_drops']}")
    assert sorted(tcp.index) == ["ps", "w0", "w1", "w2", "w3"]
    counts = tcp[list(COUNTERS)]
    assert counts.notna().all().all() and (counts >= 0).all().all()   # every host read at both ends
    assert (counts.loc[["w0", "w1", "w2", "w3"], "out_segs"] > 0).all()
    for col in COUNTERS:
        assert row[f"tcp_{col}"] == counts[col].sum(), col

    # the port toward the server dropped packets, and the workers resent segments
    q = pd.read_parquet(run_dir / "qdiscs.parquet")
    into_ps = q[q["link"] == "s1->ps"].sort_values("t")["drops"]
    assert row["server_port_drops"] == into_ps.iloc[-1] - into_ps.iloc[0] > 0
    assert row["queue_drops"] >= row["server_port_drops"]
    workers = counts.loc[["w0", "w1", "w2", "w3"], "retrans_segs"]
    assert workers.sum() > 0 and row["tcp_retrans_segs"] >= workers.sum()
