"""A tiny async frame client driving a backend directly (no proxy, no ZMQ).

It speaks :mod:`sandbox_kernel.protocol` to the agent through any
:class:`~sandbox_kernel.backends.base.SandboxBackend`: wait for ``ready``,
send ``execute_request`` messages, collect IOPub output until the cell's
``status: idle``, send ``interrupt`` frames.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field

from sandbox_kernel import protocol


@dataclass
class Cell:
    """What one execute_request produced."""

    reply: dict | None = None
    outputs: list[dict] = field(default_factory=list)

    @property
    def status(self) -> str | None:
        return self.reply["content"]["status"] if self.reply else None

    @property
    def ename(self) -> str | None:
        return self.reply["content"].get("ename") if self.reply else None

    @property
    def stdout(self) -> str:
        return "".join(m["content"]["text"] for m in self.outputs
                       if m["header"]["msg_type"] == "stream" and m["content"]["name"] == "stdout")

    def results(self) -> list[str]:
        return [m["content"]["data"].get("text/plain", "") for m in self.outputs
                if m["header"]["msg_type"] == "execute_result"]


def _msg(msg_type: str, content: dict) -> dict:
    return {"header": {"msg_id": uuid.uuid4().hex, "msg_type": msg_type, "session": "test",
                       "username": "test", "date": "2026-01-01T00:00:00Z", "version": "5.4"},
            "parent_header": {}, "metadata": {}, "content": content}


class FrameClient:
    """Frames in and out of one backend; one reader task dispatching frames."""

    def __init__(self, backend):
        self.backend = backend
        self.decoder = protocol.FrameDecoder()
        self.frames: asyncio.Queue[protocol.AgentFrame | None] = asyncio.Queue()
        self._reader: asyncio.Task | None = None
        self.ready: dict | None = None

    async def start(self, timeout: float = 120) -> dict:
        """Start reading; wait for the agent's ``ready``; return its body."""
        self._reader = asyncio.ensure_future(self._read_loop())
        while True:
            f = await asyncio.wait_for(self.frames.get(), timeout)
            if f is None:
                raise EOFError("the agent's stream ended before ready")
            if f.op == "ready":
                self.ready = f.body
                return f.body

    async def _read_loop(self) -> None:
        try:
            while True:
                data = await self.backend.read()
                if not data:
                    return
                for obj in self.decoder.feed(data):
                    self.frames.put_nowait(protocol.validate_agent_frame(obj))
        finally:
            self.frames.put_nowait(None)

    async def close(self) -> None:
        if self._reader:
            self._reader.cancel()
            with __import__("contextlib").suppress(BaseException):
                await self._reader

    async def send_execute(self, code: str) -> str:
        msg = _msg("execute_request", {"code": code, "silent": False, "store_history": True,
                                       "user_expressions": {}, "allow_stdin": False,
                                       "stop_on_error": True})
        await self.backend.write(protocol.host_msg_frame("shell", msg))
        return msg["header"]["msg_id"]

    async def interrupt(self) -> None:
        await self.backend.write(protocol.host_op_frame("interrupt"))

    async def collect(self, msg_id: str, timeout: float = 60) -> Cell:
        """Gather frames answering ``msg_id`` until its reply and ``idle`` both came."""
        cell, idle = Cell(), False
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not (idle and cell.reply is not None):
            f = await asyncio.wait_for(self.frames.get(), max(0.01, deadline - loop.time()))
            if f is None:
                raise EOFError("the agent's stream ended")
            if f.op != "msg" or f.parent_msg_id != msg_id:
                continue
            if f.channel == "shell" and f.msg_type == "execute_reply":
                cell.reply = f.msg
            elif f.channel == "iopub":
                if f.msg_type == "status":
                    idle = f.msg["content"]["execution_state"] == "idle"
                else:
                    cell.outputs.append(f.msg)
        return cell

    async def execute(self, code: str, timeout: float = 60) -> Cell:
        return await self.collect(await self.send_execute(code), timeout)
