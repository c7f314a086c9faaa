"""Running a plan's runs as Ray tasks, one emulated network per node at a time.

One machine holds one emulated network at a time, so a sweep spreads over machines: each
run is a Ray task that needs the custom resource `emu` (a node offers {"emu": 1}), runs
`run_one` into a temporary results root of its own node and hands back its row and its run
directory as a tarball. Only the driver writes into the results root: it unpacks each run
and records its row as the run comes back, so the rules of one machine hold (completed runs
are skipped, each run_id is recorded once). A task whose node is lost mid-run is retried by
Ray on another node; the lost attempt wrote only to its own node, so nothing of it is recorded.
Ray is imported here only once a sweep asks for it: it is an optional dependency.
"""
from __future__ import annotations

import contextlib
import datetime as dt
import io
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from tqdm import tqdm

from emu.config.experiment import ConfigError
from emu.config.plan import Plan
from emu.run.claims import Claim, Holder, try_claim
from emu.run.results import ResultsError, check_dir, completed, flatten, in_results, make_dir, read_runs, record_run
from emu.sweeps.sweep import outcome, plan_runs, point_columns, recorded, recorded_since, run_label
from emu.testbed import preflight
from emu.testbed.cleanup import StateDir, alive, start_time

REPO = Path(__file__).resolve().parents[2]
RESOURCE = "emu"  # the custom resource a node offers once: {"emu": 1}
MAX_RETRIES = 3  # attempts after a node or worker is lost (an error inside a run is a failed row, not a retry)
CANCEL_GRACE_S = 60  # after Ctrl-C, how long cancelled runs get to tear their networks down
NO_NODE_S = 120  # runs left and no node offering `emu` this long: the sweep stops
CLAIM_POLL_S = 2.0  # how often a run another sweep holds is looked at again (its claim, then its row)
# What a node does not need of the driver's tree (Ray also leaves out what .gitignore names).
EXCLUDES = [".git", ".venv", "__pycache__", "results", "notebooks", "docs"]
# Node-local results roots, one per Ray worker process (<pid>-<start time>): removed after each
# run, and by the next run on the machine if its worker was killed with its node.
RUNS_TMP = Path(tempfile.gettempdir()) / "schedlab-ray-runs"
HOST_PORT = re.compile(r"^(?:ray://)?(?P<host>\[[0-9a-fA-F:]+\]|[A-Za-z0-9_.\-]+):(?P<port>\d{1,5})$")


class NodeResult(BaseModel):
    """What a node hands back for one run: its row, its run directory, where it ran."""
    row: dict[str, Any]
    tarball: bytes
    node: str
    cleaned: list[str] = []


def refuse_plugins(plan: Plan) -> None:
    """Plugins are not shipped to a cluster's nodes yet (the runtime environment carries the
    repository only), so a sweep with `plugins:` is refused on Ray rather than run with other code."""
    if any(e.plugins for e in plan.experiments):
        raise ConfigError("plugins: not supported with --ray yet (plugin files are not shipped to the cluster's "
                          "nodes); run this sweep without --ray")


def parse_address(text: str) -> str:
    """`local`, `auto` (the cluster this machine is a node of) or HOST:PORT / ray://HOST:PORT of
    a head node; an address must answer now. A ConfigError otherwise, before anything is created."""
    text = (text or "").strip()
    if text in ("local", "auto"):
        return text
    m = HOST_PORT.match(text)
    if not m or not 0 < int(m["port"]) < 65536:
        raise ConfigError(f"--ray {text!r}: expected local, auto, HOST:PORT or ray://HOST:PORT "
                          f"(the head node's address, e.g. 10.0.0.5:6379)")
    host, port = m["host"].strip("[]"), int(m["port"])
    try:
        socket.create_connection((host, port), timeout=3).close()
    except OSError as e:
        why = e.strerror or type(e).__name__
        raise ConfigError(f"--ray {text!r}: nothing answers at {host}:{port} ({why}); start the head node with "
                          f"`ray start --head` (docs/scaling.md: From one machine to N)") from None
    return text


def _git(*args: str) -> str:
    r = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True)
    return r.stdout.strip() if r.returncode == 0 else ""


def runtime_env() -> dict:
    """Every node runs the driver's tree (uploaded, without .git, .venv, results); meta.json
    still names its commit and dirty flag (emu/run/runner.py environment() reads them from here)."""
    dirty = bool(_git("status", "--porcelain", "--untracked-files=no"))
    return {"working_dir": str(REPO), "excludes": EXCLUDES,
            "env_vars": {"SCHEDLAB_GIT_SHA": _git("rev-parse", "HEAD"), "SCHEDLAB_GIT_DIRTY": str(int(dirty))}}


def _quiet_environment(address: str) -> dict[str, str]:
    """Environment for Ray: no usage statistics (nothing leaves the machine), and for `local`
    token authentication with a secret of this sweep's own (Ray would otherwise write one to
    ~/.ray/auth_token and say so)."""
    env = {"RAY_USAGE_STATS_ENABLED": "0",
           # Ray's own default excludes, but it warns about each that exists: EXCLUDES names them instead.
           "RAY_OVERRIDE_RUNTIME_ENV_DEFAULT_EXCLUDES": "venv"}
    if address == "local" and "RAY_AUTH_MODE" not in os.environ:
        env |= {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
    return env


def _remove_dead_local_dirs() -> None:
    """Temporary directories of `--ray local` clusters whose driver was killed (kill -9: no
    cleanup ran); their processes exit on their own once the driver is gone."""
    for d in Path(tempfile.gettempdir()).glob("schedlab-ray-*-*"):
        pid = d.name.split("-")[2]
        if pid.isdigit() and not alive(int(pid), None):
            shutil.rmtree(d, ignore_errors=True)


@contextlib.contextmanager
def connect(address: str) -> Iterator[Any]:
    """ray, initialised: `local` starts a one-node cluster with {"emu": 1} in a temporary
    directory, stopped and removed on exit; otherwise the driver joins the cluster at `address`."""
    env = _quiet_environment(address)
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)  # before Ray is imported: it reads some of them once
    import logging

    import ray

    common = {"runtime_env": runtime_env(), "log_to_driver": False, "logging_level": logging.WARNING}
    tmp = None
    try:
        if address == "local":
            _remove_dead_local_dirs()
            # short: Ray's socket paths must fit 107 bytes
            tmp = tempfile.mkdtemp(prefix=f"schedlab-ray-{os.getpid()}-")
            ray.init(num_cpus=1, resources={RESOURCE: 1}, include_dashboard=False, _temp_dir=tmp,
                     object_store_memory=256 * 2**20, **common)
        else:
            try:
                ray.init(address=address, **common)
            except (ConnectionError, RuntimeError) as e:
                raise ConfigError(f"--ray {address!r}: {str(e).splitlines()[0]}") from None
        yield ray
    finally:
        ray.shutdown()
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _own_tmp() -> Path:
    pid = os.getpid()
    path = RUNS_TMP / f"{pid}-{start_time(pid)}"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _remove_dead_tmps() -> list[str]:
    removed = []
    for d in sorted(RUNS_TMP.iterdir()) if RUNS_TMP.is_dir() else []:
        pid, _, started = d.name.partition("-")
        if pid.isdigit() and not alive(int(pid), int(started) if started.isdigit() else None):
            shutil.rmtree(d, ignore_errors=True)
            removed.append(f"node-local results {d} [worker {pid}]")
    return removed


def pack(run_dir: Path) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.add(run_dir, arcname=".")
    return buf.getvalue()


def unpack(tarball: bytes, run_dir: Path) -> None:
    """A run's directory as the node wrote it, replacing what an earlier attempt left."""
    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(tarball), mode="r") as tar:
        members = tar.getmembers()
        for m in members:  # this Python may predate extractall(filter="data"): the same checks by hand
            parts = Path(m.name).parts
            if Path(m.name).is_absolute() or ".." in parts or not (m.isfile() or m.isdir()):
                raise ValueError(f"run tarball: refusing {m.name!r} (outside the run, or not a file)")
        tar.extractall(run_dir, members=members)


def run_on_node(exp, repeat: int, point: dict) -> NodeResult:
    """The Ray task: one run on this node, into a temporary results root that is removed after."""
    import ray

    from emu.run.runner import run_one, terminate_as_interrupt
    from emu.sweeps.autodilate import run_auto

    node = f"{socket.gethostname()}/{ray.get_runtime_context().get_node_id()[:8]}"
    preflight.check([exp])  # this node's kernel: a ConfigError is the run's reason
    _remove_dead_tmps()
    tmp = _own_tmp()
    run_dir = tmp / exp.name / exp.run_id(repeat)
    try:  # `ray stop` (SIGTERM) and ray.cancel (a simulated SIGINT) end the run with its network torn down
        old = {signal.SIGTERM: signal.signal(signal.SIGTERM, terminate_as_interrupt),
               signal.SIGINT: signal.signal(signal.SIGINT, signal.default_int_handler)}  # Ray starts it ignored
    except ValueError:  # not the main thread
        old = {}
    said = io.StringIO()  # the Testbed's notes: what a killed run left, removed before this one
    try:
        with StateDir() as state, contextlib.redirect_stderr(said):
            try:
                # time_dilation: auto chooses its k on this node (calibrating the node the first time)
                row = (run_auto if exp.auto_dilation else run_one)(exp, repeat, tmp, state,
                                                                   extra={**point_columns(point), "ray_node": node})
            except Exception:  # noqa: BLE001 - run_one recorded the failed row before raising
                runs = read_runs(tmp / exp.name)
                row = runs.iloc[-1].to_dict()
                (run_dir / "logs" / "harness.err").write_text(traceback.format_exc())
        cleaned = [ln.removeprefix("cleaned up ") for ln in said.getvalue().splitlines()
                   if ln.startswith("cleaned up ")]
        return NodeResult(row=row, tarball=pack(run_dir), node=node, cleaned=cleaned)
    finally:
        sys.stderr.write(said.getvalue())  # the node's worker log keeps them too
        for sig, handler in old.items():
            signal.signal(sig, handler)
        shutil.rmtree(tmp, ignore_errors=True)
        _remove_dead_tmps()  # a worker killed while this run waited for the network


def failed_row(exp, repeat: int, point: dict, reason: str) -> dict:
    """The row of a run that never came back from the cluster (its node failed every attempt)."""
    return {"run_id": exp.run_id(repeat), "sweep": exp.name, "repeat": repeat, "status": "failed",
            "reason": reason, "started_at": dt.datetime.now(dt.UTC).isoformat(), "network": exp.net.describe(),
            **flatten(exp.resolved()), **point_columns(point), "ray_node": None}


def _first_line(e: BaseException) -> str:
    lines = [ln for ln in str(e).splitlines() if ln.strip()]
    return lines[-1].strip() if lines else type(e).__name__


def collect(ray, ref, sweep_dir: Path, exp, repeat: int, point: dict) -> tuple[dict, list[str]]:
    """A finished task's run into the results root, its row recorded (the driver is the only
    writer); returns the row and what the node cleaned up first."""
    try:
        res = ray.get(ref)
    except ray.exceptions.TaskCancelledError:
        raise KeyboardInterrupt("cancelled") from None
    except ray.exceptions.RayError as e:
        row = failed_row(exp, repeat, point, f"ray: {type(e).__name__}: {_first_line(e)}")
        record_run(sweep_dir, row, create=False)
        return row, []
    try:
        check_dir(sweep_dir)   # never made again mid-sweep
        unpack(res.tarball, sweep_dir / exp.run_id(repeat))
    except (OSError, ResultsError) as e:   # the results directory cannot take it: the failed row where there is room
        err = in_results(e, sweep_dir)
        if err is None:
            raise
        shutil.rmtree(sweep_dir / exp.run_id(repeat), ignore_errors=True)   # no half-unpacked run
        err.run_id, err.recorded = exp.run_id(repeat), False
        with contextlib.suppress(OSError, ResultsError):
            record_run(sweep_dir, {**res.row, "status": "failed", "reason": f"results: {err}"}, create=False)
            err.recorded = True
        raise err from None
    record_run(sweep_dir, res.row, create=False)
    return res.row, res.cleaned


class Nodes:
    """The nodes offering `emu`, watched while runs are left: a lost node is named, and a
    cluster with none for NO_NODE_S stops the sweep instead of waiting for ever."""

    def __init__(self, ray) -> None:
        self.ray = ray
        self.alive = self._now()
        self.none_since: float | None = None

    def _now(self) -> dict[str, str]:
        return {n["NodeID"]: f"{n['NodeManagerHostname']}/{n['NodeID'][:8]}"
                for n in self.ray.nodes() if n["Alive"] and n["Resources"].get(RESOURCE)}

    def check(self, say) -> None:
        now = self._now()
        for nid in self.alive.keys() - now.keys():
            say(f"ray: node {self.alive[nid]} lost; its run, if any, is retried on another node")
        for nid in now.keys() - self.alive.keys():
            say(f"ray: node {now[nid]} joined")
        self.alive = now
        if now:
            self.none_since = None
        elif self.none_since is None:
            self.none_since = time.monotonic()
        elif time.monotonic() - self.none_since > NO_NODE_S:
            raise RuntimeError(f"no node offers the resource {RESOURCE!r} for {NO_NODE_S} s; runs left unrun")


class Submitter:
    """Submits the runs this driver claims (emu/run/claims.py): a run another sweep into the same
    results directory holds is deferred and tried again while the sweep waits, its row taken as
    that sweep recorded it; a claim is let go once its run's row is in."""

    def __init__(self, ray, todo: list, sweep_dir: Path, labels: dict[int, str], before: dict[str, str]):
        self.task = ray.remote(run_on_node).options(resources={RESOURCE: 1}, num_cpus=1, max_retries=MAX_RETRIES,
                                                    retry_exceptions=False)
        self.todo, self.sweep_dir, self.labels, self.before = todo, sweep_dir, labels, before
        self.pending: dict = {}           # ref -> (label, exp, repeat, point)
        self.deferred: list[tuple] = []   # (label, exp, repeat, point)
        self.held: dict[str, Claim] = {}  # run_id -> this driver's claim
        self.others: list[dict] = []      # rows other sweeps recorded for runs of this plan

    def first(self, done: set[str]) -> None:
        for i, (exp, repeat, point) in enumerate(self.todo, 1):
            label = run_label(i, len(self.todo), exp, repeat, self.labels[id(exp)])
            if exp.run_id(repeat) in done:
                print(f"{label}: already in {self.sweep_dir}/runs.parquet, skipped", file=sys.stderr)
                continue
            if not self.offer(label, exp, repeat, point):
                self.deferred.append((label, exp, repeat, point))

    def offer(self, label: str, exp, repeat: int, point: dict, waited: bool = False) -> bool:
        """Claim and submit the run (or take the row another sweep recorded); False: another sweep holds it."""
        rid = exp.run_id(repeat)
        got = try_claim(self.sweep_dir, rid)
        if isinstance(got, Holder):
            if not waited:
                tqdm.write(f"{label}: claimed by another sweep ({got.describe()}): left to it, its row awaited",
                           file=sys.stderr)
            return False
        other = recorded_since(self.sweep_dir, rid, self.before)
        if other is not None:
            got.release()
            tqdm.write(f"{label}: run by another sweep meanwhile, not again: {outcome(exp, other, self.sweep_dir)}",
                       file=sys.stderr)
            self.others.append(other)
            return True
        if got.left is not None:
            tqdm.write(f"{label}: taking over the claim of {got.left.describe()}, which is no longer running",
                       file=sys.stderr)
        self.held[rid] = got
        self.pending[self.task.remote(exp, repeat, point)] = (label, exp, repeat, point)
        return True

    def retry_deferred(self) -> int:
        """Deferred runs whose claim is free now: submitted or taken as recorded; how many were."""
        left = [d for d in self.deferred if not self.offer(*d, waited=True)]
        n = len(self.deferred) - len(left)
        self.deferred = left
        return n

    def finished(self, run_id: str) -> None:
        claim = self.held.pop(run_id, None)
        if claim is not None:
            claim.release()

    def release_all(self) -> None:
        for claim in self.held.values():
            claim.release()
        self.held.clear()


def _cancel(ray, pending: dict) -> None:
    """Ctrl-C or SIGTERM: every run left is cancelled (a running one tears its network down)."""
    refs = list(pending)
    for ref in refs:
        ray.cancel(ref)
    if refs:
        tqdm.write(f"ray: cancelled {len(refs)} run(s); waiting up to {CANCEL_GRACE_S} s for their networks to go down",
                   file=sys.stderr)
        ray.wait(refs, num_returns=len(refs), timeout=CANCEL_GRACE_S)


def run_plan_on_ray(plan: Plan, results_root: Path, address: str, force: bool = False,
                    shard: tuple[int, int] | None = None) -> list[dict]:
    """run_plan's contract (skip what is done, each run once, a row per run, a claim per run
    executed) over a Ray cluster; `address` as parse_address returns it. Only `local` needs
    root here: elsewhere the driver writes results and the nodes run the networks."""
    from emu.run.runner import terminate_as_interrupt

    refuse_plugins(plan)
    if address == "local":  # a cluster's nodes check their own kernels, run by run (run_on_node)
        preflight.check(plan)
    sweep_dir = results_root / plan.name
    todo = plan_runs(plan, shard)
    rows: list[dict] = []
    with connect(address) as ray:
        if not ray.cluster_resources().get(RESOURCE):
            raise ConfigError(f"--ray {address!r}: no node offers the resource {RESOURCE!r}; start each node with "
                              f"ray start --resources='{{\"{RESOURCE}\": 1}}'")
        make_dir(sweep_dir)
        before = recorded(sweep_dir)
        done = set() if force else completed(sweep_dir)
        nodes = Nodes(ray)
        runs = Submitter(ray, todo, sweep_dir, {id(e): t for e, t in zip(plan.experiments, plan.labels())}, before)
        bar = tqdm(total=0, desc=f"sweep on {len(nodes.alive)} node(s)", unit="run", file=sys.stderr,
                   dynamic_ncols=True, mininterval=0.2 if sys.stderr.isatty() else 5.0)
        old_term = signal.signal(signal.SIGTERM, terminate_as_interrupt)
        try:
            runs.first(done)
            bar.total = len(runs.pending) + len(runs.deferred)
            bar.refresh()
            while runs.pending or runs.deferred:
                if runs.pending:
                    ready, _ = ray.wait(list(runs.pending), num_returns=1, timeout=2.0)
                else:   # only runs another sweep holds: look again in a while
                    ready = []
                    time.sleep(CLAIM_POLL_S)
                before_nodes = len(nodes.alive)
                nodes.check(lambda line: tqdm.write(line, file=sys.stderr))
                if len(nodes.alive) != before_nodes:
                    bar.set_description(f"sweep on {len(nodes.alive)} node(s)")
                for ref in ready:
                    label, exp, repeat, point = runs.pending.pop(ref)
                    try:
                        row, cleaned = collect(ray, ref, sweep_dir, exp, repeat, point)
                    finally:
                        runs.finished(exp.run_id(repeat))
                    for line in cleaned:
                        tqdm.write(f"cleaned up {line} (on {row.get('ray_node')})", file=sys.stderr)
                    rows.append(row)
                    bar.update(1)
                    tqdm.write(f"{label} on {row.get('ray_node') or '?'}: {outcome(exp, row, sweep_dir)}",
                               file=sys.stderr)
                if runs.deferred:
                    runs.retry_deferred()
                rows.extend(runs.others)
                bar.update(len(runs.others))
                runs.others.clear()
            rows.extend(runs.others)
        except BaseException:
            _cancel(ray, runs.pending)
            raise
        finally:
            runs.release_all()
            signal.signal(signal.SIGTERM, old_term)
            bar.close()
    return rows
