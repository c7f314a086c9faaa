"""Unit tests: recorded-state cleanup (by pid and start time, never by name) and results files."""
from __future__ import annotations

import json
import subprocess
import threading
import time

import pandas as pd

from emu.run.results import completed, flatten, read_runs, record_run
from emu.testbed.cleanup import StateDir, alive, clean, start_time


def test_clean_kills_recorded_group_of_dead_orchestrator(tmp_path, procs):
    # A "role" with a child of its own, in its own session, as mnexec -d starts them.
    role = procs.start(["bash", "-c", "sleep 60 & wait"], start_new_session=True)
    time.sleep(0.2)
    child = int(subprocess.run(["pgrep", "-P", str(role.pid)], capture_output=True, text=True).stdout.split()[0])
    dead = subprocess.Popen(["true"])
    dead.wait()
    state = StateDir(tmp_path, pid=dead.pid)
    state.path.mkdir(parents=True)
    (state.path / "owner.json").write_text(json.dumps({"pid": dead.pid, "started": 1}))
    state.add_process("role", "worker0", role.pid)

    removed = clean(root=tmp_path)
    role.wait(5)
    assert removed == [f"role worker0 (pid {role.pid}) [orchestrator {dead.pid}]"]
    assert not alive(child, None), "the whole process group must go"
    assert not state.path.exists()


def test_clean_spares_live_orchestrators_and_recycled_pids(tmp_path, procs):
    live = procs.start(["sleep", "30"], start_new_session=True)
    state = StateDir(tmp_path, pid=live.pid).open()
    state.add_process("role", "worker0", live.pid)
    assert clean(root=tmp_path) == []          # owner alive: not ours to touch
    # A record whose start time does not match is a recycled pid: never killed.
    other = StateDir(tmp_path, pid=999_999_9)
    other.path.mkdir()
    (other.path / "proc-role-x-1.json").write_text(
        json.dumps({"kind": "role", "name": "x", "pid": live.pid, "started": start_time(live.pid) + 1}))
    assert clean(root=tmp_path) == []
    assert live.poll() is None


def test_read_runs_while_a_sweep_rewrites_the_file_never_reads_a_torn_one(tmp_path):
    """A report or a poll reads runs.parquet while a sweep records rows. Read by path, pyarrow
    raised on more than half of such reads here (it takes the size, then reopens the file)."""
    record_run(tmp_path, {"run_id": "r0", "status": "ok", "x": 0.0})
    done = threading.Event()

    def sweep():
        for k in range(1, 150):
            record_run(tmp_path, {"run_id": f"r{k}", "status": "ok", "x": float(k), "tag": "y" * (k % 7)})
        done.set()

    writer = threading.Thread(target=sweep)
    writer.start()
    sizes = []
    while not done.is_set():
        sizes.append(len(read_runs(tmp_path)))
    writer.join()
    assert len(sizes) > 10 and sizes == sorted(sizes)


def test_record_run_replaces_by_run_id_and_keeps_others(tmp_path):
    record_run(tmp_path, {"run_id": "a", "status": "failed", "x": 1.0})
    record_run(tmp_path, {"run_id": "b", "status": "ok", "x": 2.0})
    record_run(tmp_path, {"run_id": "a", "status": "ok", "x": 3.0})
    runs = read_runs(tmp_path).set_index("run_id")
    assert sorted(runs.index) == ["a", "b"] and runs.loc["a", "x"] == 3.0
    assert completed(tmp_path) == {"a", "b"}
    assert not list(tmp_path.glob(".*tmp*")), "temporary files must be renamed away"


def test_flatten():
    assert flatten({"a": {"b": 1, "c": [1, 2]}, "d": "x"}) == {"a.b": 1, "a.c": "[1, 2]", "d": "x"}
    assert isinstance(pd.DataFrame([flatten({"a": {"b": 1}})]), pd.DataFrame)
