"""The host side of the framed link to one sandbox: its state, requests and replies.

:class:`Relay` owns a backend and the sandbox's :class:`SandboxState` (it is
the only writer, through :meth:`Relay._to`, which refuses any change not in
:data:`~sandbox_kernel.sandbox_state.TRANSITIONS`).  Its
:class:`~sandbox_kernel.channel.AgentChannel` reads the backend's stream
strictly (frame numbers, corruption, liveness) and hands it admitted frames;
its :class:`~sandbox_kernel.inflight.InFlight` matches replies to requests by
``parent_header.msg_id`` and hands IOPub and stdin messages to the proxy
kernel through :class:`RelayHost`.

It never crashes on input from the sandbox.  A corrupted channel or a silent
one (no frame for ``ping_after_s`` + ``pong_timeout_s`` while a request is
pending) is treated like a dead sandbox: the pending requests fail with the
cause, and a fresh sandbox is started.  The idle lifecycle
(:mod:`sandbox_kernel.lifecycle`) asks the relay to :meth:`~Relay.suspend` a
sandbox; the next request :meth:`~Relay.wake` s it.

All methods run on the proxy's main asyncio loop.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol, TypeVar

from . import protocol
from .aio import background
from .backends.base import SandboxBackend
from .channel import AgentChannel
from .errors import (
    AdmissionRefused,
    KernelRewound,
    KernelShuttingDown,
    SandboxDied,
    SandboxKernelError,
    SandboxStartError,
    SnapshotError,
)
from .files import FileTransfers
from .inflight import InFlight, MessageHost, Pending, inner_request, stdin_reply
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
T = TypeVar("T")

#: What a request made after a shutdown began is told (:class:`KernelShuttingDown`).
SHUTTING_DOWN = "the kernel is shutting down: no sandbox is started for this request"


class RelayHost(MessageHost, Protocol):
    """What the relay needs from the proxy kernel: the messages :class:`InFlight` hands
    on (:class:`~sandbox_kernel.inflight.MessageHost`), and the lifecycle's events."""

    def on_lifecycle(self, event: LifecycleEvent, detail: str) -> None:
        """Report a lifecycle event with a one-line detail (a notice for ``RESUMED``/``RESTORED``)."""


class Relay:
    """One sandbox, its agent, and the requests in flight.

    Parameters
    ----------
    backend : SandboxBackend
    host : RelayHost
    max_frame_bytes : int
        A frame longer than this corrupts the channel.
    log : logging.Logger
    ping_after_s, pong_timeout_s : float, optional
        The liveness watch's timers, seconds (``SandboxKernel`` options); default
        :data:`~sandbox_kernel.channel.PING_AFTER_S` and
        :data:`~sandbox_kernel.channel.PONG_TIMEOUT_S`.
    """

    def __init__(self, backend: SandboxBackend, host: RelayHost, *, max_frame_bytes: int,
                 log: logging.Logger, ping_after_s: float | None = None,
                 pong_timeout_s: float | None = None):
        self.backend = backend
        self.host = host
        self.log = log
        self.max_frame_bytes = max_frame_bytes
        self.state = S.STOPPED
        #: Every transition taken, in order (``(old, new)``); bounded.
        self.history: collections.deque[tuple[SandboxState, SandboxState]] = collections.deque(maxlen=64)
        self.kernel_info: dict[str, Any] | None = None
        self.last_activity = time.monotonic()
        #: Host operations under way on the sandbox (:meth:`awake`): no idle step meanwhile.
        self.holds = 0
        self.timings: dict[str, float] = {}
        #: How many times each idle action and wake-up happened (``pause``, ``resume``...).
        self.counts: collections.Counter[str] = collections.Counter()
        self.died_cause: str | None = None
        #: A request was failed with :attr:`died_cause` (the user heard it in that cell): the
        #: next one is not told again, whether or not the replacement has started by then.
        self.death_told = False
        #: Idle seconds after which the sandbox was stopped, until the next request.
        self.stopped_after_idle_s: float | None = None
        #: A notice for the next cell (state was lost while nobody was told).
        self.state_notice: str | None = None
        #: The state a wake started from (``paused`` or ``checkpointed``), for :meth:`progress`.
        self._waking_from: SandboxState | None = None
        #: What guards the agent's channel inside the sandbox (the agent's ``ready``).
        self.guard: dict[str, Any] | None = None
        self._ready = asyncio.Event()
        #: A fork whose source ran a cell: the copy's interrupted cell must end before the first request.
        self.settle_needed = False
        self._lock = asyncio.Lock()
        #: Backend verbs under way (start, pause, checkpoint, resume) and kills under way:
        #: :meth:`shutdown` waits for both, so whatever they make is removed before it returns.
        self._ops: set[asyncio.Future] = set()
        self._kills: set[asyncio.Future] = set()
        self.channel = AgentChannel(backend, max_frame_bytes=max_frame_bytes, on_frame=self._dispatch,
                                    on_end=self._on_channel_end, waiting=self._waiting, log=log,
                                    ping_after_s=ping_after_s, pong_timeout_s=pong_timeout_s)
        self.inflight = InFlight(host, self.channel.corrupt, log)
        #: The file transfers of this sandbox (:mod:`sandbox_kernel.files`), set by the
        #: proxy; the agent's ``file`` and ``file_data`` frames go there.
        self.files: FileTransfers | None = None

    @property
    def pending(self) -> dict[str, Pending]:
        """msg_id -> request relayed and not finished yet."""
        return self.inflight.pending

    @property
    def last_seq(self) -> int:
        """Number of the last frame read from the agent."""
        return self.channel.last_seq

    def _waiting(self) -> bool:
        return self.state is S.RUNNING and bool(self.pending)

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

    @property
    def shut_down(self) -> bool:
        """True once :meth:`shutdown` began: nothing starts or wakes a sandbox any more."""
        return self.state is S.SHUT_DOWN

    async def _backend_op(self, verb: Callable[[], Awaitable[T]]) -> T:
        """Run a backend verb that may make or keep a sandbox (``start``, ``pause``,
        ``checkpoint``, ``resume``), known to :meth:`shutdown` until it ends.

        The verb runs in its own task: a caller that is cancelled (a request whose
        client went away) does not cut it half-way; :meth:`shutdown` waits for it.

        Raises
        ------
        KernelShuttingDown
            If the shutdown began: the verb is not run.
        """
        if self.shut_down:
            raise KernelShuttingDown(SHUTTING_DOWN)
        task = asyncio.ensure_future(verb())
        self._ops.add(task)
        task.add_done_callback(self._op_done)
        return await asyncio.shield(task)

    def _op_done(self, task: asyncio.Future) -> None:
        self._ops.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved: a caller cancelled meanwhile does not see it

    async def _kill_quietly(self) -> None:
        with contextlib.suppress(Exception):
            await self.backend.kill()

    async def _kill_tracked(self) -> None:
        """``backend.kill()``, returning only once every kill begun so far has ended (a
        second caller must not return while the first is still removing the sandbox)."""
        task = asyncio.ensure_future(self._kill_quietly())
        self._kills.add(task)
        task.add_done_callback(self._kills.discard)
        await asyncio.wait(set(self._kills))

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
        if self.shut_down:
            raise KernelShuttingDown(SHUTTING_DOWN)
        if self._kills:  # the previous sandbox is still being removed: its memory, its processes
            await asyncio.wait(set(self._kills))
            if self.shut_down:
                raise KernelShuttingDown(SHUTTING_DOWN)
        self._to(S.STARTING)
        self.stopped_after_idle_s = None
        t0 = time.monotonic()
        self._ready.clear()
        self.channel.closing = False
        try:
            await self._backend_op(self.backend.start)
        except SandboxKernelError:
            self._start_failed()
            raise
        except Exception as err:
            self._start_failed()
            raise SandboxStartError(f"the {self.backend.name} sandbox did not start: {err}") from err
        if self.state is not S.STARTING:  # shut down meanwhile: shutdown() removes it
            raise KernelShuttingDown(SHUTTING_DOWN)
        copy = self.backend.restored_copy()
        if copy is not None:  # a fork's first sandbox: no ready comes, its agent numbers on
            self._started_as_fork(copy, t0)
            return
        self.channel.open()
        timeout = self.backend.ready_timeout_s
        try:
            await asyncio.wait_for(self._ready.wait(), timeout)
        except TimeoutError as err:
            info = await self.backend.exit_info() if not self.channel.reading() else None
            await self._kill_backend()
            self._start_failed()
            cause = info.cause if info else f"no answer within {timeout:.0f} s"
            raise SandboxStartError(f"the sandbox's interpreter did not start: {cause}") from err
        if self.shut_down:
            raise KernelShuttingDown(SHUTTING_DOWN)
        if self.state is not S.RUNNING:
            cause = self.died_cause or "it exited during start"
            if self.state is S.STARTING:
                await self._kill_backend()
                self._start_failed()
            raise SandboxStartError(f"the sandbox's interpreter did not start: {cause}")
        self.died_cause, self.death_told = None, False
        self.timings["start_s"] = time.monotonic() - t0
        self.last_activity = time.monotonic()
        self.host.on_lifecycle(LifecycleEvent.STARTED, f"{self.backend.capabilities.boundary}, "
                                                       f"{self.timings['start_s']:.2f} s")

    def _started_as_fork(self, copy: dict[str, Any], t0: float) -> None:
        """The sandbox just started is a fork's (:meth:`.backends.base.SandboxBackend.restored_copy`):
        its interpreter is its source's as it was, answering already; what it sends for the
        source's requests is dropped, as after a rewind, but for a thread's output, published
        with no parent (:meth:`.inflight.InFlight.begin_rewound`)."""
        info = copy.get("kernel_info")
        self.kernel_info = info if isinstance(info, dict) else self.kernel_info
        self.settle_needed = bool(copy.get("busy"))  # the source's cell of then ends first (.proxy)
        self.inflight.begin_rewound(settled=not self.settle_needed)
        self.channel.open(rebase=True)
        self._now_ready()
        self.died_cause, self.death_told = None, False
        self.timings["start_s"] = time.monotonic() - t0
        self.last_activity = time.monotonic()
        self.host.on_lifecycle(LifecycleEvent.FORKED, notice(
            f"this kernel is fork {copy.get('fork_id', '')} of kernel {copy.get('source_kernel', '')}, with its "
            f"state as of {copy.get('created', '')} (started in {self.timings['start_s']:.2f} s)"))

    @contextlib.asynccontextmanager
    async def awake(self) -> AsyncIterator[str | None]:
        """Keep the sandbox running for a host operation (a file transfer): woken as by
        :meth:`ensure_running` (whose notice it yields), then no idle pause, checkpoint
        or stop until the block ends, however long the sandbox takes to read or answer.

        Raises
        ------
        SandboxStartError, KernelShuttingDown
            As :meth:`ensure_running`.
        """
        self.holds += 1  # before the wake: an idle step cannot begin between the two
        try:
            yield await self.ensure_running()
        finally:
            self.holds -= 1
            self.last_activity = time.monotonic()

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
        KernelShuttingDown
            Once :meth:`shutdown` began (a request queued behind it).
        """
        if self.shut_down:
            raise KernelShuttingDown(SHUTTING_DOWN)
        self.last_activity = time.monotonic()
        if self.state is S.STARTING:
            await self._ready.wait()
        told, self.state_notice = self.state_notice, None
        try:
            if self.state in SUSPENDED or self.stopped_after_idle_s is not None:
                told = await self.wake() or told
            if self.state is S.RUNNING:
                return told
            if self.state is S.DEAD and self.died_cause and not self.death_told:
                told = self._lost_notice(f"the previous sandbox ended ({self.died_cause})")
            async with self._lock:
                if self.state is not S.RUNNING:
                    await self._start_locked()
        except SandboxKernelError:
            # no sandbox came back: a state-lost notice not yet told waits for the start
            # that succeeds (the cell getting this error sees it too: SandboxKernel)
            self.state_notice = self.state_notice or told
            raise
        return told

    def progress(self) -> str:
        """What a request waiting in :meth:`ensure_running` waits for, in words, e.g.
        ``"restoring the sandbox from its checkpoint"``; the kernel shows it live in
        the cell that waits (:meth:`.cells.Cells.ready_with_progress`)."""
        if self.backend.waiting_for:
            return f"waiting for {self.backend.waiting_for}"
        if self.state is S.RESUMING:
            return ("restoring the sandbox from its checkpoint" if self._waking_from is S.CHECKPOINTED
                    else "resuming the paused sandbox")
        if self.state in (S.PAUSING, S.CHECKPOINTING, S.STOPPING):
            return f"waiting for the idle sandbox to finish {self.state.value}, then bringing it back"
        if self.died_cause:
            return f"starting a new sandbox (the previous one ended: {self.died_cause})"
        return "starting the sandbox"

    @staticmethod
    def _lost_notice(what: str) -> str:
        return notice(f"{what}; this is a fresh interpreter: variables and imports were lost.")

    async def _kill_backend(self, *, final: bool = False) -> None:
        self.channel.closing = True
        await self._kill_tracked()
        await self.channel.close(stop_watching=final)

    def fail_pending(self, cause: str) -> int:
        """Answer every request waiting on the sandbox with :class:`SandboxDied` (``cause``)
        now, before the slower work of a shutdown (a copy back, the kill); a reply that
        comes later is dropped.  Returns how many were pending."""
        return self._fail_all(SandboxDied(cause))

    async def shutdown(self) -> None:
        """Remove the sandbox for good; pending requests fail.  Idempotent.

        The state becomes ``shut_down`` before anything is awaited, so nothing
        started afterwards (a request queued behind the shutdown, the replacement
        of a dead sandbox, the idle timer) can start, wake or suspend a sandbox.
        Backend verbs already under way are waited for (not cut: a start
        cancelled half-way could leave a process or a directory), then the
        sandbox is killed; it returns once every kill has ended.
        """
        if not self.shut_down:
            self._to(S.SHUT_DOWN)
        self._ready.set()  # a start waiting for ready sees the shutdown
        self.channel.closing = True
        while self._ops:
            await asyncio.wait(set(self._ops))
        await self._kill_backend(final=True)
        self._fail_all(SandboxDied("the kernel is shutting down"))
        if self.files is not None:
            self.files.fail_all("the kernel is shutting down")

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
            except (TimeoutError, SandboxDied):
                await self._kill_backend()
                self._start_failed()
                await self._start_locked()
        self.host.on_lifecycle(LifecycleEvent.RESTARTED, reason)

    # ---- snapshots: take one, rewind to one (sandbox_kernel.snapshots) ---------------------

    async def snapshot(self, take: Callable[[], Awaitable[T]]) -> T:
        """Run ``take`` (the backend's snapshot of the running sandbox) with the sandbox
        awake (a paused or checkpointed one is woken first) and no other lifecycle step
        meanwhile; cells go on running (runsc pauses the sandbox while it writes).

        Raises
        ------
        SandboxKernelError
            No sandbox could be brought up, or ``take`` failed (the sandbox goes on).
        """
        async with self.awake(), self._lock:
            if self.state is not S.RUNNING:
                raise SnapshotError(f"the sandbox is {self.state.value}, not running: nothing to snapshot")
            return await self._backend_op(take)

    async def rewind(self, restore: Callable[[], Awaitable[None]], *, cause: str, notice_text: str,
                     kernel_info: dict[str, Any] | None) -> str:
        """Replace the sandbox with one restored from a snapshot: the requests pending are
        answered with :class:`~.errors.KernelRewound` (``cause``), the sandbox killed,
        ``restore`` (the backend's) makes the new one, whose agent numbers its frames
        from where it was at the snapshot (:meth:`.channel.AgentChannel.open` ``rebase``);
        what it sends for requests of before (a cell that ran when the snapshot was taken,
        which ``restore`` interrupts) is dropped (:meth:`.inflight.InFlight.begin_rewound`).

        Returns
        -------
        str
            The notice the next cell shows (``notice_text`` and the time the restore took),
            given to :meth:`RelayHost.on_lifecycle` as ``REWOUND``'s detail.

        Raises
        ------
        SnapshotError
            The restore failed: a fresh sandbox was started instead (the next cell is told
            that state was lost).
        """
        await self.ensure_running()
        async with self._lock:
            if self.shut_down:
                raise KernelShuttingDown(SHUTTING_DOWN)
            if self.state is not S.RUNNING:
                raise SnapshotError(f"the sandbox is {self.state.value}: not rewound")
            self._fail_all(KernelRewound(cause))
            if self.files is not None:
                self.files.fail_all(cause)
            self._ready.clear()
            self._to(S.STARTING)
            await self._kill_backend()
            t0 = time.monotonic()
            try:
                await self._backend_op(restore)
            except Exception as err:
                self._start_failed()
                self.log.error("restore from the snapshot failed: %s", err)
                await self._start_locked()
                self.state_notice = self._lost_notice(f"the rewind failed ({err})")
                raise SnapshotError(f"the restore failed ({err}); a fresh interpreter was started") from err
            if self.state is not S.STARTING:
                raise KernelShuttingDown(SHUTTING_DOWN)
            self.kernel_info = kernel_info or self.kernel_info
            self.inflight.begin_rewound()
            self.channel.open(rebase=True)
            self._to(S.RUNNING)
            self._ready.set()
            self.died_cause, self.death_told = None, False
            self.timings["rewind_s"] = time.monotonic() - t0
            self.counts["rewind"] += 1
            self.last_activity = time.monotonic()
        told = notice(f"{notice_text} in {self.timings['rewind_s']:.2f} s")
        self.host.on_lifecycle(LifecycleEvent.REWOUND, told)
        return told

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
            if self.pending or self.holds or self.state not in (S.RUNNING, S.PAUSED, S.CHECKPOINTED):
                return False
            if time.monotonic() - self.last_activity < min_idle_s:
                return False
            before = self.state
            self._to(action.transient)
            t0 = time.monotonic()
            try:
                if action is IdleAction.PAUSE:
                    await self._backend_op(self.backend.pause)
                elif action is IdleAction.CHECKPOINT:
                    await self._backend_op(self.backend.checkpoint)
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
            await self._backend_op(self.backend.resume)
            await self.reattach()
        except Exception as err:  # noqa: BLE001 - any failure: the sandbox is ended and the next cell told
            self.log.error("could not reattach after the failed %s: %s", action.value, err)
            await self._kill_backend()
            if self.shut_down:
                return
            self._to(S.DEAD)
            self.died_cause = f"the sandbox was lost when an idle {action.value} failed ({err})"

    async def wake(self) -> str | None:
        """Bring a paused, checkpointed or idle-stopped sandbox back before a request.

        Returns
        -------
        str or None
            A notice that state was lost (idle stop, failed restore), else None.

        Raises
        ------
        AdmissionRefused
            A checkpointed sandbox could not be restored for lack of memory (the backend
            waited and retried first): it stays checkpointed, state kept on disk.
        """
        async with self._lock:
            self.last_activity = time.monotonic()
            if self.state in (S.PAUSED, S.CHECKPOINTED):
                restore = self.state is S.CHECKPOINTED
                kind = "restore" if restore else "resume"
                self._waking_from = self.state
                self._to(S.RESUMING)
                t0 = time.monotonic()
                try:
                    await self._backend_op(self.backend.resume)
                    if self.state is not S.RESUMING:
                        return None  # shut down meanwhile
                    self._to(S.RUNNING)
                    # restart the reader if the pause ended the stream (E2B), then replay
                    # the frames written while detached (still buffered in the agent)
                    await self.reattach()
                except AdmissionRefused:  # no memory for it now: it stays on disk, nothing lost
                    if self.state is S.RESUMING:
                        self._to(S.CHECKPOINTED)
                    raise
                except Exception as err:  # noqa: BLE001 - any failure: a fresh sandbox and a notice
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
                told, self.backend.notice = self.backend.notice, None
                self.host.on_lifecycle(LifecycleEvent.RESTORED if restore else LifecycleEvent.RESUMED,
                                       notice(f"{what} in {dt:.2f} s" + (f"; {told}" if told else "")))
                return None
            if self.state is S.STOPPED and self.stopped_after_idle_s is not None:
                lost = notice(f"sandbox stopped after {human_duration(self.stopped_after_idle_s)} idle; "
                              "state was lost; this is a fresh interpreter")
                try:
                    await self._start_locked()
                except SandboxKernelError:
                    # the fresh start was refused (AdmissionRefused...): the state is lost all
                    # the same, so the cell that gets the error is told, and the start that
                    # succeeds later says it again (a fresh interpreter)
                    self.state_notice = lost
                    raise
                return lost
        return None

    # ---- requests ----------------------------------------------------------------

    async def send_request(self, channel: str, parent: dict[str, Any], ident: list[bytes],
                           expect_reply: bool = True, header: dict[str, Any] | None = None,
                           own: bool = False) -> Pending:
        """Relay a frontend request to the inner kernel's ``channel``; return its :class:`Pending`.

        The inner request reuses the frontend's header (same ``msg_id``), so
        replies and outputs are matched by ``parent_header.msg_id``; ``header``
        overrides fields of the inner copy only (a subshell's inner id); ``own``: the
        proxy's own request, whose IOPub has no parent (:class:`.inflight.Pending`).

        Raises
        ------
        SandboxDied
            If the sandbox is gone.
        """
        p = self.inflight.add(parent, ident, expect_reply, own)
        try:
            inner = inner_request(parent)
            if header:
                inner["header"] = {**inner["header"], **header}
            await self.backend.write(protocol.host_msg_frame(channel, inner, parent.get("buffers")))
        except SandboxDied:
            self.pending.pop(p.msg_id, None)
            raise
        return p

    async def wait(self, p: Pending) -> AgentFrame | None:
        """Wait for ``p``'s reply and idle status (:meth:`InFlight.wait`)."""
        return await self.inflight.wait(p)

    def abandon(self, p: Pending, err: BaseException) -> None:
        """Fail ``p`` with ``err``; a reply that still comes for it is dropped quietly."""
        self.inflight.abandon(p, err)

    def _fail_all(self, err: BaseException) -> int:
        return self.inflight.fail_all(err)

    async def send_stdin_reply(self, request: AgentFrame, value: str) -> None:
        """Answer the inner kernel's ``input_request`` with ``value``."""
        await self.backend.write(protocol.host_msg_frame("stdin", stdin_reply(request, value)))

    async def interrupt(self) -> None:
        """Deliver SIGINT to the inner kernel's process group (through the agent)."""
        if self.state is S.RUNNING:
            await self.backend.write(protocol.host_op_frame("interrupt"))

    def reader_ended(self) -> bool:
        """True when nothing is reading the backend's stream."""
        return not self.channel.reading()

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
        after = self.channel.begin_replay()
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

    async def _on_channel_end(self, cause: str | None) -> None:
        """The channel stopped by itself: corrupted or silent (``cause``), or the stream
        ended: a pause detached it (E2B), or the sandbox ended (its exit tells why)."""
        if cause is None:
            if self.state in DETACHED:
                # wake() calls reattach(), which reads again.
                self.log.info("the sandbox's stream ended while %s; reattaching on resume", self.state.value)
                return
            info = await self.backend.exit_info()
            self.log.error("sandbox ended: %s", info.cause)
            cause = info.cause
        await self._on_sandbox_end(cause)

    async def _on_sandbox_end(self, cause: str) -> None:
        self.channel.closing = True
        if self.state in (S.RUNNING, S.STARTING):
            self._to(S.DEAD)
        self.died_cause = cause
        self._ready.set()  # wake waiters; they see state != running
        # the user hears the cause at once; removing the sandbox may take seconds (a stopped one)
        told = self._fail_all(SandboxDied(cause)) > 0  # a failed cell carries the cause to the user
        self.death_told = told
        if self.files is not None:
            self.files.fail_all(cause)
        self.host.on_lifecycle(LifecycleEvent.DIED, cause)
        await self._kill_tracked()
        if self.state is S.DEAD:
            background(self._replace_dead_sandbox(told))

    async def _replace_dead_sandbox(self, told: bool) -> None:
        """Start a fresh sandbox right away, so the next cell does not wait.

        If no request was told of the death, the cause becomes the next cell's notice.
        """
        cause = self.died_cause
        if not told and cause:  # before the start: a request let in once it is ready must see it
            self.state_notice = self._lost_notice(f"the previous sandbox ended ({cause})")
        try:
            await self.start()
        except SandboxKernelError as err:
            self.log.error("could not start a replacement sandbox: %s", err)
            self.died_cause = cause

    def _dispatch(self, frame: AgentFrame) -> None:
        """An admitted frame from the agent (the channel checked it and its number)."""
        if frame.op == "msg":
            self.last_activity = time.monotonic()  # output, comm traffic: the sandbox is at work
            self.inflight.route(frame)
        elif frame.op == "ready":
            self._on_ready(frame)
        elif frame.op == "died":
            self._on_interpreter_death(frame)
        elif frame.op in ("file", "file_data"):
            self.last_activity = time.monotonic()  # a transfer in progress is activity
            if self.files is not None:
                self.files.on_frame(frame)
        elif frame.op == "log":
            self.log.info("agent: %s", str(frame.body.get("text", ""))[:500])

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
        if self.state is S.STARTING and self.backend.holds_ready:
            background(self._ready_after_backend())
            return
        self._now_ready()

    async def _ready_after_backend(self) -> None:
        """The backend's :meth:`~.backends.base.SandboxBackend.on_ready` (a start template
        is made), then the sandbox takes requests: none reaches it before."""
        try:
            await self.backend.on_ready()
        except Exception:
            self.log.exception("the backend's step after ready failed")
        self._now_ready()

    def _now_ready(self) -> None:
        """The sandbox takes requests: a start ends in ``running``, waiters are woken."""
        if self.state is S.STARTING:
            self._to(S.RUNNING)
        self._ready.set()

    def _on_interpreter_death(self, frame: AgentFrame) -> None:
        """The agent reports the inner kernel ended: fail what waited for it, tell the
        user (now, or on the next cell), and start a fresh interpreter."""
        if self.channel.closing:
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
        background(self._restart_after_death(cause))

    async def _restart_after_death(self, cause: str) -> None:
        try:
            await self.restart_interpreter(f"the interpreter died ({cause})")
        except SandboxKernelError as err:
            self.log.error("could not restart the interpreter: %s", err)
