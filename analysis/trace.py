"""One run's timeline as Trace Event Format JSON (what Perfetto and chrome://tracing open).

`build_trace(run_dir)` reads a stored run directory (`results/<sweep>/<run_id>`, its row in
the sweep's runs.parquet) and returns the trace as a dict; `write_trace` writes it. Nothing
else is touched: the trace is a view of the stored tables.

**One time axis.** Every `ts` is microseconds from the run's origin, the monitors' t = 0:
`monitor_t0_wall` in the row, the one wall-clock instant the monitor's clock and the roles'
share (emu/run/runner.py). The stored tables have three time bases, each put on it:

- wall-clock instants (`time.time()` in the roles): iterations' `start`, `end`,
  `forward_start`, `backward_end` and events' `t`, stored already in emulated time
  (emu/config/dilation.py maps them around `monitor_t0_wall`): ts = (x - origin) x 1e6;
- monitor time `t` (seconds since the monitors' t = 0, emulated) of links.parquet and
  qdiscs.parquet: ts = (monitor_t0_wall - origin + t) x 1e6;
- what is stored in the roles' or the harness's wall clock, not converted at collection:
  faults.parquet's `actual_start_s`/`actual_end_s` (seconds after `roles_t0_wall`) and the
  forest's plan records (scheduler_info.json `plans`, their `time` a wall-clock instant on
  worker 0). They are made emulated instants here as the runner makes the others,
  origin + (x - origin) / k with k the row's `time_dilation` (x itself at k = 1).

Should any instant come before `monitor_t0_wall` (a row without it: rows older than it), the
origin is the earliest instant instead, and without `monitor_t0_wall` the monitor's t = 0 is
taken to be that origin (`otherData.monitor_aligned` is then false).

**What is in it.** One process (pid) per worker, named `worker<r> (<host>)`, with threads:
`iterations` (one slice per iteration: the window of contracts/iterations.py, from the
iteration table), `compute` (per step a `forward` and a `backward` slice: forward_start to the
start of backward, then to backward_end), `layers` (per layer and step its `wait` for the
previous iteration's aggregates, its `forward` and its `backward`, from layers.parquet), and
one thread per tensor key (`key K`, and `key K (2)`... where a push overlaps the key's
previous one; per iteration a `push` slice from the tensor's first
scheduler event to its last, which for the parameter servers and most collectives is its
first chunk sent to its aggregate received, for a forest's root its aggregate to its last
chunk sent down; and every scheduler event of that key as an instant named by its kind, args
chunk and iteration). Servers that traced get a process each, with their events
as instants per key. A `network` process holds two counter tracks per link direction:
`<link> utilisation` in % (achieved rate / configured rate, links.parquet) and `<link>
queue` in bytes (backlog, qdiscs.parquet); the unit is the counter's one arg, which Perfetto
appends to the track's name. A `run` process holds the faults (an instant where each
began and one where it ended) and the forest's plans (an instant each), global in scope.

The layer timeline is reconstructed from durations (workloads/timing.py): the forward pass
runs from `forward_start`, layer by layer in forward order, each layer's wait then its
forward (the time before the first layer, `lead_s`, is not stored: taken as 0); backward
follows at once, layers in reverse order, each for the sum of its tensors' gaps; the last
iteration's waits (in `finish()`) follow its step's `backward_end`. Per-layer positions are
therefore approximate; the step slices and the events are not.
"""
from __future__ import annotations

import io
import json
import math
import os
from collections import Counter
from pathlib import Path
from typing import Any

import pandas as pd

from analysis.tables import NoResults

US = 1e6
# thread ids within a worker's process; tensor keys are KEY_TID + key
T_ITERATIONS, T_COMPUTE, T_LAYERS, KEY_TID = 1, 2, 3, 100
# A push that begins before the key's previous one ended (a forest relays partial sums of the
# next iteration while this one's are still going down) goes on a further lane of its key, as
# a viewer stacks only slices that nest: lane L of key K is thread KEY_TID + K + LANE_TID x L.
LANE_TID = 100_000
T_FAULTS, T_PLANS = 1, 2


class NoRun(NoResults):
    """The directory is not a stored run (missing, or no row in its sweep's runs.parquet)."""


class NoTrace(NoResults):
    """The run recorded no scheduler events (`trace: false`, or it failed before collecting them)."""


def run_row(run_dir: Path) -> pd.Series:
    """The run's row from its sweep's runs.parquet (the directory's parent)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise NoRun(f"{run_dir}: no such run directory (expected RESULTS/SWEEP/RUN_ID)")
    runs_path = run_dir.parent / "runs.parquet"
    if not runs_path.exists():
        raise NoRun(f"{run_dir}: not a run directory ({runs_path}: no such file)")
    runs = pd.read_parquet(io.BytesIO(runs_path.read_bytes()))  # whole: a sweep may be replacing it
    row = runs[runs["run_id"] == run_dir.name] if "run_id" in runs else runs.iloc[:0]
    if row.empty:
        raise NoRun(f"{run_dir}: no run {run_dir.name!r} in {runs_path}")
    return row.iloc[-1]


def _num(v) -> float | None:
    """A finite float, or None (JSON has no NaN)."""
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def _args(**kw) -> dict[str, Any]:
    out = {}
    for k, v in kw.items():
        if hasattr(v, "item"):
            v = v.item()
        if isinstance(v, float):
            v = _num(v)
        out[k] = v
    return out


def _read(run_dir: Path, name: str) -> pd.DataFrame | None:
    path = run_dir / f"{name}.parquet"
    return pd.read_parquet(path) if path.exists() else None


def _hosts(row: pd.Series, key: str) -> list[str]:
    try:
        return list(json.loads(row.get(key) or "[]"))
    except (TypeError, ValueError):
        return []


class _Axis:
    """Wall-clock instants and monitor times as microseconds from the origin (module docstring)."""

    def __init__(self, row: pd.Series, instants: list[float]):
        self.monitor_t0 = _num(row.get("monitor_t0_wall"))
        self.k = _num(row.get("time_dilation")) or 1.0
        self.roles_t0 = _num(row.get("roles_t0_wall"))
        earliest = min(instants) if instants else None
        if self.monitor_t0 is None:
            self.origin = earliest if earliest is not None else 0.0
        else:
            self.origin = self.monitor_t0 if earliest is None else min(self.monitor_t0, earliest)
        self.monitor_aligned = self.monitor_t0 is not None

    def wall(self, x: float) -> float:
        """An instant stored in emulated time."""
        return round((x - self.origin) * US, 3)

    def duration(self, x: Any) -> float | None:
        """A duration the scheduler timed in the wall clock (a plan's probe), in emulated seconds."""
        x = _num(x)
        return None if x is None else x / self.k

    def raw_wall(self, x: float) -> float:
        """An instant in the wall clock (faults, plans): made emulated first."""
        if self.k != 1 and self.monitor_t0 is not None:
            x = self.monitor_t0 + (x - self.monitor_t0) / self.k
        return self.wall(x)

    def monitor(self, t: float) -> float:
        t0 = self.monitor_t0 if self.monitor_t0 is not None else self.origin
        return round((t0 - self.origin + t) * US, 3)


def _slice(name: str, cat: str, ts: float, dur: float, pid: int, tid: int, args: dict | None = None) -> dict:
    return {"name": name, "cat": cat, "ph": "X", "ts": round(max(ts, 0.0), 3), "dur": round(max(dur, 0.0), 3),
            "pid": pid, "tid": tid, "args": args or {}}


def _instant(name: str, cat: str, ts: float, pid: int, tid: int, scope: str, args: dict | None = None) -> dict:
    return {"name": name, "cat": cat, "ph": "i", "s": scope, "ts": max(ts, 0.0), "pid": pid, "tid": tid,
            "args": args or {}}


def _meta(what: str, pid: int, value, tid: int | None = None) -> dict:
    ev = {"name": what, "ph": "M", "pid": pid, "args": {"sort_index" if what.endswith("sort_index") else "name": value}}
    if tid is not None:
        ev["tid"] = tid
    return ev


def _layer_slices(its: pd.DataFrame, layers: pd.DataFrame, axis: _Axis, pid: int) -> list[dict]:
    """One worker's per-layer waits, forwards and backwards (module docstring: reconstructed)."""
    out = []
    by_it = {int(i): g.sort_values("layer") for i, g in layers.groupby("iteration")}
    steps = its.set_index("iteration").sort_index()
    last = int(steps.index.max())
    for s, step in steps.iterrows():
        s = int(s)
        cursor = axis.wall(step["forward_start"])   # microseconds on the axis, so that slices abut
        prev, here = by_it.get(s - 1), by_it.get(s)
        waits = dict(zip(prev["layer"], prev["wait_s"], strict=True)) if prev is not None else {}
        names = dict(zip(prev["layer"], prev["name"], strict=True)) if prev is not None else {}
        order = sorted(set(waits) | (set(here["layer"]) if here is not None else set()))
        fwd = dict(zip(here["layer"], here["forward_s"], strict=True)) if here is not None else {}
        names.update(dict(zip(here["layer"], here["name"], strict=True)) if here is not None else {})
        for layer in order:
            if layer in waits:
                out.append(_slice(f"wait {names[layer]}", "wait", cursor, waits[layer] * US, pid, T_LAYERS,
                                  _args(layer=layer, iteration=s - 1, wait_s=waits[layer])))
                cursor += waits[layer] * US
            if layer in fwd:
                out.append(_slice(f"forward {names[layer]}", "layer forward", cursor, fwd[layer] * US, pid,
                                  T_LAYERS, _args(layer=layer, iteration=s, forward_s=fwd[layer])))
                cursor += fwd[layer] * US
        if here is not None:
            for _, r in here.sort_values("layer", ascending=False).iterrows():
                out.append(_slice(f"backward {r['name']}", "layer backward", cursor, r["backward_s"] * US,
                                  pid, T_LAYERS, _args(layer=r["layer"], iteration=s, backward_s=r["backward_s"])))
                cursor += r["backward_s"] * US
        if s == last and here is not None:   # its own aggregates, waited for in finish()
            cursor = axis.wall(step["backward_end"])
            for _, r in here.iterrows():
                out.append(_slice(f"wait {r['name']}", "wait", cursor, r["wait_s"] * US, pid, T_LAYERS,
                                  _args(layer=r["layer"], iteration=s, wait_s=r["wait_s"])))
                cursor += r["wait_s"] * US
    return out


def _backward_start(its: pd.DataFrame, layers: pd.DataFrame | None, axis: _Axis) -> dict[int, float]:
    """Per step, when backward began on the axis: forward_start + the step's waits and forwards
    (lead 0), at most backward_end; without layer records, unknown (no entry)."""
    if layers is None or not len(layers):
        return {}
    fwd = layers.groupby("iteration")["forward_s"].sum()
    wait = layers.groupby("iteration")["wait_s"].sum()   # waited for in the next step
    out = {}
    for _, r in its.iterrows():
        s = int(r["iteration"])
        start = axis.wall(r["forward_start"]) + (float(fwd.get(s, 0.0)) + float(wait.get(s - 1, 0.0))) * US
        out[s] = min(start, axis.wall(r["backward_end"]))
    return out


def _worker(rank: int, its: pd.DataFrame, layers: pd.DataFrame | None, ev: pd.DataFrame | None, axis: _Axis,
            pid: int) -> list[dict]:
    out = []
    for _, r in its.sort_values("iteration").iterrows():
        out.append(_slice(f"iteration {int(r['iteration'])}", "iteration", axis.wall(r["start"]),
                          (r["end"] - r["start"]) * US, pid, T_ITERATIONS,
                          _args(iteration=r["iteration"], wait_s=r.get("wait_s"), compute_s=r.get("compute_s"),
                                loss=r.get("loss"))))
    if "forward_start" in its and "backward_end" in its:
        split = _backward_start(its, layers, axis)
        for _, r in its.sort_values("iteration").iterrows():
            s = int(r["iteration"])
            bwd = split.get(s)
            if bwd is None:
                out.append(_slice(f"compute {s}", "compute", axis.wall(r["forward_start"]),
                                  (r["backward_end"] - r["forward_start"]) * US, pid, T_COMPUTE, _args(iteration=s)))
                continue
            fwd, end = axis.wall(r["forward_start"]), axis.wall(r["backward_end"])
            out.append(_slice(f"forward {s}", "forward", fwd, bwd - fwd, pid, T_COMPUTE, _args(iteration=s)))
            out.append(_slice(f"backward {s}", "backward", bwd, end - bwd, pid, T_COMPUTE, _args(iteration=s)))
        if layers is not None and len(layers):
            out += _layer_slices(its, layers, axis, pid)
    if ev is not None and len(ev):
        out += _events(ev, axis, pid, pushes=True)
    return out


def _events(ev: pd.DataFrame, axis: _Axis, pid: int, pushes: bool) -> list[dict]:
    """Every scheduler event as an instant on its key's thread; with `pushes`, per (key,
    iteration) a push slice from its first event to its last."""
    out = []
    for r in ev.itertuples(index=False):
        out.append(_instant(str(r.event), str(r.event), axis.wall(r.t), pid, KEY_TID + int(r.key), "t",
                            _args(key=r.key, chunk=r.chunk, iteration=r.iteration)))
    if pushes:
        spans = []
        for (key, it), g in ev.sort_values("t", kind="stable").groupby(["key", "iteration"]):
            first, last = g.iloc[0], g.iloc[-1]
            spans.append((axis.wall(first["t"]), axis.wall(last["t"]), int(key), it, first, last, len(g)))
        lanes: dict[int, list[float]] = {}   # key -> where each of its lanes' last slice ends
        for start, end, key, it, first, last, n in sorted(spans, key=lambda x: (x[2], x[0])):
            ends = lanes.setdefault(key, [])
            lane = next((i for i, e in enumerate(ends) if e <= start), len(ends))
            ends[lane:lane + 1] = [end]
            out.append(_slice(f"push {key}", "push", start, end - start, pid, KEY_TID + key + LANE_TID * lane,
                              _args(key=key, iteration=it, seconds=last["t"] - first["t"], events=n,
                                    first=first["event"], last=last["event"])))
    return out


def _network(links: pd.DataFrame | None, qdiscs: pd.DataFrame | None, axis: _Axis, pid: int) -> list[dict]:
    out = []
    if links is not None:
        for r in links.itertuples(index=False):
            conf = _num(r.configured_bps)
            rate = _num(r.tx_bytes_per_s) or 0.0
            util = 100.0 * rate * 8 / conf if conf else 0.0
            out.append({"name": f"{r.link} utilisation", "cat": "utilisation", "ph": "C",
                        "ts": max(axis.monitor(r.t), 0.0), "pid": pid, "args": {"%": round(util, 3)}})
    if qdiscs is not None:
        for r in qdiscs.itertuples(index=False):
            out.append({"name": f"{r.link} queue", "cat": "queue", "ph": "C",
                        "ts": max(axis.monitor(r.t), 0.0), "pid": pid, "args": {"bytes": _num(r.backlog_bytes) or 0.0}})
    return out


def plans(run_dir: Path) -> list[dict]:
    """The forest's plan records (scheduler_info.json `plans`), [] without any."""
    path = Path(run_dir) / "scheduler_info.json"
    if not path.exists():
        return []
    try:
        return list(json.loads(path.read_text()).get("plans") or [])
    except (ValueError, AttributeError):
        return []


def _run_events(faults: pd.DataFrame | None, records: list[dict], axis: _Axis, pid: int) -> list[dict]:
    out = []
    if faults is not None and axis.roles_t0 is not None:
        for _, f in faults.iterrows():
            what = f"fault {int(f['fault'])}: {f['kind']} {f['target']}"
            args = _args(fault=f["fault"], kind=f["kind"], target=f["target"], host=f.get("host"),
                         planned_start_s=f.get("planned_start_s"), planned_end_s=f.get("planned_end_s"),
                         ended=f.get("ended"), note=f.get("note"), cost_s=f.get("cost_s"),
                         stall_max_s=f.get("stall_max_s"))
            if _num(f["actual_start_s"]) is not None:
                out.append(_instant(what, "fault", axis.raw_wall(axis.roles_t0 + f["actual_start_s"]), pid, T_FAULTS,
                                    "g", args))
            if _num(f["actual_end_s"]) is not None:
                out.append(_instant(f"{what} ends", "fault end", axis.raw_wall(axis.roles_t0 + f["actual_end_s"]), pid,
                                    T_FAULTS, "g", args))
    for rec in records:
        t = _num(rec.get("time"))
        if t is None:
            continue
        epoch = rec.get("epoch")
        name = f"forest {'plan' if not epoch else 're-plan'} (epoch {epoch}, iteration {rec.get('iteration')})"
        out.append(_instant(name, "plan", axis.raw_wall(t), pid, T_PLANS, "g",
                            _args(epoch=epoch, iteration=rec.get("iteration"), reason=rec.get("reason"),
                                  probe_s=axis.duration(rec.get("probe_s")), plan_s=axis.duration(rec.get("plan_s")),
                                  rate_bps=rec.get("rate_bps"), trees=rec.get("trees"))))
    return out


def build_trace(run_dir: Path) -> dict[str, Any]:
    """The run's timeline as a Trace Event Format dict (module docstring). Raises NoRun for a
    directory that is not a stored run, NoTrace for a run without scheduler events."""
    run_dir = Path(run_dir)
    row = run_row(run_dir)
    ev = _read(run_dir, "events")
    if ev is None or not len(ev):
        traced = _num(row.get("trace")) == 1.0
        why = (f"it recorded no scheduler events (status {row.get('status')}: {row.get('reason') or 'no reason'})"
               if traced else "it was not traced")
        raise NoTrace(f"{run_dir}: no events.parquet, {why}; set `trace: true` in its config "
                      f"(or --set trace=true) and run it again")
    if "role" not in ev:
        ev = ev.assign(role="worker")
    its = _read(run_dir, "iterations")
    layers = _read(run_dir, "layers")
    links, qdiscs, faults = _read(run_dir, "links"), _read(run_dir, "qdiscs"), _read(run_dir, "faults")
    instants = list(ev["t"].astype(float))
    if its is not None and len(its):
        instants += list(its["start"].astype(float))
    axis = _Axis(row, [x for x in instants if math.isfinite(x)])

    workers, servers = _hosts(row, "roles.workers"), _hosts(row, "roles.servers")
    w_ranks = sorted(set(ev.loc[ev["role"] == "worker", "rank"].astype(int))
                     | (set(its["rank"].astype(int)) if its is not None else set()) | set(range(len(workers))))
    s_ranks = sorted(set(ev.loc[ev["role"] == "server", "rank"].astype(int)))
    events: list[dict] = []
    pid = 1
    events += [_meta("process_name", pid, f"run {run_dir.name}: faults and plans"), _meta("process_sort_index", pid, 0),
               _meta("thread_name", pid, "faults", T_FAULTS), _meta("thread_name", pid, "plans", T_PLANS)]
    events += _run_events(faults, plans(run_dir), axis, pid)
    pid = 2
    events += [_meta("process_name", pid, "network"), _meta("process_sort_index", pid, 1)]
    events += _network(links, qdiscs, axis, pid)
    for role, ranks, hosts in (("worker", w_ranks, workers), ("server", s_ranks, servers)):
        for rank in ranks:
            pid += 1
            host = f" ({hosts[rank]})" if rank < len(hosts) else ""
            events += [_meta("process_name", pid, f"{role}{rank}{host}"), _meta("process_sort_index", pid, pid)]
            mine = ev[(ev["role"] == role) & (ev["rank"] == rank)]
            if role == "worker":
                w_its = its[its["rank"] == rank] if its is not None else pd.DataFrame()
                w_layers = layers[layers["rank"] == rank] if layers is not None else None
                for tid, name in ((T_ITERATIONS, "iterations"), (T_COMPUTE, "compute"), (T_LAYERS, "layers")):
                    events += [_meta("thread_name", pid, name, tid), _meta("thread_sort_index", pid, tid, tid)]
                made = (_worker(rank, w_its, w_layers, mine, axis, pid) if len(w_its)
                        else _events(mine, axis, pid, pushes=True))
            else:
                made = _events(mine, axis, pid, pushes=False)
            events += made
            used = {e["tid"] for e in made if e["tid"] >= KEY_TID}
            for tid in sorted(used | {KEY_TID + int(k) for k in mine["key"]}):
                key, lane = (tid - KEY_TID) % LANE_TID, (tid - KEY_TID) // LANE_TID
                sort = KEY_TID + key * 100 + lane
                events += [_meta("thread_name", pid, f"key {key}" + (f" ({lane + 1})" if lane else ""), tid),
                           _meta("thread_sort_index", pid, sort, tid)]
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"run_id": run_dir.name, "sweep": str(row.get("sweep", "")),
                          "scheduler": str(row.get("scheduler", "")), "origin_wall_s": axis.origin,
                          "time_dilation": axis.k, "monitor_aligned": axis.monitor_aligned,
                          "time_axis": "microseconds from origin_wall_s (the monitors' t = 0), emulated time"}}


KINDS = {"X": "slices", "C": "counters", "i": "instants", "M": "metadata"}


def counts(trace: dict[str, Any]) -> dict[str, Counter]:
    """Per kind of event (slices, counters, instants, metadata), how many of each category."""
    out: dict[str, Counter] = {k: Counter() for k in KINDS.values()}
    for e in trace["traceEvents"]:
        out[KINDS[e["ph"]]][e.get("cat", e["name"])] += 1
    return out


def span_us(trace: dict[str, Any]) -> tuple[float, float]:
    """(first ts, last ts + dur) over the timed events."""
    timed = [e for e in trace["traceEvents"] if e["ph"] != "M"]
    if not timed:
        return 0.0, 0.0
    return min(e["ts"] for e in timed), max(e["ts"] + e.get("dur", 0.0) for e in timed)


def write_trace(trace: dict[str, Any], path: Path) -> Path:
    """`trace` as JSON at `path`, written to a temporary file and renamed into place."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(json.dumps(trace, allow_nan=False, separators=(",", ":")))
    os.replace(tmp, path)
    return path
