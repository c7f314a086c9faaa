#!/usr/bin/env bash
# Idempotent set-up of everything the harness needs on a Debian/Ubuntu machine:
# system packages (Mininet, iperf3, tc, bridge tools) and a virtual environment with
# the locked Python dependencies. Each step is skipped when already satisfied, so a
# second run costs well under a second.
#
# requirements.txt is the lock file: every package pinned, compiled by pip-tools from the
# direct dependencies in pyproject.toml (its header has the command; run it again after
# changing pyproject.toml). SCHEDLAB_VENV=DIR sets the environment up in DIR instead of
# .venv, e.g. to try a new lock without touching the environment in use.
#
# `scripts/setup.sh ray` also installs the optional Ray group from its own lock,
# requirements-ray.txt (compiled against requirements.txt, so the two agree): the first
# `./inv sweep FILE --ray ...` runs it, and so does every node of a Ray cluster.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv="${SCHEDLAB_VENV:-$root/.venv}"
lock="$root/requirements.txt"

# Commands the harness calls -> the Debian package that provides each.
declare -A need=(
  [mn]=mininet [mnexec]=mininet [iperf3]=iperf3 [brctl]=bridge-utils
  [tc]=iproute2 [ip]=iproute2 [ifconfig]=net-tools [ethtool]=ethtool
  [cgcreate]=cgroup-tools [cgclassify]=cgroup-tools [sysctl]=procps
)
missing=()
for cmd in "${!need[@]}"; do
  command -v "$cmd" >/dev/null 2>&1 || missing+=("${need[$cmd]}")
done
/usr/bin/python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || missing+=(python3-venv)
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "setup: missing system packages (${missing[*]}); run as root (sudo ./inv ...) so they can be installed" >&2
    exit 2
  fi
  pkgs=$(printf '%s\n' "${missing[@]}" | sort -u | tr '\n' ' ')
  echo "setup: installing system packages: $pkgs" >&2
  export DEBIAN_FRONTEND=noninteractive
  log=$(mktemp)
  # shellcheck disable=SC2086
  if ! { apt-get update -qq && apt-get install -y -qq --no-install-recommends $pkgs; } >"$log" 2>&1; then
    cat "$log" >&2; rm -f "$log"; echo "setup: apt-get failed (output above)" >&2; exit 1
  fi
  rm -f "$log"
fi

# The stamp is the lock's hash: a changed lock (a pull, a re-compile) installs again.
stamp="$venv/.requirements.sha256"
want=$(sha256sum "$lock" | cut -d' ' -f1)
if [ ! -x "$venv/bin/python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "setup: installing requirements.txt into $venv (about a minute the first time)" >&2
  # System site-packages: Debian's mininet library lives there.
  [ -x "$venv/bin/python" ] || /usr/bin/python3 -m venv --system-site-packages "$venv"
  # PIP_EXTRA_ARGS: e.g. the index that serves torch's CPU build (see the Vagrantfile).
  # shellcheck disable=SC2086
  if ! "$venv/bin/python" -m pip install -q --disable-pip-version-check ${PIP_EXTRA_ARGS:-} -r "$lock" >&2; then
    echo "setup: pip could not install requirements.txt (output above). If it is torch: the lock has its" \
         "CPU build ($(grep -m1 '^torch==' "$lock")), which PyPI does not serve; pass an index that does" \
         "in PIP_EXTRA_ARGS, as the Vagrantfile does" >&2
    exit 1
  fi
  echo "$want" > "$stamp"
fi

# Optional groups, named on the command line: each its own lock and stamp.
for group in "$@"; do
  case "$group" in
    ray) glock="$root/requirements-ray.txt" ;;
    *) echo "setup: unknown optional group '$group' (known: ray)" >&2; exit 2 ;;
  esac
  gstamp="$venv/.requirements-$group.sha256"
  gwant=$(sha256sum "$glock" | cut -d' ' -f1)
  if [ "$(cat "$gstamp" 2>/dev/null)" != "$gwant" ]; then
    echo "setup: installing $(basename "$glock") (optional group $group) into $venv" >&2
    log=$(mktemp)
    # shellcheck disable=SC2086
    if ! "$venv/bin/python" -m pip install -q --disable-pip-version-check ${PIP_EXTRA_ARGS:-} -r "$glock" \
        >"$log" 2>&1; then
      cat "$log" >&2; rm -f "$log"; echo "setup: pip could not install $(basename "$glock") (output above)" >&2
      exit 1
    fi
    rm -f "$log"
    echo "$gwant" > "$gstamp"
  fi
done
