"""Pre-started proxies: a kernel start that does not wait for Python to import the proxy.

A proxy is a new Python process that imports ipykernel, jupyter_client, zmq and the
relay before it can answer (~0.3 s of CPU, as long as a stock ipykernel's own start):
more than a warm pool's whole sandbox hand-off (20–60 ms).  This module keeps **spare
proxies** that have done their imports and wait, holding no connection file, no key and
no sandbox, for a kernel to become:

* :class:`PrestartedProvisioner`, a jupyter_client kernel provisioner (entry point
  ``sandbox-kernel-prestarted`` in the ``jupyter_client.kernel_provisioners`` group,
  chosen by a kernelspec's ``metadata.kernel_provisioner``: ``sandbox-kernel install
  --prestart N``), launches a kernel by **handing a spare its connection file** instead
  of starting a process, then starts a replacement spare.  The first start of a kernelspec
  in a server process has no spare yet and launches as usual.
* A spare is ``python -m sandbox_kernel`` started with :data:`HANDOVER_FD_ENV` naming
  its end of a socketpair.  It imports the proxy and blocks in :func:`await_handover`;
  the hand-over message (JSON: connection file, working directory, per-kernel
  environment variables) arrives with the frontend's stdout/stderr descriptors
  (``SCM_RIGHTS``), and the kernel starts as if launched with them.  When the server
  process ends, the socket closes and the spare exits.

A spare is used only for a launch whose command line (the connection file aside) and
environment (the per-kernel ``JPY_*``/``KERNEL_*`` variables aside) equal those it was
started with; anything else launches a new process, so a spare never serves another
kernelspec's policy.  The signing key reaches the spare only in the connection file it
reads after the hand-over, as for any kernel.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

from jupyter_client.connect import KernelConnectionInfo
from jupyter_client.provisioning import LocalProvisioner
from traitlets import Integer

log = logging.getLogger("sandbox_kernel.prestart")

#: Environment variable naming a spare's file descriptor of its hand-over socket.
HANDOVER_FD_ENV = "SANDBOX_KERNEL_HANDOVER_FD"
#: Placeholder for the connection file in a spare's command line.
CONNECTION_FILE = "{connection_file}"
#: Prefixes of environment variables that differ per kernel (jupyter_server's
#: ``JPY_SESSION_NAME``, the launcher's ``JPY_PARENT_PID``, gateways' ``KERNEL_ID``):
#: not part of a spare's identity, handed over with the connection file.
PER_KERNEL_ENV = ("JPY_", "KERNEL_")
#: Largest hand-over message, bytes.
HANDOVER_MAX = 1 << 20
#: A spare's messages on its hand-over socket: its imports are done; its ZMQ sockets are bound.
READY, BOUND = b"ready", b"bound"
#: Seconds a launch waits for a handed-over spare to bind its sockets (normally ~20 ms).
BOUND_WAIT_S = 2.0
#: Most distinct launch identities (kernelspec, environment) with spares in one process;
#: the least recently used one's spares are ended past it.
MAX_IDENTITIES = 4


# -- the spare's side ------------------------------------------------------------------

def await_handover(fd: int, argv: list[str]) -> list[str] | None:
    """Block until this spare is handed a kernel; return the kernel's argv.

    Parameters
    ----------
    fd : int
        This process's end of the hand-over socketpair (:data:`HANDOVER_FD_ENV`).
    argv : list of str
        The command line without the interpreter, with :data:`CONNECTION_FILE` where
        the connection file goes.

    Returns
    -------
    list of str or None
        ``argv`` with the connection file filled in, after the process took the
        kernel's working directory, per-kernel environment and stdout/stderr; None when
        the socket closed without a hand-over (the server ended or dropped the spare:
        the caller exits).  The socket stays open until :func:`sockets_bound`.
    """
    global _handover_sock
    sock = socket.socket(fileno=fd)
    with contextlib.suppress(OSError):
        sock.send(READY)
    try:
        msg, fds, _flags, _addr = socket.recv_fds(sock, HANDOVER_MAX, 2)
    except OSError:
        msg, fds = b"", []
    if not msg:
        sock.close()
        return None
    try:
        handover = json.loads(msg)
        for target, received in zip((1, 2), fds):
            os.dup2(received, target)
        env = {str(k): str(v) for k, v in handover.get("env", {}).items()}
        cwd = str(handover["cwd"])
        connection_file = str(handover["connection_file"])
    finally:
        for received in fds:
            os.close(received)
    spawned_in = os.getcwd()
    os.environ.update(env)
    os.chdir(cwd)
    if sys.path and sys.path[0] == spawned_in:  # `python -m` put the launch directory first
        sys.path[0] = cwd
    _handover_sock = sock
    return [connection_file if a == CONNECTION_FILE else a for a in argv]


#: A handed-over spare's socket, until it said its ZMQ sockets are bound.
_handover_sock: socket.socket | None = None


def sockets_bound() -> None:
    """Tell the provisioner this kernel's sockets are bound (no-op unless handed over).

    The provisioner's launch returns then, so the frontend's first connection finds them
    bound: a connection refused is retried only after ZMQ's reconnect interval (100 ms).
    """
    global _handover_sock
    sock, _handover_sock = _handover_sock, None
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.send(BOUND)
        sock.close()


# -- the server's side -----------------------------------------------------------------

@dataclass
class Spare:
    """One waiting proxy process and the server's end of its hand-over socket."""

    proc: subprocess.Popen
    sock: socket.socket
    is_ready: bool = False

    def alive(self) -> bool:
        return self.proc.poll() is None

    def ready(self) -> bool:
        """Whether the spare has done its imports and waits (it said :data:`READY`)."""
        if not self.is_ready:
            with contextlib.suppress(BlockingIOError, OSError):
                self.is_ready = self.sock.recv(16, socket.MSG_DONTWAIT) == READY
        return self.is_ready

    def end(self) -> None:
        """Close the socket (the spare exits on it) and reap the process."""
        self.sock.close()
        with contextlib.suppress(OSError):
            self.proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(5)
            return
        with contextlib.suppress(OSError):
            self.proc.kill()
        self.proc.wait()


def _fd_of(stream: Any) -> int | None:
    """The descriptor of a launch's stdout/stderr argument; None to inherit ours.

    Raises
    ------
    ValueError
        For ``subprocess.PIPE`` or anything else a spare cannot be handed.
    """
    if stream is None:
        return None
    if isinstance(stream, int):
        if stream >= 0:
            return stream
        raise ValueError(f"stream {stream!r} cannot be handed to a spare")
    return int(stream.fileno())


class SparePool:
    """Spare proxies of this process, by launch identity (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._spares: dict[tuple, list[Spare]] = {}
        atexit.register(self.close)

    @staticmethod
    def identity(template: list[str], env: dict[str, str]) -> tuple:
        """What a spare must share with a launch to serve it: the command line and the
        environment without the per-kernel variables."""
        shared = tuple(sorted((k, v) for k, v in env.items() if not k.startswith(PER_KERNEL_ENV)))
        return tuple(template), shared

    def take(self, key: tuple) -> Spare | None:
        """A live spare for ``key``, removed from the pool; None when there is none."""
        with self._lock:
            spares = self._spares.get(key, [])
            while spares:
                spare = spares.pop(0)
                if spare.alive():
                    return spare
                spare.end()
            return None

    def fill(self, key: tuple, template: list[str], env: dict[str, str], count: int) -> None:
        """Start spares until ``count`` wait for ``key``; end those of the least recently
        used identities past :data:`MAX_IDENTITIES`."""
        ended: list[Spare] = []
        with self._lock:
            spares = self._spares.pop(key, [])
            self._spares[key] = spares  # most recently used last
            while len(self._spares) > MAX_IDENTITIES:
                ended += self._spares.pop(next(iter(self._spares)))
            for dead in [s for s in spares if not s.alive()]:
                spares.remove(dead)
                ended.append(dead)
            while len(spares) < count:
                spares.append(self._spawn(template, env))
        for s in ended:
            s.end()

    @staticmethod
    def _spawn(template: list[str], env: dict[str, str]) -> Spare:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            spare_env = {k: v for k, v in env.items() if not k.startswith(PER_KERNEL_ENV)}
            spare_env[HANDOVER_FD_ENV] = str(theirs.fileno())
            # As jupyter_client's launcher: a session of its own (interrupts and the final
            # kill reach its process group), stdin not inherited.
            proc = subprocess.Popen(template, env=spare_env, stdin=subprocess.DEVNULL,
                                    pass_fds=(theirs.fileno(),), start_new_session=True)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        log.debug("started spare proxy %d: %s", proc.pid, " ".join(template))
        return Spare(proc, ours)

    def wait_ready(self, timeout: float = 60.0) -> int:
        """Wait until every live spare has done its imports; return how many wait.

        Raises
        ------
        TimeoutError
            If one has not after ``timeout`` seconds.
        """
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                spares = [s for group in self._spares.values() for s in group if s.alive()]
            if all(s.ready() for s in spares):
                return len(spares)
            if time.monotonic() > deadline:
                raise TimeoutError(f"a spare proxy was not ready after {timeout:g} s")
            time.sleep(0.02)

    def close(self) -> None:
        """End every spare (at interpreter exit)."""
        with self._lock:
            spares = [s for group in self._spares.values() for s in group]
            self._spares.clear()
        for s in spares:
            s.end()


#: The spares of this process (a Jupyter Server, an agent's client, a benchmark).
SPARES = SparePool()


async def _until_bound(sock: socket.socket) -> None:
    """Read a handed-over spare's messages until :data:`BOUND` or the end of the socket."""
    loop = asyncio.get_running_loop()
    while await loop.sock_recv(sock, 16) not in (BOUND, b""):
        pass


class PrestartedProvisioner(LocalProvisioner):
    """jupyter_client's local provisioner, launching kernels on pre-started proxies.

    Kernelspec: ``"metadata": {"kernel_provisioner": {"provisioner_name":
    "sandbox-kernel-prestarted", "config": {"spares": 1}}}`` (written by ``sandbox-kernel
    install --prestart N``).  Only the launch differs from :class:`LocalProvisioner`:
    signals, waits, kills and cleanup act on the process as for any local kernel.
    """

    spares = Integer(1, min=0, config=True,
                     help="Spare proxies kept ready for this kernelspec in the server process.")

    async def launch_kernel(self, cmd: list[str], **kwargs: Any) -> KernelConnectionInfo:
        """Hand ``cmd``'s kernel to a waiting spare, or launch it as usual when there is none;
        then start spares up to :attr:`spares`.

        Falls back to a usual launch (never fails for want of a spare) when the launch's
        stdout/stderr cannot be handed over (``PIPE``), options other than those
        jupyter_client passes are given, or the spare died meanwhile.
        """
        connection_file = self.parent.connection_file if self.parent is not None else None
        env = dict(kwargs.get("env") or os.environ)
        template = [CONNECTION_FILE if a == connection_file else a for a in cmd]
        key = SPARES.identity(template, env)
        usable = connection_file in cmd and set(kwargs) <= {"env", "cwd", "stdout", "stderr", "stdin",
                                                             "kernel_id", "extra_arguments"}
        fds: list[int] = []
        try:
            fds = [fd for fd in (_fd_of(kwargs.get("stdout")), _fd_of(kwargs.get("stderr"))) if fd is not None]
            if len(fds) == 1:  # one given, one inherited: send ours for the other
                fds = [_fd_of(kwargs.get("stdout")) or 1, _fd_of(kwargs.get("stderr")) or 2]
        except ValueError:
            usable = False
        spare = SPARES.take(key) if usable else None
        if spare is not None and await self._hand_over(spare, connection_file, env, kwargs.get("cwd"), fds):
            self.process, self.pid = spare.proc, spare.proc.pid
            self.pgid = spare.proc.pid  # its own session
            self.cwd = kwargs.get("cwd") or os.getcwd()
            log.info("kernel launched on pre-started proxy %d", self.pid)
        else:
            await super().launch_kernel(cmd, **kwargs)
        if usable and self.spares:
            SPARES.fill(key, template, env, self.spares)
        return self.connection_info

    @staticmethod
    async def _hand_over(spare: Spare, connection_file: str | None, env: dict[str, str], cwd: Any,
                   fds: list[int]) -> bool:
        msg = json.dumps({"connection_file": connection_file, "cwd": str(cwd or os.getcwd()),
                          "env": {k: v for k, v in env.items() if k.startswith(PER_KERNEL_ENV)}
                          | {"JPY_PARENT_PID": str(os.getpid())}}).encode()
        try:
            socket.send_fds(spare.sock, [msg], fds)
        except OSError as err:
            log.warning("spare proxy %d could not take a kernel (%s): launching one", spare.proc.pid, err)
            spare.end()
            return False
        try:  # until its ZMQ sockets are bound (sockets_bound): the client connects next
            spare.sock.setblocking(False)
            await asyncio.wait_for(_until_bound(spare.sock), BOUND_WAIT_S)
        except (TimeoutError, OSError):
            pass  # not bound yet, or it died: the client's connection retries, the manager sees a death
        finally:
            spare.sock.close()
        return True


def warm_up(argv: list[str]) -> None:
    """Do what a kernel start would do first that needs no connection file: import what it
    imports lazily (the output firewall, the kernelspec's backend, looked up among the
    entry points), list the local interfaces (jupyter_client, with psutil), so a spare
    spends that time before its hand-over, not after.  Best effort: a failure here is met
    again, and reported, by the kernel's own start."""
    backend = next((a.split("=", 1)[1] for a in argv if a.startswith("--SandboxKernel.backend=")), "local")
    with contextlib.suppress(Exception):
        import tornado.platform.asyncio  # noqa: F401  ipykernel's control and IOPub threads' loops
        from jupyter_client import localinterfaces

        from .backends import load_backend
        from .outputs import OutputFirewall  # noqa: F401
        load_backend(backend)
        localinterfaces.localhost()
