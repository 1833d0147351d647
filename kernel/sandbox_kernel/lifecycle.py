"""The idle lifecycle: running -> paused -> checkpointed -> stopped, resume on demand.

One :class:`IdleLifecycle` per proxy kernel runs a periodic task on the
proxy's main asyncio loop (started from ``SandboxKernel.start``).  Each tick it

* calls :meth:`SandboxBackend.refresh` every :data:`REFRESH_EVERY_S` (the cloud
  dead-man's switch: E2B ``set_timeout``, Modal keep-alive);
* measures idleness as the time since the last relayed request finished (a
  running cell is never idle) and moves the sandbox one level down when the
  policy says so.

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

Any relayed request wakes the sandbox first: :meth:`Relay.ensure_running`
calls :meth:`IdleLifecycle.wake`.  Heartbeats and ``kernel_info`` are answered
by the proxy itself and never wake it.  Transitions take the relay's start
lock, so a request arriving mid-pause waits for the pause and then resumes.
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

if TYPE_CHECKING:
    from .relay import Relay

#: Seconds between calls to the backend's ``refresh`` (server-side lifetime).
REFRESH_EVERY_S = 30.0
#: Longest tick of the idle timer, seconds.
TICK_MAX_S = 1.0

#: Depth of each level; the lifecycle only goes down while idle.
_DEPTH = {"running": 0, "paused": 1, "checkpointed": 2, "stopped": 3}


@dataclass(frozen=True)
class Step:
    """One level of the idle plan: ``action`` after ``after_s`` idle seconds."""

    after_s: float
    action: str  # "pause" | "checkpoint" | "stop"


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
            steps.append(Step(policy.pause_after_s, "pause"))
        elif caps.checkpoint:
            steps.append(Step(policy.pause_after_s, "checkpoint"))
    if policy.checkpoint_after_s > 0:
        steps.append(Step(policy.checkpoint_after_s, "checkpoint" if caps.checkpoint else "stop"))
    if policy.stop_after_s > 0:
        steps.append(Step(policy.stop_after_s, "stop"))
    out: list[Step] = []
    for s in sorted(steps, key=lambda s: s.after_s):
        if out and out[-1].action == "stop":
            break
        if any(_DEPTH[_LEVEL_OF[o.action]] >= _DEPTH[_LEVEL_OF[s.action]] for o in out):
            continue
        out.append(s)
    return out


_LEVEL_OF = {"pause": "paused", "checkpoint": "checkpointed", "stop": "stopped"}


def human_duration(seconds: float) -> str:
    """``4 s``, ``10 min``, ``1 h``, ``1 h 30 min``."""
    s = int(round(seconds))
    if s < 120:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min"
    h, m = divmod(s // 60, 60)
    return f"{h} h" + (f" {m} min" if m else "")


class IdleLifecycle:
    """Idle timer and level transitions for one :class:`Relay`.

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
        self.level = "running"
        #: Idle seconds after which the sandbox was stopped (until the next request).
        self.stopped_after_s: float | None = None
        self.counts: dict[str, int] = {}
        self._task: asyncio.Task | None = None
        self._last_refresh = 0.0
        self._busy_seen = False

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
        shortest = min([s.after_s for s in self.steps] or [REFRESH_EVERY_S])
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
        if now - self._last_refresh >= REFRESH_EVERY_S and relay.state in ("running", "paused", "checkpointed"):
            self._last_refresh = now
            try:
                await self.backend.refresh()
            except Exception as err:
                self.log.warning("refreshing the sandbox's lifetime failed: %s", err)
        if relay.pending:  # a cell is running (even with nobody listening): not idle
            relay.last_activity = now
            return
        if relay.state not in ("running", "paused", "checkpointed"):
            return
        idle = now - relay.last_activity
        for step in reversed(self.steps):
            if idle >= step.after_s:
                if _DEPTH[_LEVEL_OF[step.action]] > _DEPTH[relay.state]:
                    await self._go(step, idle)
                return

    # ---- transitions --------------------------------------------------------------

    async def _go(self, step: Step, idle: float) -> None:
        relay = self.relay
        async with relay._start_lock:
            if relay.pending or relay.state not in ("running", "paused", "checkpointed"):
                return
            if time.monotonic() - relay.last_activity < step.after_s:
                return  # a request came in meanwhile
            action = step.action
            before = relay.state
            relay.state = {"pause": "pausing", "checkpoint": "checkpointing", "stop": "stopping"}[action]
            t0 = time.monotonic()
            try:
                if action == "pause":
                    await self.backend.pause()
                elif action == "checkpoint":
                    await self.backend.checkpoint()
                else:
                    await relay._kill_backend()
            except (SandboxKernelError, NotImplementedError, OSError) as err:
                relay.state = before
                self.log.warning("idle %s failed (%s); this level is now skipped", action, err)
                if action != "stop" and relay.reader_ended():
                    await self._reattach_after_failed(action)
                self.steps = [s for s in self.steps if s.action != action]
                if action == "checkpoint" and not any(s.action == "stop" for s in self.steps):
                    # state could not be written to disk: free the memory by a stop instead
                    self.steps.append(Step(step.after_s, "stop"))
                return
            dt = time.monotonic() - t0
            self.level = _LEVEL_OF[action]
            relay.state = "stopped" if action == "stop" else self.level
            relay.timings[f"{action}_s"] = dt
            self.counts[action] = self.counts.get(action, 0) + 1
            if action == "stop":
                self.stopped_after_s = idle
            relay.host.on_lifecycle(self.level, f"after {human_duration(idle)} idle, in {dt:.2f} s")

    async def _reattach_after_failed(self, action: str) -> None:
        """The backend detached its stream and then failed to pause (E2B): the sandbox
        still runs, so reattach; if that fails too, end it (the next request starts a
        fresh one and says why)."""
        relay = self.relay
        try:
            await self.backend.resume()
            await relay.reattach()
        except Exception as err:
            self.log.error("could not reattach after the failed %s: %s", action, err)
            await relay._kill_backend()
            relay.state = "dead"
            relay.died_cause = f"the sandbox was lost when an idle {action} failed ({err})"

    async def wake(self) -> str | None:
        """Bring a paused, checkpointed or idle-stopped sandbox back (before a request).

        Returns
        -------
        str or None
            A notice that state was lost (idle stop, failed restore), else None.
        """
        relay = self.relay
        if relay.state not in ("pausing", "paused", "checkpointing", "checkpointed", "stopping") and not (
                relay.state == "stopped" and self.stopped_after_s is not None):
            return None
        async with relay._start_lock:
            relay.last_activity = time.monotonic()
            if relay.state in ("paused", "checkpointed"):
                kind = "restore" if relay.state == "checkpointed" else "resume"
                t0 = time.monotonic()
                try:
                    await self.backend.resume()
                    relay.state = "running"
                    # restart the reader if the pause ended the stream (E2B), then replay
                    # the frames written while detached (still buffered in the agent)
                    await relay.reattach()
                except Exception as err:
                    self.log.error("%s of the sandbox failed: %s", kind, err)
                    await relay._kill_backend()
                    relay.state = "dead"
                    self.level = "running"
                    await relay._start_locked()
                    return (f"sandbox-kernel: the paused sandbox could not be brought back ({err}); "
                            "state was lost; this is a fresh interpreter")
                dt = time.monotonic() - t0
                self.level = "running"
                relay.timings[f"{kind}_s"] = dt
                self.counts[kind] = self.counts.get(kind, 0) + 1
                what = "restored from a checkpoint" if kind == "restore" else "resumed from pause"
                relay.host.on_lifecycle("restored" if kind == "restore" else "resumed",
                                        f"sandbox-kernel: {what} in {dt:.2f} s")
                return None
            if relay.state == "stopped" and self.stopped_after_s is not None:
                idle, self.stopped_after_s = self.stopped_after_s, None
                self.level = "running"
                await relay._start_locked()
                return (f"sandbox stopped after {human_duration(idle)} idle; state was lost; "
                        "this is a fresh interpreter")
        return None

    def describe(self) -> dict[str, Any]:
        """The idle plan and counters, for ``kernel_info``'s ``sandbox`` field."""
        d: dict[str, Any] = {"plan": [[s.action, s.after_s] for s in self.steps], "counts": dict(self.counts)}
        if self.stopped_after_s is not None:
            d["stopped_after_idle_s"] = round(self.stopped_after_s, 1)
        return d
