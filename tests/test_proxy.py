"""The proxy kernel in-process over the scripted backend (fast tier): what a cell's
frontend receives when caps, timeouts, the firewall or a broken sandbox are involved.
Real sandboxes prove the same paths end to end in ``test_cases.py`` and ``tests/security``.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from fakes.backend import FakeBackend
from fakes.kernel import ProxyHarness, stderr, stdout
from sandbox_kernel.errors import AdmissionRefused
from sandbox_kernel.sandbox_state import IdleAction


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 30))


def test_a_cell_is_relayed_with_its_output_and_reply():
    async def main():
        h = ProxyHarness()
        await h.start()
        reply, iopub = await h.execute("print:hello")
        assert reply["status"] == "ok" and stdout(iopub) == "hello"
        await h.stop()

    run(main())


def test_the_byte_cap_keeps_a_prefix_and_says_what_was_dropped():
    async def main():
        h = ProxyHarness(max_output_bytes_per_cell=1000)
        await h.start()
        reply, iopub = await h.execute("flood:10:300")
        out = stdout(iopub)
        assert reply["status"] == "ok"
        assert 0 < len(out) <= 1000 and set(out) == {"x"}
        assert "output limit reached; dropped" in stderr(iopub) and "max_output_bytes_per_cell=1000" in stderr(iopub)
        reply, iopub = await h.execute("print:next cell")  # the next cell has its own budget
        assert stdout(iopub) == "next cell" and stderr(iopub) == ""
        await h.stop()

    run(main())


def test_the_rate_cap_drops_whole_messages_past_the_limit():
    async def main():
        h = ProxyHarness(max_output_msgs_per_s=100)
        await h.start()
        _, iopub = await h.execute("flood:500:1")
        assert len(stdout(iopub)) == 100
        assert "(400 whole messages)" in stderr(iopub)
        await h.stop()

    run(main())


def test_a_cell_timeout_interrupts_and_names_the_limit_and_keeps_state():
    async def main():
        h = ProxyHarness(cell_timeout_s=0.2)
        await h.start()
        reply, iopub = await h.execute("sleep")
        assert reply["ename"] == "CellTimeoutError" and "cell_timeout_s=0.2" in reply["evalue"]
        assert "state is kept" in reply["evalue"]
        assert any(m.msg_type == "error" and m.content["ename"] == "CellTimeoutError" for m in iopub)
        assert "was interrupted" in stderr(iopub)
        assert [f["op"] for f in h.fake.written].count("restart") == 0
        await h.stop()

    run(main())


def test_a_cell_that_ignores_the_timeout_interrupt_gets_a_fresh_interpreter_and_is_told():
    async def main():
        h = ProxyHarness(cell_timeout_s=0.2, interrupt_grace_s=0.2)
        await h.start()
        reply, _ = await h.execute("stubborn")
        assert reply["ename"] == "SandboxRestarted"
        assert "ignored the interrupt after cell_timeout_s=0.2 s" in reply["evalue"]
        assert [f["op"] for f in h.fake.written].count("restart") == 1
        reply, _ = await h.execute("1")  # the restarted interpreter answers
        assert reply["status"] == "ok"
        await h.stop()

    run(main())


def test_script_output_is_removed_with_a_notice_on_the_way_to_the_frontend():
    async def main():
        h = ProxyHarness()
        await h.start()
        bundle = {"application/javascript": "alert(1)", "text/plain": "<Javascript object>"}
        _, iopub = await h.execute("display:" + json.dumps(bundle))
        shown = [m.content["data"] for m in iopub if m.msg_type == "display_data"]
        assert shown == []  # nothing of it left but the default repr: not shown, as stock shows nothing
        assert stderr(iopub).count("removed JavaScript") == 1
        await h.stop()

    run(main())


def test_a_sandbox_that_dies_mid_cell_gives_a_clear_error_then_a_fresh_one():
    async def main():
        h = ProxyHarness()
        await h.start()
        task = asyncio.ensure_future(h.execute("stubborn"))
        await asyncio.sleep(0.05)
        h.fake.end()
        reply, iopub = await task
        assert reply["ename"] == "SandboxRestarted" and "the fake sandbox ended" in reply["evalue"]
        assert any(m.msg_type == "error" for m in iopub)
        reply, _ = await h.execute("1")
        assert reply["status"] == "ok" and h.fake.starts == 2
        await h.stop()

    run(main())


def test_a_request_the_interpreter_went_idle_on_without_replying_gets_an_error_reply(monkeypatch):
    """An exception inside ipykernel's handler leaves no reply; the frontend must not wait
    forever (the next request then still works)."""
    from sandbox_kernel import inflight

    monkeypatch.setattr(inflight, "IDLE_GRACE_S", 0.1)

    async def main():
        h = ProxyHarness()
        await h.start()
        reply, iopub = await h.execute("noreply")
        assert reply["ename"] == "NoReplyFromSandbox" and "state is intact" in reply["evalue"]
        reply, _ = await h.request("inspect_request", {"code": "len", "cursor_pos": 3, "detail_level": 0})
        assert reply["status"] == "ok"
        reply, _ = await h.execute("print:still here")
        assert reply["status"] == "ok"
        await h.stop()

    run(main())


async def _until(pred) -> None:
    while not pred():
        await asyncio.sleep(0)


def test_a_comm_beside_a_running_cell_leaves_every_status_with_its_own_request():
    """Issue 33, through ipykernel's own dispatch: a ``comm_msg`` arrives while a cell runs;
    the sandbox, busy in the cell, handles it only after the cell, by when the next cell
    runs.  Each request gets one ``busy`` and one ``idle`` with its own parent, as from a
    stock kernel (the next cell's idle used to go out under the first cell's parent, and
    the comm got no status at all)."""
    from fakes.backend import default_responder, jupyter_msg

    arrived: list[str] = []

    def in_order(fake, frame):  # answers only what the test says, as it says
        if frame.get("op") == "msg" and frame.get("channel") == "shell":
            arrived.append(frame["msg"]["header"]["msg_id"])
        else:
            default_responder(fake, frame)

    def cell(code):
        return jupyter_msg("execute_request", {"code": code, "silent": False, "store_history": True,
                                               "user_expressions": {}, "allow_stdin": False,
                                               "stop_on_error": True})

    async def main():
        h = ProxyHarness(FakeBackend(responder=in_order))
        await h.start()
        send = h.shell_receiver()
        first, comm, second = cell("first"), jupyter_msg("comm_msg", {"comm_id": "c0ffee", "data": {}}), cell("2")
        ids = [m["header"]["msg_id"] for m in (first, comm, second)]
        running = asyncio.ensure_future(send(first))
        await _until(lambda: ids[0] in arrived)
        beside = asyncio.ensure_future(send(comm))
        await _until(lambda: ids[1] in arrived)
        h.fake.reply(first["header"])  # the sandbox ends the cell first...
        h.fake.iopub(first["header"], "status", {"execution_state": "idle"})
        await running
        then = asyncio.ensure_future(send(second))
        await _until(lambda: ids[2] in arrived)
        h.fake.iopub(comm["header"], "status", {"execution_state": "idle"})  # ...then the comm
        await beside
        h.fake.reply(second["header"])
        h.fake.iopub(second["header"], "status", {"execution_state": "idle"})
        await then
        statuses = [(m.parent_msg_id, m.content["execution_state"]) for m in h.sent if m.msg_type == "status"]
        assert {i: [s for p, s in statuses if p == i] for i in ids} == {i: ["busy", "idle"] for i in ids}, statuses
        assert all(p in ids for p, _ in statuses), statuses
        await h.stop()

    run(main())


def test_the_kernel_is_the_face_its_parts_see():
    """``SandboxKernel`` has every member of ``KernelFace`` (what cells, subshells, the
    debugger, usage and the file comm use of it), each method with the protocol's
    parameters and kind: mypy cannot tell, the kernel's traits being a dynamic base."""
    import inspect

    from sandbox_kernel.kernel_face import KernelFace

    async def main():
        k = ProxyHarness().kernel
        members = {n: m for n, m in vars(KernelFace).items() if not n.startswith("_")}
        assert {"publish", "send_reply", "ready", "relay", "policy"} <= set(members)
        for name, declared in members.items():
            assert hasattr(k, name), name
            if isinstance(declared, property):
                continue
            mine = getattr(k, name)
            want = list(inspect.signature(declared).parameters.values())[1:]  # without self
            assert [(p.name, p.kind) for p in inspect.signature(mine).parameters.values()] == \
                [(p.name, p.kind) for p in want], name
            assert inspect.iscoroutinefunction(mine) == inspect.iscoroutinefunction(declared), name

    run(main())


def test_cells_queued_behind_a_shutdown_start_no_sandbox():
    """Issue 16: a cell runs, more are queued with ``stop_on_error=False``, the kernel is
    shut down (or restarted): the queued cells, dispatched one by one as ipykernel does,
    are refused and nothing is started for them; no sandbox is left."""

    async def main():
        h = ProxyHarness()
        await h.start()

        async def shell_queue():  # ipykernel's shell: one request after the other
            return [await h.execute(code, stop_on_error=False) for code in ("sleep", "print:a", "print:b")]

        cells = asyncio.ensure_future(shell_queue())
        await _until(lambda: bool(h.kernel.relay.pending))
        gate = h.fake.gates["kill"] = asyncio.Event()
        stopping = asyncio.ensure_future(h.kernel.do_shutdown(True))  # a restart: same path
        await _until(lambda: h.kernel.relay.shut_down)
        # while the shutdown still removes the sandbox, a request that comes is refused
        reply, iopub = await h.execute("print:late")
        assert reply["ename"] == "KernelShuttingDown" and "shutting down" in reply["evalue"]
        # the running cell and those queued behind it are answered before the kill ends
        # (a frontend stops waiting 2.5 s after shutdown_request; the kill may take longer)
        (first, _), *queued = await asyncio.wait_for(cells, 10)
        assert not stopping.done()
        gate.set()
        assert (await stopping)["restart"] is True
        assert first["ename"] == "KernelShuttingDown" and "a shutdown or restart was requested" in first["evalue"]
        for reply, iopub in queued:
            assert reply["ename"] == "KernelShuttingDown" and stdout(iopub) == ""
        assert h.fake.starts == 1 and not h.fake.alive
        await h.stop()

    run(main())


def test_a_shutdown_during_the_first_start_waits_for_it_and_removes_the_sandbox():
    async def main():
        h = ProxyHarness()
        gate = h.fake.gates["start"] = asyncio.Event()
        h.kernel.start_sandbox()
        await _until(lambda: h.kernel.relay.state.value == "starting")
        stopping = asyncio.ensure_future(h.kernel.do_shutdown(False))
        await _until(lambda: h.kernel.relay.shut_down)
        await asyncio.sleep(0)
        assert not stopping.done()
        gate.set()
        await stopping
        assert h.fake.starts == 1 and not h.fake.alive
        reply, _ = await h.execute("print:a")
        assert reply["ename"] == "KernelShuttingDown" and h.fake.starts == 1
        await h.stop()

    run(main())


def _progress(iopub):
    return [m for m in iopub if m.msg_type in ("display_data", "update_display_data", "clear_output")]


async def _shown(h: ProxyHarness, text: str) -> None:
    """Until a progress line holding ``text`` was published (the condition, not a delay:
    a loaded machine may take longer than any margin)."""
    while not any(text in str(m.content.get("data", {}).get("text/plain", "")) for m in _progress(h.sent)):
        await asyncio.sleep(0.01)


@pytest.fixture
def quick_progress(monkeypatch):
    """The progress line after 0.05 s and every 0.05 s (1 s in use), so the fast tier sees it."""
    from sandbox_kernel import cells

    monkeypatch.setattr(cells, "PROGRESS_AFTER_S", 0.05)
    monkeypatch.setattr(cells, "PROGRESS_EVERY_S", 0.05)


async def _checkpointed() -> tuple[ProxyHarness, asyncio.Event]:
    """A started harness whose sandbox is checkpointed, its resume held by the returned gate."""
    h = ProxyHarness()
    await h.start()
    assert await h.kernel.relay.suspend(IdleAction.CHECKPOINT, idle_s=60, min_idle_s=0)
    gate = h.fake.gates["resume"] = asyncio.Event()
    return h, gate


def test_a_cell_waiting_for_a_restore_shows_what_it_waits_for_then_clears_it(quick_progress):
    """The wait is shown in the waiting cell while it lasts (what, and for how long),
    updated in place, and cleared before the cell's own notice and output."""

    async def main():
        h, gate = await _checkpointed()
        h.fake.waiting_for = "memory to restore this kernel (the machine is full)"

        async def free_memory_then_restore():
            await asyncio.wait_for(_shown(h, "waiting for memory"), 60)
            h.fake.waiting_for = None
            await asyncio.wait_for(_shown(h, "restoring the sandbox"), 60)
            gate.set()

        freeing = asyncio.ensure_future(free_memory_then_restore())
        reply, iopub = await h.execute("print:after the wake")
        await freeing
        assert reply["status"] == "ok" and stdout(iopub) == "after the wake"
        shown = _progress(iopub)
        assert shown[0].msg_type == "display_data" and shown[-1].msg_type == "clear_output"
        texts = [m.content["data"]["text/plain"] for m in shown[:-1]]
        assert {m.msg_type for m in shown[1:-1]} == {"update_display_data"}
        assert len({m.content["transient"]["display_id"] for m in shown[:-1]}) == 1  # one line, updated
        assert texts[0].startswith("sandbox-kernel: waiting for memory to restore this kernel")
        assert texts[-1].startswith("sandbox-kernel: restoring the sandbox from its checkpoint… ")
        # cleared before anything of the cell's own: the notice and the output follow the clear
        order = [m.msg_type for m in iopub]
        assert order.index("clear_output") < order.index("stream")
        assert "restored from a checkpoint" in stderr(iopub)
        await h.stop()

    run(main())


def test_a_quick_wake_shows_no_progress_and_a_failed_one_clears_it(quick_progress):
    async def main():
        h = ProxyHarness()
        await h.start()
        assert await h.kernel.relay.suspend(IdleAction.PAUSE, idle_s=60, min_idle_s=0)
        reply, iopub = await h.execute("print:quick")
        assert reply["status"] == "ok" and _progress(iopub) == []
        await h.stop()
        h, gate = await _checkpointed()
        h.fake.raises["resume"] = AdmissionRefused("not enough memory on this machine", resource="memory",
                                                   need=512, available=100, unit="MiB")
        async def open_once_shown():
            await asyncio.wait_for(_shown(h, "sandbox-kernel: "), 60)
            gate.set()

        opening = asyncio.ensure_future(open_once_shown())
        reply, iopub = await h.execute("print:refused")
        await opening
        assert reply["ename"] == "AdmissionRefused"
        order = [m.msg_type for m in iopub]
        assert order[0] == "display_data" and "clear_output" in order
        assert order.index("clear_output") < order.index("error")  # the error stays visible
        await h.stop()

    run(main())


def test_state_lost_is_said_even_when_the_fresh_start_is_refused():
    """An idle stop lost the state; the next cell's fresh start is refused (no disk for
    checkpoints, no memory): that cell shows the refusal and that state was lost, and the
    start that succeeds later says again that this is a fresh interpreter."""

    async def main():
        h = ProxyHarness()
        await h.start()
        assert await h.kernel.relay.suspend(IdleAction.STOP, idle_s=4, min_idle_s=0)
        for _ in range(2):  # refused twice: told both times
            h.fake.raises["start"] = AdmissionRefused("not enough disk for this sandbox's checkpoints",
                                                      resource="disk", need=256, available=19, unit="MiB")
            reply, iopub = await h.execute("print:refused")
            assert reply["ename"] == "AdmissionRefused"
            assert "sandbox stopped after 4 s idle; state was lost" in stderr(iopub)
        reply, iopub = await h.execute("print:fresh")
        assert reply["status"] == "ok" and stdout(iopub) == "fresh"
        assert "state was lost; this is a fresh interpreter" in stderr(iopub)
        reply, iopub = await h.execute("print:again")
        assert stderr(iopub) == ""  # said until a sandbox came back, not after
        await h.stop()

    run(main())


def _large_blocks_in_heap(env: dict[str, str], keep: bool) -> tuple[str, int]:
    """In a fresh Python (the proxy's code, no cell code): whether ``keep_freed_blocks`` took
    effect, and how many of three 2 MiB buffers lie in the heap (``[heap]`` of
    /proc/self/maps; CPython's ``id`` is an object's address) rather than in a mapping of
    their own."""
    import os
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent(f"""
        from sandbox_kernel.app import keep_freed_blocks
        took = keep_freed_blocks() if {keep!r} else None
        blobs = [bytes(2 << 20) for _ in range(3)]
        lo, hi = next([int(x, 16) for x in line.split()[0].split("-")]
                      for line in open("/proc/self/maps") if line.rstrip().endswith("[heap]"))
        print(took, sum(lo <= id(b) < hi for b in blobs))
    """)
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True,
                         text=True, check=True, timeout=60).stdout.split()
    return out[0], int(out[1])


def test_the_proxy_keeps_large_freed_blocks_in_its_heap():
    """A 1 MB image is a few ~1.4 MB buffers in the proxy, freed once relayed: the proxy
    takes them from its heap (and keeps them there for the next output) instead of a
    mapping of their own each, which glibc returns to the kernel at once
    (app.keep_freed_blocks).  An operator's own MALLOC_* settings are left in force."""
    took, in_heap = _large_blocks_in_heap({}, keep=True)
    assert took == "True" and in_heap == 3
    assert _large_blocks_in_heap({}, keep=False)[1] == 0  # glibc's defaults: a mapping each
    assert _large_blocks_in_heap({"MALLOC_TRIM_THRESHOLD_": "131072"}, keep=True)[0] == "False"
