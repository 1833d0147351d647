#!/usr/bin/env bash
# Set up sandbox-kernel on a fresh Debian/Ubuntu machine, idempotently:
# apt packages (gVisor's runsc, bubblewrap, chromium for the browser tests), a venv in .venv with the project
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

if [ ! -x .venv/bin/python ]; then
  echo "==> creating .venv with $("$PY" --version)"
  "$PY" -m venv .venv
fi
echo "==> pip install -e '.[notebooks,test,e2b,modal,agents]'"
.venv/bin/python -m pip install -q --upgrade pip 2>&1 | grep -v -i warning || true
.venv/bin/python -m pip install -q -e '.[notebooks,test,e2b,modal,agents]' 2>&1 | grep -v -i warning || true
.venv/bin/python -c 'import sandbox_kernel, ipykernel, numpy, pandas, matplotlib' \
  || { echo "setup: the venv is incomplete; see pip's output above" >&2; exit 1; }

echo "==> sandbox-kernel install --sys-prefix"
.venv/bin/sandbox-kernel install --sys-prefix
.venv/bin/sandbox-kernel doctor

if [ -n "$run_nb" ]; then
  echo "==> sandbox-kernel run $run_nb"
  .venv/bin/sandbox-kernel run "$run_nb"
fi
