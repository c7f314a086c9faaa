"""One run, one executor: a claim per run in the results directory.

Two sweeps into one results directory (a second terminal, a cron job) would each execute every
run, and a 1.5-hour sweep would cost 3. So a sweep claims a run before executing it: an exclusive
`flock` on `<sweep>/.claims/<run_id>`, held by the open file for as long as the run executes.
The kernel drops a flock with the last descriptor of its holder, so a dead process (kill -9, a
lost machine's driver) holds no claim and the next sweep takes it over; the file says who held it
(pid, the process's start time, host), for the lines that name the other sweep. A claim let go
normally removes its file: a file found with a holder in it is what a killed sweep left.
"""
from __future__ import annotations

import datetime as dt
import fcntl
import json
import os
import socket
from pathlib import Path

from pydantic import BaseModel, ValidationError

from emu.run.results import storage_error
from emu.testbed.cleanup import start_time

CLAIMS = ".claims"


class Holder(BaseModel):
    """Who holds (or held) a claim."""

    pid: int
    started: int | None = None   # the process's start time in clock ticks (/proc/<pid>/stat), None if unknown
    host: str = ""
    since: str = ""

    def describe(self) -> str:
        if self.pid < 0:
            return "a process that has not written its pid yet"
        here = "" if self.host in ("", socket.gethostname()) else f" on {self.host}"
        return f"pid {self.pid}{here}" + (f", since {self.since[11:19]} UTC" if self.since else "")


def _me() -> Holder:
    pid = os.getpid()
    return Holder(pid=pid, started=start_time(pid), host=socket.gethostname(),
                  since=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"))


def _read_holder(fd: int) -> Holder | None:
    try:
        text = os.pread(fd, 4096, 0)
        return Holder.model_validate_json(text) if text.strip() else None
    except (OSError, ValidationError, ValueError):
        return None


class Claim:
    """A claim held by this process; `left`: the holder a killed sweep left in its file (taken over)."""

    def __init__(self, path: Path, fd: int, left: Holder | None):
        self.path, self.fd, self.left = path, fd, left

    def release(self) -> None:
        """Let go: the file goes first (a sweep waiting on it sees it was replaced and tries again)."""
        if self.fd < 0:
            return
        try:
            self.path.unlink()
        except OSError:
            pass   # a directory removed or made read-only: the lock still goes with the descriptor
        os.close(self.fd)
        self.fd = -1

    def __enter__(self) -> Claim:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def claim_path(sweep_dir: Path, run_id: str) -> Path:
    return sweep_dir / CLAIMS / run_id


def try_claim(sweep_dir: Path, run_id: str, wait: bool = False) -> Claim | Holder:
    """This process's claim on the run, or (without `wait`) the live holder of it (pid -1 where its
    file does not say yet). A ResultsError where the directory cannot hold a claim file."""
    path = claim_path(sweep_dir, run_id)
    while True:
        try:
            path.parent.mkdir(exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as e:
            err = storage_error(e, path)
            if err is None:
                raise
            raise err from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            holder = _read_holder(fd) or Holder(pid=-1)
            os.close(fd)
            return holder
        except BaseException:
            os.close(fd)
            raise
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except OSError:
            same = False
        if not same:   # its holder let go and removed it while we waited: claim the new file
            os.close(fd)
            continue
        left = _read_holder(fd)
        try:
            data = json.dumps(_me().model_dump()).encode()
            os.ftruncate(fd, 0)
            os.pwrite(fd, data, 0)
        except OSError as e:
            try:
                path.unlink()
            except OSError:
                pass
            os.close(fd)
            err = storage_error(e, path)
            if err is None:
                raise
            raise err from None
        return Claim(path, fd, left)
