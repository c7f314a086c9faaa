"""Loading tidy results into pandas: what notebooks, plots and the report start from.

Besides the run rows and their long tables this module names *configurations*: runs that
differ only in the scheduler (its tunables and parameter servers), the seed and the repeat
index measure the same network and workload, so they are the ones whose times may be compared.
Within one, each distinct resolved config of a scheduler is a *treatment*, a variant named by
what sets it apart (`bytescheduler credit 256k`); only its repeats (seed, repeat index) pool.
"""
from __future__ import annotations

import hashlib
import io
import json
import math
import re
from functools import lru_cache
from pathlib import Path

import pandas as pd
import yaml

from analysis import catalog
from contracts.iterations import measured
from contracts.point_label import POINT_NAME, point_from_columns, short_labels
from contracts.scheduler_info import LEGACY_BOUND_MODELS


class NoResults(LookupError):
    pass


# Config keys that do not change *what* is measured, only who schedules it or which sample it is.
# Parameter servers belong to the scheduling choice: the PS family needs them, the collectives
# refuse them, and both train the same workers on the same network. A `label` names a variant
# of the scheduler (e.g. its tuned tunables).
def _not_configuration(key: str) -> bool:
    """Keys that tell treatments of one configuration apart, not configurations: the scheduler,
    its tunables and servers, the seed, the label, and the plugins (whose code is a scheduler's)."""
    return key in ("scheduler", "seed", "schedulers", "roles.servers", "label", "plugins") or \
        key.startswith("schedulers.")


# What repeats of one treatment differ in: the seed, and the repeat index (not a config key).
_REPEAT_KEYS = ("seed", "repeat")
# Unit suffixes of scheduler tunables: trimmed from the name, shown with the value.
_UNITS = (("_numel", ""), ("_bytes", ""), ("_us", " us"), ("_ms", " ms"), ("_mbps", " Mb/s"), ("_mb", " MB"),
          ("_kb", " KB"), ("_pct", "%"), ("_s", " s"))


def _hash(ident: dict) -> str:
    return hashlib.sha256(json.dumps(ident, sort_keys=True, default=str).encode()).hexdigest()[:8]


def _norm(v):
    """A cell or config value as plain data, equal however it was stored: integral floats as
    ints, NaN as None, arrays and JSON list text as lists."""
    if hasattr(v, "tolist") and not isinstance(v, (str, bytes)):
        v = v.tolist()
    if isinstance(v, float):
        return None if math.isnan(v) else int(v) if v.is_integer() else v
    if isinstance(v, str) and v.startswith("["):
        try:
            return json.loads(v)
        except ValueError:
            return v
    return v


def _resolved(run, sweep_dir: Path | None) -> dict | None:
    """The run's resolved config, flattened, or None where its directory has none. Parsed once
    per file version: naming treatments (`load_runs`) and configurations (`add_configurations`)
    both read it."""
    if sweep_dir is None:
        return None
    path = Path(sweep_dir) / run["run_id"] / "config.yaml"
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return dict(_read_flat(str(path), st.st_mtime_ns, st.st_size))


@lru_cache(maxsize=4096)
def _read_flat(path: str, _mtime_ns: int, _size: int) -> dict:
    """A config file, flattened; the file's version is part of the key (callers do not mutate it)."""
    return _flat(yaml.safe_load(Path(path).read_text()) or {})


def _config_ident(run, cols: list[str], cfg: dict | None) -> dict:
    if cfg is not None:
        return {k: v for k, v in cfg.items() if not _not_configuration(k)}
    return {c: _scalar(run[c]) for c in cols
            if c == "sweep" or (c.startswith("point.") and not _not_configuration(c[len("point."):]))}


def _text_or_empty(v) -> str:
    return v if isinstance(v, str) else ""


def _treatment(run, cols: list[str], cfg: dict | None, name: str) -> tuple[dict, dict, str]:
    """(the treatment's identity, its scheduler part, its label) of one run.

    The identity is the resolved config without the seed (the repeat index is not in it), and
    without other schedulers' sections (a run's id hashes only its own). The scheduler part is
    what can tell two treatments of one configuration apart: the scheduler's own tunables and
    the parameter servers, as resolved (the grid point's value where the resolved config leaves
    a tunable out). Without a config file: the grid point, then the row's resolved
    `schedulers.<name>.*` and `roles.servers` cells where set."""
    own = f"schedulers.{name}."

    def mine(key: str) -> bool:
        return key.startswith(own) or key == "roles.servers"

    points = {c[len("point."):]: _norm(run[c]) for c in cols if c.startswith("point.") and mine(c[len("point."):])}
    if cfg is not None:  # a tunable the resolved config leaves out (startup_us 0) named as the grid set it
        ident = {k: v for k, v in cfg.items() if k not in _REPEAT_KEYS
                 and (not k.startswith("schedulers") or k.startswith(own) or k == f"schedulers.{name}")}
        part = {**{k: v for k, v in points.items() if v is not None}, **{k: _norm(v) for k, v in cfg.items()
                                                                          if mine(k)}}
        return ident, part, _text_or_empty(cfg.get("label"))
    part = {}
    for c in [c for c in cols if c.startswith("point.")] + [c for c in cols if not c.startswith("point.")]:
        key = c[len("point."):] if c.startswith("point.") else c
        if mine(key) and (v := _norm(run[c])) is not None:
            part[key] = v
    label = _text_or_empty(run.get("label")) or _text_or_empty(run.get("point.label"))
    ident = {**_config_ident(run, cols, None), "scheduler": name, "label": label, **part}
    return ident, part, label


def _count(v: int) -> str:
    """A count of elements: 65536 -> 64k, 4194304 -> 4M; other numbers exact (4,000,000)."""
    for unit, step in (("M", 1 << 20), ("k", 1 << 10)):
        if v and v % step == 0:
            return f"{v // step}{unit}"
    return f"{v:,}"


def _value_of(key: str, v) -> str:
    last = key.rsplit(".", 1)[-1]
    if isinstance(v, bool):
        return "on" if v else "off"
    if v is None:
        return "none"
    if isinstance(v, list):
        return "+".join(map(str, v)) or "none"
    if isinstance(v, (int, float)):
        if last.endswith(("_numel", "_bytes")) and float(v).is_integer():
            return _count(int(v)) + ("B" if last.endswith("_bytes") else "")
        if last.endswith("_us") and v >= 1000:
            return f"{v / 1000:g} ms"
        unit = next((u for s, u in _UNITS if last.endswith(s)), "")
        return f"{v if isinstance(v, int) else format(v, 'g')}{unit}"
    return str(v)


def _short(key: str, name: str, keys: list[str]) -> str:
    """A tunable as a variant's name says it: its last component (more where two varying keys
    share it) less a unit suffix, e.g. schedulers.bytescheduler.credit_numel -> credit."""
    tail = key[len(f"schedulers.{name}."):] if key.startswith(f"schedulers.{name}.") else key
    last = tail.rsplit(".", 1)[-1]
    if sum(k.rsplit(".", 1)[-1] == last for k in keys) > 1:
        last = tail
    suffix = next((s for s, _ in _UNITS if last.endswith(s) and len(last) > len(s)), "")
    return (last[:-len(suffix)] if suffix else last).replace("_", " ").replace(".", " ")


def _dump(v) -> str:
    return json.dumps(v, sort_keys=True, default=str)


def variant_names(runs: pd.DataFrame, sweep_dir: Path | None = None) -> pd.DataFrame:
    """Name each run's *treatment*: `scheduler` becomes the variant the analysis compares, the
    registry name stays in `scheduler_name`, and `treatment_id` (with `treatment_params`, the
    scheduler's own tunables and servers as JSON) says which runs are repeats of each other.

    Within a configuration every distinct resolved config of a scheduler, seed and repeat
    index aside, is a treatment of its own (a swept tunable or `roles.servers` included), and
    only runs of one treatment are pooled. Its name is the scheduler's display name
    (analysis/catalog.py; the registry name where unknown), its `label` if the config
    sets one (`bytescheduler (tuned)`), then what tells it apart from the scheduler's other
    treatments of the same label on some configuration (`bytescheduler credit 256k`, and the
    default-valued one `bytescheduler credit 64k`); the plain name where there is one. Keys
    are chosen over the whole table, so a variant has one name on every configuration. Read
    from each run's config.yaml in `sweep_dir` where present, else from the row."""
    runs = runs.copy()
    names = runs["scheduler_name"] if "scheduler_name" in runs else runs["scheduler"]
    cols = list(runs.columns)
    info = []  # (config, treatment_id, name, label, part) per run
    for i, run in runs.iterrows():
        cfg = _resolved(run, sweep_dir)
        ident, part, label = _treatment(run, cols, cfg, names[i])
        info.append((_hash(_config_ident(run, cols, cfg)), _hash(ident), names[i], label, part))
    # per (scheduler, label): the keys that tell its treatments apart on some configuration
    parts: dict[tuple[str, str], dict[str, dict[str, dict]]] = {}
    for cid, _, name, label, part in info:
        parts.setdefault((name, label), {}).setdefault(cid, {})[_dump(part)] = part
    varying: dict[tuple[str, str], list[str]] = {}
    for (name, label), per_config in parts.items():
        keys: list[str] = []
        for here in per_config.values():
            for k in dict.fromkeys(k for p in here.values() for k in p):
                if k not in keys and len({_dump(p.get(k)) for p in here.values()}) > 1:
                    keys.append(k)
        varying[(name, label)] = sorted(keys, key=lambda k: k == "roles.servers")  # servers last
    text = []
    for _, _, name, label, part in info:
        keys = varying[(name, label)]
        bits = []
        for k in keys:
            v = part.get(k)
            if k == "roles.servers":
                seen = {_dump(p.get(k)): p.get(k) for c in parts[(name, label)].values() for p in c.values()}
                by_count = len({len(s) for s in seen.values() if isinstance(s, list)}) == len(seen)
                hosts = v if isinstance(v, list) else [] if v is None else [v]
                bits.append(f"{len(hosts)} PS" if by_count else f"PS {'+'.join(map(str, hosts))}" if hosts
                            else "no PS")
            else:
                bits.append(f"{_short(k, name, keys)} {_value_of(k, v) if k in part else 'default'}")
        text.append(catalog.display_name(name) + (f" ({label})" if label else "") + (" " + ", ".join(bits) if bits
                                                                                      else ""))
    runs["scheduler_name"] = list(names)
    runs["scheduler"] = text
    runs["treatment_id"] = [t for _, t, _, _, _ in info]
    runs["treatment_params"] = [_dump(p) for _, _, _, _, p in info]
    # Equal names for different treatments of one configuration (values that print alike)
    cids = pd.Series([c for c, _, _, _, _ in info], index=runs.index)
    clash = runs.groupby([cids, runs["scheduler"]])["treatment_id"].transform("nunique") > 1
    runs.loc[clash, "scheduler"] = runs.loc[clash, "scheduler"] + " [" + runs.loc[clash, "treatment_id"] + "]"
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
    runs = pd.read_parquet(io.BytesIO(path.read_bytes()))  # whole: a sweep may be replacing it
    for col in [c for c in runs.columns if c.startswith("point.")]:
        # a swept list (e.g. roles.servers) comes back as an array: make it hashable text
        runs[col] = runs[col].map(lambda v: json.dumps(list(v)) if hasattr(v, "__len__") and not isinstance(v, str)
                                  else v)
    if run_ids is not None:
        runs = runs[runs["run_id"].isin(run_ids)]
    if "bound_model" in runs:  # annotated before the bound models had names of their own
        runs = runs.assign(bound_model=runs["bound_model"].map(lambda m: LEGACY_BOUND_MODELS.get(m, m)))
    runs = variant_names(catalog.fill(runs), sweep_dir)
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
    """Per data frame of a traced PS run (schedulers/transport/txstamps.py): role, rank, peer (the
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


def swept_keys(runs: pd.DataFrame, treatments: bool = False) -> list[str]:
    """The sweep's grid/zip keys that define configurations (from the `point.<key>` columns),
    leaving out the scheduler, its tunables and the seed, and keys with a single value. With
    `treatments`, every swept key but the scheduler itself: the tunables, `roles.servers`, the
    label and the seed too (what a reader of the setup needs to know was varied)."""
    keys = []
    for col in runs.columns:
        key = col[len("point."):]
        if col.startswith("point.") and key != POINT_NAME and \
                (key != "scheduler" if treatments else not _not_configuration(key)):
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


def host_names(runs: pd.DataFrame) -> list[str] | None:
    """The configured hosts' names (`topology.hosts`), to name `topology.hosts.N.*` keys by."""
    try:
        return [h["name"] for h in json.loads(runs["topology.hosts"].iloc[0])]
    except (KeyError, IndexError, TypeError, ValueError):
        return None


def add_configurations(runs: pd.DataFrame, sweep_dir: Path | None = None) -> pd.DataFrame:
    """Add `config_id` and `config` (a readable label) to each run.

    Two runs share a configuration when their resolved configs (each run's config.yaml) are
    equal apart from `scheduler`, `schedulers.*` and `seed`; the repeat index is not part of a
    config. The YAML is used rather than the row's columns because some row cells are
    overwritten by measurements (cross_traffic holds what the tenants achieved). Without a
    run directory (e.g. a synthetic table) the sweep name and the grid point decide. Rows not
    from `load_runs` get their treatments named here (`variant_names`).
    """
    runs = runs.copy() if "treatment_id" in runs else variant_names(runs, sweep_dir)
    ids = []
    for _, run in runs.iterrows():
        ids.append(_hash(_config_ident(run, list(runs.columns), _resolved(run, sweep_dir))))
    runs["config_id"] = ids
    keys = swept_keys(runs)
    single = runs["config_id"].nunique() == 1
    if keys or f"point.{POINT_NAME}" in runs:
        runs["config"] = short_labels([point_from_columns(r) for r in runs.to_dict("records")], host_names(runs))
    else:
        runs["config"] = [str(r.get("network", "") or "") or ("all runs" if single else r["config_id"])
                          for _, r in runs.iterrows()]
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
