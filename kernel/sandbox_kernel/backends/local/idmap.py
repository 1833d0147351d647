"""The workspace folder as its host owner sees it: an id-mapped mount, as root.

With ``workspace`` ``ro`` or ``rw`` and the proxy running as root, the folder is
not bound into the sandbox as it is (where the interpreter, uid 65534, sees the
user's files as another user's: a 0755 folder refuses its writes, a 0600 file
its reads) but through an *id-mapped* clone of it (Linux 5.12+,
``mount_setattr(MOUNT_ATTR_IDMAP)``): in that mount only, files the kernel's
user owns on disk (uid and gid of the proxy) appear as owned by the sandbox
user (:data:`.layout.SANDBOX_UID`), and what the sandbox user creates there is
written to disk as the kernel's user's.  Any other owner on disk is not mapped
(but ``nobody``, :func:`mapping_userns`): the host kernel then gives the sandbox
only the "other" permission bits on it (and no capability applies to such a
file), whatever ``stat`` shows inside.  Set-id bits are refused in such a
sandbox (:func:`.seccomp.build_filter`'s ``no_setid``, :func:`.seccomp.oci_setid_profile`):
a set-user-id file of root's in the user's folder would be root for any host user.

The clone is made in a private mount namespace of the process that starts the
runtime (bubblewrap's launcher, ``runsc run``/``restore``), on a staging point
in the sandbox's state directory: the host's mount table never holds it, and
it ends with the sandbox's processes.

The user namespace that describes the mapping (:func:`mapping_userns`) is held
by no process past its creation: only its file descriptor, for ``mount_setattr``.
No process of the sandbox runs in it.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import os
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ...errors import SandboxStartError
from .layout import SANDBOX_GID, SANDBOX_UID

log = logging.getLogger("sandbox_kernel.backends.local")
_libc = ctypes.CDLL(None, use_errno=True)
_CLONE_NEWUSER = 0x10000000
_CLONE_NEWNS = 0x00020000
_MS_REC, _MS_PRIVATE = 16384, 1 << 18
# x86_64 and aarch64 share these numbers (the new mount API is in the generic table).
_SYS_OPEN_TREE, _SYS_MOVE_MOUNT, _SYS_MOUNT_SETATTR = 428, 429, 442
_OPEN_TREE_CLONE, _OPEN_TREE_CLOEXEC = 1, 0o2000000
_AT_FDCWD, _AT_SYMLINK_NOFOLLOW, _AT_EMPTY_PATH, _AT_RECURSIVE = -100, 0x100, 0x1000, 0x8000
_MOVE_MOUNT_F_EMPTY_PATH = 0x4
_MOUNT_ATTR_IDMAP = 0x00100000


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]


def _check(rc: int, what: str) -> int:
    if rc < 0:
        e = ctypes.get_errno()
        raise OSError(e, f"{what}: {os.strerror(e)}")
    return rc


@dataclass(frozen=True)
class OwnerMap:
    """Which host owner the sandbox user stands for in the workspace mount.

    Attributes
    ----------
    source : str
        The resolved workspace folder on the host.
    point : str
        The staging point (a directory in the sandbox's state directory) the
        id-mapped clone is mounted on, in the launcher's mount namespace; the
        runtime binds this path instead of ``source``.
    uid, gid : int
        The kernel's user on the host (the proxy's effective ids).
    """

    source: str
    point: str
    uid: int
    gid: int

    def as_dict(self) -> dict:
        return {"source": self.source, "point": self.point, "uid": self.uid, "gid": self.gid}


def needed(workspace: str | None) -> bool:
    """An id-mapped workspace mount is made: a workspace, and the proxy is root (an
    ordinary user's sandboxes already map the sandbox user onto that user:
    bubblewrap's user namespace; rootless runsc cannot, see ``docs/decisions.md``)."""
    return workspace is not None and os.geteuid() == 0


def mapping_userns(uid: int, gid: int) -> int:
    """A file descriptor of a new user namespace: ``uid``/``gid`` (inside: on disk) onto
    :data:`SANDBOX_UID`/:data:`SANDBOX_GID` (outside: as seen through the mount), and
    the sandbox user's ids back onto ``uid``/``gid`` (a swap, two ids each).

    Used as ``MOUNT_ATTR_IDMAP``'s mapping: a file owned by ``uid`` on disk shows as
    owned by the sandbox user through the mount, and what the sandbox user creates is
    written as ``uid``'s.  The swap's second half is for gVisor: its file server creates
    a file as host root, then gives it to the guest's user (``fchown``), and a mount
    refuses to create a file for an id it cannot write to disk (``EOVERFLOW``); so host
    root creates as the sandbox user's id on disk, for the moment before the ``fchown``.
    Files that are the sandbox user's on disk (``nobody``'s) therefore show as host
    root's through the mount: not the sandbox user's.  A short-lived ``/bin/cat`` is the
    namespace's only member until the descriptor is open; it runs nothing else and ends
    when its stdin closes.  Blocking.

    Raises
    ------
    OSError
    """

    def enter() -> None:
        _check(_libc.unshare(_CLONE_NEWUSER), "unshare(CLONE_NEWUSER)")

    child = subprocess.Popen(["/bin/cat"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, env={}, cwd="/",
                             preexec_fn=enter, close_fds=True)  # noqa: PLW1509 - one unshare, no lock taken
    try:
        with open(f"/proc/{child.pid}/uid_map", "w") as f:
            f.write(f"{uid} {SANDBOX_UID} 1\n{SANDBOX_UID} {uid} 1\n")
        with open(f"/proc/{child.pid}/setgroups", "w") as f:
            f.write("deny")
        with open(f"/proc/{child.pid}/gid_map", "w") as f:
            f.write(f"{gid} {SANDBOX_GID} 1\n{SANDBOX_GID} {gid} 1\n")
        return os.open(f"/proc/{child.pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait()


def mount_idmapped(source: str, point: str, userns_fd: int) -> None:
    """Clone ``source`` (with the mounts below it; a link put in its place since
    :func:`sandbox_kernel.workspace.resolve` is not followed), id-map the clone with
    ``userns_fd`` and mount it on ``point``, in the calling process's mount namespace.  Called in a
    launcher's ``preexec_fn`` after :func:`private_namespace`.

    Raises
    ------
    OSError
        The host cannot id-map this folder's filesystem (``EINVAL``), among others.
    """
    fd = _check(_libc.syscall(_SYS_OPEN_TREE, _AT_FDCWD, source.encode(),
                              _OPEN_TREE_CLONE | _OPEN_TREE_CLOEXEC | _AT_RECURSIVE | _AT_SYMLINK_NOFOLLOW),
                f"open_tree {source}")
    try:
        attr = _MountAttr(attr_set=_MOUNT_ATTR_IDMAP, userns_fd=userns_fd)
        _check(_libc.syscall(_SYS_MOUNT_SETATTR, fd, b"", _AT_EMPTY_PATH | _AT_RECURSIVE,
                             ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr))),
               f"id-map {source}")
        _check(_libc.syscall(_SYS_MOVE_MOUNT, fd, b"", _AT_FDCWD, point.encode(), _MOVE_MOUNT_F_EMPTY_PATH),
               f"mount on {point}")
    finally:
        os.close(fd)


def private_namespace() -> None:
    """Enter a new mount namespace whose mounts do not propagate to the host's."""
    _check(_libc.unshare(_CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    _check(_libc.mount(b"none", b"/", None, _MS_REC | _MS_PRIVATE, None), "make / private")


#: The record of a sandbox's mapping in its state directory (for ``runsc restore``).
RECORD = "idmap.json"


@dataclass
class Staged:
    """One sandbox's id-mapped workspace, ready for its launcher.

    Attributes
    ----------
    owner : OwnerMap
    userns_fd : int
        The mapping's user namespace (:func:`mapping_userns`); :meth:`close` once the
        launcher has started (it is close-on-exec: no sandbox process holds it).
    """

    owner: OwnerMap
    userns_fd: int

    @property
    def point(self) -> str:
        return self.owner.point

    def mount(self) -> None:
        """In a launcher's ``preexec_fn``, already in a private mount namespace."""
        mount_idmapped(self.owner.source, self.owner.point, self.userns_fd)

    def preexec(self, then: Callable[[], None] | None = None) -> Callable[[], None]:
        """A ``preexec_fn``: a private mount namespace holding the id-mapped workspace on
        its point, then ``then``.  For ``runsc run``/``restore`` (their sentry and gofer
        inherit the namespace)."""

        def step() -> None:
            private_namespace()
            self.mount()
            if then is not None:
                then()

        return step

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.userns_fd)


def trial(owner: OwnerMap, userns_fd: int) -> int:
    """Make the id-mapped mount once in a throwaway process (its own mount namespace,
    ``/bin/true``); 0, or the ``errno`` it failed with (``EINVAL``: this filesystem, NFS
    for one, cannot be id-mapped).  A ``preexec_fn`` hides its exception's detail, so the
    trial's exit status carries it.  Blocking."""

    def attempt() -> None:
        try:
            private_namespace()
            mount_idmapped(owner.source, owner.point, userns_fd)
        except OSError as err:
            os._exit(err.errno or 1)

    return subprocess.run(["/bin/true"], env={}, cwd="/", check=False,
                          preexec_fn=attempt).returncode


def stage(state_dir: Path, source: str) -> Staged | None:
    """Map the kernel's user (the proxy's effective uid and gid) for ``source``, staged
    at ``<state_dir>/workspace`` (created, 0755), and record it (:data:`RECORD`).
    Blocking (starts and ends two short processes).

    Returns
    -------
    Staged or None
        None where the host cannot id-map the folder (:func:`trial`; logged): the folder
        is then bound as it is, as before issue 33 (its files keep their owner inside).

    Raises
    ------
    SandboxStartError
        No user namespace could be made (naming the reason).
    """
    point = Path(state_dir) / "workspace"
    point.mkdir(mode=0o755, exist_ok=True)
    os.chmod(point, 0o755)  # noqa: S103 - an empty mount point, traversed by the sandbox user
    owner = OwnerMap(source, str(point), os.geteuid(), os.getegid())
    try:
        fd = mapping_userns(owner.uid, owner.gid)
    except OSError as err:
        raise SandboxStartError(f"cannot map the workspace {source} onto the sandbox user (a user namespace "
                                f"for an id-mapped mount: {err}); use workspace=none") from err
    failed = trial(owner, fd)
    if failed:
        os.close(fd)
        log.warning("the workspace %s cannot be id-mapped here (%s): bound as it is, its files keep their "
                    "owner inside (docs/security.md, \"The workspace\")", source, os.strerror(failed))
        return None
    (Path(state_dir) / RECORD).write_text(json.dumps(owner.as_dict()))
    return Staged(owner, fd)


def restage(state_dir: Path) -> Staged | None:
    """The recorded mapping of a sandbox (:func:`stage`), made again for ``runsc restore``;
    None when it has none.  The record lies in the state directory, which only the
    proxy's user writes (0700 or 0711 root's).

    Raises
    ------
    SandboxStartError
    """
    try:
        rec = json.loads((Path(state_dir) / RECORD).read_text())
    except (OSError, ValueError):
        return None
    try:
        fd = mapping_userns(int(rec["uid"]), int(rec["gid"]))
    except OSError as err:
        raise SandboxStartError(f"cannot map the workspace {rec['source']} again: {err}") from err
    return Staged(OwnerMap(str(rec["source"]), str(rec["point"]), int(rec["uid"]), int(rec["gid"])), fd)
