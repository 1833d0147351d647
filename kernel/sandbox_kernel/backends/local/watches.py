"""The watches that end a local sandbox when a limit or its runtime says it is over.

Shared by the local backend (each kernel's own sandbox: :meth:`.backend.LocalBackend._own`)
and the sandbox service (the sandboxes it made for ordinary users, whose owners cannot
write their cgroups: :mod:`.service.server`).  Each watch is told whether the sandbox is
still its owner's current one (``current``): a sandbox replaced, removed or handed on
meanwhile is left alone.  What ended it is recorded on the sandbox
(:attr:`.sandbox.LocalSandbox.helper_died`, ``memory_breach``; the cgroup's OOM count),
so the owner's ``exit_info`` names the limit or the process.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING

from . import procs

if TYPE_CHECKING:
    from .runtime import Runtime
    from .sandbox import LocalSandbox

#: Seconds between two looks at the memory of a sandbox no cgroup limits (rootless gVisor).
MEMORY_WATCH_S = 0.25
#: Seconds between two looks for a runtime's helper processes while they start.
HELPERS_LOOK_S = 0.2
#: Seconds a helper's kind is looked for again after one of it ended, before the sandbox
#: is taken for broken (a look at ``/proc`` can miss a process in the middle of its exec).
HELPER_GONE_S = 0.5


async def end_on_oom(sb: LocalSandbox, current: Callable[[], bool], log: logging.Logger, since: int = 0) -> None:
    """End the sandbox at its cgroup's first OOM kill after ``since`` kills
    (:attr:`.runtime.Runtime.oom_ends_sandbox`): every process of the cgroup is killed, so
    the runtime process exits and its owner reads the end of the stream.

    Parameters
    ----------
    sb : LocalSandbox
        With a cgroup.
    current : callable
        Whether ``sb`` is still its owner's (checked once the kill is seen).
    log : logging.Logger
    since : int
        OOM kills already counted (a restored sandbox keeps its cgroup).
    """
    assert sb.cgroup is not None
    await sb.cgroup.wait_for_oom(since=since)
    if current():
        log.warning("sandbox %s: %s; ending it", sb.container_id, sb.cgroup.oom_cause())
        await asyncio.to_thread(sb.cgroup.kill_all)


async def end_on_memory(sb: LocalSandbox, runtime: Runtime, memory_mib: int, current: Callable[[], bool],
                        log: logging.Logger, every_s: float = MEMORY_WATCH_S) -> None:
    """End a sandbox no cgroup limits (rootless gVisor) once its guest holds more than
    ``memory_mib`` MiB (:meth:`.runtime.Runtime.guest_memory`, polled every ``every_s``
    seconds), recording why in ``sb.memory_breach``."""
    limit = memory_mib << 20
    while current() and sb.proc.returncode is None:
        used = await asyncio.to_thread(runtime.guest_memory, sb)  # None: not up yet, or gone
        if used is not None and used > limit and current() and not sb.checkpointed:
            sb.memory_breach = (f"memory limit {memory_mib} MiB exceeded ({used >> 20} MiB "
                                "held; rootless gVisor, no cgroup: the sandbox's memory is watched)")
            log.warning("sandbox %s: %s; ending it", sb.container_id, sb.memory_breach)
            await asyncio.to_thread(procs.kill_mentioning, str(sb.state_dir))
            with contextlib.suppress(ProcessLookupError):
                sb.proc.kill()
            return
        await asyncio.sleep(every_s)


async def end_on_helper_death(sb: LocalSandbox, runtime: Runtime, current: Callable[[], bool],
                              log: logging.Logger, find_for_s: float = 60.0) -> None:
    """End the sandbox when one of the runtime's helper processes dies
    (:attr:`.runtime.Runtime.helpers`: gVisor's gofer and sentry), naming it in
    ``sb.helper_died``.

    The helpers are found once they run (the runtime starts them), then watched
    through pidfds: no polling.  A helper that ends while another of its kind runs
    for the sandbox, or appears within :data:`HELPER_GONE_S`, made way for it (the
    runtime re-executes itself while it boots): the watch goes on with the new one.
    A checkpoint ends them on purpose, and so does the owner's own kill (the sandbox
    is no longer current).
    """
    while True:
        helpers = await _find_helpers(sb, runtime, current, find_for_s)
        if not helpers:
            return
        pid, what = await _first_exit(helpers)
        if _not_a_death(sb, current):
            return
        if await _still_one(sb, what):
            continue  # it made way for another of its kind: watch again
        if _not_a_death(sb, current):  # meanwhile
            return
        break
    sb.helper_died = f"gVisor's {what} (pid {pid}) ended"
    log.warning("sandbox %s: %s; ending it", sb.container_id, sb.helper_died)
    if sb.cgroup is not None:
        await asyncio.to_thread(sb.cgroup.kill_all)
    with contextlib.suppress(ProcessLookupError):
        sb.proc.kill()


def _not_a_death(sb: LocalSandbox, current: Callable[[], bool]) -> bool:
    """True where a helper's end is not the sandbox's breakage: it is no longer the owner's
    sandbox, it was checkpointed, its runtime exited, or the memory limit ended it
    (``end_on_oom`` says that cause)."""
    if not current() or sb.checkpointed or sb.proc.returncode is not None:
        return True
    return sb.cgroup is not None and sb.cgroup.oom_detected(since=sb.oom_kills_seen)


async def _still_one(sb: LocalSandbox, what: str) -> bool:
    """True if a helper of kind ``what`` runs for ``sb``, looked for over :data:`HELPER_GONE_S`."""
    for _ in range(int(HELPER_GONE_S / 0.1)):
        if what in (await asyncio.to_thread(sb.helper_pids)).values():
            return True
        await asyncio.sleep(0.1)
    return False


async def _find_helpers(sb: LocalSandbox, runtime: Runtime, current: Callable[[], bool],
                        within_s: float) -> dict[int, str]:
    """The sandbox's helper processes, once one of each kind runs (or after ``within_s``)."""
    helpers: dict[int, str] = {}
    for _ in range(max(1, int(within_s / HELPERS_LOOK_S))):
        helpers = await asyncio.to_thread(sb.helper_pids)
        if len(set(helpers.values())) >= len(runtime.helpers) or not current():
            break
        await asyncio.sleep(HELPERS_LOOK_S)
    return helpers


def _settle(fut: asyncio.Future, value: object) -> None:
    if not fut.done():
        fut.set_result(value)


async def _first_exit(helpers: dict[int, str]) -> tuple[int, str]:
    """Wait for the first of ``helpers`` (pid -> name) to exit, through pidfds."""
    loop = asyncio.get_running_loop()
    died: asyncio.Future[tuple[int, str]] = loop.create_future()
    fds: list[int] = []
    try:
        for pid, what in helpers.items():
            try:
                fd = os.pidfd_open(pid)
            except OSError:  # gone already
                _settle(died, (pid, what))
                continue
            fds.append(fd)
            loop.add_reader(fd, _settle, died, (pid, what))
        return await died
    finally:
        for fd in fds:
            loop.remove_reader(fd)
            os.close(fd)
