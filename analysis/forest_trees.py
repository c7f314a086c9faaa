"""Planned against achieved, per tree of the forest, from the run's record (scheduler_info.json
`trees`, contracts/forest_trees.py): which tree, and on which link, held each iteration back.

Over the measured iterations (`contracts/iterations.py`: iteration >= warmup), in emulated
units (a dilated run's wall-clock rates x k, durations / k):

- a tree's **achieved** rate in an iteration: its slice of the gradient (bits) over its
  all-reduce time, the longest at any worker from that worker's first push to the moment the
  tree's last average reached it (per worker, so that workers whose iterations are skewed do
  not add their skew). Were every tree at its planned rate, every tree would finish at G / R, each at
  achieved = planned; the tree that finishes last **set the iteration**.
- a tree edge's rate: the bits of that tree it carried one way over the time from its first
  frame to its last (the tree's stream on that edge, as the receiver saw it), less what the
  socket held already when the first header was read (a receive thread that was late would
  otherwise make the span too short and the rate too high). The tree's
  slowest edge is where it was held back; its links are the path of that edge, the plan's
  tightest of them (highest planned load / capacity) named first.
- a tree's **pipeline share**: the share of its planned rate it reaches when each of its
  2 x depth hops (up to the root, then down) runs at that rate and forwards only whole chunks.
  A slice of S bits in chunks of c crosses them as a pipeline in (S + (2 depth - 1) c) / rate,
  so the share is S / (S + (2 depth - 1) c), with c the tree's mean frame (bytes / frames on
  its edges). Where a tree's achieved share is near it, its chunks held it, not the network;
  hops that run faster than planned (pacing's margin, a link other trees left idle) beat it.
- a link's achieved load: the bits every tree edge crossing it carried (less each edge's early
  bytes), over the time from the first frame to the last. Receivers time what they read, so
  only a link into a receiving host (its path's last hop) is judged: above that link's configured
  rate (plus `PHYSICS_SLACK`) is a measurement bug (`physics_violations`). On a link further
  up a path, bytes that crossed it earlier and waited in a queue after it arrive inside the
  window, so its figure may exceed its rate without breaking physics (`last_hop` False).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.capacity import time_dilation
from contracts.forest_trees import KEY, EpochPlan, ForestTrees

SECTION = "forest_trees"  # the report section this module is (schedulers declare it)

PHYSICS_SLACK = 1.05   # a link's achieved load may exceed its configured rate by this before it is a bug


def load(run_dir: Path) -> ForestTrees | None:
    """The run's record; None where the run kept none (not a forest, or written before it had one)."""
    path = Path(run_dir) / "scheduler_info.json"
    if not path.exists():
        return None
    try:
        info = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(info, dict) or KEY not in info:
        return None
    return ForestTrees.model_validate(info[KEY])


def _frames(rec: ForestTrees, warmup: int, k: float) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    edges = pd.DataFrame(rec.edges.model_dump())
    done = pd.DataFrame(rec.done.model_dump())
    pushes = pd.DataFrame(rec.pushes.model_dump())
    edges, done, pushes = (d[d["iteration"] >= warmup] for d in (edges, done, pushes))
    span = (edges["last_t"] - edges["first_t"]) / k
    after = (edges["bytes"] - edges["early"]).clip(lower=0)      # what came in between first_t and last_t
    edges = edges.assign(rate_bps=np.where(span > 0, 8.0 * after / span.where(span > 0, 1.0), np.nan), after=after)
    return edges, done, pushes


def _tight(plan: EpochPlan, links: list[int]) -> list[int]:
    """`links` with the plan's tightest first (planned load / assumed capacity, then lowest capacity)."""
    def key(e):
        cap = plan.capacity_bps[e]
        return (-(plan.planned_bps[e] / cap) if cap else 0.0, cap or np.inf, e)
    return sorted(set(links), key=key)


def iteration_table(rec: ForestTrees, warmup: int, k: float = 1.0) -> pd.DataFrame:
    """Per measured iteration and tree: planned and achieved rate, finish time, its mean chunk
    and pipeline share, whether it set the iteration, its slowest edge and that edge's
    rate and links."""
    edges, done, pushes = _frames(rec, warmup, k)
    if edges.empty or done.empty or pushes.empty:
        return pd.DataFrame()
    epoch = pushes.groupby("iteration")["epoch"].max()
    done = done.merge(pushes[["iteration", "rank", "first_t"]], on=["iteration", "rank"])
    done["took"] = (done["t"] - done["first_t"]) / k
    finish = done.groupby(["iteration", "tree"])["took"].max()
    last_rank = done.loc[done.groupby(["iteration", "tree"])["took"].idxmax()].set_index(["iteration", "tree"])["rank"]
    rows = []
    for (it, tree), grp in edges.groupby(["iteration", "tree"]):
        plan = rec.plans[int(epoch.get(it, 0))]
        if tree >= len(plan.trees):
            continue
        pt = plan.trees[tree]
        dur = finish.get((it, tree), np.nan)
        slow = grp.loc[grp["rate_bps"].fillna(np.inf).idxmin()]
        slice_bytes = float(grp["bytes"].max())
        chunk = float((grp["bytes"] / grp["frames"].where(grp["frames"] > 0)).median())
        edge = next(e for e in pt.edges if {e.child, e.parent} == {int(slow["src"]), int(slow["dst"])})
        path = edge.up if int(slow["src"]) == edge.child else edge.down
        rows.append({"iteration": int(it), "epoch": plan.epoch, "tree": int(tree), "root": pt.root, "depth": pt.depth,
                     "fraction": pt.fraction, "planned_bps": (pt.rate_bps or np.nan) * k,
                     "achieved_bps": 8.0 * slice_bytes / dur if dur > 0 else np.nan,
                     "finish_s": dur, "last_rank": int(last_rank.get((it, tree), -1)),
                     "chunk_bytes": chunk, "pipeline_share": slice_bytes / (slice_bytes + (2 * pt.depth - 1) * chunk)
                     if slice_bytes > 0 and chunk > 0 else np.nan,
                     "slowest_edge": f"{int(slow['src'])}->{int(slow['dst'])}", "slowest_bps": float(slow["rate_bps"]),
                     "slowest_links": " ".join(plan.links[e] for e in _tight(plan, path))})
    out = pd.DataFrame(rows)
    if out.empty:
        return out
    out["set_iteration"] = out["finish_s"] == out.groupby("iteration")["finish_s"].transform("max")
    return out


def tree_table(rec: ForestTrees, warmup: int, k: float = 1.0) -> pd.DataFrame:
    """Per (plan epoch, tree), over the measured iterations: planned and median achieved rate,
    their ratio, the median pipeline share, median finish, how often it set
    the iteration, its usual slowest edge, that edge's median rate and links."""
    it = iteration_table(rec, warmup, k)
    if it.empty:
        return it
    rows = []
    for (epoch, tree), g in it.groupby(["epoch", "tree"]):
        edge = g["slowest_edge"].mode().iloc[0]
        ge = g[g["slowest_edge"] == edge]
        achieved = g["achieved_bps"].median()
        rows.append({"epoch": int(epoch), "tree": int(tree), "root": int(g["root"].iloc[0]),
                     "depth": int(g["depth"].iloc[0]), "fraction": float(g["fraction"].iloc[0]),
                     "planned_bps": float(g["planned_bps"].iloc[0]), "achieved_bps": float(achieved),
                     "of_planned": float(achieved / g["planned_bps"].iloc[0]),
                     "pipeline_share": float(g["pipeline_share"].median()),
                     "finish_s": float(g["finish_s"].median()), "set_iterations": int(g["set_iteration"].sum()),
                     "iterations": len(g), "slowest_edge": edge, "slowest_bps": float(ge["slowest_bps"].median()),
                     "slowest_links": ge["slowest_links"].iloc[0]})
    return pd.DataFrame(rows)


def link_table(rec: ForestTrees, warmup: int, k: float = 1.0) -> pd.DataFrame:
    """Per link that a tree edge crosses, per plan epoch: the capacity the plan assumed, the
    configured one, the plan's load and the median achieved load over the measured iterations
    (bits of every tree edge crossing it / first frame to last), and how many iterations put
    more than the configured capacity through it (a measurement bug)."""
    edges, _, pushes = _frames(rec, warmup, k)
    if edges.empty:
        return pd.DataFrame()
    epoch = pushes.groupby("iteration")["epoch"].max()
    rows = []
    for ep, plan in enumerate(rec.plans):
        its = [i for i, e in epoch.items() if e == ep]
        part = edges[edges["iteration"].isin(its)]
        if part.empty:
            continue
        path: dict[tuple[int, int, int], list[int]] = {}
        for t in plan.trees:
            for e in t.edges:
                path[(t.tree, e.child, e.parent)] = e.up
                path[(t.tree, e.parent, e.child)] = e.down
        outgoing: dict[str, int] = {}
        for name in plan.links:
            outgoing[name.split(">")[0]] = outgoing.get(name.split(">")[0], 0) + 1
        into_host = [outgoing.get(name.split(">")[1], 0) == 1 for name in plan.links]   # a host has one link
        crossing: dict[int, list[int]] = {}
        for idx, (tree, src, dst) in zip(part.index, zip(part["tree"], part["src"], part["dst"], strict=True),
                                         strict=True):
            for link in path.get((int(tree), int(src), int(dst)), []):
                crossing.setdefault(link, []).append(idx)
        for link, idxs in sorted(crossing.items()):
            sub = part.loc[idxs]
            per_it = sub.groupby("iteration").agg(bits=("after", lambda b: 8.0 * b.sum()), first=("first_t", "min"),
                                                 last=("last_t", "max"))
            span = (per_it["last"] - per_it["first"]) / k
            load = (per_it["bits"] / span.where(span > 0)).dropna()
            conf = plan.configured_bps[link]
            rows.append({"epoch": ep, "link": plan.links[link],
                         "capacity_bps": (plan.capacity_bps[link] or np.nan) * k,
                         "configured_bps": (conf or np.nan) * k, "planned_bps": plan.planned_bps[link] * k,
                         "achieved_bps": float(load.median()) if len(load) else np.nan,
                         "last_hop": into_host[link],
                         "physics_violations": int((load > conf * k * PHYSICS_SLACK).sum())
                         if conf and into_host[link] else 0})
    return pd.DataFrame(rows)


def run_summary(run_dir: Path, warmup: int) -> dict | None:
    """The run's trees, links, and who set its iterations: the tree that finished last most
    often, its usual slowest edge and that edge's links (the plan's tightest first); None
    without a record."""
    rec = load(run_dir)
    if rec is None:
        return None
    k = time_dilation(run_dir)
    trees = tree_table(rec, warmup, k)
    links = link_table(rec, warmup, k)
    if trees.empty:
        return None
    setter = trees.sort_values(["set_iterations", "of_planned"], ascending=[False, True]).iloc[0]
    return {"trees": trees, "links": links, "ranks": len(rec.ranks), "setter_tree": int(setter["tree"]),
            "setter_epoch": int(setter["epoch"]), "setter_share": f"{setter['set_iterations']}/{setter['iterations']}",
            "setter_edge": setter["slowest_edge"], "setter_links": setter["slowest_links"],
            "setter_of_planned": float(setter["of_planned"]), "setter_pipeline_share": float(setter["pipeline_share"]),
            "physics_violations": int(links["physics_violations"].sum()) if len(links) else 0}
