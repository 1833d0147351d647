"""Which runsc and platform gVisor sandboxes get (issue 15), with real runsc binaries.

``scripts/setup.sh`` installs a current runsc (Debian 13's) beside the
system's when that one is too old for systrap; these tests run kernels on
both: the current one on systrap by default, the old one forced to ptrace
with the statx shim.  Every cell runs inside a gVisor sandbox.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest
from sandbox_kernel.backends.local import runsc, template
from sandbox_kernel.errors import SandboxKernelError

pytestmark = [pytest.mark.sandbox,  # runs runsc (probes, ``runsc do``) without a sandbox fixture
              pytest.mark.skipif(not runsc.have_runsc() or os.geteuid() != 0, reason="gVisor needs runsc and root")]


def _date(path: str) -> int:
    out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30).stdout
    m = re.search(r"(20\d{6})", out)
    return int(m.group(1)) if m else 0


#: The system's runsc when it predates systrap (Debian 12's 20221219): the "old runsc" path.
OLD_RUNSC = next((p for p in (shutil.which("runsc"), "/usr/bin/runsc")
                  if p and os.access(p, os.X_OK) and _date(p) < 20230601), None)


def test_auto_takes_the_newest_runsc_installed_and_systrap_where_it_runs():
    choice = runsc.choose()
    assert choice.path == runsc.find_runsc()
    found = runsc.probe(choice.path)
    assert choice.platform == ("systrap" if found["systrap"] else "ptrace"), choice
    assert choice.why.startswith("auto: ")
    assert choice.statx_shim is (not found["statx_ok"])
    if os.access(runsc.PRIVATE_RUNSC, os.X_OK):  # what scripts/setup.sh installs on Debian 12
        assert choice.path == runsc.PRIVATE_RUNSC and choice.platform == "systrap"
        assert not choice.statx_shim, "Debian 13's runsc handles statx(AT_NO_AUTOMOUNT) itself"


def test_a_bad_runsc_path_is_a_clear_error():
    with pytest.raises(SandboxKernelError, match="runsc_path='/nonexistent/runsc' is not an executable"):
        runsc.choose("/nonexistent/runsc")


@pytest.mark.parametrize("runtime", ["gvisor", "auto"])
def test_a_bad_runsc_path_never_falls_back_to_bubblewrap(runtime):
    from sandbox_kernel.backends.local.sandbox import resolve_runtime
    from sandbox_kernel.errors import RuntimeUnavailable

    with pytest.raises(RuntimeUnavailable, match="runsc_path='/nonexistent/runsc' is not an executable"):
        resolve_runtime(runtime, "/nonexistent/runsc")
    assert resolve_runtime("bubblewrap", "/nonexistent/runsc").name == "bubblewrap"


@pytest.mark.skipif(OLD_RUNSC is None, reason="no runsc older than systrap on this machine")
def test_systrap_asked_of_an_old_runsc_is_a_clear_error():
    assert OLD_RUNSC is not None
    with pytest.raises(SandboxKernelError, match=r"gvisor_platform='systrap'.*cannot run it here"):
        runsc.choose(OLD_RUNSC, "systrap")


def _check_kernel(kernel, platform: str, shim: bool) -> dict:
    assert kernel.execute("a = 6 * 7").status == "ok"
    info = kernel.sandbox_info()
    g = info["gvisor"]
    assert (g["platform"], g["statx_shim"]) == (platform, shim), g
    assert f"{platform} platform" in info["boundary"] and g["version"] in info["boundary"]
    r = kernel.execute("!ls -d /proc && stat -c %F /tmp")  # coreutils' statx: the shim's case
    assert r.stdout.split() == ["/proc", "directory"], (r.stdout, r.stderr)
    r = kernel.execute("import os\nprint(a, os.getuid())")
    assert r.stdout == "42 65534\n"
    r = kernel.execute("import time\nwhile True: time.sleep(0.1)", interrupt_after=1.0)
    assert r.ename == "KeyboardInterrupt"
    assert kernel.execute("a").result_text == "42"
    return info


def test_the_default_kernel_runs_on_the_chosen_runsc(install_kernelspec, start_kernel):
    choice = runsc.choose()
    k = start_kernel(install_kernelspec("gvisor", "runsc-default"))
    info = _check_kernel(k, choice.platform, choice.statx_shim)
    assert info["gvisor"]["runsc"] == choice.path


@pytest.mark.skipif(OLD_RUNSC is None, reason="no runsc older than systrap on this machine")
def test_the_old_runsc_still_works_on_ptrace_with_the_statx_shim(install_kernelspec, start_kernel):
    assert OLD_RUNSC is not None
    templates = set(template.base_dir().glob("*")) if template.base_dir().is_dir() else set()
    k = start_kernel(install_kernelspec("gvisor", "runsc-old", runsc_path=OLD_RUNSC, gvisor_platform="ptrace",
                                        pause_after_s=0, checkpoint_after_s=2, start_template=True))
    info = _check_kernel(k, "ptrace", True)
    assert info["gvisor"]["runsc"] == OLD_RUNSC
    # its checkpoint has no --compression flag (it always compresses): the state is kept
    assert k.execute("kept = 41").status == "ok"
    k.wait_state("checkpointed", timeout=60)
    r = k.execute("kept + 1")
    assert r.result_text == "42" and "restored from a checkpoint" in r.stderr, (r.reply, r.stderr)
    # and no start template from it: this runsc's restore into another sandbox fails
    assert k.sandbox_info()["from_template"] is False
    assert (set(template.base_dir().glob("*")) if template.base_dir().is_dir() else set()) == templates
