"""CPU cgroups of limited hosts (`host_cpu`, the `slow` fault) on either cgroup hierarchy.

A machine mounts the legacy hierarchies (v1: one per controller or group of controllers,
`/sys/fs/cgroup/cpu/<group>`, the limit in `cpu.cfs_quota_us` and `cpu.cfs_period_us`), the
unified one (v2: one tree, a controller enabled for a cgroup's children in its
`cgroup.subtree_control`, the limit in `cpu.max` as "quota period"), or both (hybrid: each
controller is bound to exactly one of them). `detect()` reads which from the directories
under the root (injectable, so tests lay out a recorded tree) and `Layout.cpu_tree()` gives
the one `CpuTree` that drives the cpu controller where it is: callers create, limit, read
back, add pids and remove without knowing the version. The harness mounts nothing; the only
shared state it changes is recorded first through `on_change` (emu/testbed/cleanup.py) and undone
by `undo` (v2: a `subtree_control` it enabled, its own parent cgroup).
"""
from __future__ import annotations

import errno
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

SYS_ROOT = Path("/sys/fs/cgroup")
PROC_CGROUPS = Path("/proc/cgroups")
PERIOD_US = 100_000          # the CFS period, as Mininet's CPULimitedHost uses
MIN_QUOTA_US = 1000          # the kernel's smallest quota; a smaller share gets a longer period
V2_PARENT = "schedlab"       # v2: the harness's own cgroup under the root, the hosts' groups below it
V1_CPU = ("cpu", "cpuacct")  # v1: a host's group is in both hierarchies (cpuacct where mounted)


class CgroupError(RuntimeError):
    """A cgroup could not be created, limited or removed; the message says which file said what."""


def cfs_limit(share: float, cpus: int | None = None) -> tuple[int, int]:
    """(quota_us, period_us) that give `share` of the whole machine (-1: no limit), the
    arithmetic of Mininet's `CPULimitedHost.cfsInfo`, so v1 limits are what they were."""
    cpus = cpus or os.cpu_count() or 1
    quota, period = int(PERIOD_US * share * cpus), PERIOD_US
    if share > 0 and quota < MIN_QUOTA_US:
        quota, period = MIN_QUOTA_US, int(MIN_QUOTA_US / share / cpus)
    return (-1 if quota < 0 else quota), period


# The kernel boundary: every change to a cgroup filesystem goes through these three (unit
# tests put a recorded tree's kernel behind them).
def _mkdir(path: Path) -> None:
    path.mkdir()


def _rmdir(path: Path) -> None:
    path.rmdir()


def _write_file(path: Path, value: str) -> None:
    with open(path, "w") as f:  # the kernel's answer comes with the write (at close)
        f.write(value)


def _write(path: Path, value: str) -> None:
    try:
        _write_file(path, value)
    except OSError as e:
        raise CgroupError(f"writing {value!r} to {path}: {e.strerror or e}") from None


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError as e:
        raise CgroupError(f"reading {path}: {e.strerror or e}") from None


def rmdir(path: Path, tries: int = 10) -> bool:
    """Remove an empty cgroup (missing counts as removed). A group whose last process has just
    exited can be busy for a moment, so EBUSY is retried; False if it stays."""
    for i in range(tries):
        try:
            _rmdir(path)
            return True
        except FileNotFoundError:
            return True
        except OSError as e:
            if e.errno != errno.EBUSY or i == tries - 1:
                return False
            time.sleep(0.05)
    return False


@dataclass(frozen=True)
class Change:
    """Shared state a tree changed for its groups, recorded before the change so that a killed
    run's is undone: `rmdir` a cgroup it created, or `subtree` (take `controller` out of the
    cgroup's `cgroup.subtree_control` again)."""

    undo: str
    path: str
    controller: str = ""

    def as_dict(self) -> dict:
        return {"undo": self.undo, "path": self.path, "controller": self.controller}


def undo(change: dict) -> str | None:
    """Undo one recorded `Change` if it is still in force: a line saying what was undone (or
    could not be), None if there was nothing to undo."""
    path = Path(change["path"])
    if change["undo"] == "rmdir":
        if not path.is_dir():
            return None
        return f"cgroup {path}" if rmdir(path) else f"cgroup {path} (not empty, left)"
    if change["undo"] == "subtree":
        ctl = change["controller"]
        try:
            if ctl not in (path / "cgroup.subtree_control").read_text().split():
                return None
        except OSError:
            return None  # the cgroup is gone
        try:
            _write(path / "cgroup.subtree_control", f"-{ctl}")
        except CgroupError as e:  # EBUSY: a cgroup below uses it (someone else enabled it further down)
            return f"{ctl} in {path}/cgroup.subtree_control (kept: {e})"
        return f"{ctl} in {path}/cgroup.subtree_control (taken out again)"
    return f"unknown cgroup change {change!r}"


class CpuTree:
    """Where hosts' CPU groups live on one hierarchy, and how they are driven. A group is named
    after its host; `paths(name)` are its directories (recorded before `create`)."""

    hierarchy = ""
    limit_file = ""

    def paths(self, name: str) -> list[Path]:
        raise NotImplementedError

    def create(self, name: str, on_change: Callable[[Change], None] = lambda c: None) -> None:
        raise NotImplementedError

    def set_limit(self, name: str, share: float) -> tuple[int, int]:
        """Limit the group to `share` of the machine (negative: no limit); the (quota_us,
        period_us) read back (quota -1: no limit)."""
        raise NotImplementedError

    def limit(self, name: str) -> tuple[int, int]:
        raise NotImplementedError

    def procs_files(self, name: str) -> list[Path]:
        """The files a process writes its pid to, to join the group (all of its hierarchies)."""
        return [p / "cgroup.procs" for p in self.paths(name)]

    def add(self, name: str, pid: int) -> None:
        """Move process `pid` (all its threads) into the group; its later children are born there."""
        for f in self.procs_files(name):
            _write(f, str(pid))

    def remove(self, name: str) -> list[str]:
        """Remove the group (empty once its processes are gone); what was left, if anything."""
        return [f"cgroup {p} (busy, left)" for p in self.paths(name) if not rmdir(p)]

    def pids(self, name: str) -> list[int]:
        return [int(x) for x in _read(self.procs_files(name)[0]).split()]


class V1CpuTree(CpuTree):
    """cgroup v1: a group in the cpu hierarchy (and cpuacct, where mounted separately), at its
    root as Mininet's CPULimitedHost made it; CFS bandwidth in cpu.cfs_quota_us/period_us."""

    hierarchy = "v1"
    limit_file = "cpu.cfs_quota_us"

    def __init__(self, mounts: list[Path]):
        self.mounts = mounts  # the cpu hierarchy first

    def paths(self, name: str) -> list[Path]:
        return [m / name for m in self.mounts]

    def create(self, name: str, on_change: Callable[[Change], None] = lambda c: None) -> None:
        for p in self.paths(name):
            if p.is_dir():
                continue  # a group left by a killed run is reused, as cgcreate did
            try:
                _mkdir(p)
            except OSError as e:
                raise CgroupError(f"creating {p}: {e.strerror or e}") from None

    def set_limit(self, name: str, share: float) -> tuple[int, int]:
        quota, period = cfs_limit(share)
        cpu = self.paths(name)[0]
        _write(cpu / "cpu.cfs_period_us", str(period))
        _write(cpu / "cpu.cfs_quota_us", str(quota))
        return self.limit(name)

    def limit(self, name: str) -> tuple[int, int]:
        cpu = self.paths(name)[0]
        return int(_read(cpu / "cpu.cfs_quota_us")), int(_read(cpu / "cpu.cfs_period_us"))


class V2CpuTree(CpuTree):
    """cgroup v2: `<root>/schedlab/<host>`, the cpu controller enabled in the subtree_control
    of every cgroup above the hosts' groups (each enabling recorded, and taken back at
    teardown); CFS bandwidth in cpu.max. The hosts' groups are leaves, and schedlab holds no
    process, as v2 requires of a cgroup whose children use a controller."""

    hierarchy = "v2"
    limit_file = "cpu.max"

    def __init__(self, root: Path, parent: str = V2_PARENT, controller: str = "cpu"):
        self.root = root
        self.parent = root / parent
        self.controller = controller  # another only to test the mechanics where cpu is bound to v1

    def paths(self, name: str) -> list[Path]:
        return [self.parent / name]

    def _chain(self) -> list[Path]:
        """The cgroups from the root down to the parent of the hosts' groups."""
        rel = self.parent.relative_to(self.root).parts
        return [self.root.joinpath(*rel[:i]) for i in range(len(rel) + 1)]

    def create(self, name: str, on_change: Callable[[Change], None] = lambda c: None) -> None:
        for cg in self._chain():
            if not cg.is_dir():
                on_change(Change("rmdir", str(cg)))
                try:
                    _mkdir(cg)
                except OSError as e:
                    raise CgroupError(f"creating {cg}: {e.strerror or e}") from None
            ctl = self.controller
            offered = _read(cg / "cgroup.controllers").split()
            if ctl not in offered:
                raise CgroupError(f"{cg}/cgroup.controllers has no {ctl} controller ({' '.join(offered) or 'none'})")
            if ctl not in _read(cg / "cgroup.subtree_control").split():
                on_change(Change("subtree", str(cg), ctl))
                try:
                    _write(cg / "cgroup.subtree_control", f"+{ctl}")
                except CgroupError as e:
                    hint = (" (the cgroup has processes of its own: v2 enables a controller for children only "
                            "in a cgroup without any; a container's root needs its processes moved to a child)"
                            if "busy" in str(e).lower() else "")
                    raise CgroupError(f"{e}{hint}") from None
        leaf = self.paths(name)[0]
        try:
            if not leaf.is_dir():
                _mkdir(leaf)
        except OSError as e:
            raise CgroupError(f"creating {leaf}: {e.strerror or e}") from None

    def set_limit(self, name: str, share: float) -> tuple[int, int]:
        quota, period = cfs_limit(share)
        _write(self.paths(name)[0] / "cpu.max", f"{'max' if quota < 0 else quota} {period}")
        return self.limit(name)

    def limit(self, name: str) -> tuple[int, int]:
        quota, period = _read(self.paths(name)[0] / "cpu.max").split()
        return (-1 if quota == "max" else int(quota)), int(period)


@dataclass(frozen=True)
class Layout:
    """What a machine mounts under its cgroup root: which hierarchy, which controllers where."""

    root: Path
    v1: dict[str, Path] = field(default_factory=dict)   # controller -> its v1 hierarchy's mount
    v2: Path | None = None                              # the unified hierarchy's mount
    v2_controllers: tuple[str, ...] = ()                # what its root offers (cgroup.controllers)
    kernel: dict[str, bool] | None = None               # /proc/cgroups: controller -> enabled (None: unread)

    @property
    def kind(self) -> str:
        """v1, v2 (unified only), hybrid (both mounted) or none."""
        if self.v2 is not None and self.v2 == self.root:
            return "v2"
        if self.v2 is not None and self.v1:
            return "hybrid"
        return "v1" if self.v1 else ("v2" if self.v2 is not None else "none")

    def controllers(self) -> dict[str, str]:
        """controller -> 'v1' | 'v2', and 'available (not mounted)' for those the kernel has
        enabled but no hierarchy here holds."""
        out = {c: "v1" for c in self.v1}
        out.update({c: "v2" for c in self.v2_controllers if c not in out})
        for c, enabled in (self.kernel or {}).items():
            if enabled:
                out.setdefault(c, "available (not mounted)")
        return out

    def describe(self) -> str:
        """One line for the doctor: the hierarchy and the controllers in each part of it."""
        parts = []
        if self.v1:
            by_mount: dict[Path, list[str]] = {}
            for c, m in sorted(self.v1.items()):
                by_mount.setdefault(m, []).append(c)
            both = "v1 " if self.v2 is not None else ""
            parts.append(both + ", ".join(sorted(",".join(cs) for cs in by_mount.values())))
        if self.v2 is not None:
            both = "v2 " if self.v1 else ""
            parts.append(f"{both}at {self.v2} with {' '.join(self.v2_controllers) or 'no controllers'}")
        return f"{self.kind}: " + ("; ".join(parts) or f"nothing mounted under {self.root}")

    def cpu_tree(self) -> CpuTree | None:
        """The tree that drives the cpu controller here (v1 where it is bound to v1, else v2
        where the unified root offers it), or None: `cpu_problem()` says why."""
        if "cpu" in self.v1:
            acct = self.v1.get("cpuacct")
            return V1CpuTree([self.v1["cpu"]] + ([acct] if acct is not None and acct != self.v1["cpu"] else []))
        if self.v2 is not None and "cpu" in self.v2_controllers:
            return V2CpuTree(self.v2)
        return None

    def cpu_problem(self) -> tuple[str, str] | None:
        """Why host_cpu and slow faults cannot work here, and the fix this system can do; None
        if they can."""
        if self.cpu_tree() is not None:
            return None
        enabled = (self.kernel or {}).get("cpu")
        if self.kernel is not None and enabled is None:
            return ("which this kernel does not have (no cpu line in /proc/cgroups)",
                    "a kernel built with CONFIG_CGROUP_SCHED and CONFIG_CFS_BANDWIDTH")
        if enabled is False:
            return ("which is disabled at boot (/proc/cgroups)",
                    "remove cgroup_disable=cpu from the kernel command line")
        if self.v2 is not None:
            # Offered nowhere: bound to a v1 hierarchy mounted elsewhere, or (a container, a
            # delegated subtree) not passed down to this cgroup namespace's root.
            return (f"which the unified hierarchy at {self.v2} does not offer (its cgroup.controllers: "
                    f"{' '.join(self.v2_controllers) or 'none'})",
                    "delegate cpu to this container or unit (systemd: Delegate=cpu), "
                    "or boot with systemd.unified_cgroup_hierarchy=1")
        if self.v1:
            d = f"{self.root}/cpu,cpuacct"
            return ("which is not mounted here", f"mkdir {d} && mount -t cgroup -o cpu,cpuacct cpu,cpuacct {d}")
        return ("which is not mounted here (no cgroup hierarchy is)", f"mount -t cgroup2 cgroup2 {self.root}")


def _v1_controllers(d: Path, known: set[str] | None) -> list[str]:
    """The controllers a v1 hierarchy mounted at `d` holds: `d`'s name split at commas, as
    systemd and cgroupfs-mount name them (cpu,cpuacct), those the kernel has (without
    /proc/cgroups: those whose files are there), so a named hierarchy (systemd) holds none."""
    names = [c for c in d.name.split(",") if c]
    return [c for c in names if (c in known if known is not None else any(d.glob(f"{c}.*")))]


def detect(root: Path | None = None, proc_cgroups: Path | None = None) -> Layout:
    """The hierarchies mounted under `root` (default `SYS_ROOT`): v2 if `root` itself is a
    cgroup2 mount (it has cgroup.controllers), hybrid's unified part at `root`/unified; each
    other directory with a cgroup.procs file is a v1 hierarchy. `proc_cgroups` (default
    `PROC_CGROUPS`) says which controllers the kernel has and enables. Both defaults are read
    at call time, so a test points the whole harness at a recorded tree."""
    root = SYS_ROOT if root is None else root
    proc_cgroups = PROC_CGROUPS if proc_cgroups is None else proc_cgroups
    kernel: dict[str, bool] | None = {}
    try:
        for line in proc_cgroups.read_text().splitlines()[1:]:
            name, _hier, _n, enabled = line.split()
            kernel[name] = enabled == "1"
    except (OSError, ValueError):
        kernel = None
    v1: dict[str, Path] = {}
    v2: Path | None = None
    if (root / "cgroup.controllers").is_file():
        v2 = root
    else:
        if (root / "unified" / "cgroup.controllers").is_file():
            v2 = root / "unified"
        try:
            entries = sorted(root.iterdir())
        except OSError:
            entries = []
        for d in entries:
            if d.name == "unified" or not d.is_dir() or not (d / "cgroup.procs").is_file():
                continue
            for c in _v1_controllers(d, set(kernel) if kernel else None):
                # A co-mounted pair has a symlink per controller (cpu -> cpu,cpuacct): one mount.
                v1.setdefault(c, d.resolve() if d.is_symlink() else d)
    offered = tuple((v2 / "cgroup.controllers").read_text().split()) if v2 is not None else ()
    return Layout(root=root, v1=v1, v2=v2, v2_controllers=offered, kernel=kernel)
