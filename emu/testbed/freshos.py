"""`./inv fresh-os`: the README's commands on a freshly installed Debian 12, in a directory.

A developer's machine hides what a user's fresh machine lacks (a package, a setting, pip's
configuration), so the commands are run where nothing of this machine is: a minimal Debian
12 root file system (`mmdebstrap --variant=minbase`, cached between calls, keyed by what it
is built from) with the repository's committed tree (`git archive HEAD`) in `/root/schedlab`.
From this machine it gets only what a fresh machine would have or be given: the kernel, the
network's settings (DNS, the CA bundle, proxy and pip network variables) and, read-only,
the torch wheel directory standing in for PyTorch's CPU index (`SCHEDLAB_TORCH_INDEX`).
pip's configuration is not passed in (`PIP_CONFIG_FILE=/dev/null`).

Each step runs as root in a private mount namespace: the root file system bound onto itself,
`pivot_root` into it, then /proc, /sys (with this machine's cgroup mounts, which its init
made), /dev, /dev/pts, /dev/shm, /run and /tmp. A plain chroot does not work for Mininet:
`mnexec -n` cannot make a chroot's root private (it is not a mount point), and `mnexec -a`
enters the host shell's mount namespace, whose root would not be the chroot's. The steps
stay in this machine's network and PID namespaces (Mininet's hosts are network namespaces
of this kernel), so the steps that build networks hold this machine's network lock.

Everything mounted lives in that namespace and goes when its last process exits; a process
left running inside after a step is killed and fails the step. The unpacked root file system
is removed afterwards unless `keep`.
"""
from __future__ import annotations

import ctypes
import fcntl
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from emu.testbed.cleanup import STATE_ROOT

REPO = Path(__file__).resolve().parents[2]
SUITE = "bookworm"
VARIANT = "minbase"
# What the README asks of a machine: Debian 12 with Python 3.11 (every Debian 12 installation
# but a minbase one has it). Everything else is the README's commands' to install.
PACKAGES = ("python3",)
INSIDE_REPO = "/root/schedlab"
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "schedlab" / "fresh-os"
WORK = Path("/var/tmp")  # the unpacked root (about 2 GB once installed): on disk, not in a tmpfs
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
LOCAL_CA = Path("/usr/local/share/ca-certificates/schedlab-host-bundle.crt")
WHEELS = Path("/opt/wheels")
# The network's settings a user behind a proxy or a TLS-intercepting firewall would set on a
# fresh machine too. Not PIP_FIND_LINKS, PIP_CONSTRAINT or PIP_CONFIG_FILE: those are this
# machine's pip configuration, which a fresh machine does not have.
NETWORK_ENV = ("http_proxy", "https_proxy", "no_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY",
               "ALL_PROXY", "PIP_CERT", "PIP_CLIENT_CERT", "PIP_PROXY", "PIP_TRUSTED_HOST", "PIP_INDEX_URL",
               "PIP_EXTRA_INDEX_URL", "PIP_DEFAULT_TIMEOUT", "PIP_RETRIES", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE",
               "CURL_CA_BUNDLE")
STEP_TIMEOUT_S = {"demo": 1800.0, "doctor": 300.0, "fast tier": 1800.0, "full suite": 7200.0}
MARKER = "SCHEDLAB_FRESH_OS"  # set inside, so the test that runs this does not run it again in there


class FreshOSError(RuntimeError):
    """The fresh OS could not be built or entered (not a failure of a step inside it)."""


@dataclass
class Step:
    name: str
    argv: list[str]
    network: bool  # builds Mininet networks: holds this machine's network lock
    rc: int | None = None
    wall_s: float = 0.0
    setup_s: float | None = None  # of wall_s: the set-up (system packages and .venv), where this step did it
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.rc == 0 and not self.notes


def say(msg: str) -> None:
    print(f"fresh-os: {msg}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------ the root file system
def mmdebstrap_argv(target: Path, packages: Sequence[str] = PACKAGES) -> list[str]:
    include = [f"--include={','.join(sorted(packages))}"] if packages else []
    return ["mmdebstrap", f"--variant={VARIANT}", *include, "--quiet", SUITE, str(target)]


def cache_key(packages: Sequence[str] = PACKAGES) -> str:
    """What the root file system is built from: the suite, the variant and the package list."""
    text = json.dumps({"suite": SUITE, "variant": VARIANT, "packages": sorted(packages)})
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def ensure_mmdebstrap() -> None:
    """Debian's mmdebstrap, installed as the set-up installs the harness's other system packages."""
    if shutil.which("mmdebstrap"):
        return
    say("installing Debian's mmdebstrap")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for argv in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "--no-install-recommends",
                                                 "mmdebstrap"]):
        r = subprocess.run(argv, env=env, capture_output=True, text=True)
        if r.returncode:
            raise FreshOSError(f"{' '.join(argv)} failed: {(r.stderr or r.stdout).strip()[-2000:]}")


def rootfs_tarball(packages: Sequence[str] = PACKAGES, rebuild: bool = False, cache: Path = CACHE
                   ) -> tuple[Path, bool]:
    """The cached root file system's tarball, built first if missing (or `rebuild`); whether it was built."""
    tarball = cache / f"{SUITE}-{VARIANT}-{cache_key(packages)}.tar"
    if tarball.exists() and not rebuild:
        return tarball, False
    ensure_mmdebstrap()
    cache.mkdir(parents=True, exist_ok=True)
    tmp = tarball.with_name(f".{tarball.name}.{os.getpid()}.tmp.tar")
    try:
        r = subprocess.run(mmdebstrap_argv(tmp, packages), capture_output=True, text=True)
        if r.returncode:
            raise FreshOSError(f"mmdebstrap exited with {r.returncode}: {(r.stderr or r.stdout).strip()[-2000:]}")
        tmp.replace(tarball)
    finally:
        tmp.unlink(missing_ok=True)
    return tarball, True


def unpack(tarball: Path, work: Path = WORK) -> Path:
    root = Path(tempfile.mkdtemp(prefix="schedlab-fresh-os-", dir=work))
    r = subprocess.run(["tar", "-x", "--numeric-owner", "-f", str(tarball), "-C", str(root)],
                       capture_output=True, text=True)
    if r.returncode:
        shutil.rmtree(root, ignore_errors=True)
        raise FreshOSError(f"unpacking {tarball}: {r.stderr.strip()}")
    return root


def committed_tree(root: Path, repo: Path = REPO) -> str:
    """HEAD's tree (what a user clones, without .git) into root/INSIDE_REPO; HEAD's commit."""
    dest = root / INSIDE_REPO.lstrip("/")
    dest.mkdir(parents=True)
    archive = subprocess.Popen(["git", "-C", str(repo), "archive", "--format=tar", "HEAD"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE)
    untar = subprocess.run(["tar", "-x", "-C", str(dest)], stdin=archive.stdout, capture_output=True, text=True)
    archive.stdout.close()
    err = archive.stderr.read().decode(errors="replace")
    if archive.wait() or untar.returncode:
        raise FreshOSError(f"git archive HEAD into {dest}: {err.strip() or untar.stderr.strip()}")
    return subprocess.run(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True).stdout.strip()


def network_settings(root: Path) -> None:
    """What a fresh machine on this network is given: its resolver, the CA bundle (a TLS-
    intercepting proxy's certificate), and the /etc/hosts an installer writes."""
    etc = root / "etc"
    resolv = Path("/etc/resolv.conf")
    if resolv.exists():
        (etc / "resolv.conf").unlink(missing_ok=True)
        (etc / "resolv.conf").write_text(resolv.read_text())
    if CA_BUNDLE.exists():
        # Also where a user installs a proxy's certificate: apt installing ca-certificates
        # rebuilds the bundle from Debian's certificates and these (update-ca-certificates).
        for dest in (root / CA_BUNDLE.relative_to("/"), root / LOCAL_CA.relative_to("/")):
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(CA_BUNDLE, dest)
    if not (etc / "hosts").exists():
        (etc / "hosts").write_text("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n")


def inside_env(host: dict[str, str] | None = None, wheels: Path | None = WHEELS) -> dict[str, str]:
    """A root login's environment on a fresh machine, plus the network's settings from `host`."""
    host = os.environ if host is None else host
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root",
           "USER": "root", "LOGNAME": "root", "SHELL": "/bin/bash", "LANG": "C.UTF-8",
           "PIP_CONFIG_FILE": os.devnull, MARKER: "1"}
    env.update({k: host[k] for k in NETWORK_ENV if host.get(k)})
    if wheels is not None:
        env["SCHEDLAB_TORCH_INDEX"] = str(wheels)
    return env


# ------------------------------------------------------------------ inside (a private mount namespace)
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC = 32, 4096, 16384
MNT_DETACH = 2
_libc = ctypes.CDLL(None, use_errno=True)


def _mount(source: str, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    if _libc.mount(source.encode(), target.encode(), fstype.encode() if fstype else None, flags,
                   data.encode() if data else None):
        e = ctypes.get_errno()
        raise OSError(e, f"mount {source} on {target} ({fstype or 'bind'}): {os.strerror(e)}")


def enter(root: str, wheels: str, cwd: str, argv: list[str], env: dict[str, str]) -> None:
    """Runs in the new mount namespace (`unshare --mount --propagation private`): makes `root`
    this namespace's root as a booted machine's would be, then execs `argv` in `cwd`."""
    _mount(root, root, None, MS_BIND)  # pivot_root needs a mount point
    os.makedirs(f"{root}/.oldroot", exist_ok=True)
    os.chdir(root)
    r = subprocess.run(["pivot_root", ".", ".oldroot"], capture_output=True, text=True)
    if r.returncode:
        raise OSError(f"pivot_root {root}: {r.stderr.strip()}")
    os.chdir("/")
    nosuid = MS_NOSUID | MS_NODEV | MS_NOEXEC
    _mount("proc", "/proc", "proc", nosuid)
    _mount("sysfs", "/sys", "sysfs", nosuid)
    if os.path.ismount("/.oldroot/sys/fs/cgroup"):  # what this machine's init mounted there
        _mount("/.oldroot/sys/fs/cgroup", "/sys/fs/cgroup", None, MS_BIND | MS_REC)
    _mount("devtmpfs", "/dev", "devtmpfs", MS_NOSUID, "mode=755")
    os.makedirs("/dev/pts", exist_ok=True)
    _mount("devpts", "/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC, "newinstance,ptmxmode=0666,mode=620,gid=5")
    _mount("/dev/pts/ptmx", "/dev/ptmx", None, MS_BIND)  # ptys from this instance (Mininet's shells)
    os.makedirs("/dev/shm", exist_ok=True)
    _mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777")
    _mount("tmpfs", "/run", "tmpfs", MS_NOSUID | MS_NODEV, "mode=755")
    os.makedirs("/run/lock", mode=0o1777, exist_ok=True)
    _mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777")
    if wheels:
        os.makedirs(wheels, exist_ok=True)
        _mount(f"/.oldroot{wheels}", wheels, None, MS_BIND)
        _mount(wheels, wheels, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
    if _libc.umount2(b"/.oldroot", MNT_DETACH):
        e = ctypes.get_errno()
        raise OSError(e, f"umount /.oldroot: {os.strerror(e)}")
    os.rmdir("/.oldroot")
    os.chdir(cwd)
    os.execvpe(argv[0], argv, env)


def enter_argv(root: Path, argv: Sequence[str], wheels: Path | None, cwd: str = INSIDE_REPO) -> list[str]:
    """The command that runs `argv` inside `root` (this module's `enter`, in a new mount namespace)."""
    return ["unshare", "--mount", "--propagation", "private", "--", sys.executable, "-m", "emu.testbed.freshos",
            "enter", str(root), str(wheels or ""), cwd, "--", *argv]


# ------------------------------------------------------------------ processes and the lock
def inside_processes(root: Path) -> list[int]:
    """Processes whose root directory is `root` (every process of a step, Mininet's hosts too)."""
    want = os.stat(root)
    found = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                st = os.stat(f"/proc/{d}/root")
            except OSError:
                continue
            if (st.st_dev, st.st_ino) == (want.st_dev, want.st_ino):
                found.append(int(d))
    return found


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"


def kill_inside(root: Path, grace_s: float = 5.0) -> list[str]:
    """Kills what is still running inside `root` (SIGTERM, then SIGKILL); what it found."""
    pids = inside_processes(root)
    found = [f"{p} {_cmdline(p)}" for p in pids]
    for sig in (signal.SIGTERM, signal.SIGCONT):
        for p in pids:
            try:
                os.kill(p, sig)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + grace_s
    while inside_processes(root) and time.monotonic() < deadline:
        time.sleep(0.1)
    for p in inside_processes(root):
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace_s
    while inside_processes(root) and time.monotonic() < deadline:
        time.sleep(0.1)
    return found


class NetworkLock:
    """This machine's one-network lock (docs/design.md: One network at a time), held while a
    step inside builds networks: their interfaces are this kernel's, the lock inside is not this machine's."""

    def __init__(self, root: Path = STATE_ROOT):
        self.path = root / "network.lock"
        self._f = None

    def __enter__(self) -> NetworkLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._f = open(self.path, "a+")
        try:
            fcntl.flock(self._f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._f.seek(0)
            say(f"waiting for the run of orchestrator {self._f.read().strip() or '?'} to release the network "
                f"({self.path})")
            fcntl.flock(self._f, fcntl.LOCK_EX)
        self._f.seek(0)
        self._f.truncate()
        self._f.write(str(os.getpid()))
        self._f.flush()
        return self

    def __exit__(self, *exc) -> None:
        self._f.close()


def run_step(root: Path, step: Step, env: dict[str, str], wheels: Path | None, timeout_s: float) -> None:
    """One step inside `root`, timed; a Ctrl-C is passed on to it and waited for (its networks
    come down), then raised."""
    venv_stamp = root / INSIDE_REPO.lstrip("/") / ".venv" / ".requirements.sha256"
    had_venv = venv_stamp.exists()
    say(f"{step.name}: {' '.join(step.argv)}")
    t0, w0 = time.monotonic(), time.time()
    p = subprocess.Popen(enter_argv(root, step.argv, wheels), stdin=subprocess.DEVNULL, env=env,
                         start_new_session=True)
    interrupted = None
    try:
        try:
            p.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            step.notes.append(f"timed out after {timeout_s:g} s")
            _stop(p)
    except KeyboardInterrupt as e:
        interrupted = e
        say(f"{step.name}: interrupted, waiting for it to tear down")
        _stop(p)
    finally:
        step.rc = p.wait()
        step.wall_s = time.monotonic() - t0
        left = kill_inside(root)
        if left:
            step.notes.append(f"left running inside (killed): {'; '.join(left)}")
    if not had_venv and venv_stamp.exists():
        step.setup_s = venv_stamp.stat().st_mtime - w0
    if interrupted is not None:
        raise interrupted


def _stop(p: subprocess.Popen) -> None:
    """SIGINT to the step's process group (the harness tears its network down), then SIGTERM, then SIGKILL."""
    for sig, wait_s in ((signal.SIGINT, 60), (signal.SIGTERM, 30), (signal.SIGKILL, 10)):
        try:
            os.killpg(p.pid, sig)
        except ProcessLookupError:
            return
        try:
            p.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


# ------------------------------------------------------------------ the task
def steps(full: bool = False) -> list[Step]:
    """The README's first command, `./inv doctor` (the machine check a user would run next; the
    fresh OS stands in for the VM's Debian 12), then the fast tier (or, `full`, the README's test
    command)."""
    tests = Step("full suite", ["./inv", "test"], network=True) if full else \
        Step("fast tier", ["./inv", "test", "--fast"], network=False)
    return [Step("demo", ["./inv", "demo"], network=True), Step("doctor", ["./inv", "doctor"], network=True), tests]


def run(full: bool = False, keep: bool = False, rebuild: bool = False, wheels: Path | None = WHEELS,
        timeouts: dict[str, float] | None = None, report: Callable[[str], None] = say) -> list[Step]:
    """Builds (or reuses) the root file system and runs the steps in it; the steps, timed."""
    if wheels is not None and not wheels.is_dir():
        wheels = None
    timeouts = {**STEP_TIMEOUT_S, **(timeouts or {})}
    old_term = signal.signal(signal.SIGTERM, _terminate_as_interrupt)  # a SIGTERM cleans up as a Ctrl-C does
    try:
        return _run(full, keep, rebuild, wheels, timeouts, report)
    finally:
        signal.signal(signal.SIGTERM, old_term)


def _terminate_as_interrupt(signum, _frame):
    raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")


def _run(full: bool, keep: bool, rebuild: bool, wheels: Path | None, timeouts: dict[str, float],
         report: Callable[[str], None]) -> list[Step]:
    t0 = time.monotonic()
    tarball, built = rootfs_tarball(rebuild=rebuild)
    build = Step("build", mmdebstrap_argv(tarball), network=False, rc=0, wall_s=time.monotonic() - t0)
    report(f"build: {build.wall_s:.1f} s ({'mmdebstrap' if built else 'cached'}: {tarball})")
    t0 = time.monotonic()
    root = unpack(tarball)
    try:
        sha = committed_tree(root)
        network_settings(root)
        report(f"unpack: {time.monotonic() - t0:.1f} s ({root}, HEAD {sha} in {INSIDE_REPO})")
        env = inside_env(wheels=wheels)
        done = [build]
        for step in steps(full):
            if step.network:
                with NetworkLock():
                    run_step(root, step, env, wheels, timeouts[step.name])
            else:
                run_step(root, step, env, wheels, timeouts[step.name])
            done.append(step)
            setup = f", set-up {step.setup_s:.1f} s of it" if step.setup_s is not None else ""
            report(f"{step.name}: {'ok' if step.ok else 'FAILED'} in {step.wall_s:.1f} s{setup} "
                   f"(exit {step.rc}){''.join('; ' + n for n in step.notes)}")
        return done
    finally:
        kill_inside(root)
        if keep:
            report(f"kept: {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


def _main(args: list[str]) -> None:
    """`python -m emu.testbed.freshos enter ROOT WHEELS CWD -- ARGV...`, as `enter_argv` builds it."""
    if len(args) < 5 or args[0] != "enter" or args[4] != "--":
        raise SystemExit("usage: python -m emu.testbed.freshos enter ROOT WHEELS CWD -- ARGV...")
    env = {k: v for k, v in os.environ.items()}
    enter(args[1], args[2], args[3], args[5:], env)


if __name__ == "__main__":
    _main(sys.argv[1:])
