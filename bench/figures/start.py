"""A new kernel each time: launch to first reply (cold), and an idle kernel's memory."""

from __future__ import annotations

import dataclasses
import time

from bench.figures._registry import IDLE_BEFORE_MEMORY_S, Figure, register
from bench.harness import Context, Running
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


def _template_starts(ctx: Context, target, n: int, out: list[float]) -> None:
    from sandbox_kernel.prestart import SPARES
    for _ in range(n):
        SPARES.wait_ready()  # the spare proxy (if the kernelspec has one) has done its imports
        k = Running(ctx.bench, target)
        try:
            out.append(k.first_reply_s())
            info = k.kc.kernel_info(reply=True, timeout=60)["content"]["sandbox"]
            if not info.get("from_template"):
                raise RuntimeError(f"the kernel did not start from its template: {info}")
        finally:
            k.stop()


def fig_template_start(ctx: Context, n: int) -> dict[str, list[float]]:
    from sandbox_kernel.backends.local import template
    from sandbox_kernel.kernelspec import install

    name = f"sandbox-bench-{ctx.target.runtime}-template"
    options = {"runtime": ctx.target.runtime, "start_template": True}
    install(name, options=options, prefix=ctx.bench.prefix, prestart=1)
    install(name + "-new-process", options=options, prefix=ctx.bench.prefix, prestart=0)
    spare = dataclasses.replace(ctx.target, kernel_name=name)
    new_process = dataclasses.replace(ctx.target, kernel_name=name + "-new-process")
    template.remove_all()
    first, fresh = [], []
    try:
        maker = Running(ctx.bench, spare)  # makes the template
        try:
            maker.first_reply_s()
        finally:
            maker.stop()
        _template_starts(ctx, spare, 1, [])  # the kernelspec's first launch has no spare proxy yet
        _template_starts(ctx, spare, n, first)
        _template_starts(ctx, new_process, n, fresh)
    finally:
        template.remove_all()
    return {"template_start": first, "template_start_new_process": fresh}


register("template_start", Figure(
    "Launch to first execute_reply (start template, pre-started proxy)", "s", fig_template_start, n=12,
    n_quick=3, kind="fresh", targets=("gvisor",),
    note="As cold start, with `LocalBackend.start_template` (no pool): the sandbox is restored from "
         "the checkpoint of a freshly started kernel of the same policy, made by the first kernel "
         "(not measured), into its own state directory, cgroup and mounts; the proxy is a pre-started "
         "spare (`--prestart 1`)."))
register("template_start_new_process", Figure(
    "Launch to first execute_reply (start template, new proxy process)", "s", None, n=0, n_quick=0,
    kind="fresh", produced_by="template_start", targets=("gvisor",),
    note="The same with a `--prestart 0` kernelspec: a new proxy process, then the restore."))
