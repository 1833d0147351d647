"""The proxy kernel in-process over the scripted backend (fast tier): what a cell's
frontend receives when caps, timeouts, the firewall or a broken sandbox are involved.
Real sandboxes prove the same paths end to end in ``test_cases.py`` and ``tests/security``.
"""

from __future__ import annotations

import asyncio
import json

from fakes.kernel import ProxyHarness, stderr, stdout


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
