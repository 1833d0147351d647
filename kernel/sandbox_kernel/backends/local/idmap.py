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

The sandbox service (root, :mod:`.service`) maps an ordinary user's folder the same
way, from a :class:`Folder`: file descriptors the user's proxy opened and passed
(``SCM_RIGHTS``), never a name root resolves.  Its clones are made in the service
(:func:`clone_idmapped` on the descriptor, ``AT_EMPTY_PATH``: a detached mount that
is in no mount table), and only moved onto their points in the launcher's private
namespace (:func:`attach`); a protected subfolder (``.git``) gets a clone of its own,
read-only, on a point in the state directory.  There host root's creates land on
disk as :data:`NO_ACCOUNT_ID` (not ``nobody``), so that no other user's file is
mapped: every file not the peer's keeps its "other" bits against any process of the
sandbox, its agent (guest root with ``CAP_DAC_OVERRIDE``) included.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import os
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ...errors import SandboxStartError
from .layout import PROTECTED_SUBDIRS, SANDBOX_GID, SANDBOX_UID

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
_MOUNT_ATTR_RDONLY, _MOUNT_ATTR_IDMAP = 0x1, 0x00100000
#: Where host root's creates land on disk in a folder the sandbox service maps (an ordinary
#: user's), for the moment before gVisor's ``fchown`` (:func:`mapping_userns`): an id of
#: the range no account may have (2**31..2**32-2, systemd's "avoid"), not ``nobody``'s, so
#: that no existing user's file is mapped onto host root (whose capabilities would then
#: apply to it through the mount).
NO_ACCOUNT_ID = 4294967293


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


def mapping_userns(uid: int, gid: int, creates_as: int = SANDBOX_UID) -> int:
    """A file descriptor of a new user namespace: ``uid``/``gid`` (inside: on disk) onto
    :data:`SANDBOX_UID`/:data:`SANDBOX_GID` (outside: as seen through the mount), and
    ``creates_as`` (on disk) onto host root, uid and gid (for root's kernels, whose
    ``uid`` is 0, the sandbox user's ids: a swap, two ids each; for the sandbox service's
    ordinary users :data:`NO_ACCOUNT_ID`).

    Used as ``MOUNT_ATTR_IDMAP``'s mapping: a file owned by ``uid`` on disk shows as
    owned by the sandbox user through the mount, and what the sandbox user creates is
    written as ``uid``'s.  The second pair is for gVisor: its file server creates
    a file as host root, then gives it to the guest's user (``fchown``), and a mount
    refuses to create a file for an id it cannot write to disk (``EOVERFLOW``); so host
    root creates as ``creates_as`` on disk, for the moment before the ``fchown``.
    Files that are ``creates_as``'s on disk therefore show as host root's through the
    mount: not the sandbox user's (and host root's capabilities apply to them).  A short-lived ``/bin/cat`` is the
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
            f.write(f"{uid} {SANDBOX_UID} 1\n{creates_as} 0 1\n")
        with open(f"/proc/{child.pid}/setgroups", "w") as f:
            f.write("deny")
        with open(f"/proc/{child.pid}/gid_map", "w") as f:
            f.write(f"{gid} {SANDBOX_GID} 1\n{creates_as} 0 1\n")
        return os.open(f"/proc/{child.pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait()


def clone_idmapped(dfd: int, path: str, userns_fd: int, *, readonly: bool = False) -> int:
    """A detached clone of the folder at ``path`` relative to ``dfd`` (``""``: ``dfd``
    itself, ``AT_EMPTY_PATH``; with the mounts below it; a link in its place is not
    followed), id-mapped with ``userns_fd`` (and read-only with ``readonly``): the fd
    of a mount in no namespace's table until :func:`attach`.  A descriptor's folder
    must be in the caller's mount namespace (the kernel refuses another's).

    Raises
    ------
    OSError
        The host cannot id-map this folder's filesystem (``EINVAL``), among others.
    """
    what = path or f"the folder of fd {dfd}"
    flags = _OPEN_TREE_CLONE | _OPEN_TREE_CLOEXEC | _AT_RECURSIVE | _AT_SYMLINK_NOFOLLOW
    fd = _check(_libc.syscall(_SYS_OPEN_TREE, dfd, path.encode(), flags | (0 if path else _AT_EMPTY_PATH)),
                f"open_tree {what}")
    try:
        attr = _MountAttr(attr_set=_MOUNT_ATTR_IDMAP | (_MOUNT_ATTR_RDONLY if readonly else 0), userns_fd=userns_fd)
        _check(_libc.syscall(_SYS_MOUNT_SETATTR, fd, b"", _AT_EMPTY_PATH | _AT_RECURSIVE,
                             ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr))),
               f"id-map {what}")
    except BaseException:
        os.close(fd)
        raise
    return fd


def attach(mount_fd: int, point: str) -> None:
    """Mount a detached clone (:func:`clone_idmapped`) on ``point``, in the calling
    process's mount namespace.

    Raises
    ------
    OSError
    """
    _check(_libc.syscall(_SYS_MOVE_MOUNT, mount_fd, b"", _AT_FDCWD, point.encode(), _MOVE_MOUNT_F_EMPTY_PATH),
           f"mount on {point}")


def mount_idmapped(source: str, point: str, userns_fd: int) -> None:
    """Clone ``source`` (:func:`clone_idmapped`; a link put in its place since
    :func:`sandbox_kernel.workspace.resolve` is not followed) and mount it on ``point``,
    in the calling process's mount namespace.  Called in a launcher's ``preexec_fn``
    after :func:`private_namespace`.

    Raises
    ------
    OSError
        The host cannot id-map this folder's filesystem (``EINVAL``), among others.
    """
    fd = clone_idmapped(_AT_FDCWD, source, userns_fd)
    try:
        attach(fd, point)
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
    clones : dict of str to int
        A :class:`Folder`'s: point -> its detached clone (:func:`clone_idmapped`, made by
        :func:`stage_folder`), attached by :meth:`mount`; empty: ``owner.source`` is cloned
        by name there.
    protected : dict of str to int
        A :class:`Folder`'s protected subfolders: name (``.git``) -> the point of its own
        read-only clone, which the runtime binds over the workspace's.
    """

    owner: OwnerMap
    userns_fd: int
    clones: dict[str, int] = field(default_factory=dict)
    protected: dict[str, str] = field(default_factory=dict)

    @property
    def point(self) -> str:
        return self.owner.point

    def mount(self) -> None:
        """In a launcher's ``preexec_fn``, already in a private mount namespace."""
        if not self.clones:
            mount_idmapped(self.owner.source, self.owner.point, self.userns_fd)
        for point, fd in self.clones.items():
            attach(fd, point)

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
        """The parent's fds (the clones stay mounted where the launcher attached them)."""
        for fd in [self.userns_fd, *self.clones.values()]:
            with contextlib.suppress(OSError):
                os.close(fd)


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


def restage(state_dir: Path, folder: Folder | None = None) -> Staged | None:
    """The recorded mapping of a sandbox (:func:`stage`, :func:`stage_folder`), made again
    for ``runsc restore``; None when it has none.  The record lies in the state directory,
    which only the proxy's user writes (0700 or 0711 root's).  A folder the sandbox
    service mapped is mapped again from ``folder`` (its owner's fds, kept by the service
    for the sandbox's life) only: never from a name.

    Raises
    ------
    SandboxStartError
        No user namespace, or a service's folder without its fds (a service started
        again since the sandbox was made, and no fd came with the restore): not
        restored, the checkpoint is kept.
    """
    rec = _record(state_dir)
    if rec is None:
        return None
    if rec.get("folder"):
        if folder is None:
            raise SandboxStartError(
                "the sandbox's workspace folder was passed by its owner's proxy to the sandbox service, which "
                "no longer holds it (the service was started again since) and was not given it again with the "
                "restore: it is not mapped again by name, so the sandbox is not restored (its checkpoint is kept)")
        return stage_folder(Path(state_dir), folder)
    try:
        fd = mapping_userns(int(rec["uid"]), int(rec["gid"]))
    except OSError as err:
        raise SandboxStartError(f"cannot map the workspace {rec['source']} again: {err}") from err
    return Staged(OwnerMap(str(rec["source"]), str(rec["point"]), int(rec["uid"]), int(rec["gid"])), fd)


def folder_record(state_dir: Path) -> dict | None:
    """The record of a workspace mapped from a :class:`Folder` (``uid``, ``gid``, ``rw`` and
    the folder's ``dev`` and ``ino``), or None: none, or one mapped by name."""
    rec = _record(state_dir)
    return rec if rec is not None and rec.get("folder") else None


def _record(state_dir: Path) -> dict | None:
    """The sandbox's mapping record (:func:`stage`, :func:`stage_folder`), or None."""
    try:
        rec = json.loads((Path(state_dir) / RECORD).read_text())
    except (OSError, ValueError):
        return None
    return rec if isinstance(rec, dict) else None


@dataclass
class Folder:
    """A workspace folder as the sandbox service holds it: opened by its owner's proxy
    (``O_RDONLY | O_DIRECTORY | O_NOFOLLOW``, passed with ``SCM_RIGHTS``) and checked
    owned by the peer (:func:`.service.peers.peer_folder`); never a name root resolves.
    Kept for the sandbox's life, so a restore maps the same folder again (a service
    started again takes it from the restore request: :func:`.service.peers.folder_again`).

    Attributes
    ----------
    fd : int
    uid, gid : int
        The peer's (``SO_PEERCRED``): its files on disk are the sandbox user's.
    rw : bool
        ``workspace=rw`` (else the clone is read-only on the host too).
    protected : dict of str to int
        With ``rw``: :data:`.layout.PROTECTED_SUBDIRS` that are directories, opened by
        the service below ``fd`` (``O_PATH | O_NOFOLLOW``), each bound read-only.
    """

    fd: int
    uid: int
    gid: int
    rw: bool
    protected: dict[str, int] = field(default_factory=dict)

    @classmethod
    def open_protected(cls, fd: int, uid: int, gid: int, rw: bool) -> Folder:
        """A folder of ``fd`` (now the returned one's), its protected subfolders opened
        relative to it without following links (a link or a non-directory is left: the
        sandbox resolves it in its own tree, where nothing of the host is)."""
        protected = {}
        for name in PROTECTED_SUBDIRS if rw else ():
            with contextlib.suppress(OSError):  # absent, a link (ELOOP) or not a directory
                protected[name] = os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                                          dir_fd=fd)
        return cls(fd, uid, gid, rw, protected)

    def close(self) -> None:
        """Close the fds (once: a second call does nothing)."""
        for fd in [self.fd, *self.protected.values()]:
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self.fd, self.protected = -1, {}


def stage_folder(state_dir: Path, folder: Folder) -> Staged:
    """The sandbox service's :func:`stage`: ``folder``'s owner mapped onto the sandbox user
    (host root's creates landing as :data:`NO_ACCOUNT_ID`), its clones made now in this
    process from the fds (:func:`clone_idmapped`), staged at ``<state_dir>/workspace`` and
    ``<state_dir>/protected/<name>`` (root's, 0755) and recorded (:data:`RECORD`, no path
    of the folder in it).  Blocking.

    Raises
    ------
    SandboxStartError
        The folder cannot be id-mapped here (its filesystem, or a mount of another
        namespace): refused, never bound as it is (that would be root's bind of a
        user's folder).
    """
    point = Path(state_dir) / "workspace"
    points = {point: folder.fd, **{Path(state_dir) / "protected" / n: fd for n, fd in folder.protected.items()}}
    for p in points:
        p.mkdir(mode=0o755, parents=True, exist_ok=True)
        os.chmod(p, 0o755)  # noqa: S103 - an empty mount point, traversed by the sandbox user
    owner = OwnerMap("", str(point), folder.uid, folder.gid)
    try:
        userns = mapping_userns(folder.uid, folder.gid, NO_ACCOUNT_ID)
    except OSError as err:
        raise SandboxStartError(f"cannot map the workspace onto the sandbox user (a user namespace for an "
                                f"id-mapped mount: {err})") from err
    staged = Staged(owner, userns, protected={n: str(Path(state_dir) / "protected" / n) for n in folder.protected})
    try:
        for p, fd in points.items():
            staged.clones[str(p)] = clone_idmapped(fd, "", userns, readonly=p != point or not folder.rw)
    except OSError as err:
        staged.close()
        raise SandboxStartError(
            f"the workspace folder cannot be id-mapped here ({err}): the sandbox service binds a user's folder "
            "only through an id-mapped mount (its filesystem must support one: not NFS, and it must be a mount of "
            "the host's namespace); run this kernel with --workspace none, or without the service "
            "(--LocalBackend.service_socket='')") from err
    st = os.fstat(folder.fd)
    (Path(state_dir) / RECORD).write_text(json.dumps({**owner.as_dict(), "folder": True, "rw": folder.rw,
                                                      "dev": st.st_dev, "ino": st.st_ino}))
    return staged
