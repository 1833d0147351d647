#!/usr/bin/env bash
# Set up sandbox-kernel on a fresh Debian/Ubuntu machine, idempotently:
# apt packages (gVisor's runsc, bubblewrap, chromium for the browser tests), a current runsc from
# Debian 13's archive where the system's is too old for systrap, a venv in .venv with the project
# and the libraries the notebooks use, and the "Python 3 (sandbox: local)"
# kernelspec inside the venv.  With --run NOTEBOOK, also execute it through
# the sandboxed kernel (the executed copy goes to out/).
set -euo pipefail
cd "$(dirname "$0")/.."

run_nb=""
if [ "${1:-}" = "--run" ]; then run_nb="${2:?--run needs a notebook path}"; fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
need=()
command -v runsc >/dev/null || need+=(runsc)
command -v bwrap >/dev/null || need+=(bubblewrap)
command -v cc >/dev/null || need+=(gcc)   # builds the statx shim gVisor 20221219 needs for ls/stat
[ -x /usr/bin/chromium ] || need+=(chromium)   # tests/browser: JupyterLab in headless Chromium (Playwright)
PY=${PYTHON:-python3}
"$PY" -c 'import venv, ensurepip' 2>/dev/null || need+=(python3-venv)
if [ ${#need[@]} -gt 0 ]; then
  echo "==> apt-get install ${need[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi

# gVisor's systrap platform (system calls ~30x cheaper than ptrace) needs a runsc from 2023 or later;
# Debian 12's is 20221219.  Then Debian 13's runsc package (one static binary) is fetched from
# Debian's archive with a private apt sources list (the system's apt setup stays untouched), its
# signature checked by apt, and its binary installed at $PRIVATE_RUNSC, outside PATH: sandbox-kernel
# prefers it (LocalBackend.runsc_path overrides).  SANDBOX_KERNEL_NO_RUNSC_FETCH=1 skips this.
PRIVATE_RUNSC=/usr/local/lib/sandbox-kernel/runsc
runsc_date() { "$1" --version 2>/dev/null | grep -o '20[0-9]\{6\}' | head -1 || true; }
sys_date=$(runsc_date "$(command -v runsc || echo /nonexistent)")
if [ -z "${SANDBOX_KERNEL_NO_RUNSC_FETCH:-}" ] && [ ! -x "$PRIVATE_RUNSC" ] && [ "${sys_date:-0}" -lt 20230601 ]; then
  echo "==> runsc ${sys_date:-missing} has no systrap: fetching Debian 13's runsc into $PRIVATE_RUNSC"
  d=$(mktemp -d); chmod 755 "$d"; mkdir -p "$d/lists/partial" "$d/archives/partial" "$d/parts"
  echo "deb http://deb.debian.org/debian trixie main" > "$d/sources.list"
  apt_private=(-o "Dir::Etc::SourceList=$d/sources.list" -o "Dir::Etc::SourceParts=$d/parts"
               -o "Dir::State::Lists=$d/lists" -o "Dir::Cache::Archives=$d/archives" -o Debug::NoLocking=1
               -o APT::Sandbox::User=root)
  $SUDO apt-get "${apt_private[@]}" update -qq
  (cd "$d" && $SUDO apt-get "${apt_private[@]}" download runsc >/dev/null)
  dpkg-deb -x "$d"/runsc_*.deb "$d/x"
  $SUDO install -D -m 0755 "$d/x/usr/bin/runsc" "$PRIVATE_RUNSC"
  $SUDO rm -rf "$d"
  echo "    $("$PRIVATE_RUNSC" --version | head -1)"
fi

if [ ! -x .venv/bin/python ]; then
  echo "==> creating .venv with $("$PY" --version)"
  "$PY" -m venv .venv
fi
echo "==> pip install -e '.[notebooks,test,e2b,modal,agents,ray]'"
.venv/bin/python -m pip install -q --upgrade pip 2>&1 | grep -v -i warning || true
.venv/bin/python -m pip install -q -e '.[notebooks,test,e2b,modal,agents,ray]' 2>&1 | grep -v -i warning || true
.venv/bin/python -c 'import sandbox_kernel, ipykernel, numpy, pandas, matplotlib' \
  || { echo "setup: the venv is incomplete; see pip's output above" >&2; exit 1; }

echo "==> sandbox-kernel install --sys-prefix"
.venv/bin/sandbox-kernel install --sys-prefix

# The sandbox service (root): ordinary users' kernels get cgroup limits, pause, checkpoint and
# restore through it (README, "As an ordinary user").  Installed as a systemd unit where systemd
# runs and this is root or sudo works without a password; SANDBOX_KERNEL_NO_SERVICE=1 skips it.
if [ -n "${SANDBOX_KERNEL_NO_SERVICE:-}" ]; then
  echo "==> sandbox service skipped (SANDBOX_KERNEL_NO_SERVICE): ordinary users' kernels run rootless gVisor"
elif [ -d /run/systemd/system ] && { [ -z "$SUDO" ] || sudo -n true 2>/dev/null; }; then
  echo "==> sandbox service: systemd unit sandbox-kernel.service (SANDBOX_KERNEL_NO_SERVICE=1 skips it)"
  $SUDO .venv/bin/sandbox-kernel service --install-unit
  $SUDO systemctl daemon-reload
  $SUDO systemctl enable --now sandbox-kernel
else
  echo "==> sandbox service not installed (no systemd here, or no root/sudo): ordinary users' kernels run"
  echo "    rootless gVisor; to serve them, run as root: .venv/bin/sandbox-kernel service"
fi
.venv/bin/sandbox-kernel doctor

if [ -n "$run_nb" ]; then
  echo "==> sandbox-kernel run $run_nb"
  .venv/bin/sandbox-kernel run "$run_nb"
fi
