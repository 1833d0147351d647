"""Snapshot and rewind of a live kernel, answered by the proxy on the control channel.

Three message types of the proxy's own (the cell's namespace never sees them; on
control, so they are answered while a cell runs), handled by :class:`Snapshots`:

* ``snapshot_request`` ``{}`` -> ``snapshot_reply`` ``{"status": "ok", "snapshot":
  {"id", "created", "size_mib"}, "removed": [ids]}``: the kernel's whole state
  (interpreter memory, its files in the sandbox, its processes) kept under ``id``;
  ``created`` is ISO 8601 (UTC), ``size_mib`` what it takes on disk; ``removed``
  names the oldest snapshots dropped to stay within ``SandboxKernel.snapshots_max``.
  The kernel goes on.
* ``restore_request`` ``{"snapshot_id"}`` -> ``restore_reply`` ``{"status": "ok",
  "snapshot": {...}}``: the kernel rewound in place to that snapshot.  What was
  running is ended as an interrupt would end it (its request answered with
  ``KernelRewound``), the sandbox replaced by one restored from the snapshot and
  made its own (entropy-drawn state redrawn: ``docs/lifecycle.md``), a cell that
  ran when the snapshot was taken interrupted, and the next cell shows one notice
  line.
* ``snapshots_request`` ``{}`` -> ``snapshots_reply`` ``{"status": "ok",
  "snapshots": [{...}, ...]}``, oldest first.
* ``fork_request`` ``{"n"}`` -> ``fork_reply`` ``{"status": "ok", "fork_id", "created",
  "size_mib", "forks": [{"fork_from", "extra_arguments"}, ...]}``: the running sandbox
  snapshotted (it pauses while the image is written, then goes on) for ``n`` new kernels
  to start from; each is started by the client from this kernel's kernelspec with its
  ``extra_arguments`` (``--LocalBackend.fork_from=<hand-off>``, ``--RayBackend...``), so each has its own
  proxy, connection file and key (jupyter_client's) and sandbox, restored and made its
  own (:mod:`.backends.local.forks`, :mod:`.backends.ray.copies`).  ``n`` is 1 to ``SandboxKernel.forks_max``.

Errors: ``{"status": "error", "ename", "evalue"}``: ``SnapshotUnsupported`` (the
backend or runtime cannot: bubblewrap, Modal, rootless runsc, egress, naming it),
``UnknownSnapshot``, ``RestoreInProgress`` (another snapshot, restore or fork runs),
``ForkRefused`` (``n`` out of bounds, or past admission: memory, or the image's disk),
``SnapshotRefused`` (no disk for the image: the figures named; or past the sandbox
service's image bound), ``SnapshotFailed``.
A refused operation leaves the running kernel untouched.

The backend keeps the images (:meth:`.backends.base.SandboxBackend.snapshot`); the
relay swaps the sandbox (:meth:`.relay.Relay.rewind`); this module keeps the list,
and reaches the kernel through :class:`~sandbox_kernel.kernel_face.KernelFace`.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from .errors import SandboxKernelError, SnapshotError

if TYPE_CHECKING:
    from .kernel_face import KernelFace
    from .relay import Relay

log = logging.getLogger("sandbox_kernel")

MIB = 1 << 20
#: The control message types answered here (each by the handler of its name).
REQUESTS = ("snapshot_request", "restore_request", "snapshots_request", "fork_request")
#: Longest a rewound kernel may take to answer (the cell of the snapshot interrupted), seconds.
SETTLE_S = 20.0


@dataclass
class Snapshot:
    """One snapshot of this kernel, as the proxy keeps it.

    Attributes
    ----------
    id : str
    created : str
        When it was taken, ISO 8601 (UTC, seconds).
    size_mib : float
        Disk it takes, MiB.
    kernel_info : dict or None
        The interpreter's ``kernel_info`` then (the relay's, restored with it).
    busy : bool
        A cell ran when it was taken: a rewind to it interrupts that cell.
    """

    id: str
    created: str
    size_mib: float
    kernel_info: dict[str, Any] | None = field(default=None, repr=False)
    busy: bool = False

    def public(self) -> dict[str, Any]:
        """What replies say of it: ``id``, ``created``, ``size_mib``."""
        return {"id": self.id, "created": self.created, "size_mib": self.size_mib}


def _error(err: SandboxKernelError) -> dict[str, Any]:
    return {"status": "error", "ename": getattr(err, "ename", type(err).__name__), "evalue": str(err)}


def _cell_running(relay: Relay) -> bool:
    return any(p.msg_type == "execute_request" for p in relay.pending.values())


class Snapshots:
    """This kernel's snapshots and the handlers of ``snapshot_request``,
    ``restore_request`` and ``snapshots_request`` (see the module docstring).

    Parameters
    ----------
    kernel : KernelFace
        The proxy kernel: its relay and backend (read at each call), its replies.
    max_kept : int
        ``SandboxKernel.snapshots_max``: beyond it, the oldest is removed.
    forks_max : int
        ``SandboxKernel.forks_max``: the most forks one ``fork_request`` may ask for.
    """

    def __init__(self, kernel: KernelFace, max_kept: int, forks_max: int = 8):
        self.kernel = kernel
        self.max_kept = max(1, max_kept)
        self.forks_max = max(1, forks_max)
        self.kept: collections.OrderedDict[str, Snapshot] = collections.OrderedDict()
        #: The operation under way ("snapshot" or "restore"), on the main loop; one at a time.
        self._under_way: str | None = None

    # ---- handlers (ipykernel's control dispatch, on the control thread) ----------------

    async def snapshot_request(self, stream: Any, ident: Any, parent: dict[str, Any]) -> None:
        content = await self.kernel.on_main_loop(self.run_one("snapshot", self.take))
        self.kernel.send_reply(stream, "snapshot_reply", content, parent, ident)

    async def restore_request(self, stream: Any, ident: Any, parent: dict[str, Any]) -> None:
        sid = (parent.get("content") or {}).get("snapshot_id")
        content = await self.kernel.on_main_loop(self.run_one("restore", lambda: self.rewind(sid)))
        self.kernel.send_reply(stream, "restore_reply", content, parent, ident)

    async def snapshots_request(self, stream: Any, ident: Any, parent: dict[str, Any]) -> None:
        content = {"status": "ok", "snapshots": [s.public() for s in self.kept.values()]}
        self.kernel.send_reply(stream, "snapshots_reply", content, parent, ident)

    async def fork_request(self, stream: Any, ident: Any, parent: dict[str, Any]) -> None:
        n = (parent.get("content") or {}).get("n", 1)
        content = await self.kernel.on_main_loop(self.run_one("fork", lambda: self.fork(n)))
        self.kernel.send_reply(stream, "fork_reply", content, parent, ident)

    # ---- on the main loop -------------------------------------------------------------

    async def run_one(self, what: str, op: Callable[[], Awaitable[dict[str, Any]]]) -> dict[str, Any]:
        """Run ``op()`` if no other snapshot or restore is under way; its reply content."""
        if self._under_way is not None:
            return _error(SnapshotError(f"a {self._under_way} of this kernel is under way: {what} refused, "
                                        "try again once it ended", "RestoreInProgress"))
        self._under_way = what
        try:
            return {"status": "ok", **await op()}
        except SandboxKernelError as err:
            log.warning("%s refused or failed: %s", what, err)
            return _error(err)
        finally:
            self._under_way = None

    def _parts(self, fork: bool = False) -> tuple[Relay, Any]:
        """The relay and the backend, after the refusals that touch nothing (of a snapshot
        and a rewind, or of a ``fork``)."""
        backend, relay = self.kernel.sandbox, self.kernel.relay
        if backend is None or relay is None:
            raise SnapshotError(self.kernel.config_error or "no sandbox", "SnapshotUnsupported")
        why = backend.fork_refusal() if fork else backend.snapshot_refusal()
        if why is not None:
            raise SnapshotError(why, "SnapshotUnsupported")
        return relay, backend

    async def take(self) -> dict[str, Any]:
        """Snapshot the running kernel (woken first if idle); the new :class:`Snapshot`."""
        relay, backend = self._parts()
        sid = uuid.uuid4().hex[:12]
        busy = _cell_running(relay)
        size = await relay.snapshot(lambda: backend.snapshot(sid))
        snap = Snapshot(id=sid, created=datetime.now(UTC).isoformat(timespec="seconds"),
                        size_mib=round(size / MIB, 1), kernel_info=relay.kernel_info,
                        busy=busy or _cell_running(relay))
        self.kept[sid] = snap
        removed = []
        while len(self.kept) > self.max_kept:
            removed.append(self.kept.popitem(last=False)[0])
        if removed:
            backend.remove_snapshots(removed)
            log.info("snapshots removed to keep at most %d (snapshots_max): %s", self.max_kept, ", ".join(removed))
        log.info("snapshot %s taken (%.1f MiB)", sid, snap.size_mib)
        return {"snapshot": snap.public(), "removed": removed}

    async def rewind(self, snapshot_id: object, *, told_in_cell: bool = False) -> dict[str, Any]:
        """Rewind the kernel in place to ``snapshot_id``; refused, untouched, if unknown.
        ``told_in_cell``: the cell that asked (``%rewind``) says so itself, so the next cell
        does not show the rewind's notice again."""
        relay, backend = self._parts()
        snap = self.kept.get(snapshot_id) if isinstance(snapshot_id, str) else None
        if snap is None:
            raise SnapshotError(f"no snapshot {snapshot_id!r} of this kernel (never taken, or removed); "
                                f"known: {', '.join(self.kept) or 'none'}", "UnknownSnapshot")
        what = f"snapshot {snap.id} (taken {snap.created})"
        told = await relay.rewind(lambda: backend.restore_snapshot(snap.id, interrupt=snap.busy),
                           cause=f"the kernel was rewound to {what} while this ran",
                           notice_text=f"rewound to {what}: what ran after it is undone",
                           kernel_info=snap.kernel_info)
        if told_in_cell:
            self.kernel.forget_notice(told)
        await self.settle(relay)
        return {"snapshot": snap.public()}

    async def fork(self, n: object) -> dict[str, Any]:
        """Snapshot the running kernel (woken first if idle) for ``n`` new kernels to start
        from; refused, untouched, for a backend or runtime that cannot, a bad ``n``, or
        ``n`` sandboxes the machine cannot hold (admission)."""
        relay, backend = self._parts(fork=True)
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= self.forks_max:
            raise SnapshotError(f"n={n!r} forks refused: ask for 1 to {self.forks_max} "
                                "(SandboxKernel.forks_max)", "ForkRefused")
        backend.admit_forks(n)
        fid = uuid.uuid4().hex[:12]
        created = datetime.now(UTC).isoformat(timespec="seconds")
        meta = {"source_kernel": backend.kernel_id, "fork_id": fid, "created": created,
                "kernel_info": relay.kernel_info, "busy": _cell_running(relay)}
        handoffs, size = await relay.snapshot(lambda: backend.fork(fid, n, meta))
        log.info("fork %s: %d kernel(s) may start from an image of %.1f MiB", fid, n, size / MIB)
        return {"fork_id": fid, "created": created, "size_mib": round(size / MIB, 1),
                "forks": [{"fork_from": h, "extra_arguments": [backend.fork_argument(h)]} for h in handoffs]}

    async def settle(self, relay: Relay) -> None:
        """Wait until a rewound or forked interpreter answers on shell (a cell of the snapshot's,
        interrupted, has ended; its replies were dropped as stale): an ``is_complete_request``
        of the proxy's own, asked again while the inner kernel aborts what was queued
        behind the interrupted cell.  Not ``kernel_info_request``: ipykernel's first one in
        a restored interpreter drew one number from ``random``'s global generator, so a
        generator the user seeded did not continue as it would have in the kernel itself.
        Then a thread's output of before is published, with no parent
        (:meth:`.inflight.InFlight.settled`)."""
        try:
            for _ in range(5):
                probe = self.kernel.new_message("is_complete_request", {"code": ""})
                p = await relay.send_request("shell", probe, [], own=True)
                try:
                    reply = await asyncio.wait_for(relay.wait(p), SETTLE_S)
                except (TimeoutError, SandboxKernelError) as err:
                    relay.abandon(p, SnapshotError(f"{err}"))
                    log.warning("the rewound interpreter did not answer: %s", err)
                    return
                if reply is None or reply.content.get("status") != "aborted":
                    return
                await asyncio.sleep(0.1)
        finally:
            relay.inflight.settled()

    def remove_all(self) -> None:
        """Remove every snapshot of this kernel (its shutdown)."""
        self.kept.clear()
        backend = self.kernel.sandbox
        if backend is not None:
            backend.remove_snapshots(None)
