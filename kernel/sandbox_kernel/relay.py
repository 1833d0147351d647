"""The host side of the framed link to one sandbox: its state, requests and replies.

:class:`Relay` owns a backend and the sandbox's :class:`SandboxState` (it is
the only writer, through :meth:`Relay._to`, which refuses any change not in
:data:`~sandbox_kernel.sandbox_state.TRANSITIONS`).  It reads the backend's
stream in one task, validates every frame (:mod:`sandbox_kernel.protocol`),
matches replies to pending requests by ``parent_header.msg_id``, and hands
IOPub and stdin messages to the proxy kernel through :class:`RelayHost`.

It never crashes on input from the sandbox.  A corrupted channel (a frame out
of sequence, bytes that are not a frame, a reply for no request or a second
one) or a silent one (no frame for :data:`PING_AFTER_S` +
:data:`PONG_TIMEOUT_S` while a request is pending) is treated like a dead
sandbox: the pending requests fail with the cause, and a fresh sandbox is
started.  The idle lifecycle (:mod:`sandbox_kernel.lifecycle`) asks the relay
to :meth:`~Relay.suspend` a sandbox; the next request :meth:`~Relay.wake` s it.

All methods run on the proxy's main asyncio loop.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from . import protocol
from .backends.base import SandboxBackend
from .errors import SandboxDied, SandboxKernelError, SandboxStartError
from .protocol import AgentFrame
from .sandbox_state import (
    DETACHED,
    IDLE_EVENTS,
    SUSPENDED,
    TRANSITIONS,
    IdleAction,
    IllegalTransition,
    LifecycleEvent,
    SandboxState,
    human_duration,
    notice,
)

S = SandboxState

#: Seconds to wait for the inner idle status after a reply arrived.
IDLE_GRACE_S = 5.0
#: Frames between acknowledgements sent to the agent.
ACK_EVERY = 64
#: Seconds without a frame, while a request is pending, before the relay asks the
#: agent whether it is alive (``ping``).
PING_AFTER_S = 10.0
#: Seconds a ``ping`` may go without any frame in return before the channel is
#: declared dead and the sandbox replaced.
PONG_TIMEOUT_S = 20.0
#: Seconds between two checks of the liveness watch.
LIVENESS_TICK_S = 1.0
#: Message ids of requests given up (timeout, death) kept to recognise their late replies.
ABANDONED_KEEP = 256


class RelayHost(Protocol):
    """What the relay needs from the proxy kernel."""

    def on_iopub(self, frame: AgentFrame, pending: "Pending | None") -> None:
        """Publish an IOPub message from the sandbox (called for every non-status one)."""

    def on_input_request(self, frame: AgentFrame, pending: "Pending") -> None:
        """Forward an ``input_request`` to the frontend (stdin channel)."""

    def on_lifecycle(self, event: LifecycleEvent, detail: str) -> None:
        """Report a lifecycle event with a one-line detail (a notice for ``RESUMED``/``RESTORED``)."""


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
    """

    msg_id: str
    msg_type: str
    parent: dict[str, Any]
    ident: list[bytes]
    expect_reply: bool = True
    reply: asyncio.Future = field(default_factory=lambda: asyncio.get_running_loop().create_future())
    idle: asyncio.Event = field(default_factory=asyncio.Event)
    started: float = field(default_factory=time.monotonic)
    output_bytes: int = 0
    dropped_bytes: int = 0
    dropped_msgs: int = 0
    timed_out: bool = False
    capped: bool = False
    window_start: float = 0.0
    window_msgs: int = 0
    on_done: list[Callable[[], None]] = field(default_factory=list)

    def fail(self, err: BaseException) -> None:
        if not self.reply.done():
            self.reply.set_exception(err)
        self.idle.set()


def _iso_now() -> str:
    from datetime import datetime, timezone

    return datetime.now(timezone.utc).isoformat()


class Relay:
    """One sandbox, its agent, and the requests in flight.

    Parameters
    ----------
    backend : SandboxBackend
    host : RelayHost
    max_frame_bytes : int
        A frame longer than this corrupts the channel.
    log : logging.Logger
    """

    def __init__(self, backend: SandboxBackend, host: RelayHost, *, max_frame_bytes: int,
                 log: logging.Logger):
        self.backend = backend
        self.host = host
        self.log = log
        self.max_frame_bytes = max_frame_bytes
        self.state = S.STOPPED
        #: Every transition taken, in order (``(old, new)``); bounded.
        self.history: collections.deque[tuple[SandboxState, SandboxState]] = collections.deque(maxlen=64)
        self.kernel_info: dict[str, Any] | None = None
        self.pending: dict[str, Pending] = {}
        self.last_activity = time.monotonic()
        self.timings: dict[str, float] = {}
        #: How many times each idle action and wake-up happened (``pause``, ``resume``...).
        self.counts: collections.Counter[str] = collections.Counter()
        self.died_cause: str | None = None
        #: Idle seconds after which the sandbox was stopped, until the next request.
        self.stopped_after_idle_s: float | None = None
        #: A notice for the next cell (state was lost while nobody was told).
        self.state_notice: str | None = None
        #: What guards the agent's channel inside the sandbox (the agent's ``ready``).
        self.guard: dict[str, Any] | None = None
        self._ready = asyncio.Event()
        self._reader: asyncio.Task | None = None
        self._liveness: asyncio.Task | None = None
        self._lock = asyncio.Lock()
        self._sequence = protocol.FrameSequence()
        self._decoder = self._new_decoder()
        self._unacked = 0
        self._expect_eof = False
        #: Why the channel is corrupted (ends the read loop), or None.
        self._broken: str | None = None
        self._last_frame_at = time.monotonic()
        self._ping_sent_at: float | None = None
        #: Requests given up (their late replies are not corruption).
        self._abandoned: collections.OrderedDict[str, None] = collections.OrderedDict()

    @property
    def last_seq(self) -> int:
        """Number of the last frame read from the agent."""
        return self._sequence.last

    def _to(self, new: SandboxState) -> None:
        """The only writer of :attr:`state`.

        Raises
        ------
        IllegalTransition
            If ``state -> new`` is not in :data:`TRANSITIONS` (a bug).
        """
        old = self.state
        if new is old:
            return
        if new not in TRANSITIONS[old]:
            raise IllegalTransition(old, new)
        self.state = new
        self.history.append((old, new))
        self.log.debug("sandbox %s -> %s", old.value, new.value)

    # ---- start, stop, restart -------------------------------------------------------

    async def start(self) -> None:
        """Start a fresh sandbox and wait until its interpreter answers.

        Raises
        ------
        SandboxStartError
            If the sandbox or the inner kernel does not come up.
        """
        async with self._lock:
            if self.state is S.RUNNING:
                return
            await self._start_locked()

    def _start_failed(self) -> None:
        if self.state is S.STARTING:  # not if a shutdown came meanwhile
            self._to(S.DEAD)

    async def _start_locked(self) -> None:
        self._to(S.STARTING)
        self.stopped_after_idle_s = None
        t0 = time.monotonic()
        self._ready.clear()
        self._decoder = self._new_decoder()
        self._sequence.reset()
        self._expect_eof = False
        self._broken = None
        try:
            await self.backend.start()
        except SandboxKernelError:
            self._start_failed()
            raise
        except Exception as err:
            self._start_failed()
            raise SandboxStartError(f"the {self.backend.name} sandbox did not start: {err}") from err
        if self.state is not S.STARTING:  # shut down meanwhile
            await self._kill_backend()
            raise SandboxStartError("the kernel was shut down while its sandbox started")
        self._reader = asyncio.ensure_future(self._read_loop())
        if self._liveness is None or self._liveness.done():
            self._liveness = asyncio.ensure_future(self._watch_liveness())
        timeout = self.backend.ready_timeout_s
        try:
            await asyncio.wait_for(self._ready.wait(), timeout)
        except asyncio.TimeoutError as err:
            info = await self.backend.exit_info() if self._reader.done() else None
            await self._kill_backend()
            self._start_failed()
            cause = info.cause if info else f"no answer within {timeout:.0f} s"
            raise SandboxStartError(f"the sandbox's interpreter did not start: {cause}") from err
        if self.state is not S.RUNNING:
            cause = self.died_cause or "it exited during start"
            if self.state is S.STARTING:
                await self._kill_backend()
                self._start_failed()
            raise SandboxStartError(f"the sandbox's interpreter did not start: {cause}")
        self.died_cause = None
        self.timings["start_s"] = time.monotonic() - t0
        self.last_activity = time.monotonic()
        self.host.on_lifecycle(LifecycleEvent.STARTED, f"{self.backend.capabilities.boundary}, "
                                                       f"{self.timings['start_s']:.2f} s")

    async def ensure_running(self) -> str | None:
        """Make the sandbox ready for a request: wait for a start, wake a suspended
        sandbox, or start a fresh one after a death or an idle stop.

        Returns
        -------
        str or None
            A notice for the user when state was lost (the previous sandbox
            died, or was stopped while idle), else None.

        Raises
        ------
        SandboxStartError
            If no sandbox can be started.
        """
        self.last_activity = time.monotonic()
        if self.state is S.STARTING:
            await self._ready.wait()
        told, self.state_notice = self.state_notice, None
        if self.state in SUSPENDED or self.stopped_after_idle_s is not None:
            told = await self.wake() or told
        if self.state is S.RUNNING:
            return told
        if self.state is S.DEAD and self.died_cause:
            told = self._lost_notice(f"the previous sandbox ended ({self.died_cause})")
        async with self._lock:
            if self.state is not S.RUNNING:
                await self._start_locked()
        return told

    @staticmethod
    def _lost_notice(what: str) -> str:
        return notice(f"{what}; this is a fresh interpreter: variables and imports were lost.")

    async def _kill_backend(self) -> None:
        self._expect_eof = True
        with contextlib.suppress(Exception):
            await self.backend.kill()
        if self._reader and not self._reader.done() and self._reader is not asyncio.current_task():
            self._reader.cancel()
            with contextlib.suppress(BaseException):
                await self._reader

    async def shutdown(self) -> None:
        """Kill the sandbox; pending requests fail.  Idempotent."""
        if self._liveness is not None:
            self._liveness.cancel()
        await self._kill_backend()
        self._to(S.STOPPED)
        self._fail_all(SandboxDied("the kernel is shutting down"))

    async def restart_interpreter(self, reason: str) -> None:
        """Replace the inner kernel (same sandbox) with a fresh one and wait for it.

        Falls back to a new sandbox when the agent does not answer.
        """
        self.log.warning("restarting the interpreter: %s", reason)
        async with self._lock:
            if self.state is not S.RUNNING:
                return  # the sandbox itself ended: the next request starts a fresh one
            self._ready.clear()
            self._to(S.STARTING)
            try:
                await self.backend.write(protocol.host_op_frame("restart"))
                await asyncio.wait_for(self._ready.wait(), self.backend.ready_timeout_s)
                if self.state is not S.RUNNING:
                    raise SandboxDied(self.died_cause or "the interpreter did not start")
            except (SandboxDied, asyncio.TimeoutError):
                await self._kill_backend()
                self._start_failed()
                await self._start_locked()
        self.host.on_lifecycle(LifecycleEvent.RESTARTED, reason)

    # ---- idle: suspend and wake ---------------------------------------------------------

    async def suspend(self, action: IdleAction, *, idle_s: float, min_idle_s: float) -> bool:
        """Pause, checkpoint or stop the sandbox (called by the idle lifecycle).

        Parameters
        ----------
        action : IdleAction
        idle_s : float
            Seconds the sandbox has been idle, for the notice and the log.
        min_idle_s : float
            Skip the action if a request came in meanwhile (idle for less).

        Returns
        -------
        bool
            False when skipped: a request is pending or came in, or the sandbox
            is not at an idle level.

        Raises
        ------
        SandboxKernelError, NotImplementedError, OSError
            When the backend failed; the state is back where it was (or
            ``dead`` when the sandbox was lost on the way).
        """
        async with self._lock:
            if self.pending or self.state not in (S.RUNNING, S.PAUSED, S.CHECKPOINTED):
                return False
            if time.monotonic() - self.last_activity < min_idle_s:
                return False
            before = self.state
            self._to(action.transient)
            t0 = time.monotonic()
            try:
                if action is IdleAction.PAUSE:
                    await self.backend.pause()
                elif action is IdleAction.CHECKPOINT:
                    await self.backend.checkpoint()
                else:
                    await self._kill_backend()
            except (SandboxKernelError, NotImplementedError, OSError):
                if self.state is not action.transient:
                    return False  # shut down meanwhile
                self._to(before)
                if action is not IdleAction.STOP and self.reader_ended():
                    await self._reattach_after_failed(action)
                raise
            if self.state is not action.transient:
                return False  # shut down meanwhile
            dt = time.monotonic() - t0
            self._to(action.target)
            if action is IdleAction.STOP:
                self.stopped_after_idle_s = idle_s
            self.timings[f"{action.value}_s"] = dt
            self.counts[action.value] += 1
            self.host.on_lifecycle(IDLE_EVENTS[action], f"after {human_duration(idle_s)} idle, in {dt:.2f} s")
            return True

    async def _reattach_after_failed(self, action: IdleAction) -> None:
        """The backend detached its stream and then failed to pause (E2B): the sandbox
        still runs, so reattach; if that fails too, end it (the next request starts a
        fresh one and says why)."""
        try:
            await self.backend.resume()
            await self.reattach()
        except Exception as err:
            self.log.error("could not reattach after the failed %s: %s", action.value, err)
            await self._kill_backend()
            self._to(S.DEAD)
            self.died_cause = f"the sandbox was lost when an idle {action.value} failed ({err})"

    async def wake(self) -> str | None:
        """Bring a paused, checkpointed or idle-stopped sandbox back before a request.

        Returns
        -------
        str or None
            A notice that state was lost (idle stop, failed restore), else None.
        """
        async with self._lock:
            self.last_activity = time.monotonic()
            if self.state in (S.PAUSED, S.CHECKPOINTED):
                restore = self.state is S.CHECKPOINTED
                kind = "restore" if restore else "resume"
                self._to(S.RESUMING)
                t0 = time.monotonic()
                try:
                    await self.backend.resume()
                    if self.state is not S.RESUMING:
                        return None  # shut down meanwhile
                    self._to(S.RUNNING)
                    # restart the reader if the pause ended the stream (E2B), then replay
                    # the frames written while detached (still buffered in the agent)
                    await self.reattach()
                except Exception as err:
                    if self.state not in (S.RESUMING, S.RUNNING):
                        return None  # shut down meanwhile
                    self.log.error("%s of the sandbox failed: %s", kind, err)
                    await self._kill_backend()
                    self._to(S.DEAD)
                    await self._start_locked()
                    return notice(f"the paused sandbox could not be brought back ({err}); "
                                  "state was lost; this is a fresh interpreter")
                dt = time.monotonic() - t0
                self.timings[f"{kind}_s"] = dt
                self.counts[kind] += 1
                what = "restored from a checkpoint" if restore else "resumed from pause"
                self.host.on_lifecycle(LifecycleEvent.RESTORED if restore else LifecycleEvent.RESUMED,
                                       notice(f"{what} in {dt:.2f} s"))
                return None
            if self.state is S.STOPPED and self.stopped_after_idle_s is not None:
                idle = self.stopped_after_idle_s
                await self._start_locked()
                return notice(f"sandbox stopped after {human_duration(idle)} idle; state was lost; "
                              "this is a fresh interpreter")
        return None

    # ---- requests ----------------------------------------------------------------

    async def send_request(self, channel: str, parent: dict[str, Any], ident: list[bytes],
                           expect_reply: bool = True) -> Pending:
        """Relay a frontend request to the inner kernel; return its :class:`Pending`.

        The inner request reuses the frontend's header (same ``msg_id``), so
        replies and outputs are matched by ``parent_header.msg_id``.
        """
        header = dict(parent["header"])
        msg_id = str(header["msg_id"])
        p = Pending(msg_id=msg_id, msg_type=header["msg_type"], parent=parent, ident=ident,
                    expect_reply=expect_reply)
        self.pending[msg_id] = p
        msg = {
            "header": _jsonable(header),
            "parent_header": {},
            "metadata": _jsonable(parent.get("metadata") or {}),
            "content": parent.get("content") or {},
        }
        try:
            await self.backend.write(protocol.host_msg_frame(channel, msg, parent.get("buffers")))
        except SandboxDied:
            self.pending.pop(msg_id, None)
            raise
        return p

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
                if p.reply.done() and p.reply.exception():
                    raise p.reply.exception()
            else:
                try:
                    await asyncio.wait_for(p.idle.wait(), IDLE_GRACE_S)
                except asyncio.TimeoutError:
                    self.log.warning("no idle status from the sandbox for %s", p.msg_id)
            return reply
        finally:
            self.pending.pop(p.msg_id, None)
            for cb in p.on_done:
                cb()

    def abandon(self, p: Pending, err: BaseException) -> None:
        """Fail ``p`` with ``err``; a reply that still comes for it is dropped quietly."""
        self._abandoned[p.msg_id] = None
        while len(self._abandoned) > ABANDONED_KEEP:
            self._abandoned.popitem(last=False)
        p.fail(err)

    def _fail_all(self, err: BaseException) -> int:
        """Fail every pending request; return how many had no reply yet (and so are told)."""
        told = 0
        for p in list(self.pending.values()):
            told += not p.reply.done()
            self.abandon(p, err)
        return told

    async def send_stdin_reply(self, request: AgentFrame, value: str) -> None:
        """Answer the inner kernel's ``input_request`` with ``value``."""
        msg = {
            "header": {"msg_id": uuid.uuid4().hex, "msg_type": "input_reply", "session": "proxy",
                       "username": "sandbox", "date": _iso_now(), "version": "5.4"},
            "parent_header": request.msg["header"] if request.msg else {},
            "metadata": {},
            "content": {"status": "ok", "value": value},
        }
        await self.backend.write(protocol.host_msg_frame("stdin", msg))

    async def interrupt(self) -> None:
        """Deliver SIGINT to the inner kernel's process group (through the agent)."""
        if self.state is S.RUNNING:
            await self.backend.write(protocol.host_op_frame("interrupt"))

    def reader_ended(self) -> bool:
        """True when no reader task is reading the backend's stream."""
        return self._reader is None or self._reader.done()

    async def reattach(self) -> None:
        """After a resume: read the stream again and ask the agent to replay.

        Backends whose :meth:`~SandboxBackend.read` returned ``b""`` on pause
        (E2B) ended the reader; it is restarted with a fresh decoder (the
        detach may have cut a frame in half).  Backends whose stream survives
        a pause (local) keep their reader.  Either way the agent re-sends the
        frames after :attr:`last_seq` (output produced while detached), ends
        with ``replayed``, and :class:`~sandbox_kernel.protocol.FrameSequence`
        drops those already seen meanwhile.
        """
        await asyncio.sleep(0)  # let a reader that was handed b"" by the pause finish
        after = self._sequence.begin_replay()
        if self.reader_ended():
            self._decoder = self._new_decoder()
            self._reader = asyncio.ensure_future(self._read_loop())
        await self.backend.write(protocol.host_op_frame("replay", after=after))

    def describe(self) -> dict[str, Any]:
        """Sandbox state and timings, for ``kernel_info`` and logs."""
        d = {**self.backend.describe(), "state": self.state.value,
             "idle_s": round(time.monotonic() - self.last_activity, 3),
             "timings_s": {k: round(v, 4) for k, v in self.timings.items()}}
        if self.guard is not None:
            d["channel_guard"] = self.guard
        return d

    # ---- the stream from the sandbox ---------------------------------------------------

    def _new_decoder(self) -> protocol.FrameDecoder:
        return protocol.FrameDecoder(self.max_frame_bytes, on_drop=self._on_bad_line)

    def _on_bad_line(self, why: str) -> None:
        if self._sequence.replaying:  # a detach may have cut the first line; the replay resends it
            self.log.info("ignored a partial line while replaying: %s", why)
            return
        self._break(f"the sandbox sent bytes that are not a frame ({why})")

    def _break(self, what: str) -> None:
        """Declare the channel corrupted: the read loop stops and the sandbox is replaced."""
        if self._broken is None and not self._expect_eof:
            self._broken = f"the sandbox's channel was corrupted: {what}"
            self.log.error("%s", self._broken)

    async def _read_loop(self) -> None:
        try:
            while self._broken is None:
                data = await self.backend.read()
                if not data:
                    break
                self._last_frame_at = time.monotonic()
                self._ping_sent_at = None
                for raw in self._decoder.feed(data):
                    if self._broken is not None:
                        break
                    try:
                        frame = protocol.validate_agent_frame(raw)
                    except Exception as err:  # ProtocolError, or a validator bug
                        self._decoder.dropped += 1
                        self._on_bad_line(f"invalid frame: {err}")
                        continue
                    try:
                        self._dispatch(frame)
                    except Exception:  # never let the sandbox crash the proxy
                        self.log.exception("error handling a %s frame", frame.op)
                        self._break(f"a {frame.op} frame could not be handled")
        except asyncio.CancelledError:
            raise
        except Exception:
            self.log.exception("reading from the sandbox failed")
        if self._expect_eof:
            return
        if self._broken is not None:
            await self._on_sandbox_end(self._broken)
            return
        if self.state in DETACHED:
            # A pause detached the stream (E2B drops every stream on pause): not a death.
            # wake() calls reattach(), which restarts this reader.
            self.log.info("the sandbox's stream ended while %s; reattaching on resume", self.state.value)
            return
        info = await self.backend.exit_info()
        self.log.error("sandbox ended: %s", info.cause)
        await self._on_sandbox_end(info.cause)

    async def _on_sandbox_end(self, cause: str) -> None:
        self._expect_eof = True
        with contextlib.suppress(Exception):
            await self.backend.kill()
        if self.state in (S.RUNNING, S.STARTING):
            self._to(S.DEAD)
        self.died_cause = cause
        self._ready.set()  # wake waiters; they see state != running
        told = self._fail_all(SandboxDied(cause)) > 0  # a failed cell carries the cause to the user
        self.host.on_lifecycle(LifecycleEvent.DIED, cause)
        if self.state is S.DEAD:
            asyncio.ensure_future(self._replace_dead_sandbox(told))

    async def _replace_dead_sandbox(self, told: bool) -> None:
        """Start a fresh sandbox right away, so the next cell does not wait.

        If no request was told of the death, the cause becomes the next cell's notice.
        """
        cause = self.died_cause
        try:
            await self.start()
        except SandboxKernelError as err:
            self.log.error("could not start a replacement sandbox: %s", err)
            self.died_cause = cause
            return
        if not told and cause:
            self.state_notice = self._lost_notice(f"the previous sandbox ended ({cause})")

    async def _watch_liveness(self) -> None:
        """Bound how long a pending request waits on a live but silent sandbox.

        While a request is pending and no frame came for :data:`PING_AFTER_S`,
        ask the agent for a ``pong``; when nothing at all comes back within
        :data:`PONG_TIMEOUT_S`, the channel is declared dead (the sandbox is
        replaced and the request fails with the reason).
        """
        while True:
            await asyncio.sleep(LIVENESS_TICK_S)
            if self.state is not S.RUNNING or not self.pending or self._broken is not None:
                self._ping_sent_at = None
                continue
            now = time.monotonic()
            if self._ping_sent_at is None:
                if now - self._last_frame_at >= PING_AFTER_S:
                    self._ping_sent_at = now
                    with contextlib.suppress(SandboxDied):
                        await self.backend.write(protocol.host_op_frame("ping"))
            elif now - self._ping_sent_at >= PONG_TIMEOUT_S and self._reader is not None:
                silent = now - self._last_frame_at
                self._break(f"no frame for {silent:.0f} s while a request was pending "
                            "(the agent stopped answering)")
                self._reader.cancel()
                with contextlib.suppress(BaseException):
                    await self._reader
                await self._on_sandbox_end(self._broken or "the agent stopped answering")

    def _dispatch(self, frame: AgentFrame) -> None:
        try:
            if not self._sequence.admit(frame.seq):
                return  # already seen: the replay resends what was in flight
        except protocol.ChannelCorrupted as err:
            self._break(str(err))
            return
        self._unacked += 1
        if self._unacked >= ACK_EVERY:
            self._unacked = 0
            asyncio.ensure_future(self._ack())
        if frame.op == "msg":
            self._on_msg(frame)
        elif frame.op == "ready":
            self._on_ready(frame)
        elif frame.op == "died":
            self._on_interpreter_death(frame)
        elif frame.op == "log":
            self.log.info("agent: %s", str(frame.body.get("text", ""))[:500])
        elif frame.op == "replayed":
            self._sequence.end_replay()

    def _on_ready(self, frame: AgentFrame) -> None:
        info = frame.body.get("kernel_info")
        if isinstance(info, dict):
            self.kernel_info = info
        warm_s = frame.body.get("warm_s")
        if isinstance(warm_s, (int, float)) and not isinstance(warm_s, bool):
            self.timings["completer_warm_s"] = float(warm_s)  # the agent's warm-up before ready (C16)
        guard = frame.body.get("guard")
        self.guard = {str(k)[:40]: v for k, v in guard.items() if isinstance(v, (bool, int))} \
            if isinstance(guard, dict) else None
        if self.state is S.STARTING:
            self._to(S.RUNNING)
        self._ready.set()

    def _on_interpreter_death(self, frame: AgentFrame) -> None:
        """The agent reports the inner kernel ended: fail what waited for it, tell the
        user (now, or on the next cell), and start a fresh interpreter."""
        if self._expect_eof:
            return  # we are killing the sandbox ourselves
        cause = self.backend.explain_interpreter_death(str(frame.body.get("cause", "unknown cause"))[:300])
        self.log.error("the interpreter died: %s; stderr: %s", cause, str(frame.body.get("stderr", ""))[-500:])
        self.died_cause = cause
        told = self._fail_all(SandboxDied(cause)) > 0
        self.host.on_lifecycle(LifecycleEvent.DIED, cause)
        if self.state is S.STARTING:
            self._ready.set()  # the start fails with the cause; no restart loop
            return
        if not told:
            self.state_notice = self._lost_notice(f"the interpreter ended between cells ({cause}) "
                                                  "and was restarted")
        asyncio.ensure_future(self._restart_after_death(cause))

    async def _restart_after_death(self, cause: str) -> None:
        try:
            await self.restart_interpreter(f"the interpreter died ({cause})")
        except SandboxKernelError as err:
            self.log.error("could not restart the interpreter: %s", err)

    async def _ack(self) -> None:
        with contextlib.suppress(SandboxDied):
            await self.backend.write(protocol.host_op_frame("ack", seq=self.last_seq))

    def _on_msg(self, frame: AgentFrame) -> None:
        pid = frame.parent_msg_id
        p = self.pending.get(pid) if pid else None
        if frame.channel == "iopub":
            if frame.msg_type == "status":
                if p is not None and frame.msg["content"].get("execution_state") == "idle":
                    p.idle.set()
                return
            self.host.on_iopub(frame, p)
        elif frame.channel in ("shell", "control"):
            if p is None or p.reply.done():
                if pid in self._abandoned or (p is not None and p.reply.exception() is not None):
                    self.log.info("late %s for a request given up; dropped", frame.msg_type)
                elif p is None:
                    self._break(f"a {frame.msg_type} for a request that does not exist")
                else:
                    self._break(f"a second {frame.msg_type} for one request")
                return
            p.reply.set_result(frame)
        elif frame.channel == "stdin":
            if frame.msg_type == "input_request" and p is not None:
                self.host.on_input_request(frame, p)


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
