"""Tidy results on disk: `runs.parquet` (one row per run) and per-run long tables.

Every write goes to a temporary file in the same directory and is renamed into place,
under an exclusive lock, so a crash or `kill -9` never leaves a half-written file and
two writers never lose each other's rows.
"""
from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pandas as pd

RUNS = "runs.parquet"


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested config -> flat `a.b.c` columns; lists become JSON text (one cell)."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        elif isinstance(v, list):
            out[key] = json.dumps(v, sort_keys=True)
        else:
            out[key] = v
    return out


def write_parquet(df: pd.DataFrame, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    df.to_parquet(tmp, index=False)
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


@contextmanager
def locked(sweep_dir: Path) -> Iterator[None]:
    sweep_dir.mkdir(parents=True, exist_ok=True)
    with open(sweep_dir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def read_runs(sweep_dir: Path) -> pd.DataFrame:
    path = sweep_dir / RUNS
    return pd.read_parquet(path) if path.exists() else pd.DataFrame()


def record_run(sweep_dir: Path, row: dict[str, Any]) -> None:
    """Insert or replace (by run_id) one run's row."""
    with locked(sweep_dir):
        runs = read_runs(sweep_dir)
        if len(runs):
            runs = runs[runs["run_id"] != row["run_id"]]
        new = pd.DataFrame([row])
        runs = new if runs.empty else pd.concat([runs, new], ignore_index=True)
        write_parquet(runs, sweep_dir / RUNS)


def update_runs(sweep_dir: Path, fn) -> None:
    """Rewrite runs.parquet as fn(runs), atomically and under the lock (e.g. to add bounds)."""
    with locked(sweep_dir):
        runs = read_runs(sweep_dir)
        if not runs.empty:
            write_parquet(fn(runs), sweep_dir / RUNS)


def completed(sweep_dir: Path) -> set[str]:
    runs = read_runs(sweep_dir)
    if runs.empty:
        return set()
    return set(runs.loc[runs["status"] == "ok", "run_id"])


def merge(sources: list[Path], into: Path) -> int:
    """Concatenate sweeps' results (e.g. the shards of one sweep) into `into`; returns the
    number of runs. Run directories are copied; a run_id present twice keeps its ok row."""
    import shutil

    frames = []
    for src in sources:
        runs = read_runs(src)
        if runs.empty:
            raise FileNotFoundError(f"{src / RUNS}: no such file")
        frames.append(runs)
        if src.resolve() != into.resolve():
            for rid in runs["run_id"]:
                if (src / rid).is_dir():
                    shutil.copytree(src / rid, into / rid, dirs_exist_ok=True)
    with locked(into):
        frames.insert(0, read_runs(into))
        allruns = pd.concat([f for f in frames if not f.empty], ignore_index=True)
        allruns = (allruns.assign(_ok=allruns["status"] == "ok").sort_values("_ok", kind="stable")
                   .drop_duplicates("run_id", keep="last").drop(columns="_ok"))
        write_parquet(allruns.reset_index(drop=True), into / RUNS)
    return len(allruns)
