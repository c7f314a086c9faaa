"""The forest's per-tree record (contracts/forest_trees.py): what each tree was planned to carry
and what it achieved, per iteration. It only observes: nothing here changes what is sent or when.

Cost: per received data frame, two clock reads and one dict update (under the forest's lock,
which the frame takes anyway); per averaged chunk one clock read; per push one. At close the
workers pass their records up a gather tree (a BFS tree from worker 0 over the connections
they have), so worker 0's `info()` holds everyone's.
"""
from __future__ import annotations

import time
from collections import deque

import numpy as np

from contracts.forest_trees import DoneColumns, EdgeColumns, EpochPlan, ForestTrees, PlannedTree, PushColumns, TreeEdge
from schedulers.collective.forest_plan import ForestPlan
from schedulers.core.linkmodel import LinkModel

REDUCE, BROADCAST = 0, 1


def _num(x: float) -> float | None:
    return None if not np.isfinite(x) else float(x)


def epoch_plan(epoch: int, plan: ForestPlan, model: LinkModel, assumed_bps: np.ndarray | None,
               configured: dict[tuple[str, str], float]) -> EpochPlan:
    """What the plan gave each tree and each link. `assumed_bps`: the capacities the plan was
    made on (model.links order; None: the model's own); `configured`: the capacity graph's rates."""
    cap = model.capacity if assumed_bps is None else np.asarray(assumed_bps, float)
    paths = model.path_links
    m = len(model.links)
    planned = np.zeros(m)
    trees = []
    for k, t in enumerate(plan.trees):
        edges = []
        for v, p in enumerate(t.parent):
            if p < 0:
                continue
            up = [int(e) for e in paths[v, p] if e < m]
            down = [int(e) for e in paths[p, v] if e < m]
            edges.append(TreeEdge(child=v, parent=p, up=up, down=down))
            if np.isfinite(t.rate):
                for e in up + down:
                    planned[e] += t.rate
        trees.append(PlannedTree(tree=k, root=t.root, depth=t.depth, fraction=t.fraction, rate_bps=_num(t.rate),
                                 edges=edges))
    return EpochPlan(epoch=epoch, rate_bps=_num(plan.rate), links=[f"{u}>{v}" for u, v in model.links],
                     capacity_bps=[_num(c) for c in cap],
                     configured_bps=[configured.get(link) for link in model.links],
                     planned_bps=[float(x) for x in planned], trees=trees)


def configured_rates(topology: dict | None) -> dict[tuple[str, str], float]:
    """The capacity graph's link rates (recorded beside the plan's; the measured-bandwidth plan never reads them)."""
    if topology is None:
        return {}
    return {(e["source"], e["target"]): float(e["capacity"])
            for e in topology.get("links", topology.get("edges", [])) if "capacity" in e}


def gather_tree(n: int, adjacency: list[set[int]]) -> tuple[list[int], list[list[int]]]:
    """(parent, children) of a BFS tree from worker 0 over `adjacency` (neighbours in rank
    order): the same on every worker for the same input. Unreached workers get parent -1."""
    parent = [-1] * n
    children: list[list[int]] = [[] for _ in range(n)]
    seen = {0}
    queue = deque([0])
    while queue:
        u = queue.popleft()
        for v in sorted(adjacency[u]):
            if v not in seen:
                seen.add(v)
                parent[v] = u
                children[u].append(v)
                queue.append(v)
    return parent, children


class TreeRecorder:
    """One worker's observations (the forest calls it with its lock held)."""

    def __init__(self, rank: int):
        self.rank = rank
        self.plans: list[EpochPlan] = []
        self._edges: dict[tuple[int, int, int], list] = {}    # (it, tree, src) -> [phase, bytes, first, last,
        #                                                        frames, early]
        self._done: dict[tuple[int, int], float] = {}          # (it, tree) -> latest average here
        self._pushes: dict[int, list] = {}                      # it -> [epoch, first, last]
        self._merged: list[ForestTrees] = []

    def add_plan(self, plan: EpochPlan) -> None:
        self.plans.append(plan)

    def pushed(self, it: int, epoch: int) -> None:
        now = time.time()
        rec = self._pushes.get(it)
        if rec is None:
            self._pushes[it] = [epoch, now, now]
        else:
            rec[2] = now

    def is_new(self, it: int, tree: int, src: int) -> bool:
        """No frame of this (iteration, tree, sender) yet: the next one opens its span (read
        without the lock by src's receive thread, the only one that adds such keys)."""
        return (it, tree, src) not in self._edges

    def frame(self, it: int, tree: int, src: int, phase: int, nbytes: int, first: float, last: float,
              early: int = 0) -> None:
        """A data frame from `src` for `tree`: its header was read at `first`, its payload was in
        at `last`; `early`: the bytes the socket already held when the span's first header was read
        (they came in before `first`, so a rate over the span leaves them out)."""
        rec = self._edges.get((it, tree, src))
        if rec is None:
            self._edges[(it, tree, src)] = [phase, nbytes, first, last, 1, early]
        else:
            rec[1] += nbytes
            rec[3] = last
            rec[4] += 1

    def delivered(self, it: int, tree: int) -> None:
        self._done[(it, tree)] = time.time()

    def merge(self, other: ForestTrees) -> None:
        self._merged.append(other)

    def record(self) -> ForestTrees:
        """Ours and what was merged into it."""
        e = sorted(self._edges.items())
        d = sorted(self._done.items())
        p = sorted(self._pushes.items())
        out = ForestTrees(
            ranks=[self.rank], plans=list(self.plans),
            edges=EdgeColumns(iteration=[k[0] for k, _ in e], tree=[k[1] for k, _ in e], src=[k[2] for k, _ in e],
                              dst=[self.rank] * len(e), phase=[v[0] for _, v in e], bytes=[v[1] for _, v in e],
                              first_t=[v[2] for _, v in e], last_t=[v[3] for _, v in e],
                              frames=[v[4] for _, v in e], early=[v[5] for _, v in e]),
            done=DoneColumns(iteration=[k[0] for k, _ in d], tree=[k[1] for k, _ in d], rank=[self.rank] * len(d),
                             t=[v for _, v in d]),
            pushes=PushColumns(iteration=[k for k, _ in p], rank=[self.rank] * len(p), epoch=[v[0] for _, v in p],
                               first_t=[v[1] for _, v in p], last_t=[v[2] for _, v in p]))
        for other in self._merged:
            out.merge(other)
        return out
