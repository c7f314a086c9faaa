"""Loading tidy results into pandas: what notebooks and plots start from."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd


class NoResults(LookupError):
    pass


def load_runs(sweep_dir: Path, status: str | None = None, run_ids: list[str] | None = None) -> pd.DataFrame:
    path = Path(sweep_dir) / "runs.parquet"
    if not path.exists():
        raise NoResults(f"{path}: no such file (run the sweep first)")
    runs = pd.read_parquet(path)
    if run_ids is not None:
        runs = runs[runs["run_id"].isin(run_ids)]
    runs["num_workers"] = runs["roles.workers"].map(lambda s: len(json.loads(s)))
    if status is not None:
        runs = runs[runs["status"] == status]
        if runs.empty:
            raise NoResults(f"{path}: no run with status {status!r}")
    return runs.reset_index(drop=True)


def load_iterations(sweep_dir: Path, runs: pd.DataFrame, drop_warmup: bool = True) -> pd.DataFrame:
    """Per-iteration records of `runs`, joined with the run's scheduler and repeat."""
    frames = []
    for _, run in runs.iterrows():
        df = pd.read_parquet(Path(sweep_dir) / run["run_id"] / "iterations.parquet")
        if drop_warmup:
            df = df[df["iteration"] >= run["workload.warmup"]]
        df = df.assign(scheduler=run["scheduler"], repeat=run["repeat"], worker=df["rank"].map(lambda r: f"w{r}"))
        frames.append(df)
    return pd.concat(frames, ignore_index=True)
