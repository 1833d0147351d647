"""The idle lifecycle: running -> paused -> checkpointed -> stopped, resume on demand.

One :class:`IdleLifecycle` per proxy kernel runs a periodic task on the
proxy's main asyncio loop (started from ``SandboxKernel.start``).  Each tick it

* calls :meth:`SandboxBackend.refresh` every ``refresh_every_s`` (a backend
  option; the cloud dead-man's switch: E2B ``set_timeout``);
* measures idleness as the time since the sandbox was last active, as a user
  means it: a relayed request (a running cell, a pending ``input()``, a comm
  message from the frontend), any message from the sandbox (output of a
  background thread, a comm's update), a file transfer, or the sandbox's own
  CPU above :data:`CPU_ACTIVE_SHARE` of a core since the last tick (a training
  loop in a thread that prints nothing); and asks the relay to go one level down
  (:meth:`Relay.suspend <sandbox_kernel.relay.Relay.suspend>`) when the policy
  says so.

Levels (:func:`plan`), each used only where the backend's
:class:`~sandbox_kernel.backends.base.Capabilities` allow:

``pause`` (``pause_after_s``)
    Freeze; CPU freed, memory kept.  Without ``pause_keeps_memory`` the level
    becomes a checkpoint when the backend has one, else it is skipped.
``checkpoint`` (``checkpoint_after_s``)
    Memory written to disk and freed; the interpreter comes back intact.
    Without ``checkpoint`` the level becomes a stop (state lost, user told).
``stop`` (``stop_after_s``)
    The sandbox is removed; the next request starts a fresh one and the cell's
    output begins with a plain notice.

Any relayed request wakes the sandbox first (:meth:`Relay.ensure_running
<sandbox_kernel.relay.Relay.ensure_running>`); heartbeats and ``kernel_info``
are answered by the proxy itself and never wake it.  The relay owns the state
and its lock: a request arriving mid-pause waits for the pause, then resumes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .backends.base import Capabilities
from .errors import SandboxKernelError
from .policy import Policy
from .sandbox_state import IDLE_LEVELS, IdleAction, SandboxState

if TYPE_CHECKING:
    from .relay import Relay

#: Longest tick of the idle timer, seconds.
TICK_MAX_S = 1.0
#: Share of one core the sandbox's processes must use over :data:`CPU_WINDOW_S` to count as
#: active (an idle gVisor sandbox uses about 0.04: its Sentry, the agent's poll, ipykernel's
#: threads; bubblewrap's about 0.001; a busy loop in a thread about 1, and still about 0.3
#: with both cores taken by other work).
CPU_ACTIVE_SHARE = 0.15
#: Seconds over which the sandbox's CPU share is measured (the clock ticks of
#: ``/proc/<pid>/stat`` are 10 ms: a shorter window reads mostly rounding).
CPU_WINDOW_S = 1.0


@dataclass(frozen=True)
class Step:
    """One level of the idle plan: ``action`` after ``after_s`` idle seconds."""

    after_s: float
    action: IdleAction


def _depth(state: SandboxState) -> int:
    return IDLE_LEVELS.index(state)


def plan(policy: Policy, caps: Capabilities) -> list[Step]:
    """The idle steps in force for ``policy`` on a backend with ``caps``.

    Returns
    -------
    list of Step
        Sorted by time, each action at most once, nothing after a stop.
    """
    steps = []
    if policy.pause_after_s > 0:
        if caps.pause_keeps_memory:
            steps.append(Step(policy.pause_after_s, IdleAction.PAUSE))
        elif caps.checkpoint:
            steps.append(Step(policy.pause_after_s, IdleAction.CHECKPOINT))
    if policy.checkpoint_after_s > 0:
        steps.append(Step(policy.checkpoint_after_s,
                          IdleAction.CHECKPOINT if caps.checkpoint else IdleAction.STOP))
    if policy.stop_after_s > 0:
        steps.append(Step(policy.stop_after_s, IdleAction.STOP))
    out: list[Step] = []
    for s in sorted(steps, key=lambda s: s.after_s):
        if out and out[-1].action is IdleAction.STOP:
            break
        if any(_depth(o.action.target) >= _depth(s.action.target) for o in out):
            continue
        out.append(s)
    return out


class IdleLifecycle:
    """Idle timer for one :class:`~sandbox_kernel.relay.Relay`.

    Parameters
    ----------
    relay : Relay
    policy : Policy
    log : logging.Logger
    """

    def __init__(self, relay: "Relay", policy: Policy, log: logging.Logger):
        self.relay = relay
        self.backend = relay.backend
        self.policy = policy
        self.log = log
        self.steps = plan(policy, self.backend.capabilities)
        self._task: asyncio.Task | None = None
        self._last_refresh = 0.0
        #: (time, the sandbox's CPU seconds) at the start of the current window, and the
        #: last window's verdict (:meth:`_cpu_busy`).
        self._cpu: tuple[float, float] | None = None
        self._cpu_was_busy = False

    # ---- the periodic task ------------------------------------------------------

    def start(self) -> None:
        """Start the periodic task on the running loop."""
        if self._task is None:
            self._task = asyncio.ensure_future(self._run())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

    @property
    def tick_s(self) -> float:
        shortest = min([s.after_s for s in self.steps] or [self.backend.refresh_every_s])
        return max(0.05, min(TICK_MAX_S, shortest / 8))

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.tick_s)
            try:
                await self.tick()
            except asyncio.CancelledError:
                raise
            except Exception:  # the timer must outlive any one failure
                self.log.exception("idle lifecycle tick failed")

    async def tick(self, now: float | None = None) -> None:
        """One step of the timer: refresh the backend, maybe go down one level."""
        now = time.monotonic() if now is None else now
        relay = self.relay
        held = relay.state in (SandboxState.RUNNING, SandboxState.PAUSED, SandboxState.CHECKPOINTED)
        if now - self._last_refresh >= self.backend.refresh_every_s and held:
            self._last_refresh = now
            try:
                await self.backend.refresh()
            except Exception as err:  # noqa: BLE001 - the dead-man's switch must outlive one failure
                self.log.warning("refreshing the sandbox's lifetime failed: %s", err)
        if relay.pending or relay.holds:  # a cell or a transfer runs (even with nobody listening): not idle
            relay.last_activity = now
            return
        if not held:
            return
        if self._cpu_busy(now):  # work in a thread after its cell ended
            relay.last_activity = now
            return
        idle = now - relay.last_activity
        for step in reversed(self.steps):
            if idle >= step.after_s:
                if _depth(step.action.target) > _depth(relay.state):
                    await self._go(step, idle)
                return

    def _cpu_busy(self, now: float) -> bool:
        """Whether the running sandbox used at least :data:`CPU_ACTIVE_SHARE` of a core over
        the last :data:`CPU_WINDOW_S` (its backend's :meth:`~.backends.base.SandboxBackend.usage`;
        a backend that cannot read it never counts as busy)."""
        if self.relay.state is not SandboxState.RUNNING:
            self._cpu, self._cpu_was_busy = None, False
            return False
        if self._cpu is not None and now - self._cpu[0] < CPU_WINDOW_S:
            return self._cpu_was_busy
        usage = self.backend.usage()
        start, self._cpu = self._cpu, (now, usage.cpu_s) if usage is not None else None
        self._cpu_was_busy = (usage is not None and start is not None and now > start[0]
                              and (usage.cpu_s - start[1]) / (now - start[0]) >= CPU_ACTIVE_SHARE)
        return self._cpu_was_busy

    async def _go(self, step: Step, idle: float) -> None:
        try:
            await self.relay.suspend(step.action, idle_s=idle, min_idle_s=step.after_s)
        except (SandboxKernelError, NotImplementedError, OSError) as err:
            self.log.warning("idle %s failed (%s); this level is now skipped", step.action.value, err)
            self.steps = [s for s in self.steps if s.action is not step.action]
            if step.action is IdleAction.CHECKPOINT and not any(s.action is IdleAction.STOP for s in self.steps):
                # state could not be written to disk: free the memory by a stop instead
                self.steps.append(Step(step.after_s, IdleAction.STOP))

    def describe(self) -> dict[str, Any]:
        """The idle plan and counters, for ``kernel_info``'s ``sandbox.idle`` field."""
        d: dict[str, Any] = {"plan": [[s.action.value, s.after_s] for s in self.steps],
                             "counts": dict(self.relay.counts)}
        if self.relay.stopped_after_idle_s is not None:
            d["stopped_after_idle_s"] = round(self.relay.stopped_after_idle_s, 1)
        return d
