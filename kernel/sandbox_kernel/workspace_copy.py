"""The workspace on backends that cannot mount it (E2B, Modal): a copy in, and back.

At each fresh sandbox the proxy copies the host folder in
(:meth:`WorkspaceCopy.copy_in`, before the first request is relayed) through
the agent's file operations (:class:`~sandbox_kernel.files.FileTransfers`),
the same checked path as the file comm.  With ``workspace=rw`` the files the
sandbox changed or created are copied back on request (the file comm's
``sync``) and at shutdown (:meth:`WorkspaceCopy.copy_back`).

The host side never follows a link: the host folder is read and written
component by component with ``O_NOFOLLOW`` from its resolved root; links in it
are not copied in (they read as missing inside, as with a mount), links and
special files the sandbox made are not copied back.  A host file that changed
since the copy-in is never overwritten: the sandbox's version is written beside
it as ``<name>.sandbox-<time><suffix>`` and the report says so.  Deletions in
the sandbox are not copied back.
"""

from __future__ import annotations

import asyncio
import logging
import os
import stat as stat_mod
import time
from dataclasses import dataclass, field
from typing import Any

from .errors import SandboxKernelError
from .files import FileTransferError, FileTransfers
from .guest import WORKSPACE_DIR
from .policy import Policy
from .workspace import PROTECTED_SUBDIRS

#: Files and directories copied at most, each way.
MAX_ENTRIES = 10_000
#: Bytes read from the host per upload chunk.
READ_BYTES = 1 << 20


class WorkspaceTooLarge(SandboxKernelError, OSError):
    """The workspace is over what a cloud sandbox gets copied (the message says how much)."""


@dataclass
class WorkspaceCopy:
    """One kernel's copied workspace.

    Parameters
    ----------
    files : FileTransfers
    policy : Policy
        Resolved (:func:`sandbox_kernel.workspace.resolve`): ``workspace`` is
        ``ro`` or ``rw`` and ``workspace_path`` the real host folder; the total
        copied is capped at ``max_file_transfer_bytes``.
    log : logging.Logger
    """

    files: FileTransfers
    policy: Policy
    log: logging.Logger
    #: Host state at the copy-in: relative path -> (size, mtime_ns).
    host_seen: dict[str, tuple[int, int]] = field(default_factory=dict)
    #: Sandbox state right after the copy-in: relative path -> (size, mtime).
    sandbox_seen: dict[str, tuple[int, float]] = field(default_factory=dict)
    #: The current sandbox has no copy yet (a fresh one started: :meth:`mark_fresh`).
    needed: bool = True
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def mark_fresh(self) -> None:
        """A fresh sandbox started (the proxy's ``STARTED`` lifecycle event): copy again."""
        self.needed = True

    async def ensure(self) -> None:
        """Copy in once per sandbox; called by the proxy before relaying each request.

        Raises
        ------
        WorkspaceTooLarge, FileTransferError
            Each request is answered with it until it succeeds.
        """
        if not self.needed:
            return
        async with self._lock:
            if self.needed:
                await self.copy_in()
                self.needed = False

    @property
    def root(self) -> str:
        return self.policy.workspace_path

    # ---- in ---------------------------------------------------------------------------

    def plan(self) -> tuple[list[str], list[tuple[str, int, int]]]:
        """The host folder's directories and regular files (``(path, size, mtime_ns)``),
        relative, without following links; links and special files are left out.

        Raises
        ------
        WorkspaceTooLarge
            Over ``max_file_transfer_bytes`` in total or :data:`MAX_ENTRIES` entries.
        """
        dirs: list[str] = []
        found: list[tuple[str, int, int]] = []
        total, queue = 0, [""]
        while queue:
            rel = queue.pop(0)
            with os.scandir(os.path.join(self.root, rel)) as it:
                for e in it:
                    path = os.path.join(rel, e.name)
                    st = e.stat(follow_symlinks=False)
                    if stat_mod.S_ISDIR(st.st_mode):
                        dirs.append(path)
                        queue.append(path)
                    elif stat_mod.S_ISREG(st.st_mode):
                        found.append((path, st.st_size, st.st_mtime_ns))
                        total += st.st_size
                    if total > self.policy.max_file_transfer_bytes or len(dirs) + len(found) > MAX_ENTRIES:
                        raise WorkspaceTooLarge(
                            f"the workspace {self.root} is over what is copied into a "
                            f"{self.files.relay.backend.name} sandbox ({total} bytes so far, limit "
                            f"{self.policy.max_file_transfer_bytes} bytes = max_file_transfer_bytes; "
                            f"at most {MAX_ENTRIES} entries): expose a smaller folder "
                            "(--SandboxKernel.workspace_path) or raise the limit")
        return dirs, found

    async def copy_in(self) -> dict[str, int]:
        """Copy the host folder to :data:`~sandbox_kernel.guest.WORKSPACE_DIR` of a fresh
        sandbox (``ro``: files read-only, mode 0444).  Called by the proxy before the
        first request to each new sandbox.

        Returns
        -------
        dict
            ``files``, ``directories`` and ``bytes`` copied.

        Raises
        ------
        WorkspaceTooLarge, FileTransferError
        """
        dirs, found = self.plan()
        for rel in dirs:
            await self.files.mkdir(f"{WORKSPACE_DIR}/{rel}")
        self.host_seen.clear()
        total = 0
        mode = 0o444 if self.policy.workspace == "ro" else None
        for rel, _, _ in found:
            try:
                fd = _open_host(self.root, rel, os.O_RDONLY)
            except OSError as err:
                self.log.warning("workspace: %s not copied in: %s", rel, err)
                continue
            with os.fdopen(fd, "rb") as f:
                st = os.fstat(f.fileno())
                if not stat_mod.S_ISREG(st.st_mode):
                    continue
                fid = await self.files.upload_open(f"{WORKSPACE_DIR}/{rel}", st.st_size, mode=mode)
                import hashlib

                digest, offset = hashlib.sha256(), 0
                while offset < st.st_size:
                    chunk = f.read(min(READ_BYTES, st.st_size - offset))
                    if not chunk:
                        break
                    digest.update(chunk)
                    await self.files.upload_data(fid, offset, chunk)
                    offset += len(chunk)
                await self.files.upload_close(fid, offset, digest.hexdigest())
                self.host_seen[rel] = (offset, st.st_mtime_ns)
                total += offset
        self.sandbox_seen = {rel: (e["size"], e["mtime"]) for rel, e in (await self._sandbox_tree()).items()
                             if e["type"] == "file"}
        self.log.info("workspace: copied %d files, %d directories, %d bytes into the sandbox",
                      len(self.host_seen), len(dirs), total)
        return {"files": len(self.host_seen), "directories": len(dirs), "bytes": total}

    # ---- back ---------------------------------------------------------------------------

    async def _sandbox_tree(self) -> dict[str, dict[str, Any]]:
        """Every entry under the sandbox's workspace, by relative path (no link followed)."""
        out: dict[str, dict[str, Any]] = {}
        queue = [""]
        while queue and len(out) < MAX_ENTRIES:
            rel = queue.pop(0)
            listing = await self.files.list(f"{WORKSPACE_DIR}/{rel}" if rel else WORKSPACE_DIR)
            for e in listing["entries"]:
                if e["name"] in (".", "..") or "\0" in e["name"]:
                    continue
                path = os.path.join(rel, e["name"])
                out[path] = e
                if e["type"] == "directory":
                    queue.append(path)
        return out

    async def copy_back(self) -> list[dict[str, str]]:
        """Copy what the sandbox changed or created since the copy-in to the host folder
        (``rw`` only).  Called on the file comm's ``sync`` and at shutdown.

        Returns
        -------
        list of dict
            One ``{"path", "action", "detail"}`` per file: ``action`` is
            ``updated``, ``created``, ``kept-both`` (the host file changed
            meanwhile: the sandbox's version is ``detail``) or ``skipped``.
        """
        if self.policy.workspace != "rw":
            return []
        report: list[dict[str, str]] = []
        for rel, e in (await self._sandbox_tree()).items():
            if e["type"] == "directory":
                continue
            if e["type"] == "file" and self.sandbox_seen.get(rel) == (e["size"], e["mtime"]):
                continue  # unchanged in the sandbox
            if rel.split("/")[0] in PROTECTED_SUBDIRS:
                report.append({"path": rel, "action": "skipped", "detail": "never copied back (what "
                               "the host runs on its own, e.g. git hooks)"})
                continue
            if e["type"] != "file":
                report.append({"path": rel, "action": "skipped", "detail": f"a {e['type']} is not copied"})
                continue
            try:
                report.append(await self._bring_back(rel))
            except (OSError, SandboxKernelError) as err:
                report.append({"path": rel, "action": "skipped", "detail": str(err)[:300]})
            self.sandbox_seen[rel] = (e["size"], e["mtime"])
        for r in report:
            self.log.info("workspace sync: %s %s %s", r["action"], r["path"], r["detail"])
        return report

    async def at_shutdown(self, timeout_s: float) -> None:
        """:meth:`copy_back` of a running sandbox at kernel shutdown, within ``timeout_s``
        seconds; a failure is logged (the shutdown goes on)."""
        if self.policy.workspace != "rw" or self.files.relay.state.value != "running":
            return
        try:
            await asyncio.wait_for(self.copy_back(), timeout_s)
        except Exception:  # logged; the sandbox is removed anyway
            self.log.exception("copying the workspace back at shutdown failed")

    async def _bring_back(self, rel: str) -> dict[str, str]:
        parent_rel, name = os.path.split(rel)
        dfd = _open_host_dir(self.root, parent_rel, create=True)
        try:
            try:
                st: os.stat_result | None = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            except FileNotFoundError:
                st = None
            seen = self.host_seen.get(rel)
            unchanged = st is not None and stat_mod.S_ISREG(st.st_mode) and seen == (st.st_size, st.st_mtime_ns)
            if st is None and seen is None:
                final, action = name, "created"
            elif unchanged:
                final, action = name, "updated"
            else:
                stem, dot, suffix = name.rpartition(".")
                stamp = time.strftime("%Y%m%d-%H%M%S")
                final = f"{stem}.sandbox-{stamp}.{suffix}" if dot and stem else f"{name}.sandbox-{stamp}"
                action = "kept-both"
            tmp = f".{name[:200]}.sk-sync-{os.urandom(4).hex()}"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644, dir_fd=dfd)
            ok = False
            try:
                with os.fdopen(fd, "wb") as out:
                    async for _, chunk in self.files.download(f"{WORKSPACE_DIR}/{rel}"):
                        out.write(chunk)
                    out.flush()
                    os.fsync(out.fileno())
                if action == "kept-both":
                    os.link(tmp, final, src_dir_fd=dfd, dst_dir_fd=dfd)  # never replaces a file
                    os.unlink(tmp, dir_fd=dfd)
                else:
                    os.rename(tmp, final, src_dir_fd=dfd, dst_dir_fd=dfd)
                ok = True
            finally:
                if not ok:
                    try:
                        os.unlink(tmp, dir_fd=dfd)
                    except OSError:
                        pass
            new = os.stat(final, dir_fd=dfd, follow_symlinks=False)
            if action != "kept-both":
                self.host_seen[rel] = (new.st_size, new.st_mtime_ns)
            detail = os.path.join(parent_rel, final) if action == "kept-both" else ""
            return {"path": rel, "action": action, "detail": detail}
        finally:
            os.close(dfd)


def _open_host_dir(root: str, rel: str, *, create: bool = False) -> int:
    """A directory under ``root``, opened component by component without following links
    (made when missing with ``create``).

    Raises
    ------
    FileTransferError
        When a component is a link or not a directory.
    """
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        for part in [p for p in rel.split("/") if p]:
            if part in (".", ".."):
                raise FileTransferError(f"{rel!r}: '..' is not allowed", "PermissionError")
            if create:
                try:
                    os.mkdir(part, 0o755, dir_fd=fd)
                except FileExistsError:
                    pass
            try:
                nfd = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            except OSError as err:
                raise FileTransferError(f"{rel!r}: {part} on the host is a link or not a directory "
                                        f"({err.strerror}); not followed", "PermissionError") from None
            os.close(fd)
            fd = nfd
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_host(root: str, rel: str, flags: int) -> int:
    """A file under ``root`` opened with ``flags`` and ``O_NOFOLLOW`` in every component."""
    parent, name = os.path.split(rel)
    dfd = _open_host_dir(root, parent)
    try:
        return os.open(name, flags | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dfd)
    finally:
        os.close(dfd)
