"""Pre-started proxies (issue 15): a kernel launched on a spare that did its imports.

Real kernels through ``jupyter_client`` with kernelspecs written by ``sandbox-kernel
install --prestart 1``: the second launch of a kernelspec in this process is handed to
the spare the first one started (the kernel's pid is the spare's), and works as any
kernel: the frontend's key, its working directory (the notebook's folder, exposed as
the workspace), its stdout/stderr for the kernel's log, interrupts, restarts.  A spare
never serves another kernelspec, and none outlives the process that started it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from kernels import Kernel
from sandbox_kernel import cli
from sandbox_kernel.prestart import SPARES, SparePool

RUNTIME = "bubblewrap"  # the proxy is what is pre-started: the runtime does not matter here


def _install(prefix: str, name: str, *extra: str) -> str:
    assert cli.main(["install", "--prefix", prefix, "--name", name, "--runtime", RUNTIME, *extra]) == 0
    return name


def _spare_pids() -> set[int]:
    return {s.proc.pid for group in SPARES._spares.values() for s in group if s.alive()}


def _python_procs_of(pids: set[int]) -> set[int]:
    return {p for p in pids if Path(f"/proc/{p}").exists()}


def _start_spare(name: str, **start_kwargs) -> None:
    """Launch ``name`` once (which starts its spare) and wait until the spare is ready.

    In the test's own phase: a spare serves launches whose environment equals its own, and
    pytest's ``PYTEST_CURRENT_TEST`` differs between a fixture and the test."""
    Kernel(name, **start_kwargs).shutdown()
    assert SPARES.wait_ready(60) >= 1


@pytest.fixture
def prestarted(kernelspec_prefix):
    """A ``--prestart 1`` kernelspec; every spare ended at teardown."""
    yield _install(kernelspec_prefix, "sandbox-test-prestart")
    SPARES.close()


def test_install_names_the_provisioner_and_jupyter_lists_the_kernel(kernelspec_prefix):
    _install(kernelspec_prefix, "sandbox-test-prestart-listed", "--prestart", "2")
    spec = json.loads((Path(kernelspec_prefix) / "share/jupyter/kernels/sandbox-test-prestart-listed/kernel.json")
                      .read_text())
    assert spec["metadata"]["kernel_provisioner"] == {"provisioner_name": "sandbox-kernel-prestarted",
                                                      "config": {"spares": 2}}
    out = subprocess.run([sys.executable, "-m", "jupyter", "kernelspec", "list", "--json"],
                         capture_output=True, text=True, check=True, env=os.environ).stdout
    assert "sandbox-test-prestart-listed" in json.loads(out)["kernelspecs"]
    _install(kernelspec_prefix, "sandbox-test-prestart-none", "--prestart", "0")
    spec = json.loads((Path(kernelspec_prefix) / "share/jupyter/kernels/sandbox-test-prestart-none/kernel.json")
                      .read_text())
    assert "kernel_provisioner" not in spec["metadata"]
    assert cli.main(["install", "--prefix", kernelspec_prefix, "--prestart", "-1"]) == 2


def test_a_launch_is_handed_to_the_spare_and_works_as_any_kernel(prestarted, tmp_path):
    _start_spare(prestarted)
    spares = _spare_pids()
    assert len(spares) == 1
    folder = tmp_path / "notebooks"
    folder.mkdir()
    (folder / "data.csv").write_text("a,b\n1,2\n")
    log = tmp_path / "kernel.log"
    with log.open("w") as out:
        # As Jupyter Server launches a notebook's kernel: cwd = the notebook's folder.
        k = Kernel(prestarted, cwd=str(folder), stdout=out, stderr=out)
    try:
        assert k.km.provisioner.pid in spares  # the spare became the kernel
        assert _spare_pids() - spares, "a replacement spare was started"
        r = k.execute("x = 41\nx += 1\nprint(x)")
        assert r.reply["content"]["status"] == "ok" and r.stdout == "42\n"
        # Interrupt reaches it (message mode, through the control channel).
        r = k.execute("import time\ntime.sleep(60)", interrupt_after=1.0, timeout=60)
        assert r.reply["content"]["ename"] == "KeyboardInterrupt"
        assert k.execute("print(x)").stdout == "42\n"
    finally:
        k.shutdown()
    # The kernel's own log went to the stdout/stderr this launch gave, not the first launch's.
    assert "sandbox started" in log.read_text()


def test_the_kernel_gets_this_launchs_folder_as_its_workspace(kernelspec_prefix, tmp_path):
    name = _install(kernelspec_prefix, "sandbox-test-prestart-ws", "--workspace", "ro")
    first, second = tmp_path / "first", tmp_path / "second"
    for d in (first, second):
        d.mkdir()
        d.chmod(0o755)
        (d / "which.txt").write_text(d.name)
        (d / "which.txt").chmod(0o644)
    _start_spare(name, cwd=str(first))  # the spare is spawned in the first's folder
    spares = _spare_pids()
    k = Kernel(name, cwd=str(second))
    try:
        assert k.km.provisioner.pid in spares
        assert k.execute("print(open('which.txt').read())").stdout == "second\n"
    finally:
        k.shutdown()
        SPARES.close()


def test_a_spare_serves_only_its_own_kernelspec(prestarted, kernelspec_prefix):
    other = _install(kernelspec_prefix, "sandbox-test-prestart-other", "--memory-mib", "768")
    _start_spare(prestarted)
    spares = _spare_pids()
    k = Kernel(other)
    try:
        assert k.km.provisioner.pid not in spares  # a new process: another policy
        assert k.sandbox_info()["limits"]["memory_mib"] == 768
        assert spares <= _spare_pids()  # the first kernelspec's spare still waits
    finally:
        k.shutdown()


def test_a_restart_takes_the_next_spare_and_says_state_is_gone(prestarted):
    _start_spare(prestarted)
    k = Kernel(prestarted)
    try:
        k.execute("x = 1")
        SPARES.wait_ready(60)
        spares = _spare_pids()
        k.km.restart_kernel(now=False)
        k.kc.wait_for_ready(timeout=120)
        assert k.km.provisioner.pid in spares
        r = k.execute("print('x' in dir())")
        assert r.stdout == "False\n"
    finally:
        k.shutdown()


def test_a_launch_whose_output_is_a_pipe_gets_a_new_process(prestarted):
    _start_spare(prestarted)
    spares = _spare_pids()
    k = Kernel(prestarted, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert k.km.provisioner.pid not in spares
        assert k.execute("print(1 + 1)").stdout == "2\n"
    finally:
        k.shutdown()


def test_spares_and_their_kernels_end_with_the_process_that_started_them(prestarted):
    # A server process that starts a kernel (and so a spare), a second kernel on that
    # spare (and so another spare), then dies without shutting anything down.
    server = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import time
        from jupyter_client.manager import KernelManager
        from sandbox_kernel.client.transport import local_manager
        from sandbox_kernel.prestart import SPARES
        kms = []
        for _ in range(2):
            km = local_manager({prestarted!r}, KernelManager)
            km.start_kernel()
            kc = km.client()
            kc.start_channels()
            kc.wait_for_ready(timeout=120)
            kms.append(km)
            SPARES.wait_ready(60)
        print(*[km.provisioner.pid for km in kms], flush=True)
        print(*[s.proc.pid for g in SPARES._spares.values() for s in g], flush=True)
        time.sleep(600)
        """)], stdout=subprocess.PIPE, text=True, env=os.environ)
    try:
        kernels = {int(p) for p in server.stdout.readline().split()}
        spares = {int(p) for p in server.stdout.readline().split()}
        assert len(kernels) == 2 and len(spares) == 1
        assert _python_procs_of(kernels | spares) == kernels | spares
    finally:
        server.send_signal(signal.SIGKILL)
        server.wait()
    # As stock kernels do (ipykernel's parent poller), the kernel handed to a spare ends
    # with its launcher; the spare ends when its hand-over socket closes.
    deadline = time.monotonic() + 15
    while _live(kernels | spares) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _live(kernels | spares) == set()


def _live(pids: set[int]) -> set[int]:
    """Those of ``pids`` still running (a zombie waiting for init to reap it is not)."""
    live = set()
    for p in _python_procs_of(pids):
        try:
            state = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            live.add(p)
    return live


def test_close_ends_every_spare_and_leaves_no_process(kernelspec_prefix):
    pool = SparePool()
    template = [sys.executable, "-m", "sandbox_kernel", "-f", "{connection_file}"]
    pool.fill(("k",), template, dict(os.environ), 2)
    assert pool.wait_ready(60) == 2
    pids = {s.proc.pid for g in pool._spares.values() for s in g}
    pool.close()
    assert _python_procs_of(pids) == set()
