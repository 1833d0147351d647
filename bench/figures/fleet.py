"""Kernels per machine: a fleet of idle gVisor kernels, checkpointed, then woken one by one."""

from __future__ import annotations

import contextlib
import time
from typing import Any

from bench.figures._registry import Figure, register
from bench.figures.lifecycle import lifecycle_target
from bench.harness import Context, Running, sandbox_info, say, timed_cell, wait_state
from bench.procmem import du_mib, meminfo_mib, tree_memory_parts

#: Kernels started at once for the fleet (2 cores: more only queue on the CPU).
FLEET_BATCH = 3
FLEET_PAUSE_AFTER_S = 2.0
FLEET_CHECKPOINT_AFTER_S = 5.0
#: The fleet's memory limit, MiB: what an idle kernel needs, with room for admission.
FLEET_MEMORY_MIB = 1024


def fig_fleet(ctx: Context, n: int) -> dict[str, Any]:
    """``n`` idle gVisor kernels, started a few at a time, each with ``x = i``; all
    checkpointed, their memory summed; then each woken and ``x`` checked; all shut down."""
    from concurrent.futures import ThreadPoolExecutor

    from sandbox_kernel.backends.local.layout import state_base
    # Admission (issue 16) counts the live kernels' memory limits: at the default 4096 MiB
    # this machine admits 5 at once, and a batch starts before the previous one checkpointed.
    target = lifecycle_target(ctx.bench, ctx.target, "fleet", FLEET_PAUSE_AFTER_S, FLEET_CHECKPOINT_AFTER_S,
                              memory_mib=FLEET_MEMORY_MIB)
    avail0 = meminfo_mib("MemAvailable")
    kernels: list[Running] = []
    cids: list[str] = []
    start, wake = [], []
    extra: dict[str, Any] = {"kernels": n, "batch": FLEET_BATCH,
                             "pause_after_s": FLEET_PAUSE_AFTER_S,
                             "checkpoint_after_s": FLEET_CHECKPOINT_AFTER_S,
                             "mem_available_before_mib": round(avail0)}
    t0 = time.perf_counter()
    kept = 0
    try:
        for b in range(0, n, FLEET_BATCH):
            batch = [Running(ctx.bench, target) for _ in range(min(FLEET_BATCH, n - b))]
            kernels += batch
            for i, k in enumerate(batch, start=b):
                k.timer.request(lambda: k.kc.execute(f"x = {i}", store_history=False),
                                wait_idle=False, timeout=300)
                start.append(time.perf_counter() - k.t_launch)
                k.ensure_iopub()
                cids.append(sandbox_info(k)["container_id"])
        extra["start_all_s"] = round(time.perf_counter() - t0, 1)
        say(f"  fleet: {n} kernels started in {extra['start_all_s']} s; waiting for the checkpoints")
        for k in kernels:
            wait_state(k, "checkpointed", timeout=300)
        extra["all_checkpointed_after_s"] = round(time.perf_counter() - t0, 1)
        time.sleep(1.0)
        parts = [tree_memory_parts(k.pid) for k in kernels]
        extra["mem_available_checkpointed_mib"] = round(meminfo_mib("MemAvailable"))
        for key in ("pss", "rss", "sandbox_pss", "sandbox_rss", "procs", "sandbox_procs"):
            extra[f"total_{key}"] = round(sum(p[key] for p in parts), 1)
        extra["checkpoint_images_mib"] = round(sum(du_mib(state_base() / c / "checkpoint") for c in cids), 1)
        say(f"  fleet: all checkpointed; PSS {extra['total_pss']:.0f} MiB in all "
            f"(sandboxes {extra['total_sandbox_pss']:.1f} MiB, {extra['total_sandbox_procs']} processes)")
        t1 = time.perf_counter()
        while kernels:
            # oldest first; each is shut down once checked, so the woken ones do not freeze
            # and checkpoint again beside the next wakes (the rest stay checkpointed)
            k = kernels.pop(0)
            i = n - len(kernels) - 1
            try:
                wake.append(timed_cell(k, "pass", str(i)) * 1000)
                kept += 1
            except RuntimeError as err:
                say(f"  fleet: kernel {i}: {err}")
            finally:
                quiet_stop(k)
        extra["wake_and_shutdown_all_s"] = round(time.perf_counter() - t1, 1)
        extra["state_kept"] = kept
    finally:
        with ThreadPoolExecutor(4) as ex:  # what is left after a failure
            list(ex.map(quiet_stop, kernels))
        time.sleep(2.0)
        extra["leaked_state_dirs"] = sum((state_base() / c).exists() for c in cids)
        extra["leaked_processes"] = sum(len(_procs_mentioning(str(state_base() / c))) for c in cids)
        extra["mem_available_after_mib"] = round(meminfo_mib("MemAvailable"))
        extra["total_s"] = round(time.perf_counter() - t0, 1)
        say(f"  fleet: {extra}")
    return {"fleet_start": start,
            "fleet_checkpointed_pss": [p["pss"] for p in parts],
            "fleet_checkpointed_sandbox_pss": [p["sandbox_pss"] for p in parts],
            "fleet_restore": wake,
            "_extra": {"fleet_checkpointed_pss": extra}}



def quiet_stop(k: Running) -> None:
    """Stop ``k``; if that fails, kill its proxy (its watchdog reaps the sandbox)."""
    try:
        k.stop()
    except Exception as err:
        say(f"  stop failed ({err}); killing the proxy (its watchdog reaps the sandbox)")
        with contextlib.suppress(Exception):
            k.km.shutdown_kernel(now=True)


def _procs_mentioning(needle: str) -> list[int]:
    from sandbox_kernel.backends.local.procs import processes_mentioning
    return processes_mentioning(needle)


register("fleet_start", Figure(
    "Fleet: launch to first reply, a few at a time", "s", fig_fleet,
    n=50, n_quick=10, kind="fresh", targets=("gvisor",), rounds=1,
    note=f"N idle gVisor kernels (N = n; 50, 10 with --quick) on a kernelspec with "
         f"pause_after_s={FLEET_PAUSE_AFTER_S:g}, checkpoint_after_s={FLEET_CHECKPOINT_AFTER_S:g}, "
         f"launched {FLEET_BATCH} at a time; each first cell sets `x = i`. Per-kernel launch "
         "to first execute_reply, with the others starting or checkpointing beside it."))
register("fleet_checkpointed_pss", Figure(
    "Fleet: per kernel, all checkpointed (PSS, tree)", "MiB", None, n=0, n_quick=0,
    kind="fresh", produced_by="fleet_start", targets=("gvisor",),
    note="Once every kernel of the fleet says `checkpointed`: PSS of each proxy kernel's "
         "process tree (what is left: the proxy and its watchdog). Totals, MemAvailable and "
         "the state check are listed under *Kernels per machine* below."))
register("fleet_checkpointed_sandbox_pss", Figure(
    "Fleet: sandbox memory per kernel, all checkpointed (PSS)", "MiB", None, n=0, n_quick=0,
    kind="fresh", produced_by="fleet_start", targets=("gvisor",), plot=False,
    note="The same trees without the proxy and the watchdog: the sandbox's resident memory "
         "(0 = no runtime process left)."))
register("fleet_restore", Figure(
    "Fleet: wake a checkpointed kernel, to execute_reply", "ms", None, n=0, n_quick=0,
    kind="fresh", produced_by="fleet_start", targets=("gvisor",),
    note="Then each kernel in turn gets a cell (x checked against the value set before the "
         "checkpoint), timed to its execute_reply, and is shut down; the others stay "
         "checkpointed meanwhile."))
