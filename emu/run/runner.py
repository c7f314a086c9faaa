"""The path of one run: network up, roles launched, records collected, row written.

Whatever happens (a role crashes, the run times out, Ctrl-C or SIGTERM) the network is
torn down in a `finally`, the logs stay in the run directory, and the run's row is
written with its status and reason. Rows already written are never touched.
"""
from __future__ import annotations

import contextlib
import datetime as dt
import importlib.metadata as md
import json
import math
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from contracts import progress as role_progress
from contracts import tx_frames
from contracts.iterations import measured
from contracts.role_spec import Address, RoleSpec
from contracts.role_spec import role_specs as build_role_specs
from contracts.scheduler_info import COLUMN as SCHEDULER_METADATA
from emu.config.capacity import capacity_graph, graph_to_json
from emu.config.dilation import (
    WallPlan,
    cross_to_emulated,
    rates_to_emulated,
    summary_to_emulated,
    table_to_emulated,
    wall_plan,
)
from emu.config.experiment import NETLINK_QDISC_INTERVAL_S, Experiment
from emu.run.faults import FaultOps, Faults
from emu.run.faults import costs as fault_costs
from emu.run.results import (
    ResultsError,
    flatten,
    in_results,
    record_run,
    remove_temporaries,
    write_parquet,
    write_text,
)
from emu.run.watchdog import Evidence, Peers, Stall, Watchdog, proc_state
from emu.run.watchdog import reason as stall_reason
from emu.testbed.cleanup import StateDir
from emu.testbed.crosstraffic import CrossTraffic
from emu.testbed.fidelity import verdict
from emu.testbed.machine import RUN_LIMITS, read_sysctl
from emu.testbed.monitor import Monitor, backend_for
from emu.testbed.netlink import NetlinkError
from emu.testbed.network import NetworkError, Testbed
from emu.testbed.shaping import Shaper
from emu.testbed.tcpcounters import HostCounters, drops_toward
from emu.testbed.tcpcounters import totals as tcp_totals

REPO = Path(__file__).resolve().parents[2]
SERVER_PORT = 29500  # server i listens on SERVER_PORT + i
WORKER_PORT = 29600  # worker i listens for its peers on WORKER_PORT + i
SYSCTLS = ["net.core.rmem_max", "net.core.wmem_max", "net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem",
           "net.ipv4.tcp_congestion_control", "net.ipv4.tcp_allowed_congestion_control",
           "net.bridge.bridge-nf-call-iptables", *(limit.key for limit in RUN_LIMITS)]


class RunFailed(Exception):
    """The run could not complete; the message is the reason stored in its row."""


def terminate_as_interrupt(signum, _frame):
    raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")


def environment() -> dict[str, Any]:
    """What produced a result: code version, library versions, kernel, and the machine's
    network sysctls (the root namespace's; the hosts' congestion control is `tcp.*` in the row)."""
    def git(*args: str) -> str:
        try:
            r = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True)
        except OSError:  # no git on a machine given the tree as an archive: the version is unknown
            return ""
        return r.stdout.strip() if r.returncode == 0 else ""

    sysctls = {name: read_sysctl(name) for name in SYSCTLS}
    versions = {}
    for pkg in ("torch", "numpy", "pandas", "pydantic", "networkx"):
        try:
            versions[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            versions[pkg] = None
    from mininet.net import VERSION as mininet_version

    versions["mininet"] = mininet_version
    versions["python"] = platform.python_version()
    sha = git("rev-parse", "HEAD")
    if not sha and os.environ.get("SCHEDLAB_GIT_SHA"):  # a Ray node runs the driver's tree without .git
        sha, dirty = os.environ["SCHEDLAB_GIT_SHA"], os.environ.get("SCHEDLAB_GIT_DIRTY") == "1"
    else:
        dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    return {
        "git_sha": sha or None,
        "git_dirty": dirty,
        "versions": versions,
        "kernel": platform.release(),
        "sysctls": sysctls,
        "cpus": os.cpu_count(),
        **machine(),
    }


def machine(cpuinfo: Path = Path("/proc/cpuinfo")) -> dict[str, Any]:
    """The machine beside its CPU count, for a figure's provenance: the CPU's model (the first
    `model name` of /proc/cpuinfo, else platform.processor(), None where neither says) and the
    physical memory in bytes (None where sysconf does not know it)."""
    model = None
    try:
        for line in cpuinfo.read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and value.strip():
                model = value.strip()
                break
    except OSError:
        pass
    model = model or platform.processor() or None
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        memory = None
    return {"cpu_model": model, "memory_bytes": memory if memory and memory > 0 else None}


def role_specs(exp: Experiment, ips: dict[str, str], out_dir: Path, wall: WallPlan | None = None
               ) -> list[tuple[str, str, RoleSpec]]:
    """(role name, host, spec) for servers then workers. The roles live in wall-clock time:
    under time dilation (`wall`, emu/config/dilation.py) they get the links' real (dilated) rates in
    their capacity graph, the scheduler's times, the connect timeout and the dead-peer time x k, replayed
    compute k times slower, and never k itself."""
    wall = wall or wall_plan(exp)
    specs = build_role_specs(
        [Address(host=h, ip=ips[h], port=SERVER_PORT + i) for i, h in enumerate(exp.roles.servers)],
        [Address(host=h, ip=ips[h], port=WORKER_PORT + i) for i, h in enumerate(exp.roles.workers)],
        seed=exp.seed, scheduler=exp.scheduler, params=wall.scheduler_params, workload=wall.workload,
        topology=graph_to_json(capacity_graph(wall.net)), out_dir=out_dir,
        connect_timeout_s=wall.connect_timeout_s,  # the run's own timeout_s bounds everything anyway
        dead_peer_s=wall.dead_peer_s,
        trace=exp.trace, plugins=role_plugins(exp, Path(out_dir).parent))
    return [(s.name, s.address.host, s) for s in specs]


def plugin_copies(exp: Experiment) -> list[tuple[Any, str | None]]:
    """Each of the run's plugins with the name of its copy under the run's `plugins/` (None for
    a module, which the roles import by name); a second file of the same name gets its index."""
    taken: set[str] = set()
    out: list[tuple[Any, str | None]] = []
    for i, p in enumerate(exp.plugins):
        name = None
        if p.kind == "file":
            name = Path(p.path or p.spec).name
            name = f"{i}-{name}" if name in taken else name
            taken.add(name)
        out.append((p, name))
    return out


def role_plugins(exp: Experiment, run_dir: Path) -> list[str]:
    """What the roles load before creating the scheduler: the copies in the run directory (the
    code the run id hashed, even if the original changes meanwhile) or the modules' names."""
    return [str(run_dir / "plugins" / name) if name else (p.module or p.spec) for p, name in plugin_copies(exp)]


def _copy_plugins(exp: Experiment, run_dir: Path) -> None:
    """The plugin files go with the run, as its config does."""
    for p, name in plugin_copies(exp):
        if name is not None:
            (run_dir / "plugins").mkdir(exist_ok=True)
            shutil.copyfile(p.path or p.spec, run_dir / "plugins" / name)


def _last_line(path: Path) -> str:
    try:
        lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return lines[-1].strip()[:300] if lines else ""


def _exit_reason(role: str, host: str, rc: int, log_dir: Path, injected: str = "") -> str:
    """`injected`: the fault that caused it, said before the role's last words."""
    how = f"was killed by {signal.Signals(-rc).name}" if rc < 0 else f"exited with code {rc}"
    last = _last_line(log_dir / f"{role}.err")
    return f"{role} on {host} {how}{injected}" + (f": {last}" if last else "")


def _evidence(tb: Testbed, stall: Stall, faults: Faults | None = None) -> Evidence:
    """What the runner can see of a stall: the roles' process states, the links that are down,
    and the injected faults in force (or ended within the window: their effects outlast them)."""
    return Evidence(wall_now=time.time(), proc_state={r: proc_state(tb.roles[r].pid) for r in stall.reports},
                    down_links=tb.down_links(),
                    faults=faults.in_force(stall.at, recent_s=stall.window.seconds) if faults is not None else [])


def _killed_by(faults: Faults | None, role: str) -> str:
    what = faults.killed(role) if faults is not None else None
    return f" (injected: {what})" if what else ""


def _wait_for_roles(tb: Testbed, roles: list[tuple[str, str, RoleSpec]], exp: Experiment, log_dir: Path,
                    rec_dir: Path, progress: Callable[[int], None], background=(), wall: WallPlan | None = None,
                    watchdog: Watchdog | None = None,
                    evidence: Callable[[Stall], Evidence] | None = None, faults: Faults | None = None) -> None:
    """Until every role has exited 0; a RunFailed naming the cause otherwise: a background
    helper's error, a role's death (and the kill fault that caused it, from `faults`), roles
    outliving the workers, `timeout_s` (x time_dilation in wall clock, `wall`), or a stall
    (`watchdog`, emu/run/watchdog.py; `evidence` says what is known about it)."""
    wall = wall or wall_plan(exp)
    deadline = time.monotonic() + wall.timeout_s
    workers_done_at = None
    host_of = {r: h for r, h, _ in roles}
    iterations = exp.workload["iterations"]
    while True:
        for helper in background:
            if helper.error is not None:
                raise RunFailed(f"{type(helper).__name__.lower()}: {helper.error}")
        codes = {r: p.poll() for r, p in tb.roles.items()}
        if any(rc not in (None, 0) for rc in codes.values()):
            # One death makes its peers fail too; let them settle, then name the likely
            # root cause first: a role killed by a signal, then workers before servers.
            time.sleep(0.5)
            codes = {r: p.poll() for r, p in tb.roles.items()}
            failed = sorted((r for r, rc in codes.items() if rc not in (None, 0)),
                            key=lambda r: (codes[r] > 0, r.startswith("server"), r))
            raise RunFailed("; ".join(_exit_reason(r, host_of[r], codes[r], log_dir, _killed_by(faults, r))
                                      for r in failed))
        if all(rc == 0 for rc in codes.values()):
            return
        workers = [r for r in codes if r.startswith("worker")]
        if workers_done_at is None and all(codes[r] == 0 for r in workers):
            workers_done_at = time.monotonic()
        if workers_done_at is not None and time.monotonic() - workers_done_at > wall.roles_grace_s:
            stuck = [r for r, rc in codes.items() if rc is None]
            raise RunFailed(f"{', '.join(stuck)} did not exit {wall.roles_grace_s:g} s after the workers finished")
        if time.monotonic() > deadline:
            done = []
            for r in workers:
                p = rec_dir / f"{r}.progress"
                done.append(f"{r} at {p.read_text() if p.exists() else 0}/{iterations}")
            dilated = f" x time_dilation {wall.k:g} = {wall.timeout_s:g} s of wall clock" if wall.k != 1 else ""
            raise RunFailed(f"timed out after {exp.timeout_s:g} s (timeout_s{dilated}); {', '.join(done)}")
        if watchdog is not None:
            stall = watchdog.poll(time.monotonic(), [r for r, rc in codes.items() if rc is None])
            if stall is not None:
                ev = evidence(stall) if evidence is not None else Evidence(wall_now=time.time())
                raise RunFailed(stall_reason(stall, ev, watchdog.peers, iterations)[1])
        least = iterations
        for r in workers:
            try:
                least = min(least, int((rec_dir / f"{r}.progress").read_text() or 0))
            except (OSError, ValueError):
                least = 0
        progress(least)
        time.sleep(0.2)


def summarize(exp: Experiment, iters: pd.DataFrame, summaries: list[dict]) -> dict[str, Any]:
    warm = iters[measured(iters["iteration"], exp.workload["warmup"], exp.workload["iterations"])]
    t = warm["end"] - warm["start"]
    last = iters[iters["iteration"] == iters["iteration"].max()]
    return {
        "iter_time_median_s": float(t.median()),
        "iter_time_mean_s": float(t.mean()),
        "iter_time_p90_s": float(t.quantile(0.9)),
        "wait_median_s": float(warm["wait_s"].median()),
        "compute_median_s": float(warm["compute_s"].median()),
        # Workers run in lock-step (each waits for the same aggregates), so the job's rate
        # is every worker's batch per median iteration.
        "samples_per_s": float(exp.workload["batch_size"] * len(summaries) / t.median()),
        "iterations_measured": int(warm["iteration"].nunique()),
        "final_loss": float(last["loss"].mean()),
        "first_loss": float(iters[iters["iteration"] == 0]["loss"].mean()),
        "params_consistent": len({s["checksum"] for s in summaries}) == 1,
        "compute_mode": summaries[0]["compute_mode"],
        "replayed": summaries[0]["compute_mode"] == "replay",
        "speedup": summaries[0].get("speedup", 1.0),
        "num_params": summaries[0]["num_params"],
        "num_tensors": summaries[0]["num_tensors"],
        "peak_rss_bytes": max(s.get("peak_rss_bytes", 0) for s in summaries),
        "final_accuracy": float(last["accuracy"].mean()) if "accuracy" in last else math.nan,
        "eval_accuracy": _mean(s.get("eval_accuracy") for s in summaries),
        "aggregate_max_abs_error": _max(s.get("aggregate_max_abs_error") for s in summaries),
        "replay_max_late_s": _max(s.get("replay_max_late_s") for s in summaries),
    }


def _mean(values) -> float:
    vals = [v for v in values if v is not None]
    return float(sum(vals) / len(vals)) if vals else math.nan


def _max(values) -> float:
    vals = [v for v in values if v is not None]
    return float(max(vals)) if vals else math.nan


def run_one(exp: Experiment, repeat: int, results_root: Path, state: StateDir,
            progress: Callable[[int], None] = lambda n: None, extra: dict[str, Any] | None = None,
            time_dilation: float | None = None) -> dict[str, Any]:
    """Run one experiment once; return (and record in runs.parquet) its row.
    `extra`: more columns for the row (the sweep's grid point, as point.<key>).
    `time_dilation`: the k to run at, chosen for `time_dilation: auto` (emu/sweeps/autodilate.py);
    meta.json and the row record it, config.yaml and the run id keep `auto`."""
    wall = wall_plan(exp, time_dilation)
    run_id = exp.run_id(repeat)
    sweep_dir = results_root / exp.name
    run_dir = sweep_dir / run_id
    # What the registry says about the scheduler goes with the run (row and meta.json), so that
    # analysis of stored results needs no scheduler's code; not in config.yaml, not in the run id.
    declared = {} if exp.scheduler_info is None else {SCHEDULER_METADATA: exp.scheduler_info.model_dump(mode="json")}

    # Under time dilation the testbed runs `wall` (emu/config/dilation.py); every table and metric is
    # converted back to emulated time as it is collected. wall_s, bringup_s and teardown_s
    # stay the harness's own wall-clock seconds.
    row: dict[str, Any] = {"run_id": run_id, "sweep": exp.name, "repeat": repeat, "status": "running",
                           "reason": "", "started_at": dt.datetime.now(dt.UTC).isoformat(),
                           "network": exp.net.describe(), **flatten(exp.resolved()), "time_dilation": wall.k,
                           **{k: json.dumps(v) for k, v in declared.items()}, **(extra or {})}
    t0 = time.monotonic()
    tables: dict[str, pd.DataFrame] = {}
    failure: ResultsError | None = None   # the results directory could not take a write
    try:
        _start_run_dir(exp, repeat, run_dir, wall, declared)
        backend = backend_for(exp.monitor.backend)
        row["monitor_backend"] = backend
        # timeout_s bounds bring-up and Mininet's teardown too, each on its own (the roles' is below)
        with Testbed(wall.net, state, exp.host_cpu, exp.tcp.congestion_control, netlink=backend == "netlink",
                     cpu_groups=exp.slowed_hosts, timeout_s=wall.timeout_s) as tb:
            row["bringup_s"] = tb.bringup_s
            _record_machine_changes(run_dir / "meta.json", state)
            t0_wall = _execute(tb, exp, run_dir, tables, row, progress, wall)
            # wall-clock time of t = 0 in links/qdiscs/cpu tables: the one instant both clocks share
            row["monitor_t0_wall"] = t0_wall
        row["teardown_s"] = getattr(tb, "teardown_s", None)
        iters = _gather(exp, run_dir, wall, t0_wall, tables, row)
        # Judge fidelity over the measured iterations (start-up imports saturate the CPU
        # while no gradient moves).
        warm = iters[measured(iters["iteration"], exp.workload["warmup"], exp.workload["iterations"])]
        row.update(_net_summary(exp, tables, (warm["start"].min() - t0_wall, warm["end"].max() - t0_wall)))
        row["status"] = "ok"
    except RunFailed as e:
        row.update(status="failed", reason=str(e))
    except NetworkError as e:
        row.update(status="failed", reason=f"network: {e}")
    except KeyboardInterrupt as e:
        row.update(status="interrupted", reason=f"interrupted ({str(e) or 'signal SIGINT'})")
        raise
    except Exception as e:  # noqa: BLE001 - recorded, then re-raised for the traceback
        failure = in_results(e, sweep_dir)
        if failure is None:
            row.update(status="failed", reason=f"harness error: {type(e).__name__}: {e}")
            raise
        row.update(status="failed", reason=f"results: {failure}")
    finally:
        row["wall_s"] = time.monotonic() - t0
        if "links" in tables and "fidelity_ok" not in row:
            row.update(_net_summary(exp, tables, None))
        failure = _save(sweep_dir, run_dir, tables, row, failure)
    if failure is not None:
        raise failure
    return row


def _start_run_dir(exp: Experiment, repeat: int, run_dir: Path, wall: WallPlan, declared: dict) -> None:
    """The run's directory made anew (what an interrupted earlier attempt left goes; the sweep's
    claim on the run says no one else is writing it), with config.yaml, meta.json and the plugins."""
    if run_dir.exists():
        shutil.rmtree(run_dir)
    for d in (run_dir / "logs", run_dir / "records", run_dir / "roles"):
        d.mkdir(parents=True)
    write_text(run_dir / "config.yaml", yaml.safe_dump(exp.resolved(), sort_keys=False))
    # Plugins' code is part of the run (and its id): their identities in meta.json, their files copied.
    plugins = {"plugins": [p.model_dump(mode="json") for p in exp.plugins]} if exp.plugins else {}
    chosen = {"time_dilation": wall.k} if exp.auto_dilation else {}   # analysis/capacity.py reads it
    write_text(run_dir / "meta.json", json.dumps({"run_id": exp.run_id(repeat), "repeat": repeat, **environment(),
                                                  **declared, **plugins, **chosen}, indent=2))
    _copy_plugins(exp, run_dir)


def _save(sweep_dir: Path, run_dir: Path, tables: dict[str, pd.DataFrame], row: dict,
          failure: ResultsError | None) -> ResultsError | None:
    """The run's tables and its row, as far as the results directory takes them: after the first
    write it refuses, no more tables (the row matters more), and the row is tried anyway, with that
    write's reason. Returns the results directory's error (with whether the row got in), if any."""
    for name, df in tables.items():
        if failure is not None:
            break
        if len(df):
            try:
                write_parquet(df.assign(run_id=row["run_id"])[["run_id", *df.columns]], run_dir / f"{name}.parquet")
            except ResultsError as e:
                failure = in_results(e, sweep_dir) or e
    if failure is not None or row["status"] != "ok":
        remove_temporaries(run_dir)   # what a write cut short left holds space the row may need
    if failure is not None and f"results: {failure}" not in row["reason"]:
        why = f"results: {failure}"
        row.update(status="failed" if row["status"] != "interrupted" else row["status"],
                   reason=f"{row['reason']}; {why}" if row["reason"] and row["status"] != "ok" else why)
    try:
        record_run(sweep_dir, row, create=False)   # a sweep directory removed meanwhile is not made again
        recorded = True
    except ResultsError as e:
        failure, recorded = failure or in_results(e, sweep_dir) or e, False
    if failure is not None:
        failure.run_id, failure.recorded = row["run_id"], recorded
    return failure


def _gather(exp: Experiment, run_dir: Path, wall: WallPlan, t0_wall: float, tables: dict[str, pd.DataFrame],
            row: dict) -> pd.DataFrame:
    """What the roles wrote, into `tables` and `row` in emulated time; the iterations table."""
    rec_dir = run_dir / "records"
    iters, summaries, long_tables = _collect(rec_dir, len(exp.roles.workers))
    iters = table_to_emulated("iterations", iters, wall.k, t0_wall)
    summaries = [summary_to_emulated(s, wall.k) for s in summaries]
    long_tables = {name: table_to_emulated(name, df, wall.k, t0_wall) for name, df in long_tables.items()}
    tables["iterations"] = iters
    tables.update(long_tables)
    if "faults" in tables:   # what each survived fault cost in iteration time
        tables["faults"]["cost_s"] = fault_costs(tables["faults"], iters, row["roles_t0_wall"],
                                                 exp.workload["warmup"], exp.workload["iterations"])
        row["fault_cost_s"] = float(tables["faults"]["cost_s"].sum(min_count=1))
    row.update(summarize(exp, iters, summaries))
    row.update(tx_summary(tables.get("tx_frames")))
    info = summaries[0].get("scheduler_info") or {}
    if info:
        write_text(run_dir / "scheduler_info.json", json.dumps(info, indent=1))
        plan = info.get("plan") or {}
        row.update(rates_to_emulated({f"plan_{k}": plan.get(k) for k in ("rate_bps", "optimum_bps", "of_optimum",
                                                                          "ring_rate_bps") if k in plan}, wall.k))
        if "plans" in info:   # forest on measured bandwidth: one record per (re-)plan
            row["plan_count"] = len(info["plans"])
    return iters


def _record_machine_changes(meta_path: Path, state: StateDir) -> None:
    """meta.json gets what the run changed on the machine for its duration: key -> [machine's value, run's]."""
    meta = json.loads(meta_path.read_text())
    meta["machine_settings_changed"] = {r["name"]: [r["original"], read_sysctl(r["name"])] for r in state.sysctls()}
    write_text(meta_path, json.dumps(meta, indent=2))


def _execute(tb: Testbed, exp: Experiment, run_dir: Path, tables: dict[str, pd.DataFrame], row: dict,
             progress: Callable[[int], None], wall: WallPlan | None = None) -> float:
    """Inside the network: monitors, shaping and cross traffic on, roles launched, faults
    injected from then on, and the roles awaited, all in wall-clock time (`wall`); the monitor
    tables go into `tables` in emulated time. Returns the wall-clock time that the monitors'
    t = 0 stands for.

    Each helper enters an ExitStack as it starts, so whatever fails, the ones started stop,
    in reverse order, each leaving its table or columns: faults first (nothing stays stopped,
    cut or throttled; then the watchdog's summary and the faults table, on the clock of the
    run's end), cross traffic (the shaper stopped before it, as no rate may change while
    the flows write what they achieved), the shaper, the monitor (its tables, shaping's)."""
    wall = wall or wall_plan(exp)
    log_dir, rec_dir, spec_dir = run_dir / "logs", run_dir / "records", run_dir / "roles"
    net = wall.net
    directions = [(ln.a, ln.b, ln.ab_mbps) for ln in net.links] + [(ln.b, ln.a, ln.ba_mbps) for ln in net.links]
    rates = {(a, b): mbps * 1e6 for a, b, mbps in directions}
    backend = row["monitor_backend"]
    # in emulated time (the row's unit); the monitor samples k times less often in wall time
    qdisc_interval_s = exp.monitor.qdisc_interval_s if backend == "tc" else \
        exp.monitor.netlink_qdisc_interval_s or NETLINK_QDISC_INTERVAL_S
    row["monitor_qdisc_interval_s"] = qdisc_interval_s
    faults = Faults(exp.faults, FaultOps(signal=tb.signal_role, set_link=tb.set_link, set_cpu=tb.set_cpu,
                                         host_of=exp.role_hosts))
    monitor = Monitor(counters={f"{a}->{b}": tb.counter(a, b) for a, b, _ in directions},
                      egress={f"{a}->{b}": tb.egress(a, b) for a, b, _ in directions},
                      rates=rates, interval_s=wall.monitor_interval_s,
                      qdisc_interval_s=qdisc_interval_s * wall.k, backend=backend)
    shaper = Shaper(exp.shaping, exp.timeout_s, tb.set_rate, rates, dilation=wall.k)
    for s in exp.shaping:
        tb.prepare_rate(tuple(s.link))
    watchdog: Watchdog | None = None
    failing: list[int] = []

    def end_faults() -> None:
        faults.stop()
        if watchdog is not None:
            row.update(watchdog.summary(time.monotonic()))
        if exp.faults:
            tables["faults"] = _fault_table(faults, watchdog, row.get("failed_at_s"), failing)

    with contextlib.ExitStack() as helpers:
        try:
            monitor.start()
        except NetlinkError as e:
            raise NetworkError(f"monitor (netlink): {e}") from None
        helpers.callback(_end_monitor, monitor, shaper, tables, wall.k)
        shaper.start()
        helpers.callback(shaper.stop)
        cross = CrossTraffic(wall.flows, wall.timeout_s, tb.ip,
                             lambda host, name, argv: tb.launch(host, name, argv, log_dir, aux=True), log_dir).start()
        helpers.callback(_end_cross, cross, shaper, row, bool(exp.cross_traffic), wall.k)
        helpers.callback(end_faults)   # from the first role's launch on, a fault may be in force
        tcp = HostCounters({h: tb.pid(h) for h in net.hosts})   # every host's TCP counts from here on
        helpers.callback(_end_tcp, tcp, tables, row, wall.k)     # ... to the roles' end, before teardown
        roles = role_specs(exp, {h: tb.ip(h) for h in net.hosts}, rec_dir, wall)
        env = {"PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": str(exp.workload["threads"])}
        for role, host, spec in roles:
            path = spec_dir / f"{role}.json"
            path.write_text(spec.to_json())
            tb.launch(host, role, [sys.executable, "-m", spec.module, str(path)], log_dir, env=env, cwd=REPO)
        faults.start()   # its clock starts with the roles
        t_roles = faults.t0
        row["roles_t0_wall"] = faults.t0_wall   # t = 0 of failed_at_s and of faults.parquet
        watchdog = _watchdog(exp, roles, {h: tb.ip(h) for h in net.hosts}, rec_dir, t_roles, wall.k)
        try:
            _wait_for_roles(tb, roles, exp, log_dir, rec_dir, progress, background=(shaper, cross, faults),
                            wall=wall, watchdog=watchdog, evidence=lambda stall: _evidence(tb, stall, faults),
                            faults=faults)
        except RunFailed:
            now = time.monotonic()
            row["failed_at_s"] = now - t_roles
            failing = faults.in_force_ids(now, recent_s=watchdog.window_now.seconds)
            raise
        return monitor.t0_wall


def _end_monitor(monitor: Monitor, shaper: Shaper, tables: dict[str, pd.DataFrame], k: float) -> None:
    """The monitor's tables and the shaper's log (empty if it never started), in emulated time."""
    measured_tables = dict(zip(("links", "qdiscs", "cpu"), monitor.stop(), strict=True))
    measured_tables["shaping"] = pd.DataFrame(shaper.log, columns=["link", "planned_t", "actual_t", "rate_bps"])
    for name, df in measured_tables.items():   # times relative to t = 0 and rates: no origin needed
        tables[name] = table_to_emulated(name, df, k)


def _end_tcp(tcp: HostCounters, tables: dict[str, pd.DataFrame], row: dict, k: float) -> None:
    """What each host's TCP counted since the roles started (tcp.parquet; counts, the same in
    both clocks) and the row's totals (`tcp_*`, emu/testbed/tcpcounters.py)."""
    tables["tcp"] = table_to_emulated("tcp", tcp.table(), k)
    row.update(tcp_totals(tables["tcp"]))


def _end_cross(cross: CrossTraffic, shaper: Shaper, row: dict, configured: bool, k: float) -> None:
    """The cross traffic interrupted (the shaper stopped first, as it always was) and summarised."""
    shaper.stop()
    cross.stop()
    row["cross_traffic"] = json.dumps(cross_to_emulated(cross.summary(), k)) if configured else ""


def _fault_table(faults: Faults, watchdog: Watchdog | None, failed_at_s: float | None,
                 failing: list[int]) -> pd.DataFrame:
    """faults.parquet: the log, plus per fault the longest time any role went without progress
    around it (`stall_max_s`), and for the faults in force when the run failed, the time from
    the fault to the run's reason (`reason_after_s`). `cost_s` is added once the iterations
    are collected (a run that failed has none: NaN)."""
    t = faults.table()
    now = time.monotonic()
    stall, after = [], []
    for _, f in t.iterrows():
        start, end = f["actual_start_s"], f["actual_end_s"]
        if watchdog is None or math.isnan(start):
            stall.append(math.nan)
        else:
            stop = end if not math.isnan(end) else now - faults.t0
            stall.append(watchdog.longest_gap(faults.t0 + start, faults.t0 + stop, now))
        after.append(failed_at_s - start if failed_at_s is not None and f["fault"] in failing else math.nan)
    return t.assign(stall_max_s=stall, reason_after_s=after, cost_s=math.nan)


def _watchdog(exp: Experiment, roles: list[tuple[str, str, RoleSpec]], ips: dict[str, str], rec_dir: Path,
              now: float, k: float = 1.0) -> Watchdog:
    """The run's watchdog over the roles' progress reports in `rec_dir`, with names for every
    address a role listens on and every host's IP (to say what a role was waiting on)."""
    peers = Peers(host_of={r: h for r, h, _ in roles},
                  listen={f"{s.address.ip}:{s.address.port}": r for r, _, s in roles},
                  ip_host={ip: h for h, ip in ips.items()})
    return Watchdog(exp.watchdog, peers, exp.workload["iterations"], now,
                    read=lambda r: role_progress.read(role_progress.path(rec_dir, r)), time_dilation=k)


def _net_summary(exp: Experiment, tables: dict[str, pd.DataFrame], window: tuple[float, float] | None
                 ) -> dict[str, Any]:
    """The fidelity verdict (over `window` of monitor time, if given), the shaper's timeliness and
    the drops at the servers' ports (over the whole run)."""
    if "links" not in tables:
        return {}

    def cut(df: pd.DataFrame) -> pd.DataFrame:
        return df if window is None or not len(df) else df[(df["t"] >= window[0]) & (df["t"] <= window[1])]

    out = verdict(cut(tables["links"]), cut(tables["qdiscs"]), cut(tables["cpu"]), exp.fidelity).row()
    sh = tables["shaping"]
    out["shaping_changes"] = len(sh)
    # what the switch's ports toward the servers (incast) and every queue dropped over the whole run, like tcp_*
    out["server_port_drops"] = drops_toward(tables["qdiscs"], exp.roles.servers)
    out["queue_drops"] = drops_toward(tables["qdiscs"])
    out["shaping_lag_max_s"] = float((sh["actual_t"] - sh["planned_t"]).max()) if len(sh) else None
    return out


def _collect(rec_dir: Path, num_workers: int) -> tuple[pd.DataFrame, list[dict], dict[str, pd.DataFrame]]:
    """Workers' records -> iterations table, summaries, and the long tables (events, layers)."""
    frames, summaries, events, layers = [], [], [], []
    for rank in range(num_workers):
        path = rec_dir / f"worker{rank}.json"
        if not path.exists():
            raise RunFailed(f"worker{rank} exited 0 but wrote no records ({path.name})")
        rec = json.loads(path.read_text())
        frames.append(pd.DataFrame(rec["iterations"]))
        summaries.append(rec["summary"])
        ev = pd.DataFrame(rec.get("events", []), columns=["event", "key", "chunk", "iteration", "t"])
        events.append(ev.assign(rank=rank))
        layers.append(pd.DataFrame(rec.get("layers", [])))
    # Servers trace too (trace: true); their events carry role "server" and the server's rank.
    for path in sorted(rec_dir.glob("server*.json")):
        if not path.stem[len("server"):].isdigit():
            continue   # server<r>.progress.json: the watchdog's, not a record
        try:
            ev = pd.DataFrame(json.loads(path.read_text()).get("events", []),
                              columns=["event", "key", "chunk", "iteration", "t"])
        except (OSError, ValueError):
            continue
        events.append(ev.assign(rank=int(path.stem[len("server"):]), role="server"))
    ev_all = pd.concat(events, ignore_index=True)
    ev_all["role"] = ev_all["role"].fillna("worker") if "role" in ev_all else "worker"
    long_tables = {"events": ev_all, "layers": pd.concat(layers, ignore_index=True)}
    tx = collect_tx_frames(rec_dir)
    if tx is not None:
        long_tables["tx_frames"] = tx
    return pd.concat(frames, ignore_index=True), summaries, long_tables


def collect_tx_frames(rec_dir: Path) -> pd.DataFrame | None:
    """The roles' `<role><rank>.tx_frames.npz` (traced PS runs, contracts/tx_frames.py) as one
    table: role, rank, then one row per data frame; None when no role wrote one."""
    parts = []
    for path in sorted(Path(rec_dir).glob(f"*{tx_frames.SUFFIX}")):
        name = path.name[:-len(tx_frames.SUFFIX)]
        role = "server" if name.startswith("server") else "worker"
        try:
            rank = int(name[len(role):])
            with np.load(path) as z:
                cols = {k: z[k] for k in tx_frames.COLUMNS}
        except (OSError, ValueError, KeyError):
            continue
        parts.append(pd.DataFrame({"role": role, "rank": rank, **cols}))
    return pd.concat(parts, ignore_index=True) if parts else None


def tx_summary(tx: pd.DataFrame | None) -> dict[str, Any]:
    """The row's priority-inversion figures (contracts/tx_frames.py) over the workers' data frames
    (PUSH: inversion_*, data_frames) and the servers' (RESULT: server_inversion_*, ...)."""
    if tx is None or not len(tx):
        return {}
    out: dict[str, Any] = {}
    for role, prefix in (("worker", ""), ("server", "server_")):
        part = tx[tx["role"] == role]
        if len(part):
            out.update(tx_frames.summary(part["inversion_s"].tolist(), prefix))
    return out
