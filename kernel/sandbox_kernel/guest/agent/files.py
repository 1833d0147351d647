"""File transfer inside the sandbox: the host's ``file`` frames (``sandbox_kernel/files.py``
is the host side).

Runs in the agent process only.
"""

from __future__ import annotations

import base64
import contextlib
import os
import uuid

#: Bytes of file data per ``file_data`` frame (base64 in the frame).
FILE_CHUNK_BYTES = 1 << 20
#: Entries one ``list`` returns at most (``truncated`` says when there were more).
FILE_LIST_MAX = 10_000


class FileOpError(Exception):
    """A refused file operation: ``ename`` is the builtin exception it maps to on the host."""

    def __init__(self, ename: str, text: str):
        super().__init__(text)
        self.ename = ename


def _kind(mode: int) -> str:
    import stat

    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "directory"
    if stat.S_ISLNK(mode):
        return "symlink"
    return "other"


class FileOps:
    """Upload, download, list, stat and remove inside the sandbox's writable areas.

    Paths are relative to the interpreter's working directory or absolute under
    one of ``roots``; ``..``, symlinks (in any component: each is opened with
    ``O_NOFOLLOW`` from ``/``) and special files are refused.  Files the agent
    creates belong to the interpreter's user (``owner``).  Every answer is a
    ``file`` frame (``ok``, ``error``/``ename`` or ``result``); a download sends
    ``file_data`` frames first, then its size and SHA-256.
    """

    def __init__(self, emit, cwd: str, roots: tuple[str, ...], hidden: tuple[str, ...],
                 owner: tuple[int, int] | None):
        self.emit = emit
        self.cwd = cwd
        self.roots = roots
        self.hidden = hidden
        self.owner = owner
        self.uploads: dict[str, dict] = {}

    def handle(self, frame: dict) -> None:
        fid = str(frame.get("id", ""))[:64]
        action = frame.get("action")
        try:
            handler = getattr(self, f"do_{action}", None) if isinstance(action, str) else None
            if handler is None:
                raise FileOpError("ValueError", f"unknown file action {str(action)[:40]!r}")
            result = handler(fid, frame)
        except FileOpError as err:
            self.emit("file", id=fid, ok=False, ename=err.ename, error=str(err))
        except OSError as err:
            self.emit("file", id=fid, ok=False, ename=type(err).__name__,
                      error=f"{os.strerror(err.errno) if err.errno else err}: {frame.get('path', '')!r}")
        except Exception as err:  # noqa: BLE001 - never let a request end the agent
            self.emit("file", id=fid, ok=False, ename="OSError", error=f"{type(err).__name__}: {err}")
        else:
            if result is not None:
                self.emit("file", id=fid, ok=True, result=result)

    # ---- paths ------------------------------------------------------------

    def _full(self, path) -> str:
        if not isinstance(path, str) or not path or "\0" in path or len(path) > 4096:
            raise FileOpError("ValueError", "a path must be a non-empty string")
        if ".." in path.split("/"):
            raise FileOpError("PermissionError", f"{path!r}: '..' is not allowed")
        full = os.path.normpath(path if path.startswith("/") else os.path.join(self.cwd, path))
        inside = any(full == r or full.startswith(r.rstrip("/") + "/") for r in self.roots)
        if not inside or any(full == h or full.startswith(h + "/") for h in self.hidden):
            raise FileOpError("PermissionError", f"{path!r} is outside the sandbox's writable areas "
                              f"({', '.join(self.roots)})")
        return full

    def _parent(self, path, make: bool = False) -> tuple[int, str, str]:
        """``(dir fd, name, full path)``: the parent opened component by component
        without following any symlink; ``make``: missing folders are made on the way
        (an upload into ``new dir/sub/``), owned as uploaded files are."""
        full = self._full(path)
        parts = [p for p in full.split("/") if p]
        if not parts:
            raise FileOpError("PermissionError", f"{path!r} is outside the sandbox's writable areas")
        fd = os.open("/", os.O_RDONLY | os.O_DIRECTORY)
        try:
            for i, part in enumerate(parts[:-1]):
                flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
                try:
                    try:
                        nfd = os.open(part, flags, dir_fd=fd)
                    except FileNotFoundError:
                        if not make:
                            raise
                        with contextlib.suppress(FileExistsError):  # made meanwhile: opened below
                            os.mkdir(part, 0o755, dir_fd=fd)  # a name that exists (a symlink too) is left
                        nfd = os.open(part, flags, dir_fd=fd)
                        if self.owner is not None:
                            os.fchown(nfd, *self.owner)
                except OSError as err:
                    import errno

                    if err.errno in (errno.ELOOP, errno.ENOTDIR):
                        where = "/" + "/".join(parts[:i + 1])
                        raise FileOpError("PermissionError", f"{path!r}: {where} is a symlink or not a "
                                          "directory; symlinks are not followed") from None
                    raise
                os.close(fd)
                fd = nfd
        except BaseException:
            os.close(fd)
            raise
        return fd, parts[-1], full

    def _lstat(self, dfd: int, name: str, path):
        try:
            return os.stat(name, dir_fd=dfd, follow_symlinks=False)
        except FileNotFoundError:
            raise FileOpError("FileNotFoundError", f"{path!r} does not exist in the sandbox") from None

    @staticmethod
    def _describe(st) -> dict:
        return {"type": _kind(st.st_mode), "size": st.st_size, "mtime": st.st_mtime,
                "mode": st.st_mode & 0o7777}

    # ---- actions ------------------------------------------------------------

    def do_stat(self, fid: str, frame: dict) -> dict:
        dfd, name, full = self._parent(frame.get("path"))
        try:
            return {"path": full, **self._describe(self._lstat(dfd, name, frame.get("path")))}
        finally:
            os.close(dfd)

    def do_list(self, fid: str, frame: dict) -> dict:
        path = frame.get("path") or "."
        if os.path.normpath(path if path.startswith("/") else os.path.join(self.cwd, path)) == "/":
            raise FileOpError("PermissionError", "'/' is outside the sandbox's writable areas")
        dfd, name, full = self._parent(path)
        try:
            fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dfd)
        except OSError as err:
            import errno

            if err.errno in (errno.ELOOP, errno.ENOTDIR):
                raise FileOpError("NotADirectoryError", f"{path!r} is not a directory (symlinks are "
                                  "not followed)") from None
            raise
        finally:
            os.close(dfd)
        entries: list[dict] = []
        truncated = False
        try:
            with os.scandir(fd) as it:
                for e in it:
                    if len(entries) >= FILE_LIST_MAX:
                        truncated = True
                        break
                    try:
                        entries.append({"name": e.name, **self._describe(e.stat(follow_symlinks=False))})
                    except OSError:
                        continue
        finally:
            os.close(fd)
        entries.sort(key=lambda d: d["name"])
        return {"path": full, "entries": entries, "truncated": truncated}

    def do_remove(self, fid: str, frame: dict) -> dict:
        dfd, name, full = self._parent(frame.get("path"))
        try:
            st = self._lstat(dfd, name, frame.get("path"))
            kind = _kind(st.st_mode)
            if kind == "directory":
                os.rmdir(name, dir_fd=dfd)
            elif kind == "file":
                os.unlink(name, dir_fd=dfd)
            else:
                raise FileOpError("PermissionError", f"{frame.get('path')!r} is a {kind}; only regular "
                                  "files and empty directories are removed")
        finally:
            os.close(dfd)
        return {"path": full, "removed": kind}

    def do_mkdir(self, fid: str, frame: dict) -> dict:
        dfd, name, full = self._parent(frame.get("path"))
        try:
            try:
                os.mkdir(name, 0o755, dir_fd=dfd)
                if self.owner is not None:
                    os.chown(name, *self.owner, dir_fd=dfd, follow_symlinks=False)
            except FileExistsError:
                st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
                if _kind(st.st_mode) != "directory":
                    raise FileOpError("FileExistsError", f"{frame.get('path')!r} exists and is a "
                                      f"{_kind(st.st_mode)}") from None
        finally:
            os.close(dfd)
        return {"path": full}

    def do_get(self, fid: str, frame: dict) -> dict:
        import hashlib
        import stat

        limit = int(frame.get("max_bytes", 0))
        dfd, name, full = self._parent(frame.get("path"))
        try:
            try:
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dfd)
            except FileNotFoundError:
                raise FileOpError("FileNotFoundError", f"{frame.get('path')!r} does not exist in the "
                                  "sandbox") from None
            except OSError as err:
                import errno

                if err.errno == errno.ELOOP:
                    raise FileOpError("PermissionError", f"{frame.get('path')!r} is a symlink; symlinks "
                                      "are not followed") from None
                raise
        finally:
            os.close(dfd)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise FileOpError("PermissionError", f"{frame.get('path')!r} is a {_kind(st.st_mode)}, "
                                  "not a regular file")
            if st.st_size > limit:
                raise FileOpError("FileTooLarge", f"{frame.get('path')!r} is {st.st_size} bytes, over "
                                  f"the transfer limit of {limit} bytes")
            digest, offset = hashlib.sha256(), 0
            while True:
                data = os.read(fd, FILE_CHUNK_BYTES)
                if not data:
                    break
                if offset + len(data) > limit:
                    raise FileOpError("FileTooLarge", f"{frame.get('path')!r} grew over the transfer "
                                      f"limit of {limit} bytes while it was read")
                digest.update(data)
                self.emit("file_data", id=fid, offset=offset, data=base64.b64encode(data).decode("ascii"))
                offset += len(data)
        finally:
            os.close(fd)
        return {"path": full, "size": offset, "sha256": digest.hexdigest()}

    def do_put_open(self, fid: str, frame: dict) -> dict:
        import hashlib

        if fid in self.uploads:
            raise FileOpError("ValueError", f"upload {fid!r} is already open")
        dfd, name, full = self._parent(frame.get("path"), make=True)
        try:
            try:
                st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            except FileNotFoundError:
                st = None
            if st is not None and _kind(st.st_mode) != "file":
                raise FileOpError("PermissionError", f"{frame.get('path')!r} exists and is a "
                                  f"{_kind(st.st_mode)}; only regular files are replaced")
            if st is not None and not frame.get("overwrite", True):
                raise FileOpError("FileExistsError", f"{frame.get('path')!r} exists (overwrite=False)")
            tmp = f".{name[:200]}.sk-upload-{uuid.uuid4().hex[:8]}"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644, dir_fd=dfd)
            if self.owner is not None:
                os.fchown(fd, *self.owner)
            if isinstance(frame.get("mode"), int):
                os.fchmod(fd, frame["mode"] & 0o777)
        except BaseException:
            os.close(dfd)
            raise
        self.uploads[fid] = {"fd": fd, "dfd": dfd, "name": name, "tmp": tmp, "full": full, "size": 0,
                             "sha": hashlib.sha256(), "limit": int(frame.get("size", 0)), "error": None}
        return {"path": full}

    def do_put_data(self, fid: str, frame: dict) -> None:
        up = self.uploads.get(fid)
        if up is None or up["error"] is not None:
            return None
        data = base64.b64decode(frame.get("data", ""))
        if int(frame.get("offset", -1)) != up["size"] or up["size"] + len(data) > up["limit"]:
            up["error"] = ("ValueError", "chunks out of order or over the announced size")
            return None
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(up["fd"], view):]
        except OSError as err:
            up["error"] = (type(err).__name__, f"{os.strerror(err.errno) if err.errno else err}: "
                           f"{up['full']!r}")
            return None
        up["sha"].update(data)
        up["size"] += len(data)
        return None

    def do_put_close(self, fid: str, frame: dict) -> dict:
        up = self.uploads.pop(fid, None)
        if up is None:
            raise FileOpError("ValueError", f"no upload {fid!r} is open")
        ok = False
        try:
            if up["error"] is not None:
                raise FileOpError(*up["error"])
            if up["size"] != frame.get("size") or up["sha"].hexdigest() != frame.get("sha256"):
                raise FileOpError("ValueError", f"upload of {up['full']!r}: {up['size']} bytes "
                                  "written, not what the host sent")
            os.fsync(up["fd"])
            os.rename(up["tmp"], up["name"], src_dir_fd=up["dfd"], dst_dir_fd=up["dfd"])
            ok = True
        finally:
            os.close(up["fd"])
            if not ok:
                try:
                    os.unlink(up["tmp"], dir_fd=up["dfd"])
                except OSError:
                    pass
            os.close(up["dfd"])
        return {"path": up["full"], "size": up["size"], "sha256": up["sha"].hexdigest()}

    def do_put_abort(self, fid: str, frame: dict) -> dict:
        up = self.uploads.get(fid)
        if up is not None:
            up["error"] = ("ValueError", "aborted by the host")
            try:
                self.do_put_close(fid, frame)
            except FileOpError:
                pass
        return {"aborted": True}
