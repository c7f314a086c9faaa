"""What a role's traffic costs this machine in CPU, per scheduler: the calibration behind
`time_dilation: auto` (emu/config/autodilation.py has the model and the choice).

Measured once per scheduler, the first time an `auto` run of it starts here, through the normal
run path (emu/run/runner.py `run_one`): stars of workers (and a parameter server for the
parameter-server family), CAL_RUNS: 4 workers fast and slow (and 16 slow for a collective), the
small VGG replayed at speedup
CAL_SPEEDUP (communication-bound), about CAL_SECONDS of measured iterations. Every SAMPLE_S over
the run: each role process's CPU (utime + stime of /proc/<pid>/stat, all its threads), the
orchestrator's (its monitors), every process's, and the machine's busy time (/proc/stat); over
the measured iterations these give each role's CPU, the orchestrator's, and the kernel's work
charged to no process (softirq of veth, bridges and htb: the machine's busy time less every
process's, so other users' processes are not counted), and the busiest second over the mean.
Bytes: each role's host link, from the run's links table. Before the run, the machine's own load
for BASE_S (the least of its half seconds). `derive` (emu/config/autodilation.py) turns them
into the costs.

The result is cached in one JSON file per machine description (CPU model, CPUs, memory, kernel)
and digest of the data path's sources (schedulers/ and workloads/*.py), so another machine, a
new kernel or a change of the data path calibrates again; inside it one entry per scheduler
(a plugin's by its name and code hash). The directory: $SCHEDLAB_CACHE_DIR, else
$XDG_CACHE_HOME/schedlab, else ~/.cache/schedlab. Deleting the file calibrates again.
"""
from __future__ import annotations

import datetime as dt
import fcntl
import hashlib
import json
import math
import os
import platform
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from contracts.iterations import measured
from emu.config.autodilation import RoleSample, SchedulerCost, combine, derive, link_directions, role_rates
from emu.config.experiment import Experiment
from emu.run.runner import REPO, machine, run_one
from emu.testbed.cleanup import StateDir
from emu.testbed.procstat import find_roles, process_ticks

CACHE_ENV = "SCHEDLAB_CACHE_DIR"
FORMAT = 4   # of the cache file: a new format is a new file
CAL_NAME = "calibrate"
# The calibration runs per family: (workers, every link's Mb/s). A role costs more per Gbit at
# lower rates (fewer bytes per wakeup), and a dilated run's links are slower: 4 workers fast, then
# slow. A collective's messages shrink as its workers grow (a ring's chunks are G / n), so it costs
# more per Gbit with more workers: 16 workers slow too. A parameter server's messages are its
# tensors, whatever the number of workers. Its workers share its link (flows of 75 and 15 Mb/s);
# a collective worker's flows take their link.
CAL_RUNS = {"ps": ((4, 300.0), (4, 60.0)), "collective": ((4, 75.0), (4, 15.0), (16, 15.0))}
CAL_SPEEDUP = 10.0      # the small VGG's 48 ms of compute in 4.8 ms: the run is communication-bound
CAL_SECONDS = 4.0       # measured iterations, at the bound (at least MIN_MEASURED iterations)
MIN_MEASURED = 2
CAL_WARMUP = 2
CAL_TIMEOUT_S = 180
CAL_PROFILE = ("vgg", "small")
BASE_S = 2.0            # the machine's own load, measured before the run
CAL_EST_S = {"ps": 40, "collective": 70}   # one scheduler's calibration on the reference machine (2 cores), s
BUSY_IDLE = 0.35        # a calibration run whose CPU idle fell below this says the machine was busy
TICK = os.sysconf("SC_CLK_TCK")

Say = Callable[[str], None]


class CalibrationError(RuntimeError):
    """The calibration run failed or measured nothing; the message says why."""


def _stderr(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------- the cache

def cache_dir() -> Path:
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "schedlab"


DATAPATH = ("schedulers/**/*.py", "workloads/*.py")


def datapath_digest(repo: Path = REPO) -> str:
    """sha256 of the data path's sources (path and content of each, in order)."""
    h = hashlib.sha256()
    for pattern in DATAPATH:
        for path in sorted(repo.glob(pattern)):
            if "__pycache__" in path.parts:
                continue
            h.update(str(path.relative_to(repo)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def describe_machine(repo: Path = REPO) -> dict:
    """What the calibration holds for: this machine, this kernel, this data path."""
    return {"format": FORMAT, **machine(), "cpus": os.cpu_count(), "kernel": platform.release(),
            "datapath_sha256": datapath_digest(repo)}


def cache_path(description: dict, directory: Path | None = None) -> Path:
    key = hashlib.sha256(json.dumps(description, sort_keys=True).encode()).hexdigest()[:16]
    return (directory or cache_dir()) / f"calibration-{key}.json"


def scheduler_key(exp: Experiment) -> str:
    """A scheduler's entry: its name, and for a plugin's its code hash."""
    own = [p.sha256[:12] for p in exp.plugins]
    return exp.scheduler + (f"@{'+'.join(own)}" if own else "")


def load(path: Path) -> dict[str, SchedulerCost]:
    """The cached entries of one file (none where it is missing or unreadable)."""
    try:
        data = json.loads(path.read_text())
        return {k: SchedulerCost.from_json(v) for k, v in data.get("schedulers", {}).items()}
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def store(path: Path, description: dict, key: str, cost: SchedulerCost) -> None:
    """Add (or replace) one scheduler's entry, under a lock, by an atomic rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            data = {}
        data = {"machine": description, "schedulers": {**data.get("schedulers", {}), key: cost.to_json()}}
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
        os.replace(tmp, path)


def cached(exp: Experiment, directory: Path | None = None) -> tuple[SchedulerCost | None, Path]:
    """This machine's calibration of the experiment's scheduler, if there is one, and its file."""
    path = cache_path(describe_machine(), directory)
    return load(path).get(scheduler_key(exp)), path


def cost_for(exp: Experiment, state: StateDir, say: Say = _stderr) -> SchedulerCost:
    """The cached calibration of the experiment's scheduler, measured first where there is none."""
    description = describe_machine()
    path = cache_path(description)
    key = scheduler_key(exp)
    found = load(path).get(key)
    if found is not None:
        return found
    runs = ", ".join(f"{n} workers at {mbps:g} Mb/s" for n, mbps in CAL_RUNS[family(exp)])
    say(f"time_dilation auto: calibrating {exp.scheduler} on this machine, once (about {CAL_EST_S[family(exp)]} s: "
        f"{runs}{', and a server' if exp.roles.servers else ''}; each role's "
        f"CPU per Gbit); cached in {path}")
    cost = calibrate(exp, state, say)
    store(path, description, key, cost)
    say(f"time_dilation auto: {summary(cost)}")
    idle = min((r.get("fidelity_cpu_idle_min", 1.0) for r in cost.info.get("runs", [])), default=1.0)
    if idle < BUSY_IDLE:
        say(f"time_dilation auto: warning: the CPU idle fell to {idle:.2f} during the calibration run (other work "
            f"on this machine?), so its costs may be high and k larger than needed; delete {path} to calibrate again")
    return cost


def summary(c: SchedulerCost) -> str:
    """One line: each role kind's CPU s per Gbit of its bound (busiest second) at each rate it was measured at."""
    roles = "; ".join(f"{kind} " + ", ".join(f"{cost:.3f} at {gbps * 1e3:.0f} Mb/s" for gbps, cost in pts)
                      for kind, pts in c.cost.items())
    more = "; ".join(f"{kind} x {f:.2f} at {n:g} workers" for kind, pts in c.workers.items() for n, f in pts[1:])
    return (f"{c.scheduler}: CPU s per Gbit of the bound (busiest second, by a role's rate in + out): {roles}"
            f"{'; ' + more if more else ''}; orchestrator {c.harness * 1e3:.2f} ms/s per link direction "
            f"({c.cpus} CPUs)")


# ---------------------------------------------------------------------------- the calibration run

def grad_bytes(repo: Path = REPO) -> float:
    model, preset = CAL_PROFILE
    return float(json.loads((repo / "profiles" / f"{model}-{preset}.json").read_text())["grad_bytes"])


def family(exp: Experiment) -> str:
    return "ps" if exp.roles.servers else "collective"


def calibration_experiment(exp: Experiment, n: int | None = None, mbps: float | None = None) -> Experiment:
    """A calibration run of `exp`'s scheduler (and plugins): a star of `n` workers (and a server),
    every link at `mbps` (default: the family's first of CAL_RUNS), the small VGG replayed; its
    iterations from the bound, for about CAL_SECONDS measured."""
    n, mbps = (n, mbps) if n and mbps else CAL_RUNS[family(exp)][0]
    ps = bool(exp.roles.servers)
    workers = [f"w{i}" for i in range(n)]
    hosts = (["ps"] if ps else []) + workers
    per_iteration = n * grad_bytes() if ps else 2 * (n - 1) / n * grad_bytes()
    iterations = CAL_WARMUP + max(MIN_MEASURED, math.ceil(CAL_SECONDS / (per_iteration * 8 / (mbps * 1e6))))
    model, preset = CAL_PROFILE
    raw = {"name": CAL_NAME, "seed": 0, "timeout_s": CAL_TIMEOUT_S,
           "topology": {"kind": "star", "hosts": [{"name": h, "bw_mbps": mbps} for h in hosts]},
           "roles": {"servers": ["ps"] if ps else [], "workers": workers},
           "workload": {"model": model, "preset": preset, "data": "synthetic", "compute": "replay", "profile": None,
                        "speedup": CAL_SPEEDUP, "batch_size": 32, "iterations": iterations, "warmup": CAL_WARMUP,
                        "threads": 1, "lr": 0.01, "momentum": 0.9, "weight_decay": 1e-4},
           "scheduler": exp.scheduler,
           "plugins": [{**p.model_dump(mode="json"), "path": p.path, "module": p.module} for p in exp.plugins]}
    return Experiment.model_validate(raw, context={"base_dir": str(REPO), "traces": {}})


def _stat_jiffies() -> tuple[float, float, float]:
    """(busy, total, irq + softirq) clock ticks of the whole machine, all CPUs, from /proc/stat
    (iowait counts as idle)."""
    v = [float(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return sum(v[:8]) - v[3] - v[4], sum(v[:8]), v[5] + v[6]


def machine_load(seconds: float, every: float = 0.5) -> float:
    """The machine's own load in busy CPUs over the next `seconds`: the least of its `every`
    intervals (what stays when nothing else runs for a moment)."""
    cpus = os.cpu_count() or 1
    loads = []
    busy0, total0, _ = _stat_jiffies()
    for _ in range(max(1, round(seconds / every))):
        time.sleep(every)
        busy1, total1, _ = _stat_jiffies()
        loads.append((busy1 - busy0) / max(total1 - total0, 1e-9) * cpus)
        busy0, total0 = busy1, total1
    return max(min(loads), 0.0)


def network_free(state: StateDir) -> None:
    """Return once no run holds the machine's network (emu/testbed/network.py's lock): the
    machine's own load is measured without another run's network, which is gone by the time
    this run's is up. Waits as the Testbed would; holds nothing."""
    with open(state.path.parent / "network.lock", "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        fcntl.flock(f, fcntl.LOCK_UN)


def own_load(state: StateDir | None) -> float:
    """The machine's own load in busy CPUs now, with no run's network up (where `state` is given)."""
    if state is not None:
        network_free(state)
    return machine_load(BASE_S)


def calibrate(exp: Experiment, state: StateDir, say: Say = _stderr) -> SchedulerCost:
    """The calibration runs of `exp`'s scheduler (CAL_RUNS); its costs."""
    runs = []
    for n, mbps in CAL_RUNS[family(exp)]:
        runs.append((n, calibration_run(calibration_experiment(exp, n, mbps), state)))
        say(f"time_dilation auto: {exp.scheduler}, {n} workers at {mbps:g} Mb/s: " + ", ".join(
            f"{kind} {pts[0][1]:.3f} CPU s per Gbit at {pts[0][0] * 1e3:.0f} Mb/s in + out"
            for kind, pts in runs[-1][1].cost.items()))
    return combine(runs)


def calibration_run(cal: Experiment, state: StateDir) -> SchedulerCost:
    """One calibration run and its costs. Its directory is removed unless it failed (then the
    error names it)."""
    root = Path(tempfile.mkdtemp(prefix="schedlab-calibrate-"))
    run_dir = root / cal.name / cal.run_id(0)
    before = machine_load(BASE_S)
    sampler = Sampler(str(run_dir / "roles") + "/", len(cal.roles.servers) + len(cal.roles.workers)).start()
    try:
        row = run_one(cal, 0, root, state)
    finally:
        sampler.stop()
    if row["status"] != "ok":
        raise CalibrationError(f"calibrating {cal.scheduler} failed: {row['reason']} (logs: {run_dir / 'logs'})")
    base = min(before, machine_load(BASE_S))   # the run may have waited for another's network: for the record
    try:
        cost = measure(cal, row, run_dir, sampler.samples, base)
    except (OSError, ValueError, KeyError) as e:
        raise CalibrationError(f"calibrating {cal.scheduler}: nothing measured ({e}; run: {run_dir})") from None
    shutil.rmtree(root, ignore_errors=True)
    return cost


@dataclass(frozen=True)
class Sample:
    """One instant of the sampler: CPU clock ticks of each role, of the orchestrator and of every
    process (pid -> ticks), and the machine's busy ticks and those in interrupts (/proc/stat)."""
    t: float
    roles: dict[str, int]
    harness: int
    procs: dict[int, int]
    busy: float
    irq: float


def intervals(samples: list[Sample], roles: list[str]) -> pd.DataFrame:
    """Per interval between successive samples (`t`: its end): the roles' CPU ticks, the
    orchestrator's, and the kernel's work charged to no process: the machine's busy ticks less
    every process's (those seen at both ends grow, a new one counts whole), at most its ticks in
    interrupts and softirq (a process that ended inside the interval took its ticks along)."""
    rows = []
    for prev, cur in zip(samples, samples[1:]):
        if not all(r in prev.roles and r in cur.roles for r in roles):
            continue
        procs = sum(v - prev.procs.get(pid, 0) for pid, v in cur.procs.items())
        uncharged = min(max((cur.busy - prev.busy) - procs, 0.0), cur.irq - prev.irq)
        rows.append({"t0": prev.t, "t": cur.t, "roles": {r: cur.roles[r] - prev.roles[r] for r in roles},
                     "harness": cur.harness - prev.harness, "uncharged": uncharged})
    return pd.DataFrame(rows, columns=["t0", "t", "roles", "harness", "uncharged"])


def measure(cal: Experiment, row: dict, run_dir: Path, samples: list[Sample], base: float | None = None
            ) -> SchedulerCost:
    """The costs of a finished calibration run from its tables and the sampler's samples, over
    the samples inside its measured iterations."""
    iters = pd.read_parquet(run_dir / "iterations.parquet")
    warm = iters[measured(iters["iteration"], cal.workload["warmup"], cal.workload["iterations"])]
    roles = cal.role_hosts
    iv = intervals(samples, list(roles))
    iv = iv[(iv["t0"] >= warm["start"].min()) & (iv["t"] <= warm["end"].max())]
    if len(iv) < 2 or not (iv["t0"].iloc[1:].to_numpy() == iv["t"].iloc[:-1].to_numpy()).all():
        raise ValueError(f"{len(iv)} whole sampler intervals with every role inside the measured iterations")
    a, b = float(iv["t0"].iloc[0]), float(iv["t"].iloc[-1])
    mine = (iv["roles"].map(lambda d: sum(d.values())) + iv["harness"] + iv["uncharged"]).to_numpy()
    per_second = np.convolve(mine, np.ones(SECOND_INTERVALS), "valid") if len(mine) >= SECOND_INTERVALS else mine
    dt_ = (iv["t"] - iv["t0"]).to_numpy()
    span = np.convolve(dt_, np.ones(SECOND_INTERVALS), "valid") if len(dt_) >= SECOND_INTERVALS else dt_
    peak_over_mean = float((per_second / span).max() / (mine.sum() / (b - a))) if mine.sum() > 0 else 1.0
    links = pd.read_parquet(run_dir / "links.parquet")
    t0 = row["monitor_t0_wall"]
    rates = {r.role: r.gbps for r in role_rates(cal.net, list(cal.roles.servers), list(cal.roles.workers))}
    role_samples = [RoleSample("server" if role.startswith("server") else "worker",
                               float(sum(d[role] for d in iv["roles"])) / TICK,
                               _link_bytes(links, f"{host}->s1", a - t0, b - t0) +
                               _link_bytes(links, f"s1->{host}", a - t0, b - t0), rates[role])
                    for role, host in roles.items()]
    cpus = os.cpu_count() or 1
    cost = derive(cal.scheduler, window_s=b - a, roles=role_samples,
                  harness_s=float(iv["harness"].sum()) / TICK, uncharged_s=float(iv["uncharged"].sum()) / TICK,
                  peak_over_mean=peak_over_mean, directions=link_directions(cal.net), cpus=cpus)
    info = {**cost.info, "machine_load_cpus": None if base is None else round(base, 3),
            "mbps": cal.net.links[0].ab_mbps,
            "iteration_ms": round(row["iter_time_median_s"] * 1e3, 1),
            "fidelity_cpu_idle_min": round(float(row["fidelity_cpu_idle_min"]), 3),
            "measured_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds")}
    return SchedulerCost(cost.scheduler, cost.cost, cost.harness, cost.cpus, info)


def _link_bytes(links: pd.DataFrame, label: str, a: float, b: float) -> float:
    """Bytes a link direction carried over (a, b] of monitor time (each row: the rate since its previous one)."""
    rows = links[links["link"] == label].sort_values("t")
    t = rows["t"].to_numpy()
    dt_ = np.diff(t, prepend=np.nan)
    keep = (t > a + 1e-9) & (t <= b + 1e-9)
    return float(np.nansum(rows["tx_bytes_per_s"].to_numpy()[keep] * dt_[keep]))


def _ticks(pid: int | str) -> int | None:
    """utime + stime of a process (all its threads), in clock ticks; None once it is gone."""
    got = process_ticks(pid)
    return None if got is None else sum(got)


SAMPLE_S = 0.5                              # reading every process's stat costs about 1% of a core at 2 Hz
SECOND_INTERVALS = round(1 / SAMPLE_S)      # the CPU check's window: 1 s


class Sampler:
    """Every SAMPLE_S: the CPU ticks of each role process of one run (found by its roles/
    directory), of the orchestrator, of every process, and the machine's busy ticks."""

    def __init__(self, marker: str, expect: int, every: float = SAMPLE_S):
        self.marker, self.expect, self.every = marker, expect, every
        self.pids: dict[str, int] = {}
        self.samples: list[Sample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="calibrate-sampler", daemon=True)

    def start(self) -> Sampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        while not self._stop.wait(self.every - time.time() % self.every):
            if len(self.pids) < self.expect:
                for role, pid in find_roles(self.marker).items():
                    self.pids.setdefault(role, pid)
            now = time.time()
            procs = {int(d): v for d in os.listdir("/proc") if d.isdigit() and (v := _ticks(d)) is not None}
            busy, _, irq = _stat_jiffies()
            roles = {r: procs[p] for r, p in self.pids.items() if p in procs}
            self.samples.append(Sample(now, roles, procs.get(os.getpid(), 0), procs, busy, irq))
