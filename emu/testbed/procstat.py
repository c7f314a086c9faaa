"""What /proc says of processes: a process's CPU ticks and the role processes of a run.

The monitor (the orchestrator's own CPU), the calibration of `time_dilation: auto` and the
data path benchmark all read the same fields; one reading, so that they count alike.
"""
from __future__ import annotations

import contextlib
import os
from pathlib import Path


def parse_stat(text: str) -> tuple[int, int]:
    """(utime, stime) in clock ticks from the text of /proc/<pid>/stat. The command name (field 2)
    is in parentheses and may hold spaces and parentheses itself: fields count from the last ')'."""
    rest = text.rsplit(")", 1)[1].split()
    # rest[0] is field 3 (state); utime and stime are fields 14 and 15
    return int(rest[11]), int(rest[12])


def process_ticks(pid: int | str) -> tuple[int, int] | None:
    """(utime, stime) of a process (all its threads) in clock ticks; None once it is gone."""
    try:
        return parse_stat(Path(f"/proc/{pid}/stat").read_text())
    except (OSError, IndexError, ValueError):
        return None


def find_roles(marker: str) -> dict[str, int]:
    """Role name -> pid of every Python process whose last argument is a spec file under `marker`
    (a run's roles/ directory): `python -m workloads.worker .../roles/worker0.json`."""
    out = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        with contextlib.suppress(OSError):
            args = [a.decode(errors="replace") for a in Path(f"/proc/{d}/cmdline").read_bytes().split(b"\0") if a]
            if args and Path(args[0]).name.startswith("python") and args[-1].startswith(marker):
                out[Path(args[-1]).stem] = int(d)
    return out
