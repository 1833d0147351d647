"""One lifecycle script, every backend: the contract of ``backends/base.py``, kept.

The script drives each backend through the real :class:`~sandbox_kernel.relay.Relay`
(the contract's only client), as the proxy does: start, execute, interrupt,
idle (pause and resume, checkpoint and restore, or stop, by what the backend
declares in its ``Capabilities``), execute again, shut down and leave nothing.
Targets: the local backend on gVisor and on bubblewrap, and E2B and Modal
through their real SDKs against the local emulations (``tests/emulators``),
where every command runs in bubblewrap.  No cell runs on the host.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid

import pytest
from fakes.host import RecordingHost, request, result_text, run_cell
from sandbox_kernel.backends import load_backend
from sandbox_kernel.policy import Policy
from sandbox_kernel.relay import Relay
from sandbox_kernel.sandbox_state import IdleAction, SandboxState

log = logging.getLogger("test_contract")

TARGETS = ["gvisor", "bubblewrap", "e2b", "modal"]


@pytest.fixture(params=TARGETS)
def target(request):
    """``(backend name, options)`` for each target, with its emulation running."""
    name = request.param
    if name in ("e2b", "modal"):
        pytest.importorskip({"e2b": "e2b_code_interpreter", "modal": "modal"}[name])
        request.getfixturevalue(f"{name}_emulator")
        return name, Policy(), {}
    return "local", Policy(), {"runtime": name}


def make_relay(target) -> tuple[Relay, RecordingHost]:
    name, policy, options = target
    backend = load_backend(name)(policy, uuid.uuid4().hex, log=log, **options)
    host = RecordingHost()
    return Relay(backend, host, max_frame_bytes=policy.max_frame_bytes, log=log), host


async def cell(relay: Relay, host: RecordingHost, code: str, timeout: float = 120):
    reply = await run_cell(relay, code, timeout=timeout)
    return reply.msg["content"], result_text(host, reply)


def test_the_lifecycle_script(target):
    lifecycle_script(target)


def lifecycle_script(target) -> None:
    """The script on one target ``(backend name, policy, options)``; also run by the
    backends tested against a cluster of their own (``test_ray_backend.py``)."""

    async def main():
        relay, host = make_relay(target)
        caps = relay.backend.capabilities
        try:
            await asyncio.wait_for(relay.start(), 300)
            assert relay.state is SandboxState.RUNNING
            info = relay.describe()
            assert info["backend"] == relay.backend.name and info["boundary"] == relay.backend.capabilities.boundary
            assert relay.kernel_info["language_info"]["name"] == "python"

            content, text = await cell(relay, host, "x = 41\nx + 1")
            assert content["status"] == "ok" and text == "42"

            # interrupt: SIGINT to the interpreter through the agent
            p = await relay.send_request("shell", request("import time; time.sleep(60)"), [])
            await asyncio.sleep(1.0)
            t0 = time.monotonic()
            await relay.interrupt()
            reply = await asyncio.wait_for(relay.wait(p), 30)
            assert reply.msg["content"]["ename"] == "KeyboardInterrupt"
            assert time.monotonic() - t0 < 10

            # idle: by what the backend declares it can do
            if caps.pause_keeps_memory:
                for n in range(2):
                    assert await relay.suspend(IdleAction.PAUSE, idle_s=1, min_idle_s=0)
                    assert relay.state is SandboxState.PAUSED
                    _, text = await cell(relay, host, "x += 1; x")  # wakes it
                    assert text == str(42 + n)
            if caps.checkpoint:
                assert await relay.suspend(IdleAction.CHECKPOINT, idle_s=1, min_idle_s=0)
                assert relay.state is SandboxState.CHECKPOINTED
                _, text = await cell(relay, host, "x")
                assert text == str(41 + 2 * caps.pause_keeps_memory)
                assert relay.counts["restore"] == 1
            assert await relay.suspend(IdleAction.STOP, idle_s=1, min_idle_s=0)
            assert relay.state is SandboxState.STOPPED
            told = await relay.ensure_running()
            assert told and "state was lost" in told
            content, _ = await cell(relay, host, "x")
            assert content["ename"] == "NameError"
        finally:
            await relay.shutdown()
        assert relay.state is SandboxState.SHUT_DOWN
        assert await relay.backend.read() == b""
        await relay.backend.kill()  # idempotent

    asyncio.run(asyncio.wait_for(main(), 600))
