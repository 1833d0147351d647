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
        name = f"sandbox-bench-{runtime}-pool"
        install(name, options={"runtime": runtime, "pool_socket": str(self.socket)}, prefix=bench.prefix)
        self.target = dataclasses.replace(TARGETS[runtime], kernel_name=name)

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


def fig_warm_start(ctx: Context, n: int) -> dict[str, list[float]]:
    pool = BenchPool(ctx.bench, ctx.target.runtime)
    first, sandbox = [], []
    try:
        for _ in range(n):
            pool.wait_full()  # warm: the pool is full when the kernel is launched
            k = Running(ctx.bench, pool.target)
            try:
                first.append(k.first_reply_s())
                info = k.kc.kernel_info(reply=True, timeout=60)["content"]["sandbox"]
                if not info.get("pooled"):
                    raise RuntimeError(f"the kernel started cold: {info}")
                sandbox.append(info["timings_s"]["start_s"] * 1000)
            finally:
                k.stop()
    finally:
        pool.stop()
    return {"warm_start": first, "warm_start_sandbox": sandbox}


register("warm_start", Figure(
    "Launch to first execute_reply (warm pool)", "s", fig_warm_start, n=12, n_quick=3,
    kind="fresh", targets=("bubblewrap", "gvisor"), rounds=2,
    note=f"As cold start, with a `sandbox-kernel pool --size {POOL_SIZE}` daemon for the runtime "
         "and a kernelspec whose pool_socket points at it; the pool is full at each launch "
         "and starts a replacement while the measured kernel comes up (as in real use)."))
register("warm_start_sandbox", Figure(
    "Sandbox ready inside a warm-pool start", "ms", None, n=0, n_quick=0, kind="fresh",
    produced_by="warm_start", targets=("bubblewrap", "gvisor"),
    note="The proxy's own part of the same starts: from its backend start until the agent's "
         "ready frame (pool request, fd hand-off, adoption; kernel_info sandbox.timings_s.start_s). "
         "On a cold start this is the whole sandbox + inner kernel start."))
