"""Forest against each baseline on the same network: the ratio the bounds predict beside the
ratio measured: the test of the forest paper's claim (up to 18.3x).

A network point is a run's resolved config without its scheduler, scheduler tunables, seed,
roles and label (a parameter server placed on another host, or ranks listed in another order,
is part of the baseline, not of the network), and without its time dilation: how slowly the
emulation ran, not what it emulated (results are in emulated time), so a forest whose small
chunks need the CPU of k = 16 is set beside baselines run at 8. At each point the forest that
plans on measured bandwidth is the reference; for every other variant there:

    predicted = baseline's bound / forest's bound,   measured = baseline's iteration / forest's,

each bound being the optimum of the model the scheduler plays in on the bandwidth the run had
(`analysis/bounds.py`; ring and gloo in the order their ranks were given use
`ring_rank_order_bound_s`), iterations the runs' median (mean where the bandwidth varied).
`agreement` = measured / predicted: 1 when both run at the same fraction of their optimum.

The report section of forest and of the baselines it names by their deployment (ring and gloo:
their `report_sections`, contracts/scheduler_info.py), so the one module of analysis that names
them; every other baseline is named by its family (a parameter server: where its servers ran).
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from analysis import catalog

SECTION = "forest_compare"  # the report section this module is (schedulers declare it)
PAPER_BEST = 18.3   # the forest paper's largest speed-up over prior synchronization schemes
TARGET_AGREEMENT = 0.9
_NOT_NETWORK = ("scheduler", "schedulers", "seed", "roles", "name", "label", "time_dilation")


def variant(run: pd.Series) -> str:
    """A baseline as the report names it: the scheduler and what makes it that deployment, with
    the config's `label` where it sets one (a ring in the given order whose ranks a sweep lists
    rack by rack, beside one whose ranks it deals round-robin: the order is part of the roles,
    which the network point leaves out)."""
    name = _variant(run)
    label = _text(run.get("label"), "")
    if not label:
        return name
    return f"{name[:-1]}, {label})" if name.endswith(")") else f"{name} ({label})"


def _variant(run: pd.Series) -> str:
    sched = _registry_name(run)
    if sched == "forest":
        return f"forest ({_text(run.get('schedulers.forest.bandwidth'), 'measured')} bandwidth)"
    if sched == "ring":
        return f"ring (order {_text(run.get('schedulers.ring.order'), 'given')})"
    info = catalog.of_run(run)
    if info is not None and info.family == "parameter_server":
        servers = run.get("roles.servers")
        servers = ", ".join(json.loads(servers)) if isinstance(servers, str) and servers.startswith("[") else servers
        return f"{sched} (server on {servers})"
    return sched


def _registry_name(run: pd.Series) -> str:
    """The scheduler's registry name (`scheduler` may be a variant's, tables.variant_names)."""
    name = run.get("scheduler_name")
    return name if isinstance(name, str) and name else run["scheduler"]


def _text(value, default: str) -> str:
    return value if isinstance(value, str) and value else default


def _network_id(cfg: dict) -> str:
    net = {k: v for k, v in cfg.items() if k not in _NOT_NETWORK}
    return hashlib.sha256(json.dumps(net, sort_keys=True, default=str).encode()).hexdigest()[:8]


def _labels(cfgs: dict[str, dict]) -> dict[str, str]:
    """network id -> a short label: the topology's kind and the scalar settings that differ
    between this sweep's networks of that kind (the rest is in the report's Setup), plus
    contention."""
    def text(v):   # a generator's settings, e.g. {kind: spread, ratio: 20} -> "spread(ratio=20)"
        rest = ",".join(f"{k}={x:g}" if isinstance(x, float) else f"{k}={x}" for k, x in v.items() if k != "kind")
        return f"{v.get('kind', '')}({rest})"
    flat = {i: {k: (text(v) if isinstance(v, dict) else v)
                for k, v in (c.get("topology") or {}).items() if not isinstance(v, list)} for i, c in cfgs.items()}
    out = {}
    for i, cfg in cfgs.items():
        f = flat[i]
        same = [g for g in flat.values() if g.get("kind") == f.get("kind")]    # vary within a kind
        varying = [k for k in sorted(f) if k != "kind" and len({json.dumps(g.get(k), default=str) for g in same}) > 1]
        parts = [str(f.get("kind", "?"))] + [f"{k}={f[k]:g}" if isinstance(f[k], float) else f"{k}={f[k]}"
                                             for k in varying if f.get(k) not in (None, "null")]
        if cfg.get("cross_traffic"):
            parts.append(f"+ {len(cfg['cross_traffic'])} tenant flow(s)")
        if cfg.get("shaping"):
            parts.append(f"+ {len(cfg['shaping'])} shaped link(s)")
        out[i] = " ".join(parts)
    return out


def _iteration(run: pd.Series) -> float:
    if run.get("efficiency_basis") == "mean":
        return float(run["iter_time_mean_s"])
    return float(run["iter_time_median_s"])


def _bound(run: pd.Series) -> float:
    """The bound of the model the run plays in; ring and gloo in the given order use that order's."""
    sched = _registry_name(run)
    if sched == "gloo" or (sched == "ring" and _text(run.get("schedulers.ring.order"), "given") == "given"):
        rank = run.get("ring_rank_order_bound_s")
        if rank is not None and np.isfinite(rank):
            return max(float(rank), float(run.get("compute_median_s") or 0))
    return float(run["bound_s"])


def network_labels(runs: pd.DataFrame, sweep_dir: Path) -> dict[str, str]:
    """run id -> its network's short label (as `compare` names networks); runs without a config.yaml left out."""
    ids, cfgs = {}, {}
    for run_id in runs["run_id"]:
        path = Path(sweep_dir) / run_id / "config.yaml"
        if path.exists():
            cfg = yaml.safe_load(path.read_text())
            ids[run_id] = _network_id(cfg)
            cfgs.setdefault(ids[run_id], cfg)
    labels = _labels(cfgs)
    return {r: labels[i] for r, i in ids.items()}


def compare(runs: pd.DataFrame, sweep_dir: Path) -> pd.DataFrame:
    """One row per (network point, baseline variant) that has a measured-bandwidth forest run:
    predicted and measured forest/baseline ratios. Empty without such pairs."""
    ok = runs[runs["status"] == "ok"].copy()
    if ok.empty or "bound_s" not in ok:
        return pd.DataFrame()
    ids, cfgs = [], {}
    for _, run in ok.iterrows():
        path = Path(sweep_dir) / run["run_id"] / "config.yaml"
        cfg = yaml.safe_load(path.read_text()) if path.exists() else None
        ids.append(None if cfg is None else _network_id(cfg))
        if cfg is not None:
            cfgs.setdefault(ids[-1], cfg)
    labels = _labels(cfgs)
    ok["network_id"] = ids
    ok["network"] = [labels.get(i) for i in ids]
    ok["variant"] = ok.apply(variant, axis=1)
    ok["iteration_s"] = ok.apply(_iteration, axis=1)
    ok["model_bound_s"] = ok.apply(_bound, axis=1)
    rows = []
    for (_, label), grp in ok.dropna(subset=["network_id"]).groupby(["network_id", "network"], sort=False):
        by = grp.groupby("variant", sort=False).agg(iteration_s=("iteration_s", "median"),
                                                    bound_s=("model_bound_s", "median"), runs=("run_id", "size"))
        ref = "forest (measured bandwidth)"
        if ref not in by.index:
            continue
        f = by.loc[ref]
        for name, b in by.iterrows():
            if name == ref:
                continue
            predicted, measured = b["bound_s"] / f["bound_s"], b["iteration_s"] / f["iteration_s"]
            rows.append({"network": label, "baseline": name, "predicted": predicted, "measured": measured,
                         "agreement": measured / predicted, "forest_efficiency": f["bound_s"] / f["iteration_s"],
                         "baseline_efficiency": b["bound_s"] / b["iteration_s"],
                         "forest_ms": f["iteration_s"] * 1e3, "baseline_ms": b["iteration_s"] * 1e3,
                         "runs": int(b["runs"])})
    return pd.DataFrame(rows)


def headline(table: pd.DataFrame) -> dict[str, float | str]:
    """The largest measured forest/ring all-reduce (over the schedulers that declare that bound
    model) and forest/best-baseline ratios, and where."""
    out: dict[str, float | str] = {}
    rings = table[table["baseline"].str.startswith(tuple(catalog.with_bound_model("ring_allreduce")))]
    if len(rings):
        top = rings.loc[rings["measured"].idxmax()]
        out.update(ring_allreduce=float(top["measured"]),
                   ring_allreduce_where=f"{top['network']}, over {top['baseline']}",
                   ring_allreduce_predicted=float(top["predicted"]))
    others = table[~table["baseline"].str.startswith("forest")]
    if len(others):
        best = others.loc[others.groupby("network")["measured"].idxmin()]   # the fastest baseline per network
        top = best.loc[best["measured"].idxmax()]
        out.update(best=float(top["measured"]), best_where=f"{top['network']}, over {top['baseline']}",
                   best_predicted=float(top["predicted"]))
        out["largest"] = float(others["measured"].max())
        out["largest_predicted"] = float(others["predicted"].max())
    return out
