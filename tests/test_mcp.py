"""``sandbox-kernel mcp`` driven by the MCP SDK's own client, over stdio and streamable HTTP.

The server runs as a subprocess (as an agent framework starts it) with the
test kernelspecs (``JUPYTER_PATH``); its kernels are sandboxed (gVisor over
stdio, bubblewrap over HTTP), so every cell runs inside a sandbox.  The HTTP
server binds 127.0.0.1 and the test talks to it only.
"""

from __future__ import annotations

import asyncio
import base64
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

pytest.importorskip("mcp")

import httpx
from client_flow import stop_process
from kernels import kernel_name_for
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import get_default_environment, stdio_client
from mcp.client.streamable_http import streamable_http_client
from sandbox_kernel.backends.local.layout import state_base

TOOLS = {"execute_code", "get_result", "wait", "interrupt", "restart", "sandbox_info", "list_files",
         "read_file", "write_file", "snapshot", "restore", "list_snapshots", "fork", "close_fork"}


def _text(res) -> str:
    return "".join(c.text for c in res.content if c.type == "text")


def _server_argv(kernel: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "sandbox_kernel.cli", "mcp", "--kernel-name", kernel, "--budget-s", "20",
            "--max-output-bytes", "4000", *extra]


def _env() -> dict[str, str]:
    """The server's environment: the test's kernelspecs where a fixture installed them, and the
    package under test where ``PYTHONPATH`` names it (a worktree beside the installed one)."""
    keep = {k: os.environ[k] for k in ("JUPYTER_PATH", "PYTHONPATH") if os.environ.get(k)}
    return {**get_default_environment(), **keep}


async def drive(session: ClientSession, runtime: str) -> str:
    """Every "what must hold" point of the MCP server; returns the sandbox's container id."""
    await session.initialize()
    tools = {t.name: t for t in (await session.list_tools()).tools}
    assert TOOLS <= set(tools), set(tools)
    schema = tools["execute_code"].inputSchema
    assert schema["required"] == ["code"] and {"code", "budget_s", "timeout_s"} <= set(schema["properties"])
    assert all(t.inputSchema.get("type") == "object" for t in tools.values())

    res = await session.call_tool("execute_code", {"code": "print(6*7)"})
    assert not res.isError and _text(res).strip() == "42", res
    assert res.structuredContent["status"] == "ok"

    # state kept across calls
    assert not (await session.call_tool("execute_code", {"code": "x = 5"})).isError
    assert _text(await session.call_tool("execute_code", {"code": "x * 2"})).strip() == "10"

    # an image comes back as image content
    res = await session.call_tool("execute_code", {
        "code": "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2]); plt.show()"})
    imgs = [c for c in res.content if c.type == "image"]
    assert len(imgs) == 1 and imgs[0].mimeType == "image/png", res.content
    assert base64.b64decode(imgs[0].data).startswith(b"\x89PNG\r\n\x1a\n")

    # errors as structured results
    res = await session.call_tool("execute_code", {"code": "1/0"})
    err = res.structuredContent["error"]
    assert res.structuredContent["status"] == "error" and err["ename"] == "ZeroDivisionError", res
    assert "ZeroDivisionError" in _text(res)

    # a 30 s cell with a 2 s budget returns a handle; wait later gives the output
    res = await session.call_tool("execute_code", {
        "code": "import time\nprint('started', flush=True)\ntime.sleep(30)\nprint('finished')", "budget_s": 2})
    assert res.structuredContent["status"] == "running", res
    handle = res.structuredContent["handle"]
    assert f"wait(handle={handle!r})" in _text(res)
    assert (await session.call_tool("get_result", {"handle": handle})).structuredContent["status"] == "running"
    res = await session.call_tool("wait", {"handle": handle, "timeout_s": 60})
    assert res.structuredContent["status"] == "ok", res
    assert _text(res) == "started\nfinished\n"

    # output capped with a marker; the full output stays readable
    res = await session.call_tool("execute_code", {"code": "print('a' * 30000 + 'END')"})
    text, s = _text(res), res.structuredContent
    assert "bytes cut" in text and len(text.encode()) < 4200 and s["cut_bytes"] > 25000, s
    got, offset = "", 0
    while offset is not None:
        part = await session.call_tool("get_result", {"handle": s["handle"], "offset": offset})
        got += _text(part)
        offset = part.structuredContent["next_offset"]
    assert got == "a" * 30000 + "END\n"

    # bad arguments: a clear tool error, and the server goes on
    res = await session.call_tool("execute_code", {"cod": "1"})
    assert res.isError and "code" in _text(res) and "required" in _text(res).lower(), res
    res = await session.call_tool("execute_code", {"code": "1", "budget_s": "soon"})
    assert res.isError and "budget_s" in _text(res), res
    res = await session.call_tool("wait", {"handle": "cell-999"})
    assert res.isError and "no cell with handle" in _text(res)
    res = await session.call_tool("write_file", {"path": "notes.txt", "content": "héllo\n"})
    assert not res.isError and "7 bytes" in _text(res), res
    res = await session.call_tool("list_files", {"path": "."})
    assert not res.isError and "notes.txt" in _text(res), res
    assert _text(await session.call_tool("read_file", {"path": "notes.txt"})) == "héllo\n"
    res = await session.call_tool("read_file", {"path": "missing.txt"})
    assert res.isError and "FileNotFoundError" in _text(res), res
    assert _text(await session.call_tool("execute_code", {"code": "x"})).strip() == "5"

    # interrupt keeps the state; restart drops it
    res = await session.call_tool("execute_code", {"code": "import time\ntime.sleep(60)", "budget_s": 1})
    h = res.structuredContent["handle"]
    assert _text(await session.call_tool("interrupt", {})) == "interrupted"
    res = await session.call_tool("wait", {"handle": h, "timeout_s": 30})
    assert res.structuredContent["error"]["ename"] == "KeyboardInterrupt"
    assert _text(await session.call_tool("execute_code", {"code": "x"})).strip() == "5"

    # snapshot and rewind (issue 30): gVisor keeps the state; bubblewrap refuses, naming itself
    res = await session.call_tool("snapshot", {})
    if runtime == "gvisor":
        snap = res.structuredContent
        snap = snap.get("result", snap)
        assert not res.isError and snap["id"], res
        assert not (await session.call_tool("execute_code", {"code": "x = 99"})).isError
        res = await session.call_tool("restore", {"snapshot_id": snap["id"]})
        assert not res.isError and snap["id"] in _text(res), res
        text = _text(await session.call_tool("execute_code", {"code": "x"}))
        assert text.strip().endswith("\n5") and f"rewound to snapshot {snap['id']}" in text, text  # told once
        listed = (await session.call_tool("list_snapshots", {})).structuredContent
        assert [s["id"] for s in listed.get("result", listed)] == [snap["id"]], listed
    else:
        assert res.isError and "SnapshotUnsupported" in _text(res) and runtime in _text(res), _text(res)
    res = await session.call_tool("restore", {"snapshot_id": "no-such-snapshot"})
    assert res.isError and ("UnknownSnapshot" in _text(res) or "SnapshotUnsupported" in _text(res)), _text(res)
    assert _text(await session.call_tool("execute_code", {"code": "x"})).strip() == "5"  # untouched

    # fork (issue 30): new kernels of this session from its state now, run through `kernel`
    res = await session.call_tool("fork", {"n": 2})
    if runtime == "gvisor":
        out = res.structuredContent
        forks = out.get("result", out)["kernels"]
        assert not res.isError and forks == ["fork-1", "fork-2"], res
        draws = set()
        for i, name in enumerate(forks):
            text = _text(await session.call_tool("execute_code", {"code": f"x += {i + 1}; x", "kernel": name}))
            assert text.strip().splitlines()[-1] == str(6 + i) and "this kernel is fork" in text, text
        for name in ("main", *forks):
            code = "import random; print(random.random())"
            draws.add(_text(await session.call_tool("execute_code", {"code": code, "kernel": name})).strip())
        assert len(draws) == 3, draws  # each copy its own entropy
        assert not (await session.call_tool("close_fork", {"kernel": "fork-1"})).isError
        res = await session.call_tool("execute_code", {"code": "x", "kernel": "fork-1"})
        assert res.isError and "no kernel 'fork-1'" in _text(res) and "fork-2" in _text(res), _text(res)
        assert _text(await session.call_tool("execute_code", {"code": "x", "kernel": "fork-2"})).strip() == "7"
    else:
        assert res.isError and "SnapshotUnsupported" in _text(res) and runtime in _text(res), _text(res)
    res = await session.call_tool("fork", {"n": 0})
    assert res.isError and "n" in _text(res), _text(res)
    assert _text(await session.call_tool("execute_code", {"code": "x"})).strip() == "5"  # untouched

    info = (await session.call_tool("sandbox_info", {})).structuredContent
    info = info.get("result", info)
    assert info["backend"] == "local" and info["egress"] == "none" and info["limits"]["memory_mib"] > 0, info
    assert not (await session.call_tool("restart", {})).isError
    res = await session.call_tool("execute_code", {"code": "x"})
    assert res.structuredContent["error"]["ename"] == "NameError"
    return info["raw"]["container_id"]


def _gone(container_id: str, timeout: float = 30) -> bool:
    deadline = time.monotonic() + timeout
    while (state_base() / container_id).exists():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def test_mcp_over_stdio(kernelspec_prefix):
    params = StdioServerParameters(command=sys.executable, args=_server_argv(kernel_name_for("gvisor"))[1:],
                                   env=_env())

    async def main() -> str:
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            return await drive(session, "gvisor")

    container = asyncio.run(main())
    assert _gone(container), f"sandbox {container} still there after the MCP session closed"


@pytest.fixture
def http_server(kernelspec_prefix):
    token = "t-" + os.urandom(16).hex()
    proc = subprocess.Popen(_server_argv(kernel_name_for("bubblewrap"), "--http", "--port", "0"),
                            env={**_env(), "SANDBOX_KERNEL_MCP_TOKEN": token},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = None
    deadline = time.monotonic() + 60
    while url is None and time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line and proc.poll() is not None:
            break
        if "listening on " in line:
            url = line.split("listening on ", 1)[1].strip()
    assert url is not None and url.startswith("http://127.0.0.1:"), "the MCP server did not start"
    try:
        yield url, token, proc
    finally:
        stop_process(proc)


def test_mcp_over_streamable_http(http_server):
    url, token, proc = http_server
    for headers in ({}, {"Authorization": "Bearer wrong-token-wrong-token"}):
        req = urllib.request.Request(url, data=b"{}", headers={"Content-Type": "application/json", **headers})
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.build_opener(urllib.request.ProxyHandler({})).open(req, timeout=10)
        assert err.value.code == 401

    async def main() -> str:
        client = httpx.AsyncClient(headers={"Authorization": f"Bearer {token}"},
                                   timeout=httpx.Timeout(60, read=300))
        async with client, streamable_http_client(url, http_client=client) as (read, write, _), \
                ClientSession(read, write) as session:
            return await drive(session, "bubblewrap")

    container = asyncio.run(main())
    # the session ended (the client's DELETE) while the server runs on: its sandbox is gone
    assert _gone(container), f"sandbox {container} still there after the MCP session closed"
    assert proc.poll() is None


def test_http_refuses_a_non_loopback_host():
    r = subprocess.run(_server_argv("sandbox-local", "--http", "--host", "0.0.0.0", "--port", "0"),
                       capture_output=True, text=True, timeout=60, env={**_env(), "SANDBOX_KERNEL_MCP_TOKEN": "x" * 20})
    assert r.returncode == 2 and "loopback" in r.stderr


def test_idle_shutdown_frees_the_kernel_and_says_so(kernelspec_prefix):
    """--idle-shutdown-s: the session's kernel (and sandbox) goes; the next call starts a new one,
    which is not shut down under that call even though starting it took longer than the idle time
    (the idle time counts from the end of a call; a call in progress holds the kernel)."""
    from mcp.server.fastmcp.exceptions import ToolError
    from sandbox_kernel.mcp.server import ServerOptions, SessionKernel

    idle_s = 0.5  # shorter than any sandbox start, so the second start always outlasts it
    async def main() -> None:
        sk = SessionKernel(ServerOptions(kernel_name=kernel_name_for("bubblewrap"), idle_shutdown_s=idle_s))
        try:
            async with sk.use() as sbx:
                assert (await sbx.run("x = 1")).ok
                container = (await sbx.info()).raw["container_id"]
            for _ in range(200):
                if sk.sandbox is None:
                    break
                await asyncio.sleep(0.1)
            assert sk.sandbox is None and "variables are gone" in sk.freed_note
            assert await asyncio.to_thread(_gone, container)
            async with sk.use() as sbx:
                await asyncio.sleep(3 * idle_s)  # an agent's call still using the kernel
                assert (await sbx.run("x")).error.ename == "NameError"
            with pytest.raises(ToolError, match="no cell with handle"):
                sk.job("cell-1")
        finally:
            await sk.close()
        assert sk.sandbox is None

    asyncio.run(main())
