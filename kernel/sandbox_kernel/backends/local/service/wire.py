"""What the sandbox service and its clients share: where it listens, its protocol
version, the fds of an answer, and how the service reads a request
(:mod:`sandbox_kernel.backends.local.service`)."""

from __future__ import annotations

import asyncio
import contextlib
import socket

#: The standard socket of the sandbox service (``LocalBackend.service_socket``).
SERVICE_SOCKET = "/run/sandbox-kernel/service.sock"
SERVICE_PROTOCOL = 1
#: Seconds a client waits for ``create``/``restore``/``checkpoint`` (runsc work).
SLOW_TIMEOUT_S = 120.0
#: fds of a ``create`` answer, and of a ``restore`` answer (no new watchdog).
CREATE_FDS = ("stdin", "stdout", "stderr", "watchdog", "pidfd")
RESTORE_FDS = ("stdin", "stdout", "stderr", "pidfd")
#: Longest a request line may be, bytes; seconds the service waits for each part of it.
MAX_REQUEST_BYTES = 1 << 20
READ_WAIT_S = 10.0


def _wake(ready: asyncio.Future[None]) -> None:
    if not ready.done():
        ready.set_result(None)


async def read_request(conn: socket.socket, passed: list[int]) -> bytes | None:
    """One request line from a client of the service, with the fds it passed appended to
    ``passed`` (``SCM_RIGHTS``, at most one: a workspace folder's; the caller closes those
    it does not take).  None when the client closed first or passed more than one fd.

    Raises
    ------
    TimeoutError
        Nothing came for :data:`READ_WAIT_S` seconds.
    """
    loop = asyncio.get_running_loop()
    data = b""
    while not data.endswith(b"\n") and len(data) < MAX_REQUEST_BYTES:
        ready: asyncio.Future[None] = loop.create_future()
        loop.add_reader(conn.fileno(), _wake, ready)
        try:
            await asyncio.wait_for(ready, READ_WAIT_S)
        finally:
            loop.remove_reader(conn.fileno())
        with contextlib.suppress(BlockingIOError):
            chunk, got, flags, _ = socket.recv_fds(conn, 65536, 1)
            passed += got
            if not chunk or flags & socket.MSG_CTRUNC:
                return None
            data += chunk
    return data
