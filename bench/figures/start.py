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


def _wait_spare(runtime: str, timeout_s: float = 120.0) -> None:
    """Until a spare pool of ``runtime`` (the default kernelspec's fast start) holds a
    started sandbox (another runtime's pool, lingering after its figure, does not count)."""
    from sandbox_kernel.backends.local.pool import spares

    deadline = time.monotonic() + timeout_s
    while not any(p.get("ready") and p.get("runtime") == runtime for p in spares.report()):
        if time.monotonic() > deadline:
            raise RuntimeError("no spare sandbox became ready")
        time.sleep(0.1)


def _default_starts(ctx: Context, target, n: int, out: list[float], fast: bool = True) -> None:
    """``n`` launches of ``target`` to their first reply, each once the spare proxy and the
    spare sandbox are ready (``fast``: each must have taken the spare)."""
    from sandbox_kernel.prestart import SPARES
    for _ in range(n):
        SPARES.wait_ready()  # the spare proxy (if the kernelspec has one) has done its imports
        if fast:
            _wait_spare(ctx.target.runtime)
        k = Running(ctx.bench, target)
        try:
            out.append(k.first_reply_s())
            info = k.kc.kernel_info(reply=True, timeout=60)["content"]["sandbox"]
            if fast and not (info.get("from_template") or info.get("pooled")):
                raise RuntimeError(f"the kernel started cold, not from a spare: {info}")
        finally:
            k.stop()


def _no_spares(timeout_s: float = 60.0) -> None:
    """End every spare pool of this user and wait until none is listed (as after a reboot)."""
    from sandbox_kernel.backends.local.pool import spares

    spares.stop_all()
    deadline = time.monotonic() + timeout_s
    while spares.report():
        if time.monotonic() > deadline:
            raise RuntimeError(f"spare pools still listed: {spares.report()}")
        time.sleep(0.1)


def _as_after_boot() -> None:
    """As after a reboot: no spare pool (:func:`_no_spares`), and no record of a recent kernel
    of any policy.  Those records (``<state dir>/spares/<key>.kernels``) are in ``/run``
    (root) or ``/tmp``, which a boot empties; one younger than ``spare_linger_s`` makes the
    next kernel start its policy's spare pool at its ready, beside its first reply, instead
    of ``spare_after_s`` later."""
    from sandbox_kernel.backends.local.pool import spares

    _no_spares()
    for record in spares.spares_dir().glob("*.kernels"):
        record.unlink(missing_ok=True)


def fig_template_start(ctx: Context, n: int) -> dict[str, list[float]]:
    from sandbox_kernel.backends.local import template
    from sandbox_kernel.kernelspec import install

    name = f"sandbox-bench-{ctx.target.runtime}-default"
    options = {"runtime": ctx.target.runtime}  # the default kernelspec's options
    install(name, options=options, prefix=ctx.bench.prefix, prestart=1)
    install(name + "-new-process", options=options, prefix=ctx.bench.prefix, prestart=0)
    spare = dataclasses.replace(ctx.target, kernel_name=name)
    new_process = dataclasses.replace(ctx.target, kernel_name=name + "-new-process")
    template.remove_all()
    _no_spares()
    first, fresh, making, after_boot = [], [], [], []
    try:
        maker = Running(ctx.bench, spare)  # the first kernel ever of its policy: cold, and it stays
        try:
            making.append(maker.first_reply_s())  # (on gVisor it also makes the policy's start template)
            # a second kernel of the policy (no spare yet) starts the policy's spare pool;
            # the kernelspec's first launch has no spare proxy yet either
            _default_starts(ctx, spare, 1, [], fast=False)
            _default_starts(ctx, spare, n, first)
            _default_starts(ctx, new_process, n, fresh)
        finally:
            maker.stop()
        # after a reboot: no spare pool, no spare proxy (a new server), the start template on disk
        for _ in range(n):
            _as_after_boot()
            k = Running(ctx.bench, new_process)
            try:
                after_boot.append(k.first_reply_s())
                info = k.kc.kernel_info(reply=True, timeout=60)["content"]["sandbox"]
                if ctx.target.runtime == "gvisor" and not info.get("from_template"):
                    raise RuntimeError(f"the kernel after boot started cold, not from its template: {info}")
            finally:
                k.stop()
    finally:
        template.remove_all()
        _no_spares()
    return {"template_start": first, "template_start_new_process": fresh, "template_first": after_boot,
            "template_first_ever": making}


register("template_start", Figure(
    "Launch to first execute_reply (default kernelspec, a later kernel of its policy)", "s",
    fig_template_start, n=12, n_quick=3, kind="fresh", targets=("bubblewrap", "gvisor"),
    note="As cold start, with the default kernelspec (`sandbox-kernel install`: spare sandboxes on): a "
         "later kernel of a policy in use takes the spare sandbox of the policy's spare pool (started by "
         "the policy's second kernel, waited for before each launch) while the first kernel runs; the "
         "proxy is a pre-started spare (`--prestart 1`)."))
register("template_start_new_process", Figure(
    "Launch to first execute_reply (default kernelspec, later kernel, new proxy process)", "s", None, n=0,
    n_quick=0, kind="fresh", produced_by="template_start", targets=("bubblewrap", "gvisor"),
    note="The same with a `--prestart 0` kernelspec: a new proxy process, then the spare sandbox."))
register("template_first", Figure(
    "Launch to first execute_reply (default kernelspec, the first kernel of a policy after boot)", "s", None,
    n=0, n_quick=0, kind="fresh", produced_by="template_start", targets=("bubblewrap", "gvisor"),
    note="The first kernel of a policy after a reboot: no spare pool and no record of a recent kernel "
         "(a boot empties /run and /tmp), no pre-started proxy (a new proxy "
         "process), the policy's start template on disk from before (gVisor restores it; bubblewrap has "
         "no checkpoint: its sandbox is started beside the proxy's imports). The file cache is warm: "
         "a real boot also reads the image (about 100 MiB) from disk."))
register("template_first_ever", Figure(
    "Launch to first execute_reply (default kernelspec, the first kernel ever of a policy)", "s", None,
    n=0, n_quick=0, kind="fresh", produced_by="template_start", targets=("bubblewrap", "gvisor"),
    note="No template, no spare pool, a pre-started proxy: a cold start; on gVisor it also writes the "
         "policy's start template (a checkpoint taken at ready, before the first reply)."))


def fig_restart(ctx: Context, n: int) -> list[float]:
    """``KernelManager.restart_kernel()`` to the ``execute_reply`` of ``pass``, the default
    kernelspec (a spare proxy, a spare sandbox: the first restart starts the policy's pool)."""
    from sandbox_kernel.backends.local.pool import spares
    from sandbox_kernel.prestart import SPARES

    target = ctx.target
    spares.stop_all()  # no pool of an earlier figure or target
    if target.runtime:
        from sandbox_kernel.kernelspec import install

        name = f"sandbox-bench-{target.name}-default"
        install(name, options={"runtime": target.runtime}, prefix=ctx.bench.prefix, prestart=1)
        target = dataclasses.replace(target, kernel_name=name)
    k = Running(ctx.bench, target)
    out = []
    try:
        k.first_reply_s()
        if target.runtime:  # the first restart starts cold and starts the policy's spare pool
            k.t_launch = time.perf_counter()
            k.km.restart_kernel(now=False)
            k.first_reply_s()
        for _ in range(n):
            SPARES.wait_ready()
            if target.runtime:
                _wait_spare(target.runtime)
            k.t_launch = time.perf_counter()
            k.km.restart_kernel(now=False)
            out.append(k.first_reply_s())
    finally:
        k.stop()
        spares.stop_all()
    return out


register("restart", Figure(
    "Restart to first execute_reply (default kernelspec)", "s", fig_restart, n=8, n_quick=2, kind="fresh",
    targets=("stock", "bubblewrap", "gvisor"),
    note="KernelManager.restart_kernel(now=False) (what JupyterLab's restart asks of Jupyter Server) until "
         "the execute_reply of `pass` sent right after; the default kernelspec with `--prestart 1` (a "
         "pre-started proxy; the policy's spare sandbox, waited for before each restart, the first "
         "restart not measured: it starts the pool)."))
