"""What the agent paths add: ``Sandbox.run("pass")`` and MCP ``execute_code`` beside raw ``jupyter_client``.

The three are taken in turns, sample by sample, on the same target: raw
``jupyter_client`` and the client on the target's shared kernel (the client
attaches by its connection file), MCP through ``sandbox-kernel mcp`` over
stdio driven by the SDK's client (its own kernel of the same kernelspec).
"""

from __future__ import annotations

import asyncio
import os
import sys
import time

from bench.figures._registry import WARMUP, Figure, register
from bench.harness import Context


def fig_agent_rtt(ctx: Context, n: int) -> dict[str, list[float]]:
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client
    from sandbox_kernel import Sandbox

    s = ctx.session
    raw: list[float] = []
    client: list[float] = []
    mcp: list[float] = []
    params = StdioServerParameters(command=sys.executable, env=dict(os.environ), args=[
        "-m", "sandbox_kernel.cli", "mcp", "--kernel-name", ctx.target.kernel_name])

    async def measure() -> None:
        with Sandbox(connection_file=s.km.connection_file) as sbx:
            async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
                await session.initialize()
                for i in range(WARMUP + n):
                    dt_raw = s.run("pass")[0]
                    t0 = time.perf_counter()
                    ex = sbx.run("pass")
                    dt_client = time.perf_counter() - t0
                    t0 = time.perf_counter()
                    res = await session.call_tool("execute_code", {"code": "pass"})
                    dt_mcp = time.perf_counter() - t0
                    if not ex.ok or res.isError or res.structuredContent["status"] != "ok":
                        raise RuntimeError(f"a `pass` failed: {ex.error} / {res.content}")
                    if i >= WARMUP:
                        raw.append(dt_raw * 1000)
                        client.append(dt_client * 1000)
                        mcp.append(dt_mcp * 1000)

    asyncio.run(measure())
    return {"agent_raw_rtt": raw, "agent_client_rtt": client, "agent_mcp_rtt": mcp}


_SAME = ("Taken in turns with the other two agent figures, sample by sample, after "
         f"{WARMUP} warm-up cells each.")
register("agent_raw_rtt", Figure(
    "Agent paths: raw jupyter_client `pass`", "ms", fig_agent_rtt, n=200, n_quick=40, plot=False,
    note="`pass` through a BlockingKernelClient: execute_request until execute_reply and idle "
         "(as trivial_rtt). " + _SAME))
register("agent_client_rtt", Figure(
    "Agent paths: Sandbox.run(\"pass\")", "ms", None, n=0, n_quick=0, produced_by="agent_raw_rtt",
    note="The agent client (`sandbox_kernel.Sandbox`, attached to the same kernel by its connection "
         "file): the call until the Execution is complete (reply and idle). " + _SAME))
register("agent_mcp_rtt", Figure(
    "Agent paths: MCP execute_code(\"pass\")", "ms", None, n=0, n_quick=0, produced_by="agent_raw_rtt",
    note="`sandbox-kernel mcp` over stdio, the MCP SDK's ClientSession.call_tool until the tool "
         "result (a kernel of the same kernelspec, started by the server). " + _SAME))
