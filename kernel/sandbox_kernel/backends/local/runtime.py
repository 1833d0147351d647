"""What a local runtime does, whichever it is: the strategy behind a :class:`LocalSandbox`.

Each runtime (:class:`.gvisor.Gvisor`, :class:`.bwrap.Bubblewrap`) says how
to launch a sandbox, freeze and thaw it, write it to disk and bring it back,
and end it; :class:`.sandbox.LocalSandbox` keeps the record and the order of
things (state directory, cgroup, watchdog, flags), so no code outside the two
runtime modules asks which runtime it has.  What a runtime cannot do is
declared in :attr:`Runtime.capabilities`, not discovered by calling it.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from ...errors import SandboxStartError
from ..base import Capabilities
from .admission import CHECKPOINTED_MARK

if TYPE_CHECKING:
    from ...policy import Policy
    from .admission import Admission
    from .cgroups import SandboxCgroup
    from .layout import HostLayout

#: The runtime process's stdin, stdout and stderr: pipes to this process.  The warm
#: pool passes its own pipe ends instead (fds, which it hands on to a proxy later).
PIPES: Mapping[str, int] = {"stdin": asyncio.subprocess.PIPE, "stdout": asyncio.subprocess.PIPE,
                            "stderr": asyncio.subprocess.PIPE}


class SandboxRecord(Protocol):
    """What a runtime reads and writes of the sandbox it drives: the record kept by
    :class:`.sandbox.LocalSandbox` (this module never imports that one, which imports
    the runtimes)."""

    #: ``sandbox-kernel-<kernel id[:12]>-<6 hex>``: the runtime's container name.
    container_id: str
    #: The sandbox's state directory (bundle, runsc's state, checkpoint image).
    state_dir: Path
    #: Its cgroup, None where cgroups are unusable.
    cgroup: SandboxCgroup | None
    #: The runtime process (``asyncio.subprocess.Process`` or an adopted one), or None.
    proc: Any
    #: Processes a bubblewrap pause stopped with ``SIGSTOP`` (no cgroup freezer), to continue.
    stopped_pids: list[int]
    #: The watchdog's pipe, which the sandbox service's runtime closes at a kill.
    watchdog_fd: int | None
    #: Its memory limit, MiB (admission).
    memory_mib: int
    #: The sandbox service's: the workspace folder as its owner's fds (:class:`.idmap.Folder`), or None.
    folder: Any

    def helper_pids(self) -> dict[int, str]:
        """Pid -> name of the runtime's helper processes running now."""


class Runtime(abc.ABC):
    """How one local runtime launches, freezes, checkpoints and ends a sandbox.

    Every verb is called by :class:`.sandbox.LocalSandbox`, which owns the
    sandbox's record and flags; a runtime keeps no state of its own.
    """

    #: ``LocalBackend.runtime`` value, ``tag.json``'s ``runtime`` and the watchdog's ``--runtime``.
    name: ClassVar[str]
    #: What sandboxes of this runtime can do (``LocalBackend.capabilities``).
    capabilities: Capabilities
    #: An OOM kill in the sandbox's cgroup leaves it unusable, so the backend ends it
    #: (gVisor); else only the killed process is gone and the agent reports it (bubblewrap).
    oom_ends_sandbox: ClassVar[bool] = False
    #: Host processes of a sandbox besides the runtime process whose death leaves it
    #: broken, by executable name -> what to call it (gVisor: the gofer serves the
    #: files, the sentry is the kernel); the backend ends the sandbox naming the one
    #: that died.  A death of the runtime process itself ends the stream.
    helpers: ClassVar[dict[str, str]] = {}

    @property
    def key(self) -> str:
        """What a warm pool's sandboxes must match besides the policy (:func:`.pool.wire.policy_key`)."""
        return self.name

    @property
    def measures_guest_memory(self) -> bool:
        """:meth:`guest_memory` is measured (a runtime whose sandboxes have no cgroup)."""
        return False

    def guest_memory(self, sb: SandboxRecord) -> int | None:
        """Bytes of memory the sandbox's guest holds, for a sandbox no cgroup limits
        (``LocalBackend`` then watches it against the memory limit); None: not measured
        by this runtime (the default), or not now."""
        return None

    async def resolve(self) -> object:
        """Settle what the runtime runs with (gVisor: the runsc binary and platform); idempotent."""
        return None

    @abc.abstractmethod
    async def launch(self, sb: SandboxRecord, policy: Policy, layout: HostLayout,
                     stdio: Mapping[str, int], *, die_with_parent: bool) -> asyncio.subprocess.Process:
        """Start the runtime process running the agent; called by :meth:`LocalSandbox.create`
        once the state directory, ``/etc`` and cgroup exist.

        Parameters
        ----------
        stdio : mapping
            ``stdin``/``stdout``/``stderr`` for ``create_subprocess_exec``
            (:data:`PIPES`, or the warm pool's fds).
        die_with_parent : bool
            End the sandbox when this process dies (bubblewrap's
            ``--die-with-parent``); the warm pool turns it off, since its
            sandboxes outlive it once handed on (their watchdog reaps them).
        """

    async def launch_from_image(self, sb: SandboxRecord, policy: Policy, layout: HostLayout,
                                stdio: Mapping[str, int], image: Path) -> asyncio.subprocess.Process:
        """As :meth:`launch`, restoring the checkpoint ``image`` of another sandbox made
        with the same policy (a start template, :mod:`.template`) instead of starting
        the agent: only runtimes with :attr:`Capabilities.checkpoint`.

        Raises
        ------
        SandboxStartError
            This runtime cannot restore a checkpoint.
        """
        raise SandboxStartError(f"the {self.name} runtime cannot restore a checkpoint")

    @abc.abstractmethod
    async def pause(self, sb: SandboxRecord) -> None:
        """Freeze every process of the sandbox, memory kept; called by :meth:`LocalSandbox.freeze`."""

    @abc.abstractmethod
    async def resume(self, sb: SandboxRecord) -> None:
        """Undo :meth:`pause`; called by :meth:`LocalSandbox.thaw`."""

    async def checkpoint(self, sb: SandboxRecord, compression: str = "flate-best-speed") -> None:
        """Write the running sandbox's memory to ``<state dir>/checkpoint`` (``compression``:
        ``none`` or ``flate-best-speed``) and end its processes; called by
        :meth:`LocalSandbox.checkpoint` when :attr:`Capabilities.checkpoint`."""
        raise NotImplementedError(f"the {self.name} runtime cannot checkpoint")

    async def restore(self, sb: SandboxRecord, stdio: Mapping[str, int] = PIPES) -> asyncio.subprocess.Process:
        """Start a runtime process from the checkpoint (``stdio`` as for :meth:`launch`:
        pipes to this process, or the sandbox service's fds); called by
        :meth:`LocalSandbox.restore`."""
        raise NotImplementedError(f"the {self.name} runtime cannot restore")

    async def kill(self, sb: SandboxRecord) -> None:
        """End the runtime process and everything it runs, and wait for it (up to 10 s);
        called by :meth:`LocalSandbox.destroy`, the owner's teardown, with the sandbox thawed."""
        proc = sb.proc
        if proc is None or proc.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(proc.wait(), 10)

    def reserve_restore(self, sb: SandboxRecord, admission: Admission | None) -> None:
        """Before :meth:`restore`: take the sandbox's memory back for admission (its
        ``checkpointed`` mark removed), under the machine's admission lock.  Blocking;
        called by :meth:`LocalSandbox.reserve_restore`.

        Raises
        ------
        AdmissionRefused
            The machine cannot hold it now; it stays checkpointed.
        """
        mark = sb.state_dir / CHECKPOINTED_MARK
        if admission is None:
            mark.unlink(missing_ok=True)
            return
        admission.reserve(sb.state_dir.parent, sb.memory_mib, lambda: mark.unlink(missing_ok=True))

    def reap(self, sb: SandboxRecord) -> None:  # noqa: B027 - optional hook, nothing by default
        """Blocking, by name only (no process handle): end what the runtime itself keeps
        of the sandbox; called by :meth:`LocalSandbox.reap` (watchdog, ``gc``) before
        every process naming the state directory is killed.  Nothing by default."""
