"""The node side of the Ray backend: a Ray actor that owns one local sandbox.

:class:`SandboxOwner` runs in a Ray worker process on whichever node Ray's
scheduler placed it (:class:`.backend.RayBackend` creates it with the policy's
memory and CPUs and the operator's custom resources as its demand).  It holds a
:class:`~sandbox_kernel.backends.local.LocalBackend`, so the sandbox is made by
the same runtime code as on a single machine (gVisor by default, bubblewrap if
the operator says so), runs the same agent zipapp, and gets the same limits and
the same dead-man's switch: the local watchdog reaps the sandbox when this
worker process ends, which Ray makes happen when the proxy (the actor's owner)
dies.

The actor carries the framed channel: :meth:`SandboxOwner.write` passes whole
frames to the agent's stdin, :meth:`SandboxOwner.read` returns the next chunk of
its stdout (at most ``max_bytes``; it waits on the pipe, never polls).  It parses
none of it: the proxy does, as for every backend.  It also pauses and resumes the
sandbox, and moves a checkpoint: :meth:`SandboxOwner.checkpoint_out` returns the
image's bytes (an object of the proxy's in Ray's object store) and removes the
sandbox, :meth:`SandboxOwner.restore_in` on a new actor, on any node, restores it.

This module imports neither ray nor anything host-only beyond the local
backend; Ray imports it on the node by reference (``ray.remote(SandboxOwner)``
in the proxy pickles the class by its module path), so the node needs
sandbox-kernel installed, as ``scripts/setup.sh`` does.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import socket
from pathlib import Path
from typing import Any

from ...policy import Policy
from .egress import NodeEgressLog

#: Options of :class:`~sandbox_kernel.backends.local.LocalBackend` an actor's sandbox
#: always gets: no warm pool, spare sandbox or start template (each a process or a cache
#: of the node's, kept for a later kernel of the same user on the same machine, which a
#: cluster's placement does not give).
FIXED_LOCAL_OPTIONS: dict[str, Any] = {"pool_socket": "", "spare_sandbox": False, "start_template": False}

#: The most bytes one :meth:`SandboxOwner.read` returns (its ``max_bytes`` is capped to it).
MAX_READ_BYTES = 1 << 20
#: The snapshot id a moved checkpoint is restored under on its new node (removed after).
RESTORE_ID = "ray-moved-checkpoint"
#: The snapshot id a snapshot or a fork's image is written under on the node (removed once read).
SNAPSHOT_ID = "ray-snapshot-out"


def read_image(image: Path) -> dict[str, bytes]:
    """The files of a runsc checkpoint image directory (flat), by name.  Blocking."""
    return {p.name: p.read_bytes() for p in sorted(image.iterdir()) if p.is_file()}


def write_image(image: Path, files: dict[str, bytes]) -> None:
    """Write :func:`read_image`'s files into the new directory ``image`` (0700, files 0600);
    a name that is not a plain file name is refused.  Blocking.

    Raises
    ------
    ValueError
        A name with a path separator, or ``.``/``..``.
    """
    image.mkdir(mode=0o700)
    for name, data in files.items():
        if "/" in name or name in (".", "..", ""):
            raise ValueError(f"bad file name in a checkpoint image: {name!r}")
        fd = os.open(image / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)


def node_policy(policy: Policy) -> Policy:
    """The policy the node's sandbox is made with: ``policy`` without host paths.

    ``ro_paths`` and ``workspace_path`` name folders of the proxy's machine, which
    mean nothing (or something else) on a cluster node.  ``ro_paths`` is dropped (the
    kernel reports it as not enforced: :attr:`.backend.RayBackend.enforced_fields`).
    ``workspace`` stays with an empty ``workspace_path``: a copied workspace
    (:attr:`~sandbox_kernel.backends.local.layout.HostLayout.workspace_copied`: the
    interpreter works in an empty ``/home/sandbox/work``, which the proxy fills from the
    folder and, with ``rw``, copies back: :mod:`sandbox_kernel.workspace_copy`), with the
    local backend's bounds on writes (``RLIMIT_FSIZE``, no set-id modes) as for a mount.

    Returns
    -------
    Policy
    """
    return dataclasses.replace(policy, ro_paths=(), workspace_path="")


class SandboxOwner:
    """One local sandbox on this Ray node, driven by a proxy elsewhere.

    Created by :meth:`.backend.RayBackend.start` as a Ray actor (async: its methods
    run on one event loop in the worker, several at a time, so a pending
    :meth:`read` never holds up a :meth:`write`).

    Parameters
    ----------
    policy : Policy
        The kernel's policy (validated by the proxy); host paths are dropped
        (:func:`node_policy`).
    kernel_id : str
        Put on the sandbox's name, as locally (``sandbox-kernel gc`` on the node
        finds an orphan by it).
    local_options : dict
        Traits of :class:`~sandbox_kernel.backends.local.LocalBackend` (``runtime``,
        ``runsc_path``, ``gvisor_platform``); :data:`FIXED_LOCAL_OPTIONS` win.
    """

    def __init__(self, policy: Policy, kernel_id: str, local_options: dict[str, Any]):
        from ..local import LocalBackend

        logging.basicConfig(level=logging.INFO)
        self._kernel_id = kernel_id
        self._backend = LocalBackend(node_policy(policy), kernel_id, log=logging.getLogger("sandbox_kernel.ray.owner"),
                                     **{**local_options, **FIXED_LOCAL_OPTIONS})
        #: The node's egress proxy records here (``network=allowlist``); :meth:`read` hands it on.
        self._egress = self._backend.egress_log = NodeEgressLog()
        self._pending = b""
        #: The pending read of the agent's stdout, kept across calls that returned egress records.
        self._reading: asyncio.Future[bytes] | None = None
        self._read_lock = asyncio.Lock()

    async def start(self) -> dict[str, Any]:
        """Make the sandbox and start the agent in it; called once, by the proxy's
        :meth:`~.backend.RayBackend.start` right after the actor was placed.

        Returns
        -------
        dict
            :meth:`where` (what the proxy's ``describe`` reports).

        Raises
        ------
        SandboxStartError
            As :meth:`LocalBackend.start` (``AdmissionRefused`` when the node's own
            admission refuses it).
        """
        await self._backend.start()
        return self.where()

    def where(self) -> dict[str, Any]:
        """Where the sandbox runs and what it is: ``node_id``, ``node_ip``, ``node_host`` (the
        node's host name: a KubeRay pod's name), ``worker_pid``, ``copy_refusal`` (why this
        node cannot snapshot, restore or fork: :meth:`LocalBackend.snapshot_refusal`, or None),
        ``runtime``, ``boundary``, ``container_id`` and, under gVisor, ``gvisor``."""
        import ray

        ctx = ray.get_runtime_context()
        local = self._backend.describe()
        keep = ("runtime", "boundary", "container_id", "gvisor")
        return {"node_id": ctx.get_node_id(), "node_ip": ray.util.get_node_ip_address(),
                "node_host": socket.gethostname(), "worker_pid": os.getpid(),
                "copy_refusal": self._copy_refusal(), **{k: local[k] for k in keep if k in local}}

    def _copy_refusal(self) -> str | None:
        """:meth:`LocalBackend.snapshot_refusal`; and a node whose sandbox the sandbox service runs
        (a worker not root): its images stay in the service's state, not movable through Ray's store."""
        if self._backend.service_runtime() is not None:
            return ("the sandbox's Ray node runs it through the sandbox service, whose images stay in "
                    "its own state: run the Ray workers as root to snapshot, rewind or fork")
        return self._backend.snapshot_refusal()

    async def read(self, max_bytes: int) -> tuple[bytes | None, dict[str, Any] | None]:
        """The next chunk of the agent's stdout, at most ``max_bytes`` (capped to
        :data:`MAX_READ_BYTES`), and the egress records since the last call
        (:meth:`.egress.NodeEgressLog.take`, None if none); waits until there is either.

        Called in a loop by the proxy's :meth:`~.backend.RayBackend.read`, one call at a
        time; calls are served in turn (a lock), so no chunk is split between two.

        Returns
        -------
        (bytes or None, dict or None)
            The chunk (``b""``: the stream ended; None: egress records only, the agent
            wrote nothing yet) and the records.
        """
        max_bytes = max(1, min(int(max_bytes), MAX_READ_BYTES))
        async with self._read_lock:
            if not self._pending:
                if self._reading is None:  # at most 1 MiB: the pipe keeps the rest
                    self._reading = asyncio.ensure_future(self._backend.read())
                if self._backend.policy.network != "none" and not self._egress.changed.is_set():
                    changed: asyncio.Future[Any] = asyncio.ensure_future(self._egress.changed.wait())
                    try:
                        await asyncio.wait([self._reading, changed], return_when=asyncio.FIRST_COMPLETED)
                    finally:
                        changed.cancel()
                else:
                    await asyncio.wait({self._reading})
                if not self._reading.done():
                    return None, self._egress.take()
                done, self._reading = self._reading, None
                self._pending = done.result()
                if not self._pending:
                    return b"", self._egress.take()
            data, self._pending = self._pending[:max_bytes], self._pending[max_bytes:]
            return data, self._egress.take()

    async def write(self, data: bytes, cell: str | None = None) -> None:
        """Send whole frames to the agent's stdin; called by the proxy's
        :meth:`~.backend.RayBackend.write`, one call at a time.  ``cell``: the ``msg_id`` of
        the cell the proxy relayed last, to which egress attempts are attributed from now.

        Raises
        ------
        SandboxDied
            The sandbox is gone.
        """
        self._egress.cell = cell
        await self._backend.write(data)

    async def exit_info(self) -> tuple[str, int | None]:
        """``(cause, returncode)`` of the sandbox's end (:meth:`LocalBackend.exit_info`)."""
        info = await self._backend.exit_info()
        return info.cause, info.returncode

    def explain_interpreter_death(self, cause: str) -> str:
        """The agent's report of an interpreter death with the limit it hit, if any
        (:meth:`LocalBackend.explain_interpreter_death`)."""
        return self._backend.explain_interpreter_death(cause)

    async def pause(self) -> None:
        """Freeze the sandbox, memory kept on this node (:meth:`LocalBackend.pause`); called
        by the proxy's :meth:`~.backend.RayBackend.pause`."""
        await self._backend.pause()

    async def resume(self) -> None:
        """Thaw the frozen sandbox (:meth:`LocalBackend.resume`); called by the proxy's
        :meth:`~.backend.RayBackend.resume` when the sandbox was paused, not checkpointed."""
        await self._backend.resume()

    async def checkpoint_out(self) -> tuple[dict[str, Any], dict[str, bytes]]:
        """Checkpoint the sandbox (:meth:`LocalBackend.checkpoint`), hand its image back and
        remove the sandbox from this node.

        Called by the proxy's :meth:`~.backend.RayBackend.checkpoint` with two return
        objects: the image becomes an object of the proxy's in Ray's object store (kept on
        this node's store until a restore, wherever it lands, pulls it), so this node
        keeps neither the sandbox nor its image on disk.

        Returns
        -------
        (dict, dict)
            :meth:`where` with ``image_bytes`` (bytes); the image's files by name (bytes each).
        """
        await self._backend.checkpoint()
        image = self._backend.checkpoint_image()
        assert image is not None
        files = await asyncio.to_thread(read_image, image)
        info = {**self.where(), "image_bytes": sum(len(b) for b in files.values())}
        await self._backend.kill()
        return info, files

    async def snapshot_out(self) -> tuple[dict[str, Any], dict[str, bytes]]:
        """Snapshot the running sandbox, which goes on (:meth:`LocalBackend.snapshot`:
        ``runsc checkpoint --leave-running``, refused as locally), and hand its image back;
        the node keeps nothing of it on disk.

        Called by the proxy's :meth:`~.copies.RayCopies.snapshot` and
        :meth:`~.copies.RayCopies.fork` with two return objects, as :meth:`checkpoint_out`.

        Returns
        -------
        (dict, dict)
            :meth:`where` with ``image_bytes`` (bytes); the image's files by name.

        Raises
        ------
        SnapshotError
            This node cannot (not gVisor, rootless runsc, egress), or runsc failed.
        """
        from ..local import snapshots

        self._backend.remove_snapshots([SNAPSHOT_ID])
        try:
            await self._backend.snapshot(SNAPSHOT_ID)
            image = snapshots.kernel_dir(self._kernel_id) / SNAPSHOT_ID / "image"
            files = await asyncio.to_thread(read_image, image)
        finally:
            self._backend.remove_snapshots([SNAPSHOT_ID])
        return {**self.where(), "image_bytes": sum(len(b) for b in files.values())}, files

    async def restore_in(self, image: dict[str, bytes], interrupt: bool = False) -> dict[str, Any]:
        """Restore an image taken by :meth:`checkpoint_out` or :meth:`snapshot_out` (on this
        node or another) into a new sandbox here, as a snapshot is restored locally
        (:meth:`LocalBackend.restore_snapshot`: a cell that ran then interrupted when
        ``interrupt``, then the interpreter's generators redrawn, user seeds kept: the
        clone-correct rules in one place); called on a freshly placed actor, instead of
        :meth:`start`, by the proxy's :meth:`~.backend.RayBackend.resume` (an idle
        checkpoint), a rewind and a fork's first start (:mod:`.copies`).

        Returns
        -------
        dict
            :meth:`where`.

        Raises
        ------
        SnapshotError
            This node cannot restore (not gVisor, rootless runsc); AdmissionRefused: no memory.
        """
        from ..local import snapshots

        self._backend.remove_snapshots([RESTORE_ID])
        d = await asyncio.to_thread(snapshots.new_dir, self._kernel_id, RESTORE_ID)
        try:
            await asyncio.to_thread(write_image, d / "image", image)
            await self._backend.restore_snapshot(RESTORE_ID, interrupt=interrupt)
        finally:
            self._backend.remove_snapshots([RESTORE_ID])  # the sandbox holds its own links
        return self.where()

    async def kill(self) -> None:
        """Destroy the sandbox (:meth:`LocalBackend.kill`); called by the proxy before it
        kills this actor.  Idempotent."""
        await self._backend.kill()
