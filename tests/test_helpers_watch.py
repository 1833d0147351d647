"""Which host processes are a local sandbox's runtime helpers (gVisor's gofer and sentry).

The helper watch (``watches.end_on_helper_death``) ends a sandbox whose gofer or sentry
died.  While they boot, runsc's gofer and sentry fork children that carry their parent's
name for a few milliseconds (seen as root and rootless, runsc 20240729); one such child
ending must not read as its parent's death.  Real processes here, named as runsc names
them; no sandbox is needed to tell them apart.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

from sandbox_kernel.backends.local.gvisor import Gvisor
from sandbox_kernel.backends.local.sandbox import LocalSandbox

#: A "runsc-gofer" that forks a child, which sleeps under the same name until it is killed.
GOFER = ("import os, sys, time\n"
         "pid = os.fork()\n"
         "if pid == 0:\n    time.sleep(60); os._exit(0)\n"
         "print(pid, flush=True)\ntime.sleep(60)\n")


def test_a_helpers_own_child_of_its_name_is_not_a_helper(tmp_path: Path):
    state_dir = tmp_path / "sandbox-kernel-k-1"
    state_dir.mkdir()
    sb = SimpleNamespace(state_dir=state_dir, runtime=SimpleNamespace(helpers=Gvisor.helpers))
    gofer = subprocess.Popen(["runsc-gofer", "-c", GOFER, f"--root={state_dir}/runsc"], executable=sys.executable,
                             stdout=subprocess.PIPE, text=True)
    sentry = subprocess.Popen(["runsc-sandbox", "-c", "import time; time.sleep(60)", f"--root={state_dir}/runsc"],
                              executable=sys.executable)
    child = 0
    try:
        assert gofer.stdout is not None
        child = int(gofer.stdout.readline())
        deadline = time.monotonic() + 30
        while (found := LocalSandbox.helper_pids(sb)) != {gofer.pid: Gvisor.helpers["runsc-gofer"],  # type: ignore[arg-type]
                                                          sentry.pid: Gvisor.helpers["runsc-sandbox"]}:
            assert time.monotonic() < deadline, found
            time.sleep(0.05)
        assert child not in found  # the gofer's child, of its name, is not watched
    finally:
        if child:
            os.kill(child, signal.SIGKILL)
        for p in (gofer, sentry):
            p.kill()
            p.wait()
