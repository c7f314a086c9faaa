"""Reading a file a user named, within a byte limit: the one implementation that config,
sweep and trace files (emu/config/yaml_input.py) and replay profiles (workloads/profile_file.py)
share.

Any path can be named, and a careless read of the wrong one hangs or exhausts the harness:
opening a FIFO blocks until a writer comes, /dev/zero never ends, and a file can be swapped
or grow between the size check and the read. So only a regular file is opened, and at most
limit + 1 bytes of it are read. Each reader words a refusal for its own users, so `Refused`
carries what went wrong (`kind`), not a sentence.
"""
from __future__ import annotations

import os
import stat
from pathlib import Path

MISSING = "missing"          # no such file
BAD_PATH = "bad_path"        # not a path the OS accepts (a NUL byte); detail: why
UNREADABLE = "unreadable"    # the OS refused to stat, open or read it; detail: its reason
DIRECTORY = "directory"
NOT_REGULAR = "not_regular"  # a device, FIFO or socket
TOO_LARGE = "too_large"      # size: what stat said; None when it grew while being read


class Refused(ValueError):
    """Why the file was not read: `kind` (one of the constants above), `detail`, `size`."""

    def __init__(self, kind: str, detail: str = "", size: int | None = None):
        super().__init__(f"{kind} ({detail})" if detail else kind)
        self.kind, self.detail, self.size = kind, detail, size


def _reason(e: OSError) -> str:
    return str(e.strerror or e)


def read(path: Path | str, limit: int) -> bytes:
    """The bytes of the regular file `path`; `Refused` if it is anything else or larger than `limit`."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise Refused(MISSING) from None
    except ValueError as e:  # a NUL byte in the path
        raise Refused(BAD_PATH, str(e)) from None
    except OSError as e:
        raise Refused(UNREADABLE, _reason(e)) from None
    if stat.S_ISDIR(st.st_mode):
        raise Refused(DIRECTORY)
    if not stat.S_ISREG(st.st_mode):
        raise Refused(NOT_REGULAR)
    if st.st_size > limit:
        raise Refused(TOO_LARGE, size=st.st_size)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as e:
        raise Refused(UNREADABLE, _reason(e)) from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # replaced since the stat above
            raise Refused(NOT_REGULAR)
        chunks, n = [], 0
        while n <= limit:
            chunk = os.read(fd, min(1 << 16, limit + 1 - n))
            if not chunk:
                break
            chunks.append(chunk)
            n += len(chunk)
    except OSError as e:
        raise Refused(UNREADABLE, _reason(e)) from None
    finally:
        os.close(fd)
    if n > limit:  # it grew after the stat
        raise Refused(TOO_LARGE)
    return b"".join(chunks)
