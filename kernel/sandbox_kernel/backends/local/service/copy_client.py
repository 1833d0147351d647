"""The proxy's side of snapshots and forks through the sandbox service (issue 30).

Called by the local backend's snapshot and fork verbs (:mod:`..snapshots`, :mod:`..forks`)
when its sandbox is the service's (:class:`.client.ServiceRuntime`): each is one request
naming ids only; the images stay in the service's state (:mod:`.copies`).  A rewind and a
fork's first start are a ``create`` naming the snapshot or the hand-off
(:func:`.client.start_from_service`'s ``copy_from``), then the local backend's own
interrupt and reseed.
"""

from __future__ import annotations

import asyncio
from typing import Any

from ....errors import AdmissionRefused, SnapshotError
from ..runtime import SandboxRecord
from .client import ServiceRefused, ServiceRuntime, call

#: What a fork's ``LocalBackend.fork_from`` starts with when its hand-off is the service's.
SERVICE_HANDOFF = "service:"


async def snapshot(runtime: ServiceRuntime, sb: SandboxRecord, snapshot_id: str, compression: str) -> int:
    """``runsc checkpoint --leave-running`` of ``sb`` by the service, kept as ``snapshot_id``;
    the bytes it takes on the service's disk.

    Raises
    ------
    SnapshotError
        ``SnapshotRefused`` (the service refused: its image bound, its disk check, its
        reason named) or ``SnapshotFailed`` (runsc failed); the sandbox goes on.
    """
    try:
        answer, _ = await asyncio.to_thread(call, runtime.path, "snapshot", container_id=sb.container_id,
                                            snapshot_id=snapshot_id, compression=compression)
    except (ServiceRefused, OSError) as err:
        raise SnapshotError(f"the sandbox service could not snapshot the sandbox: {err}",
                            _ename(err, "SnapshotRefused")) from err
    return int(answer.get("bytes", 0))


async def fork(runtime: ServiceRuntime, sb: SandboxRecord, fork_id: str, n: int, meta: dict[str, Any],
               compression: str) -> tuple[list[str], int]:
    """One image of ``sb`` handed over by the service to ``n`` forks: their ``fork_from``
    (``service:<hand-off>``) and the image's bytes.

    Raises
    ------
    SnapshotError
        ``ForkRefused`` (the service's admission, its image bound, its disk check, or
        another refusal, its reason named), or ``SnapshotFailed`` (runsc failed).
    """
    try:
        answer, _ = await asyncio.to_thread(call, runtime.path, "fork", container_id=sb.container_id,
                                            fork_id=fork_id, n=n, meta=meta, compression=compression)
    except AdmissionRefused as err:
        raise SnapshotError(str(err), "ForkRefused") from err
    except (ServiceRefused, OSError) as err:
        raise SnapshotError(f"the sandbox service could not fork the sandbox: {err}",
                            _ename(err, "ForkRefused")) from err
    handoffs = answer.get("handoffs")
    if not isinstance(handoffs, list) or len(handoffs) != n or not all(isinstance(h, str) for h in handoffs):
        raise SnapshotError(f"the sandbox service answered a fork with {handoffs!r}, not {n} hand-offs")
    return [SERVICE_HANDOFF + h for h in handoffs], int(answer.get("bytes", 0))


def _ename(err: Exception, refused: str) -> str:
    """``refused`` where the service said it refused, else ``SnapshotFailed``."""
    return refused if isinstance(err, ServiceRefused) and err.refused else "SnapshotFailed"


def remove(runtime: ServiceRuntime, kernel_id: str, snapshot_ids: list[str] | None) -> None:
    """Have the service remove these snapshots of ``kernel_id`` (None: all, and its fork
    hand-offs not taken); blocking.

    Raises
    ------
    ServiceRefused, OSError
        The service refused or is unreachable (its sweep removes them once this proxy is gone).
    """
    call(runtime.path, "remove_snapshots", 30.0, kernel_id=kernel_id, snapshot_ids=snapshot_ids)
