"""Forks of a live local gVisor kernel: the source's images handed over, a fork's first start.

A fork (``fork_request``, :mod:`sandbox_kernel.snapshots`) is a snapshot of the running
sandbox (``runsc checkpoint --leave-running``: the source pauses while runsc writes the
image, then goes on, :meth:`LocalForks.fork`) handed over to ``n`` new kernels, each
its own proxy process with its own connection file and key (jupyter_client's) and its
own sandbox, which its backend restores from the image at its first start
(:meth:`LocalForks._start_fork`, option ``LocalBackend.fork_from``) and makes its own
by the same reseed as a rewind's (:func:`.template.reseed`).

Where the images are: the source writes one image under its snapshots' directory
(:func:`.snapshots.kernel_dir`) and hard-links it into one hand-off directory per fork,
``<source kernel id>/fork-<fork id>-<i>/`` (0700, the proxy's user) holding ``image/`` and
``fork.json`` (the source's ``kernel_info``, whether a cell ran, when, from which kernel:
written by the source proxy, never by a sandbox); the image it wrote is then removed.
A fork's backend links its hand-off's image into its sandbox's own place
(:func:`.template.link_image`, removed with that sandbox) and removes the hand-off
directory, used or not, at its first start.  A hand-off no fork took is removed with the
source kernel's snapshots (its shutdown) or by ``sandbox-kernel gc`` once the source's
proxy is gone (:func:`.snapshots.collect`).  A fork's sandbox, once running, depends on
no file of its source.

Through the sandbox service, the image and the hand-offs are the service's, in root's state
(:mod:`.service.copies`): ``fork_from`` is ``service:<hand-off>``, a name the service looks up
among this user's, and the fork's first start is the service's restore, then the same
interrupt and reseed (:meth:`.snapshots.LocalSnapshots._reseeded`).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import stat
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...errors import AdmissionRefused, SandboxStartError, SnapshotError
from . import snapshots, template
from .gvisor import Gvisor
from .layout import state_base
from .service import copy_client

#: A hand-off directory's name: ``fork-<fork id>-<index>``.
HANDOFF_RE = re.compile(r"^fork-[A-Za-z0-9_-]{1,64}-[0-9]{1,3}$")
#: What a hand-off holds besides its image.
META = "fork.json"
#: Largest ``fork.json`` read, bytes.
MAX_META_BYTES = 1 << 20


def make_handoffs(kernel_id: str, fork_id: str, image: Path, n: int, meta: dict[str, Any],
                  new_dir: Callable[[str, str], Path] = snapshots.new_dir) -> list[Path]:
    """Hard-link ``image`` into ``n`` hand-off directories beside it, each with ``fork.json``.

    Parameters
    ----------
    kernel_id : str
        The source kernel (whose snapshots' directory holds them).
    fork_id : str
        The fork's id (:data:`.snapshots.ID_RE`).
    image : Path
        The checkpoint image the source wrote.
    n : int
        How many forks.
    meta : dict
        What each fork's proxy needs besides the image (``kernel_info``, ``busy``...), as JSON.
    new_dir : callable
        Makes one directory ``(kernel_id, name)``: this user's (:func:`.snapshots.new_dir`),
        or the sandbox service's in its own state (:mod:`.service.copies`).

    Returns
    -------
    list of Path
        The hand-off directories, one per fork, in order.

    Raises
    ------
    OSError
        A link or a write failed; what was made is removed.
    """
    made: list[Path] = []
    try:
        for i in range(n):
            d = new_dir(kernel_id, f"fork-{fork_id}-{i}")
            made.append(d)
            template.link_tree(image, d / "image")
            (d / META).write_text(json.dumps(meta))
    except BaseException:
        for d in made:
            shutil.rmtree(d, ignore_errors=True)
        raise
    return made


def open_handoff(path: Path) -> tuple[Path, dict[str, Any]]:
    """A hand-off directory's image and ``fork.json``, checked: under this user's
    snapshots (:func:`.snapshots.base_dir`), named as one, a directory (not a link) of
    this user's with no access for others.

    Raises
    ------
    ValueError
        Anything else: named in the message.
    OSError
        It cannot be read.
    """
    base = snapshots.base_dir()
    if path.parent.parent != base or not HANDOFF_RE.match(path.name):
        raise ValueError(f"{path} is not a fork's hand-off directory under {base}")
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
        raise ValueError(f"{path} is not a private directory of this user's")
    raw = (path / META).read_bytes()
    meta = json.loads(raw) if len(raw) <= MAX_META_BYTES else None
    image = path / "image"
    if not isinstance(meta, dict) or not image.is_dir() or not any(image.iterdir()):
        raise ValueError(f"{path} holds no image or no {META}")
    return image, meta


async def checked_handoff(path: Path, refusal: str | None) -> tuple[Path, dict[str, Any]]:
    """A fork's hand-off, opened for its first start (:func:`open_handoff`), unless this
    kernel cannot be a fork (``refusal``, its backend's :meth:`fork_refusal`).  Called by the
    local and the Ray backends' ``_start_fork``, which remove the hand-off after, used or not.

    Raises
    ------
    SandboxStartError
        The refusal, or the hand-off cannot be used: the kernel has none of its source's state.
    """
    if refusal is not None:
        raise SandboxStartError(f"this kernel was to start as a fork, but {refusal}")
    try:
        return await asyncio.to_thread(open_handoff, path)
    except (OSError, ValueError) as err:
        raise SandboxStartError(f"the fork's image cannot be used ({err}); this kernel starts "
                                "without its source's state") from err


def fork_record(meta: dict[str, Any]) -> tuple[dict[str, str], dict[str, Any]]:
    """From a hand-off's ``fork.json``: the fork's ``fork_of`` (``describe``) and what its
    backend's ``restored_copy`` gives the relay once (``kernel_info``, ``busy``, ``fork_of``'s)."""
    fork_of = {k: str(meta.get(k, "")) for k in ("source_kernel", "fork_id", "created")}
    info = meta.get("kernel_info")
    return fork_of, {"kernel_info": info if isinstance(info, dict) else None, "busy": bool(meta.get("busy")),
                     **fork_of}


class ForkOrigin:
    """What a kernel started as a fork knows of its origin, for every backend that forks
    (local, Ray, E2B; mixed in before the backend's class): ``fork_of`` in ``describe``, and
    :meth:`restored_copy` for the relay, once.  The backend's ``_start_fork`` sets both from
    its hand-off's ``fork.json`` (:func:`fork_record`)."""

    #: This kernel's sandbox is a fork's (restored from a source's image): whose, for ``describe``.
    fork_of: dict[str, Any] | None = None
    #: Set by ``_start_fork``, taken by the relay (:meth:`restored_copy`).
    _copy: dict[str, Any] | None = None

    def describe(self) -> dict:
        """The backend's ``describe``, with ``fork_of`` (``source_kernel``, ``fork_id``,
        ``created``) when this kernel started as a fork."""
        d: dict = super().describe()  # type: ignore[misc]
        if self.fork_of is not None:
            d["fork_of"] = dict(self.fork_of)
        return d

    def restored_copy(self) -> dict[str, Any] | None:
        """Once, right after a start that restored a fork: ``kernel_info`` (the source's),
        ``busy``, ``source_kernel``, ``fork_id``, ``created``; else None (see the base class)."""
        copy, self._copy = self._copy, None
        return copy


class LocalForks(ForkOrigin, snapshots.LocalSnapshots):
    """``LocalBackend``'s fork verbs, mixed in beside its snapshot verbs: :meth:`fork_refusal`
    and :meth:`fork` on the source, :meth:`_start_fork` on a fork."""

    if TYPE_CHECKING:
        fork_from: str  # LocalBackendConfig's
        service_socket: str

    def fork_refusal(self) -> str | None:
        """Why this kernel cannot be forked (naming the runtime or the option), or None."""
        return self.snapshot_refusal("fork")

    def admit_forks(self, n: int) -> None:
        """Refuse ``n`` forks the machine cannot hold now (memory: ``n`` sandboxes of this
        policy's ``memory_mib`` besides those running; process ids), before any image is
        written (:meth:`.admission.Admission.check`; each fork's own start asks again).

        Raises
        ------
        SnapshotError
            ``ForkRefused``, naming the resource and the numbers.
        """
        try:
            self.admission.check(state_base(), self.policy.memory_mib * n)
        except AdmissionRefused as err:
            raise SnapshotError(f"{n} fork(s) of {self.policy.memory_mib} MiB each refused by admission: {err}",
                                "ForkRefused") from err

    async def fork(self, fork_id: str, n: int, meta: dict[str, Any]) -> tuple[list[str], int]:
        """Checkpoint the running sandbox (it goes on) into one image, handed over to ``n``
        forks (:func:`make_handoffs`); the image written is removed once linked.

        Returns
        -------
        tuple of (list of str, int)
            The hand-off directories (what each fork's ``LocalBackend.fork_from`` is set
            to), and the bytes the image takes on disk (once, however many links).

        Raises
        ------
        SnapshotError
            ``SnapshotUnsupported`` (:meth:`fork_refusal`), or runsc failed (the sandbox
            goes on, nothing is kept).
        """
        why = self.fork_refusal()
        if why is not None:
            raise SnapshotError(why, "SnapshotUnsupported")
        sb = self._sb
        if sb is None:
            raise SnapshotError("no sandbox is running: nothing to fork")
        if (service := self.service_runtime()) is not None:  # the images stay root's: hand-offs by name
            return await copy_client.fork(service, sb, fork_id, n, meta, self.checkpoint_compression)
        assert isinstance(self._runtime, Gvisor)
        await self._disk_room(sb, "ForkRefused")
        d = await asyncio.to_thread(snapshots.new_dir, self.kernel_id, f"fork-{fork_id}")
        try:
            try:
                await self._runtime.snapshot(sb, d / "image", self.image_compression(d))
            except Exception as err:
                raise SnapshotError(f"runsc could not checkpoint the sandbox: {err}") from err
            size = await asyncio.to_thread(template.allocated_bytes, d)
            handoffs = await asyncio.to_thread(make_handoffs, self.kernel_id, fork_id, d / "image", n, meta)
        finally:
            await asyncio.to_thread(shutil.rmtree, d, True)
        return [str(h) for h in handoffs], size

    async def _start_fork(self) -> None:
        """Start this kernel's first sandbox restored from its hand-off (``fork_from``),
        interrupt the source's cell that ran then (if one did), reseed it; the hand-off is
        removed, used or not.  Called by ``LocalBackend.start`` once: a later start (after
        a death) is a cold one.

        Raises
        ------
        SandboxStartError
            The hand-off cannot be used, or the restore failed: this kernel has no state
            of its source (its ``kernel_info`` names no ``fork_of``).
        """
        fork_from, self.fork_from = self.fork_from, ""
        if fork_from.startswith(copy_client.SERVICE_HANDOFF):  # the service's hand-off, by name
            refusal = self.fork_refusal() or (None if self.service_runtime() else "no sandbox service answers at "
                                              f"{self.service_socket!r}, which holds the fork's image")
            if refusal is not None:
                raise SandboxStartError(f"this kernel was to start as a fork, but {refusal}")
            sb, got = await self._restored(None, fork_from[len(copy_client.SERVICE_HANDOFF):])
            if got is None:
                await self.kill()
                raise SandboxStartError("the sandbox service restored the fork without its fork.json")
            meta = got
        else:
            handoff = Path(fork_from)
            try:
                image, meta = await checked_handoff(handoff, self.fork_refusal())
                sb, _ = await self._restored(image, None)
            finally:
                await asyncio.to_thread(shutil.rmtree, handoff, True)
        # the source's cell of then: ended in the copy, its output dropped
        await self._reseeded(sb, bool(meta.get("busy")))
        self.fork_of, self._copy = fork_record(meta)
        self.log.info("sandbox %s restored as fork %s of kernel %s", sb.container_id,
                      self.fork_of["fork_id"], self.fork_of["source_kernel"])
