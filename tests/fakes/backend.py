"""A scripted sandbox backend for the fast test tier: frames in, frames out, no code run.

:class:`FakeBackend` implements the backend contract
(:class:`sandbox_kernel.backends.base.SandboxBackend`) with an in-memory agent.
What the relay writes is decoded and handed to a *responder*; what the
responder emits is what the relay reads.  The default responder answers like
the real agent and a stock ipykernel would, for the message types tests use:
``busy``, the reply, ``idle``.  Nothing is executed: a "cell" is a string the
responder may look at to decide what to send (``"sleep"`` sends nothing, as a
long cell; ``"print:<text>"`` sends a stream first).

Tests drive the hostile side with :meth:`FakeBackend.emit` (a well-formed
frame with the next sequence number), :meth:`FakeBackend.emit_raw` (any bytes)
and by swapping :attr:`FakeBackend.responder`; the lifecycle side with
:attr:`FakeBackend.fail` (verbs that raise) and :attr:`FakeBackend.gates`
(verbs, ``kill`` too, that wait for an event, to act while they are under way).
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sandbox_kernel import protocol
from sandbox_kernel.backends.base import Capabilities, ExitInfo, SandboxBackend
from sandbox_kernel.errors import SandboxDied, SandboxKernelError, SandboxStartError
from sandbox_kernel.policy import Policy

KERNEL_INFO = {"status": "ok", "protocol_version": "5.4", "implementation": "fake",
               "language_info": {"name": "python"}}


def jupyter_msg(msg_type: str, content: dict, parent: dict | None = None) -> dict[str, Any]:
    """A message in the messaging spec's shape, ``parent`` being a request's header."""
    return {"header": {"msg_id": uuid.uuid4().hex, "msg_type": msg_type, "session": "fake",
                       "username": "fake", "date": "2026-01-01T00:00:00Z", "version": "5.4"},
            "parent_header": dict(parent or {}), "metadata": {}, "content": content}


def default_responder(fake: "FakeBackend", frame: dict) -> None:
    """Answer like the agent and an ipykernel would, for these "cells" (nothing runs):

    ``print:<text>``
        stdout ``<text>``, then the reply.
    ``flood:<n>:<chars>``
        ``n`` stdout messages of ``chars`` characters each.
    ``display:<json>``
        one ``display_data`` with the mime bundle ``<json>``.
    ``sleep``
        nothing until an ``interrupt``: then ``KeyboardInterrupt`` (error, reply).
    ``stubborn``
        nothing, and ignores interrupts.
    ``noreply``
        ``busy`` and ``idle`` but no reply (a handler that failed inside ipykernel).
    anything else
        ``busy``, an ``ok`` reply, ``idle``.
    """
    op = frame.get("op")
    if op == "ping":
        fake.emit("pong")
    elif op == "replay":
        fake.replay(int(frame["after"]))
    elif op == "restart":
        fake.running = None
        fake.emit("ready", kernel_info=KERNEL_INFO, guard=fake.guard)
    elif op == "interrupt" and fake.running is not None:
        header, fake.running = fake.running, None
        err = {"status": "error", "ename": "KeyboardInterrupt", "evalue": "",
               "traceback": ["KeyboardInterrupt"], "execution_count": 1}
        fake.iopub(header, "error", {k: err[k] for k in ("ename", "evalue", "traceback")})
        fake.reply(header, err)
        fake.iopub(header, "status", {"execution_state": "idle"})
    elif op == "msg" and frame.get("channel") in ("shell", "control"):
        header = frame["msg"]["header"]
        code = str(frame["msg"]["content"].get("code", ""))
        fake.iopub(header, "status", {"execution_state": "busy"})
        if code == "noreply":  # a handler that failed inside ipykernel: idle, no reply
            fake.iopub(header, "status", {"execution_state": "idle"})
            return
        if code in ("sleep", "stubborn"):
            fake.running = header if code == "sleep" else None
            return
        if code.startswith("print:"):
            fake.iopub(header, "stream", {"name": "stdout", "text": code[6:]})
        elif code.startswith("flood:"):
            n, chars = (int(x) for x in code[6:].split(":"))
            for _ in range(n):
                fake.iopub(header, "stream", {"name": "stdout", "text": "x" * chars})
        elif code.startswith("display:"):
            fake.iopub(header, "display_data", {"data": json.loads(code[8:]), "metadata": {}})
        fake.reply(header, channel=frame["channel"])
        fake.iopub(header, "status", {"execution_state": "idle"})


@dataclass
class FakeAgentState:
    """One fake sandbox's stream: what was emitted (for replay) and the read queue."""

    out: asyncio.Queue = field(default_factory=asyncio.Queue)
    seq: int = 0
    sent: list[tuple[int, bytes]] = field(default_factory=list)


class FakeBackend(SandboxBackend):
    """See the module docstring.

    Attributes
    ----------
    written : list of dict
        Every frame the relay wrote, decoded, in order.
    starts : int
        How many sandboxes were started (a replacement after a death counts).
    responder : callable
        ``responder(fake, frame)`` for each frame the relay writes.
    """

    name = "fake"

    def __init__(self, policy: Policy | None = None, kernel_id: str = "fake", log=None, *,
                 caps: Capabilities | None = None,
                 responder: Callable[["FakeBackend", dict], None] = default_responder):
        super().__init__(policy or Policy(), kernel_id, log)
        self._caps = caps or Capabilities(boundary="fake (no isolation: runs no code)",
                                          pause_keeps_memory=True)
        self.responder = responder
        self.written: list[dict] = []
        self.starts = 0
        self.kills = 0
        self.paused = False
        self.checkpointed = False
        #: Header of the "cell" an interrupt would end (``sleep``), if any.
        self.running: dict | None = None
        #: Names of verbs (``start``, ``pause``, ``checkpoint``, ``resume``) that raise.
        self.fail: set[str] = set()
        #: Verb name -> the exception it raises (an ``AdmissionRefused``...), once.
        self.raises: dict[str, BaseException] = {}
        #: Verb name (``kill`` too) -> event the verb waits for before it acts.
        self.gates: dict[str, asyncio.Event] = {}
        self.guard = {"uid_separated": True, "non_dumpable": True, "pid1": True}
        self._agent: FakeAgentState | None = None

    @property
    def capabilities(self) -> Capabilities:
        return self._caps

    @property
    def alive(self) -> bool:
        """A sandbox is there (started and not killed): what a shutdown must not leave."""
        return self._agent is not None

    # ---- the contract -----------------------------------------------------------

    async def _verb(self, name: str) -> None:
        if name in self.gates:
            await self.gates[name].wait()
        if name in self.raises:
            raise self.raises.pop(name)
        if name in self.fail:
            raise SandboxStartError(f"the fake {name} failed") if name == "start" else \
                SandboxKernelError(f"the fake {name} failed")

    async def start(self) -> None:
        await self._verb("start")
        self._end_stream()
        self._agent = FakeAgentState()
        self.starts += 1
        self.emit("ready", kernel_info=KERNEL_INFO, guard=self.guard)

    async def read(self) -> bytes:
        agent = self._agent
        if agent is None:
            return b""
        return await agent.out.get()

    async def write(self, data: bytes) -> None:
        if self._agent is None:
            raise SandboxDied("the fake sandbox is not running")
        for line in data.splitlines():
            frame = json.loads(line)
            self.written.append(frame)
            self.responder(self, frame)

    async def pause(self) -> None:
        await self._verb("pause")
        self.paused = True

    async def checkpoint(self) -> None:
        await self._verb("checkpoint")
        self.checkpointed = True

    async def resume(self) -> None:
        await self._verb("resume")
        self.paused = self.checkpointed = False

    async def kill(self) -> None:
        if "kill" in self.gates:
            await self.gates["kill"].wait()
        if self._agent is not None:
            self.kills += 1
        self._end_stream()

    async def exit_info(self) -> ExitInfo:
        return ExitInfo(cause="the fake sandbox ended")

    # ---- the scripted agent's side ---------------------------------------------------

    def _end_stream(self) -> None:
        if self._agent is not None:
            self._agent.out.put_nowait(b"")
            self._agent = None

    def emit(self, op: str, **fields: Any) -> int:
        """Send a well-formed frame with the next sequence number; return that number."""
        agent = self._require()
        agent.seq += 1
        line = protocol.encode_frame({"seq": agent.seq, "op": op, **fields})
        agent.sent.append((agent.seq, line))
        agent.out.put_nowait(line)
        return agent.seq

    def emit_raw(self, data: bytes) -> None:
        """Send bytes as they are (garbage, a forged frame, half a line)."""
        self._require().out.put_nowait(data)

    def end(self) -> None:
        """The stream ends, as when the sandbox dies."""
        self._end_stream()

    def replay(self, after: int) -> None:
        agent = self._require()
        for seq, line in list(agent.sent):
            if seq > after:
                agent.out.put_nowait(line)
        self.emit("replayed", after=after)

    def iopub(self, parent: dict, msg_type: str, content: dict) -> int:
        return self.emit("msg", channel="iopub", msg=jupyter_msg(msg_type, content, parent), buffers=[])

    def reply(self, parent: dict, content: dict | None = None, channel: str = "shell") -> int:
        reply_type = str(parent.get("msg_type", "execute_request")).replace("_request", "_reply")
        return self.emit("msg", channel=channel,
                         msg=jupyter_msg(reply_type, content or {"status": "ok", "execution_count": 1},
                                         parent), buffers=[])

    @property
    def next_seq(self) -> int:
        return self._require().seq + 1

    def _require(self) -> FakeAgentState:
        if self._agent is None:
            raise RuntimeError("the fake sandbox is not started")
        return self._agent
