"""What the client's ``snapshot``/``restore``/``snapshots`` verbs return and raise.

The kernel answers ``snapshot_request``, ``restore_request`` and ``snapshots_request``
on the control channel (``docs/agents.md``, ``docs/lifecycle.md``); these are their
replies as objects.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


class SnapshotError(RuntimeError):
    """The kernel refused or failed a snapshot or a restore; the running kernel is
    untouched unless :attr:`evalue` says otherwise.

    Attributes
    ----------
    ename : str
        ``SnapshotUnsupported`` (this backend or runtime cannot: bubblewrap, E2B, Modal,
        rootless runsc), ``UnknownSnapshot``, ``RestoreInProgress`` (another snapshot or
        restore runs), ``SnapshotFailed``; or the kernel's own (``KernelShuttingDown``).
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
