"""File transfer through the kernel's file comm (``sandbox_kernel.files``): the one call site.

Every file verb of the client and of the MCP server comes through
:class:`FileComm`, which speaks the comm's messages (``docs/files.md``) over
the client's own connection: ``comm_open``/``comm_msg`` on the control
channel (served while a cell runs), answers as IOPub ``comm_msg`` parented to
the request, file bytes as binary message buffers.  The proxy answers the
comm itself and moves the bytes through the sandbox's agent; there is no
fallback that runs base64 code in the user's namespace (that would be cell
code the user did not write, and its output would fill the cell's budget).
The blocking twin for a plain ``jupyter_client`` client is
:mod:`sandbox_kernel.files_client`.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
import uuid
from typing import Any

from ..files import FileTransferError
from ..files_client import check_reply

#: The comm target the proxy answers (:data:`sandbox_kernel.files_comm.TARGET`).
FILES_COMM_TARGET = "sandbox_kernel.files"
#: Seconds to wait for one answer.
TIMEOUT_S = 300.0


class FileComm:
    """Upload, download and list files in the sandbox through the file comm.

    The comm is opened on first use and kept for the client's life.

    Parameters
    ----------
    sandbox : AsyncSandbox
        The client whose kernel answers the comm; its transport carries the
        messages and its router hands back the answers.

    Raises
    ------
    NotImplementedError
        From every verb over a transport without binary message buffers (a
        Jupyter Server connection, whose binary WebSocket frames this client
        does not decode yet).
    """

    def __init__(self, sandbox: Any, timeout_s: float = TIMEOUT_S):
        self.sandbox = sandbox
        self.timeout_s = timeout_s
        self.comm_id = ""
        self.chunk_bytes = 1 << 20
        #: Largest file the kernel moves, bytes (its ``max_file_transfer_bytes``); 0 until opened.
        self.max_bytes = 0
        self._lock = asyncio.Lock()

    # ---- the verbs -----------------------------------------------------------------------

    async def upload(self, data: bytes, dest: str) -> dict[str, Any]:
        """Write ``data`` to ``dest`` in the sandbox (relative to the interpreter's
        working directory, or absolute in a writable area).

        Returns
        -------
        dict
            ``path`` (inside), ``size`` (bytes), ``sha256`` (hex), as the kernel checked them.

        Raises
        ------
        FileNotFoundError, PermissionError, FileExistsError, ValueError
            As the sandbox refused (outside its writable areas, a symlink, a read-only workspace).
        FileTransferError
            Over the size limit (``ename`` ``FileTooLarge``) or a failed transfer.
        """
        async with self._lock:
            await self._open()
            rid = uuid.uuid4().hex
            await self._request({"op": "upload_begin", "id": rid, "path": dest, "size": len(data),
                                 "overwrite": True})
            for offset in range(0, len(data), self.chunk_bytes):
                self.sandbox.transport.send("control", self._message(
                    "comm_msg", {"op": "upload_chunk", "id": rid, "offset": offset},
                    [data[offset:offset + self.chunk_bytes]]))
            return await self._request({"op": "upload_end", "id": rid,
                                        "sha256": hashlib.sha256(data).hexdigest()})

    async def download(self, path: str, max_bytes: int | None = None) -> bytes:
        """The bytes of ``path`` in the sandbox, checked against the kernel's size and SHA-256.

        Parameters
        ----------
        max_bytes : int, optional
            Refuse (``ValueError``, before any byte moves) a file larger than this.

        Raises
        ------
        FileNotFoundError, PermissionError, ValueError
            As the sandbox refused, or over ``max_bytes``.
        FileTransferError
            Over the kernel's limit, or bytes that do not add up.
        """
        async with self._lock:
            await self._open()
            if max_bytes is not None:
                size = int((await self._request({"op": "stat", "path": path}))["stat"].get("size", 0))
                if size > max_bytes:
                    raise ValueError(f"{path} is {size} bytes; at most {max_bytes} are read here")
            rid = uuid.uuid4().hex
            queue, msg_id = self._route(self._message("comm_msg", {"op": "download", "id": rid, "path": path}))
            digest, parts, got = hashlib.sha256(), [], 0
            try:
                while True:
                    data, buffers = await self._next(queue, lambda d: d.get("id") == rid)
                    if data.get("kind") != "chunk":
                        result = check_reply(data)
                        break
                    if data.get("offset") != got:
                        raise FileTransferError(f"download of {path!r}: a chunk out of order")
                    chunk = b"".join(bytes(b) for b in buffers)
                    digest.update(chunk)
                    parts.append(chunk)
                    got += len(chunk)
            finally:
                self.sandbox._routes.pop(msg_id, None)
            if result.get("size") != got or result.get("sha256") != digest.hexdigest():
                raise FileTransferError(f"download of {path!r}: {got} bytes received do not match the "
                                        "kernel's size and SHA-256; nothing was kept")
            return b"".join(parts)

    async def list_files(self, path: str) -> list[dict[str, Any]]:
        """Entries of the directory ``path``: ``name``, ``type`` (file, directory, symlink,
        other), ``size`` (bytes), ``mtime`` (seconds since the epoch), ``mode``."""
        async with self._lock:
            await self._open()
            return list((await self._request({"op": "list", "path": path}))["entries"])

    # ---- messages --------------------------------------------------------------------------

    async def _open(self) -> None:
        if self.comm_id:
            return
        if not getattr(self.sandbox.transport, "binary_buffers", False):
            raise NotImplementedError(
                f"file transfer through {self.sandbox.transport.where} is not supported by this client "
                "(it needs binary message buffers, which it does not decode over a Jupyter Server's "
                "WebSocket yet); connect with a kernelspec or a connection file")
        if not self.sandbox.started:
            await self.sandbox.start()
        self.comm_id = uuid.uuid4().hex
        msg = self.sandbox.transport.message("comm_open", {"comm_id": self.comm_id,
                                                           "target_name": FILES_COMM_TARGET, "data": {}})
        queue, msg_id = self._route(msg)
        try:
            self.sandbox.transport.send("control", msg)
            hello, _ = await self._next(queue, lambda d: d.get("kind") == "hello")
        except BaseException:
            self.comm_id = ""
            raise
        finally:
            self.sandbox._routes.pop(msg_id, None)
        self.chunk_bytes = int(hello.get("chunk_bytes") or self.chunk_bytes)
        self.max_bytes = int(hello.get("max_bytes") or 0)

    def _message(self, msg_type: str, data: dict[str, Any], buffers: list[bytes] | None = None) -> dict:
        """A comm message of this comm (not yet sent)."""
        msg = self.sandbox.transport.message(msg_type, {"comm_id": self.comm_id, "data": data})
        if buffers:
            msg["buffers"] = buffers
        return msg

    def _route(self, msg: dict) -> tuple[asyncio.Queue, str]:
        """Register for the answers to ``msg`` (by its ``msg_id``), then send it if it is a comm_msg."""
        msg_id = str(msg["header"]["msg_id"])
        queue: asyncio.Queue = asyncio.Queue()
        self.sandbox._routes[msg_id] = queue
        if msg["header"]["msg_type"] == "comm_msg":
            self.sandbox.transport.send("control", msg)
        return queue, msg_id

    async def _request(self, data: dict[str, Any]) -> dict[str, Any]:
        data = {"id": uuid.uuid4().hex, **data}
        queue, msg_id = self._route(self._message("comm_msg", data))
        try:
            reply, _ = await self._next(queue, lambda d: d.get("kind") == "reply" and d.get("id") == data["id"])
        finally:
            self.sandbox._routes.pop(msg_id, None)
        return check_reply(reply)

    async def _next(self, queue: asyncio.Queue, match: Any) -> tuple[dict[str, Any], list]:
        """The next IOPub ``comm_msg`` of this comm in ``queue`` whose data ``match``es."""
        deadline = time.monotonic() + self.timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no answer from the kernel's {FILES_COMM_TARGET} comm in "
                                   f"{self.timeout_s:.0f} s")
            try:
                channel, m = await asyncio.wait_for(queue.get(), left)
            except TimeoutError:
                continue
            if channel == "client":  # the client was closed, or the kernel went away
                raise FileTransferError(str(m.get("evalue", "the client was closed")), str(m.get("ename")))
            content = m.get("content") or {}
            if (channel == "iopub" and m.get("msg_type") == "comm_msg"
                    and content.get("comm_id") == self.comm_id):
                data = content.get("data") or {}
                if match(data):
                    return data, list(m.get("buffers") or [])

