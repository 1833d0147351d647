"""Snapshot, rewind and fork of a kernel on the Ray backend: the local machinery, images moved.

The node's actor takes the image as a local gVisor kernel does
(:meth:`.owner.SandboxOwner.snapshot_out`: ``runsc checkpoint --leave-running``, the
sandbox goes on) and hands its files back through Ray's object store; the proxy keeps
them on its own machine's disk, where the local backend keeps its snapshots and fork
hand-offs (:mod:`..local.snapshots`, :mod:`..local.forks`: the same folders, owner file,
``SandboxKernel.snapshots_max`` bound and ``sandbox-kernel gc``).  Every restore of an
image, whatever its reason, is one call: :meth:`.owner.SandboxOwner.restore_in` on a new
actor wherever Ray places it, which restores it with the local backend's own
:meth:`~..local.snapshots.LocalSnapshots.restore_snapshot` (the cell of then interrupted,
the interpreter's generators redrawn, user seeds kept: the clone-correct rules in one
place, on the node):

* a snapshot (:meth:`RayCopies.snapshot`): the image under
  ``<snapshots>/<kernel id>/<snapshot id>/image/`` on the proxy's machine;
* a rewind (:meth:`RayCopies.restore_snapshot`): the actor ended (by the relay's kill),
  the kept image restored in a new one, on any node with room;
* a fork (:meth:`RayCopies.fork`): one image written as hand-offs
  (:func:`..local.forks.make_handoffs`), one per fork; each fork's proxy is started by the
  client with ``--RayBackend.fork_from=<hand-off>`` (:meth:`~..base.SandboxBackend.fork_argument`)
  and restores it at its first start (:meth:`RayCopies._start_fork`) on a node Ray picks,
  the hand-off removed, used or not.

Refused, naming why (:meth:`RayCopies.snapshot_refusal`): a runtime other than gVisor on
the nodes, a kernel with egress (the node's egress proxy socket is its sandbox's own), a
node that cannot restore (rootless runsc: the node's own words, from its actor).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...errors import SandboxStartError, SnapshotError
from ..local import forks as local_forks
from ..local import snapshots as local_snapshots
from ..local.template import allocated_bytes
from . import cluster
from .owner import read_image, write_image

if TYPE_CHECKING:
    from ...policy import Policy


class RayCopies(local_forks.ForkOrigin):
    """``RayBackend``'s snapshot, rewind and fork verbs (those of
    :class:`~..base.SandboxBackend`), mixed in; see the module docstring."""

    if TYPE_CHECKING:  # what RayBackend gives the verbs
        policy: Policy
        kernel_id: str
        runtime: str
        fork_from: str
        log: logging.Logger
        _actor: Any
        _where: dict[str, Any]
        _gcs: str | None

        async def _place(self) -> Any: ...
        async def _end_actor(self, graceful: bool = True) -> None: ...
        def _map(self, err: BaseException, doing: str) -> BaseException: ...
        def _demand(self) -> dict[str, float]: ...

    def snapshot_refusal(self, what: str = "snapshot or restore") -> str | None:
        """Why this kernel cannot snapshot and rewind (or ``what``: ``"fork"``), naming the
        runtime, the option or the node's own reason, or None.  Called by the proxy before
        each operation, and by ``kernel_info`` and ``doctor`` (:meth:`copy_operations`)."""
        runtime = self._where.get("runtime", self.runtime)
        if runtime != "gvisor":
            return (f"the {runtime} runtime has no checkpoint, so the Ray backend cannot {what} this "
                    "kernel: use the gVisor runtime on the nodes (--RayBackend.runtime=gvisor)")
        if self.policy.network != "none":
            return (f"{what} of a kernel with network egress is not supported on the Ray backend yet: "
                    "its sandbox's socket to the node's egress proxy is its own and cannot be restored")
        node = self._where.get("copy_refusal")
        if node:
            return f"the sandbox's Ray node cannot {what} it: {node}"
        return None

    def fork_refusal(self) -> str | None:
        """Why this kernel cannot be forked (:meth:`snapshot_refusal`), or None."""
        return self.snapshot_refusal("fork")

    def _refuse(self) -> None:
        """Raise :meth:`snapshot_refusal` as ``SnapshotUnsupported``, if any."""
        if (why := self.snapshot_refusal()) is not None:
            raise SnapshotError(why, "SnapshotUnsupported")

    def admit_forks(self, n: int) -> None:
        """Refuse ``n`` forks the cluster could never hold: its live nodes together have less
        than ``n`` sandboxes' demand of a resource, or no node can hold one (each fork's own
        placement then waits at most ``placement_timeout_s``).  Called by the proxy before
        any image is written.

        Raises
        ------
        SnapshotError
            ``ForkRefused``, with the numbers.
        """
        need = self._demand()
        nodes = cluster.live_nodes()
        refusal = cluster.no_node_fits(need, nodes, self._gcs or "?")
        if refusal is not None:
            raise SnapshotError(f"{n} fork(s) refused: {refusal}", "ForkRefused")
        for res, amount in need.items():
            total = sum(node.total.get(res, 0.0) for node in nodes)
            if amount * (n + 1) > total:
                unit, div = (" MiB", cluster.MIB) if res == "memory" else ("", 1)
                raise SnapshotError(
                    f"{n} fork(s) refused: with this kernel they need {res} {amount * (n + 1) / div:g}{unit} of "
                    f"the Ray cluster, whose live nodes have {total / div:g}{unit} in all: ask for fewer",
                    "ForkRefused")

    async def _take_image(self, d: Path) -> int:
        """The running sandbox's image (it goes on) written into ``d / "image"`` on this
        machine; bytes it takes.  ``d`` is removed if it fails."""
        self._refuse()
        actor = self._actor
        if actor is None:
            raise SnapshotError("no sandbox is running on the Ray cluster: nothing to snapshot")
        try:
            info_ref, files_ref = actor.snapshot_out.options(num_returns=2).remote()
            try:
                info = await info_ref
                files = await files_ref
            except Exception as err:
                mapped = self._map(err, "snapshot the sandbox on the Ray node")
                raise (mapped if isinstance(mapped, SnapshotError) else SnapshotError(str(mapped))) from err
            await asyncio.to_thread(write_image, d / "image", files)
        except BaseException:
            await asyncio.to_thread(shutil.rmtree, d, True)
            raise
        self.log.info("snapshot of the sandbox on Ray node %s: %d bytes through the object store",
                      str(info.get("node_id"))[:8], info.get("image_bytes") or 0)
        return await asyncio.to_thread(allocated_bytes, d)

    async def snapshot(self, snapshot_id: str) -> int:
        """Keep the running sandbox's image as ``snapshot_id`` on this machine's disk (the
        sandbox goes on); bytes it takes.  Called by the proxy (``snapshot_request``).

        Raises
        ------
        SnapshotError
            ``SnapshotUnsupported`` (:meth:`snapshot_refusal`), or the node failed.
        """
        d = await asyncio.to_thread(local_snapshots.new_dir, self.kernel_id, snapshot_id)
        return await self._take_image(d)

    async def restore_image(self, image: Any, *, interrupt: bool, doing: str) -> None:
        """Place a new actor (any node with room) and restore ``image`` (its files by name, or
        an ObjectRef of them) in it (:meth:`.owner.SandboxOwner.restore_in`); it becomes the
        sandbox.  Called by a rewind, a fork's first start and ``resume`` after an idle
        checkpoint.

        Raises
        ------
        AdmissionRefused, BackendError
            No node has room within ``placement_timeout_s``, or no cluster.
        SandboxDied, SandboxStartError, SnapshotError
            The node could not restore it (the actor is ended again).
        """
        actor = await self._place()
        try:
            self._where = await actor.restore_in.remote(image, interrupt)
        except BaseException as err:
            await self._end_actor()
            raise self._map(err, doing) from err

    async def restore_snapshot(self, snapshot_id: str, *, interrupt: bool = False) -> None:
        """Restore the snapshot kept on this machine in a new actor wherever Ray places it
        (the running one already ended by the relay's kill).  Called by the proxy
        (``restore_request``)."""
        self._refuse()
        image = await asyncio.to_thread(local_snapshots.image_dir, self.kernel_id, snapshot_id)
        files = await asyncio.to_thread(read_image, image)
        await self._end_actor()
        await self.restore_image(files, interrupt=interrupt, doing=f"restore snapshot {snapshot_id} on the Ray node")
        self.log.info("sandbox restored from snapshot %s on Ray node %s", snapshot_id,
                      str(self._where.get("node_id"))[:8])

    async def fork(self, fork_id: str, n: int, meta: dict[str, Any]) -> tuple[list[str], int]:
        """The running sandbox's image (it goes on) handed over to ``n`` forks as the local
        backend does (:func:`..local.forks.make_handoffs` on this machine); the hand-off
        directories and the image's bytes.  Called by the proxy (``fork_request``)."""
        d = await asyncio.to_thread(local_snapshots.new_dir, self.kernel_id, f"fork-{fork_id}")
        try:
            size = await self._take_image(d)
            handoffs = await asyncio.to_thread(local_forks.make_handoffs, self.kernel_id, fork_id, d / "image",
                                               n, meta)
        finally:
            await asyncio.to_thread(shutil.rmtree, d, True)
        return [str(h) for h in handoffs], size

    async def _start_fork(self) -> None:
        """Start this kernel's first sandbox from its hand-off (``fork_from``) on a node Ray
        picks (:meth:`restore_image`: the source's cell of then interrupted, the interpreter
        reseeded on the node); the hand-off is removed, used or not.  Called by ``start``
        once: a later start is a cold one.

        Raises
        ------
        SandboxStartError
            The hand-off cannot be used or the restore failed: this kernel has no state of
            its source (its ``kernel_info`` names no ``fork_of``).
        """
        handoff, self.fork_from = Path(self.fork_from), ""
        try:
            image, meta = await local_forks.checked_handoff(handoff, self.fork_refusal())
            try:
                files = await asyncio.to_thread(read_image, image)
            except OSError as err:
                raise SandboxStartError(f"the fork's image cannot be read ({err}); this kernel starts "
                                        "without its source's state") from err
        finally:
            await asyncio.to_thread(shutil.rmtree, handoff, True)
        await self.restore_image(files, interrupt=bool(meta.get("busy")),
                                 doing="restore the fork's image on the Ray node")
        self.fork_of, self._copy = local_forks.fork_record(meta)
        self.log.info("sandbox restored as fork %s of kernel %s on Ray node %s", self.fork_of["fork_id"],
                      self.fork_of["source_kernel"], str(self._where.get("node_id"))[:8])

    def remove_snapshots(self, snapshot_ids: list[str] | None = None) -> None:
        """Remove these snapshots of this kernel from this machine's disk (None: all, and
        the hand-offs no fork took: its shutdown)."""
        with contextlib.suppress(OSError):
            local_snapshots.remove(self.kernel_id, snapshot_ids)
