"""A new kernel each time: launch to first reply (cold), and an idle kernel's memory."""

from __future__ import annotations

import time

from bench.figures._registry import IDLE_BEFORE_MEMORY_S, Figure, register
from bench.harness import Context
from bench.procmem import tree_memory_mib


def fig_cold_start(ctx: Context, n: int) -> list[float]:
    out = []
    for _ in range(n):
        k = ctx.launch()
        try:
            out.append(k.first_reply_s())
        finally:
            k.stop()
    return out


def fig_memory(ctx: Context, n: int) -> dict[str, list[float]]:
    rss, pss = [], []
    for _ in range(n):
        k = ctx.launch()
        try:
            k.first_reply_s()
            k.ensure_iopub()
            k.run("pass", timeout=60)
            time.sleep(IDLE_BEFORE_MEMORY_S)
            r, p, _ = tree_memory_mib(k.pid)
            rss.append(r)
            pss.append(p)
        finally:
            k.stop()
    return {"memory_idle_rss": rss, "memory_idle_pss": pss}


register("cold_start", Figure(
    "Launch to first execute_reply (cold)", "s", fig_cold_start, n=12, n_quick=3, kind="fresh",
    note="KernelManager.start_kernel() until the execute_reply of `pass` sent right after "
         "start_channels(); a new kernel (and sandbox) each time."))
register("memory_idle_rss", Figure(
    "Memory of an idle kernel (RSS)", "MiB", fig_memory, n=4, n_quick=2, kind="fresh",
    note=f"Sum of VmRSS over the kernel's process tree, {IDLE_BEFORE_MEMORY_S:g} s after its "
         "second cell. Proxy: proxy + bwrap + agent + inner kernel, or proxy + runsc + gofer "
         "+ sandbox (Sentry) + its stub processes."))
register("memory_idle_pss", Figure(
    "Memory of an idle kernel (PSS)", "MiB", None, n=0, n_quick=0, kind="fresh",
    produced_by="memory_idle_rss",
    note="Same processes, proportional set size: shared pages (the Python binary, gVisor's "
         "memory file mapped by the Sentry and its stubs) counted once."))
