"""What both sides of the warm pool share: the socket, the policy key, the framing.

One request per connection on a unix socket (mode 0600; both sides check that
the peer has their uid): the client sends one JSON line, the daemon answers
one JSON line, with file descriptors attached (``SCM_RIGHTS``) to a ``take``
answer, in the order of :data:`FD_NAMES`.  See :mod:`.daemon` for the picture.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import socket
import struct
from collections.abc import Iterable, Sequence
from pathlib import Path

from ....policy import Policy
from ..layout import state_base

SOCKET_NAME = "pool.sock"
PROTOCOL = 1
#: Seconds a proxy waits for the daemon's answer before it starts cold.
TAKE_TIMEOUT_S = 3.0
#: Seconds a pooled sandbox may take to send ``ready``.
READY_TIMEOUT_S = 180.0
#: Bytes of agent output kept per pooled sandbox before it is discarded as misbehaving.
MAX_BUFFERED_BYTES = 1 << 20
#: fds of one hand-off, in this order.
FD_NAMES = ("stdin", "stdout", "stderr", "watchdog", "pidfd")


def default_socket_path() -> Path:
    """The standard pool socket: ``<state dir>/pool.sock`` (``/run/sandbox-kernel`` as root)."""
    return state_base() / SOCKET_NAME


def policy_key(policy: Policy, runtime: str, python: str) -> str:
    """Hash of what a sandbox is made with: the policy's sandbox fields
    (:meth:`Policy.sandbox_fields`), the runtime resolved (``auto`` -> what runs) and
    the interpreter (``LocalBackend.python``).

    Fields the proxy enforces (output caps, cell timeout, idle times...) do not
    count: a pooled sandbox serves kernels that differ only in those.  ``python``
    counts by its directory and the binary it resolves to, so ``.venv/bin/python``
    and ``.venv/bin/python3`` (the same interpreter and environment) match.
    """
    d = policy.sandbox_fields()
    d["runtime"] = runtime
    d["python"] = [os.path.dirname(os.path.abspath(python)), os.path.realpath(python)]
    return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:32]


def peer_cred(sock: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process at the other end of a unix socket (``SO_PEERCRED``,
    as the kernel recorded them at ``connect``: not something the peer says)."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", creds)
    return pid, uid, gid


def peer_uid(sock: socket.socket) -> int:
    """The uid of the process at the other end of a unix socket (``SO_PEERCRED``)."""
    return peer_cred(sock)[1]


def close_fds(fds: Iterable[int | None]) -> None:
    """Close each fd, ignoring None and fds already closed."""
    for fd in fds:
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)


def request(path: str | os.PathLike, req: dict, timeout_s: float = TAKE_TIMEOUT_S, *,
            peer: int | None = None, send: Sequence[int] = ()) -> tuple[dict, list[int]]:
    """Send one request to the daemon; return its JSON answer and any fds it passed.

    Parameters
    ----------
    timeout_s : float
        Seconds to wait for the answer.
    peer : int, optional
        The uid the daemon must run as (``SO_PEERCRED``); default this process's
        (the warm pool); the sandbox service passes 0 (root).
    send : sequence of int
        fds passed with the request (``SCM_RIGHTS``), after the peer's uid was checked.

    Raises
    ------
    OSError
        Unreachable daemon, timeout, or a peer that is not the expected uid.
    ValueError
        A malformed answer.
    """
    for attempt in (1, 2):
        try:
            return _request_once(path, req, timeout_s, peer, send)
        except _NotRead as err:  # closed before our request's end came: it did nothing, ask again
            if attempt == 2:
                raise ConnectionError(f"{path} closed the connection before reading the request "
                                      f"({err.__cause__})") from err.__cause__
    raise AssertionError("unreachable")


class _NotRead(Exception):
    """The daemon closed the connection while the request was being sent (so before its
    newline: it cannot have acted on it)."""


def _request_once(path: str | os.PathLike, req: dict, timeout_s: float, peer: int | None,
                  send: Sequence[int]) -> tuple[dict, list[int]]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    fds: list[int] = []
    try:
        sock.settimeout(timeout_s)
        sock.connect(os.fspath(path))
        expected = os.geteuid() if peer is None else peer
        if peer_uid(sock) != expected:
            raise PermissionError(f"the socket {path} is served by uid {peer_uid(sock)}, not {expected}")
        line = json.dumps(req).encode() + b"\n"
        try:
            sent = socket.send_fds(sock, [line], list(send)) if send else 0
            sock.sendall(line[sent:])
        except (BrokenPipeError, ConnectionResetError) as err:
            raise _NotRead() from err
        data = b""
        while not data.endswith(b"\n"):
            chunk, got, flags, _ = socket.recv_fds(sock, 1 << 20, len(FD_NAMES))
            fds += got
            if flags & socket.MSG_CTRUNC:
                raise ValueError("file descriptors truncated in the pool's answer")
            if not chunk:
                raise ConnectionError("the pool closed the connection")
            data += chunk
            if len(data) > 8 << 20:
                raise ValueError("the pool's answer is too long")
        return json.loads(data), fds
    except BaseException:
        close_fds(fds)
        raise
    finally:
        sock.close()


def listen(path: Path, mode: int, what: str) -> socket.socket:
    """A non-blocking listening unix socket at ``path`` with permissions ``mode``.

    A socket file nobody answers on is stale and replaced; one that answers means
    another ``what`` runs there.

    Raises
    ------
    SystemExit
        Another ``what`` is already listening on ``path``.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() or path.is_symlink():
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.settimeout(1.0)
            probe.connect(str(path))
        except OSError:
            path.unlink()  # stale
        else:
            raise SystemExit(f"a {what} is already listening on {path}")
        finally:
            probe.close()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        sock.bind(str(path))
    finally:
        os.umask(old)
    os.chmod(path, mode)
    sock.listen(64)
    sock.setblocking(False)
    return sock
