"""Launch to first reply with a warm pool of sandboxes (``sandbox-kernel pool``)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import time
from pathlib import Path

from bench.figures._registry import Figure, register
from bench.harness import Bench, Context, Running
from bench.targets import TARGETS

POOL_SIZE = 2


class BenchPool:
    """A ``sandbox-kernel pool`` process for one runtime, socket in the bench's temp prefix
    (the bench's handle on the daemon, not ``sandbox_kernel.backends.local.pool.daemon.PoolDaemon`` itself)."""

    def __init__(self, bench: Bench, runtime: str):
        from sandbox_kernel.kernelspec import install
        self.socket = Path(bench.prefix) / f"pool-{runtime}.sock"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sandbox_kernel.cli", "pool", "--size", str(POOL_SIZE),
             "--runtime", runtime, "--socket", str(self.socket)], stdout=bench.log, stderr=bench.log)
        options = {"runtime": runtime, "pool_socket": str(self.socket), "spare_sandbox": False}
        name = f"sandbox-bench-{runtime}-pool"
        install(name, options=options, prefix=bench.prefix, prestart=1)
        self.target = dataclasses.replace(TARGETS[runtime], kernel_name=name)
        install(name + "-new-process", options=options, prefix=bench.prefix, prestart=0)
        self.target_new_process = dataclasses.replace(TARGETS[runtime], kernel_name=name + "-new-process")

    def wait_full(self, timeout: float = 300.0) -> None:
        from sandbox_kernel.backends.local.pool.wire import request
        deadline = time.perf_counter() + timeout
        while time.perf_counter() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"pool daemon exited ({self.proc.returncode})")
            if self.socket.exists() and request(self.socket, {"op": "status"})[0]["ready"] >= POOL_SIZE:
                return
            time.sleep(0.2)
        raise TimeoutError("the pool did not fill")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(120)


def _warm_starts(bench: Bench, pool: BenchPool, target, n: int, first: list[float],
                 sandbox: list[float]) -> None:
    from sandbox_kernel.prestart import SPARES
    for _ in range(n):
        pool.wait_full()  # warm: the pool is full when the kernel is launched
        SPARES.wait_ready()  # and the spare proxy (if the kernelspec has one) has done its imports
        k = Running(bench, target)
        try:
            first.append(k.first_reply_s())
            info = k.kc.kernel_info(reply=True, timeout=60)["content"]["sandbox"]
            if not info.get("pooled"):
                raise RuntimeError(f"the kernel started cold: {info}")
            sandbox.append(info["timings_s"]["start_s"] * 1000)
        finally:
            k.stop()


def fig_warm_start(ctx: Context, n: int) -> dict[str, list[float]]:
    pool = BenchPool(ctx.bench, ctx.target.runtime)
    first, sandbox, new_process, unused = [], [], [], []
    try:
        # The kernelspec's first launch in a process has no spare proxy yet (it starts one).
        _warm_starts(ctx.bench, pool, pool.target, 1, [], [])
        _warm_starts(ctx.bench, pool, pool.target, n, first, sandbox)
        _warm_starts(ctx.bench, pool, pool.target_new_process, n, new_process, unused)
    finally:
        pool.stop()
    return {"warm_start": first, "warm_start_sandbox": sandbox, "warm_start_new_process": new_process}


register("warm_start", Figure(
    "Launch to first execute_reply (warm pool, pre-started proxy)", "s", fig_warm_start, n=12, n_quick=3,
    kind="fresh", targets=("bubblewrap", "gvisor"), rounds=2,
    note=f"As cold start, with a `sandbox-kernel pool --size {POOL_SIZE}` daemon for the runtime "
         "and a kernelspec whose pool_socket points at it, installed with `--prestart 1` (the "
         "default): the proxy is a spare that did its imports (jupyter_client provisioner "
         "`sandbox-kernel-prestarted`). The pool is full and the spare ready at each launch; "
         "both start a replacement while the measured kernel comes up (as in real use)."))
register("warm_start_new_process", Figure(
    "Launch to first execute_reply (warm pool, new proxy process)", "s", None, n=0, n_quick=0,
    kind="fresh", produced_by="warm_start", targets=("bubblewrap", "gvisor"),
    note="The same warm pool with a `--prestart 0` kernelspec: the proxy is a new Python "
         "process importing ipykernel and the relay (what pre-starting removes)."))
register("warm_start_sandbox", Figure(
    "Sandbox ready inside a warm-pool start", "ms", None, n=0, n_quick=0, kind="fresh",
    produced_by="warm_start", targets=("bubblewrap", "gvisor"),
    note="The proxy's own part of the same starts: from its backend start until the agent's "
         "ready frame (pool request, fd hand-off, adoption; kernel_info sandbox.timings_s.start_s). "
         "On a cold start this is the whole sandbox + inner kernel start."))
