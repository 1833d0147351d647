"""How the client reaches a kernel: one small async interface, two ways.

:class:`KernelTransport` uses ``jupyter_client`` on this machine (a
kernelspec it starts with ``AsyncKernelManager``, or a running kernel's
connection file); :class:`.remote.ServerTransport` talks to a Jupyter Server's
REST and WebSocket API.  Both hand every incoming message to one ``deliver``
callback with its channel name; :class:`~.sandbox.AsyncSandbox` routes them
by their parent's ``msg_id``.  Neither runs cell code: the kernels are
sandbox-kernel kernelspecs, whose interpreter lives in a sandbox.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

from jupyter_client.asynchronous.client import AsyncKernelClient
from jupyter_client.manager import AsyncKernelManager, KernelManager
from jupyter_core.paths import jupyter_runtime_dir

from ..aio import background
from .polling import poll_in_slices

log = logging.getLogger("sandbox_kernel.client")

#: ``deliver(channel, msg)``: channel is ``"iopub"``, ``"shell"``, ``"stdin"`` or ``"control"``.
Deliver = Callable[[str, dict[str, Any]], None]

CHANNELS = ("iopub", "shell", "stdin", "control")

M = TypeVar("M", bound=KernelManager)

#: Longest IPC endpoint path used (``sun_path`` holds 108 bytes with its NUL; ZMQ adds "-N").
_IPC_PATH_MAX = 100


def ipc_endpoints(runtime_dir: str | None = None) -> dict[str, str]:
    """Traits for a kernel manager whose kernel listens on Unix sockets of its own, not TCP.

    jupyter_client's default TCP transport picks five free loopback ports and writes
    them into the connection file, and the kernel binds them once it has started: any
    other process on the machine that takes one of them in between (another kernel's
    start, any outgoing connection's ephemeral port) makes the kernel fail its start with
    ``EADDRINUSE``.  IPC endpoints named by a random id in the Jupyter runtime directory
    (private to the user) cannot be taken, and no other local user can reach them.

    Parameters
    ----------
    runtime_dir : str, optional
        Folder for the endpoints; default :func:`jupyter_core.paths.jupyter_runtime_dir`.

    Returns
    -------
    dict
        ``{"transport": "ipc", "ip": path}`` to pass to a ``KernelManager``; empty (TCP,
        jupyter_client's default) when the folder cannot be made or the path is too long
        for a Unix socket (over 100 bytes with ZMQ's ``-N`` suffix).
    """
    folder = runtime_dir or jupyter_runtime_dir()
    ip = os.path.join(folder, f"kernel-{uuid.uuid4().hex[:16]}-ipc")
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
    except OSError:
        return {}
    if len(os.fsencode(ip)) + 2 > _IPC_PATH_MAX:
        return {}
    return {"transport": "ipc", "ip": ip}


def local_manager(kernel_name: str, manager_class: type[M]) -> M:
    """A kernel manager for ``kernel_name`` on :func:`ipc_endpoints` (not started).

    ``manager_class`` is ``AsyncKernelManager`` or ``KernelManager`` (blocking), or a subclass.
    """
    return manager_class(kernel_name=kernel_name, **ipc_endpoints())


class Transport:
    """The verbs :class:`~.sandbox.AsyncSandbox` needs from a kernel connection.

    Attributes
    ----------
    owns_kernel : bool
        True if :meth:`close` shuts the kernel down (it was started here).
    where : str
        What this transport reaches, for messages and :meth:`AsyncSandbox.info`.
    """

    owns_kernel = False
    where = ""
    #: Messages may carry binary buffers both ways (the file comm's bytes need them).
    binary_buffers = False

    async def start(self, deliver: Deliver, timeout_s: float) -> None:
        """Start or reach the kernel and begin delivering its messages."""
        raise NotImplementedError

    def message(self, msg_type: str, content: dict[str, Any]) -> dict[str, Any]:
        """A new message (header, ``msg_id``) in this connection's session, not yet sent."""
        raise NotImplementedError

    def send(self, channel: str, msg: dict[str, Any]) -> None:
        """Send ``msg`` (from :meth:`message`) on ``channel``."""
        raise NotImplementedError

    async def interrupt(self) -> None:
        """Interrupt the running cell (the kernel's own way: signal or control message)."""
        raise NotImplementedError

    async def restart(self) -> None:
        """Restart the kernel's interpreter (state lost); returns once asked."""
        raise NotImplementedError

    async def is_alive(self) -> bool:
        """False once the kernel is known to be gone."""
        return True

    async def close(self) -> None:
        """Stop delivering; shut the kernel down if :attr:`owns_kernel`."""
        raise NotImplementedError


class KernelTransport(Transport):
    """A kernel on this machine through ``jupyter_client``.

    Parameters
    ----------
    kernel_name : str, optional
        A kernelspec to start (``AsyncKernelManager``); the kernel is shut down
        by :meth:`close`.
    connection_file : str, optional
        A running kernel's connection file; :meth:`close` only disconnects.
    cwd : str, optional
        Host working directory of the started proxy process (not the sandbox's).
    extra_arguments : list of str, optional
        Appended to the kernelspec's argv (a fork's ``--LocalBackend.fork_from=...``).
    """

    def __init__(self, kernel_name: str | None = None, connection_file: str | None = None,
                 cwd: str | None = None, extra_arguments: list[str] | None = None):
        if (kernel_name is None) == (connection_file is None):
            raise ValueError("give exactly one of kernel_name and connection_file")
        self.kernel_name = kernel_name
        self.connection_file = connection_file
        self.cwd = cwd
        self.extra_arguments = list(extra_arguments or [])
        self.km: AsyncKernelManager | None = None
        self.kc: AsyncKernelClient | None = None
        self.owns_kernel = kernel_name is not None
        self.binary_buffers = True
        self.where = f"kernelspec {kernel_name}" if kernel_name else f"connection file {connection_file}"
        self._readers: list[asyncio.Future] = []

    async def start(self, deliver: Deliver, timeout_s: float) -> None:
        if self.kernel_name is not None:
            self.km = local_manager(self.kernel_name, AsyncKernelManager)
            kw: dict[str, Any] = {"cwd": self.cwd} if self.cwd else {}
            if self.extra_arguments:
                kw["extra_arguments"] = self.extra_arguments
            await self.km.start_kernel(**kw)
            self.kc = self.km.client()
        else:
            self.kc = AsyncKernelClient()
            self.kc.load_connection_file(self.connection_file)
        self.kc.start_channels()
        try:
            await self.kc.wait_for_ready(timeout=timeout_s)
        except RuntimeError as err:
            await self.close()
            raise TimeoutError(f"the kernel ({self.where}) was not ready in {timeout_s} s: {err}; "
                               "run `sandbox-kernel doctor`") from err
        for name in CHANNELS:
            self._readers.append(background(self._read(name, deliver)))

    async def _read(self, name: str, deliver: Deliver) -> None:
        assert self.kc is not None
        channel = getattr(self.kc, f"{name}_channel")
        poll_in_slices(channel)  # a lost wake-up would hold a message until the next one came
        while True:
            try:
                msg = await channel.get_msg()
            except asyncio.CancelledError:
                raise
            except Exception as err:  # noqa: BLE001  a closed socket ends this reader
                log.debug("%s reader ended: %s", name, err)
                return
            deliver(name, msg)

    def message(self, msg_type: str, content: dict[str, Any]) -> dict[str, Any]:
        assert self.kc is not None
        return self.kc.session.msg(msg_type, content)

    def send(self, channel: str, msg: dict[str, Any]) -> None:
        assert self.kc is not None
        getattr(self.kc, f"{channel}_channel").send(msg)

    async def interrupt(self) -> None:
        if self.km is not None:
            await self.km.interrupt_kernel()
        else:
            self.send("control", self.message("interrupt_request", {}))

    async def restart(self) -> None:
        if self.km is None:
            raise RuntimeError(f"cannot restart a kernel this client did not start ({self.where}): "
                               "restart it through its owner (JupyterLab, the process that started it)")
        await self.km.restart_kernel(now=False)

    async def is_alive(self) -> bool:
        return True if self.km is None else bool(await self.km.is_alive())

    async def close(self) -> None:
        for task in self._readers:
            task.cancel()
        for task in self._readers:
            with contextlib.suppress(BaseException):
                await task
        self._readers.clear()
        if self.kc is not None:
            self.kc.stop_channels()
        if self.km is not None and await self.km.is_alive():
            await self.km.shutdown_kernel(now=False)
        self.kc = None
