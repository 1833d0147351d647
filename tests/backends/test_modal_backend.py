"""The Modal backend through the real ``modal`` client, against a local emulation.

The emulator (``tests/emulators/modal_emulator.py``) is a gRPC service on a
random loopback port; the client is pointed at it with ``MODAL_SERVER_URL``
and fake tokens.  Behind it every sandbox command runs in bubblewrap as uid
65534, so the real agent and a real ipykernel answer; no cell runs on the host.

Tests marked ``live`` talk to Modal itself and run only with credentials
(``MODAL_TOKEN_ID``/``MODAL_TOKEN_SECRET``) and ``SANDBOX_KERNEL_LIVE=1``.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import time
import uuid

import pytest
from sandbox_kernel import protocol
from sandbox_kernel.policy import Policy

from backends.framing import FrameClient

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="the emulated sandbox needs bubblewrap")

def make_backend(**options):
    from sandbox_kernel.backends.modal import ModalBackend

    policy = Policy(memory_mib=1024, cpu_cores=1.0, lifetime_s=600)
    return ModalBackend(policy, kernel_id=f"test-{uuid.uuid4().hex[:8]}", **options)


def run(coro, timeout: float = 240):
    return asyncio.run(asyncio.wait_for(coro, timeout))


async def attach(backend, timeout_s: float = 120) -> tuple[FrameClient, dict]:
    """A frame client on a started backend, after the agent's ``ready``."""
    fc = FrameClient(backend)
    fc.start_reader()
    ready = await fc.wait_ready(timeout_s)
    return fc, ready.body


def detach(fc: FrameClient) -> None:
    if fc.reader is not None:
        fc.reader.cancel()


# ----------------------------------------------------------------------------
# Without a sandbox
# ----------------------------------------------------------------------------


def test_import_never_imports_modal():
    code = ("import sys, sandbox_kernel, sandbox_kernel.backends, sandbox_kernel.policy;"
            "from sandbox_kernel.backends import load_backend, available_backends;"
            "assert 'modal' in available_backends();"
            "assert 'modal' not in sys.modules, 'importing sandbox_kernel imported modal'")
    subprocess.run([sys.executable, "-I", "-c", code], check=True, timeout=60)


def test_module_gets_the_sdk_not_itself():
    from sandbox_kernel.backends import load_backend
    from sandbox_kernel.backends.modal import _modal

    assert load_backend("modal").__name__ == "ModalBackend"
    assert hasattr(_modal(), "Sandbox") and hasattr(_modal(), "Image")


def test_policy_maps_to_sandbox_options():
    b = make_backend(gpu="T4", idle_timeout_s=120)
    kw = b.sandbox_kwargs()
    assert kw["cpu"] == 1.0 and kw["memory"] == 1024 and kw["timeout"] == 600
    assert kw["block_network"] is True and kw["gpu"] == "T4" and kw["idle_timeout"] == 120
    assert kw["tags"]["sandbox-kernel.kernel_id"] == b.kernel_id
    assert not any(k.startswith("MODAL_") for k in kw["env"])
    caps = b.capabilities
    assert caps.boundary == "gVisor container (Modal)"
    assert caps.pause_keeps_memory is False
    assert make_backend(memory_snapshots=True).capabilities.pause_keeps_memory is True


# ----------------------------------------------------------------------------
# Through the emulation
# ----------------------------------------------------------------------------


def test_kill_and_restart_use_the_sdk_calls_and_start_fresh(modal_emulator):
    """Modal's own part (the shared script is tests/backends/test_contract.py)."""
    async def main():
        b = make_backend()
        try:
            await b.start()
            fc, ready = await attach(b)
            assert ready["kernel_info"]["language_info"]["name"] == "python"

            cell = await fc.execute("x = 41\nx + 1")
            assert cell.status == "ok" and cell.result_text == "42"

            detach(fc)

            await b.kill()
            assert modal_emulator.running() == []
            await b.kill()  # idempotent

            await b.start()
            fc, _ = await attach(b)
            cell = await fc.execute("x")
            assert cell.ename == "NameError", "a restarted sandbox must start fresh"
            detach(fc)
        finally:
            await b.kill()

    run(main())
    assert modal_emulator.unimplemented == []
    calls = set(modal_emulator.state.calls)
    assert {"SandboxCreateV2", "TaskExecStart", "TaskExecStdinWrite", "TaskExecStdioRead",
            "SandboxTerminateV2"} <= calls
    sandboxes = list(modal_emulator.state.sandboxes.values())
    assert len(sandboxes) == 2
    d = sandboxes[0].definition
    from modal_proto import api_pb2

    assert d.network_access.network_access_type == api_pb2.NetworkAccess.BLOCKED
    assert d.timeout_secs == 600 and d.idle_timeout_secs == 600
    assert d.resources.memory_mb == 1024 and d.resources.milli_cpu == 1000


def test_a_killed_agent_and_an_ended_sandbox_are_told_apart(modal_emulator):
    """The agent's process killed inside the container is named with its signal; the
    sandbox ended by Modal (its timeout) is named as the sandbox's end."""
    from modal_proto import api_pb2

    async def ended(b) -> str:
        while await asyncio.wait_for(b.read(), 30):
            pass
        return (await b.exit_info()).cause

    async def main():
        killed, expired = make_backend(), make_backend()
        try:
            for b in (killed, expired):
                await b.start()
                fc, _ = await attach(b)
                detach(fc)
            sb = modal_emulator.state.sandboxes[killed.describe()["sandbox_id"]]
            agent = next(ex for ex in sb.execs.values() if any("agent" in a for a in ex.argv))
            agent.proc.kill()  # its bubblewrap: the agent and everything it started
            assert "the agent was killed by signal 9 (SIGKILL)" in await ended(killed)
            sb = modal_emulator.state.sandboxes[expired.describe()["sandbox_id"]]
            await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(modal_emulator.state.finish(
                sb, api_pb2.GenericResult(status=api_pb2.GenericResult.GENERIC_STATUS_TIMEOUT)),
                modal_emulator._loop))
            assert "the Modal sandbox ended" in await ended(expired)
        finally:
            for b in (killed, expired):
                await b.kill()

    run(main())
    assert modal_emulator.running() == []


def test_credentials_never_reach_the_sandbox(modal_emulator):
    FAKE_ID, FAKE_SECRET = modal_emulator.token_id, modal_emulator.token_secret
    # The probe never spells the tokens (history and the cell's source would then
    # hold them): it gets them reversed and reverses them inside.
    probe = (
        "import os\n"
        f"tid, tsec = {FAKE_ID[::-1]!r}[::-1], {FAKE_SECRET[::-1]!r}[::-1]\n"
        "leaks = sorted(k for k, v in os.environ.items() if k.startswith('MODAL_') or tid in v or tsec in v)\n"
        "files = []\n"
        "for root in ('/home', '/tmp', '/root', '/etc', '/opt'):\n"
        "    for dp, dn, fn in os.walk(root):\n"
        "        for f in fn:\n"
        "            try:\n"
        "                data = open(os.path.join(dp, f), 'rb').read(1 << 20)\n"
        "            except OSError:\n"
        "                continue\n"
        "            if tsec.encode() in data or tid.encode() in data:\n"
        "                files.append(os.path.join(dp, f))\n"
        "for p in os.listdir('/proc'):\n"
        "    for name in ('environ', 'cmdline'):\n"
        "        try:\n"
        "            data = open(f'/proc/{p}/{name}', 'rb').read()\n"
        "        except OSError:\n"
        "            continue\n"
        "        if tsec.encode() in data or tid.encode() in data:\n"
        "            files.append(f'/proc/{p}/{name}')\n"
        "print(leaks, files)"
    )

    async def main():
        b = make_backend()
        try:
            await b.start()
            fc, _ = await attach(b)
            cell = await fc.execute(probe)
            detach(fc)
            return cell
        finally:
            await b.kill()

    cell = run(main())
    assert cell.status == "ok", cell.reply
    assert cell.stdout.strip() == "[] []"
    # The client did authenticate with them...
    assert (FAKE_ID, FAKE_SECRET) in modal_emulator.state.credentials_seen
    # ...and nothing the sandbox was given carries them.
    for sb in modal_emulator.state.sandboxes.values():
        given = repr(sb.definition) + repr(sb.env)
        given += "".join(repr(ex.argv) + repr(ex.env) for ex in sb.execs.values())
        assert FAKE_ID not in given and FAKE_SECRET not in given


def test_kernel_cases_through_the_client(modal_emulator):
    """Cases C04-C08 (kernel-behaviour.md) at the backend level; C10 below."""

    async def main():
        b = make_backend()
        try:
            await b.start()
            fc, _ = await attach(b)
            out = {}
            out["c04"] = await fc.execute(
                "import matplotlib\nmatplotlib.use('module://matplotlib_inline.backend_inline')\n"
                "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2]); plt.title('t'); plt.show()")
            out["c05"] = await fc.execute("name = input('name? '); print('hi', name)", timeout_s=10)
            msg_id = await fc.send_execute("name = input('name? '); print('hi', name)", allow_stdin=True)
            out["c05b"] = await fc.collect(msg_id, timeout_s=10, answer="ada")
            await fc.execute("x = 42")
            for _ in range(3):  # C06: repeated interrupts of a busy loop
                msg_id = await fc.send_execute("while True: pass")
                await asyncio.sleep(0.5)
                await fc.interrupt()
                cell = await fc.collect(msg_id, timeout_s=10)
                assert cell.ename == "KeyboardInterrupt"
            out["c06"] = await fc.execute("x")
            out["c07a"] = await fc.execute("print('Hello, World')")
            out["c07b"] = await fc.execute("for i in range(20000): print(i)", timeout_s=120)
            out["c07c"] = await fc.execute("import sys; sys.stdout.write('tail-without-newline')")
            out["c08"] = await fc.execute("print('\\u00e9' * 100000)")
            out["c08b"] = await fc.execute("print('caf\\u00e9\\u2615\\u65e5\\u672c\\u8a9e')")
            detach(fc)
            return out
        finally:
            await b.kill()

    out = run(main(), timeout=400)
    figs = [f.msg for f in out["c04"].iopub if f.msg_type == "display_data"]
    assert len(figs) == 1 and {"image/png", "text/plain"} <= set(figs[0]["content"]["data"])
    assert out["c05"].ename == "StdinNotImplementedError"
    assert out["c05b"].stdout == "hi ada\n"
    assert out["c06"].result_text == "42"
    assert out["c07a"].stdout == "Hello, World\n"
    assert out["c07b"].stdout == "".join(f"{i}\n" for i in range(20000))
    assert out["c07c"].stdout == "tail-without-newline"
    assert out["c08"].stdout == "\u00e9" * 100000 + "\n"
    assert out["c08b"].stdout == "caf\u00e9\u2615\u65e5\u672c\u8a9e\n"


def test_c10_stop_then_fresh_interpreter_and_server_side_idle(modal_emulator):
    """Modal cannot pause memory by default: a stop loses state, and says so
    through the capabilities; the server-side idle timeout reaps a sandbox
    whose agent is gone."""

    async def main():
        b = make_backend(idle_timeout_s=1)
        try:
            assert b.capabilities.pause_keeps_memory is False
            await b.start()
            fc, _ = await attach(b)
            assert (await fc.execute("x = 1")).status == "ok"
            # The agent ends (a cell cannot end it: the host asks it to).
            await b.write(protocol.host_op_frame("shutdown"))
            while await asyncio.wait_for(b.read(), 30):
                pass
            info = await b.exit_info()
            assert info.cause
            # No exec left running: Modal's idle_timeout (1 s here) ends the sandbox.
            deadline = time.monotonic() + 15
            while modal_emulator.running() and time.monotonic() < deadline:
                await asyncio.sleep(0.2)
            assert modal_emulator.running() == []
            detach(fc)
            await b.start()
            fc, _ = await attach(b)
            assert (await fc.execute("x")).ename == "NameError"
            detach(fc)
        finally:
            await b.kill()

    run(main())


_HOLDER = """
import asyncio, sys, uuid
from sandbox_kernel.backends.modal import ModalBackend
from sandbox_kernel.policy import Policy

async def main():
    b = ModalBackend(Policy(memory_mib=1024, lifetime_s=600), kernel_id="test-" + uuid.uuid4().hex[:8],
                     deadman_s=3, idle_timeout_s=1)
    await b.start()
    while b"ready" not in await b.read():
        pass
    print(b.describe()["sandbox_id"], flush=True)
    await asyncio.sleep(3600)

asyncio.run(main())
"""


def test_a_killed_proxys_sandbox_ends_by_the_agents_dead_mans_switch(modal_emulator):
    """Modal's exec stream outlives its client, so a SIGKILLed proxy's agent never sees
    stdin end: it ends after ``deadman_s`` without a frame (the live proxy's keepalive
    every deadman_s / 3 holds it off while idle), then ``idle_timeout`` ends the sandbox,
    long before its ``timeout``."""
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        assert holder.stdout is not None
        sandbox_id = holder.stdout.readline().strip()
        assert modal_emulator.running() == [sandbox_id]
        time.sleep(7)  # more than deadman_s idle: the keepalive holds it
        assert modal_emulator.running() == [sandbox_id]
    finally:
        holder.kill()
        holder.wait()
    t0 = time.monotonic()
    while modal_emulator.running() and time.monotonic() - t0 < 30:
        time.sleep(0.2)
    # not its timeout (lifetime_s=600): deadman_s + idle_timeout_s, and the emulator's poll
    assert modal_emulator.running() == [], "the killed proxy's sandbox still runs"


def test_rejected_credentials_are_mapped(modal_emulator, monkeypatch):
    from sandbox_kernel.errors import CredentialsMissing

    modal_emulator.state.require_credentials = (modal_emulator.token_id, modal_emulator.token_secret)
    monkeypatch.setenv("MODAL_TOKEN_SECRET", "as-wrong")

    async def main():
        b = make_backend()
        with pytest.raises(CredentialsMissing) as info:
            await b.start()
        return info.value

    err = run(main(), timeout=120)
    assert "modal token new" in str(err) and err.__cause__ is not None
    assert modal_emulator.state.sandboxes == {}


# ----------------------------------------------------------------------------
# Live (opt-in)
# ----------------------------------------------------------------------------


@pytest.mark.live
@pytest.mark.skipif(not (os.environ.get("MODAL_TOKEN_ID") and os.environ.get("MODAL_TOKEN_SECRET")
                         and os.environ.get("SANDBOX_KERNEL_LIVE") == "1"),
                    reason="live Modal test: set MODAL_TOKEN_ID, MODAL_TOKEN_SECRET and SANDBOX_KERNEL_LIVE=1")
def test_live_lifecycle():
    async def main():
        b = make_backend(idle_timeout_s=300)
        try:
            await b.start()
            fc, _ = await attach(b, 600)
            assert (await fc.execute("x = 41\nx + 1")).result_text == "42"
            msg_id = await fc.send_execute("import time; time.sleep(30)")
            await asyncio.sleep(2)
            await fc.interrupt()
            assert (await fc.collect(msg_id, timeout_s=30)).ename == "KeyboardInterrupt"
            assert (await fc.execute("x")).result_text == "41"
            detach(fc)
        finally:
            await b.kill()

    run(main(), timeout=900)
