"""The sandbox's states, the transitions between them, and the events the proxy hears.

Pure: no I/O.  :class:`~sandbox_kernel.relay.Relay` is the only writer of a
:class:`SandboxState` (``Relay._to``), and refuses a transition that is not in
:data:`TRANSITIONS`; the idle lifecycle (:mod:`sandbox_kernel.lifecycle`) only
asks the relay to :meth:`~sandbox_kernel.relay.Relay.suspend` or
:meth:`~sandbox_kernel.relay.Relay.wake`.  ``docs/architecture.md`` draws the
same table as a diagram, and ``tests/test_sandbox_state.py`` walks every edge.
"""

from __future__ import annotations

import enum

from .errors import SandboxKernelError


class SandboxState(str, enum.Enum):
    """Where one kernel's sandbox is.  The value is what ``kernel_info``'s
    ``sandbox.state`` shows."""

    #: No sandbox: before the first start, after shutdown, or stopped while idle.
    STOPPED = "stopped"
    #: A sandbox (or, after a death or timeout, only its interpreter) is starting.
    STARTING = "starting"
    #: The interpreter answers requests.
    RUNNING = "running"
    PAUSING = "pausing"
    #: Frozen: CPU freed, memory kept.
    PAUSED = "paused"
    CHECKPOINTING = "checkpointing"
    #: Memory written to disk and freed; state kept.
    CHECKPOINTED = "checkpointed"
    #: Coming back from ``paused`` or ``checkpointed`` before a request.
    RESUMING = "resuming"
    #: Being removed after an idle stop.
    STOPPING = "stopping"
    #: Ended without being asked to (died, corrupted channel, failed start or resume);
    #: the next request starts a fresh sandbox and says why.
    DEAD = "dead"
    #: The kernel is shutting down (or restarting: a new kernel process follows): terminal.
    #: Nothing starts, wakes or suspends a sandbox from here (:meth:`Relay.shutdown
    #: <sandbox_kernel.relay.Relay.shutdown>` waits for what was under way, then removes it).
    SHUT_DOWN = "shut_down"


S = SandboxState

#: Every allowed transition (``from -> {to}``).  Staying in a state is not a
#: transition.  Every state may also go to ``shut_down`` (a shutdown comes at any
#: time), and ``shut_down`` goes nowhere: a request queued behind the shutdown cannot
#: start a sandbox the exiting proxy would leave behind.
TRANSITIONS: dict[SandboxState, frozenset[SandboxState]] = {
    old: frozenset(new) | {S.SHUT_DOWN} for old, new in {
        S.STOPPED: {S.STARTING},
        S.STARTING: {S.RUNNING, S.DEAD},
        S.RUNNING: {S.STARTING, S.PAUSING, S.CHECKPOINTING, S.STOPPING, S.DEAD},
        S.PAUSING: {S.PAUSED, S.RUNNING},
        S.PAUSED: {S.RESUMING, S.CHECKPOINTING, S.STOPPING},
        S.CHECKPOINTING: {S.CHECKPOINTED, S.RUNNING, S.PAUSED},
        S.CHECKPOINTED: {S.RESUMING, S.STOPPING},
        S.RESUMING: {S.RUNNING, S.DEAD, S.CHECKPOINTED},
        S.STOPPING: {S.STOPPED},
        S.DEAD: {S.STARTING},
    }.items()
}
TRANSITIONS[S.SHUT_DOWN] = frozenset()

#: States in which the stream from the sandbox may end without the sandbox having
#: died: a pause or checkpoint detached it (E2B drops every stream on pause).
DETACHED = frozenset({S.PAUSING, S.PAUSED, S.CHECKPOINTING, S.CHECKPOINTED, S.RESUMING})
#: States a request must wake the sandbox from (idle-stopped is told apart by the relay).
SUSPENDED = frozenset({S.PAUSING, S.PAUSED, S.CHECKPOINTING, S.CHECKPOINTED, S.STOPPING})
#: States the idle lifecycle may move down from.
IDLE_LEVELS = (S.RUNNING, S.PAUSED, S.CHECKPOINTED, S.STOPPED)


class IllegalTransition(SandboxKernelError, RuntimeError):
    """A state change not in :data:`TRANSITIONS`: a bug in sandbox-kernel.  Please report it
    with the kernel's log."""

    def __init__(self, old: SandboxState, new: SandboxState):
        self.old, self.new = old, new
        super().__init__(f"sandbox state {old.value} -> {new.value} is not a transition")


class IdleAction(str, enum.Enum):
    """What the idle lifecycle asks of the relay after ``*_after_s`` idle seconds."""

    PAUSE = "pause"
    CHECKPOINT = "checkpoint"
    STOP = "stop"

    @property
    def transient(self) -> SandboxState:
        """The state while the action runs."""
        return {IdleAction.PAUSE: S.PAUSING, IdleAction.CHECKPOINT: S.CHECKPOINTING,
                IdleAction.STOP: S.STOPPING}[self]

    @property
    def target(self) -> SandboxState:
        """The state once the action is done."""
        return {IdleAction.PAUSE: S.PAUSED, IdleAction.CHECKPOINT: S.CHECKPOINTED,
                IdleAction.STOP: S.STOPPED}[self]


class LifecycleEvent(str, enum.Enum):
    """What :meth:`RelayHost.on_lifecycle` reports (with a one-line detail)."""

    STARTED = "started"
    DIED = "died"
    RESTARTED = "restarted"
    PAUSED = "paused"
    CHECKPOINTED = "checkpointed"
    STOPPED = "stopped"
    RESUMED = "resumed"
    RESTORED = "restored"
    #: Rewound to a snapshot (``restore_request``): the detail is the notice for the next cell.
    REWOUND = "rewound"
    #: Started as a fork of another kernel (``fork_request``): the detail is the notice for its first cell.
    FORKED = "forked"


#: The event each idle action reports once done.
IDLE_EVENTS = {IdleAction.PAUSE: LifecycleEvent.PAUSED, IdleAction.CHECKPOINT: LifecycleEvent.CHECKPOINTED,
               IdleAction.STOP: LifecycleEvent.STOPPED}


#: Metadata key of the ``display_data`` a waiting cell shows while its sandbox starts,
#: wakes or restores (cleared before the cell's own output), so agents can tell it apart.
PROGRESS_METADATA = "sandbox_kernel_progress"


def notice(text: str) -> str:
    """A line for the user's cell output, in one voice: ``sandbox-kernel: <text>``."""
    return f"sandbox-kernel: {text}"


def human_duration(seconds: float) -> str:
    """``4 s``, ``10 min``, ``1 h``, ``1 h 30 min``.

    Examples
    --------
    >>> human_duration(4.2), human_duration(600), human_duration(5400)
    ('4 s', '10 min', '1 h 30 min')
    """
    s = round(seconds)
    if s < 120:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min"
    h, m = divmod(s // 60, 60)
    return f"{h} h" + (f" {m} min" if m else "")
