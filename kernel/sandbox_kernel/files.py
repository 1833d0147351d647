"""File transfer with a sandbox, host side: bytes move through the agent, checked.

:class:`FileTransfers` sends the agent ``file`` operations (protocol
:data:`~sandbox_kernel.protocol.FILE_ACTIONS`) and matches its answers by
``id``.  Nothing runs in the user's namespace and nothing passes through the
inner kernel: the agent opens the file itself, inside the sandbox, refusing
``..``, symlinks, special files and paths outside the sandbox's writable areas
(``guest/agent/files.py`` ``FileOps``).  Every operation first makes the sandbox
ready and keeps it so until it ends (:meth:`TransferLink.awake`: a frozen or
checkpointed sandbox is woken, and no idle pause or checkpoint cuts into a transfer),
and never waits for a running cell.

The sandbox is hostile: a download is accepted only if its chunks arrive in
order, stay under the size cap, and their size and SHA-256 equal what the
agent then claims; an upload only if the agent reports the size and SHA-256
the host sent.  Anything else is a :class:`FileTransferError`, and the bytes
received are dropped.

All methods run on the proxy's main asyncio loop.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import itertools
import logging
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from . import protocol
from .errors import FileTransferError, SandboxKernelError  # FileTransferError: also importable here
from .protocol import AgentFrame

if TYPE_CHECKING:
    from .backends.base import SandboxBackend
    from .sandbox_state import SandboxState

#: Bytes per upload frame sent to the agent.
CHUNK_BYTES = 1 << 20
#: Seconds one file operation (or one chunk of a download) may take in the sandbox.
OP_TIMEOUT_S = 120.0
#: Builtin exceptions an agent's ``ename`` may map to; anything else is ``OSError``.
BUILTIN_ERRORS: dict[str, type[Exception]] = {
    "FileNotFoundError": FileNotFoundError, "FileExistsError": FileExistsError,
    "PermissionError": PermissionError, "IsADirectoryError": IsADirectoryError,
    "NotADirectoryError": NotADirectoryError, "ValueError": ValueError, "OSError": OSError,
}


@dataclass
class _Waiter:
    """One operation's answer: the final ``file`` frame, and ``file_data`` chunks before it."""

    done: asyncio.Future = field(default_factory=lambda: asyncio.get_running_loop().create_future())
    chunks: asyncio.Queue = field(default_factory=asyncio.Queue)


class TransferLink(Protocol):
    """What :class:`FileTransfers` uses of the link to its sandbox
    (:class:`~sandbox_kernel.relay.Relay`, which feeds it the agent's file frames)."""

    @property
    def backend(self) -> SandboxBackend:
        """Carries the frames to the agent (``backend.write``)."""

    @property
    def log(self) -> logging.Logger:
        """Where a frame for no transfer is noted."""

    @property
    def state(self) -> SandboxState:
        """The sandbox's state (:class:`~sandbox_kernel.workspace_copy.WorkspaceCopy` copies
        back at shutdown only from a running one)."""

    async def ensure_running(self) -> str | None:
        """Make the sandbox ready (a frozen or checkpointed one is woken) before an operation."""

    def awake(self) -> AbstractAsyncContextManager[str | None]:
        """Wake the sandbox as :meth:`ensure_running` and keep it from idling until the block ends."""


class FileTransfers:
    """The file operations of one kernel's sandbox.

    Parameters
    ----------
    relay : TransferLink
        The relay: its backend carries the frames; :meth:`on_frame` is fed the
        agent's ``file``/``file_data`` frames by it.
    max_bytes : int
        Largest file moved either way, bytes (``max_file_transfer_bytes``).
    """

    def __init__(self, relay: TransferLink, max_bytes: int):
        self.relay = relay
        self.max_bytes = max_bytes
        self._ids = itertools.count(1)
        self._waiters: dict[str, _Waiter] = {}

    # ---- frames from the agent ----------------------------------------------------------

    def on_frame(self, frame: AgentFrame) -> None:
        """An admitted ``file`` or ``file_data`` frame (called by the relay)."""
        w = self._waiters.get(str(frame.body.get("id")))
        if w is None or w.done.done():
            self.relay.log.info("a %s frame for no transfer in progress; dropped", frame.op)
            return
        if frame.op == "file_data":
            w.chunks.put_nowait((frame.body["offset"], frame.buffers[0]))
        else:
            w.done.set_result(frame.body)
            w.chunks.put_nowait(None)

    def fail_all(self, why: str) -> None:
        """The sandbox ended: every operation in progress fails with ``why``."""
        for w in self._waiters.values():
            if not w.done.done():
                w.done.set_exception(FileTransferError(f"the sandbox ended during the transfer: {why}"))
                w.chunks.put_nowait(None)

    # ---- the operations -----------------------------------------------------------------------

    async def _send(self, action: str, fid: str | None = None, **fields: Any) -> str:
        """Send one operation; the caller holds the sandbox awake (``relay.awake()``)."""
        fid = fid or f"f{next(self._ids)}"
        await self.relay.backend.write(protocol.host_op_frame("file", id=fid, action=action, **fields))
        return fid

    async def _call(self, action: str, **fields: Any) -> dict[str, Any]:
        """One operation with one answer; its ``result``."""
        fid = f"f{next(self._ids)}"
        w = self._waiters[fid] = _Waiter()
        try:
            async with self.relay.awake():
                await self._send(action, fid, **fields)
                return _result(await asyncio.wait_for(w.done, OP_TIMEOUT_S))
        except TimeoutError:
            raise FileTransferError(f"the sandbox did not answer a file {action} in {OP_TIMEOUT_S:.0f} s") \
                from None
        finally:
            self._waiters.pop(fid, None)

    async def stat(self, path: str) -> dict[str, Any]:
        """``path``'s ``type`` (file, directory, symlink, other), ``size`` (bytes),
        ``mtime`` (s since the epoch), ``mode`` and resolved ``path``."""
        return _stat_like(await self._call("stat", path=path))

    async def list(self, path: str) -> dict[str, Any]:
        """The entries of directory ``path`` (``name`` and :meth:`stat`'s fields each),
        sorted by name; ``truncated`` when there were more than the agent lists."""
        r = await self._call("list", path=path)
        entries = r.get("entries")
        if not isinstance(entries, list):
            raise FileTransferError("the sandbox's list answer has no entries")
        clean = []
        for e in entries[:100_000]:
            if isinstance(e, dict) and isinstance(e.get("name"), str) and "/" not in e["name"]:
                clean.append({"name": e["name"][:4096], **_stat_like(e, path=False)})
        return {"path": str(r.get("path", ""))[:4096], "entries": clean, "truncated": bool(r.get("truncated"))}

    async def remove(self, path: str) -> dict[str, Any]:
        """Remove a regular file or an empty directory."""
        r = await self._call("remove", path=path)
        return {"path": str(r.get("path", ""))[:4096], "removed": str(r.get("removed", ""))[:16]}

    async def mkdir(self, path: str) -> dict[str, Any]:
        """Create directory ``path`` (its parent must exist); an existing one is fine."""
        r = await self._call("mkdir", path=path)
        return {"path": str(r.get("path", ""))[:4096]}

    async def download(self, path: str) -> AsyncIterator[tuple[int, bytes]]:
        """The chunks of file ``path``, ``(offset, bytes)`` in order, checked as they come.

        The last item is ``(size, b"")`` once the agent's size and SHA-256 were
        checked against the bytes received.  Consume it to the end: only then
        is the file known to be whole.

        Raises
        ------
        FileTransferError
            Refused (``ename`` says why), over :attr:`max_bytes`, out of order,
            or size or checksum not what the agent claims.
        """
        fid = f"f{next(self._ids)}"
        w = self._waiters[fid] = _Waiter()
        digest, size = hashlib.sha256(), 0
        try:
            async with self.relay.awake():  # a slow consumer or sandbox: not idle meanwhile
                await self._send("get", fid, path=path, max_bytes=self.max_bytes)
                while True:
                    try:
                        item = await asyncio.wait_for(w.chunks.get(), OP_TIMEOUT_S)
                    except TimeoutError:
                        raise FileTransferError(f"the sandbox stopped sending {path!r}") from None
                    if item is None:
                        break
                    offset, data = item
                    if offset != size:
                        raise FileTransferError(f"the sandbox sent {path!r} out of order (offset {offset}, "
                                                f"{size} expected)")
                    if size + len(data) > self.max_bytes:
                        raise FileTransferError(f"the sandbox sent more than the transfer limit of "
                                                f"{self.max_bytes} bytes for {path!r}", "FileTooLarge")
                    digest.update(data)
                    size += len(data)
                    yield offset, data
                r = _result(w.done.result())
                if r.get("size") != size or r.get("sha256") != digest.hexdigest():
                    raise FileTransferError(f"the sandbox's account of {path!r} does not match the bytes it "
                                            f"sent ({size} bytes received, SHA-256 {digest.hexdigest()[:12]}...; "
                                            f"claimed {str(r.get('size'))[:20]} bytes, "
                                            f"{str(r.get('sha256'))[:12]}...): nothing was kept")
                yield size, b""
        finally:
            self._waiters.pop(fid, None)

    async def upload_open(self, path: str, size: int, *, overwrite: bool = True,
                          mode: int | None = None) -> str:
        """Start writing ``size`` bytes to ``path`` (a temporary file beside it until
        :meth:`upload_close`, then with permission bits ``mode`` if given); returns the
        upload's id.

        Raises
        ------
        FileTransferError
            Over :attr:`max_bytes`, or refused by the sandbox (a path outside its
            writable areas, a symlink, a read-only workspace...).
        """
        if not isinstance(size, int) or size < 0 or size > self.max_bytes:
            raise FileTransferError(f"{size} bytes is over the transfer limit of {self.max_bytes} bytes "
                                    "(max_file_transfer_bytes)", "FileTooLarge")
        fid = f"u{next(self._ids)}"
        w = self._waiters[fid] = _Waiter()
        try:
            extra = {} if mode is None else {"mode": mode}
            async with self.relay.awake():
                await self._send("put_open", fid, path=path, size=size, overwrite=bool(overwrite), **extra)
                _result(await asyncio.wait_for(w.done, OP_TIMEOUT_S))
        except TimeoutError:
            raise FileTransferError("the sandbox did not answer the upload's start") from None
        finally:
            self._waiters.pop(fid, None)
        return fid

    async def upload_data(self, fid: str, offset: int, data: bytes) -> None:
        """Send one chunk (``offset`` = bytes sent before it); no answer is awaited.

        A sandbox the idle timer paused or checkpointed between two chunks (a client that
        was slow to send the next) is woken first, as for any operation; its open upload
        survives a pause and a checkpoint (the agent's file and offset are in its memory).
        """
        async with self.relay.awake():  # no idle step while the sandbox reads it
            for i in range(0, len(data), CHUNK_BYTES):
                piece = data[i:i + CHUNK_BYTES]
                await self.relay.backend.write(protocol.host_op_frame(
                    "file", id=fid, action="put_data", offset=offset + i,
                    data=base64.b64encode(piece).decode("ascii")))

    async def upload_close(self, fid: str, size: int, sha256: str) -> dict[str, Any]:
        """Finish an upload: the agent checks the bytes it wrote against ``size`` and
        ``sha256``, then renames the file into place.

        Raises
        ------
        FileTransferError
            The agent refused, or reported another size or checksum (its file is
            then not trusted; the client is told).
        """
        w = self._waiters[fid] = _Waiter()
        try:
            async with self.relay.awake():
                await self._send("put_close", fid, size=size, sha256=sha256)
                r = _result(await asyncio.wait_for(w.done, OP_TIMEOUT_S))
        except TimeoutError:
            raise FileTransferError("the sandbox did not confirm the upload") from None
        finally:
            self._waiters.pop(fid, None)
        if r.get("size") != size or r.get("sha256") != sha256:
            raise FileTransferError(f"the sandbox reports {str(r.get('size'))[:20]} bytes with another "
                                    "checksum than the ones sent: the upload is not confirmed")
        return {"path": str(r.get("path", ""))[:4096], "size": size, "sha256": sha256}

    async def upload_abort(self, fid: str) -> None:
        """Drop an unfinished upload (its temporary file is removed)."""
        try:
            await self.relay.backend.write(protocol.host_op_frame("file", id=fid, action="put_abort"))
        except SandboxKernelError:
            pass


def _result(body: dict[str, Any]) -> dict[str, Any]:
    """A ``file`` frame's result, or its error raised as :class:`FileTransferError`."""
    if not body.get("ok"):
        raise FileTransferError(str(body.get("error", "refused")), str(body.get("ename", "OSError")))
    return dict(body.get("result") or {})


def _stat_like(r: dict[str, Any], path: bool = True) -> dict[str, Any]:
    """The stat fields of an agent's answer, typed (anything else is dropped)."""
    kind = r.get("type")
    out: dict[str, Any] = {
        "type": kind if kind in ("file", "directory", "symlink", "other") else "other",
        "size": r["size"] if isinstance(r.get("size"), int) and r["size"] >= 0 else 0,
        "mtime": float(r["mtime"]) if isinstance(r.get("mtime"), (int, float)) else 0.0,
        "mode": r["mode"] & 0o7777 if isinstance(r.get("mode"), int) else 0,
    }
    if path:
        out["path"] = str(r.get("path", ""))[:4096]
    return out
