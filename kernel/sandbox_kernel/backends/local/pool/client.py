"""The proxy's side of the warm pool: take a sandbox from the daemon and hand it to the backend.

See :mod:`.daemon` for the daemon and the whole picture, :mod:`.wire` for what
both sides share.  ``LocalBackend.start`` calls :func:`start_from_pool`, which
asks the daemon (:func:`take`) and passes what it got to the backend's public
``adopt(info, fds)``; the backend wraps the runtime process it did not start
in an :class:`AdoptedProcess`.  Nothing here touches the backend's internals:
what the pool and service clients use of it is :class:`Adopter`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from .wire import FD_NAMES, PROTOCOL, TAKE_TIMEOUT_S, close_fds, policy_key, request

if TYPE_CHECKING:
    from ....policy import Policy
    from ...base import Capabilities


class Adopter(Protocol):
    """What the warm pool's and the sandbox service's clients use of the backend they
    hand a sandbox to (:class:`~sandbox_kernel.backends.local.backend.LocalBackend`,
    which imports them)."""

    #: The sandbox came from a pool (``describe()``); the service's client sets it.
    pooled: bool

    @property
    def kernel_id(self) -> str:
        """The kernel the sandbox is for (its tag)."""

    @property
    def policy(self) -> Policy:
        """The kernel's policy: a pooled sandbox must have been made for the same."""

    @property
    def python(self) -> str:
        """Host path of the interpreter run inside."""

    @property
    def runtime_name(self) -> str:
        """``gvisor`` or ``bubblewrap``: the pool's sandboxes must run the same."""

    @property
    def runtime_key(self) -> str:
        """What a pool's sandboxes must match besides the policy (:func:`.wire.policy_key`)."""

    @property
    def capabilities(self) -> Capabilities:
        """Its ``boundary`` is logged."""

    @property
    def log(self) -> logging.Logger:
        """Where the way the kernel started is said."""

    async def adopt(self, info: dict[str, Any], fds: dict[str, int], *, base: str | None = None) -> None:
        """Take over the sandbox handed over (``LocalBackend.adopt``); owns ``fds`` from then on."""


@dataclass
class Handoff:
    """What a proxy receives for one sandbox (it owns the fds).

    Attributes
    ----------
    meta : dict
        The daemon's answer: ``LocalSandbox.handoff_info()`` plus ``output`` and
        ``stderr_tail`` (base64: what the agent wrote so far), ``started_at``, ``key``.
    fds : dict of str to int
        :data:`FD_NAMES` -> fd.
    """

    meta: dict[str, Any]
    fds: dict[str, int]

    def close(self) -> None:
        close_fds(self.fds.values())
        self.fds = {}


def take(path: str | os.PathLike, key: str, kernel_id: str, runtime: str,
         timeout_s: float = TAKE_TIMEOUT_S) -> tuple[Handoff | None, str]:
    """Ask the pool for a sandbox of policy ``key``; (handoff, "") or (None, reason)."""
    answer, fds = request(path, {"op": "take", "protocol": PROTOCOL, "key": key,
                                 "kernel_id": kernel_id, "runtime": runtime}, timeout_s)
    if not answer.get("ok"):
        close_fds(fds)
        return None, str(answer.get("reason", "refused"))[:200]
    if len(fds) != len(FD_NAMES):
        close_fds(fds)
        return None, f"expected {len(FD_NAMES)} fds, got {len(fds)}"
    return Handoff(meta=answer, fds=dict(zip(FD_NAMES, fds))), ""


async def start_from_pool(backend: Adopter, path: str) -> bool:
    """Try to give ``backend`` a sandbox from the pool at ``path``; False means: start cold.

    Called by ``LocalBackend.start`` when a pool socket is configured.  Logs which
    way the kernel started and why.
    """
    if not os.path.exists(path):  # noqa: ASYNC240 - one stat
        backend.log.debug("cold start: no warm pool at %s", path)
        return False
    t0 = time.monotonic()
    key = policy_key(backend.policy, backend.runtime_key, backend.python)
    try:
        handoff, reason = await asyncio.to_thread(take, path, key, backend.kernel_id, backend.runtime_name)
    except (OSError, ValueError) as err:
        backend.log.warning("cold start: the warm pool at %s did not answer: %s", path, err)
        return False
    if handoff is None:
        backend.log.info("cold start: the warm pool at %s had no sandbox for this kernel (%s)", path, reason)
        return False
    try:
        await backend.adopt(handoff.meta, handoff.fds)  # owns the fds from here on
    except Exception as err:  # noqa: BLE001  the fds are closed; the sandbox's watchdog reaps it
        backend.log.warning("cold start: could not adopt the pooled sandbox: %s", err)
        return False
    backend.log.info("sandbox %s from the warm pool at %s in %.0f ms: %s", handoff.meta.get("container_id"),
                     path, (time.monotonic() - t0) * 1000, backend.capabilities.boundary)
    return True


#: Value of :attr:`AdoptedProcess.returncode` once the process ended (its status is its
#: parent's, the daemon's, to collect).
UNKNOWN_RETURNCODE = -1


class AdoptedProcess:
    """The part of :class:`asyncio.subprocess.Process` that the local backend uses, for
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
        """Wrap the pipe ends in streams (``already_read`` first on stdout) and watch the pidfd."""
        loop = asyncio.get_running_loop()
        stdout = self.stdout = asyncio.StreamReader(limit=1 << 20, loop=loop)
        if already_read:
            stdout.feed_data(already_read)
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stdout, loop=loop),
                                     os.fdopen(stdout_fd, "rb", buffering=0))
        stderr = self.stderr = asyncio.StreamReader(limit=1 << 20, loop=loop)
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stderr, loop=loop),
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
