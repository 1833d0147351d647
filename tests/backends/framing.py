"""A tiny async client of the agent's framed protocol, driving a backend directly.

Used by backend tests (no proxy): send an ``execute_request`` frame, collect
frames until the cell's ``status: idle`` and ``execute_reply``, track the last
``seq`` seen for ``replay``, drop duplicates by ``seq``.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass, field

from sandbox_kernel import protocol
from sandbox_kernel.backends.base import SandboxBackend


def execute_msg(code: str, msg_id: str | None = None, allow_stdin: bool = False) -> dict:
    """An ``execute_request`` (messaging spec, "Execute") with fixed headers."""
    return {
        "header": {"msg_id": msg_id or uuid.uuid4().hex, "msg_type": "execute_request",
                   "session": "test", "username": "test", "date": "2026-01-01T00:00:00Z",
                   "version": "5.4"},
        "parent_header": {}, "metadata": {},
        "content": {"code": code, "silent": False, "store_history": True, "user_expressions": {},
                    "allow_stdin": allow_stdin, "stop_on_error": True},
    }


@dataclass
class Cell:
    """What one execute_request produced."""

    reply: dict | None = None
    iopub: list[protocol.AgentFrame] = field(default_factory=list)

    @property
    def status(self) -> str:
        return self.reply["content"]["status"] if self.reply else "none"

    @property
    def ename(self) -> str | None:
        return self.reply["content"].get("ename") if self.reply else None

    @property
    def stdout(self) -> str:
        return "".join(f.msg["content"]["text"] for f in self.iopub
                       if f.msg_type == "stream" and f.msg["content"]["name"] == "stdout")

    @property
    def result_text(self) -> str | None:
        for f in self.iopub:
            if f.msg_type == "execute_result":
                return f.msg["content"]["data"].get("text/plain")
        return None


class FrameClient:
    """Reads a backend's stream on a task; dedupes by ``seq``.

    Parameters
    ----------
    backend : SandboxBackend
        Already started.
    """

    def __init__(self, backend: SandboxBackend):
        self.backend = backend
        self.decoder = protocol.FrameDecoder()
        self.last_seq = 0
        self.frames: asyncio.Queue[protocol.AgentFrame | None] = asyncio.Queue()
        self.duplicates = 0
        self.reader: asyncio.Task | None = None

    def start_reader(self) -> None:
        """(Re)start the reader task on the backend's current stream."""
        self.decoder = protocol.FrameDecoder()  # a detach may cut a frame in half
        self.reader = asyncio.ensure_future(self._read())

    async def stop_reader(self, timeout_s: float = 30.0) -> None:
        """Wait for the reader to see the end of the stream (after pause/kill)."""
        if self.reader is not None:
            await asyncio.wait_for(self.reader, timeout_s)
            self.reader = None
        kept = []
        while not self.frames.empty():
            f = self.frames.get_nowait()
            if f is not None:
                kept.append(f)
        for f in kept:  # frames not consumed yet stay; the end marker goes
            self.frames.put_nowait(f)

    async def _read(self) -> None:
        while True:
            data = await self.backend.read()
            if not data:
                self.frames.put_nowait(None)
                return
            for obj in self.decoder.feed(data):
                f = protocol.validate_agent_frame(obj)
                if f.seq <= self.last_seq:
                    self.duplicates += 1
                    continue
                self.last_seq = f.seq
                self.frames.put_nowait(f)

    async def next_frame(self, timeout_s: float) -> protocol.AgentFrame:
        f = await asyncio.wait_for(self.frames.get(), timeout_s)
        if f is None:
            raise EOFError("the stream ended")
        return f

    async def wait_ready(self, timeout_s: float = 120.0) -> protocol.AgentFrame:
        """Wait for the agent's ``ready`` frame."""
        deadline = time.monotonic() + timeout_s
        while True:
            f = await self.next_frame(deadline - time.monotonic())
            if f.op == "ready":
                return f
            if f.op == "died":
                raise RuntimeError(f"inner kernel died: {f.body}")

    async def send_execute(self, code: str, allow_stdin: bool = False) -> str:
        msg = execute_msg(code, allow_stdin=allow_stdin)
        await self.backend.write(protocol.host_msg_frame("shell", msg))
        return msg["header"]["msg_id"]

    async def collect(self, msg_id: str, timeout_s: float = 60.0, answer: str | None = None) -> Cell:
        """Frames of ``msg_id`` until both ``status: idle`` and the reply arrived.

        ``answer`` is sent as the ``input_reply`` to each ``input_request``.
        """
        cell, idle = Cell(), False
        deadline = time.monotonic() + timeout_s
        while not (idle and cell.reply):
            f = await self.next_frame(max(0.01, deadline - time.monotonic()))
            if f.op != "msg" or f.parent_msg_id != msg_id:
                continue
            if f.channel == "stdin":
                cell.iopub.append(f)
                if answer is not None and f.msg_type == "input_request":
                    reply = execute_msg("")
                    reply["header"]["msg_type"] = "input_reply"
                    reply["parent_header"] = f.msg["header"]
                    reply["content"] = {"value": answer}
                    await self.backend.write(protocol.host_msg_frame("stdin", reply))
            elif f.channel == "shell" and f.msg_type == "execute_reply":
                cell.reply = f.msg
            elif f.channel == "iopub":
                if f.msg_type == "status":
                    idle = f.msg["content"]["execution_state"] == "idle"
                else:
                    cell.iopub.append(f)
        return cell

    async def execute(self, code: str, timeout_s: float = 60.0) -> Cell:
        return await self.collect(await self.send_execute(code), timeout_s)

    async def replay(self) -> None:
        """Ask the agent to re-send what came after :attr:`last_seq`."""
        await self.backend.write(protocol.host_op_frame("replay", after=self.last_seq))

    async def interrupt(self) -> None:
        await self.backend.write(protocol.host_op_frame("interrupt"))
