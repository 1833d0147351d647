"""Snapshots of a live local gVisor kernel, on disk, and the backend's verbs on them.

A snapshot (``snapshot_request``, :mod:`sandbox_kernel.snapshots`) is ``runsc
checkpoint --leave-running`` of the running sandbox, as a start template is
(:mod:`.template`): the sandbox pauses while runsc writes the image and goes on.
A rewind (``restore_request``) kills the sandbox and restores the image into a
new one (its own state directory, bundle, cgroup and container id), whose
interpreter is then made its own by the same reseed as a template's
(:func:`.template.reseed`).

Where they are kept: :func:`base_dir`, beside the start templates
(``<templates>/../snapshots``), one directory per kernel, 0700, the proxy's user:
``<kernel id>/owner`` (the proxy's pid, for ``sandbox-kernel gc``) and
``<kernel id>/<snapshot id>/image/``.  A kernel's snapshots are removed at its
shutdown, and by ``gc`` once its proxy is gone (:func:`collect`).  A restore reads
hard links of the image (:func:`.template.link_image`, removed with the sandbox),
so a snapshot removed meanwhile cannot fail a sandbox restored from it.

Through the sandbox service (an ordinary user's kernel, :mod:`.service`), the same verbs
ask the service (:mod:`.service.copy_client`): the images are root's, in the service's
state (:mod:`.service.copies`), and a rewind is a new sandbox the service restores from
one; the interrupt and the reseed that follow are this module's, as here
(:meth:`LocalSnapshots._reseeded`).

Refused, naming why (:meth:`LocalSnapshots.snapshot_refusal`): bubblewrap (no
checkpoint), rootless runsc (it refuses ``restore``), a kernel with egress or a
workspace folder (their sockets and mounts are the sandbox's own; not yet).  A copied workspace (no host folder: a Ray
node's sandbox, :attr:`.layout.HostLayout.workspace_copied`) is the sandbox's own files
and is restored with them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from ...errors import AdmissionRefused, SandboxKernelError, SnapshotError
from ...protocol import host_op_frame
from . import template
from .gvisor import Gvisor
from .procs import alive
from .runsc import rootless_here
from .sandbox import LocalSandbox
from .service import copy_client
from .service.client import ServiceRuntime, start_from_service

if TYPE_CHECKING:
    from ...policy import Policy
    from .admission import Admission
    from .pool.spares import SpareSpec
    from .runtime import Runtime

#: Subdirectory beside the start templates' (:func:`.template.base_dir`) holding snapshots.
SNAPSHOTS = template.COPIES[0]
#: What a snapshot id may be (the proxy makes them: :mod:`sandbox_kernel.snapshots`).
ID_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def base_dir() -> Path:
    """Where this user's snapshots are kept: beside :func:`.template.base_dir` (the same
    file system, so a restore hard-links the image)."""
    return template.base_dir().with_name(SNAPSHOTS)


def kernel_dir(kernel_id: str) -> Path:
    """One kernel's snapshots."""
    return base_dir() / kernel_id


def image_dir(kernel_id: str, snapshot_id: str) -> Path:
    """The image of a snapshot kept on disk.

    Raises
    ------
    SnapshotError
        ``UnknownSnapshot``: no such snapshot of this kernel (never taken, or removed).
    """
    d = kernel_dir(kernel_id) / snapshot_id if ID_RE.match(snapshot_id) else None
    if d is None or not (d / "image").is_dir() or not any((d / "image").iterdir()):
        raise SnapshotError(f"no snapshot {snapshot_id!r} of this kernel (never taken, or removed)",
                            "UnknownSnapshot")
    return d / "image"


def new_dir(kernel_id: str, snapshot_id: str) -> Path:
    """A new directory for a snapshot (``<kernel id>/<snapshot id>``, 0700), the kernel's
    directory made first with its ``owner`` (this proxy's pid)."""
    if not ID_RE.match(snapshot_id):
        raise SnapshotError(f"bad snapshot id {snapshot_id!r}", "UnknownSnapshot")
    kd = kernel_dir(kernel_id)
    kd.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(kd.parent, 0o700)
    (kd / "owner").write_text(json.dumps({"proxy_pid": os.getpid()}))
    d = kd / snapshot_id
    d.mkdir(mode=0o700)
    return d


def remove(kernel_id: str, snapshot_ids: list[str] | None = None) -> None:
    """Remove these snapshots of a kernel, or (None) all of them and its directory."""
    kd = kernel_dir(kernel_id)
    if snapshot_ids is None:
        shutil.rmtree(kd, ignore_errors=True)
        return
    for sid in snapshot_ids:
        if ID_RE.match(sid):
            shutil.rmtree(kd / sid, ignore_errors=True)


def collect(dry_run: bool = False, base: Path | None = None) -> int:
    """``sandbox-kernel gc``: remove the snapshots of kernels whose proxy is gone; how many
    kernels' snapshots were (or would be) removed.  ``base``: default :func:`base_dir`
    (the sandbox service's images are kept so too, :func:`.service.copies.collect`)."""
    base = base or base_dir()
    n = 0
    for kd in sorted(base.iterdir()) if base.is_dir() else ():
        try:
            pid = json.loads((kd / "owner").read_text()).get("proxy_pid")
        except (OSError, ValueError, AttributeError):
            pid = None
        if isinstance(pid, int) and alive(pid):
            continue
        n += 1
        if not dry_run:
            shutil.rmtree(kd, ignore_errors=True)
    return n


class LocalSnapshots:
    """``LocalBackend``'s snapshot verbs (:class:`~..base.SandboxBackend`'s
    ``snapshot``, ``restore_snapshot``, ``remove_snapshots``), mixed in."""

    if TYPE_CHECKING:  # what LocalBackend gives the verbs
        _sb: LocalSandbox | None
        _runtime: Runtime
        kernel_id: str
        policy: Policy
        python: str
        log: logging.Logger

        @property
        def admission(self) -> Admission: ...
        async def kill(self) -> None: ...
        async def write(self, data: bytes) -> None: ...
        def _own(self, sb: LocalSandbox) -> None: ...
        def _spare_spec(self) -> SpareSpec | None: ...
        def _hold_spare(self, key: str) -> None: ...
        def image_compression(self, state_dir: Path) -> str: ...
        checkpoint_compression: str

    def snapshot_refusal(self, what: str = "snapshot or restore") -> str | None:
        """Why this kernel cannot snapshot and rewind (or ``what``: ``"fork"``), naming the
        runtime or the option, or None."""
        runtime = self._runtime
        if runtime.name != Gvisor.name:
            return (f"the {runtime.name} runtime has no checkpoint, so it cannot {what} a "
                    "kernel: use the gVisor runtime (--LocalBackend.runtime=gvisor)")
        if not isinstance(runtime, ServiceRuntime) and rootless_here():
            return (f"rootless runsc cannot restore a checkpoint, so this kernel (not root) cannot "
                    f"{'be forked' if what == 'fork' else 'be rewound'}: run it through the sandbox "
                    "service or as root")
        if self.policy.network != "none" or (self.policy.workspace != "none" and self.policy.workspace_path):
            return (f"{what} of a kernel with network egress or a workspace folder is not supported "
                    "yet (issue 30): its socket and mounts are its sandbox's own")
        return None

    def service_runtime(self) -> ServiceRuntime | None:
        """The sandbox service's runtime, when this kernel's sandbox is the service's."""
        return self._runtime if isinstance(self._runtime, ServiceRuntime) else None

    def _refuse(self) -> None:
        why = self.snapshot_refusal()
        if why is not None:
            raise SnapshotError(why, "SnapshotUnsupported")

    async def _disk_room(self, sb: LocalSandbox, ename: str) -> None:
        """Refuse an image this user's snapshots' disk cannot hold (about the sandbox's memory
        in use, ``LocalBackend.disk_headroom_mib`` kept free), before anything is written."""
        used = sb.cgroup.memory_used_mib() if sb.cgroup is not None else 0
        try:
            await asyncio.to_thread(self.admission.check_image, base_dir(), used)
        except AdmissionRefused as err:
            raise SnapshotError(str(err), ename) from err

    async def snapshot(self, snapshot_id: str) -> int:
        """``runsc checkpoint --leave-running`` into :func:`new_dir`; bytes on disk."""
        self._refuse()
        sb = self._sb
        if sb is None:
            raise SnapshotError("no sandbox is running: nothing to snapshot")
        if (service := self.service_runtime()) is not None:
            return await copy_client.snapshot(service, sb, snapshot_id, self.checkpoint_compression)
        assert isinstance(self._runtime, Gvisor)
        await self._disk_room(sb, "SnapshotRefused")
        d = await asyncio.to_thread(new_dir, self.kernel_id, snapshot_id)
        try:
            await self._runtime.snapshot(sb, d / "image", self.image_compression(d))
        except BaseException as err:
            await asyncio.to_thread(shutil.rmtree, d, True)
            if isinstance(err, Exception):
                raise SnapshotError(f"runsc could not checkpoint the sandbox: {err}") from err
            raise
        return await asyncio.to_thread(template.allocated_bytes, d)

    async def restore_snapshot(self, snapshot_id: str, *, interrupt: bool = False) -> None:
        """Kill the sandbox, restore the snapshot's image into a new one, interrupt the cell
        it was running (``interrupt``), reseed it."""
        self._refuse()
        service = self.service_runtime()
        image = None if service else await asyncio.to_thread(image_dir, self.kernel_id, snapshot_id)
        await self.kill()
        sb, _ = await self._restored(image, snapshot_id)
        spare = self._spare_spec()  # the kill let go of this kernel's hold on its spare pool
        if spare is not None:
            self._hold_spare(spare.key)
        await self._reseeded(sb, interrupt)
        self.log.info("sandbox %s restored from snapshot %s", sb.container_id, snapshot_id)

    async def _restored(self, image: Path | None, source: str | None) -> tuple[LocalSandbox, dict | None]:
        """A new sandbox restored from a copy's image, made this kernel's: ``image`` here, or,
        through the sandbox service, the service's image ``source`` (a snapshot id or a fork's
        hand-off of this user's).  Called by a rewind and by a fork's first start, before
        :meth:`_reseeded`.  Returns the sandbox and, from the service, a hand-off's ``fork.json``."""
        if (service := self.service_runtime()) is not None:
            # adopted: this kernel's (LocalBackend, the Adopter these verbs are mixed into)
            answer = await start_from_service(self, service, copy_from=source)  # type: ignore[arg-type]
            assert self._sb is not None
            meta = answer.get("copy")
            return self._sb, meta if isinstance(meta, dict) else None
        sb = await LocalSandbox.create(self.policy, self._runtime, self.kernel_id, python=self.python,
                                       admission=self.admission, snapshot_image=image, log=self.log)
        self._own(sb)
        return sb, None

    async def _reseeded(self, sb: LocalSandbox, interrupt: bool) -> None:
        """Make a restored copy (:meth:`_restored`) its own: the cell that ran at the copy
        interrupted (``interrupt``), then the interpreter reseeded (:func:`.template.reseed`):
        the one place for a rewind and a fork's first start, here or through the service."""
        assert sb.proc.stdout is not None
        if interrupt:  # before the reseed, whose completer warm-up would wait for the cell
            await self.write(host_op_frame("interrupt"))
        # the interpreter's generators are the snapshot's: redrawn before any request
        sb.replay += await template.reseed(sb.proc.stdout, self.write, self.log, sb.container_id)

    def remove_snapshots(self, snapshot_ids: list[str] | None = None) -> None:
        if (service := self.service_runtime()) is not None:
            try:
                copy_client.remove(service, self.kernel_id, snapshot_ids)
            except (OSError, ValueError, SandboxKernelError) as err:  # the service's sweep removes them later
                self.log.warning("the sandbox service did not remove the snapshots: %s", err)
            return
        with contextlib.suppress(OSError):
            remove(self.kernel_id, snapshot_ids)
