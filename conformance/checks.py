"""The loopback checks of `./inv check-scheduler`, each one row with its figure.

- averages: at 1, 2, 3 and 8 workers (1, 1, 2 and 4 servers for the PS family), tiny,
  odd-sized and one huge tensor over several iterations, every worker's result equal to the
  reference average and the replicas bit-identical (they must stay in step);
- dead peer: a worker that dies mid-iteration is named in every survivor's error within
  DEAD_PEER_S, instead of a hang or a timeout's vague message;
- close: no thread or socket of a worker's process outlives close(), over every averages job.

The sizes keep the whole set near 15 s a scheduler on a 2-core machine (README: Tests).
"""
from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from conformance import jobs
from conformance.reference import tensor_set
from schedulers import registry

CASES = [(1, 1), (2, 1), (3, 2), (8, 4)]  # (workers, servers); the collective family has no servers
HUGE = 1_000_000      # elements (4 MB) of the huge tensor, beyond a default bucket or partition
ITERATIONS = 3
DEAD_PEER_S = 10.0
DEAD_RANK = 2         # of 3 workers; it pushes one gradient of the last iteration and exits


@dataclass
class Row:
    """One check: its name, its figure, whether it passed, and why not."""

    check: str
    figure: str
    passed: bool
    detail: str = ""


def _servers(name: str, servers: int) -> int:
    return servers if registry.SCHEDULERS[name].Params.requires_servers else 0


def _failure(out: jobs.Outcome, out_dir: Path) -> str | None:
    """The first role that failed or gave no answer, with its reason."""
    roles = [(f"worker{i}", a) for i, a in enumerate(out.workers)]   # a worker's error is the likelier cause
    roles += [(f"server{i}", a) for i, a in enumerate(out.servers)]
    for role, a in roles:
        if a is None:
            return f"{role} gave no answer (hung or crashed): {jobs.log_tail(out_dir, role)}"
        if a.get("error"):
            return f"{role}: {a['error'][:300]}"
    return None


def averages(name: str, params: dict, workers: int, servers: int, tmp: Path,
             plugins: list[str] = ()) -> tuple[Row, list[dict]]:
    """One averages job; its row and the workers' answers (their leak counts)."""
    servers = _servers(name, servers)
    seed = 7 * workers + servers
    job = jobs.Job(name, params, workers, servers, tensor_set(seed, big=HUGE), ITERATIONS, seed=seed,
                   plugins=list(plugins))
    out_dir = tmp / f"avg-{workers}w{servers}s"
    out = jobs.run(job, out_dir)
    label = f"averages {workers}w" + (f" {servers}s" if servers else "")
    failed = _failure(out, out_dir)
    if failed:
        return Row(label, f"{out.wall_s:.1f} s", False, failed), []
    first = out.workers[0]
    if first["wrong"]:
        return Row(label, f"{first['max_abs_error']:.1e} max abs error", False, first["wrong"]), out.workers
    apart = [r for r, a in enumerate(out.workers) if a["digests"] != first["digests"]]
    detail = f"worker {apart[0]}'s results differ from worker 0's (replicas must be bit-identical)" if apart else ""
    return Row(label, f"{first['max_abs_error']:.1e} max abs error, {out.wall_s:.1f} s", not apart, detail), out.workers


def dead_peer(name: str, params: dict, tmp: Path, plugins: list[str] = ()) -> Row:
    """Worker DEAD_RANK of 3 dies in the last iteration; every survivor must fail naming it."""
    job = jobs.Job(name, params, 3, _servers(name, 2), tensor_set(3, big=0), 2, seed=3, stop_after={DEAD_RANK: 1},
                   timeout_s=DEAD_PEER_S + 20, plugins=list(plugins))
    out = jobs.run(job, tmp / "dead-peer")
    died = out.workers[DEAD_RANK]
    if died is None or "died_at" not in died:
        return Row("dead peer", "-", False, f"worker {DEAD_RANK} did not get to die: {died}")
    worst, problems = 0.0, []
    for r, a in enumerate(out.workers):
        if r == DEAD_RANK:
            continue
        if a is None or not a.get("error"):
            problems.append(f"worker {r} " + ("hung" if a is None else "finished without an error"))
            continue
        took = a["failed_at"] - died["died_at"]
        worst = max(worst, took)
        if f"worker {DEAD_RANK}" not in a["error"]:
            problems.append(f"worker {r}'s error does not name worker {DEAD_RANK}: {a['error'].strip()[:200]}")
        elif took > DEAD_PEER_S:
            problems.append(f"worker {r} took {took:.1f} s")
    figure = f"named in {worst:.2f} s" if not problems else (f"{worst:.1f} s" if worst else "-")
    return Row("dead peer", figure, not problems, "; ".join(problems))


def close_leaks(answers: list[dict]) -> Row:
    """What close() left in the workers' processes, summed over the averages jobs."""
    threads = sum(len(a["threads_left"]) for a in answers)
    sockets = sum(a["sockets_left"] for a in answers)
    names = sorted({t.split("#")[0] for a in answers for t in a["threads_left"]})
    detail = f"threads left: {', '.join(names)}" if names else ("sockets left open" if sockets else "")
    return Row("close()", f"{threads} threads, {sockets} sockets left ({len(answers)} workers)",
               not threads and not sockets and bool(answers), detail or ("" if answers else "no job completed"))


def loopback(name: str, params: dict | None = None, progress: Callable[[str], None] = lambda s: None,
             work_dir: Path | None = None, plugins: list[str] = ()) -> list[Row]:
    """Every loopback check of one scheduler, in order; `progress` hears each as it starts.
    `plugins`: absolute paths (or modules) defining the scheduler, loaded by every role."""
    params = params or {}
    with tempfile.TemporaryDirectory(prefix=f"check-{name}-", dir=work_dir) as tmp:
        rows, answers = [], []
        for i, (w, s) in enumerate(CASES):
            progress(f"[{i + 1}/{len(CASES) + 1}] averages with {w} worker(s)")
            row, got = averages(name, params, w, s, Path(tmp), plugins)
            rows.append(row)
            answers += got
        progress(f"[{len(CASES) + 1}/{len(CASES) + 1}] a dead peer")
        rows.append(dead_peer(name, params, Path(tmp), plugins))
        rows.append(close_leaks(answers))
    return rows
