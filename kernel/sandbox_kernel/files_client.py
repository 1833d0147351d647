"""A host-side client of the ``sandbox_kernel.files`` comm, over ``jupyter_client``.

Upload, download, list, stat and remove files in a sandbox-kernel's sandbox
from anything holding a blocking ``jupyter_client`` kernel client::

    from jupyter_client.manager import KernelManager
    from sandbox_kernel import files_client

    km = KernelManager(kernel_name="sandbox-local"); km.start_kernel()
    kc = km.client(); kc.start_channels(); kc.wait_for_ready()
    files_client.upload(kc, "data.bin", b"...")          # or a local path
    files_client.download(kc, "out.png", "out.png")      # checked, then renamed into place
    files_client.list_files(kc, ".")

Requests go on the **control** channel, so they are served while a cell runs;
answers come on IOPub.  A client reads (and drops) IOPub messages that are not
its own answers while it waits: when another part of the program reads that
client's IOPub, give it a client of its own made by :func:`own_client`.  Not a
plain second ``km.client()``: it copies the manager's session id, which
jupyter_client also uses as the ZMQ identity of its sockets and as the prefix
of its msg_ids (with a counter of its own from 0), and once such a second
client has come and gone the first client's cells get no answer (seen with the
stock ipykernel too).
Message shapes: ``docs/files.md``.
"""

from __future__ import annotations

import hashlib
import os
import queue
import tempfile
import time
import uuid
from typing import Any

from .files import FileTransferError

#: The comm target (:data:`sandbox_kernel.files_comm.TARGET`).
TARGET = "sandbox_kernel.files"
#: Default seconds to wait for one answer.
TIMEOUT_S = 300.0
_BUILTINS: dict[str, type[Exception]] = {
    "FileNotFoundError": FileNotFoundError, "FileExistsError": FileExistsError,
    "PermissionError": PermissionError, "IsADirectoryError": IsADirectoryError,
    "NotADirectoryError": NotADirectoryError, "ValueError": ValueError,
}


class FilesClient:
    """One ``sandbox_kernel.files`` comm on a kernel client.

    Parameters
    ----------
    kc : jupyter_client.BlockingKernelClient
        Started (``start_channels``) and connected to a sandbox-kernel.
    timeout : float
        Seconds to wait for each answer.

    Raises
    ------
    TimeoutError
        If the kernel does not greet the comm (it is not a sandbox-kernel).
    """

    def __init__(self, kc: Any, timeout: float = TIMEOUT_S):
        self.kc = kc
        self.timeout = timeout
        self.comm_id = uuid.uuid4().hex
        msg_id = self._send("comm_open", {"comm_id": self.comm_id, "target_name": TARGET, "data": {}})
        hello, _ = self._wait(msg_id, lambda d: d.get("kind") == "hello")
        self.chunk_bytes = int(hello.get("chunk_bytes") or 1 << 20)
        #: Largest file the kernel moves, bytes (its ``max_file_transfer_bytes``).
        self.max_bytes = int(hello.get("max_bytes") or 0)

    # ---- the operations ------------------------------------------------------------------

    def upload(self, remote_path: str, source: bytes | str | os.PathLike, *,
               overwrite: bool = True) -> dict[str, Any]:
        """Write ``source`` (bytes, or a local file's path) to ``remote_path`` in the sandbox.

        ``remote_path`` is relative to the interpreter's working directory (the
        workspace, else the sandbox's home) or absolute in a writable area.

        Returns
        -------
        dict
            ``path`` (inside the sandbox), ``size`` (bytes), ``sha256`` (hex).

        Raises
        ------
        FileNotFoundError, PermissionError, FileExistsError, ValueError
            As the sandbox refused (a path outside its writable areas, a symlink,
            a read-only workspace, ``overwrite=False`` on an existing file...).
        FileTransferError
            Over the size limit (``ename`` ``FileTooLarge``) or a failed transfer.
        """
        rid = uuid.uuid4().hex
        if isinstance(source, (bytes, bytearray, memoryview)):
            blob = bytes(source)
            data: bytes | None = blob
            size = len(blob)
        else:
            data, size = None, os.path.getsize(source)
        self._request({"op": "upload_begin", "id": rid, "path": remote_path, "size": size,
                       "overwrite": overwrite})
        digest = hashlib.sha256()
        offset = 0
        f = open(source, "rb") if data is None else None
        try:
            while offset < size:
                chunk = data[offset:offset + self.chunk_bytes] if data is not None else \
                    f.read(self.chunk_bytes)  # type: ignore[union-attr]
                if not chunk:
                    break
                digest.update(chunk)
                self._send("comm_msg", {"comm_id": self.comm_id,
                                        "data": {"op": "upload_chunk", "id": rid, "offset": offset}},
                           [chunk])
                offset += len(chunk)
        finally:
            if f is not None:
                f.close()
        return self._request({"op": "upload_end", "id": rid, "sha256": digest.hexdigest()})

    def download(self, remote_path: str, local_path: str | os.PathLike | None = None) -> Any:
        """Read ``remote_path`` from the sandbox.

        Parameters
        ----------
        local_path : str, optional
            Where to write it.  The bytes go to a temporary file beside it,
            renamed into place only once their size and SHA-256 match the
            kernel's account; on any failure nothing is left there.

        Returns
        -------
        bytes or dict
            The bytes; with ``local_path``, ``path``, ``size`` and ``sha256``.

        Raises
        ------
        FileNotFoundError, PermissionError
            As the sandbox refused (missing, a symlink, a special file...).
        FileTransferError
            Over the size limit, or bytes that do not add up (nothing is kept).
        """
        rid = uuid.uuid4().hex
        msg_id = self._send("comm_msg", {"comm_id": self.comm_id,
                                         "data": {"op": "download", "id": rid, "path": remote_path}})
        digest, size = hashlib.sha256(), 0
        parts: list[bytes] = []
        out, tmp = None, None
        if local_path is not None:
            folder = os.path.dirname(os.path.abspath(local_path))
            fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(local_path)}.part-")
            out = os.fdopen(fd, "wb")
        ok = False
        try:
            while True:
                reply, buffers = self._wait(msg_id, lambda d: d.get("id") == rid)
                if reply.get("kind") == "chunk":
                    chunk = b"".join(bytes(b) for b in buffers)
                    if reply.get("offset") != size:
                        raise FileTransferError(f"download of {remote_path!r}: a chunk out of order")
                    digest.update(chunk)
                    size += len(chunk)
                    if out is not None:
                        out.write(chunk)
                    else:
                        parts.append(chunk)
                    continue
                result = check_reply(reply)
                if result.get("size") != size or result.get("sha256") != digest.hexdigest():
                    raise FileTransferError(f"download of {remote_path!r}: {size} bytes received do not "
                                            "match the kernel's size and SHA-256; nothing was kept")
                break
            if out is None:
                ok = True
                return b"".join(parts)
            out.flush()
            os.fsync(out.fileno())
            out.close()
            assert tmp is not None and local_path is not None
            os.replace(tmp, local_path)
            ok = True
            return {"path": os.fspath(local_path), "size": size, "sha256": digest.hexdigest()}
        finally:
            if out is not None and not out.closed:
                out.close()
            if tmp is not None and not ok:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass

    def list_files(self, path: str = ".") -> dict[str, Any]:
        """Directory ``path``'s entries: ``{"path", "entries": [{"name", "type", "size",
        "mtime", "mode"}...], "truncated"}``; ``type`` is file, directory, symlink or other."""
        return self._request({"op": "list", "path": path})

    def stat(self, path: str) -> dict[str, Any]:
        """``{"path", "type", "size", "mtime", "mode"}`` of ``path`` (a symlink is not followed)."""
        return self._request({"op": "stat", "path": path})["stat"]

    def remove(self, path: str) -> dict[str, Any]:
        """Remove a regular file or an empty directory; ``{"path", "removed"}``."""
        return self._request({"op": "remove", "path": path})

    def sync(self) -> dict[str, Any]:
        """Copy the sandbox's changes to the workspace back to the host folder now (E2B and
        Modal with ``workspace=rw``; a mounted workspace needs none).

        Returns
        -------
        dict
            ``files``: one ``{"path", "action", "detail"}`` per file, ``action``
            being ``updated``, ``created``, ``kept-both`` (the host file changed
            meanwhile; ``detail`` names the sandbox's version beside it) or ``skipped``.
        """
        return self._request({"op": "sync", "id": uuid.uuid4().hex})

    def close(self) -> None:
        """Close the comm (an unfinished upload is dropped)."""
        self._send("comm_close", {"comm_id": self.comm_id, "data": {}})

    def __enter__(self) -> FilesClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- messages ------------------------------------------------------------------------

    def _send(self, msg_type: str, content: dict, buffers: list[bytes] | None = None) -> str:
        msg = self.kc.session.msg(msg_type, content)
        # Clients made by one KernelManager (``km.client()``) copy its Session with the same
        # session id and a counter of their own from 0: their msg_ids collide, and answers
        # would match another client's request.  A random id cannot.
        msg["header"]["msg_id"] = msg["msg_id"] = uuid.uuid4().hex
        self.kc.session.send(self.kc.control_channel.socket, msg, buffers=buffers)
        return str(msg["header"]["msg_id"])

    def _request(self, data: dict[str, Any]) -> dict[str, Any]:
        msg_id = self._send("comm_msg", {"comm_id": self.comm_id, "data": data})
        reply, _ = self._wait(msg_id, lambda d: d.get("kind") == "reply" and d.get("id") == data["id"]
                              if "id" in data else d.get("kind") == "reply")
        return check_reply(reply)

    def _wait(self, msg_id: str, match: Any) -> tuple[dict[str, Any], list]:
        """The next IOPub ``comm_msg`` on this comm, parented to ``msg_id``, whose data ``match``es."""
        deadline = time.monotonic() + self.timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no answer from the kernel's {TARGET} comm in {self.timeout:.0f} s")
            try:
                m = self.kc.get_iopub_msg(timeout=min(left, 1.0))
            except queue.Empty:
                continue
            if (m["msg_type"] == "comm_msg" and m["parent_header"].get("msg_id") == msg_id
                    and m["content"].get("comm_id") == self.comm_id):
                data = m["content"].get("data") or {}
                if match(data):
                    return data, list(m.get("buffers") or [])


def own_client(km: Any) -> Any:
    """A blocking client of ``km``'s kernel with a session of its own (its own ZMQ
    identities and msg_ids), only its control and IOPub channels started: what a
    :class:`FilesClient` needs beside another client.  Stop it with ``stop_channels()``.

    Parameters
    ----------
    km : jupyter_client.KernelManager
    """
    from jupyter_client.session import Session

    kc = km.client()
    kc.session = Session(key=km.session.key, signature_scheme=km.session.signature_scheme,
                         username=km.session.username)
    kc.start_channels(shell=False, stdin=False, hb=False)
    return kc


def check_reply(reply: dict[str, Any]) -> dict[str, Any]:
    """A reply's fields, or its error raised (a builtin where one fits)."""
    if reply.get("status") == "ok":
        return {k: v for k, v in reply.items() if k not in ("kind", "id", "status")}
    ename, evalue = str(reply.get("ename", "FileTransferError")), str(reply.get("evalue", ""))
    if ename in _BUILTINS:
        raise _BUILTINS[ename](evalue)
    raise FileTransferError(evalue, ename)


# ---- one-call functions ----------------------------------------------------------------------


def upload(kc: Any, remote_path: str, source: bytes | str | os.PathLike, *, overwrite: bool = True,
           timeout: float = TIMEOUT_S) -> dict[str, Any]:
    """:meth:`FilesClient.upload` on a comm opened for this call."""
    with FilesClient(kc, timeout) as fc:
        return fc.upload(remote_path, source, overwrite=overwrite)


def download(kc: Any, remote_path: str, local_path: str | os.PathLike | None = None, *,
             timeout: float = TIMEOUT_S) -> Any:
    """:meth:`FilesClient.download` on a comm opened for this call."""
    with FilesClient(kc, timeout) as fc:
        return fc.download(remote_path, local_path)


def list_files(kc: Any, path: str = ".", *, timeout: float = TIMEOUT_S) -> dict[str, Any]:
    """:meth:`FilesClient.list_files` on a comm opened for this call."""
    with FilesClient(kc, timeout) as fc:
        return fc.list_files(path)


def stat(kc: Any, path: str, *, timeout: float = TIMEOUT_S) -> dict[str, Any]:
    """:meth:`FilesClient.stat` on a comm opened for this call."""
    with FilesClient(kc, timeout) as fc:
        return fc.stat(path)


def remove(kc: Any, path: str, *, timeout: float = TIMEOUT_S) -> dict[str, Any]:
    """:meth:`FilesClient.remove` on a comm opened for this call."""
    with FilesClient(kc, timeout) as fc:
        return fc.remove(path)
