"""The idle lifecycle: latency per level (freeze, checkpoint), memory per state."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from bench.figures._registry import IDLE_BEFORE_MEMORY_S, Figure, register
from bench.harness import Bench, Context, Running, sandbox_info, timed_cell, wait_state
from bench.procmem import du_mib, tree_memory_parts
from bench.targets import Target

#: Idle seconds of the lifecycle kernelspecs: long enough to measure a running kernel
#: (IDLE_BEFORE_MEMORY_S after its last cell) before the freeze.
LC_PAUSE_AFTER_S = 4.0
LC_CHECKPOINT_AFTER_S = 7.0


def lifecycle_target(bench: Bench, target: Target, variant: str, pause_after_s: float,
                     checkpoint_after_s: float, **options: Any) -> Target:
    """``target`` on a kernelspec (in the bench's prefix) with seconds-long idle times
    and any other ``options``."""
    from sandbox_kernel.kernelspec import install
    name = f"sandbox-bench-{target.runtime}-{variant}"
    install(name, prefix=bench.prefix, options={
        "runtime": target.runtime, "pause_after_s": pause_after_s,
        "checkpoint_after_s": checkpoint_after_s if target.runtime == "gvisor" else 0,
        "stop_after_s": 0, "spare_sandbox": False, **options})
    return dataclasses.replace(target, kernel_name=name)


def fig_lifecycle(ctx: Context, n: int) -> dict[str, list[float]]:
    """One kernel, ``n`` cycles per level: freeze (both runtimes), checkpoint (gVisor).

    Each cycle: a cell, IDLE_BEFORE_MEMORY_S idle, memory (running); the freeze
    (pause_after_s), memory (frozen); for a checkpoint cycle also the checkpoint and
    memory (checkpointed); then a cell, timed to its execute_reply, with x checked."""
    from sandbox_kernel.backends.local.layout import state_base
    target = lifecycle_target(ctx.bench, ctx.target, "idle", LC_PAUSE_AFTER_S, LC_CHECKPOINT_AFTER_S)
    levels = ["paused", "checkpointed"] if ctx.target.runtime == "gvisor" else ["paused"]
    got: dict[str, list[float]] = {}
    add = lambda name, v: got.setdefault(name, []).append(v)  # noqa: E731
    k = Running(ctx.bench, target)
    try:
        k.timer.request(lambda: k.kc.execute("x = 0", store_history=False), wait_idle=False, timeout=180)
        k.ensure_iopub()
        x = 0
        restored = False
        for _ in range(n):
            for level in levels:
                time.sleep(IDLE_BEFORE_MEMORY_S)
                info = sandbox_info(k)
                if info["state"] != "running":
                    raise RuntimeError(f"sandbox not running {IDLE_BEFORE_MEMORY_S} s after a cell: {info}")
                # a restored sandbox holds more than a fresh one: counted apart
                m = tree_memory_parts(k.pid)
                st = "restored" if restored else "running"
                add(f"mem_{st}_pss", m["pss"]); add(f"mem_{st}_rss", m["rss"])
                add(f"mem_{st}_sandbox_pss", m["sandbox_pss"])
                info = wait_state(k, "paused")
                time.sleep(0.2)
                if not restored:
                    m = tree_memory_parts(k.pid)
                    add("mem_frozen_pss", m["pss"]); add("mem_frozen_rss", m["rss"])
                    add("mem_frozen_sandbox_pss", m["sandbox_pss"])
                add("freeze_pause_backend", info["timings_s"]["pause_s"] * 1000)
                if level == "checkpointed":
                    info = wait_state(k, "checkpointed")
                    time.sleep(0.2)
                    m = tree_memory_parts(k.pid)
                    add("mem_checkpointed_pss", m["pss"]); add("mem_checkpointed_rss", m["rss"])
                    add("mem_checkpointed_sandbox_pss", m["sandbox_pss"])
                    add("checkpoint_image_mib", du_mib(state_base() / info["container_id"] / "checkpoint"))
                    add("checkpoint_backend", info["timings_s"]["checkpoint_s"] * 1000)
                x += 1
                dt = timed_cell(k, "x += 1", str(x))
                timings = sandbox_info(k)["timings_s"]
                if level == "paused":
                    add("resume_freeze", dt * 1000)
                    add("resume_freeze_backend", timings["resume_s"] * 1000)
                else:
                    restored = True
                    add("restore_checkpoint", dt * 1000)
                    add("restore_checkpoint_backend", timings["restore_s"] * 1000)
    finally:
        k.stop()
    return got


# fig_lifecycle (one run per runtime) fills all of these.
register("resume_freeze", Figure(
    "Cell on a frozen kernel: send to execute_reply", "ms", fig_lifecycle, n=8, n_quick=3,
    kind="fresh", targets=("bubblewrap", "gvisor"), rounds=4,
    note=f"A kernelspec with pause_after_s={LC_PAUSE_AFTER_S:g} (and checkpoint_after_s="
         f"{LC_CHECKPOINT_AFTER_S:g} on gVisor); once kernel_info says `paused`, `x += 1` is sent "
         "and timed until its execute_reply (thaw + relay + the cell, as the user waits for it), "
         "x checked through user_expressions. gVisor: `runsc resume`; bubblewrap: SIGCONT of "
         "the tree (or the cgroup freezer). The trivial-cell RTT of a running kernel is in "
         "`trivial_rtt`."))
register("resume_freeze_backend", Figure(
    "Thaw alone (kernel_info timings_s.resume_s)", "ms", None, n=0, n_quick=0, kind="fresh",
    produced_by="resume_freeze", targets=("bubblewrap", "gvisor"), plot=False,
    note="The backend side of the same wakes: LocalBackend.resume() + the relay's replay "
         "request, from kernel_info's sandbox.timings_s."))
register("freeze_pause_backend", Figure(
    "Freeze alone (kernel_info timings_s.pause_s)", "ms", None, n=0, n_quick=0, kind="fresh",
    produced_by="resume_freeze", targets=("bubblewrap", "gvisor"), plot=False,
    note="`runsc pause` on gVisor, SIGSTOP of the process tree (or the cgroup freezer) on "
         "bubblewrap; invisible to the user (it happens while idle)."))
register("restore_checkpoint", Figure(
    "Cell on a checkpointed kernel: send to execute_reply", "ms", None, n=0, n_quick=0,
    kind="fresh", produced_by="resume_freeze", targets=("gvisor",),
    note="As the frozen case, once kernel_info says `checkpointed` (memory written to disk by "
         "`runsc checkpoint`, the container ended): `runsc restore` of the image, the agent "
         "replaying its unacknowledged frames, then the cell. gVisor only: bubblewrap has no "
         "checkpoint (its second level is a stop)."))
register("restore_checkpoint_backend", Figure(
    "Restore launch alone (kernel_info timings_s.restore_s)", "ms", None, n=0, n_quick=0,
    kind="fresh", produced_by="resume_freeze", targets=("gvisor",), plot=False,
    note="Launching `runsc restore` and re-attaching the relay: the restore itself completes "
         "while the first request is in flight, so the cell figure is the one to read."))
register("checkpoint_backend", Figure(
    "Checkpoint alone (kernel_info timings_s.checkpoint_s)", "ms", None, n=0, n_quick=0,
    kind="fresh", produced_by="resume_freeze", targets=("gvisor",), plot=False,
    note="`runsc resume` (this runsc checkpoints a running container faster) + `runsc "
         "checkpoint` + `runsc delete`; happens while idle."))
register("checkpoint_image_mib", Figure(
    "Checkpoint image on disk", "MiB", None, n=0, n_quick=0, kind="fresh",
    produced_by="resume_freeze", targets=("gvisor",), plot=False,
    note="Allocated size of `<state>/checkpoint` (an idle ipykernel's memory, on the state "
         "directory's disk)."))


#: The memory figures the lifecycle function fills: one per state and measure.
_MEMORY_STATES = ("running", "frozen", "checkpointed", "restored")
_MEMORY_KINDS = (("pss", "PSS, whole tree"), ("rss", "RSS, whole tree"), ("sandbox_pss", "PSS, sandbox alone"))
_MEMORY_NOTES = {
    "pss": "PSS summed over the proxy kernel's whole process tree (proxy, watchdog, "
           "runtime, sandboxed processes), as `memory_idle_pss`",
    "rss": "RSS summed over the same tree (shared pages counted once per process)",
    "sandbox_pss": "PSS of the sandbox alone: the tree without the proxy process and its "
                   "watchdog (bwrap + agent + inner kernel, or runsc + gofer + Sentry + "
                   "stubs); what a pause can free"}
_STATE_NOTES = {
    "running": f", {IDLE_BEFORE_MEMORY_S:g} s after a cell, on a sandbox never checkpointed.",
    "frozen": ", once kernel_info says `paused`, on a sandbox never checkpointed.",
    "checkpointed": ", once kernel_info says `checkpointed`.",
    "restored": f", {IDLE_BEFORE_MEMORY_S:g} s after a cell, on a sandbox that was "
                "checkpointed and restored at least once."}

for _st in _MEMORY_STATES:
    for _kind, _label in _MEMORY_KINDS:
        register(f"mem_{_st}_{_kind}", Figure(
            f"Idle kernel, {'running after a restore' if _st == 'restored' else _st} ({_label})", "MiB",
            None, n=0, n_quick=0, kind="fresh", produced_by="resume_freeze",
            targets=("gvisor",) if _st in ("checkpointed", "restored") else ("bubblewrap", "gvisor"),
            plot=_kind != "rss", note=_MEMORY_NOTES[_kind] + _STATE_NOTES[_st]))
