"""The relay against a scripted backend (fast tier): the agent's channel is strict.

A broken channel must fail loudly, never leave a request pending: a frame out
of order (ahead or behind), bytes between frames, a reply for no request, a
reply twice, an oversized frame, and a live but silent agent each end the
pending request with "the sandbox's channel was corrupted: <what>" (or "...
stopped answering"), and the next request runs in a fresh sandbox.
"""

from __future__ import annotations

import asyncio
import logging
import uuid

import pytest
from fakes.backend import FakeBackend, default_responder, jupyter_msg
from fakes.host import RecordingHost, request, run_cell
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sandbox_kernel import channel as channel_mod
from sandbox_kernel import inflight as inflight_mod
from sandbox_kernel import protocol
from sandbox_kernel.errors import NoReply, SandboxDied
from sandbox_kernel.relay import Relay

log = logging.getLogger("test_relay")


async def started(fake: FakeBackend | None = None, max_frame_bytes: int = 1 << 20):
    fake = fake or FakeBackend()
    relay = Relay(fake, RecordingHost(), max_frame_bytes=max_frame_bytes, log=log)
    await relay.start()
    return fake, relay


async def corrupted(relay: Relay, fake: FakeBackend, inject, code: str = "sleep") -> str:
    """Start a cell, let ``inject(fake, header)`` misbehave; return what the user is told:
    the cell's error, or (when the cell had its reply first) the next cell's notice."""
    p = await relay.send_request("shell", request(code), [])
    inject(fake, p.parent["header"])
    try:
        await asyncio.wait_for(relay.wait(p), 5)
    except SandboxDied as err:
        return err.cause
    for _ in range(200):  # the replacement starts in the background
        if relay.state == "running" and relay.last_seq == 1:
            break
        await asyncio.sleep(0.01)
    notice = await relay.ensure_running()
    assert notice, "the corruption was told to nobody"
    return notice


@pytest.fixture
def fast_liveness(monkeypatch):
    monkeypatch.setattr(channel_mod, "LIVENESS_TICK_S", 0.02)
    monkeypatch.setattr(channel_mod, "PING_AFTER_S", 0.1)
    monkeypatch.setattr(channel_mod, "PONG_TIMEOUT_S", 0.2)
    monkeypatch.setattr(inflight_mod, "IDLE_GRACE_S", 0.1)


def test_a_cell_gets_its_reply_after_its_output():
    async def main():
        fake, relay = await started()
        reply = await run_cell(relay, "print:hi")
        assert reply.msg_type == "execute_reply"
        assert relay.host.iopub == [("stream", reply.parent_msg_id)]
        assert relay.describe()["channel_guard"] == fake.guard
        await relay.shutdown()

    asyncio.run(main())


def _forged_next_frame(fake, header):
    # the one line, with the number the genuine agent would use next
    fake.emit_raw(protocol.encode_frame({"seq": fake.next_seq, "op": "log", "text": "x"}))
    fake.reply(header)


def _far_ahead(fake, header):
    fake.emit_raw(b'{"seq":999999,"op":"log","text":"x"}\n')
    fake.reply(header)


def _glued_garbage(fake, header):
    fake.emit_raw(b"\x00garbage without a newline")
    fake.reply(header)


def _reply_for_nobody(fake, header):
    fake.reply({**header, "msg_id": "no-such-request"})


def _reply_twice(fake, header):
    fake.iopub(header, "status", {"execution_state": "busy"})
    fake.reply(header)
    fake.reply(header)


def _forged_reply_then_genuine(fake, header):
    fake.emit_raw(protocol.encode_frame({"seq": fake.next_seq, "op": "msg", "channel": "shell",
                                         "msg": jupyter_msg("execute_reply", {"status": "ok"}, header)}))
    fake.reply(header)


def _repeated_frame(fake, header):
    seq = fake.iopub(header, "status", {"execution_state": "busy"})
    fake.emit_raw(fake._agent.sent[seq - 1][1])
    fake.reply(header)


@pytest.mark.parametrize("inject, what", [
    (_forged_next_frame, "arrived when"),
    (_far_ahead, "frame 999999 arrived when"),
    (_glued_garbage, "not a frame"),
    (_reply_for_nobody, "for a request that does not exist"),
    (_reply_twice, "a second execute_reply"),
    (_forged_reply_then_genuine, "arrived when"),
    (_repeated_frame, "repeated or forged"),
])
def test_a_corrupted_channel_fails_the_cell_loudly_and_the_next_cell_runs_fresh(inject, what):
    async def main():
        fake, relay = await started()
        told = await corrupted(relay, fake, inject)
        assert "the sandbox's channel was corrupted" in told and what in told
        assert any(e == "died" and what in d for e, d in relay.host.events)
        reply = await run_cell(relay, "1")  # a fresh sandbox answers
        assert reply.msg["content"]["status"] == "ok"
        assert fake.starts == 2
        await relay.shutdown()

    asyncio.run(main())


def test_an_oversized_frame_is_corruption():
    async def main():
        fake, relay = await started(max_frame_bytes=4096)
        told = await corrupted(relay, fake, lambda f, h: f.emit_raw(b'{"seq":9,' + b"x" * 10000 + b"\n"))
        assert "over 4096 bytes" in told
        await relay.shutdown()

    asyncio.run(main())


def test_corruption_between_cells_is_told_to_the_next_cell():
    async def main():
        fake, relay = await started()
        await run_cell(relay)
        fake.emit_raw(b"junk\n")
        for _ in range(100):
            if fake.starts == 2 and relay.state == "running":
                break
            await asyncio.sleep(0.01)
        notice = await relay.ensure_running()
        assert notice and "channel was corrupted" in notice and "variables and imports were lost" in notice
        await relay.shutdown()

    asyncio.run(main())


def test_a_live_but_silent_sandbox_fails_the_pending_cell(fast_liveness):
    async def main():
        fake = FakeBackend(responder=lambda f, frame: None)  # reads everything, says nothing
        fake, relay = await started(fake)
        told = await corrupted(relay, fake, lambda f, h: None)
        assert "stopped answering" in told
        assert [f["op"] for f in fake.written].count("ping") == 1
        await relay.shutdown()

    asyncio.run(main())


def test_a_long_cell_on_a_live_agent_keeps_waiting(fast_liveness):
    async def main():
        fake, relay = await started()
        p = await relay.send_request("shell", request("sleep"), [])
        await asyncio.sleep(1.0)  # many ping/pong rounds
        assert not p.reply.done() and relay.state == "running"
        assert [f["op"] for f in fake.written].count("ping") >= 2
        fake.reply(p.parent["header"])
        fake.iopub(p.parent["header"], "status", {"execution_state": "idle"})
        assert (await asyncio.wait_for(relay.wait(p), 5)).msg_type == "execute_reply"
        await relay.shutdown()

    asyncio.run(main())


def test_a_replay_may_repeat_frames_and_cut_a_line_then_numbers_are_strict_again():
    async def main():
        fake, relay = await started()
        await run_cell(relay, "print:a")
        seen = relay.last_seq

        def detached_then_replay(f, frame):
            if frame["op"] == "replay":
                f.emit_raw(b'q":1,"op":"log"}\n')  # the detach cut this line
                f.emit_raw(f._agent.sent[seen - 2][1])  # a frame in flight arrives twice
            default_responder(f, frame)  # replays what follows `seen` (nothing), then "replayed"

        fake.responder = detached_then_replay
        await relay.reattach()
        fake.responder = default_responder
        await run_cell(relay, "print:b")
        assert relay.last_seq > seen and fake.starts == 1
        told = await corrupted(relay, fake, _repeated_frame)  # the replay is over
        assert "repeated or forged" in told
        await relay.shutdown()

    asyncio.run(main())


def _written_unseen(fake: FakeBackend, header: dict, text: str) -> None:
    """A stdout frame the agent wrote while nobody read the stream (a pause or a cut
    connection): numbered and kept for replay, never delivered."""
    agent = fake._agent
    agent.seq += 1
    agent.sent.append((agent.seq, protocol.encode_frame(
        {"seq": agent.seq, "op": "msg", "channel": "iopub", "buffers": [],
         "msg": jupyter_msg("stream", {"name": "stdout", "text": text}, header)})))


async def _running_cell_with_a_gap(fake: FakeBackend, relay: Relay, lost: str):
    """A cell that printed ``a`` (delivered), then ``lost`` while detached."""
    p = await relay.send_request("shell", request("sleep"), [])
    header = p.parent["header"]
    fake.iopub(header, "status", {"execution_state": "busy"})
    fake.iopub(header, "stream", {"name": "stdout", "text": "a"})
    for _ in range(500):
        if relay.last_seq == fake._agent.seq:
            break
        await asyncio.sleep(0.01)
    for text in lost:
        _written_unseen(fake, header, text)
    return p, header


def _stdout(relay: Relay, p) -> str:
    return "".join(f.msg["content"]["text"] for f in relay.host.outputs[p.msg_id] if f.msg_type == "stream")


def test_output_written_before_the_agent_reads_the_replay_request_comes_again_in_turn():
    """A cell still running through a cut stream (issue: the soak's E2B outage): on the
    new stream the cell's live output, ahead of the frame due, arrives before the agent
    reads ``replay``.  It is dropped and comes again in the replay, in turn: the cell's
    output arrives whole, once, in order, and the sandbox is kept."""

    async def main():
        fake, relay = await started()
        p, header = await _running_cell_with_a_gap(fake, relay, "bc")

        def live_output_first(f, frame):
            if frame["op"] == "replay":
                f.iopub(header, "stream", {"name": "stdout", "text": "d"})  # ahead of the one due
            default_responder(f, frame)  # re-sends b, c, d, then "replayed"

        fake.responder = live_output_first
        await relay.reattach()
        fake.responder = default_responder
        fake.iopub(header, "stream", {"name": "stdout", "text": "e"})
        fake.reply(header)
        fake.iopub(header, "status", {"execution_state": "idle"})
        assert (await asyncio.wait_for(relay.wait(p), 5)).msg_type == "execute_reply"
        assert _stdout(relay, p) == "abcde"
        assert fake.starts == 1 and not any(e == "died" for e, _ in relay.host.events)
        told = await corrupted(relay, fake, _far_ahead)  # the replay is over: strict again
        assert "frames lost or forged" in told
        await relay.shutdown()

    asyncio.run(main())


def test_a_replay_that_skips_frames_is_corruption_at_its_end():
    """Frames ahead are dropped during a replay only because the replay sends them
    again; a replay that comes without the frames due (the agent's buffer lost them)
    ends in a corrupted channel at its ``replayed`` frame, never in a wait."""

    async def main():
        fake, relay = await started()
        p, header = await _running_cell_with_a_gap(fake, relay, "bc")

        def lost_from_the_buffer(f, frame):
            if frame["op"] == "replay":
                f._agent.sent = [(seq, line) for seq, line in f._agent.sent if seq != relay.last_seq + 1]
            default_responder(f, frame)

        fake.responder = lost_from_the_buffer
        await relay.reattach()
        with pytest.raises(SandboxDied) as err:
            await asyncio.wait_for(relay.wait(p), 5)
        assert "the sandbox's channel was corrupted" in err.value.cause and "frames lost" in err.value.cause
        await relay.shutdown()

    asyncio.run(main())


def test_a_late_reply_for_a_request_given_up_is_dropped_quietly():
    async def main():
        fake, relay = await started()
        p = await relay.send_request("shell", request("sleep"), [])
        relay.abandon(p, SandboxDied("cell_timeout_s"))
        with pytest.raises(SandboxDied):
            await relay.wait(p)
        fake.reply(p.parent["header"])
        assert (await run_cell(relay)).msg["content"]["status"] == "ok"
        assert fake.starts == 1
        await relay.shutdown()

    asyncio.run(main())


# ---- every pending request ends, whatever the stream does --------------------------------

EVENTS = st.lists(st.sampled_from(
    ["busy", "reply", "idle", "stream", "dup", "gap", "garbage", "cut", "forged", "reply_other",
     "end"]), max_size=12)


def _play(fake: FakeBackend, header: dict, events: list[str]) -> None:
    for ev in events:
        if fake._agent is None:
            return
        if ev in ("busy", "idle"):
            fake.iopub(header, "status", {"execution_state": ev})
        elif ev == "reply":
            fake.reply(header)
        elif ev == "stream":
            fake.iopub(header, "stream", {"name": "stdout", "text": "x"})
        elif ev == "dup" and fake._agent.sent:
            fake.emit_raw(fake._agent.sent[-1][1])
        elif ev == "gap":
            fake._agent.seq += 1
        elif ev == "garbage":
            fake.emit_raw(b"\xff\xfe\n")
        elif ev == "cut":
            fake.emit_raw(b'{"seq":')
        elif ev == "forged":
            fake.emit_raw(protocol.encode_frame({"seq": fake.next_seq, "op": "log", "text": "x"}))
        elif ev == "reply_other":
            fake.reply({**header, "msg_id": uuid.uuid4().hex})
        elif ev == "end":
            fake.end()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(events=EVENTS)
def test_property_every_pending_request_ends(fast_liveness, events):
    """Interleavings, duplicates, gaps, garbage, then silence: the request ends (its
    reply, or a clear error), never waits forever."""

    async def main():
        fake = FakeBackend(responder=lambda f, frame: None)
        fake, relay = await started(fake)
        p = await relay.send_request("shell", request("sleep"), [])
        _play(fake, p.parent["header"], events)
        try:
            reply = await asyncio.wait_for(relay.wait(p), 5)
        except SandboxDied as err:  # the channel broke or went silent
            assert err.cause
        except NoReply as err:  # idle without a reply
            assert "without replying" in str(err)
        else:
            assert reply.msg_type == "execute_reply"
        await relay.shutdown()

    asyncio.run(main())


def test_an_error_reply_to_a_comm_message_is_not_corruption():
    """ipykernel answers a comm message it cannot take (an unknown subshell) with an error
    reply, which may come after its idle status: logged and dropped, the sandbox kept."""

    comm_headers = []

    def idle_only(fake, frame):
        if frame.get("op") == "msg" and frame["msg"]["header"]["msg_type"] == "comm_msg":
            header = frame["msg"]["header"]
            comm_headers.append(header)
            fake.iopub(header, "status", {"execution_state": "busy"})
            fake.iopub(header, "status", {"execution_state": "idle"})
        else:
            default_responder(fake, frame)

    async def main():
        fake = FakeBackend(responder=idle_only)
        fake, relay = await started(fake)
        p = await relay.send_request("shell", request("", "comm_msg"), [], expect_reply=False)
        await asyncio.wait_for(relay.wait(p), 5)
        fake.reply(comm_headers[0], {"status": "error", "ename": "UnknownSubshellError", "evalue": "x"})
        reply = await run_cell(relay, "print:still here")
        assert reply.msg["content"]["status"] == "ok" and fake.starts == 1
        assert not any(e == "died" for e, _ in relay.host.events)
        await relay.shutdown()

    asyncio.run(main())


def test_a_death_told_in_its_cell_is_not_told_again_by_the_next():
    """The sandbox ends while a cell runs: that cell's error says so.  The next cell,
    sent while the dead sandbox is still being removed (its replacement not yet begun),
    must not be told the same loss a second time."""
    async def main():
        fake, relay = await started()
        fake.gates["kill"] = asyncio.Event()  # removing the dead sandbox takes a while
        p = await relay.send_request("shell", request("sleep"), [])
        fake.end()
        with pytest.raises(SandboxDied):
            await asyncio.wait_for(relay.wait(p), 5)
        assert relay.state == "dead"
        nxt = asyncio.ensure_future(relay.ensure_running())
        for _ in range(20):
            await asyncio.sleep(0)  # the next cell looks at the state while the kill is held
        fake.gates["kill"].set()
        assert await asyncio.wait_for(nxt, 5) is None
        assert relay.state == "running" and fake.starts == 2
        reply = await run_cell(relay, "1")
        assert reply.msg["content"]["status"] == "ok"
        await relay.shutdown()

    asyncio.run(main())
