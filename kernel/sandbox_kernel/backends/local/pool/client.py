"""The proxy's side of the warm pool: ask the daemon for a sandbox and adopt it.

See :mod:`sandbox_kernel.pool` for the daemon and the whole picture.  Also
holds what both sides share: the socket path, the policy key, the request
framing over the unix socket.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import signal
import socket
import struct
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ....policy import Policy
from ...base import TAG
from ..layout import state_base

log = logging.getLogger("sandbox_kernel.pool")

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


def policy_key(policy: Policy, runtime: str) -> str:
    """Hash of the whole policy with the runtime resolved (``auto`` -> what runs).

    ``python`` counts by its directory and the binary it resolves to, so ``.venv/bin/python``
    and ``.venv/bin/python3`` (the same interpreter and environment) match.
    """
    d = dataclasses.asdict(policy)
    d["runtime"] = runtime
    d["python"] = [os.path.dirname(os.path.abspath(policy.python)), os.path.realpath(policy.python)]
    return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:32]


def _peer_uid(sock: socket.socket) -> int:
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[1]


def _close_fds(fds) -> None:
    for fd in fds:
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)


# ---------------------------------------------------------------------------------------
# proxy side
# ---------------------------------------------------------------------------------------


@dataclass
class Handoff:
    """What a proxy receives for one sandbox (it owns the fds)."""

    meta: dict[str, Any]
    fds: dict[str, int]

    def close(self) -> None:
        _close_fds(self.fds.values())
        self.fds = {}


def request(path: str | os.PathLike, req: dict, timeout_s: float = TAKE_TIMEOUT_S
            ) -> tuple[dict, list[int]]:
    """Send one request to the daemon; return its JSON answer and any fds it passed.

    Raises
    ------
    OSError
        Unreachable daemon, timeout, or a peer that is not the same uid.
    ValueError
        A malformed answer.
    """
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    fds: list[int] = []
    try:
        sock.settimeout(timeout_s)
        sock.connect(os.fspath(path))
        if _peer_uid(sock) != os.geteuid():
            raise PermissionError(f"the pool socket {path} belongs to another user")
        sock.sendall(json.dumps(req).encode() + b"\n")
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
        _close_fds(fds)
        raise
    finally:
        sock.close()


def take(path: str | os.PathLike, key: str, kernel_id: str, runtime: str,
         timeout_s: float = TAKE_TIMEOUT_S) -> tuple[Handoff | None, str]:
    """Ask the pool for a sandbox of policy ``key``; (handoff, "") or (None, reason)."""
    answer, fds = request(path, {"op": "take", "protocol": PROTOCOL, "key": key,
                                 "kernel_id": kernel_id, "runtime": runtime}, timeout_s)
    if not answer.get("ok"):
        _close_fds(fds)
        return None, str(answer.get("reason", "refused"))[:200]
    if len(fds) != len(FD_NAMES):
        _close_fds(fds)
        return None, f"expected {len(FD_NAMES)} fds, got {len(fds)}"
    return Handoff(meta=answer, fds=dict(zip(FD_NAMES, fds))), ""


#: Value of :attr:`AdoptedProcess.returncode` once the process ended (its status is its
#: parent's, the daemon's, to collect).
UNKNOWN_RETURNCODE = -1


class AdoptedProcess:
    """The part of :class:`asyncio.subprocess.Process` that :class:`LocalBackend` uses, for
    a runtime process this proxy did not start: pipes from fds, exit and kill via a pidfd."""

    exit_status_unknown = True

    def __init__(self, pid: int, pidfd: int):
        self.pid = pid
        self._pidfd = pidfd
        self._exited: asyncio.Future | None = None
        self.stdin: asyncio.StreamWriter | None = None
        self.stdout: asyncio.StreamReader | None = None
        self.stderr: asyncio.StreamReader | None = None

    async def attach(self, stdin_fd: int, stdout_fd: int, stderr_fd: int, already_read: bytes) -> None:
        loop = asyncio.get_running_loop()
        self.stdout = asyncio.StreamReader(limit=1 << 20, loop=loop)
        if already_read:
            self.stdout.feed_data(already_read)
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(self.stdout, loop=loop),
                                     os.fdopen(stdout_fd, "rb", buffering=0))
        self.stderr = asyncio.StreamReader(limit=1 << 20, loop=loop)
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(self.stderr, loop=loop),
                                     os.fdopen(stderr_fd, "rb", buffering=0))
        transport, protocol = await loop.connect_write_pipe(
            lambda: asyncio.streams.FlowControlMixin(loop=loop), os.fdopen(stdin_fd, "wb", buffering=0))
        self.stdin = asyncio.StreamWriter(transport, protocol, None, loop)
        self._exited = loop.create_future()
        loop.add_reader(self._pidfd, self._on_exit)

    def _on_exit(self) -> None:
        loop = asyncio.get_running_loop()
        loop.remove_reader(self._pidfd)
        if self._exited is not None and not self._exited.done():
            self._exited.set_result(None)

    @property
    def returncode(self) -> int | None:
        return UNKNOWN_RETURNCODE if self._exited is not None and self._exited.done() else None

    async def wait(self) -> int | None:
        assert self._exited is not None
        await asyncio.shield(self._exited)
        self.close()
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self._pidfd < 0:
            raise ProcessLookupError(self.pid)
        signal.pidfd_send_signal(self._pidfd, sig)  # never another process, even if pid is reused

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def close(self) -> None:
        if self._pidfd >= 0:
            with contextlib.suppress(Exception):
                asyncio.get_running_loop().remove_reader(self._pidfd)
            with contextlib.suppress(OSError):
                os.close(self._pidfd)
            self._pidfd = -1
        if self.stdin is not None:
            self.stdin.close()


async def adopt(backend, handoff: Handoff) -> None:
    """Make ``backend`` (a :class:`LocalBackend`) the owner of the handed sandbox.

    Raises
    ------
    ValueError
        If the daemon's description does not fit this backend (then nothing is adopted;
        the caller closes the fds and the watchdog reaps the sandbox).
    """
    from .. import cgroups as limits
    from ..backend import _Sandbox

    m = handoff.meta
    cid, state_dir = str(m.get("container_id", "")), Path(str(m.get("state_dir", "")))
    if (not cid.startswith(f"{TAG}-") or state_dir.name != cid or state_dir.parent != state_base()
            or not state_dir.is_dir()):
        raise ValueError(f"unexpected sandbox location {state_dir} ({cid})")
    if m.get("runtime") != backend.runtime:
        raise ValueError(f"pooled sandbox runs {m.get('runtime')}, this kernel wants {backend.runtime}")
    fds = handoff.fds
    proc = AdoptedProcess(int(m["pid"]), fds["pidfd"])
    await proc.attach(fds["stdin"], fds["stdout"], fds["stderr"], base64.b64decode(m.get("output", "")))
    watchdog_fd = fds["watchdog"]
    handoff.fds = {}  # owned by proc / the sandbox from here on
    cgroup = None
    if m.get("cgroup"):
        cgroup = limits.SandboxCgroup.existing(str(m["cgroup"]))
        if cgroup is not None:
            cgroup.memory_mib = backend.policy.memory_mib
    sb = _Sandbox(proc=proc, state_dir=state_dir, runtime=backend.runtime, container_id=cid,
                  cgroup=cgroup, watchdog_fd=watchdog_fd)
    sb.stderr_tail += base64.b64decode(m.get("stderr_tail", ""))[-8192:]
    sb.reattached.set()
    with contextlib.suppress(OSError):  # gc: this proxy is the owner now
        (state_dir / "tag.json").write_text(json.dumps(
            {"kernel_id": backend.kernel_id, "proxy_pid": os.getpid(), "created_at": time.time(),
             "runtime": backend.runtime, "owner_uid": os.getuid(), "pooled": True,
             "pool_started_at": m.get("started_at")}))
    backend._sb = sb
    backend.pooled = True
    backend._stderr_task = asyncio.ensure_future(backend._drain_stderr(sb))


async def start_from_pool(backend, path: str) -> bool:
    """Try to give ``backend`` a sandbox from the pool at ``path``; False means: start cold.

    Logs which way the kernel started and why.
    """
    if not os.path.exists(path):
        backend.log.debug("cold start: no warm pool at %s", path)
        return False
    t0 = time.monotonic()
    key = policy_key(backend.policy, backend.runtime)
    try:
        handoff, reason = await asyncio.to_thread(take, path, key, backend.kernel_id, backend.runtime)
    except (OSError, ValueError) as err:
        backend.log.warning("cold start: the warm pool at %s did not answer: %s", path, err)
        return False
    if handoff is None:
        backend.log.info("cold start: the warm pool at %s had no sandbox for this kernel (%s)", path, reason)
        return False
    try:
        await adopt(backend, handoff)
    except Exception as err:  # noqa: BLE001  the fds close; the sandbox's watchdog reaps it
        handoff.close()
        backend.log.warning("cold start: could not adopt the pooled sandbox: %s", err)
        return False
    backend.log.info("sandbox %s from the warm pool at %s in %.0f ms: %s", backend._sb.container_id,
                     path, (time.monotonic() - t0) * 1000, backend.capabilities.boundary)
    return True
