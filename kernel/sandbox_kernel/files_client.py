"""A host-side client of the ``sandbox_kernel.files`` comm, over ``jupyter_client``.

Upload, download, list, stat and remove files (and sync a copied workspace back) in a sandbox-kernel's sandbox
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
Message shapes: ``docs/files.md``.  The protocol itself is written once, async, in
:class:`sandbox_kernel.client.files.FileComm`; this module is its blocking facade
(:func:`~sandbox_kernel.client.files.run_blocking` over a
:class:`~sandbox_kernel.client.files.KernelClientChannel`).
"""

from __future__ import annotations

import functools
import inspect
import os
from collections.abc import Callable
from typing import Any

from .client.files import TARGET, TIMEOUT_S, FileComm, KernelClientChannel, check_reply, run_blocking
from .errors import FileTransferError

__all__ = ["TARGET", "TIMEOUT_S", "FileTransferError", "FilesClient", "check_reply", "download",
           "list_files", "own_client", "remove", "stat", "sync", "upload"]


class FilesClient:
    """One ``sandbox_kernel.files`` comm on a kernel client.

    Its verbs (``upload``, ``download``, ``list_files``, ``stat``, ``remove``,
    ``sync``) are :class:`~sandbox_kernel.client.files.FileComm`'s, blocking.

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

    upload: Callable[..., dict[str, Any]]
    download: Callable[..., Any]
    list_files: Callable[..., dict[str, Any]]
    stat: Callable[..., dict[str, Any]]
    remove: Callable[..., dict[str, Any]]
    sync: Callable[..., dict[str, Any]]

    def __init__(self, kc: Any, timeout: float = TIMEOUT_S):
        self.kc = kc
        self.timeout = timeout
        self.comm = run_blocking(FileComm(KernelClientChannel(kc), timeout).open())

    def __getattr__(self, name: str) -> Any:
        """The comm's ``comm_id``, ``chunk_bytes`` and ``max_bytes`` (the largest file the
        kernel moves, bytes: its ``max_file_transfer_bytes``), as its ``hello`` gave them."""
        if name in ("comm_id", "chunk_bytes", "max_bytes"):
            return getattr(self.comm, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def close(self) -> None:
        """Close the comm (an unfinished upload is dropped)."""
        self.comm.close()

    def __enter__(self) -> FilesClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _blocking(name: str) -> Callable[..., Any]:
    coro_fn = getattr(FileComm, name)

    @functools.wraps(coro_fn)
    def method(self: FilesClient, *args: Any, **kwargs: Any) -> Any:
        return run_blocking(getattr(self.comm, name)(*args, **kwargs))

    method.__doc__ = f"Blocking :meth:`FileComm.{name}`.\n\n{inspect.getdoc(coro_fn) or ''}"
    return method


#: The verbs generated for :class:`FilesClient` from :class:`FileComm` (never hand-kept twins).
VERBS = ("upload", "download", "list_files", "stat", "remove", "sync")
for _name in VERBS:
    setattr(FilesClient, _name, _blocking(_name))


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


def sync(kc: Any, *, timeout: float = TIMEOUT_S) -> dict[str, Any]:
    """:meth:`FilesClient.sync` on a comm opened for this call."""
    with FilesClient(kc, timeout) as fc:
        return fc.sync()
