"""Every way the interpreter can end between cells is told (issue 18 item 5, case C14 as a kind).

A stock kernel that ends is restarted by the frontend's kernel manager, which
shows it; here the proxy restarts the interpreter (or replaces the sandbox) by
itself, so it must say so: the frontend sees ``status: starting`` and the next
cell starts with a notice naming the cause and that state was lost, never a
bare ``NameError``.  Each way runs on both local runtimes.
"""

from __future__ import annotations

import pytest
from kernels import Kernel
from test_cases import _wait_iopub_status

#: way -> (cell that ends the interpreter after it finished, words the notice must hold)
WAYS = {
    "exit()": ("exit()", "exit code 0"),
    "quit()": ("quit()", "exit code 0"),
    "os._exit in a thread": ("import os, threading; threading.Timer(0.5, os._exit, (3,)).start()", "exit code 3"),
    "SIGKILL from another process": (
        "import os, subprocess; subprocess.Popen(['sh', '-c', f'sleep 0.5; kill -9 {os.getpid()}'])", "SIGKILL"),
    "memory limit while idle": (
        "import threading, time\n"
        "def grow():\n"
        "    time.sleep(0.5); hog = []\n"
        "    while True: hog.append(b'x' * (16 << 20))\n"
        "threading.Thread(target=grow, daemon=True).start()", "memory limit 384 MiB"),
}


@pytest.fixture(scope="module")
def small(install_kernelspec):
    return {rt: install_kernelspec(rt, "end", memory_mib=384) for rt in ("gvisor", "bubblewrap")}


@pytest.mark.parametrize("way", list(WAYS))
def test_the_next_cell_is_told_why_and_that_state_was_lost(runtime, small, way):
    cell, cause = WAYS[way]
    k = Kernel(small[runtime])
    try:
        assert k.execute("w = 3").status == "ok"
        k.execute(cell)  # exit() ends it as its cell finishes; the others a moment later
        _wait_iopub_status(k, "starting", timeout=90)  # the frontend sees the restart
        r = k.execute("print(w)", timeout=180)
        assert cause in r.stderr, (way, r.stderr)
        assert "lost" in r.stderr, (way, r.stderr)
        assert r.ename == "NameError", (way, r.reply["content"])
        assert k.execute("w = 4; w").result_text == "4"
        assert k.execute("print(w)").stderr == ""  # told once
    finally:
        k.shutdown()
