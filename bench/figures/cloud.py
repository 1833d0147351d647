"""The cloud SDKs on their own, no proxy: what the relay's transport costs."""

from __future__ import annotations

import time

from bench.figures._registry import WARMUP, Figure, register
from bench.harness import Context


def fig_e2b_sdk(ctx: Context, n: int) -> dict[str, list[float]]:
    """E2B SDK round trips on one sandbox of the emulated E2B (``e2b-emulated`` only)."""
    import asyncio

    from e2b_code_interpreter import AsyncSandbox

    async def go() -> dict[str, list[float]]:
        sbx = await AsyncSandbox.create(timeout=300)
        try:
            run = []
            for i in range(WARMUP + n):
                t0 = time.perf_counter()
                r = await sbx.commands.run("true")
                if r.exit_code != 0:
                    raise RuntimeError(f"`true` exited with {r.exit_code}")
                if i >= WARMUP:
                    run.append((time.perf_counter() - t0) * 1000)
            got = asyncio.Event()
            h = await sbx.commands.run("cat", background=True, stdin=True, timeout=0,
                                       on_stdout=lambda _t: got.set())
            echo = []
            for i in range(WARMUP + 5 * n):
                got.clear()
                t0 = time.perf_counter()
                await sbx.commands.send_stdin(h.pid, "x\n")
                await asyncio.wait_for(got.wait(), 30)
                if i >= WARMUP:
                    echo.append((time.perf_counter() - t0) * 1000)
            await h.kill()
            return {"e2b_sdk_run_rtt": run, "e2b_sdk_echo_rtt": echo}
        finally:
            await sbx.kill()

    return asyncio.run(go())


register("e2b_sdk_run_rtt", Figure(
    "E2B SDK command round trip: commands.run(\"true\")", "ms", fig_e2b_sdk, n=40, n_quick=10,
    targets=("e2b-emulated",), rounds=1,
    note="The SDK alone, no proxy: `AsyncSandbox.commands.run(\"true\")` on one sandbox, "
         "start to exit code (envd Start stream; through the emulator each command is a new "
         "bubblewrap process)."))
register("e2b_sdk_echo_rtt", Figure(
    "E2B SDK stdin → stdout echo round trip", "ms", None, n=0, n_quick=0,
    produced_by="e2b_sdk_run_rtt", targets=("e2b-emulated",),
    note="The SDK alone, no proxy: one line written with `commands.send_stdin` to a running "
         "`cat` until it comes back through the command's stdout stream: the transport the "
         "relay's frames use, so trivial_rtt on E2B minus this is what the relay adds per cell "
         "(a cell is ~4 messages back, 1 forward, through the agent and the inner kernel)."))
