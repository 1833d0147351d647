"""The client side of the kernel's file comm (``sandbox_kernel.files``), written once.

:class:`FileComm` speaks the comm's messages (``docs/files.md``): ``comm_open``
and ``comm_msg`` on the control channel (served while a cell runs), answers as
IOPub ``comm_msg`` parented to the request, file bytes as binary message
buffers in chunks of the size the kernel's ``hello`` gives, each download
checked against the kernel's size and SHA-256, and the kernel's error names
mapped to Python exceptions (:func:`check_reply`).  It is async and reaches
the kernel through a :class:`CommChannel` of three methods:

- :class:`SandboxChannel`, over :class:`~.sandbox.AsyncSandbox` (the agent
  client ``Sandbox``/``AsyncSandbox`` and the MCP server);
- :class:`KernelClientChannel`, over a blocking ``jupyter_client`` client:
  its :meth:`~KernelClientChannel.next` blocks instead of suspending, so
  :func:`run_blocking` runs :class:`FileComm`'s coroutines to their end with no
  event loop (the blocking facade :class:`sandbox_kernel.files_client.FilesClient`).

The proxy answers the comm itself and moves the bytes through the sandbox's
agent; there is no fallback that runs base64 code in the user's namespace
(that would be cell code the user did not write, and its output would fill
the cell's budget).  Local files are read and written in chunks (a temporary
file renamed into place once checked), never held whole in memory.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import queue
import tempfile
import time
import uuid
from collections.abc import Callable, Coroutine
from typing import IO, Any, Protocol, TypeVar

from ..errors import FileTransferError
from ..files_spec import TARGET

#: The comm target the proxy answers (:data:`sandbox_kernel.files_spec.TARGET`).
FILES_COMM_TARGET = TARGET
#: Default seconds to wait for one answer.
TIMEOUT_S = 300.0
#: The kernel's error names raised as the builtin of that name; any other is a FileTransferError.
_BUILTINS: dict[str, type[Exception]] = {
    "FileNotFoundError": FileNotFoundError, "FileExistsError": FileExistsError,
    "PermissionError": PermissionError, "IsADirectoryError": IsADirectoryError,
    "NotADirectoryError": NotADirectoryError, "ValueError": ValueError,
}

T = TypeVar("T")
Source = bytes | bytearray | memoryview | str | os.PathLike


class CommChannel(Protocol):
    """How :class:`FileComm` reaches the kernel: send on control, read the answers."""

    def send(self, msg_type: str, content: dict[str, Any], buffers: list[bytes] | None = None) -> str:
        """Send a message on the control channel; return its ``msg_id`` (its answers are
        kept for :meth:`next` until :meth:`forget`)."""

    async def next(self, msg_id: str, timeout_s: float) -> dict[str, Any] | None:
        """An incoming message (``{}`` for one not on IOPub), or None if none came in
        ``timeout_s`` seconds.  :class:`FileComm` keeps only its own answers."""

    def forget(self, msg_id: str) -> None:
        """Stop keeping answers to ``msg_id``."""


class FileComm:
    """Upload, download, list, stat and remove files in the sandbox through the file comm.

    The comm is opened on first use (or by :meth:`open`) and kept until :meth:`close`.

    Parameters
    ----------
    channel : CommChannel
        Carries the messages: :class:`SandboxChannel` or :class:`KernelClientChannel`.
    timeout_s : float
        Seconds to wait for each answer.
    """

    def __init__(self, channel: CommChannel, timeout_s: float = TIMEOUT_S):
        self.channel = channel
        self.timeout_s = timeout_s
        self.comm_id = ""
        self.chunk_bytes = 1 << 20
        #: Largest file the kernel moves, bytes (its ``max_file_transfer_bytes``); 0 until opened.
        self.max_bytes = 0
        self._lock = asyncio.Lock()  # bound to no loop until contended: run_blocking may use it

    # ---- the verbs -----------------------------------------------------------------------

    async def upload(self, remote_path: str, source: Source, *, overwrite: bool = True) -> dict[str, Any]:
        """Write ``source`` (bytes, or a local file's path) to ``remote_path`` in the sandbox.

        ``remote_path`` is relative to the interpreter's working directory (the
        workspace, else the sandbox's home) or absolute in a writable area.  A
        local file is read and sent chunk by chunk.

        Returns
        -------
        dict
            ``path`` (inside the sandbox), ``size`` (bytes), ``sha256`` (hex), as the kernel checked them.

        Raises
        ------
        FileNotFoundError, PermissionError, FileExistsError, ValueError
            As the sandbox refused (a path outside its writable areas, a symlink,
            a read-only workspace, ``overwrite=False`` on an existing file...).
        FileTransferError
            Over the size limit (``ename`` ``FileTooLarge``) or a failed transfer.
        """
        async with self._lock:
            await self._open()
            src = _Source(source)
            try:
                rid = uuid.uuid4().hex
                await self._request({"op": "upload_begin", "id": rid, "path": remote_path, "size": src.size,
                                     "overwrite": overwrite})
                digest, offset = hashlib.sha256(), 0
                while offset < src.size:
                    chunk = src.read(offset, self.chunk_bytes)
                    if not chunk:
                        break
                    digest.update(chunk)
                    self.channel.forget(self.channel.send("comm_msg", self._content(
                        {"op": "upload_chunk", "id": rid, "offset": offset}), [chunk]))
                    offset += len(chunk)
            finally:
                src.close()
            return await self._request({"op": "upload_end", "id": rid, "sha256": digest.hexdigest()})

    async def download(self, remote_path: str, local_path: str | os.PathLike | None = None, *,
                       max_bytes: int | None = None) -> Any:
        """Read ``remote_path`` from the sandbox, checked against the kernel's size and SHA-256.

        Parameters
        ----------
        local_path : str, optional
            Where to write it.  The bytes go to a temporary file beside it,
            renamed into place only once their size and SHA-256 match the
            kernel's account; on any failure nothing is left there.
        max_bytes : int, optional
            Refuse (``ValueError``, before any byte moves) a file larger than this.

        Returns
        -------
        bytes or dict
            The bytes; with ``local_path``, ``path``, ``size`` and ``sha256``.

        Raises
        ------
        FileNotFoundError, PermissionError, ValueError
            As the sandbox refused (missing, a symlink, a special file...), or over ``max_bytes``.
        FileTransferError
            Over the kernel's size limit, or bytes that do not add up (nothing is kept).
        """
        async with self._lock:
            await self._open()
            if max_bytes is not None:
                size = int((await self._request({"op": "stat", "path": remote_path}))["stat"].get("size", 0))
                if size > max_bytes:
                    raise ValueError(f"{remote_path} is {size} bytes; at most {max_bytes} are read here")
            rid = uuid.uuid4().hex
            msg_id = self.channel.send("comm_msg", self._content({"op": "download", "id": rid,
                                                                  "path": remote_path}))
            sink = _Sink(local_path)
            try:
                digest, got = hashlib.sha256(), 0
                while True:
                    data, buffers = await self._next(msg_id, lambda d: d.get("id") == rid)
                    if data.get("kind") != "chunk":
                        result = check_reply(data)
                        break
                    if data.get("offset") != got:
                        raise FileTransferError(f"download of {remote_path!r}: a chunk out of order")
                    chunk = b"".join(bytes(b) for b in buffers)
                    digest.update(chunk)
                    got += len(chunk)
                    sink.write(chunk)
                if result.get("size") != got or result.get("sha256") != digest.hexdigest():
                    raise FileTransferError(f"download of {remote_path!r}: {got} bytes received do not "
                                            "match the kernel's size and SHA-256; nothing was kept")
                return sink.keep(got, digest.hexdigest())
            finally:
                self.channel.forget(msg_id)
                sink.discard()

    async def list_files(self, path: str = ".") -> dict[str, Any]:
        """Directory ``path``'s entries: ``{"path", "entries": [{"name", "type", "size",
        "mtime", "mode"}...], "truncated"}``; ``type`` is file, directory, symlink or other."""
        return await self._locked({"op": "list", "path": path})

    async def stat(self, path: str) -> dict[str, Any]:
        """``{"path", "type", "size", "mtime", "mode"}`` of ``path`` (a symlink is not followed)."""
        return dict((await self._locked({"op": "stat", "path": path}))["stat"])

    async def remove(self, path: str) -> dict[str, Any]:
        """Remove a regular file or an empty directory; ``{"path", "removed"}``."""
        return await self._locked({"op": "remove", "path": path})

    async def sync(self) -> dict[str, Any]:
        """Copy the sandbox's changes to the workspace back to the host folder now (E2B and
        Modal with ``workspace=rw``; a mounted workspace needs none).

        Returns
        -------
        dict
            ``files``: one ``{"path", "action", "detail"}`` per file, ``action``
            being ``updated``, ``created``, ``kept-both`` (the host file changed
            meanwhile; ``detail`` names the sandbox's version beside it) or ``skipped``.
        """
        return await self._locked({"op": "sync"})

    async def open(self) -> FileComm:
        """Open the comm now (else on first use); returns self.

        Raises
        ------
        TimeoutError
            If the kernel does not greet the comm (it is not a sandbox-kernel).
        """
        async with self._lock:
            await self._open()
        return self

    def close(self) -> None:
        """Close the comm (an unfinished upload is dropped); the next verb opens another."""
        if self.comm_id:
            self.channel.forget(self.channel.send("comm_close", {"comm_id": self.comm_id, "data": {}}))
            self.comm_id = ""

    # ---- messages --------------------------------------------------------------------------

    async def _open(self) -> None:
        if self.comm_id:
            return
        self.comm_id = uuid.uuid4().hex
        msg_id = self.channel.send("comm_open", {"comm_id": self.comm_id, "target_name": TARGET, "data": {}})
        try:
            hello, _ = await self._next(msg_id, lambda d: d.get("kind") == "hello")
        except BaseException:
            self.comm_id = ""
            raise
        finally:
            self.channel.forget(msg_id)
        self.chunk_bytes = int(hello.get("chunk_bytes") or self.chunk_bytes)
        self.max_bytes = int(hello.get("max_bytes") or 0)

    def _content(self, data: dict[str, Any]) -> dict[str, Any]:
        return {"comm_id": self.comm_id, "data": data}

    async def _locked(self, data: dict[str, Any]) -> dict[str, Any]:
        async with self._lock:
            await self._open()
            return await self._request(data)

    async def _request(self, data: dict[str, Any]) -> dict[str, Any]:
        data = {"id": uuid.uuid4().hex, **data}
        msg_id = self.channel.send("comm_msg", self._content(data))
        try:
            reply, _ = await self._next(msg_id, lambda d: d.get("kind") == "reply" and d.get("id") == data["id"])
        finally:
            self.channel.forget(msg_id)
        return check_reply(reply)

    async def _next(self, msg_id: str, match: Callable[[dict], bool]) -> tuple[dict[str, Any], list]:
        """The next IOPub ``comm_msg`` on this comm, parented to ``msg_id``, whose data ``match``es."""
        deadline = time.monotonic() + self.timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no answer from the kernel's {TARGET} comm in {self.timeout_s:.0f} s")
            m = await self.channel.next(msg_id, left)
            if not m or m.get("msg_type") != "comm_msg" or \
                    (m.get("parent_header") or {}).get("msg_id") != msg_id:
                continue
            content = m.get("content") or {}
            data = content.get("data") or {}
            if content.get("comm_id") == self.comm_id and match(data):
                return data, list(m.get("buffers") or [])


def check_reply(reply: dict[str, Any]) -> dict[str, Any]:
    """A reply's fields, or its error raised (a builtin where one fits, else FileTransferError)."""
    if reply.get("status") == "ok":
        return {k: v for k, v in reply.items() if k not in ("kind", "id", "status")}
    ename, evalue = str(reply.get("ename", "FileTransferError")), str(reply.get("evalue", ""))
    if ename in _BUILTINS:
        raise _BUILTINS[ename](evalue)
    raise FileTransferError(evalue, ename)


class _Source:
    """What an upload sends: bytes, or a local file read chunk by chunk."""

    def __init__(self, source: Source):
        self.blob: memoryview | None = None
        self.f: IO[bytes] | None = None
        if isinstance(source, bytes | bytearray | memoryview):
            self.blob = memoryview(source).cast("B")
            self.size = len(self.blob)
        else:
            self.f = open(source, "rb")
            self.size = os.fstat(self.f.fileno()).st_size

    def read(self, offset: int, n: int) -> bytes:
        if self.blob is not None:
            return bytes(self.blob[offset:offset + n])
        assert self.f is not None
        return self.f.read(n)

    def close(self) -> None:
        if self.f is not None:
            self.f.close()


class _Sink:
    """Where a download's bytes go: memory, or a temporary file beside ``local_path``."""

    def __init__(self, local_path: str | os.PathLike | None):
        self.local_path = local_path
        self.parts: list[bytes] = []
        self.out: IO[bytes] | None = None
        self.tmp: str | None = None
        if local_path is not None:
            folder = os.path.dirname(os.path.abspath(local_path))
            fd, self.tmp = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(local_path)}.part-")
            self.out = os.fdopen(fd, "wb")

    def write(self, chunk: bytes) -> None:
        if self.out is not None:
            self.out.write(chunk)
        else:
            self.parts.append(chunk)

    def keep(self, size: int, sha256: str) -> Any:
        """The bytes, or the file synced and renamed into place (then ``path``, ``size``, ``sha256``)."""
        if self.out is None or self.tmp is None or self.local_path is None:
            return b"".join(self.parts)
        self.out.flush()
        os.fsync(self.out.fileno())
        self.out.close()
        os.replace(self.tmp, self.local_path)
        self.tmp = None
        return {"path": os.fspath(self.local_path), "size": size, "sha256": sha256}

    def discard(self) -> None:
        """Close, and remove the temporary file unless it was kept."""
        if self.out is not None and not self.out.closed:
            self.out.close()
        if self.tmp is not None:
            try:
                os.unlink(self.tmp)
            except OSError:
                pass
            self.tmp = None


# ---- the channels ------------------------------------------------------------------------------


class SandboxChannel:
    """:class:`CommChannel` over an :class:`~.sandbox.AsyncSandbox`'s transport and router."""

    def __init__(self, sandbox: Any):
        self.sandbox = sandbox
        self._queues: dict[str, asyncio.Queue] = {}

    async def ready(self) -> None:
        """Start the sandbox's client if need be.

        Raises
        ------
        NotImplementedError
            Over a transport without binary message buffers (a Jupyter Server
            connection, whose binary WebSocket frames this client does not decode yet).
        """
        if not getattr(self.sandbox.transport, "binary_buffers", False):
            raise NotImplementedError(
                f"file transfer through {self.sandbox.transport.where} is not supported by this client "
                "(it needs binary message buffers, which it does not decode over a Jupyter Server's "
                "WebSocket yet); connect with a kernelspec or a connection file")
        if not self.sandbox.started:
            await self.sandbox.start()

    def send(self, msg_type: str, content: dict[str, Any], buffers: list[bytes] | None = None) -> str:
        msg = self.sandbox.transport.message(msg_type, content)
        if buffers:
            msg["buffers"] = buffers
        msg_id = str(msg["header"]["msg_id"])
        self._queues[msg_id] = self.sandbox.route(msg_id)
        self.sandbox.transport.send("control", msg)
        return msg_id

    async def next(self, msg_id: str, timeout_s: float) -> dict[str, Any] | None:
        try:
            channel, m = await asyncio.wait_for(self._queues[msg_id].get(), timeout_s)
        except TimeoutError:
            return None
        if channel == "client":  # the client was closed, or the kernel went away
            raise FileTransferError(str(m.get("evalue", "the client was closed")), str(m.get("ename")))
        return m if channel == "iopub" else {}

    def forget(self, msg_id: str) -> None:
        if self._queues.pop(msg_id, None) is not None:
            self.sandbox.unroute(msg_id)


class KernelClientChannel:
    """:class:`CommChannel` over a blocking ``jupyter_client`` client (``kc``).

    Its :meth:`next` blocks in ``kc.get_iopub_msg`` and reads (and drops) the
    IOPub messages that are not the comm's answers; :func:`run_blocking`
    drives :class:`FileComm` over it.
    """

    def __init__(self, kc: Any):
        self.kc = kc

    def send(self, msg_type: str, content: dict[str, Any], buffers: list[bytes] | None = None) -> str:
        msg = self.kc.session.msg(msg_type, content)
        # Clients made by one KernelManager (``km.client()``) copy its Session with the same
        # session id and a counter of their own from 0: their msg_ids collide, and answers
        # would match another client's request.  A random id cannot.
        msg["header"]["msg_id"] = msg["msg_id"] = uuid.uuid4().hex
        self.kc.session.send(self.kc.control_channel.socket, msg, buffers=buffers)
        return str(msg["header"]["msg_id"])

    async def next(self, msg_id: str, timeout_s: float) -> dict[str, Any] | None:
        try:
            return dict(self.kc.get_iopub_msg(timeout=min(timeout_s, 1.0)))
        except queue.Empty:
            return None

    def forget(self, msg_id: str) -> None:
        pass


def run_blocking(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro``, a :class:`FileComm` verb over a channel that blocks instead of
    suspending, to its end on this thread (no event loop: it works inside a running one).

    Raises
    ------
    RuntimeError
        If the coroutine suspends after all (its channel is not a blocking one).
    """
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value
    coro.close()
    raise RuntimeError("a blocking file comm's coroutine suspended: use an async channel with an event loop")
