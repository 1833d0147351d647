"""Admission control of the local backend: a sandbox the machine cannot hold is refused.

Before a sandbox is made (:meth:`.sandbox.LocalSandbox.create`) or restored from
a checkpoint, :meth:`Admission.reserve` checks what the machine can still give
and refuses with :class:`~sandbox_kernel.errors.AdmissionRefused`, naming the
resource and the numbers, rather than overcommit (then the kernel OOM killer,
not the sandbox's own limit, would pick a victim: possibly a neighbour):

* **memory**: the memory limits (``memory_mib``) of the sandboxes present,
  frozen ones included (a freeze keeps memory) and checkpointed ones at 0
  (their memory is on disk), plus the new one's, may not exceed
  ``(host memory - memory_headroom_mib) x memory_overcommit``.  Where the state
  directory is on a tmpfs (Debian's ``/run``), "on disk" is memory too: the
  checkpoint images and start templates there count at their allocated size.
  Host memory is ``MemTotal``, or this process's memory cgroup limit when lower
  (the sandbox cgroups are made under it);
* **pids**: the tasks running on the host plus :data:`PIDS_PER_START` may not
  come within ``pids_headroom`` of ``min(kernel.pid_max, kernel.threads-max)``;
* **disk**: where the sandbox may be checkpointed, its image (up to
  ``memory_mib``) must fit on the state directory's file system with
  ``disk_headroom_mib`` to spare.

The sandboxes present are read from the state directories under
:func:`.layout.state_base` (``tag.json`` records each one's ``memory_mib``; a
``checkpointed`` file marks one whose memory is on disk), so every proxy
process on the machine sees the same figure.  The check and the reservation
(the new state directory and its tag, or the removal of the ``checkpointed``
mark before a restore) are made under one ``flock`` on
``<state base>/admission.lock``: two proxies starting at once cannot both take
the last room.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from ...errors import AdmissionRefused
from ...policy import Policy
from ..base import TAG
from . import template
from .cgroups import detect_layout

#: In a state directory: the sandbox is checkpointed, its memory is on disk (held: ~0).
CHECKPOINTED_MARK = "checkpointed"
#: The lock file under the state base.
LOCK_NAME = "admission.lock"
#: Host tasks a sandbox takes to start (runtime, agent, interpreter, watchdog), pids.
PIDS_PER_START = 64
#: ``memory_mib`` counted for a sandbox whose tag does not record it (made by an older
#: version): the policy's default.
UNKNOWN_MEMORY_MIB = Policy().memory_mib
MIB = 1024 * 1024


@dataclass(frozen=True)
class Held:
    """One sandbox present on the machine, as admission counts it.

    Attributes
    ----------
    name : str
        Its state directory's (and container's) name.
    memory_mib : int
        Its memory limit, MiB.
    checkpointed : bool
        Its memory is on disk: it holds ~0 MiB.
    image_mib : int
        Its checkpoint image, MiB, when that is held in memory (a tmpfs); else 0.
    """

    name: str
    memory_mib: int
    checkpointed: bool
    image_mib: int = 0

    @property
    def holds_mib(self) -> int:
        """Memory it holds for admission, MiB."""
        return self.image_mib if self.checkpointed else self.memory_mib


def present(base: Path, *, in_memory: bool = False) -> list[Held]:
    """The sandboxes whose state directory is under ``base``, with what they hold;
    ``in_memory``: ``base`` is a tmpfs, so a checkpoint image holds its size."""
    out = []
    for d in sorted(base.glob(f"{TAG}-*")):
        try:
            tag = json.loads((d / "tag.json").read_text())
        except (OSError, ValueError):
            tag = {}
        mib = tag.get("memory_mib") if isinstance(tag, dict) else None
        if not isinstance(mib, int) or isinstance(mib, bool) or mib <= 0:
            mib = UNKNOWN_MEMORY_MIB
        checkpointed = (d / CHECKPOINTED_MARK).exists()
        image = template.allocated_bytes(d / "checkpoint") // MIB if checkpointed and in_memory else 0
        out.append(Held(d.name, mib, checkpointed, image))
    return out


def _meminfo_kib(key: str, text: str | None = None) -> int:
    text = Path("/proc/meminfo").read_text() if text is None else text
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        if name == key:
            return int(rest.split()[0])
    raise ValueError(f"no {key} in /proc/meminfo")


def host_memory_mib() -> int:
    """Memory the sandboxes of this machine may share, MiB: ``MemTotal``, or this
    process's memory cgroup limit (cgroup v1) when that is lower."""
    total = _meminfo_kib("MemTotal") // 1024
    layout = detect_layout()
    base = layout.bases.get("memory") if layout is not None else None
    if base:
        with contextlib.suppress(OSError, ValueError):
            limit = int(Path(base, "memory.limit_in_bytes").read_text()) // MIB
            total = min(total, limit)
    return total


def host_tasks() -> tuple[int, int]:
    """``(tasks running on the host, the most it may run)``: ``/proc/loadavg``'s total,
    and ``min(kernel.pid_max, kernel.threads-max)``."""
    used = int(Path("/proc/loadavg").read_text().split()[3].split("/")[1])
    limit = min(int(Path("/proc/sys/kernel/pid_max").read_text()),
                int(Path("/proc/sys/kernel/threads-max").read_text()))
    return used, limit


def in_memory_fs(path: Path) -> bool:
    """Whether ``path`` lies on a tmpfs or ramfs (Debian mounts ``/run`` so): files there
    are held in memory.  From the longest mount point of ``/proc/self/mounts`` above it."""
    target = os.path.realpath(path)
    best, fstype = "", ""
    try:
        with open("/proc/self/mounts") as f:
            for line in f:
                fields = line.split()
                if len(fields) < 3:
                    continue
                point = fields[1].replace("\\040", " ")
                inside = target == point or target.startswith(point.rstrip("/") + "/")
                if inside and len(point) >= len(best):
                    best, fstype = point, fields[2]
    except OSError:
        return False
    return fstype in ("tmpfs", "ramfs")


def copies_in_memory_mib() -> int:
    """Blocks allocated to the snapshots and fork hand-offs kept beside the start templates
    (:data:`.template.COPIES`) that lie on a tmpfs or ramfs, held in memory, MiB; 0 on disk."""
    total = 0
    for name in template.COPIES:
        d = template.base_dir().with_name(name)
        if d.is_dir() and in_memory_fs(d):
            total += template.allocated_bytes(d)
    return total // MIB


def disk_free_mib(path: Path) -> int:
    """Free space of ``path``'s file system for an unprivileged writer, MiB."""
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize // MIB


@contextlib.contextmanager
def locked(base: Path) -> Iterator[None]:
    """Hold the machine's admission lock (``flock`` on ``<base>/admission.lock``), blocking."""
    fd = os.open(base / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


@dataclass(frozen=True)
class Admission:
    """The operator's headroom (``LocalBackend`` options) and the check against it.

    Attributes
    ----------
    memory_headroom_mib : int
        Host memory never committed to sandboxes (proxies, the OS, page cache), MiB.
    memory_overcommit : float
        Committed memory limits may reach this multiple of ``host - headroom``;
        0 turns the memory check off.
    pids_headroom : int
        Process ids kept free on the host.
    disk_headroom_mib : int
        Disk kept free beside a checkpoint image, MiB.
    set_by : {"LocalBackend", "service"}
        Where the operator sets these, as a refusal names them: a kernel's ``LocalBackend``
        options, or the flags of ``sandbox-kernel service`` (its sandboxes for users).
    """

    memory_headroom_mib: int = 1024
    memory_overcommit: float = 1.0
    pids_headroom: int = 2048
    disk_headroom_mib: int = 1024
    set_by: str = "LocalBackend"

    def option(self, name: str) -> str:
        """The option ``name`` (a field's) as the operator sets it: ``LocalBackend.pids_headroom``,
        or ``sandbox-kernel service --pids-headroom``."""
        if self.set_by == "service":
            return "sandbox-kernel service --" + name.replace("_", "-")
        return f"{self.set_by}.{name}"

    def check(self, base: Path, memory_mib: int, *, checkpoint_mib: int = 0,
              host_mib: Callable[[], int] = host_memory_mib) -> None:
        """Refuse a sandbox of ``memory_mib`` that the machine cannot hold now.

        Parameters
        ----------
        base : Path
            The state base (:func:`.layout.state_base`): whose sandboxes count.
        memory_mib : int
            The new (or restored) sandbox's memory limit, MiB.
        checkpoint_mib : int
            Disk its checkpoint image may take, MiB (0: it is never checkpointed).
        host_mib : callable
            :func:`host_memory_mib` (tests pass another).

        Raises
        ------
        AdmissionRefused
            Naming the resource (memory, pids, disk), the numbers and what would make room.
        """
        if self.memory_overcommit > 0:
            in_memory = in_memory_fs(base)
            every = present(base, in_memory=in_memory)
            held = [h for h in every if h.holds_mib and not h.checkpointed]
            # on a tmpfs: checkpoint images and start templates (else these are 0)
            images = sum(h.holds_mib for h in every if h.checkpointed)
            templates = template.held_mib() if in_memory_fs(template.base_dir()) else 0
            copies = copies_in_memory_mib()
            files = images + templates + copies
            committed = sum(h.holds_mib for h in held) + files
            host = host_mib()
            capacity = int(max(0, host - self.memory_headroom_mib) * self.memory_overcommit)
            if committed + memory_mib > capacity:
                kept = (f", {copies} MiB of snapshots and fork hand-offs beside them" if copies else "")
                on_tmpfs = (f" ({files} MiB of them checkpoint images and start templates on a tmpfs: "
                            f"{images} MiB in {base}, {templates} MiB in {template.base_dir()}{kept})"
                            if files else "")
                raise AdmissionRefused(
                    f"not enough memory on this machine for a sandbox of {memory_mib} MiB: "
                    f"{committed} MiB are committed to {len(held)} running or frozen sandboxes{on_tmpfs}, of "
                    f"{capacity} MiB sandboxes may hold (host {host} MiB - {self.memory_headroom_mib} MiB "
                    f"headroom, x{self.memory_overcommit:g} overcommit); refused rather than overcommitted "
                    "(the OOM killer would pick a neighbour). Make room by shutting down idle kernels, "
                    f"or ask the operator for a smaller memory_mib or {self.option('memory_headroom_mib')} / "
                    f"{self.option('memory_overcommit')}",
                    resource="memory", need=memory_mib, available=max(0, capacity - committed), unit="MiB",
                    committed_mib=committed, sandboxes=len(held), host_mib=host,
                    headroom_mib=self.memory_headroom_mib, overcommit=self.memory_overcommit,
                    **({"files_mib": files} if files else {}))
        used, limit = host_tasks()
        free = limit - used - self.pids_headroom
        if free < PIDS_PER_START:
            raise AdmissionRefused(
                f"not enough process ids on this machine for a sandbox: {used} of {limit} are in use and "
                f"{self.pids_headroom} are kept free ({self.option('pids_headroom')}); a sandbox needs about "
                f"{PIDS_PER_START} to start. Make room by shutting down kernels",
                resource="pids", need=PIDS_PER_START, available=max(0, free), unit="pids",
                in_use=used, limit=limit, headroom=self.pids_headroom)
        if checkpoint_mib:
            disk = disk_free_mib(base)
            if disk - self.disk_headroom_mib < checkpoint_mib:
                raise AdmissionRefused(
                    f"not enough disk for this sandbox's checkpoints: {disk} MiB free under {base}, "
                    f"{self.disk_headroom_mib} MiB kept free ({self.option('disk_headroom_mib')}), an image "
                    f"may take up to {checkpoint_mib} MiB (memory_mib). Free disk, or set "
                    "checkpoint_after_s=0",
                    resource="disk", need=checkpoint_mib, available=max(0, disk - self.disk_headroom_mib),
                    unit="MiB", free_mib=disk, headroom_mib=self.disk_headroom_mib)

    def check_image(self, where: Path, image_mib: int) -> None:
        """Refuse a snapshot's image of up to ``image_mib`` MiB (the sandbox's memory in use)
        that ``where``'s file system (its nearest existing folder) cannot hold with
        ``disk_headroom_mib`` kept free.  Called before a snapshot or a fork writes anything.

        Raises
        ------
        AdmissionRefused
            ``resource="disk"``, with the figures.
        """
        path = Path(where)
        while not path.exists() and path != path.parent:
            path = path.parent
        disk = disk_free_mib(path)
        if disk - self.disk_headroom_mib < image_mib:
            raise AdmissionRefused(
                f"not enough disk for the snapshot's image: {disk} MiB free under {path}, {self.disk_headroom_mib} "
                f"MiB kept free ({self.option('disk_headroom_mib')}), and the image may take up to {image_mib} MiB "
                "(the sandbox's memory in use). Free disk, or remove snapshots",
                resource="disk", need=image_mib, available=max(0, disk - self.disk_headroom_mib),
                unit="MiB", free_mib=disk, headroom_mib=self.disk_headroom_mib)

    def reserve(self, base: Path, memory_mib: int, make: Callable[[], None], *, checkpoint_mib: int = 0,
                host_mib: Callable[[], int] = host_memory_mib) -> None:
        """:meth:`check`, then ``make()`` (which must make the new commitment visible to
        :func:`present`: the state directory with its tag, or the ``checkpointed`` mark
        removed), both under the machine's admission lock.  Blocking.

        Raises
        ------
        AdmissionRefused
            From :meth:`check`; ``make`` is not called.
        """
        with locked(base):
            self.check(base, memory_mib, checkpoint_mib=checkpoint_mib, host_mib=host_mib)
            make()
