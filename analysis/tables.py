"""Loading tidy results into pandas: what notebooks, plots and the report start from.

Besides the run rows and their long tables this module names *configurations*: runs that
differ only in the scheduler (its tunables and parameter servers), the seed and the repeat
index measure the same network and workload, so they are the ones whose times may be compared.
"""
from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pandas as pd
import yaml

from contracts.iterations import measured


class NoResults(LookupError):
    pass


# Config keys that do not change *what* is measured, only who schedules it or which sample it is.
# Parameter servers belong to the scheduling choice: the PS family needs them, the collectives
# refuse them, and both train the same workers on the same network. A `label` names a variant
# of the scheduler (e.g. its tuned tunables).
def _not_configuration(key: str) -> bool:
    return key in ("scheduler", "seed", "schedulers", "roles.servers", "label") or key.startswith("schedulers.")


def variant_names(runs: pd.DataFrame) -> pd.DataFrame:
    """`scheduler` as the analysis compares it: a run with a `label` (config key) is its own
    variant, `bytescheduler (tuned)` beside `bytescheduler`; the registry name stays in
    `scheduler_name`."""
    runs = runs.assign(scheduler_name=runs["scheduler"])
    if "label" in runs:
        text = runs["label"].map(lambda v: v if isinstance(v, str) else "")
        labelled = text != ""
        runs.loc[labelled, "scheduler"] = runs.loc[labelled, "scheduler"] + " (" + text[labelled] + ")"
    return runs


def _flat(d: dict, prefix: str = "") -> dict:
    """Nested config -> {"a.b": value} (lists stay values)."""
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def load_runs(sweep_dir: Path, status: str | None = None, run_ids: list[str] | None = None) -> pd.DataFrame:
    path = Path(sweep_dir) / "runs.parquet"
    if not path.exists():
        raise NoResults(f"{path}: no such file (run the sweep first)")
    runs = pd.read_parquet(path)
    for col in [c for c in runs.columns if c.startswith("point.")]:
        # a swept list (e.g. roles.servers) comes back as an array: make it hashable text
        runs[col] = runs[col].map(lambda v: json.dumps(list(v)) if hasattr(v, "__len__") and not isinstance(v, str)
                                  else v)
    if run_ids is not None:
        runs = runs[runs["run_id"].isin(run_ids)]
    runs = variant_names(runs)
    runs["num_workers"] = runs["roles.workers"].map(lambda s: len(json.loads(s)))
    if status is not None:
        runs = runs[runs["status"] == status]
        if runs.empty:
            raise NoResults(f"{path}: no run with status {status!r}")
    return runs.reset_index(drop=True)


def load_iterations(sweep_dir: Path, runs: pd.DataFrame, drop_warmup: bool = True) -> pd.DataFrame:
    """Per-iteration records of `runs`, joined with the run's scheduler and repeat; only
    the measured iterations (contracts/iterations.py) unless `drop_warmup` is False."""
    frames = []
    for _, run in runs.iterrows():
        df = pd.read_parquet(Path(sweep_dir) / run["run_id"] / "iterations.parquet")
        if drop_warmup:
            df = df[measured(df["iteration"], run["workload.warmup"], run["workload.iterations"])]
        df = df.assign(scheduler=run["scheduler"], repeat=run["repeat"], worker=df["rank"].map(lambda r: f"w{r}"))
        frames.append(df)
    return pd.concat(frames, ignore_index=True)


def load_events(sweep_dir: Path, run_id: str, role: str = "worker") -> pd.DataFrame | None:
    """The scheduler trace of a run (send/recv per tensor chunk, wall-clock t) as seen by
    `role` ("worker" or "server"), or None when the run was not traced (`trace: false`) or
    recorded no such event."""
    path = Path(sweep_dir) / run_id / "events.parquet"
    if not path.exists():
        return None
    ev = pd.read_parquet(path)
    if "role" in ev:
        ev = ev[ev["role"] == role].reset_index(drop=True)
    elif role != "worker":
        return None
    return ev if len(ev) else None


def load_tx_frames(sweep_dir: Path, run_id: str, role: str | None = None) -> pd.DataFrame | None:
    """Per data frame of a traced PS run (schedulers/txstamps.py): role, rank, peer (the
    server of a worker's PUSH, the worker of a server's RESULT), key, chunk, iteration,
    priority, bytes, ready_t (put into the outbox), first_byte_t, last_byte_t (left the host;
    NaN: no stamp came), inversion_s (how long after ready_t bytes of lower priority still
    stood ahead). Only `role`'s rows if given; None when the run has no such table."""
    path = Path(sweep_dir) / run_id / "tx_frames.parquet"
    if not path.exists():
        return None
    tx = pd.read_parquet(path)
    if role is not None:
        tx = tx[tx["role"] == role].reset_index(drop=True)
    return tx if len(tx) else None


def load_links(sweep_dir: Path, run_id: str) -> pd.DataFrame:
    """Per-link-direction send rate and configured rate of a run (monitor time t, seconds)."""
    path = Path(sweep_dir) / run_id / "links.parquet"
    if not path.exists():
        raise NoResults(f"{path}: no such file (the run recorded no link samples)")
    return pd.read_parquet(path)


def _scalar(v):
    """Grid values as hashable cells (a swept dict or list becomes its JSON text)."""
    if isinstance(v, (dict, list, tuple)) or (hasattr(v, "tolist") and not isinstance(v, (str, bytes))
                                              and getattr(v, "ndim", 0) > 0):
        return json.dumps(v.tolist() if hasattr(v, "tolist") else v, sort_keys=True, default=str)
    return v


def swept_keys(runs: pd.DataFrame) -> list[str]:
    """The sweep's grid/zip keys that define configurations (from the `point.<key>` columns),
    leaving out the scheduler, its tunables and the seed, and keys with a single value."""
    keys = []
    for col in runs.columns:
        if col.startswith("point.") and not _not_configuration(col[len("point."):]):
            if runs[col].map(_scalar).nunique(dropna=True) > 1:
                keys.append(col[len("point."):])
    return keys


def key_label(key: str, runs: pd.DataFrame) -> str:
    """A swept key as an axis label, e.g. topology.hosts.2.bw_mbps -> 'w1 link bandwidth (Mb/s)'."""
    m = re.fullmatch(r"topology\.hosts\.(\d+)\.(bw|up|down)_mbps", key)
    if m:
        what = {"bw": "link bandwidth", "up": "upload bandwidth", "down": "download bandwidth"}[m.group(2)]
        try:
            name = json.loads(runs["topology.hosts"].iloc[0])[int(m.group(1))]["name"]
        except (KeyError, IndexError, TypeError, ValueError):
            name = f"host {m.group(1)}"
        return f"{name} {what} (Mb/s)"
    known = {"topology.bw_mbps": "link bandwidth (Mb/s)", "workload.model": "model",
             "workload.preset": "model size", "workload.batch_size": "batch size (samples)",
             "topology.count": "hosts", "workload.speedup": "compute speed-up (x)",
             "topology.heterogeneity.count": "slow hosts", "topology.heterogeneity.sigma": "heterogeneity (sigma)",
             "topology.heterogeneity.factor": "slow hosts' rate factor", "roles.workers": "workers",
             "topology.heterogeneity.ratio": "host rate spread (fastest/slowest)",
             "topology.host_spread": "host rate spread (fastest/slowest)",
             "topology.uplink_spread": "rack uplink spread (fastest/slowest)",
             "topology.wan_spread": "WAN rate spread (fastest/slowest)", "topology.wan_mbps": "WAN rate (Mb/s)",
             "seed": "seed"}
    if key in known:
        return known[key]
    last = key.rsplit(".", 1)[-1]
    if last.endswith("_mbps"):
        return f"{last[:-5].replace('_', ' ')} (Mb/s)"
    if last.endswith("_ms"):
        return f"{last[:-3].replace('_', ' ')} (ms)"
    return last.replace("_", " ")


def _value_text(key: str, v) -> str:
    unit = " Mb/s" if key.endswith("_mbps") else " ms" if key.endswith("_ms") else ""
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    return f"{v}{unit}"


def add_configurations(runs: pd.DataFrame, sweep_dir: Path | None = None) -> pd.DataFrame:
    """Add `config_id` and `config` (a readable label) to each run.

    Two runs share a configuration when their resolved configs (each run's config.yaml) are
    equal apart from `scheduler`, `schedulers.*` and `seed`; the repeat index is not part of a
    config. The YAML is used rather than the row's columns because some row cells are
    overwritten by measurements (cross_traffic holds what the tenants achieved). Without a
    run directory (e.g. a synthetic table) the sweep name and the grid point decide.
    """
    runs = runs.copy()
    ids = []
    for _, run in runs.iterrows():
        path = Path(sweep_dir) / run["run_id"] / "config.yaml" if sweep_dir is not None else None
        if path is not None and path.exists():
            cfg = _flat(yaml.safe_load(path.read_text()))
            ident = {k: v for k, v in cfg.items() if not _not_configuration(k)}
        else:
            ident = {c: _scalar(run[c]) for c in runs.columns
                     if c == "sweep" or (c.startswith("point.") and not _not_configuration(c[len("point."):]))}
        blob = json.dumps(ident, sort_keys=True, default=str)
        ids.append(hashlib.sha256(blob.encode()).hexdigest()[:8])
    runs["config_id"] = ids
    keys = swept_keys(runs)

    def label(run) -> str:
        if keys:
            return ", ".join(f"{key_label(k, runs).split(' (')[0]} {_value_text(k, _scalar(run[f'point.{k}']))}"
                             for k in keys)
        if str(run.get("network", "") or ""):
            return str(run["network"])
        return "all runs" if single else run["config_id"]

    single = runs["config_id"].nunique() == 1
    runs["config"] = [label(r) for _, r in runs.iterrows()]
    # Equal labels for different configs (e.g. runs of an older version of the same grid)
    clash = runs.groupby("config")["config_id"].transform("nunique") > 1
    runs.loc[clash, "config"] = runs.loc[clash, "config"] + " [" + runs.loc[clash, "config_id"] + "]"
    return runs


def config_facts(runs: pd.DataFrame, sweep_dir: Path | None = None) -> pd.DataFrame:
    """Per configuration, what a paper's claim is conditioned on: model, numbers of workers and
    servers, the range of link rates, whether the workers' links differ (heterogeneous), and
    whether bandwidth changes during the run or is shared with other tenants (dynamic)."""
    from analysis.bounds import load_graph  # networkx; only needed here

    rows = []
    for cid, grp in runs.groupby("config_id", sort=False):
        run = grp.iloc[0]
        workers, servers = json.loads(run["roles.workers"]), json.loads(run["roles.servers"])
        caps, hetero = [], float("nan")
        run_dir = Path(sweep_dir) / run["run_id"] if sweep_dir is not None else None
        if run_dir is not None and (run_dir / "roles").exists():
            g = load_graph(run_dir)
            caps = [d["capacity"] for _, _, d in g.edges(data=True)]
            access = [d["capacity"] for a, b, d in g.edges(data=True) if a in workers or b in workers]
            hetero = max(access) / min(access) if access else float("nan")
        shaping = str(run.get("shaping", "[]") or "[]") not in ("[]", "")
        cross = False
        cfg_path = run_dir / "config.yaml" if run_dir is not None else None
        if cfg_path is not None and cfg_path.exists():
            cfg = yaml.safe_load(cfg_path.read_text())
            shaping, cross = bool(cfg.get("shaping")), bool(cfg.get("cross_traffic"))
        rows.append({"config_id": cid, "config": run["config"], "model": run.get("workload.model"),
                     "preset": run.get("workload.preset"), "num_workers": len(workers), "num_servers": len(servers),
                     "num_hosts": len(set(workers) | set(servers)),
                     "link_mbps_min": min(caps) / 1e6 if caps else float("nan"),
                     "link_mbps_max": max(caps) / 1e6 if caps else float("nan"),
                     "worker_link_ratio": hetero, "heterogeneous": bool(hetero > 1.0 + 1e-9),
                     "time_varying": shaping, "shared": cross, "dynamic": shaping or cross,
                     "network": run.get("network", "")})
    return pd.DataFrame(rows)
