"""The idle lifecycle through installed kernelspecs: cases C10, C11, C12 and no orphans.

Idle times are seconds here (pause after ~1.5 s, checkpoint/stop after ~4 s)
so the whole file runs in a few minutes.  Every cell runs inside a sandbox.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time

import pytest
from kernels import Kernel
from sandbox_kernel.backends.local.layout import state_base
from sandbox_kernel.backends.local.procs import processes_mentioning


@pytest.fixture(scope="module")
def idle_specs(install_kernelspec) -> dict[str, str]:
    return {
        "gvisor": install_kernelspec("gvisor", "idle", pause_after_s=1.5, checkpoint_after_s=4),
        # bubblewrap cannot checkpoint: the checkpoint level becomes a stop with the notice
        "bubblewrap": install_kernelspec("bubblewrap", "idle", pause_after_s=1.5, checkpoint_after_s=4),
    }


def test_gvisor_freeze_and_checkpoint_keep_memory_and_files(start_kernel, idle_specs):
    """C10 + C11 on gVisor: five cycles (freeze, checkpoint, ...), state and files intact."""
    k = start_kernel(idle_specs["gvisor"])
    r = k.execute('x = 41; open("f.txt", "w").write("a")')
    assert r.status == "ok"
    latencies = []
    for i, level in enumerate(["paused", "checkpointed", "paused", "checkpointed", "paused"]):
        k.wait_state(level)
        r = k.execute("x += 1; x")
        assert r.status == "ok", r.reply
        assert r.result_text == str(42 + i)
        verb = "restored from a checkpoint" if level == "checkpointed" else "resumed from pause"
        assert verb in r.stderr, r.stderr
        latencies.append((level, round(r.elapsed_s, 3)))
    r = k.execute('x, open("f.txt").read()')
    assert r.result_text == "(46, 'a')"
    info = k.sandbox_info()
    assert info["idle"]["counts"] == {"pause": 5, "resume": 3, "checkpoint": 2, "restore": 2}
    assert {"pause_s", "resume_s", "checkpoint_s", "restore_s"} <= set(info["timings_s"])
    print(f"\ngVisor cell latency after each wake (s): {latencies}; last timings: {info['timings_s']}")


def test_bubblewrap_freeze_keeps_state_then_stop_gives_a_notice(start_kernel, idle_specs):
    """C10 + C11 on bubblewrap: freeze keeps memory; the second level is a stop with a notice."""
    k = start_kernel(idle_specs["bubblewrap"])
    assert k.execute('x = 41; open("f.txt", "w").write("a")').status == "ok"
    latencies = []
    for i in range(3):
        k.wait_state("paused")
        r = k.execute("x += 1; x")
        assert r.result_text == str(42 + i) and "resumed from pause" in r.stderr
        latencies.append(round(r.elapsed_s, 3))
    assert k.execute('x, open("f.txt").read()').result_text == "(44, 'a')"
    k.wait_state("stopped", timeout=30)
    r = k.execute("'x' in dir()")
    assert r.status == "ok"
    assert r.result_text == "False"
    assert r.stderr.startswith("sandbox-kernel: sandbox stopped after 4 s idle; state was lost; this is a fresh interpreter")
    assert k.execute("1 + 1").result_text == "2"  # usable, and no second notice
    print(f"\nbubblewrap cell latency after each thaw (s): {latencies}")


#: A thread started by a cell that goes on after the cell ends: it records the monotonic clock
#: every 0.2 s for 5 s (more than three pause windows of 1.5 s), printing each second or not.
WORKER = """
import threading, time
ticks = []
def work(printing):
    end = time.monotonic() + 5
    while time.monotonic() < end:
        ticks.append(time.monotonic())
        if printing and len(ticks) % 5 == 0:
            print('tick', len(ticks), flush=True)
        t = time.monotonic() + 0.2
        while time.monotonic() < t:
            if printing:
                time.sleep(0.05)
threading.Thread(target=work, args=({printing},), daemon=True).start()
"""


@pytest.mark.parametrize("printing", [True, False], ids=["printing", "silent-busy"])
def test_a_thread_at_work_after_its_cell_keeps_the_sandbox_awake(start_kernel, idle_specs, printing):
    """Idle as users mean it (issue 33): a thread that prints every second, or one that
    computes without a word, after its cell has ended, is work; the sandbox is not frozen
    under it (pause_after_s is 1.5 s here) and pauses once it is done."""
    k = start_kernel(idle_specs["bubblewrap"])
    assert k.execute(WORKER.format(printing=printing)).status == "ok"
    time.sleep(6)
    r = k.execute("import json; print(json.dumps(ticks))")
    assert r.status == "ok", (r.status, r.stdout, r.stderr, r.reply)
    ticks = json.loads(r.stdout)
    gaps = [b - a for a, b in itertools.pairwise(ticks)]
    assert len(ticks) >= 20 and max(gaps) < 1.0, (len(ticks), max(gaps))  # never frozen while at work
    k.wait_state("paused", timeout=30)  # and paused once quiet


def test_notices_can_be_turned_off(start_kernel, install_kernelspec):
    name = install_kernelspec("bubblewrap", "quiet", pause_after_s=1, lifecycle_notices=False)
    k = start_kernel(name)
    k.execute("x = 1")
    k.wait_state("paused")
    r = k.execute("x")
    assert r.result_text == "1" and r.stderr == ""


def test_reconnect_a_new_client_continues_and_the_unwatched_cell_finishes(start_kernel, idle_specs):
    """C12: client 1 goes away mid-cell; client 2 sees the cell's effects and continues."""
    k = start_kernel(idle_specs["gvisor"])
    assert k.execute("x = 1").status == "ok"
    k.kc.execute("import time; time.sleep(3); y = 5")  # nobody will read its reply
    time.sleep(0.5)
    k.kc.stop_channels()
    time.sleep(1)
    k.kc = k.km.client()
    k.kc.start_channels()
    k.kc.wait_for_ready(timeout=60)
    r = k.execute("x + 1")
    assert r.result_text == "2"
    assert k.execute("y").result_text == "5"
    k.wait_state("paused")  # and after the frontend stayed away a while
    k.kc.stop_channels()
    k.kc = k.km.client()
    k.kc.start_channels()
    k.kc.wait_for_ready(timeout=60)
    assert k.execute("x + y").result_text == "6"


def _kill_proxy(k: Kernel) -> None:
    os.kill(k.km.provisioner.process.pid, signal.SIGKILL)
    k.km.provisioner.process.wait(timeout=10)
    k.kc.stop_channels()


def _gone(state_dir, timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    while (pids := processes_mentioning(str(state_dir))) and time.monotonic() < deadline:
        time.sleep(0.2)
    return pids


def _gc() -> str:
    cli = os.path.join(os.path.dirname(sys.executable), "sandbox-kernel")
    return subprocess.run([cli, "gc"], capture_output=True,
                          text=True, timeout=120).stdout


@pytest.mark.parametrize("runtime", ["gvisor", "bubblewrap"])
def test_sigkill_of_the_proxy_leaves_no_frozen_sandbox(runtime, idle_specs, kernelspec_prefix):
    """The watchdog reaps a paused sandbox (which cannot notice stdin EOF) at once."""
    k = Kernel(idle_specs[runtime])
    try:
        k.execute("x = 1")
        info = k.wait_state("paused")
        state_dir = state_base() / info["container_id"]
        assert (state_dir / "tag.json").exists()
        assert processes_mentioning(str(state_dir))
        _kill_proxy(k)
        left = _gone(state_dir, timeout=10)
        assert not left, f"{runtime} sandbox processes survived the proxy: {left}"
        _gc()
        assert not state_dir.exists()
    finally:
        k.km.cleanup_resources()


def test_without_watchdog_the_agent_exits_on_eof_and_gc_reaps(kernelspec_prefix):
    """Proxy and watchdog both SIGKILLed: runsc's agent sees EOF and ends; gc removes the rest."""
    from kernels import kernel_name_for

    k = Kernel(kernel_name_for("gvisor"))
    try:
        info = k.sandbox_info()
        state_dir = state_base() / info["container_id"]
        watchdogs = [p for p in processes_mentioning(str(state_dir))
                     if b"sandbox_kernel.backends.local.watchdog" in open(f"/proc/{p}/cmdline", "rb").read()]
        assert len(watchdogs) == 1
        os.kill(watchdogs[0], signal.SIGKILL)
        _kill_proxy(k)
        left = _gone(state_dir, timeout=15)
        assert not left, f"runsc processes survived stdin EOF: {left}"
        assert state_dir.exists()
        out = _gc()
        assert info["container_id"] in out
        assert not state_dir.exists()
    finally:
        k.km.cleanup_resources()


def test_plan_falls_through_missing_levels():
    from sandbox_kernel.backends.base import Capabilities
    from sandbox_kernel.lifecycle import Step, plan
    from sandbox_kernel.policy import Policy
    from sandbox_kernel.sandbox_state import human_duration

    full = Capabilities("x", pause_keeps_memory=True, checkpoint=True)
    freeze_only = Capabilities("x", pause_keeps_memory=True)
    nothing = Capabilities("x")
    p = Policy(pause_after_s=60, checkpoint_after_s=600, stop_after_s=3600)
    assert plan(p, full) == [Step(60, "pause"), Step(600, "checkpoint"), Step(3600, "stop")]
    assert plan(p, freeze_only) == [Step(60, "pause"), Step(600, "stop")]
    assert plan(p, nothing) == [Step(600, "stop")]
    assert plan(Policy(pause_after_s=60), Capabilities("x", checkpoint=True)) == [Step(60, "checkpoint")]
    # the defaults: freeze after 10 min, checkpoint after 1 h, never stop
    assert plan(Policy(), full) == [Step(600, "pause"), Step(3600, "checkpoint")]
    assert plan(Policy(), freeze_only) == [Step(600, "pause"), Step(3600, "stop")]
    assert plan(Policy(pause_after_s=0, checkpoint_after_s=0), full) == []
    assert [human_duration(s) for s in (4, 600, 3600, 5400)] == ["4 s", "10 min", "1 h", "1 h 30 min"]
