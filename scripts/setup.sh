#!/usr/bin/env bash
# Idempotent set-up of everything the harness needs on a Debian/Ubuntu machine:
# system packages (Mininet, iperf3, tc, bridge tools) and a virtual environment with
# the locked Python dependencies and the project itself (editable). Each step is skipped
# when already satisfied, so a second run costs well under a second.
#
#   scripts/setup.sh [--venv-only] [GROUP...]
#
# --venv-only: the virtual environment alone, no system packages and no root: what the tasks
# that build no network need (./inv --list, analyze, report, merge, the notebook).
#
# requirements.txt is the lock file: every package pinned, compiled by pip-tools from the
# direct dependencies in pyproject.toml (its header has the command; run it again after
# changing pyproject.toml). SCHEDLAB_VENV=DIR sets the environment up in DIR instead of
# .venv, e.g. outside a VM's synced folder, or to try a new lock without touching the
# environment in use.
#
# torch: the lock pins its CPU build (+cpu), which PyPI does not serve (PyPI's build of the
# same version is the CUDA one, several GB). It is installed first, on its own: from pip's
# own configuration where that finds it (a CPU-build index or wheel directory), else from
# SCHEDLAB_TORCH_INDEX (a PEP 503 index URL, a file:// URL or a directory of wheels),
# by default PyTorch's own CPU index. Only torch comes from there.
#
# `scripts/setup.sh ray` also installs the optional Ray group from its own lock,
# requirements-ray.txt (compiled against requirements.txt, so the two agree): the first
# `./inv sweep FILE --ray ...` runs it, and so does every node of a Ray cluster.
# `scripts/setup.sh jupyter` installs JupyterLab the same way, from requirements-jupyter.txt:
# the first `./inv notebook` runs it.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv="${SCHEDLAB_VENV:-$root/.venv}"
lock="$root/requirements.txt"
python="${SCHEDLAB_PYTHON:-/usr/bin/python3}"
default_torch_index="https://download.pytorch.org/whl/cpu"
system=1
if [ "${1:-}" = "--venv-only" ]; then system=0; shift; fi

# Commands the harness calls -> the Debian package that provides each.
declare -A need=(
  [mn]=mininet [mnexec]=mininet [iperf3]=iperf3 [brctl]=bridge-utils
  [tc]=iproute2 [ip]=iproute2 [ifconfig]=net-tools [ethtool]=ethtool
  [cgcreate]=cgroup-tools [cgclassify]=cgroup-tools [sysctl]=procps
)
missing=()
[ "$system" = 1 ] && for cmd in "${!need[@]}"; do
  command -v "$cmd" >/dev/null 2>&1 || missing+=("${need[$cmd]}")
done
[ -x "$venv/bin/python" ] || "$python" -c 'import ensurepip, venv' >/dev/null 2>&1 || missing+=(python3-venv)
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

# torch's CPU build, alone (see the header). Fails in seconds, with one line, where its index
# cannot be reached.
install_torch() {
  local pin version source dir args
  pin=$(grep -m1 '^torch==' "$lock")
  version=${pin#torch==}
  if "$venv/bin/python" -c 'import importlib.metadata as m, sys; sys.exit(m.version("torch") != sys.argv[1])' \
      "$version" 2>/dev/null; then
    return 0
  fi
  source="${SCHEDLAB_TORCH_INDEX:-}"
  if [ -z "$source" ]; then
    if "$venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps --retries 0 "$pin" \
        >/dev/null 2>&1; then
      return 0   # pip's own configuration has it
    fi
    source=$default_torch_index
  fi
  dir=${source#file://}
  if [ -d "$dir" ] && compgen -G "$dir/torch-*.whl" >/dev/null; then
    args=(--no-index --find-links "$dir")              # a directory of wheels
  elif [ -d "$dir" ]; then
    args=(--index-url "file://$(cd "$dir" && pwd)")    # a PEP 503 tree on disk
  else
    if ! why=$("$venv/bin/python" - "$source" 2>&1 <<'PY'
import sys, urllib.request
url = sys.argv[1].rstrip("/") + "/torch/"
try:
    urllib.request.urlopen(url, timeout=10).close()
except Exception as e:  # noqa: BLE001 - any failure is the one line below
    print(f"{type(e).__name__}: {e}")
    sys.exit(1)
PY
    ); then
      echo "setup: the index for torch's CPU build ($pin) cannot be reached: $source ($why); set" \
           "SCHEDLAB_TORCH_INDEX to an index or a directory that holds it" >&2
      return 1
    fi
    args=(--index-url "$source" --retries 1 --timeout 30)
  fi
  echo "setup: installing $pin from $source" >&2
  if ! "$venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps "${args[@]}" "$pin" >&2; then
    echo "setup: pip could not install $pin from $source (output above); set SCHEDLAB_TORCH_INDEX to an" \
         "index or a directory that holds it" >&2
    return 1
  fi
}

# The stamp is the hash of the lock and of pyproject.toml: a changed lock (a pull, a
# re-compile) installs again, and so does a changed project (its packages, installed editable).
stamp="$venv/.requirements.sha256"
want=$(cat "$lock" "$root/pyproject.toml" | sha256sum | cut -d' ' -f1)
if [ ! -x "$venv/bin/python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "setup: installing requirements.txt into $venv (about a minute the first time)" >&2
  # System site-packages: Debian's mininet library lives there.
  [ -x "$venv/bin/python" ] || "$python" -m venv --system-site-packages "$venv"
  install_torch || exit 1
  # PIP_EXTRA_ARGS: anything else pip needs here (a proxy's certificate, an index mirror).
  # shellcheck disable=SC2086
  if ! "$venv/bin/python" -m pip install -q --disable-pip-version-check ${PIP_EXTRA_ARGS:-} -r "$lock" >&2; then
    echo "setup: pip could not install requirements.txt (output above)" >&2
    exit 1
  fi
  # The project itself, editable, so that `import emu` works from anywhere and nothing edits sys.path.
  log=$(mktemp)
  if ! "$venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation \
      -e "$root" >"$log" 2>&1; then
    cat "$log" >&2; rm -f "$log"; echo "setup: pip could not install the project itself (output above)" >&2
    exit 1
  fi
  rm -f "$log"
  echo "$want" > "$stamp"
fi

# Optional groups, named on the command line: each its own lock and stamp.
for group in "$@"; do
  case "$group" in
    ray) glock="$root/requirements-ray.txt" ;;
    jupyter) glock="$root/requirements-jupyter.txt" ;;
    *) echo "setup: unknown optional group '$group' (known: ray, jupyter)" >&2; exit 2 ;;
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
