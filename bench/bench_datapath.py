"""The harness's own data path: CPU seconds per Gbit moved, beside iperf3 on the same links
(figures, not pass/fail). Run as root (Mininet):

    sudo .venv/bin/python -m bench.bench_datapath [--quick] [--mbps 400] [--profile fifo-4]
    sudo ./inv bench --only datapath

Every link of every network here runs at --mbps (both ways). Measured, in this order:
- iperf3 (one TCP flow, a -> b on a star of two hosts, for twice a run's measured time, at least 10 s): its
  sender's and receiver's process;
- through the normal run path (emu/run/runner.py `run_one`), replayed compute sped up until
  the run is communication-bound (the small VGG, 5 MB of gradients, at --speedup): fifo at 1,
  4 and 8 workers (the server's process and the workers'), mercury at 4 (its packet-level
  priority path), ring and gloo at 4 workers.

CPU: each process's utime and stime (/proc/<pid>/stat, all its threads), sampled at 10 Hz
and interpolated at the window's ends. Bytes: both directions of the process's host link,
from the kernel's counters (a run's links.parquet; iperf3's from sysfs at the same instants):
IP frames with their headers and the ACKs going the other way, as iperf3's are counted. The
window: a run's measured iterations (warm-up and start-up excluded), snapped to the monitor's
samples; iperf3's flow after its first second. A worker row is the mean over the run's
workers (CPU and bytes summed; per Gbit = their ratio). `x iperf3`: against iperf3's sender
for workers, against its receiver for servers. A worker's process also holds what is not the
data path: replay's buffer fills (one copy of its gradients per iteration) and its sleeps.

Where the time goes: `perf record` (user and kernel, at --perf-hz) of the server and worker0
of one of those runs (--profile, default fifo-4) for --profile-s seconds inside its
measured iterations, each symbol put into one group: system calls (the kernel below
send/recv/poll: TCP/IP, veth, bridge, htb), threads (futex, scheduling: the GIL's
hand-offs), copies (memcpy, the kernel's user copies, numpy/torch copies), aggregation
(numpy/torch adds and divides), Python (the interpreter: framing, dicts, queues, per-call
overhead of numpy), other (libc allocation and locks, unknown). Python 3.11 has no perf
support for its own frames, so Python is one group, not split by function.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from emu.testbed.procstat import find_roles, parse_stat

REPO = Path(__file__).resolve().parents[1]
NAME = "bench-datapath"
TICK = os.sysconf("SC_CLK_TCK")
IPERF_PORT = 5301

# ---------------------------------------------------------------------------- pure parts


def per_gbit(cpu_s: float, nbytes: float) -> float:
    """CPU seconds per Gbit (1e9 bits) moved; NaN where nothing moved."""
    gbit = nbytes * 8 / 1e9
    return cpu_s / gbit if gbit > 0 else math.nan


def _between(samples: list[tuple], a: float, b: float, col: int) -> float:
    """The growth of column `col` of a process's samples (t, ...) between instants a and b,
    interpolated linearly; ValueError unless they cover [a, b]."""
    if len(samples) < 2 or a < samples[0][0] or b > samples[-1][0] or b < a:
        raise ValueError(f"samples cover [{samples[0][0] if samples else math.nan:.3f}, "
                         f"{samples[-1][0] if samples else math.nan:.3f}], not [{a:.3f}, {b:.3f}]")
    t = np.array([s[0] for s in samples])
    v = np.array([s[col] for s in samples], dtype=float)
    return float(np.interp(b, t, v) - np.interp(a, t, v))


def cpu_between(samples: list[tuple], a: float, b: float) -> tuple[float, float]:
    """(user s, system s) that a process spent between instants a and b, from its samples
    (t, utime ticks, stime ticks, ...), interpolated linearly; ValueError unless they cover [a, b]."""
    return _between(samples, a, b, 1) / TICK, _between(samples, a, b, 2) / TICK


def switches_between(samples: list[tuple], a: float, b: float) -> float:
    """Context switches (voluntary and not, all threads) a process made between a and b, from
    samples (t, utime, stime, switches); NaN where the samples do not count them."""
    if not samples or len(samples[0]) < 4:
        return math.nan
    return _between(samples, a, b, 3)


def parse_switches(status: str) -> int:
    """voluntary_ctxt_switches + nonvoluntary_ctxt_switches of one thread's /proc status text."""
    return sum(int(line.split()[1]) for line in status.splitlines()
               if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")))


def snap(times: np.ndarray, a: float, b: float) -> tuple[float, float]:
    """The widest span of sample instants inside [a, b]: (first >= a, last <= b)."""
    inside = times[(times >= a) & (times <= b)]
    if len(inside) < 2:
        raise ValueError(f"fewer than two samples in [{a:.3f}, {b:.3f}]")
    return float(inside[0]), float(inside[-1])


def link_bytes(links: pd.DataFrame, label: str, a: float, b: float) -> float:
    """Bytes that link direction `label` carried between two of its sample instants a < b (monitor
    time, links.parquet: each row is the rate over the interval since the label's previous row)."""
    rows = links[links["link"] == label].sort_values("t")
    t = rows["t"].to_numpy()
    dt = np.diff(t, prepend=np.nan)
    keep = (t > a + 1e-9) & (t <= b + 1e-9)
    return float(np.nansum(rows["tx_bytes_per_s"].to_numpy()[keep] * dt[keep]))


COPY = re.compile(r"memcpy|memmove|copy_user|copy_to_user|copy_from_user|_copy_to_iter|_copy_from_iter|copyin|"
                  r"copyout|rep_movs|copy_page|contig_to_contig|strided_to_strided|aligned_.*cast|skb_copy|"
                  r"csum_partial_copy|copy_kernel|PyBytes_FromStringAndSize|bytes_concat|_PyBytes_Resize", re.I)
THREADS = re.compile(r"futex|schedule|__switch_to|finish_task_switch|pick_next|enqueue_task|dequeue_task|"
                     r"try_to_wake_up|ttwu|update_curr|update_load|select_task_rq|__calc_delta|psi_|"
                     r"native_sched|idle|context_switch|wake_up_q|sched_", re.I)
NUMERIC_DSO = re.compile(r"_multiarray_umath|numpy|libtorch|libopenblas|libmkl|libgomp|libblas|libc10", re.I)
# not "multiply": PyArray_MultiplyList is numpy's shape arithmetic (FLOAT_multiply is a FLOAT_ loop)
AGGREGATE = re.compile(r"add|sum|reduce|divide|axpy|FLOAT_|DOUBLE_|binary", re.I)
PYTHON_DSO = re.compile(r"python|libpython", re.I)
GROUPS = ("system calls", "threads", "copies", "aggregation", "Python", "other")


def group(dso: str, kind: str, sym: str) -> str:
    """The group of one profiled symbol (perf's dso, '[k]' kernel or '[.]' user, symbol name)."""
    if COPY.search(sym):
        return "copies"
    if kind == "k" or "kernel" in dso:
        return "threads" if THREADS.search(sym) else "system calls"
    if NUMERIC_DSO.search(dso):
        return "aggregation" if AGGREGATE.search(sym) else "Python"
    if PYTHON_DSO.search(dso):
        return "Python"
    return "other"


PERF_LINE = re.compile(r"^\s*([\d.]+)%\s+(\S+)\s+\[(.)\]\s+(.+?)\s*$")


def parse_perf_report(text: str) -> list[tuple[float, str, str, str]]:
    """(percent, dso, kind, symbol) per line of `perf report --stdio -q --sort dso,sym`."""
    out = []
    for line in text.splitlines():
        m = PERF_LINE.match(line)
        if m:
            out.append((float(m.group(1)), m.group(2), m.group(3), m.group(4)))
    return out


def grouped(entries: list[tuple[float, str, str, str]]) -> dict[str, float]:
    """Percent of the samples per group (GROUPS order), over the entries' total."""
    total = sum(e[0] for e in entries) or 1.0
    out = dict.fromkeys(GROUPS, 0.0)
    for pct, dso, kind, sym in entries:
        out[group(dso, kind, sym)] += pct * 100 / total
    return out


@dataclass
class Cost:
    role: str
    what: str
    workers: int
    mbps: float
    nbytes: float      # per process (a worker row: the mean over the run's workers)
    user_s: float
    sys_s: float
    switches: float = math.nan  # context switches of all its threads in the window

    @property
    def switches_per_mb(self) -> float:
        return self.switches / (self.nbytes / 1e6) if self.nbytes > 0 else math.nan

    @property
    def gbit(self) -> float:
        return self.nbytes * 8 / 1e9

    @property
    def cpu_s(self) -> float:
        return self.user_s + self.sys_s

    @property
    def per_gbit(self) -> float:
        return per_gbit(self.cpu_s, self.nbytes)


def mean_cost(role: str, what: str, workers: int, mbps: float, parts: list[tuple[float, ...]]) -> Cost:
    """One row for several processes of one role, from each one's (bytes, user s, sys s[, switches]):
    the means (so that its per Gbit is the ratio of the sums)."""
    n = len(parts)
    return Cost(role, what, workers, mbps, *(sum(p[i] for p in parts) / n for i in range(len(parts[0]))))


def table(costs: list[Cost], sender: Cost | None, receiver: Cost | None) -> str:
    """The markdown table; `x iperf3` against iperf3's receiver for servers, its sender otherwise."""
    lines = ["| role | what | workers | link Mb/s | Gbit moved | CPU s (user, sys) | CPU s per Gbit (user, sys) "
             "| x iperf3 | switches per MB |", "|---|---|---|---|---|---|---|---|---|"]
    for c in costs:
        peer = receiver if c.role in ("server", "iperf3 receiver") else sender
        ratio = c.per_gbit / peer.per_gbit if peer is not None and peer.per_gbit > 0 else math.nan
        ug, sg = per_gbit(c.user_s, c.nbytes), per_gbit(c.sys_s, c.nbytes)
        lines.append(f"| {c.role} | {c.what} | {c.workers or '-'} | {c.mbps:g} | {c.gbit:.2f} "
                     f"| {c.cpu_s:.2f} ({c.user_s:.2f}, {c.sys_s:.2f}) | {c.per_gbit:.3f} ({ug:.3f}, {sg:.3f}) "
                     f"| {ratio:.1f} | {c.switches_per_mb:.0f} |")
    return "\n".join(lines)


def iterations_for(scheduler_family: str, workers: int, grad_bytes: float, mbps: float, seconds: float,
                   warmup: int) -> int:
    """Iterations that keep a run's measured part about `seconds` long, from the bytes its busiest
    link carries per iteration (the server's n x G each way; a ring worker's 2 (n-1)/n x G)."""
    per_it = workers * grad_bytes if scheduler_family == "ps" else 2 * (workers - 1) / workers * grad_bytes
    it_s = per_it * 8 / (mbps * 1e6 * 0.95)
    return warmup + max(3, math.ceil(seconds / it_s))


# ---------------------------------------------------------------------------- sampling


def read_cpu(pid: int) -> tuple[int, int, int] | None:
    """(utime, stime, context switches of all its threads) of a process; None once it is gone."""
    try:
        user, system = parse_stat(Path(f"/proc/{pid}/stat").read_text())   # emu/testbed/procstat.py
        switches = 0
        for task in Path(f"/proc/{pid}/task").iterdir():
            try:
                switches += parse_switches((task / "status").read_text())
            except OSError:
                pass  # a thread that ended between the listing and the read
        return user, system, switches
    except (OSError, IndexError, ValueError):
        return None


class Sampler:
    """Every `every` s: the CPU ticks of each process (given, or found by `marker` until `expect`
    roles are known) and the byte counters of `counters` (label -> (root-ns interface, tx|rx))."""

    def __init__(self, pids: dict[str, int] | None = None, marker: str | None = None, expect: int = 0,
                 counters: dict[str, tuple[str, str]] | None = None, every: float = 0.1):
        self.pids = dict(pids or {})
        self.marker, self.expect, self.every = marker, expect, every
        self.counters = {k: Path(f"/sys/class/net/{i}/statistics/{d}_bytes") for k, (i, d) in (counters or {}).items()}
        self.cpu: dict[str, list[tuple[float, int, int]]] = {}
        self.bytes: list[tuple[float, dict[str, int]]] = []
        self._gone: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="datapath-sampler", daemon=True)

    def start(self) -> Sampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(2)

    def _run(self) -> None:
        while True:
            self.sample()
            if self._stop.wait(self.every):
                self.sample()
                return

    def sample(self) -> None:
        if self.marker and len(self.pids) < self.expect:
            for role, pid in find_roles(self.marker).items():
                self.pids.setdefault(role, pid)
        t = time.time()
        for role, pid in list(self.pids.items()):
            if role in self._gone:
                continue
            got = read_cpu(pid)
            if got is None:
                self._gone.add(role)
                continue
            self.cpu.setdefault(role, []).append((t, *got))
        if self.counters:
            vals = {}
            for label, path in self.counters.items():
                try:
                    vals[label] = int(path.read_text())
                except (OSError, ValueError):
                    vals[label] = 0
            self.bytes.append((t, vals))


# ---------------------------------------------------------------------------- profile


class Profiler:
    """`perf record` of some roles of a run, started once (from the run's progress callback)
    when its measured iterations have begun and the sampler knows their pids."""

    def __init__(self, roles: list[str], seconds: float, hz: int, out_dir: Path):
        self.roles, self.seconds, self.hz, self.out_dir = roles, seconds, hz, out_dir
        self.procs: dict[str, subprocess.Popen] = {}
        self.error = None if shutil.which("perf") else "perf is not installed"

    def maybe_start(self, pids: dict[str, int]) -> None:
        if self.procs or self.error or not all(r in pids for r in self.roles):
            return
        for role in self.roles:
            self.procs[role] = subprocess.Popen(
                ["perf", "record", "-q", "-F", str(self.hz), "-p", str(pids[role]), "-o",
                 str(self.out_dir / f"{role}.perf.data"), "--", "sleep", f"{self.seconds:g}"],
                stdout=subprocess.DEVNULL, stderr=open(self.out_dir / f"{role}.perf.err", "wb"))

    def report(self) -> dict[str, list[tuple[float, str, str, str]]]:
        out = {}
        for role, p in self.procs.items():
            try:
                p.wait(self.seconds + 30)
            except subprocess.TimeoutExpired:
                p.kill()
            r = subprocess.run(["perf", "report", "-i", str(self.out_dir / f"{role}.perf.data"), "--stdio", "-q",
                                "--no-children", "--sort", "dso,sym", "--percent-limit", "0.05"],
                               capture_output=True, text=True, timeout=120)
            entries = parse_perf_report(r.stdout)
            if not entries:
                err = (self.out_dir / f"{role}.perf.err").read_text(errors="replace").strip()
                self.error = f"{role}: no samples ({(err or r.stderr).strip()[:300]})"
            out[role] = entries
        return out


# ---------------------------------------------------------------------------- measured parts


def iperf3_costs(state, logs: Path, mbps: float, seconds: float) -> tuple[Cost, Cost]:
    from emu.config.topospec import StarTopology
    from emu.testbed.network import Testbed

    spec = StarTopology.model_validate({"kind": "star", "hosts": [
        {"name": "a", "bw_mbps": mbps}, {"name": "b", "bw_mbps": mbps}]}).resolve()
    with Testbed(spec, state) as tb:
        counters = {lab: tb.counter(*lab.split("->")) for lab in ("a->s1", "s1->a", "b->s1", "s1->b")}
        srv = tb.launch("b", "iperf3-s", ["iperf3", "-s", "-p", str(IPERF_PORT), "-1"], logs, aux=True)
        time.sleep(0.3)
        cli = tb.launch("a", "iperf3-c", ["iperf3", "-c", tb.ip("b"), "-p", str(IPERF_PORT), "-t", f"{seconds:g}",
                                          "-J"], logs, aux=True)
        t_start = time.time()
        sampler = Sampler(pids={"sender": cli.pid, "receiver": srv.pid}, counters=counters).start()
        cli.wait(seconds + 15)
        srv.wait(5)
        sampler.stop()
    res = json.loads((logs / "iperf3-c.out").read_text())
    if "error" in res:
        raise RuntimeError(f"iperf3: {res['error']}")
    times = np.array([t for t, _ in sampler.bytes])
    # after slow start, and while both processes were still sampled (the client ends its -t early)
    last = min(sampler.cpu[r][-1][0] for r in ("sender", "receiver"))
    a, b = snap(times, t_start + 1.0, min(t_start + seconds - 0.5, last))
    at = {t: v for t, v in sampler.bytes}
    out = []
    for role, host in (("sender", "a"), ("receiver", "b")):
        moved = sum(at[b][lab] - at[a][lab] for lab in (f"{host}->s1", f"s1->{host}"))
        samples = [s for s in sampler.cpu[role]]
        user, sys_ = cpu_between(samples, a, b)
        out.append(Cost(f"iperf3 {role}", "one TCP flow", 0, mbps, moved, user, sys_,
                        switches_between(samples, a, b)))
    return out[0], out[1]


@dataclass
class RunPlan:
    label: str
    scheduler: str
    workers: int
    ps: bool


def experiment(p: RunPlan, mbps: float, model: str, preset: str, speedup: float, iterations: int, warmup: int):
    from emu.config.experiment import Sections, validate_experiment
    from schedulers.registry import infos, params_models
    from workloads.config import WorkloadConfig

    workers = [f"w{i}" for i in range(p.workers)]
    hosts = (["ps"] if p.ps else []) + workers
    raw = {"name": NAME, "seed": 0, "timeout_s": 300,
           "topology": {"kind": "star", "hosts": [{"name": h, "bw_mbps": mbps} for h in hosts]},
           "roles": {"servers": ["ps"] if p.ps else [], "workers": workers},
           "workload": {"model": model, "preset": preset, "compute": "replay", "speedup": speedup,
                        "iterations": iterations, "warmup": warmup},
           "scheduler": p.scheduler}
    return validate_experiment(raw, Sections(workload=WorkloadConfig, schedulers=params_models(), infos=infos()),
                               REPO)


def run_costs(p: RunPlan, exp, root: Path, state, profiler: Profiler | None) -> tuple[list[Cost], dict]:
    """The run through run_one, its roles sampled; (its rows, the run's row)."""
    from contracts.iterations import measured
    from emu.run.runner import run_one

    run_dir = root / exp.name / exp.run_id(0)
    n_roles = p.workers + (1 if p.ps else 0)
    sampler = Sampler(marker=str(run_dir / "roles") + "/", expect=n_roles).start()
    warmup = exp.workload["warmup"]

    def progress(done: int) -> None:
        if profiler is not None and done >= warmup + 1:
            profiler.maybe_start(sampler.pids)

    try:
        row = run_one(exp, 0, root, state, progress=progress)
    finally:
        sampler.stop()
    if row["status"] != "ok":
        return [], row
    iters = pd.read_parquet(run_dir / "iterations.parquet")
    links = pd.read_parquet(run_dir / "links.parquet")
    warm = iters[measured(iters["iteration"], warmup, exp.workload["iterations"])]
    t0 = row["monitor_t0_wall"]
    grid = links.loc[links["link"] == "w0->s1", "t"].to_numpy()
    # inside the samples of every role too: a worker exits within a sample of its last aggregate
    first = max(v[0][0] for v in sampler.cpu.values()) - t0
    last = min(v[-1][0] for v in sampler.cpu.values()) - t0
    a, b = snap(grid, max(warm["start"].min() - t0, first), min(warm["end"].max() - t0, last))
    mbps = exp.net.links[0].ab_mbps

    def part(role: str, host: str) -> tuple[float, float, float, float]:
        moved = link_bytes(links, f"{host}->s1", a, b) + link_bytes(links, f"s1->{host}", a, b)
        samples = sampler.cpu[role]
        return (moved, *cpu_between(samples, a + t0, b + t0), switches_between(samples, a + t0, b + t0))

    out = []
    if p.ps:
        out.append(mean_cost("server", p.scheduler, p.workers, mbps, [part("server0", "ps")]))
    kind = "PS worker" if p.ps else f"{p.scheduler} worker"
    out.append(mean_cost(kind, p.scheduler, p.workers, mbps, [part(f"worker{i}", f"w{i}") for i in range(p.workers)]))
    row["window_s"] = b - a
    return out, row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="shorter runs (about 3 s measured each, iperf3 10 s)")
    ap.add_argument("--mbps", type=float, default=400, help="every link's rate, both ways (default 400)")
    ap.add_argument("--seconds", type=float, help="measured seconds per run (default 10, --quick 3)")
    ap.add_argument("--model", default="vgg:small", help="replayed profile MODEL:PRESET (default vgg:small)")
    ap.add_argument("--speedup", type=float, default=10.0, help="replay's speedup (default 10: compute 1/10)")
    ap.add_argument("--profile", default="fifo-4", help="the run whose server and worker0 are profiled "
                    "(fifo-1, fifo-4, fifo-8, mercury-4; 'none': no profile)")
    ap.add_argument("--profile-s", type=float, help="seconds of profile (default 6, --quick 2)")
    ap.add_argument("--perf-hz", type=int, default=999, help="perf's sampling frequency (default 999)")
    ap.add_argument("--only", action="append", help="run only these runs' labels (repeatable), e.g. fifo-4")
    ap.add_argument("--keep", action="store_true", help="keep the runs' results directory")
    args = ap.parse_args()
    seconds = args.seconds or (3.0 if args.quick else 10.0)
    profile_s = args.profile_s or (2.0 if args.quick else 6.0)
    model, _, preset = args.model.partition(":")
    from emu.testbed.cleanup import StateDir
    from workloads.config import default_profile

    grad_bytes = json.loads(default_profile(model, preset or "small").read_text())["grad_bytes"]
    plans = [RunPlan("fifo-1", "fifo", 1, True), RunPlan("fifo-4", "fifo", 4, True), RunPlan("fifo-8", "fifo", 8, True),
             RunPlan("mercury-4", "mercury", 4, True), RunPlan("ring-4", "ring", 4, False),
             RunPlan("gloo-4", "gloo", 4, False)]
    if args.only:
        plans = [p for p in plans if p.label in args.only]
    root = Path(tempfile.mkdtemp(prefix="bench-datapath-"))
    logs = root / "logs"
    logs.mkdir()
    print(f"\n## Data path cost per byte: every link {args.mbps:g} Mb/s; replayed {model}:{preset or 'small'} "
          f"({grad_bytes / 1e6:.1f} MB of gradients) at speedup {args.speedup:g}, about {seconds:g} s measured per "
          f"run; load average before: {os.getloadavg()[0]:.2f}", flush=True)
    costs: list[Cost] = []
    notes: list[str] = []
    profile: dict = {}
    profiler = None
    t_all = time.monotonic()
    try:
        with StateDir() as state:
            # iperf3 costs little: a longer flow, so that 10 ms CPU ticks stay a small part of it
            sender, receiver = iperf3_costs(state, logs, args.mbps, max(10.0, 2 * seconds) + 1.5)
            print(f"iperf3: sender {sender.per_gbit:.3f}, receiver {receiver.per_gbit:.3f} CPU s per Gbit", flush=True)
            for p in plans:
                warmup = 2
                its = iterations_for("ps" if p.ps else "collective", p.workers, grad_bytes, args.mbps, seconds, warmup)
                exp = experiment(p, args.mbps, model, preset or "small", args.speedup, its, warmup)
                prof = None
                if p.label == args.profile:
                    prof = profiler = Profiler(["server0", "worker0"], profile_s, args.perf_hz, root)
                t0 = time.monotonic()
                try:
                    rows, row = run_costs(p, exp, root, state, prof)
                    if prof is not None:
                        profile = prof.report()
                except (ValueError, KeyError, OSError, subprocess.SubprocessError) as e:
                    # one run's measurement lost (a role not sampled, no window): the others still count
                    notes.append(f"- {p.label}: not measured: {type(e).__name__}: {e}")
                    print(notes[-1], flush=True)
                    continue
                wall = time.monotonic() - t0
                if row["status"] != "ok":
                    notes.append(f"- {p.label}: {row['status']}: {row.get('reason', '')}")
                    print(notes[-1], flush=True)
                    continue
                costs += rows
                idle = row.get("fidelity_cpu_idle_min", math.nan)
                notes.append(f"- {p.label}: {its} iterations ({warmup} warm-up), median "
                             f"{row['iter_time_median_s'] * 1e3:.0f} ms, window {row['window_s']:.1f} s, CPU idle "
                             f"min {idle:.2f}, fidelity {'ok' if row.get('fidelity_ok') else 'failed'}, "
                             f"wall {wall:.0f} s")
                print(notes[-1], flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
        else:
            print(f"results: {root}")
    print()
    print(table([*costs, sender, receiver], sender, receiver))
    print("\nRuns (window: the measured iterations):")
    print("\n".join(notes))
    if profiler is not None:
        print_profile(profiler, profile, costs, args.profile)
    print(f"\nwhole benchmark: {time.monotonic() - t_all:.0f} s", flush=True)
    return 0


def print_profile(profiler: Profiler, profile: dict, costs: list[Cost], label: str) -> None:
    print(f"\n## Where the time goes: perf record of {label}'s server and worker0 ({profiler.seconds:g} s at "
          f"{profiler.hz} Hz, user and kernel)")
    if profiler.error:
        print(f"profile: {profiler.error}")
    if not profile:
        print("no profile: the run was not measured (above)")
        return
    sched, _, n = label.partition("-")
    per = {("server0" if c.role == "server" else "worker0"): c.per_gbit for c in costs
           if c.what == sched and c.workers == int(n or 0)}
    print("| group | " + " | ".join(f"{r} % | {r} CPU s per Gbit" for r in profile) + " |")
    print("|---|" + "---|---|" * len(profile))
    shares = {r: grouped(e) for r, e in profile.items()}
    for g in GROUPS:
        print(f"| {g} | " + " | ".join(f"{shares[r][g]:.1f} | {shares[r][g] / 100 * per.get(r, math.nan):.3f}"
                                       for r in profile) + " |")
    for role, entries in profile.items():
        total = sum(e[0] for e in entries) or 1.0
        print(f"\n{role}: top symbols (% of its samples)")
        for pct, dso, kind, sym in sorted(entries, reverse=True)[:15]:
            print(f"  {pct * 100 / total:5.1f}%  {group(dso, kind, sym):12s}  {sym[:60]}  ({dso})")


if __name__ == "__main__":
    sys.exit(main())
