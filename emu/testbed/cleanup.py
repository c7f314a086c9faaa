"""What a run started, written down as it starts it, so anything can be torn down later.

Each orchestrator process owns `/run/schedlab/<pid>/` and records there every Mininet
host shell, role process, root-namespace interface and cgroup it creates (with any change
to a shared cgroup, emu/testbed/cgroups.py), and the machine's value of every kernel setting it
changes, before changing it. A process is
identified by (pid, start time), so a recycled pid is never killed. `clean()` removes the
state of orchestrators that are gone (or, with `force`, of all of them): it kills recorded
process groups, deletes recorded interfaces and puts recorded settings back. Nothing is
ever found by matching names.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from emu.testbed import cgroups
from emu.testbed.machine import read_sysctl, write_sysctl

STATE_ROOT = Path(os.environ.get("SCHEDLAB_STATE_DIR", "/run/schedlab"))
CGROUP_ROOT = str(cgroups.SYS_ROOT)  # v1 hierarchies (a directory each) or the v2 root
CPU_CGROUPS = ("cpu", "cpuacct", "cpuset")  # v1: where a record without paths (older runs) has its groups


def start_time(pid: int) -> int | None:
    """Kernel start time of `pid` in clock ticks (field 22 of /proc/pid/stat), None if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may contain spaces; fields after the last ')' are safe.
    return int(stat.rsplit(")", 1)[1].split()[19])


def alive(pid: int, started: int | None) -> bool:
    """Running (not a zombie awaiting its parent's wait) and the same process as recorded."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    fields = stat.rsplit(")", 1)[1].split()
    return fields[0] != "Z" and (started is None or int(fields[19]) == started)


@dataclass
class Proc:
    kind: str  # "host" | "role"
    name: str
    pid: int
    started: int | None


def kill_group(pid: int, started: int | None, grace_s: float = 2.0) -> None:
    """SIGTERM (and SIGCONT, for a stopped group) the process group led by `pid`, then
    SIGKILL whatever is left after `grace_s`."""
    if not alive(pid, started):
        return
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 1.0)):
        try:
            os.killpg(pid, sig)
            if sig == signal.SIGTERM:
                os.killpg(pid, signal.SIGCONT)  # a stopped group (a stop fault) handles SIGTERM only once continued
        except ProcessLookupError:
            return
        except PermissionError:
            os.kill(pid, sig)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if not alive(pid, started):
                return
            time.sleep(0.05)


def delete_link(name: str) -> None:
    if Path(f"/sys/class/net/{name}").exists():
        subprocess.run(["ip", "link", "del", name], capture_output=True)


class StateDir:
    """The record of what one orchestrator process has started."""

    def __init__(self, root: Path = STATE_ROOT, pid: int | None = None):
        self.pid = os.getpid() if pid is None else pid
        self.path = root / str(self.pid)

    def open(self) -> StateDir:
        self.path.mkdir(parents=True, exist_ok=True)
        self._write("owner.json", {"pid": self.pid, "started": start_time(self.pid)})
        return self

    def __enter__(self) -> StateDir:
        return self.open()

    def __exit__(self, *exc) -> None:
        self.teardown()  # normally nothing is left: each Testbed cleans up after itself
        self.remove()

    def _write(self, name: str, obj: dict) -> None:
        tmp = self.path / f".{name}.tmp"
        tmp.write_text(json.dumps(obj))
        os.replace(tmp, self.path / name)

    def add_process(self, kind: str, name: str, pid: int) -> None:
        self._write(f"proc-{kind}-{name}-{pid}.json",
                    {"kind": kind, "name": name, "pid": pid, "started": start_time(pid)})

    def add_link(self, name: str) -> None:
        self._write(f"link-{name}.json", {"name": name})

    def add_cgroup(self, name: str, paths: list[Path] | None = None) -> None:
        """A host's cgroup, with its directories (each hierarchy's), before it is created."""
        self._write(f"cgroup-{name}.json", {"name": name, "paths": [str(p) for p in paths or []]})

    def add_cgroup_change(self, change: cgroups.Change) -> None:
        """A change to a cgroup the harness does not own (v2: a controller enabled in a
        parent's subtree_control) or a parent cgroup it creates, before it is made; undone
        newest first after the hosts' groups are removed."""
        seq = time.time_ns()
        self._write(f"cgchange-{seq}.json", {**change.as_dict(), "seq": seq})

    def cgroup_changes(self) -> list[dict]:
        out = []
        for f in self.path.glob("cgchange-*.json"):
            try:
                rec = json.loads(f.read_text())
                out.append({"undo": str(rec["undo"]), "path": str(rec["path"]),
                            "controller": str(rec.get("controller", "")), "seq": int(rec["seq"])})
            except (OSError, ValueError, KeyError, TypeError):
                continue
        return sorted(out, key=lambda r: r["seq"], reverse=True)

    def change_sysctl(self, key: str, value: str) -> None:
        """Set a machine-wide sysctl for this run, its current value recorded first (once:
        a second change keeps the first original), so teardown or `clean` can restore it."""
        record = self.path / f"sysctl-{key}.json"
        if not record.exists():
            original = read_sysctl(key)
            if original is None:
                raise OSError(f"sysctl {key}: not present in this kernel")
            self._write(record.name, {"name": key, "original": original, "recorded_at": time.time()})
        write_sysctl(key, value)

    def sysctls(self) -> list[dict]:
        """Recorded machine settings: name, original value, when recorded."""
        out = []
        for f in sorted(self.path.glob("sysctl-*.json")):
            try:
                rec = json.loads(f.read_text())
                out.append({"name": str(rec["name"]), "original": str(rec["original"]),
                            "recorded_at": float(rec.get("recorded_at", 0))})
            except (OSError, ValueError, KeyError, TypeError):
                continue
        return out

    def _names(self, kind: str) -> list[str]:
        names = []
        for f in sorted(self.path.glob(f"{kind}-*.json")):
            try:
                names.append(json.loads(f.read_text())["name"])
            except (OSError, ValueError, KeyError):
                continue
        return names

    def links(self) -> list[str]:
        return self._names("link")

    def cgroups(self) -> list[str]:
        return self._names("cgroup")

    def cgroup_paths(self) -> dict[str, list[Path]]:
        """Recorded host cgroups -> their directories (a record from before paths were
        written: the v1 hierarchies Mininet's CPULimitedHost used)."""
        out = {}
        for f in sorted(self.path.glob("cgroup-*.json")):
            try:
                rec = json.loads(f.read_text())
                name = rec["name"]
            except (OSError, ValueError, KeyError):
                continue
            paths = rec.get("paths") or [Path(CGROUP_ROOT) / c / name for c in CPU_CGROUPS]
            out[name] = [Path(p) for p in paths]
        return out

    def processes(self) -> list[Proc]:
        out = []
        for f in sorted(self.path.glob("proc-*.json")):
            try:
                out.append(Proc(**json.loads(f.read_text())))
            except (OSError, ValueError, TypeError):
                continue
        return out

    def owner_alive(self) -> bool:
        try:
            owner = json.loads((self.path / "owner.json").read_text())
        except (OSError, ValueError):
            return False
        return alive(owner["pid"], owner.get("started"))

    def teardown(self, sysctls: bool = True) -> list[str]:
        """Kill roles, then host shells, then delete links and cgroups, then put machine
        settings back (unless `sysctls` is False); return what was still there."""
        found: list[str] = []
        procs = self.processes()
        for kind in ("role", "host"):
            for p in procs:
                if p.kind == kind and alive(p.pid, p.started):
                    found.append(f"{kind} {p.name} (pid {p.pid})")
                    kill_group(p.pid, p.started)
        for name in self.links():
            if Path(f"/sys/class/net/{name}").exists():
                found.append(f"link {name}")
                delete_link(name)
        for name, paths in self.cgroup_paths().items():
            dirs = [d for d in paths if d.is_dir()]
            if dirs:
                found.append(f"cgroup {name}")
            for d in dirs:
                cgroups.rmdir(d)  # empty once its processes are gone
        for change in self.cgroup_changes():
            line = cgroups.undo(change)
            if line:
                found.append(line)
        if sysctls:
            found += restore_sysctls(self.sysctls())
        return found

    def clear(self) -> None:
        """Forget the records of a network that was torn down cleanly."""
        for f in [*self.path.glob("proc-*.json"), *self.path.glob("link-*.json"), *self.path.glob("cgroup-*.json"),
                  *self.path.glob("cgchange-*.json"), *self.path.glob("sysctl-*.json")]:
            f.unlink(missing_ok=True)

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


def restore_sysctls(records: list[dict]) -> list[str]:
    """Put recorded settings back, newest record first, so where two runs changed the same key
    (one killed, the next recording the changed value as its original) the oldest original,
    the machine's own, is what remains."""
    done = []
    for rec in sorted(records, key=lambda r: r["recorded_at"], reverse=True):
        if read_sysctl(rec["name"]) != " ".join(rec["original"].split()):
            try:
                write_sysctl(rec["name"], rec["original"])
                done.append(f"sysctl {rec['name']} (restored to {rec['original']!r})")
            except OSError as e:
                done.append(f"sysctl {rec['name']}: could not restore {rec['original']!r} ({e})")
    return done


def clean(force: bool = False, root: Path = STATE_ROOT) -> list[str]:
    """Tear down everything recorded by orchestrators that are no longer running.

    With `force`, also those still running (use when one is hung). Returns a line per
    thing that was found and removed.
    """
    removed: list[str] = []
    if not root.exists():
        return removed
    gone: list[StateDir] = []
    for d in sorted(root.iterdir()):
        if not d.is_dir() or not d.name.isdigit():
            continue
        state = StateDir(root, int(d.name))
        if state.pid == os.getpid() or (state.owner_alive() and not force):
            continue
        removed += [f"{line} [orchestrator {state.pid}]" for line in state.teardown(sysctls=False)]
        gone.append(state)
    # Settings last and across all orchestrators at once: their order decides what remains.
    removed += restore_sysctls([rec for state in gone for rec in state.sysctls()])
    for state in gone:
        state.remove()
    return removed
