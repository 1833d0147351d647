"""The ``sandbox_kernel.files`` comm target, answered by the proxy itself.

A frontend or an agent opens a comm (messaging spec, "Custom Messages":
``comm_open`` with ``target_name`` :data:`TARGET`) and sends requests as
``comm_msg``; the proxy answers each with ``comm_msg`` on IOPub, parented to
the request.  Requests are never relayed to the sandbox's interpreter; bytes
move through the agent (:class:`~sandbox_kernel.files.FileTransfers`).

Send them on the **control** channel to have them served while a cell runs
(shell messages queue behind the running cell, as in any ipykernel); the shell
channel works too.  The message shapes are in ``docs/files.md`` (a JSON schema);
:mod:`sandbox_kernel.client.files` is their one client (:mod:`sandbox_kernel.files_client`
its blocking facade); both ends take :data:`TARGET` and :data:`VERSION` from
:mod:`sandbox_kernel.files_spec`, so the clients import nothing of this module.

:class:`FilesComm` reaches the kernel through
:class:`~sandbox_kernel.kernel_face.KernelFace`, as the proxy's other parts do, so
nothing here imports the proxy.
"""

from __future__ import annotations

import hashlib
import logging
from typing import TYPE_CHECKING, Any

from .errors import FileTransferError, SandboxKernelError
from .files import CHUNK_BYTES
from .files_spec import TARGET, VERSION

if TYPE_CHECKING:
    from .kernel_face import KernelFace

__all__ = ["MAX_ID", "TARGET", "VERSION", "FilesComm"]

#: Longest request id accepted, characters.
MAX_ID = 128

log = logging.getLogger("sandbox_kernel")


class _Upload:
    """An upload in progress: what the client announced and what came so far."""

    def __init__(self, fid: str, path: str, size: int):
        self.fid, self.path, self.size = fid, path, size
        self.received = 0
        self.digest = hashlib.sha256()
        self.error: FileTransferError | None = None


class FilesComm:
    """The file comms of one kernel.

    Parameters
    ----------
    kernel : KernelFace
        The proxy kernel: publishes the answers (on IOPub, signed with the
        frontend's key) and owns the relay whose
        :attr:`~sandbox_kernel.relay.Relay.files` moves the bytes.
    """

    def __init__(self, kernel: KernelFace):
        self.kernel = kernel
        #: Comm ids opened on :data:`TARGET`.
        self.comm_ids: set[str] = set()
        self._uploads: dict[tuple[str, str], _Upload] = {}

    def claims(self, msg_type: str, content: dict[str, Any]) -> bool:
        """True for a comm message this class answers (never relayed to the sandbox)."""
        if msg_type == "comm_open":
            return content.get("target_name") == TARGET
        return content.get("comm_id") in self.comm_ids

    def claims_from_sandbox(self, msg_type: str, content: dict[str, Any]) -> bool:
        """True for a comm message *from the sandbox* posing as this target (dropped)."""
        return (msg_type == "comm_open" and content.get("target_name") == TARGET) or \
            content.get("comm_id") in self.comm_ids

    async def handle(self, parent: dict[str, Any]) -> None:
        """Serve one ``comm_open``, ``comm_msg`` or ``comm_close`` this class claims."""
        msg_type = parent["header"]["msg_type"]
        content = parent.get("content") or {}
        cid = str(content.get("comm_id", ""))[:MAX_ID]
        if msg_type == "comm_open":
            self.comm_ids.add(cid)
            files = self._files()
            self._publish(cid, parent, {"kind": "hello", "version": VERSION, "chunk_bytes": CHUNK_BYTES,
                                        "max_bytes": files.max_bytes if files else 0})
            return
        if msg_type == "comm_close":
            self.comm_ids.discard(cid)
            for key in [k for k in self._uploads if k[0] == cid]:
                up = self._uploads.pop(key)
                files = self._files()
                if files is not None:
                    await files.upload_abort(up.fid)
            return
        data = content.get("data")
        rid = str(data.get("id", ""))[:MAX_ID] if isinstance(data, dict) else ""
        try:
            if not isinstance(data, dict) or not isinstance(data.get("op"), str):
                raise FileTransferError("a request is an object with 'op' and 'id'", "ValueError")
            handler = getattr(self, "_op_" + data["op"], None)
            if handler is None:
                raise FileTransferError(f"unknown op {data['op'][:40]!r}; ops: upload_begin, "
                                        "upload_chunk, upload_end, download, list, stat, remove, sync",
                                        "ValueError")
            await self.kernel.ready()  # a bad configuration or a failed start says so here
            result = await handler(cid, rid, data, parent)
        except FileTransferError as err:
            self._publish(cid, parent, {"kind": "reply", "id": rid, "status": "error", "ename": err.ename,
                                        "evalue": str(err)})
        except SandboxKernelError as err:
            self._publish(cid, parent, {"kind": "reply", "id": rid, "status": "error",
                                        "ename": "SandboxUnavailable", "evalue": str(err)})
        else:
            if result is not None:
                self._publish(cid, parent, {"kind": "reply", "id": rid, "status": "ok", **result})

    # ---- ops ----------------------------------------------------------------------------

    async def _op_stat(self, cid: str, rid: str, data: dict, parent: dict) -> dict:
        return {"stat": await self._need().stat(_path(data))}

    async def _op_list(self, cid: str, rid: str, data: dict, parent: dict) -> dict:
        return await self._need().list(_path(data, "."))

    async def _op_remove(self, cid: str, rid: str, data: dict, parent: dict) -> dict:
        return await self._need().remove(_path(data))

    async def _op_sync(self, cid: str, rid: str, data: dict, parent: dict) -> dict:
        """Copy the sandbox's changes back to the host folder (E2B, Modal with ``rw``); a
        mounted workspace (local) is the host folder already."""
        copy = self.kernel.workspace_copy
        if copy is None:
            mode = self.kernel.policy.workspace
            return {"files": [], "note": "nothing to copy: " + (
                "the workspace is mounted" if mode != "none" else "no workspace")}
        return {"files": await copy.copy_back()}

    async def _op_download(self, cid: str, rid: str, data: dict, parent: dict) -> dict:
        files = self._need()
        digest, size = hashlib.sha256(), 0
        async for offset, chunk in files.download(_path(data)):
            if chunk:
                digest.update(chunk)
                size = offset + len(chunk)
                self._publish(cid, parent, {"kind": "chunk", "id": rid, "offset": offset}, [chunk])
        return {"size": size, "sha256": digest.hexdigest()}

    async def _op_upload_begin(self, cid: str, rid: str, data: dict, parent: dict) -> dict:
        files = self._need()
        size = data.get("size")
        if not isinstance(size, int) or isinstance(size, bool):
            raise FileTransferError("upload_begin needs 'size' (bytes, an integer)", "ValueError")
        if (cid, rid) in self._uploads:
            raise FileTransferError(f"upload {rid!r} is already in progress", "ValueError")
        path = _path(data)
        fid = await files.upload_open(path, size, overwrite=bool(data.get("overwrite", True)))
        self._uploads[(cid, rid)] = _Upload(fid, path, size)
        return {"path": path}

    async def _op_upload_chunk(self, cid: str, rid: str, data: dict, parent: dict) -> None:
        up = self._uploads.get((cid, rid))
        if up is None:
            raise FileTransferError(f"no upload {rid!r} in progress (send upload_begin first)", "ValueError")
        if up.error is not None:
            return None
        buffers = parent.get("buffers") or []
        chunk = b"".join(bytes(b) for b in buffers)
        if data.get("offset") != up.received or up.received + len(chunk) > up.size:
            up.error = FileTransferError(f"chunk at offset {data.get('offset')!r} does not follow the "
                                         f"{up.received} bytes received, or exceeds the announced "
                                         f"{up.size} bytes", "ValueError")
            return None
        try:
            await self._need().upload_data(up.fid, up.received, chunk)
        except SandboxKernelError as err:
            up.error = FileTransferError(f"the sandbox stopped taking the upload: {err}")
            return None
        up.digest.update(chunk)
        up.received += len(chunk)
        return None

    async def _op_upload_end(self, cid: str, rid: str, data: dict, parent: dict) -> dict:
        up = self._uploads.pop((cid, rid), None)
        if up is None:
            raise FileTransferError(f"no upload {rid!r} in progress", "ValueError")
        files = self._need()
        err = up.error
        if err is None and (up.received != up.size or data.get("sha256") != up.digest.hexdigest()):
            err = FileTransferError(f"received {up.received} of {up.size} bytes with SHA-256 "
                                    f"{up.digest.hexdigest()}; the client sent {data.get('sha256')!r}")
        if err is not None:
            await files.upload_abort(up.fid)
            raise err
        return await files.upload_close(up.fid, up.size, up.digest.hexdigest())

    # ---- helpers --------------------------------------------------------------------------

    def _files(self):
        relay = self.kernel.relay
        return relay.files if relay is not None else None

    def _need(self):
        files = self._files()
        if files is None:
            raise SandboxKernelError(self.kernel.config_error or "the sandbox is not set up")
        return files

    def _publish(self, cid: str, parent: dict, data: dict,
                 buffers: list[Any] | None = None) -> None:
        self.kernel.publish("comm_msg", {"comm_id": cid, "data": data}, parent, buffers=buffers)


def _path(data: dict, default: str | None = None) -> str:
    path = data.get("path", default)
    if not isinstance(path, str) or not path:
        raise FileTransferError("the request needs 'path' (a non-empty string)", "ValueError")
    return path
