"""CPU cgroups on both hierarchies (emu/testbed/cgroups.py): detection, a host's group from creation to
removal, the doctor's lines and preflight's decisions.

Fast tier: recorded trees in a temporary directory, laid out like /sys/fs/cgroup of a
v2-only Debian 12 machine, of this machine (hybrid), of an older co-mounted v1 machine and
of a container whose v2 root does not offer cpu. A tmpfs directory does not answer like a
cgroup filesystem, so `Kernel` stands behind the module's three kernel calls (mkdir, rmdir,
write): a new cgroup gets the files its parent's subtree_control gives it, +cpu is refused
where the controller is not offered, a pid moves between cgroup.procs files, a populated
group cannot be removed.

Root tier, on the real kernel (tests/mininet/test_cgroups_kernel.py): the v1 tree drives this
machine's cpu hierarchy, and the v2 tree's mechanics (its own cgroup, a controller enabled in
the parents' subtree_control and taken back, a process joined through cgroup.procs, removal) run
on the real unified hierarchy. Here that hierarchy offers only hugetlb, so the v2 test enables
hugetlb rather than cpu (on a machine whose unified root offers cpu it uses cpu and checks
cpu.max too). The cpu controller cannot be put in a v2 hierarchy on this machine: it is bound to
the v1 hierarchy at /sys/fs/cgroup/cpu (hierarchy 1 in /proc/cgroups) and a controller is in one
hierarchy at a time. Tried, without touching the machine's mounts: writing +cpu to
/sys/fs/cgroup/unified/cgroup.subtree_control (ENOENT: not offered); in a private mount
namespace (unshare --mount --propagation private), unmounting the cpu and cpuacct v1 mounts
there and mounting a fresh cgroup2: its cgroup.controllers is still only hugetlb and +cpu is
still ENOENT, because the v1 hierarchy stays alive (mounted in the machine's namespace) and
keeps cpu. Freeing it would mean unmounting the v1 cpu hierarchy machine-wide (and destroying
it, so no cgroup may remain in it) while the harness and other runs use it, which is not done.
So cpu.max on a real v2 kernel is shown only by the recorded trees here.
"""
from __future__ import annotations

import errno
import json
import subprocess
import sys
from pathlib import Path

import pytest

from emu.config.experiment import ConfigError
from emu.config.plan import load_plan
from emu.testbed import capabilities, cgroups, cleanup, preflight
from emu.testbed.network import _joining
from tests.factories import GOOD, _sections, variant, write

DEBIAN12_CONTROLLERS = "cpuset cpu io memory hugetlb pids rdma misc"
HYBRID_PROC_CGROUPS = """#subsys_name	hierarchy	num_cgroups	enabled
cpuset	3	1	1
cpu	1	1	1
cpuacct	2	1	1
blkio	7	1	1
memory	4	44	1
devices	5	1	1
freezer	6	1	1
net_cls	0	1	1
perf_event	0	1	1
net_prio	0	1	1
hugetlb	0	1	1
pids	8	1	1
"""
V1_FILES = {"cpu": ["cpu.cfs_quota_us", "cpu.cfs_period_us", "cpu.shares", "cpu.stat"],
            "cpuacct": ["cpuacct.usage", "cpuacct.stat"], "cpuset": ["cpuset.cpus", "cpuset.mems"],
            "memory": ["memory.limit_in_bytes"], "devices": ["devices.list"], "freezer": [],
            "blkio": ["blkio.weight"], "pids": []}


def _files(d: Path, files: dict[str, str]) -> None:
    d.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (d / name).write_text(text)


def _v2_cgroup(d: Path, controllers: str, subtree: str = "", procs: str = "") -> None:
    files = {"cgroup.controllers": controllers + "\n", "cgroup.subtree_control": subtree + "\n",
             "cgroup.procs": procs, "cgroup.events": "populated 0\nfrozen 0\n", "cpu.stat": "usage_usec 0\n"}
    if "cpu" in controllers.split():
        files["cpu.max"] = "max 100000\n"
    _files(d, files)


def debian12(tmp: Path, subtree: str = "cpuset cpu io memory pids", controllers: str = DEBIAN12_CONTROLLERS) -> Path:
    """/sys/fs/cgroup of a Debian 12 machine (systemd, unified only): a root with its
    processes, system.slice, user.slice, init.scope; /proc/cgroups with every controller in
    hierarchy 0."""
    root = tmp / "sys" / "fs" / "cgroup"
    _files(root, {"cgroup.controllers": controllers + "\n", "cgroup.subtree_control": subtree + "\n",
                  "cgroup.procs": "2\n3\n", "cgroup.max.depth": "max\n", "cgroup.stat": "nr_descendants 3\n",
                  "cpu.stat": "usage_usec 1\n", "cpu.pressure": "", "io.stat": "", "memory.stat": ""})
    for child in ("init.scope", "system.slice", "user.slice"):
        _v2_cgroup(root / child, subtree, procs="1\n" if child == "init.scope" else "")
    (tmp / "cgroups").write_text("#subsys_name\thierarchy\tnum_cgroups\tenabled\n" + "".join(
        f"{c}\t0\t60\t1\n" for c in DEBIAN12_CONTROLLERS.split()))
    return root


def hybrid(tmp: Path) -> Path:
    """This machine's /sys/fs/cgroup: a tmpfs of v1 mounts, one per controller (cpu and
    cpuacct apart), name=systemd, and the unified hierarchy at unified/ with hugetlb only."""
    root = tmp / "sys" / "fs" / "cgroup"
    for ctl, files in V1_FILES.items():
        _files(root / ctl, {"cgroup.procs": "1\n", "tasks": "1\n", "cgroup.clone_children": "0\n",
                            "notify_on_release": "0\n", **{f: "" for f in files}})
    if (root / "cpu").is_dir():
        (root / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
        (root / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    _files(root / "systemd", {"cgroup.procs": "1\n", "tasks": "1\n", "release_agent": ""})
    _files(root / "unified", {"cgroup.controllers": "hugetlb\n", "cgroup.subtree_control": "\n",
                              "cgroup.procs": "1\n", "cpu.stat": "", "cpu.pressure": ""})
    (tmp / "cgroups").write_text(HYBRID_PROC_CGROUPS)
    return root


def comounted_v1(tmp: Path) -> Path:
    """Ubuntu 18.04's layout: cpu and cpuacct in one hierarchy (cpu,cpuacct) with a symlink each."""
    root = tmp / "sys" / "fs" / "cgroup"
    _files(root / "cpu,cpuacct", {"cgroup.procs": "1\n", "tasks": "1\n", "cpu.cfs_quota_us": "-1\n",
                                  "cpu.cfs_period_us": "100000\n", "cpuacct.usage": "0\n"})
    (root / "cpu").symlink_to("cpu,cpuacct")
    (root / "cpuacct").symlink_to("cpu,cpuacct")
    _files(root / "memory", {"cgroup.procs": "1\n", "memory.limit_in_bytes": ""})
    (tmp / "cgroups").write_text(HYBRID_PROC_CGROUPS)
    return root


class Kernel:
    """What the kernel does behind a cgroup filesystem, for a recorded tree."""

    def __init__(self, root: Path):
        self.root = root

    @staticmethod
    def _v2(d: Path) -> bool:
        return (d / "cgroup.controllers").exists()

    def mkdir(self, path: Path) -> None:
        parent = path.parent
        path.mkdir()
        if self._v2(parent):
            _v2_cgroup(path, (parent / "cgroup.subtree_control").read_text().strip())
        else:
            files = {"cgroup.procs": "", "tasks": ""}
            if (parent / "cpu.cfs_quota_us").exists():
                files |= {"cpu.cfs_quota_us": "-1\n", "cpu.cfs_period_us": "100000\n"}
            _files(path, files)

    def rmdir(self, path: Path) -> None:
        if not path.exists():
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", str(path))
        if (path / "cgroup.procs").read_text().split() or any(p.is_dir() for p in path.iterdir()):
            raise OSError(errno.EBUSY, "Device or resource busy", str(path))
        for f in path.iterdir():
            f.unlink()
        path.rmdir()

    def write(self, path: Path, value: str) -> None:
        d, name = path.parent, path.name
        if not path.exists():
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", str(path))
        if name == "cgroup.subtree_control":
            have = path.read_text().split()
            offered = (d / "cgroup.controllers").read_text().split()
            children = [c for c in d.iterdir() if c.is_dir()]
            for tok in value.split():
                ctl = tok[1:]
                if tok[0] == "+" and ctl not in have:
                    if ctl not in offered:
                        raise OSError(errno.ENOENT, "No such file or directory", str(path))
                    if d != self.root and (d / "cgroup.procs").read_text().split():
                        raise OSError(errno.EBUSY, "Device or resource busy", str(path))
                    have.append(ctl)
                    for c in children:
                        (c / "cgroup.controllers").write_text(" ".join(
                            (c / "cgroup.controllers").read_text().split() + [ctl]) + "\n")
                        if ctl == "cpu":
                            (c / "cpu.max").write_text("max 100000\n")
                elif tok[0] == "-" and ctl in have:
                    if any(ctl in (c / "cgroup.subtree_control").read_text().split() for c in children):
                        raise OSError(errno.EBUSY, "Device or resource busy", str(path))
                    have.remove(ctl)
                    for c in children:
                        (c / "cgroup.controllers").write_text(" ".join(
                            x for x in (c / "cgroup.controllers").read_text().split() if x != ctl) + "\n")
                        (c / "cpu.max").unlink(missing_ok=True) if ctl == "cpu" else None
            path.write_text(" ".join(have) + "\n")
        elif name == "cgroup.procs":
            pid = value.strip()
            if not pid.isdigit():
                raise OSError(errno.EINVAL, "Invalid argument", str(path))
            hierarchy = self.root if self._v2(self.root) else self.root / path.relative_to(self.root).parts[0]
            for procs in hierarchy.rglob("cgroup.procs"):  # a pid is in one cgroup of each hierarchy
                procs.write_text("".join(f"{p}\n" for p in procs.read_text().split() if p != pid))
            path.write_text(path.read_text() + pid + "\n")
        elif name == "cpu.max":
            quota, period = value.split()
            if not (quota == "max" or int(quota) >= 1000) or not 1000 <= int(period) <= 1_000_000:
                raise OSError(errno.EINVAL, "Invalid argument", str(path))
            path.write_text(f"{quota} {period}\n")
        else:
            int(value)  # cpu.cfs_*_us take a number
            path.write_text(value + "\n")

    def exit(self, pid: int) -> None:
        for procs in self.root.rglob("cgroup.procs"):
            procs.write_text("".join(f"{p}\n" for p in procs.read_text().split() if p != str(pid)))


@pytest.fixture
def tree(tmp_path, monkeypatch):
    """Point the module (and with it the doctor, preflight and the testbed) at a recorded tree."""
    def use(layout) -> Path:
        root = layout(tmp_path)
        kernel = Kernel(root)
        monkeypatch.setattr(cgroups, "SYS_ROOT", root)
        monkeypatch.setattr(cgroups, "PROC_CGROUPS", tmp_path / "cgroups")
        monkeypatch.setattr(cgroups, "_mkdir", kernel.mkdir)
        monkeypatch.setattr(cgroups, "_rmdir", kernel.rmdir)
        monkeypatch.setattr(cgroups, "_write_file", kernel.write)
        use.kernel = kernel
        return root
    return use


def dead_state(tmp_path: Path, pid: int = 999_999_101) -> cleanup.StateDir:
    state = cleanup.StateDir(tmp_path / "state", pid)
    state.path.mkdir(parents=True)
    (state.path / "owner.json").write_text(json.dumps({"pid": pid, "started": 1}))  # no such process
    return state


# ---------------------------------------------------------------------------- detection

def test_a_debian12_machine_is_v2_and_drives_cpu_through_cpu_max(tree):
    root = tree(debian12)
    layout = cgroups.detect()
    assert layout.kind == "v2" and layout.v2 == root and not layout.v1
    assert layout.controllers()["cpu"] == "v2" and layout.controllers()["hugetlb"] == "v2"
    assert layout.describe() == f"v2: at {root} with {DEBIAN12_CONTROLLERS}"
    t = layout.cpu_tree()
    assert isinstance(t, cgroups.V2CpuTree) and t.paths("w1") == [root / "schedlab" / "w1"]
    assert layout.cpu_problem() is None


def test_this_machine_is_hybrid_and_drives_cpu_through_v1(tree):
    root = tree(hybrid)
    layout = cgroups.detect()
    assert layout.kind == "hybrid" and layout.v2 == root / "unified" and layout.v2_controllers == ("hugetlb",)
    assert {c: layout.controllers()[c] for c in ("cpu", "cpuacct", "cpuset", "memory", "hugetlb", "net_cls")} == {
        "cpu": "v1", "cpuacct": "v1", "cpuset": "v1", "memory": "v1", "hugetlb": "v2",
        "net_cls": "available (not mounted)"}
    assert "systemd" not in layout.controllers()
    assert layout.describe() == (f"hybrid: v1 blkio, cpu, cpuacct, cpuset, devices, freezer, memory, pids; "
                                 f"v2 at {root}/unified with hugetlb")
    t = layout.cpu_tree()
    assert isinstance(t, cgroups.V1CpuTree) and t.paths("w1") == [root / "cpu" / "w1", root / "cpuacct" / "w1"]


def test_a_comounted_v1_hierarchy_is_one_group(tree):
    root = tree(comounted_v1)
    layout = cgroups.detect()
    assert layout.kind == "v1" and layout.v1["cpu"] == layout.v1["cpuacct"] == root / "cpu,cpuacct"
    assert layout.cpu_tree().paths("w1") == [root / "cpu,cpuacct" / "w1"]
    assert layout.describe() == "v1: cpu,cpuacct, memory"


def test_shares_are_mininets_cfs_arithmetic():
    assert cgroups.cfs_limit(0.25, cpus=2) == (50_000, 100_000)
    assert cgroups.cfs_limit(-1, cpus=2) == (-1, 100_000)
    assert cgroups.cfs_limit(0.002, cpus=2) == (1000, 250_000), "below 1 ms of quota the period grows"
    assert cgroups.cfs_limit(1.0, cpus=16) == (1_600_000, 100_000)


# ---------------------------------------------------------------------------- a group's life

@pytest.mark.slow
def test_v2_group_created_limited_read_back_and_removed_with_every_change_undone(tree, tmp_path):
    """The root's subtree_control lacks cpu (as a machine whose systemd enables none): the
    harness enables it, records that first, and takes it back with its own cgroup."""
    root = tree(lambda t: debian12(t, subtree="memory pids"))
    state = dead_state(tmp_path)
    t = cgroups.detect().cpu_tree()
    state.add_cgroup("w1", t.paths("w1"))
    t.create("w1", on_change=state.add_cgroup_change)
    assert (root / "cgroup.subtree_control").read_text().split() == ["memory", "pids", "cpu"]
    assert (root / "schedlab" / "cgroup.subtree_control").read_text().split() == ["cpu"]
    assert [(c["undo"], c["path"]) for c in state.cgroup_changes()] == [
        ("subtree", str(root / "schedlab")), ("rmdir", str(root / "schedlab")), ("subtree", str(root))]
    assert t.set_limit("w1", 0.25) == cgroups.cfs_limit(0.25)
    quota, period = cgroups.cfs_limit(0.25)
    assert (root / "schedlab" / "w1" / "cpu.max").read_text() == f"{quota} {period}\n"
    assert t.set_limit("w1", -1) == t.limit("w1") == (-1, 100_000)
    assert (root / "schedlab" / "w1" / "cpu.max").read_text() == "max 100000\n"
    t.add("w1", 4242)
    assert t.pids("w1") == [4242] and "4242" not in (root / "cgroup.procs").read_text().split()
    assert t.remove("w1") == [f"cgroup {root}/schedlab/w1 (busy, left)"], "a group with a process stays"
    tree.kernel.exit(4242)
    # A killed run: the next run's clean() finds the records and undoes everything, newest first.
    found = cleanup.clean(root=tmp_path / "state")
    assert found == [f"cgroup w1 [orchestrator {state.pid}]",
                     f"cpu in {root}/schedlab/cgroup.subtree_control (taken out again) [orchestrator {state.pid}]",
                     f"cgroup {root}/schedlab [orchestrator {state.pid}]",
                     f"cpu in {root}/cgroup.subtree_control (taken out again) [orchestrator {state.pid}]"]
    assert not (root / "schedlab").exists()
    assert (root / "cgroup.subtree_control").read_text().split() == ["memory", "pids"]
    assert not state.path.exists()


def test_v2_where_cpu_is_enabled_already_changes_only_its_own_cgroup(tree, tmp_path):
    root = tree(debian12)
    state = dead_state(tmp_path)
    t = cgroups.detect().cpu_tree()
    t.create("w1", on_change=state.add_cgroup_change)
    t.create("w2", on_change=state.add_cgroup_change)
    assert [c["undo"] for c in state.cgroup_changes()] == ["subtree", "rmdir"], "the root is left as it was"
    assert sorted(p.name for p in (root / "schedlab").iterdir() if p.is_dir()) == ["w1", "w2"]


def test_v2_refuses_a_root_that_does_not_offer_cpu_naming_the_file(tree, tmp_path):
    root = tree(lambda t: debian12(t, subtree="memory pids", controllers="memory pids"))
    assert cgroups.detect().cpu_tree() is None
    t = cgroups.V2CpuTree(root)
    with pytest.raises(cgroups.CgroupError, match=r"cgroup.controllers has no cpu controller \(memory pids\)"):
        t.create("w1")


def test_v2_says_why_a_cgroup_with_processes_cannot_enable_cpu(tree, tmp_path):
    """A container's root: processes of its own, so v2 refuses a controller for its children."""
    root = tree(debian12)
    _v2_cgroup(root / "ctr", DEBIAN12_CONTROLLERS, procs="7\n")
    t = cgroups.V2CpuTree(root, parent="ctr/schedlab")
    with pytest.raises(cgroups.CgroupError, match="has processes of its own"):
        t.create("w1")


def test_v1_group_created_limited_read_back_and_removed(tree, tmp_path):
    root = tree(hybrid)
    state = dead_state(tmp_path)
    t = cgroups.detect().cpu_tree()
    state.add_cgroup("w1", t.paths("w1"))
    t.create("w1", on_change=state.add_cgroup_change)
    assert state.cgroup_changes() == [], "v1: nothing shared is changed"
    assert t.set_limit("w1", 0.1) == cgroups.cfs_limit(0.1)
    assert (root / "cpu" / "w1" / "cpu.cfs_quota_us").read_text().strip() == str(cgroups.cfs_limit(0.1)[0])
    t.add("w1", 4242)
    assert [(root / c / "w1" / "cgroup.procs").read_text() for c in ("cpu", "cpuacct")] == ["4242\n", "4242\n"]
    tree.kernel.exit(4242)
    assert cleanup.clean(root=tmp_path / "state") == [f"cgroup w1 [orchestrator {state.pid}]"]
    assert not (root / "cpu" / "w1").exists() and not (root / "cpuacct" / "w1").exists()


def test_a_record_without_paths_is_a_v1_group_as_mininet_made_it(tmp_path, monkeypatch):
    """Records written before groups had paths name v1 groups in cpu, cpuacct and cpuset."""
    root = hybrid(tmp_path)
    monkeypatch.setattr(cleanup, "CGROUP_ROOT", str(root))
    state = dead_state(tmp_path)
    (state.path / "cgroup-w1.json").write_text(json.dumps({"name": "w1"}))
    for c in ("cpu", "cpuacct", "cpuset"):
        (root / c / "w1").mkdir()
    assert cleanup.clean(root=tmp_path / "state") == [f"cgroup w1 [orchestrator {state.pid}]"]
    assert not any((root / c / "w1").exists() for c in ("cpu", "cpuacct", "cpuset"))


def test_a_role_joins_the_group_before_it_runs(tmp_path):
    """The prefix a limited host's popen puts before mnexec: the pid written is the role's own
    (the shell execs it), to every hierarchy's file."""
    a, b = tmp_path / "a.procs", tmp_path / "b.procs"
    a.touch()
    b.touch()
    r = subprocess.run([*_joining([a, b]), "sh", "-c", "echo $$; cat " + str(a)], capture_output=True, text=True,
                       check=True)
    pid, written = r.stdout.split()
    assert pid == written == b.read_text().strip()
    r = subprocess.run([*_joining([tmp_path / "no" / "such"]), "true"], capture_output=True, text=True)
    assert r.returncode == 126 and "such" in r.stderr, "a role that cannot join does not run"


# ---------------------------------------------------------------------------- doctor and preflight

def _doctor() -> dict[str, capabilities.Check]:
    return {c.name: c for c in capabilities._cgroup_checks()}


def test_doctor_names_the_hierarchy_and_whether_host_cpu_works(tree):
    root = tree(debian12)
    d = _doctor()
    assert d["hierarchy"].state == f"v2: at {root} with {DEBIAN12_CONTROLLERS}"
    cpu = d["cpu controller (host_cpu, slow)"]
    assert cpu.ok and cpu.state == f"yes: v2, cpu in {root}/cgroup.controllers" and "cpu.max" in cpu.handling


def test_doctor_on_this_machines_layout(tree):
    root = tree(hybrid)
    d = _doctor()
    assert d["hierarchy"].state.startswith("hybrid: v1 blkio, cpu, cpuacct")
    cpu = d["cpu controller (host_cpu, slow)"]
    assert cpu.ok and cpu.state == f"yes: v1, {root}/cpu, {root}/cpuacct" and "cpu.cfs_quota_us" in cpu.handling


def test_doctor_and_preflight_refuse_alike_where_v2_does_not_offer_cpu(tree, tmp_path):
    root = tree(lambda t: debian12(t, subtree="memory pids", controllers="memory pids"))
    cpu = _doctor()["cpu controller (host_cpu, slow)"]
    why = f"which the unified hierarchy at {root} does not offer (its cgroup.controllers: memory pids)"
    assert not cpu.ok and cpu.state == f"no: {why}"
    assert "fix: delegate cpu to this container or unit" in cpu.handling
    plan = load_plan(write(tmp_path, {**GOOD, "host_cpu": {"w0": 0.5}}), _sections())
    with pytest.raises(ConfigError) as e:
        preflight.check(plan)
    refusal = f"host_cpu: needs the cgroup cpu controller (CFS bandwidth), {why}; fix: delegate cpu"
    assert str(e.value).startswith(refusal) and cpu.handling.endswith(str(e.value).split("; ", 1)[1])
    slow = load_plan(write(tmp_path, variant("faults", [
        {"at_s": 5, "kind": "slow", "target": "worker1", "for_s": 5, "cpu": 0.2}])), _sections())
    with pytest.raises(ConfigError, match=r"^faults\[0\]: slow needs the cgroup cpu controller"):
        preflight.check(slow)


def test_preflight_accepts_host_cpu_on_v2_and_on_hybrid(tree, tmp_path):
    plan = load_plan(write(tmp_path, {**GOOD, "host_cpu": {"w0": 0.5}}), _sections())
    tree(debian12)
    preflight.check(plan)


def test_preflight_accepts_host_cpu_on_this_machines_layout(tree, tmp_path):
    plan = load_plan(write(tmp_path, {**GOOD, "host_cpu": {"w0": 0.5}}), _sections())
    tree(hybrid)
    preflight.check(plan)


def test_a_v1_machine_without_cpu_mounted_is_told_the_v1_mount(tree, tmp_path):
    def v1_without_cpu(t):
        root = hybrid(t)
        for d in ("cpu", "cpuacct", "unified"):
            for f in (root / d).iterdir():
                f.unlink()
        return root
    root = tree(v1_without_cpu)
    cpu = _doctor()["cpu controller (host_cpu, slow)"]
    assert not cpu.ok and cpu.state == "no: which is not mounted here"
    d = f"{root}/cpu,cpuacct"
    assert cpu.handling.endswith(f"fix: mkdir {d} && mount -t cgroup -o cpu,cpuacct cpu,cpuacct {d}")


def test_a_kernel_without_the_cpu_controller_is_named(tree, tmp_path):
    root = tree(lambda t: debian12(t, subtree="memory pids", controllers="memory pids"))
    (tmp_path / "cgroups").write_text("#subsys_name\thierarchy\tnum_cgroups\tenabled\nmemory\t0\t1\t1\n")
    cpu = _doctor()["cpu controller (host_cpu, slow)"]
    assert not cpu.ok and cpu.state == "no: which this kernel does not have (no cpu line in /proc/cgroups)"
    assert cpu.handling.endswith("fix: a kernel built with CONFIG_CGROUP_SCHED and CONFIG_CFS_BANDWIDTH")
    assert capabilities.cpu_cgroup_refusal("host_cpu:") == (
        "host_cpu: needs the cgroup cpu controller (CFS bandwidth), which this kernel does not have (no cpu line "
        "in /proc/cgroups); fix: a kernel built with CONFIG_CGROUP_SCHED and CONFIG_CFS_BANDWIDTH")
    assert root.is_dir()


# ---------------------------------------------------------------------------- the real kernel


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
