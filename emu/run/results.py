"""Tidy results on disk: `runs.parquet` (one row per run) and per-run long tables.

Every write goes to a temporary file in the same directory and is renamed into place,
under an exclusive lock, so a crash or `kill -9` never leaves a half-written file and
two writers never lose each other's rows. A write the results directory cannot take (its
file system full or read-only, the directory removed) removes its temporary file and is a
`ResultsError` naming the path and the cause: the sweep ends in one line, not a traceback.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import io
import json
import os
import re
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pandas as pd

RUNS = "runs.parquet"


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested config -> flat `a.b.c` columns; lists become JSON text (one cell)."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        elif isinstance(v, list):
            out[key] = json.dumps(v, sort_keys=True)
        else:
            out[key] = v
    return out


# What a write into the results directory meets when the directory, not the harness, is at fault.
STORAGE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOENT,
                            errno.ENOTDIR, errno.EIO, errno.ESTALE, errno.EFBIG})
_ERRNO_TEXT = re.compile(r"\[Errno (\d+)\]")


class ResultsError(Exception):
    """The results directory cannot take a write (full, read-only, removed): one line, the path and the cause.
    `run_id`, `recorded`: the run in flight, if any, and whether its failed row found room in runs.parquet."""

    run_id: str | None = None
    recorded: bool = False


def storage_errno(e: BaseException) -> int | None:
    """The errno of an OSError a full, read-only or missing directory causes (pyarrow's and
    pandas's OSErrors carry it in their text only), else None."""
    if not isinstance(e, OSError):
        return None
    code = e.errno
    if code is None:
        m = _ERRNO_TEXT.search(str(e))
        code = int(m[1]) if m else next((c for c in STORAGE_ERRNOS if os.strerror(c) in str(e)), None)
        if code is None and "non-existent directory" in str(e):   # pandas checks the parent itself
            code = errno.ENOENT
    return code if code in STORAGE_ERRNOS else None


def storage_error(e: BaseException, path: Path, hidden: Path | None = None) -> ResultsError | None:
    """`e` as the ResultsError of a write to `path`, where the directory is at fault; else None.
    The error's own file name goes first, unless it is `hidden` (a temporary name for `path`)."""
    code = storage_errno(e)
    if code is None:
        return None
    named = getattr(e, "filename", None)
    where = Path(named) if named and Path(named) != hidden else path
    return ResultsError(f"{where}: {os.strerror(code)} ({errno.errorcode.get(code, code)})")


def in_results(e: BaseException, sweep_dir: Path) -> ResultsError | None:
    """`e` as a ResultsError where the sweep's directory is at fault (an error of a write under it,
    or of a directory that is gone), else None: the harness's own errors stay what they are."""
    if isinstance(e, ResultsError):
        err = e
    else:
        named = getattr(e, "filename", None)
        if storage_errno(e) is None or (named and not Path(os.path.abspath(named)).is_relative_to(
                Path(os.path.abspath(sweep_dir)))):
            return None
        err = storage_error(e, sweep_dir)
    if not sweep_dir.is_dir():
        return ResultsError(f"{sweep_dir}: removed during the sweep ({err})")
    return err


def unwritable(sweep_dir: Path) -> str | None:
    """Why the sweep's directory (or the nearest existing directory it would be made in) cannot be
    written, without writing: its file system mounted read-only, or no write permission; else None."""
    path = Path(os.path.abspath(sweep_dir))
    while not path.is_dir() and path != path.parent:
        path = path.parent
    if os.statvfs(path).f_flag & os.ST_RDONLY:
        return f"{path}: {os.strerror(errno.EROFS)} (EROFS)"
    if not os.access(path, os.W_OK | os.X_OK):
        return f"{path}: {os.strerror(errno.EACCES)} (EACCES)"
    return None


def remove_temporaries(run_dir: Path) -> None:
    """The temporary files of writes a full or vanishing directory cut short (the harness's and the
    roles' `.<name>.tmp*`): they hold space and are never renamed into place."""
    for p in run_dir.rglob(".*.tmp*") if run_dir.is_dir() else []:
        with contextlib.suppress(OSError):
            p.unlink()


def check_dir(sweep_dir: Path) -> None:
    """The sweep's directory is still there (it is never made again mid-sweep): else a ResultsError."""
    if not sweep_dir.is_dir():
        raise ResultsError(f"{sweep_dir}: removed during the sweep")


def make_dir(sweep_dir: Path) -> None:
    """The sweep's directory, made at its start and written to once (a file made and removed):
    a ResultsError naming it where it cannot be (read-only, not a directory, no permission)."""
    if sweep_dir.exists() and not sweep_dir.is_dir():
        raise ResultsError(f"{sweep_dir}: not a directory")
    try:
        sweep_dir.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=sweep_dir, prefix=".write-probe")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        err = storage_error(OSError(e.errno, e.strerror), sweep_dir)   # named by the directory, not the probe
        if err is None:
            raise
        raise err from None


@contextmanager
def _write_error(path: Path, tmp: Path | None = None) -> Iterator[None]:
    """No temporary file outlives a failed write; a storage error becomes a ResultsError."""
    try:
        yield
    except BaseException as e:
        if tmp is not None:
            with contextlib.suppress(OSError):
                tmp.unlink()
        err = storage_error(e, path, hidden=tmp)
        if err is not None:
            raise err from None
        raise


def write_parquet(df: pd.DataFrame, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with _write_error(path, tmp):
        df.to_parquet(tmp, index=False)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)


def write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with _write_error(path, tmp):
        tmp.write_text(text)
        os.replace(tmp, path)


@contextmanager
def locked(sweep_dir: Path, create: bool = True) -> Iterator[None]:
    """The sweep's exclusive lock on runs.parquet. `create`: make the directory if it is not
    there (a sweep's own writes say False: a directory removed mid-sweep is an error, not remade)."""
    with _write_error(sweep_dir / ".lock"):
        if create:
            sweep_dir.mkdir(parents=True, exist_ok=True)
        lock = open(sweep_dir / ".lock", "w")
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def read_runs(sweep_dir: Path) -> pd.DataFrame:
    """runs.parquet as it is now, read whole first: pyarrow given a path takes the file's size
    and then opens it again, so a rewrite (os.replace) in between reads a torn footer."""
    path = sweep_dir / RUNS
    return pd.read_parquet(io.BytesIO(path.read_bytes())) if path.exists() else pd.DataFrame()


def record_run(sweep_dir: Path, row: dict[str, Any], create: bool = True) -> None:
    """Insert or replace (by run_id) one run's row (`create`: as `locked`)."""
    with locked(sweep_dir, create):
        runs = read_runs(sweep_dir)
        if len(runs):
            runs = runs[runs["run_id"] != row["run_id"]]
        new = pd.DataFrame([row])
        runs = new if runs.empty else pd.concat([runs, new], ignore_index=True)
        write_parquet(runs, sweep_dir / RUNS)


def update_runs(sweep_dir: Path, fn) -> None:
    """Rewrite runs.parquet as fn(runs), atomically and under the lock (e.g. to add bounds)."""
    if not (sweep_dir / RUNS).exists():
        return
    with locked(sweep_dir, create=False):
        runs = read_runs(sweep_dir)
        if not runs.empty:
            write_parquet(fn(runs), sweep_dir / RUNS)


def completed(sweep_dir: Path) -> set[str]:
    runs = read_runs(sweep_dir)
    if runs.empty:
        return set()
    return set(runs.loc[runs["status"] == "ok", "run_id"])


def merge(sources: list[Path], into: Path) -> int:
    """Concatenate sweeps' results (e.g. the shards of one sweep) into `into`; returns the
    number of runs. Run directories are copied; a run_id present twice keeps its ok row."""
    import shutil

    frames = []
    for src in sources:
        runs = read_runs(src)
        if runs.empty:
            raise FileNotFoundError(f"{src / RUNS}: no such file")
        frames.append(runs)
        if src.resolve() != into.resolve():
            for rid in runs["run_id"]:
                if (src / rid).is_dir():
                    shutil.copytree(src / rid, into / rid, dirs_exist_ok=True)
    with locked(into):
        frames.insert(0, read_runs(into))
        allruns = pd.concat([f for f in frames if not f.empty], ignore_index=True)
        allruns = (allruns.assign(_ok=allruns["status"] == "ok").sort_values("_ok", kind="stable")
                   .drop_duplicates("run_id", keep="last").drop(columns="_ok"))
        write_parquet(allruns.reset_index(drop=True), into / RUNS)
    return len(allruns)
