"""Snapshots and forks of the sandbox service's sandboxes (issue 30), kept in root's state.

The service's side of ``snapshot_request``, ``restore_request`` and ``fork_request`` for an
ordinary user's kernel (:mod:`sandbox_kernel.snapshots` on the proxy; the local backend's
verbs, :mod:`..snapshots` and :mod:`..forks`, ask the service through
:mod:`.copy_client`).  Every image is written, kept, linked and removed by root; the user
names only ids, and gets back neither an image's bytes nor a path of root's:

* ``snapshot`` (the peer's own sandbox, :meth:`SandboxService._owned_by`): ``runsc checkpoint
  --leave-running`` into ``<base>/<owner uid>-<kernel id>/<snapshot id>/image``
  (:func:`base_dir`, beside the service's start templates, 0700 root's).
* ``fork``: the same image, hard-linked into ``n`` hand-offs ``fork-<fork id>-<i>`` beside it
  (:func:`..forks.make_handoffs`), each with the source proxy's ``fork.json``; the answer
  names the hand-offs (the tokens a fork's proxy starts from: ``--LocalBackend.fork_from=
  service:<token>``).  Admission first: ``n`` sandboxes of the source's memory.
* ``create`` with ``from`` (a snapshot id: a rewind; a hand-off: a fork's first start):
  the new sandbox is restored from that image (:meth:`.sandbox.LocalSandbox.create`'s
  ``snapshot_image``, after every check of a cold ``create``); a hand-off is removed, used
  or not, and its ``fork.json`` is in the answer (``copy``).
* ``remove_snapshots``: some or all of one kernel's.

An id is looked up among the peer's own (``<peer uid>-*``) only: another user's id is
refused, naming why (:meth:`ServiceCopies.find`).  Bounded: :data:`MAX_IMAGES_PER_UID`
images a user by default (``sandbox-kernel service --max-images-per-uid``), whatever its
proxy's ``snapshots_max``, a fork's ``n`` hand-offs included; a disk check before each image.
One user's snapshots and forks are taken one at a time (:meth:`ServiceCopies._taking`), so two
kernels of one user asking at the same moment cannot both pass the bound.
Removed: by the proxy (``snapshots_max``, its shutdown), and by the service once the
proxy that took them is gone (:func:`collect`, each sweep, and ``sandbox-kernel gc`` as
root) or the service stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ....errors import AdmissionRefused
from .. import snapshots, template
from ..admission import Admission, in_memory_fs
from ..forks import HANDOFF_RE, MAX_META_BYTES, META, make_handoffs
from ..layout import state_base
from ..runtime import Runtime
from .peers import Refused

log = logging.getLogger("sandbox_kernel.service")

#: The service's snapshots and hand-offs: beside its start templates (one file system: links).
SERVICE_SNAPSHOTS = template.COPIES[1]
#: Images (snapshots and hand-offs not yet taken) one user may have the service keep, by
#: default (:class:`ServiceCopies`'s ``max_images``).
MAX_IMAGES_PER_UID = 32
#: Forks one request may ask for (the proxy's ``forks_max`` bound, enforced here too).
MAX_FORKS = 8


def base_dir() -> Path:
    """Where the service keeps images: ``<templates>/../service-snapshots`` (root's)."""
    return template.base_dir().with_name(SERVICE_SNAPSHOTS)


def collect(dry_run: bool = False) -> int:
    """Remove the kernels' images whose proxy is gone (``owner``'s ``proxy_pid``); how many
    kernels' were (or would be) removed.  Called by the service's sweep and by ``gc`` as root."""
    return snapshots.collect(dry_run, base_dir())


def _checked_id(value: Any, what: str = "snapshot id") -> str:
    if not isinstance(value, str) or not (snapshots.ID_RE.match(value) or HANDOFF_RE.match(value)):
        raise Refused(f"bad {what} {str(value)[:80]!r}")
    return value


@dataclass
class Copy:
    """What a ``create`` restores from (:meth:`ServiceCopies.open`): nothing, a snapshot's
    image, or a fork's hand-off (removed by :meth:`close`)."""

    image: Path | None = None
    handoff: Path | None = None
    meta: dict[str, Any] | None = None

    def close(self) -> None:
        if self.handoff is not None:
            shutil.rmtree(self.handoff, ignore_errors=True)

    def answer(self) -> dict[str, Any]:
        """More fields of the ``create`` answer: the hand-off's ``fork.json`` (``copy``)."""
        return {"copy": self.meta} if self.meta is not None else {}


class ServiceCopies:
    """The service's snapshot, fork and remove verbs, and the restores of ``create``.

    Parameters
    ----------
    runtime : Runtime
        The service's (gVisor as root): what checkpoints a sandbox.
    admission : Admission
        The service's: what a fork's ``n`` sandboxes are checked against.
    max_images : int
        Snapshots and fork hand-offs kept for one uid at once (``--max-images-per-uid``).
    """

    def __init__(self, runtime: Runtime, admission: Admission, max_images: int = MAX_IMAGES_PER_UID):
        self.runtime = runtime
        self.admission = admission
        self.max_images = max_images
        self._takers: dict[int, asyncio.Lock] = {}

    def _taking(self, uid: int) -> asyncio.Lock:
        """Held by a snapshot or fork of ``uid``'s from its bound check until its images are
        written: the check and the fill are one step for that user (others go on)."""
        return self._takers.setdefault(uid, asyncio.Lock())

    # ---- where ---------------------------------------------------------------------------

    @staticmethod
    def _kernel(sb_dir: Path) -> tuple[str, int]:
        """The kernel id and the proxy pid a sandbox's ``tag.json`` (root's) names."""
        tag = json.loads((sb_dir / "tag.json").read_text())
        return str(tag["kernel_id"]), int(tag.get("proxy_pid", 0))

    def _new_dir(self, uid: int, proxy_pid: int) -> Any:
        """A :func:`..snapshots.new_dir` for ``uid``'s images: ``<base>/<uid>-<kernel id>/<name>``."""
        def new_dir(kernel_id: str, name: str) -> Path:
            _checked_id(name)
            kd = base_dir() / f"{uid}-{kernel_id}"
            kd.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.chmod(kd.parent, 0o700)
            (kd / "owner").write_text(json.dumps({"proxy_pid": proxy_pid, "owner_uid": uid}))
            d = kd / name
            try:
                d.mkdir(mode=0o700)
            except FileExistsError as err:
                raise Refused(f"{name} exists already") from err
            return d
        return new_dir

    def find(self, name: Any, uid: int) -> Path:
        """The directory of the snapshot or hand-off ``name`` of ``uid``'s.

        Raises
        ------
        Refused
            A bad id, another user's (named so), or none (never taken, or removed).
        """
        name = _checked_id(name)
        base = base_dir()
        mine = sorted(base.glob(f"{uid}-*/{name}"))
        if mine and (mine[0] / "image").is_dir():
            return mine[0]
        if any(base.glob(f"*/{name}")):
            log.warning("uid %d refused on %s of another user", uid, name)
            raise Refused(f"snapshot {name} belongs to another user: a user restores, forks from and "
                          "removes only the snapshots its own kernels took")
        raise Refused(f"no snapshot {name!r} of uid {uid} (never taken, or removed)")

    def _room(self, uid: int, sb: Any, adding: int = 1) -> None:
        """Refuse ``adding`` more images of ``uid``'s beyond :attr:`max_images`, or an image the
        disk cannot hold (about the sandbox's memory in use)."""
        base = base_dir()
        held = [d for d in base.glob(f"{uid}-*/*") if d.is_dir()] if base.is_dir() else []
        if len(held) + adding > self.max_images:
            raise Refused(f"uid {uid} has {len(held)} snapshots and fork hand-offs kept by the sandbox service and "
                          f"asks for {adding} more, past its bound of {self.max_images} (sandbox-kernel service "
                          "--max-images-per-uid): remove some (or end the kernels that took them)")
        try:
            self.admission.check_image(base, sb.cgroup.memory_used_mib() if sb.cgroup is not None else 0)
        except AdmissionRefused as err:
            raise Refused(str(err)) from err

    def _compression(self, req: dict, d: Path) -> str:
        value = req.get("compression", "auto")
        if value == "auto":
            return "flate-best-speed" if in_memory_fs(d) else "none"
        if value not in ("none", "flate-best-speed"):
            raise Refused(f"compression must be auto, none or flate-best-speed, not {value!r}")
        return str(value)

    async def _image(self, owned: Any, d: Path, req: dict) -> int:
        """``runsc checkpoint --leave-running`` of ``owned``'s sandbox into ``d/image``; its bytes
        on disk.  ``d`` is removed if runsc fails (the sandbox goes on)."""
        sb = owned.sb
        if sb.checkpointed or sb.frozen:
            shutil.rmtree(d, ignore_errors=True)
            raise Refused(f"sandbox {sb.container_id} is {'checkpointed' if sb.checkpointed else 'paused'}: "
                          "resume it first")
        try:
            await self.runtime.snapshot(sb, d / "image", self._compression(req, d))  # type: ignore[attr-defined]
        except BaseException:
            await asyncio.to_thread(shutil.rmtree, d, True)
            raise
        return await asyncio.to_thread(template.allocated_bytes, d)

    # ---- verbs -----------------------------------------------------------------------------

    async def snapshot(self, owned: Any, req: dict) -> tuple[dict, list[int]]:
        """``snapshot``: ``snapshot_id`` of the owner's sandbox ``container_id``."""
        sid = req.get("snapshot_id")
        if not isinstance(sid, str) or not snapshots.ID_RE.match(sid):
            raise Refused(f"bad snapshot id {str(sid)[:80]!r}")
        kernel_id, proxy_pid = await asyncio.to_thread(self._kernel, owned.sb.state_dir)
        async with self._taking(owned.owner_uid):
            await asyncio.to_thread(self._room, owned.owner_uid, owned.sb)
            d = await asyncio.to_thread(self._new_dir(owned.owner_uid, proxy_pid), kernel_id, sid)
            size = await self._image(owned, d, req)
        log.info("snapshot %s of sandbox %s (uid %d): %.1f MiB", sid, owned.sb.container_id, owned.owner_uid,
                 size / (1 << 20))
        return {"ok": True, "bytes": size}, []

    async def fork(self, owned: Any, req: dict) -> tuple[dict, list[int]]:
        """``fork``: ``n`` hand-offs of one image of the sandbox ``container_id``, each with ``meta``."""
        fid, n, meta = req.get("fork_id"), req.get("n"), req.get("meta")
        if not isinstance(fid, str) or not snapshots.ID_RE.match(fid):
            raise Refused(f"bad fork id {str(fid)[:80]!r}")
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_FORKS:
            raise Refused(f"n={n!r} forks refused: ask for 1 to {MAX_FORKS}")
        if not isinstance(meta, dict) or len(json.dumps(meta)) > MAX_META_BYTES:
            raise Refused(f"meta must be an object of at most {MAX_META_BYTES} bytes as JSON")
        sb = owned.sb
        try:
            await asyncio.to_thread(self.admission.check, state_base(), sb.memory_mib * n)
        except AdmissionRefused as err:
            return {"ok": False, "admission": err.details,
                    "reason": f"{n} fork(s) of {sb.memory_mib} MiB each refused by admission: {err}"}, []
        kernel_id, proxy_pid = await asyncio.to_thread(self._kernel, sb.state_dir)
        async with self._taking(owned.owner_uid):
            await asyncio.to_thread(self._room, owned.owner_uid, sb, n)
            new_dir = self._new_dir(owned.owner_uid, proxy_pid)
            d = await asyncio.to_thread(new_dir, kernel_id, f"fork-{fid}")
            try:
                size = await self._image(owned, d, req)
                made = await asyncio.to_thread(make_handoffs, kernel_id, fid, d / "image", n, meta, new_dir)
            finally:
                await asyncio.to_thread(shutil.rmtree, d, True)
        log.info("fork %s of sandbox %s (uid %d): %d hand-off(s)", fid, sb.container_id, owned.owner_uid, n)
        return {"ok": True, "bytes": size, "handoffs": [h.name for h in made]}, []

    def remove(self, req: dict, uid: int) -> tuple[dict, list[int]]:
        """``remove_snapshots``: ``snapshot_ids`` (or all, ``null``) of the peer's kernel ``kernel_id``;
        an id that is another user's is refused (none removed), one already gone is nothing."""
        kernel_id, ids = req.get("kernel_id"), req.get("snapshot_ids")
        if not isinstance(kernel_id, str) or "/" in kernel_id or kernel_id in ("", ".", ".."):
            raise Refused("kernel_id must be a kernel's id")
        kd = base_dir() / f"{uid}-{kernel_id}"
        if ids is None:
            shutil.rmtree(kd, ignore_errors=True)
            return {"ok": True}, []
        if not isinstance(ids, list):
            raise Refused("snapshot_ids must be a list of ids, or null (all)")
        names = [_checked_id(i) for i in ids]
        for name in names:
            if not (kd / name).exists() and any(base_dir().glob(f"*/{name}")):
                raise Refused(f"snapshot {name} belongs to another user: not removed")
        for name in names:
            shutil.rmtree(kd / name, ignore_errors=True)
        return {"ok": True}, []

    async def open(self, source: Any, uid: int) -> Copy:
        """What a ``create`` of ``uid``'s restores from: ``from`` absent or null, a cold start;
        a snapshot id of the peer's; or a fork's hand-off of the peer's (its ``fork.json`` read).

        Raises
        ------
        Refused
            :meth:`find`'s refusals; a hand-off without its ``fork.json``.
        """
        if source is None:
            return Copy()
        d = await asyncio.to_thread(self.find, source, uid)
        if not HANDOFF_RE.match(d.name):
            return Copy(image=d / "image")
        try:
            raw = (d / META).read_bytes()
            meta = json.loads(raw) if len(raw) <= MAX_META_BYTES else None
        except (OSError, ValueError):
            meta = None
        if not isinstance(meta, dict):
            shutil.rmtree(d, ignore_errors=True)
            raise Refused(f"the hand-off {d.name} holds no {META}")
        return Copy(image=d / "image", handoff=d, meta=meta)

    def remove_all(self) -> None:
        """At the service's stop: every image it keeps (their kernels' sandboxes are gone too)."""
        with contextlib.suppress(OSError):
            shutil.rmtree(base_dir())
