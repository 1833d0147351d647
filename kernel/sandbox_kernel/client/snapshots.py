"""The client's ``snapshot``/``restore``/``snapshots``/``fork`` verbs, what they return and raise.

The kernel answers ``snapshot_request``, ``restore_request``, ``snapshots_request`` and
``fork_request`` on the control channel (``docs/agents.md``, ``docs/lifecycle.md``);
:class:`SnapshotVerbs` sends them (mixed into :class:`~.sandbox.AsyncSandbox`) and turns
the replies into objects.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .transport import KernelTransport

if TYPE_CHECKING:
    from typing import Self

    from .info import InputCallback, SandboxInfo
    from .transport import Transport


class SnapshotError(RuntimeError):
    """The kernel refused or failed a snapshot or a restore; the running kernel is
    untouched unless :attr:`evalue` says otherwise.

    Attributes
    ----------
    ename : str
        ``SnapshotUnsupported`` (this backend or runtime cannot: bubblewrap, Modal,
        rootless runsc), ``UnknownSnapshot``, ``RestoreInProgress`` (another snapshot,
        restore or fork runs), ``ForkRefused`` (``n`` out of bounds, or past admission),
        ``ForkUnsupported`` (this client did not start the kernel from a kernelspec),
        ``ForkFailed`` (a fork did not start from its source's state), ``SnapshotRefused`` (no disk
        for the image, or past the sandbox service's image bound), ``SnapshotFailed``;
        or the kernel's own (``KernelShuttingDown``).
    evalue : str
        The cause in plain words.
    """

    def __init__(self, ename: str, evalue: str):
        super().__init__(f"{ename}: {evalue}")
        self.ename, self.evalue = ename, evalue


@dataclass(frozen=True)
class Snapshot:
    """One snapshot of a kernel's whole state (interpreter memory, its files in the
    sandbox, its processes), kept by the kernel until it shuts down.

    Attributes
    ----------
    id : str
        What :meth:`AsyncSandbox.restore` takes (or the object itself).
    created : str
        When it was taken, ISO 8601, UTC (seconds).
    size_mib : float
        Disk it takes on the kernel's machine, MiB.
    removed : list of str
        Ids of the oldest snapshots the kernel removed to keep at most
        ``SandboxKernel.snapshots_max`` (when this one was taken).
    """

    id: str
    created: str
    size_mib: float
    removed: list[str] = field(default_factory=list, compare=False)

    @classmethod
    def from_content(cls, snap: dict[str, Any], removed: list[str] | None = None) -> Snapshot:
        return cls(id=str(snap["id"]), created=str(snap.get("created", "")),
                   size_mib=float(snap.get("size_mib", 0.0)), removed=list(removed or []))


def checked(content: dict[str, Any]) -> dict[str, Any]:
    """A reply's content if its ``status`` is ``ok``.

    Raises
    ------
    SnapshotError
        With the reply's ``ename`` and ``evalue``.
    """
    if content.get("status") != "ok":
        raise SnapshotError(str(content.get("ename", "SnapshotFailed")), str(content.get("evalue", "")))
    return content


class SnapshotVerbs:
    """:class:`~.sandbox.AsyncSandbox`'s verbs on the kernel's whole state (mixed in)."""

    if TYPE_CHECKING:  # what AsyncSandbox gives the verbs
        transport: Transport
        on_input: InputCallback | None
        start_timeout_s: float
        interrupt_grace_s: float

        def __init__(self, kernel_name: str | None = None, *, transport: Transport | None = None,
                     on_input: InputCallback | None = None, start_timeout_s: float = ...,
                     interrupt_grace_s: float = ...) -> None: ...
        async def _request(self, channel: str, msg_type: str, content: dict[str, Any],
                           timeout_s: float) -> dict: ...
        async def start(self) -> Self: ...
        async def close(self) -> None: ...
        async def info(self, timeout_s: float = 60.0) -> SandboxInfo: ...

    async def snapshot(self, timeout_s: float = 120.0) -> Snapshot:
        """Keep the kernel's whole state under a new id (a ``snapshot_request`` on control,
        answered while a cell runs); the kernel goes on.  gVisor kernels, local or on Ray.

        Returns
        -------
        Snapshot
            ``id``, ``created`` (ISO 8601), ``size_mib`` (disk), ``removed`` (older ids dropped).

        Raises
        ------
        SnapshotError
            ``SnapshotUnsupported`` (bubblewrap, Modal, rootless runsc: named), ``RestoreInProgress``...
        """
        c = checked(await self._request("control", "snapshot_request", {}, timeout_s))
        return Snapshot.from_content(c["snapshot"], c.get("removed"))

    async def restore(self, snapshot: Snapshot | str, timeout_s: float = 120.0) -> Snapshot:
        """Rewind the kernel in place to ``snapshot`` (a :class:`Snapshot` or its id): its
        variables, files and processes as they were; running cells end with ``KernelRewound``.

        Raises
        ------
        SnapshotError
            ``UnknownSnapshot`` (never taken or removed), ``SnapshotUnsupported``,
            ``RestoreInProgress``: the kernel is untouched.
        """
        sid = snapshot.id if isinstance(snapshot, Snapshot) else str(snapshot)
        c = checked(await self._request("control", "restore_request", {"snapshot_id": sid}, timeout_s))
        return Snapshot.from_content(c["snapshot"])

    async def snapshots(self, timeout_s: float = 60.0) -> list[Snapshot]:
        """The kernel's snapshots, oldest first."""
        c = checked(await self._request("control", "snapshots_request", {}, timeout_s))
        return [Snapshot.from_content(s) for s in c["snapshots"]]

    async def fork(self, n: int = 1, timeout_s: float = 120.0) -> list[Self]:
        """``n`` new kernels starting from this one's current state (namespace, modules,
        files in the sandbox), each with its own proxy, connection file and key, and
        sandbox; this kernel goes on (paused while its image is written).  Each copy draws
        its own entropy (``random``, numpy's default generators, ``uuid4``, ``secrets``); a
        generator the user seeded continues identically in each.  gVisor kernels (local or Ray)
        started by this client from a kernelspec.

        Parameters
        ----------
        n : int
            How many forks, 1 to the kernel's ``SandboxKernel.forks_max`` (default 8).
        timeout_s : float
            Seconds for the kernel to write the image (each fork then has ``start_timeout_s``).

        Returns
        -------
        list of AsyncSandbox
            Started; each is shut down (with its sandbox) by its own :meth:`close`.

        Raises
        ------
        SnapshotError
            ``SnapshotUnsupported`` (bubblewrap, rootless runsc, Modal: named),
            ``ForkRefused`` (``n``, admission), ``ForkUnsupported``, ``ForkFailed`` (the forks
            started are closed again); this kernel is untouched.
        """
        forks = [self.forked(args) for args in await self.fork_arguments(n, timeout_s)]
        results = await asyncio.gather(*(f.start_as_fork() for f in forks), return_exceptions=True)
        failed = [r for r in results if isinstance(r, BaseException)]
        if failed:
            await asyncio.gather(*(f.close() for f in forks), return_exceptions=True)
            raise failed[0] if isinstance(failed[0], SnapshotError) else SnapshotError(
                "ForkFailed", f"a fork did not start: {failed[0]!r}") from failed[0]
        return forks

    async def fork_arguments(self, n: int, timeout_s: float) -> list[list[str]]:
        """Ask the kernel for ``n`` forks (``fork_request``); each fork's extra kernel
        arguments (its hand-off, ``--LocalBackend.fork_from=...``).  :meth:`fork`'s first half."""
        t = self.transport
        if not isinstance(t, KernelTransport) or t.kernel_name is None:
            raise SnapshotError("ForkUnsupported", f"this client reached the kernel by {t.where or 'a server'}: "
                                "a fork is started from the kernel's kernelspec by the client that "
                                "started the kernel (Sandbox(kernel_name))")
        c = checked(await self._request("control", "fork_request", {"n": n}, timeout_s))
        return [[str(a) for a in f["extra_arguments"]] for f in c["forks"]]

    def forked(self, extra_arguments: list[str]) -> Self:
        """A client (not started) for one fork: this kernel's kernelspec with ``extra_arguments``."""
        t = self.transport
        assert isinstance(t, KernelTransport) and t.kernel_name is not None
        transport = KernelTransport(kernel_name=t.kernel_name, cwd=t.cwd, extra_arguments=extra_arguments)
        return type(self)(transport=transport, on_input=self.on_input, start_timeout_s=self.start_timeout_s,
                          interrupt_grace_s=self.interrupt_grace_s)

    async def start_as_fork(self) -> Self:
        """:meth:`start` a client made by :meth:`forked`, and check that its kernel started
        from its source's state (``kernel_info``'s ``sandbox.fork_of``).

        Raises
        ------
        SnapshotError
            ``ForkFailed``, with the kernel's own words (its ``sandbox.error``).
        """
        await self.start()
        raw = (await self.info()).raw
        if not raw.get("fork_of"):
            raise SnapshotError("ForkFailed", str(raw.get("error") or "the fork started without its source's state"))
        return self
