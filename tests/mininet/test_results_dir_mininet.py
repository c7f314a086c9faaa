"""A hostile results directory, as root: a file system too small for the sweep, one that fills up
mid-run, one that is read-only, a directory removed mid-run, and two identical sweeps started
together into one directory. Each ends in one `error:` line with exit status 2 (or, for the two
sweeps, each run executed once), no traceback, no temporary file, the network torn down."""
from __future__ import annotations

import errno
import re
import shutil
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from emu.run.results import record_run
from tests.conftest import invoke, invoke_popen, wait_for
from tests.factories import GOOD, dump

# Two tiny runs (seeds 0 and 1): about 10 s each on the reference machine.
CFG = {**GOOD, "name": "hostile", "timeout_s": 120, "seeds": [0, 1],
       "workload": {"model": "cnn", "preset": "tiny", "iterations": 60, "batch_size": 8}}


@pytest.fixture
def tmpfs(tmp_path):
    """mount(size, ro=False): a tmpfs of its own under tmp_path, unmounted at the end whatever happens."""
    mounted: list[Path] = []

    def mount(size: str, ro: bool = False) -> Path:
        where = tmp_path / f"fs{len(mounted)}"
        where.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}" + (",ro" if ro else ""), "tmpfs", str(where)],
                       check=True)
        mounted.append(where)
        return where

    yield mount
    for where in mounted:
        if subprocess.run(["umount", str(where)]).returncode:
            subprocess.run(["umount", "-l", str(where)], check=True)


def _one_error_line(r) -> str:
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1, r.stderr[-3000:]
    return errors[0]


def _temporaries(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if ".tmp" in p.name]


def _fill(fs: Path) -> None:
    """Every byte of the file system taken by one file."""
    chunk = b"\0" * (1 << 20)
    with open(fs / "filler", "wb", buffering=0) as f:
        while True:
            try:
                f.write(chunk)
            except OSError as e:
                if e.errno != errno.ENOSPC:
                    raise
                if len(chunk) <= 4096:
                    return
                chunk = chunk[: len(chunk) // 16]


def _second_run_started(results: Path) -> bool:
    runs = results / "hostile" / "runs.parquet"
    if not runs.exists() or len(pd.read_parquet(runs)) < 1:
        return False
    done = set(pd.read_parquet(runs)["run_id"])
    return any(p.is_dir() and p.name not in done and any((p / "records").glob("worker*.progress"))
               for p in (results / "hostile").iterdir() if not p.name.startswith("."))


def test_a_file_system_too_small_for_the_sweep_is_refused_with_the_estimate(tmp_path, tmpfs):
    fs = tmpfs("300k")
    path = dump(tmp_path / "c.yaml", CFG)
    dry = invoke("sweep", str(path), "--results", str(fs), "--dry-run", timeout=120)
    assert dry.returncode == 0, dry.stderr[-2000:]
    assert "results size: 2 run(s) need about" in dry.stdout and "warning: this sweep cannot fit" in dry.stdout
    r = invoke("sweep", str(path), "--results", str(fs), timeout=120)
    line = _one_error_line(r)
    assert r.returncode == 2 and "not enough free space for this sweep: 2 run(s) need about" in line
    assert f"free on {fs}" in line and "largest: qdiscs" in line
    assert not list(fs.iterdir())   # nothing created


def test_a_file_system_that_fills_mid_run_ends_in_one_line_and_keeps_what_was_done(tmp_path, tmpfs,
                                                                                    no_leftovers, procs):
    fs = tmpfs("64m")
    path = dump(tmp_path / "c.yaml", CFG)
    proc = procs.add(invoke_popen("sweep", str(path), "--results", str(fs)))
    wait_for(lambda: _second_run_started(fs) or proc.poll() is not None, 180, "the second run")
    assert proc.poll() is None
    _fill(fs)
    out, err = proc.communicate(timeout=180)
    r = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    line = _one_error_line(r)
    assert r.returncode == 2, err[-3000:]
    assert line.startswith("error: results: ") and "No space left on device (ENOSPC)" in line, line
    assert "1 completed run(s) kept in runs.parquet" in line and "the run in flight" in line
    assert not _temporaries(fs), _temporaries(fs)
    runs = pd.read_parquet(fs / "hostile" / "runs.parquet")
    ok = runs[runs["status"] == "ok"]
    assert len(ok) == 1 and (fs / "hostile" / ok["run_id"].iloc[0] / "iterations.parquet").exists()
    if len(runs) == 2:   # there was room for the row of the run in flight
        assert "recorded as failed" in line
        assert "No space left on device" in runs[runs["status"] != "ok"]["reason"].iloc[0]
    # the same command again: refused before anything, with the figures
    again = invoke("sweep", str(path), "--results", str(fs), timeout=120)
    assert again.returncode == 2 and "not enough free space" in _one_error_line(again)


def test_a_read_only_results_directory_is_one_line_and_its_rows_stay(tmp_path, tmpfs):
    fs = tmpfs("16m")
    record_run(fs / "hostile", {"run_id": "earlier", "status": "ok", "started_at": "before"})
    before = (fs / "hostile" / "runs.parquet").read_bytes()
    subprocess.run(["mount", "-o", "remount,ro", str(fs)], check=True)
    path = dump(tmp_path / "c.yaml", CFG)
    r = invoke("sweep", str(path), "--results", str(fs), timeout=120)
    line = _one_error_line(r)
    assert r.returncode == 2 and line == f"error: results: {fs / 'hostile'}: Read-only file system (EROFS)"
    assert (fs / "hostile" / "runs.parquet").read_bytes() == before


def test_a_results_directory_removed_mid_run_is_one_line_and_is_not_made_again(tmp_path, no_leftovers, procs):
    results = tmp_path / "results"
    path = dump(tmp_path / "c.yaml", CFG)
    proc = procs.add(invoke_popen("sweep", str(path), "--results", str(results)))
    wait_for(lambda: _second_run_started(results) or proc.poll() is not None, 180, "the second run")
    assert proc.poll() is None
    while (results / "hostile").exists():   # the roles may write into it meanwhile
        shutil.rmtree(results / "hostile", ignore_errors=True)
    out, err = proc.communicate(timeout=180)
    r = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    line = _one_error_line(r)
    assert r.returncode == 2 and line.startswith(f"error: results: {results / 'hostile'}: removed during the sweep")
    assert not (results / "hostile").exists()


def test_two_identical_sweeps_started_together_execute_each_run_once(tmp_path, no_leftovers, procs):
    results = tmp_path / "results"
    path = dump(tmp_path / "c.yaml", CFG)
    a, b = (procs.add(invoke_popen("sweep", str(path), "--results", str(results))) for _ in range(2))
    outs = [p.communicate(timeout=400) for p in (a, b)]
    assert a.returncode == 0 and b.returncode == 0, [err[-2000:] for _, err in outs]
    errs = outs[0][1] + outs[1][1]
    executed = re.findall(r"\((\w{12})\): ok, median iteration", errs)
    runs = pd.read_parquet(results / "hostile" / "runs.parquet")
    assert len(runs) == 2 and runs["run_id"].is_unique and (runs["status"] == "ok").all()
    assert sorted(executed) == sorted(runs["run_id"]), errs[-3000:]   # each run executed once, by one sweep
    assert "claimed by another sweep" in errs and "run by another sweep meanwhile, not again: ok" in errs
    assert not list((results / "hostile" / ".claims").iterdir())
