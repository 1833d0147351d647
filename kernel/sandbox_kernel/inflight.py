"""Requests in flight to one sandbox: matching what comes back to what was asked.

:class:`InFlight` keeps a :class:`Pending` per relayed request, keyed by the
frontend's ``msg_id`` (the inner request reuses it), and routes each message
the agent relays back: IOPub to the proxy (with its request, if any), a reply
to its request, an ``input_request`` to the stdin channel.  A reply for no
request, or a second one, corrupts the channel; a late reply for a request
given up (a timeout, a death) is dropped quietly.

All methods run on the proxy's main asyncio loop.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC
from typing import Any, Protocol

from .errors import NoReply
from .protocol import AgentFrame

#: Seconds to wait for the inner idle status after a reply arrived, and for a reply
#: after the inner idle status arrived (they come in either order within one batch).
IDLE_GRACE_S = 5.0
#: Message ids of requests given up (timeout, death) kept to recognise their late replies.
ABANDONED_KEEP = 256
#: Requests relayed since a rewind after which messages for any other are no longer
#: watched for (:meth:`InFlight.begin_rewound`): the rewound interpreter is long past them.
REWOUND_KEEP = 1024
#: IOPub types a thread or a timer prints with (ipykernel parents them to the last request
#: its interpreter handled): in a copy, published with no parent when that request is one of
#: before the copy (:meth:`InFlight.begin_rewound`), never dropped.
THREAD_OUTPUT = frozenset({"stream", "display_data", "update_display_data", "clear_output"})


@dataclass(eq=False)
class Pending:
    """A request relayed to the sandbox and not finished yet.

    Attributes
    ----------
    msg_id : str
        The frontend's ``header.msg_id``, reused for the inner request.
    msg_type : str
    parent : dict
        The frontend's request message (header, content...): the parent of
        everything relayed back for it.
    ident : list of bytes
        ZMQ routing identities of the frontend's request.
    expect_reply : bool
        False for comm messages (no reply in the spec; only busy/idle).
    own : bool
        A request of the proxy's own (no frontend sent it: a rewind's or fork's settle
        probe): what the interpreter prints under it (a thread's output) has no parent.
    """

    msg_id: str
    msg_type: str
    parent: dict[str, Any]
    ident: list[bytes]
    expect_reply: bool = True
    own: bool = False
    reply: asyncio.Future = field(default_factory=lambda: asyncio.get_running_loop().create_future())
    idle: asyncio.Event = field(default_factory=asyncio.Event)
    started: float = field(default_factory=time.monotonic)
    on_done: list[Callable[[], object]] = field(default_factory=list)

    def fail(self, err: BaseException) -> None:
        if not self.reply.done():
            self.reply.set_exception(err)
        self.idle.set()


def _iso_now() -> str:
    from datetime import datetime

    return datetime.now(UTC).isoformat()


def inner_request(parent: dict[str, Any]) -> dict[str, Any]:
    """The message for the inner kernel: the frontend's header (same ``msg_id``), no parent.

    An ``execute_request`` goes with ``stop_on_error`` false: the proxy aborts the cells
    queued behind an error itself (it holds the queue; one cell of a shell reaches the
    inner kernel at a time), so the inner kernel's own abort could only catch a cell the
    frontend sent after it saw the error's reply, while the inner kernel, slowed by what
    the cell left running, had not yet stopped aborting.
    """
    content = parent.get("content") or {}
    if parent["header"].get("msg_type") == "execute_request":
        content = {**content, "stop_on_error": False}
    return {
        "header": _jsonable(dict(parent["header"])),
        "parent_header": {},
        "metadata": _jsonable(parent.get("metadata") or {}),
        "content": content,
    }


def stdin_reply(request: AgentFrame, value: str) -> dict[str, Any]:
    """An ``input_reply`` to the inner kernel's ``input_request`` (messaging spec, "stdin")."""
    return {
        "header": {"msg_id": uuid.uuid4().hex, "msg_type": "input_reply", "session": "proxy",
                   "username": "sandbox", "date": _iso_now(), "version": "5.4"},
        "parent_header": request.msg["header"] if request.msg else {},
        "metadata": {},
        "content": {"status": "ok", "value": value},
    }


class MessageHost(Protocol):
    """Where :class:`InFlight` hands the messages that are not replies: the proxy
    kernel (through :class:`~sandbox_kernel.relay.RelayHost`, which extends this)."""

    def on_iopub(self, frame: AgentFrame, pending: Pending | None) -> None:
        """Publish an IOPub message from the sandbox (called for every non-status one)."""

    def on_input_request(self, frame: AgentFrame, pending: Pending) -> None:
        """Forward an ``input_request`` to the frontend (stdin channel)."""


class InFlight:
    """The requests relayed to one sandbox and not finished yet.

    Parameters
    ----------
    host : MessageHost
        Receives IOPub and ``input_request`` messages.
    corrupt : callable
        ``corrupt(what)`` declares the channel corrupted (a reply for nothing).
    log : logging.Logger
    """

    def __init__(self, host: MessageHost, corrupt: Callable[[str], None], log: logging.Logger):
        self.host = host
        self.corrupt = corrupt
        self.log = log
        #: msg_id -> the request waiting for its reply and idle status.
        self.pending: dict[str, Pending] = {}
        self._abandoned: collections.OrderedDict[str, None] = collections.OrderedDict()
        #: After a rewind: the requests relayed since (None: not rewound, or long ago).
        self._since_rewind: set[str] | None = None
        #: A copy whose cell of before has not ended yet: everything of before is dropped.
        self._settling = False

    def add(self, parent: dict[str, Any], ident: list[bytes], expect_reply: bool, own: bool = False) -> Pending:
        header = parent["header"]
        p = Pending(msg_id=str(header["msg_id"]), msg_type=header["msg_type"], parent=parent, ident=ident,
                    expect_reply=expect_reply, own=own)
        self.pending[p.msg_id] = p
        if self._since_rewind is not None:
            self._since_rewind.add(p.msg_id)
            if len(self._since_rewind) > REWOUND_KEEP:
                self._since_rewind = None
        return p

    def begin_rewound(self, settled: bool = False) -> None:
        """The sandbox was replaced by a copy (restored from a snapshot: a rewind, or a
        fork's first sandbox): what its interpreter sends for a request not relayed since
        (a cell that ran when the snapshot was taken, its reply to the interrupt that ends
        it) is stale: dropped and logged, never shown under another cell.  Output a thread
        or a timer of before prints (:data:`THREAD_OUTPUT`, parented by ipykernel to the
        last request its interpreter handled, one of before) is published with no parent,
        as ipykernel publishes a thread's output before any request, once the copy has
        settled: at once if ``settled``, else after :meth:`settled` (until then the cell
        of before may still be printing, and its output cannot be told from a thread's).
        """
        self._since_rewind = set()
        self._settling = not settled

    def settled(self) -> None:
        """The copy's cell of before has ended (called after the settle probe's reply):
        a thread's output of before is published from now on (:meth:`begin_rewound`)."""
        self._settling = False

    def _stale(self, frame: AgentFrame, pid: str | None) -> bool:
        """True for a message of a request of before a rewind or fork; handled here:
        a thread's output published with no parent, anything else dropped."""
        if self._since_rewind is None or not pid or pid in self._since_rewind:
            return False
        if not self._settling and frame.channel == "iopub" and frame.msg_type in THREAD_OUTPUT:
            self.host.on_iopub(unparented(frame), None)
            return True
        self.log.info("dropped a stale %s %s from before the rewind (request %s)", frame.channel,
                      frame.msg_type, pid)
        return True

    async def wait(self, p: Pending) -> AgentFrame | None:
        """Wait until ``p`` has its reply (if any) and the inner kernel went idle for it.

        Returns
        -------
        AgentFrame or None
            The reply frame (None for comm messages).

        Raises
        ------
        SandboxDied
            If the interpreter or the sandbox ended first.
        """
        try:
            reply = await p.reply if p.expect_reply else None
            if not p.expect_reply:
                await p.idle.wait()
                err = p.reply.exception() if p.reply.done() else None
                if err is not None:
                    raise err
            else:
                try:
                    await asyncio.wait_for(p.idle.wait(), IDLE_GRACE_S)
                except TimeoutError:
                    self.log.warning("no idle status from the sandbox for %s", p.msg_id)
            return reply
        finally:
            self.pending.pop(p.msg_id, None)
            if not p.expect_reply:
                self._remember(p.msg_id)  # ipykernel may still answer it with an error reply
            for cb in p.on_done:
                cb()

    def _remember(self, msg_id: str) -> None:
        self._abandoned[msg_id] = None
        while len(self._abandoned) > ABANDONED_KEEP:
            self._abandoned.popitem(last=False)

    def abandon(self, p: Pending, err: BaseException) -> None:
        """Fail ``p`` with ``err``; a reply that still comes for it is dropped quietly."""
        self._remember(p.msg_id)
        p.fail(err)

    def fail_all(self, err: BaseException) -> int:
        """Fail every pending request; return how many had no reply yet (and so are told)."""
        told = 0
        for p in list(self.pending.values()):
            told += not p.reply.done()
            self.abandon(p, err)
        return told

    def _no_reply(self, p: Pending) -> None:
        if not p.reply.done():
            self.log.error("the inner kernel went idle without a %s reply", p.msg_type)
            self.abandon(p, NoReply(f"the interpreter finished handling this {p.msg_type} without "
                                    "replying (an error inside ipykernel; see the kernel's log). "
                                    "Its state is intact: try again."))

    def route(self, frame: AgentFrame) -> None:
        """Hand one relayed message (an admitted ``msg`` frame) to whom it is for."""
        pid = frame.parent_msg_id
        if self._stale(frame, pid):
            return
        p = self.pending.get(pid) if pid else None
        if frame.channel == "iopub":
            if frame.msg_type == "status":
                if p is not None and frame.content.get("execution_state") == "idle":
                    p.idle.set()
                    if p.expect_reply and not p.reply.done():
                        asyncio.get_running_loop().call_later(IDLE_GRACE_S, self._no_reply, p)
                return
            if p is not None and p.own:  # a thread printing under the proxy's probe: no parent
                self.host.on_iopub(unparented(frame), None)
                return
            self.host.on_iopub(frame, p)
        elif frame.channel in ("shell", "control"):
            if p is not None and not p.expect_reply:
                # A message that has no reply (a comm message) answered anyway: ipykernel's
                # error reply for one it could not take (an unknown subshell).  Not corruption.
                self.log.warning("the sandbox answered a %s with a %s: %s", p.msg_type, frame.msg_type,
                                 str(frame.content.get("evalue", ""))[:300])
                return
            if p is None or p.reply.done():
                if pid in self._abandoned or (p is not None and p.reply.exception() is not None):
                    self.log.info("late %s for a request given up or with no reply; dropped", frame.msg_type)
                elif p is None:
                    self.corrupt(f"a {frame.msg_type} for a request that does not exist")
                else:
                    self.corrupt(f"a second {frame.msg_type} for one request")
                return
            p.reply.set_result(frame)
        elif frame.channel == "stdin":
            if frame.msg_type == "input_request" and p is not None:
                self.host.on_input_request(frame, p)


def unparented(frame: AgentFrame) -> AgentFrame:
    """``frame`` with an empty ``parent_header``: output of no request (messaging spec:
    a kernel's IOPub message may have no parent; ipykernel's before its first request)."""
    assert frame.msg is not None
    return dataclasses.replace(frame, msg={**frame.msg, "parent_header": {}})


def _jsonable(d: dict[str, Any]) -> dict[str, Any]:
    """Headers from jupyter_client carry ``datetime``; frames need ISO strings."""
    out = {}
    for k, v in d.items():
        if hasattr(v, "isoformat"):
            v = v.isoformat()
        elif isinstance(v, dict):
            v = _jsonable(v)
        out[k] = v
    return out
