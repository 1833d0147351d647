"""The E2B backend through the real ``e2b`` SDK, against a local emulation of E2B.

The emulator (``tests/emulators/e2b_emulator.py``) listens on 127.0.0.1 only
and runs every command in bubblewrap as uid 65534, so the real agent and a
real ipykernel run, and no cell runs on the host.  Tests marked ``live`` talk
to E2B's cloud and run only when ``E2B_API_KEY`` is set (and ``E2B_API_URL``
is not).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from sandbox_kernel.backends.e2b import E2BBackend
from sandbox_kernel.errors import CredentialsMissing
from sandbox_kernel.policy import Policy

from backends.framing import FrameClient

pytest.importorskip("e2b_code_interpreter")


def run(coro, timeout_s: float = 300.0):
    return asyncio.run(asyncio.wait_for(coro, timeout_s))


def new_backend(**kw) -> E2BBackend:
    return E2BBackend(Policy(), kernel_id=uuid.uuid4().hex, **kw)


def _host_state(pid: int) -> str | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("State:"):
                return line.split()[1]
    except OSError:
        return None
    return None


# ---------------------------------------------------------------------------
# E2B's own part of the lifecycle (the shared script is tests/backends/test_contract.py)
# ---------------------------------------------------------------------------


def test_sandbox_metadata_pause_mid_cell_replay_and_cleanup(e2b_emulator):
    emu = e2b_emulator.emu

    async def scenario():
        b = new_backend()
        await b.start()
        c = FrameClient(b)
        c.start_reader()
        try:
            ready = await c.wait_ready()
            assert ready.body["kernel_info"]["language_info"]["name"] == "python"
            vm = emu.vms[b.sandbox_id]
            assert vm.template == "code-interpreter-v1"
            assert vm.metadata["kernel_id"] == b.kernel_id and vm.metadata["owner"]
            assert vm.allow_internet is False

            cell = await c.execute("import os; x = 41; print(os.getuid(), os.getcwd()); x + 1")
            assert cell.status == "ok" and cell.result_text == "42"
            assert cell.stdout.split() == ["65534", "/home/user"]

            cell = await c.execute("x += 1; x")
            assert cell.result_text == "42"

            # pause mid-cell: output produced between the detach and the freeze,
            # and between the thaw and the reattach, is dropped by E2B; replay
            # brings it back, each tick exactly once and in order.
            msg_id = await c.send_execute(
                "import time\nfor i in range(30):\n    print('tick', i, flush=True)\n"
                "    time.sleep(0.05)\n")
            while "tick 3" not in "".join(f.msg["content"].get("text", "") for f in
                                          list(c.frames._queue) if f and f.msg):
                await asyncio.sleep(0.02)
            await b.pause()
            await c.stop_reader()
            assert vm.state == "paused"
            pids = vm.host_pids()
            assert pids and all(_host_state(p) in ("T", "t", "D") for p in pids)
            await asyncio.sleep(1.0)  # frozen: nothing runs, nothing is listening
            await b.resume()
            c.start_reader()
            await c.replay()
            cell = await c.collect(msg_id, timeout_s=30)
            ticks = [ln for ln in cell.stdout.splitlines() if ln.startswith("tick")]
            assert ticks == [f"tick {i}" for i in range(30)], ticks

            # five pause/resume cycles; state survives each
            for n in range(5):
                await b.pause()
                await c.stop_reader()
                await b.resume()
                c.start_reader()
                await c.replay()
                cell = await c.execute("x += 1; x")
                assert cell.status == "ok" and cell.result_text == str(43 + n)
            dup_before = c.duplicates
            await c.backend.write(__import__("sandbox_kernel.protocol", fromlist=["x"])
                                  .host_op_frame("replay", after=c.last_seq - 3))
            await c.execute("x")
            assert c.duplicates == dup_before + 3  # replayed frames are recognised by seq

            pids = vm.host_pids()
            assert pids
        finally:
            await b.kill()
        await c.stop_reader()
        assert await b.read() == b""
        assert b.sandbox_id is None
        assert vm.state == "killed" and vm.sandbox_id not in emu.vms
        assert not [p for p in pids if _host_state(p) not in (None, "Z")]
        assert vm.cgroup is None or not vm.cgroup.exists()
        await b.kill()  # idempotent

    run(scenario())


def test_api_key_never_reaches_the_sandbox(e2b_emulator):
    emu = e2b_emulator.emu
    key = os.environ["E2B_API_KEY"]

    async def scenario():
        b = new_backend()
        await b.start()
        c = FrameClient(b)
        c.start_reader()
        try:
            await c.wait_ready()
            code = (
                "import os, glob\n"
                # reversed, so the cell's own source (kept in IPython's history) does not match
                f"key = {key[::-1]!r}[::-1]\n"
                "hits = [k for k, v in os.environ.items() if key in v or key in k]\n"
                "for p in glob.glob('/proc/[0-9]*/environ'):\n"
                "    try:\n"
                "        if key.encode() in open(p, 'rb').read(): hits.append(p)\n"
                "    except OSError: pass\n"
                "for root, _, files in os.walk('/home/user'):\n"
                "    for f in files:\n"
                "        if key.encode() in open(os.path.join(root, f), 'rb').read(): hits.append(f)\n"
                "print('HITS', hits, 'E2B' in ' '.join(os.environ))\n")
            cell = await c.execute(code)
            assert cell.stdout.strip() == "HITS [] False", cell.stdout
            vm = emu.vms[b.sandbox_id]
            assert key not in str(vm.env_vars)
            for p in vm.procs.values():
                assert key not in str(p.envs) and "E2B_API_KEY" not in p.envs
            for hp in vm.host_pids():  # what the host kernel says, too
                with open(f"/proc/{hp}/environ", "rb") as f:
                    assert key.encode() not in f.read()
        finally:
            await b.kill()
        await c.stop_reader()

    run(scenario())


def test_missing_or_wrong_key_is_credentials_missing(e2b_emulator, monkeypatch):
    monkeypatch.delenv("E2B_API_KEY")
    with pytest.raises(CredentialsMissing, match="E2B_API_KEY"):
        run(new_backend().start())
    with pytest.raises(CredentialsMissing, match="rejected the API key"):
        run(new_backend(api_key="e2b_wrong").start())
    assert not e2b_emulator.emu.vms


def test_bad_interpreter_ends_the_stream_with_its_exit_code(e2b_emulator):
    async def scenario():
        b = new_backend(python="/nonexistent/python3")
        await b.start()
        try:
            assert await asyncio.wait_for(b.read(), 30) == b""
            info = await b.exit_info()
            assert info.returncode not in (None, 0) and "exited with code" in info.cause
        finally:
            await b.kill()

    run(scenario())
    assert not e2b_emulator.emu.vms


def test_deadmans_switch(e2b_emulator):
    emu = e2b_emulator.emu

    async def scenario():
        kept, dropped = new_backend(deadman_s=2), new_backend(deadman_s=2)
        await kept.start()
        await dropped.start()
        try:
            for _ in range(8):  # 4 s: the proxy keeps refreshing one of them
                await kept.refresh()
                await asyncio.sleep(0.5)
            assert kept.sandbox_id in emu.vms
            assert dropped.sandbox_id not in emu.vms  # timed out and killed
            while await asyncio.wait_for(dropped.read(), 10):
                pass
            assert "passed its timeout" in (await dropped.exit_info()).cause
        finally:
            await kept.kill()
            await dropped.kill()

    run(scenario())


def test_the_end_of_a_sandbox_is_told_by_its_kind(e2b_emulator):
    """The agent killed inside the VM, the sandbox ended by E2B, the connection to E2B
    lost: each named as such (``exit_info``), never one vague "stream broke"."""
    emu = e2b_emulator.emu

    async def ended(b: E2BBackend) -> str:
        while await asyncio.wait_for(b.read(), 30):
            pass
        return (await b.exit_info()).cause

    async def scenario():
        killed, expired, cut = new_backend(), new_backend(), new_backend(request_timeout_s=3.0)
        try:
            for b in (killed, expired, cut):
                await b.start()
            vm = emu.vms[killed.sandbox_id]
            await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(vm.signal(killed.agent_pid, 9),
                                                                        e2b_emulator.loop))
            assert "the agent was killed by signal 9 (SIGKILL)" in await ended(killed)
            await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(emu.expire(expired.sandbox_id),
                                                                        e2b_emulator.loop))
            assert "the E2B sandbox ended: it was killed or passed its timeout" in await ended(expired)
            e2b_emulator.loop.call_soon_threadsafe(emu.outage, 30)
            await asyncio.sleep(0.2)
            cause = await ended(cut)
            assert "the connection to E2B broke" in cause and "did not say whether the sandbox lives" in cause
        finally:
            emu.down_until = 0.0
            for b in (killed, expired, cut):
                await b.kill()

    run(scenario())


def test_a_short_deadmans_switch_is_refreshed_before_it_runs_out():
    assert new_backend(api_key="unused", deadman_s=20).refresh_every_s <= 20 / 3
    assert new_backend(api_key="unused").refresh_every_s == 30  # the default, 300 s switch


def test_import_never_imports_the_sdk():
    code = ("import sys, sandbox_kernel, sandbox_kernel.backends\nfrom sandbox_kernel.backends.local import LocalBackend\n"
            "assert not [m for m in sys.modules if m.split('.')[0] in ('e2b', 'e2b_code_interpreter')]")
    subprocess.run([sys.executable, "-c", code], check=True, cwd="/", env={"PATH": "/usr/bin:/bin"})


def test_capabilities():
    caps = new_backend(api_key="unused").capabilities
    assert caps.boundary == "Firecracker microVM (E2B)"
    assert caps.pause_keeps_memory
    assert not caps.checkpoint


# ---------------------------------------------------------------------------
# The emulation itself behaves as E2B documents
# ---------------------------------------------------------------------------


def test_emulator_drops_detached_output_and_streams_on_pause(e2b_emulator):
    from e2b_code_interpreter import AsyncSandbox

    async def scenario():
        sbx = await AsyncSandbox.create(timeout=60, metadata={"test": "drop"})
        try:
            assert [s.sandbox_id for s in await AsyncSandbox.list(
                query=__import__("e2b").SandboxQuery(metadata={"test": "drop"})).next_items()] \
                == [sbx.sandbox_id]
            await sbx.files.write("/home/user/a.txt", b"hello")
            assert await sbx.files.read("/home/user/a.txt") == "hello"
            # output while nobody listens is gone
            got: list[str] = []
            h = await sbx.commands.run("sleep 0.5; echo early; sleep 1.5; echo late; sleep 30",
                                       background=True, timeout=0)
            await h.disconnect()
            await asyncio.sleep(1.0)
            h2 = await sbx.commands.connect(h.pid, timeout=0, on_stdout=got.append)
            await asyncio.sleep(1.5)
            assert "".join(got) == "late\n"
            # pause drops the open stream
            await AsyncSandbox.pause(sbx.sandbox_id)
            with pytest.raises(Exception):
                await asyncio.wait_for(h2.wait(), 10)
            await sbx.connect(timeout=60)
            procs = await sbx.commands.list()
            assert [p.pid for p in procs] == [h.pid]
            await sbx.commands.kill(h.pid)
        finally:
            await sbx.kill()

    run(scenario())


# ---------------------------------------------------------------------------
# Live: E2B's cloud (opt-in)
# ---------------------------------------------------------------------------


@pytest.mark.live
@pytest.mark.skipif(not os.environ.get("E2B_API_KEY") or os.environ.get("E2B_API_URL"),
                    reason="live E2B tests need E2B_API_KEY (and no E2B_API_URL override)")
def test_live_lifecycle():
    async def scenario():
        b = new_backend()
        await b.start()
        c = FrameClient(b)
        c.start_reader()
        try:
            await c.wait_ready(timeout_s=180)
            assert (await c.execute("x = 1; x")).result_text == "1"
            await b.refresh()
            await b.pause()
            await c.stop_reader()
            await b.resume()
            c.start_reader()
            await c.replay()
            assert (await c.execute("x + 1", timeout_s=120)).result_text == "2"
        finally:
            await b.kill()

    run(scenario(), timeout_s=600)


# ---------------------------------------------------------------------------
# Kernel-behaviour cases (../shared/cases/kernel-behaviour.md) through the SDK
# ---------------------------------------------------------------------------


def test_cases_c04_to_c08_and_c11(e2b_emulator):
    async def scenario():
        b = new_backend()
        await b.start()
        c = FrameClient(b)
        c.start_reader()
        try:
            await c.wait_ready()
            # C04: one display_data with image/png and text/plain
            cell = await c.execute("import matplotlib.pyplot as plt\n"
                                   "plt.plot([1, 3, 2]); plt.title('t'); plt.show()")
            shown = [f for f in cell.iopub if f.msg_type == "display_data"]
            assert len(shown) == 1 and {"image/png", "text/plain"} <= set(shown[0].msg["content"]["data"])
            # C05: input() with and without stdin
            msg_id = await c.send_execute("name = input('name? '); print('hi', name)", allow_stdin=True)
            cell = await c.collect(msg_id, answer="ada")
            assert cell.stdout == "hi ada\n"
            cell = await c.execute("input('x')", timeout_s=10)
            assert cell.ename == "StdinNotImplementedError"
            # C06: interrupt a busy loop, three times; state survives
            await c.execute("x = 42")
            for _ in range(3):
                msg_id = await c.send_execute("while True: pass")
                await asyncio.sleep(1.0)
                t0 = time.monotonic()
                await c.interrupt()
                assert (await c.collect(msg_id, timeout_s=10)).ename == "KeyboardInterrupt"
                assert time.monotonic() - t0 < 2.0
            assert (await c.execute("x")).result_text == "42"
            # C07: byte-exact, complete and ordered output
            assert (await c.execute('print("Hello, World")')).stdout == "Hello, World\n"
            cell = await c.execute("for i in range(20000): print(i)", timeout_s=120)
            assert cell.stdout == "".join(f"{i}\n" for i in range(20000))
            cell = await c.execute('import sys; sys.stdout.write("tail-without-newline")')
            assert cell.stdout == "tail-without-newline"
            # C08: multi-byte characters split at the file-descriptor level
            cell = await c.execute('import os, time\nb = "café☕日本語".encode()\n'
                                   "os.write(1, b[:4]); time.sleep(0.2); os.write(1, b[4:])")
            assert cell.stdout == "café☕日本語"
            cell = await c.execute('print("é" * 100000)')
            assert cell.stdout == "é" * 100000 + "\n"
            # C11: five pause/resume cycles, memory and files intact each time
            await c.execute('x = 41; open("f.txt", "w").write("a")')
            latencies = []
            for n in range(5):
                await b.pause()
                await c.stop_reader()
                t0 = time.monotonic()
                await b.resume()
                latencies.append(time.monotonic() - t0)
                c.start_reader()
                await c.replay()
                cell = await c.execute("x += 1; x, open('f.txt').read()")
                assert cell.result_text == f"({42 + n}, 'a')"
            print("resume latencies (s):", [round(t, 3) for t in latencies])
        finally:
            await b.kill()
        await c.stop_reader()

    run(scenario())
