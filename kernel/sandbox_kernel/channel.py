"""The agent's channel as the host reads it: frames in order, or a clear reason why not.

:class:`AgentChannel` reads one backend's stream in one task, cuts it into
frames (:class:`~sandbox_kernel.protocol.FrameDecoder`), checks each frame's
schema and number (:func:`~sandbox_kernel.protocol.validate_agent_frame`,
:class:`~sandbox_kernel.protocol.FrameSequence`) and hands the admitted ones
to its owner (:class:`~sandbox_kernel.relay.Relay`).  Anything that breaks the
channel's rules ends the read loop with a cause, ``"the sandbox's channel was
corrupted: <what>"``; so does silence while a request waits (a ``ping`` the
agent does not answer).  The owner decides what an end means (a death, a
detach by a pause, its own kill).

All methods run on the proxy's main asyncio loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

from . import protocol
from .aio import background
from .backends.base import SandboxBackend
from .errors import SandboxDied
from .heap import TRIM_AFTER_BYTES, TRIM_QUIET_S, return_freed_memory
from .protocol import AgentFrame

#: Frames between acknowledgements sent to the agent (it may then forget them).
ACK_EVERY = 64
#: Seconds without a frame, while a request is pending, before the channel asks the
#: agent whether it is alive (``ping``).
PING_AFTER_S = 10.0
#: Seconds a ``ping`` may go without any frame in return before the channel is
#: declared dead.
PONG_TIMEOUT_S = 20.0
#: Seconds a ping may go unanswered while a wake's replay is unanswered (the sandbox is
#: being restored from a checkpoint): a restore is not a stopped agent.
REPLAY_GRACE_S = 60.0
#: Seconds between two checks of the liveness watch.
LIVENESS_TICK_S = 1.0


class AgentChannel:
    """One sandbox's stream of frames, read strictly.

    Parameters
    ----------
    backend : SandboxBackend
        Where the bytes come from (:meth:`~SandboxBackend.read`) and where
        ``ack``/``ping`` go (:meth:`~SandboxBackend.write`).
    max_frame_bytes : int
        A longer frame corrupts the channel.
    on_frame : callable
        ``on_frame(frame)`` for each admitted frame, in order.
    on_end : coroutine function
        ``await on_end(cause)`` once the read loop ends by itself: ``cause`` is
        why the channel is corrupted or silent, or None when the stream simply
        ended (the owner asks the backend why).
    waiting : callable
        True while a request waits on the sandbox (the liveness watch runs only then).
    log : logging.Logger
    ping_after_s, pong_timeout_s : float, optional
        The liveness watch's timers, seconds (``SandboxKernel`` options);
        default :data:`PING_AFTER_S` and :data:`PONG_TIMEOUT_S`.
    """

    def __init__(self, backend: SandboxBackend, *, max_frame_bytes: int,
                 on_frame: Callable[[AgentFrame], None], on_end: Callable[[str | None], Awaitable[None]],
                 waiting: Callable[[], bool], log: logging.Logger, ping_after_s: float | None = None,
                 pong_timeout_s: float | None = None):
        self.backend = backend
        self.max_frame_bytes = max_frame_bytes
        self.on_frame = on_frame
        self.on_end = on_end
        self.waiting = waiting
        self.log = log
        self.ping_after_s = ping_after_s
        self.pong_timeout_s = pong_timeout_s
        self.sequence = protocol.FrameSequence()
        #: Why the channel is corrupted or silent (ends the read loop), or None.
        self.broken: str | None = None
        #: The owner is ending the stream itself: its end is no news.
        self.closing = False
        self._decoder = self._new_decoder()
        self._reader: asyncio.Task | None = None
        self._liveness: asyncio.Task | None = None
        self._unacked = 0
        self._last_frame_at = time.monotonic()
        self._ping_sent_at: float | None = None
        #: Bytes read since the last :func:`~.heap.return_freed_memory`, and the timer of
        #: the next one (:meth:`_trim_later`).
        self._read_since_trim = 0
        self._trim: asyncio.TimerHandle | None = None

    @property
    def last_seq(self) -> int:
        """Number of the last frame admitted."""
        return self.sequence.last

    @property
    def replaying(self) -> bool:
        return self.sequence.replaying

    def reading(self) -> bool:
        """True while a read loop is reading the stream."""
        return self._reader is not None and not self._reader.done()

    # ---- the owner's verbs --------------------------------------------------------

    def open(self, *, rebase: bool = False) -> None:
        """A new sandbox: numbering from 1 (``rebase``: restored from a snapshot, from its
        first frame's number, :class:`~.protocol.FrameSequence`), a fresh decoder, start
        reading (and watching)."""
        self.sequence.reset(rebase)
        self.broken = None
        self.closing = False
        self._decoder = self._new_decoder()
        self._reader = asyncio.ensure_future(self._read_loop())
        self._last_frame_at = time.monotonic()
        if self._liveness is None or self._liveness.done():
            self._liveness = asyncio.ensure_future(self._watch_liveness())

    async def close(self, *, stop_watching: bool = False) -> None:
        """Stop reading (the owner is killing the sandbox); its end is then no news."""
        self.closing = True
        if stop_watching and self._liveness is not None:
            self._liveness.cancel()
        if self.reading() and self._reader is not asyncio.current_task():
            assert self._reader is not None
            self._reader.cancel()
            with contextlib.suppress(BaseException):
                await self._reader

    def begin_replay(self) -> int:
        """After a resume: expect repeats (and a cut first line) until the agent's
        ``replayed``; read again if a pause ended the stream.  Returns the number
        of the last frame seen, to replay after."""
        after = self.sequence.begin_replay()
        if not self.reading():
            self._decoder = self._new_decoder()
            self._reader = asyncio.ensure_future(self._read_loop())
        return after

    def corrupt(self, what: str) -> None:
        """Declare the channel corrupted: the read loop stops, and ``on_end`` hears why."""
        if self.broken is None and not self.closing:
            self.broken = f"the sandbox's channel was corrupted: {what}"
            self.log.error("%s", self.broken)

    # ---- reading -----------------------------------------------------------------------

    def _new_decoder(self) -> protocol.FrameDecoder:
        return protocol.FrameDecoder(self.max_frame_bytes, on_drop=self._on_bad_line)

    def _on_bad_line(self, why: str) -> None:
        if self.sequence.replaying:  # a detach may have cut the first line; the replay resends it
            self.log.info("ignored a partial line while replaying: %s", why)
            return
        self.corrupt(f"the sandbox sent bytes that are not a frame ({why})")

    async def _read_loop(self) -> None:
        try:
            while self.broken is None:
                data = await self.backend.read()
                if not data:
                    if self.closing or not await self.backend.reconnect() or self.closing:
                        break
                    # the stream is back (a cut connection, the sandbox alive): the agent
                    # re-sends what the cut lost; the sequence drops what came through
                    self.log.warning("the stream from the sandbox was cut and is back; replaying")
                    after = self.sequence.begin_replay()
                    self._decoder = self._new_decoder()
                    await self._send("replay", after=after)
                    continue
                self._last_frame_at = time.monotonic()
                self._ping_sent_at = None
                self._trim_later(len(data))
                for raw in self._decoder.feed(data):
                    if self.broken is not None:
                        break
                    try:
                        frame = protocol.validate_agent_frame(raw)
                    except Exception as err:  # noqa: BLE001 - ProtocolError, or a validator bug
                        self._on_bad_line(f"invalid frame: {err}")
                        continue
                    self._admit(frame)
        except asyncio.CancelledError:
            raise
        except Exception:
            self.log.exception("reading from the sandbox failed")
        if not self.closing:
            await self.on_end(self.broken)

    def _trim_later(self, n: int) -> None:
        """Count ``n`` bytes read; past :data:`~.heap.TRIM_AFTER_BYTES`, give the freed
        memory back once the sandbox has been quiet for :data:`~.heap.TRIM_QUIET_S`."""
        self._read_since_trim += n
        if self._read_since_trim < TRIM_AFTER_BYTES:
            return
        if self._trim is not None:
            self._trim.cancel()
        self._trim = asyncio.get_running_loop().call_later(TRIM_QUIET_S, self._trim_now)

    def _trim_now(self) -> None:
        self._trim, self._read_since_trim = None, 0
        return_freed_memory()

    def _admit(self, frame: AgentFrame) -> None:
        ends_replay = self.sequence.ends_replay(frame.op, frame.body.get("after"))
        try:
            if not self.sequence.admit(frame.seq, ends_replay):
                return  # seen, or written before the replay request: the replay sends it in turn
        except protocol.ChannelCorrupted as err:
            self.corrupt(str(err))
            return
        self._unacked += 1
        if self._unacked >= ACK_EVERY:
            self._unacked = 0
            background(self._send("ack", seq=self.last_seq))
        if ends_replay:
            self.sequence.end_replay()
        elif frame.op not in ("pong", "replayed"):  # an earlier replay's end: nothing to hand on
            try:
                self.on_frame(frame)
            except Exception:  # never let the sandbox crash the proxy
                self.log.exception("error handling a %s frame", frame.op)
                self.corrupt(f"a {frame.op} frame could not be handled")

    async def _send(self, op: str, **fields: object) -> None:
        with contextlib.suppress(SandboxDied):
            await self.backend.write(protocol.host_op_frame(op, **fields))

    def _pong_limit_s(self) -> float:
        """How long a ping may go unanswered: ``pong_timeout_s``, or, while a wake's replay
        is unanswered (a checkpoint being restored: over 10 s on a loaded machine in the
        soak run), at least :data:`REPLAY_GRACE_S`."""
        limit = self.pong_timeout_s or PONG_TIMEOUT_S
        return max(limit, REPLAY_GRACE_S) if self.replaying else limit

    async def _watch_liveness(self) -> None:
        """Bound how long a waiting request depends on a live but silent sandbox.

        While a request waits and no frame came for ``ping_after_s``, ask the
        agent for a ``pong``; when nothing at all comes back within
        ``pong_timeout_s``, the channel is declared dead.
        """
        while True:
            await asyncio.sleep(LIVENESS_TICK_S)
            if not self.waiting() or self.broken is not None or not self.reading():
                self._ping_sent_at = None
                continue
            now = time.monotonic()
            if self._ping_sent_at is None:
                if now - self._last_frame_at >= (self.ping_after_s or PING_AFTER_S):
                    self._ping_sent_at = now
                    await self._send("ping")
            elif now - self._ping_sent_at >= self._pong_limit_s():
                silent = now - self._last_frame_at
                self.corrupt(f"no frame for {silent:.0f} s while a request was pending "
                             + ("after a wake (the restored sandbox never answered)" if self.replaying
                                else "(the agent stopped answering)"))
                await self.close()
                self.closing = False
                await self.on_end(self.broken)
