"""The warm pool: sandboxes started ahead of time, handed to new kernels over a unix socket.

gVisor needs seconds to start an ipykernel (Python imports under ptrace), so a
new kernel on the local backend can instead take a sandbox that is already up:

* ``sandbox-kernel pool --size N [--runtime R] [--python P] [policy options]`` runs
  :class:`PoolDaemon`.  It keeps ``N`` sandboxes made by the local backend's
  own code (:meth:`.sandbox.LocalSandbox.create`, with pipes whose ends it can
  pass on and no ``--die-with-parent``), each with its agent's ``ready`` frame
  read and kept, and listens on a unix socket (:func:`.wire.default_socket_path`,
  mode 0600; peers must have the daemon's uid).
* A proxy's ``LocalBackend.start`` calls :func:`.client.start_from_pool` first.
  The daemon answers a ``take`` whose policy key (:func:`.wire.policy_key`) matches
  its own by passing the runtime process's stdin/stdout/stderr pipe ends, the
  watchdog's arming pipe and a pidfd with ``SCM_RIGHTS``, plus the container
  id, state directory, cgroup name and every byte the agent wrote so far (its
  ``ready`` frame).  Then it closes its copies and forgets the sandbox; it
  only reaps the process once it exits (it is the daemon's child).
* The proxy adopts the sandbox (``LocalBackend.adopt``): it now holds the only write
  end of the watchdog pipe (so the dead-man's switch is armed by the new
  owner: if the proxy dies, the watchdog reaps the sandbox), and kill, pause
  and checkpoint work through the state directory and container id as for a
  cold start.  The process is not the proxy's child: its end is seen as EOF on
  the agent's stream and on the pidfd (:class:`.client.AdoptedProcess`), not ``wait()``.

A pooled sandbox has never run code: nothing but the ready handshake has
passed through it, it goes to exactly one kernel (the daemon drops it before
anything else can ask), and the daemon starts a replacement right away.  A
policy mismatch, an empty pool or an unreachable daemon mean a normal cold
start; the proxy logs which.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import fcntl
import json
import logging
import os
import signal
import socket
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ....aio import background
from ....policy import Policy
from ....protocol import FrameDecoder, validate_agent_frame
from .. import jedi_cache
from ..admission import Admission
from ..runtime import Runtime
from ..sandbox import LocalSandbox, resolve_runtime
from .wire import (
    MAX_BUFFERED_BYTES,
    PROTOCOL,
    READY_TIMEOUT_S,
    close_fds,
    default_socket_path,
    listen,
    peer_uid,
    policy_key,
    request,
)

log = logging.getLogger("sandbox_kernel.pool")


def kernels_alive(path: Path) -> bool:
    """Whether a process holds :func:`.spares.hold`'s shared lock on ``path`` (a kernel of
    the spare pool's policy)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # releases the lock if it was taken
    return False


def stdio_pipes() -> tuple[dict[str, int], dict[str, int]]:
    """Pipes for a runtime process's stdin, stdout and stderr: (the ends handed to the
    owner, the ends the process gets), by name.  Closes what it made if a pipe fails."""
    ends: dict[str, int] = {}
    child: dict[str, int] = {}
    try:
        for name in ("stdin", "stdout", "stderr"):
            r, w = os.pipe()
            ends[name], child[name] = (w, r) if name == "stdin" else (r, w)
    except BaseException:
        close_fds([*ends.values(), *child.values()])
        raise
    return ends, child


async def launch_for_handover(policy: Policy, runtime: Runtime, python: str, kernel_id: str | None = None,
                              die_with_parent: bool = False, **create: Any) -> tuple[LocalSandbox, dict[str, int]]:
    """Make one sandbox with the local backend's own code, its stdio on pipes whose
    ends this process keeps and later passes on, no ``--die-with-parent`` (the sandbox
    outlives its maker once handed to a proxy; its watchdog reaps).  Used by the warm
    pool and the sandbox service.

    Parameters
    ----------
    kernel_id : str, optional
        Default ``pool<hex>``.
    die_with_parent : bool
        As :meth:`.sandbox.LocalSandbox.create`: False for a sandbox handed to another
        process; True where the thread that starts it outlives it (:mod:`..early`).
    **create
        More :meth:`.sandbox.LocalSandbox.create` arguments (``admission``, ``prefixes``, ``tag``).

    Returns
    -------
    (LocalSandbox, dict)
        The sandbox and this process's pipe ends: ``stdin`` (write), ``stdout`` and
        ``stderr`` (read).
    """
    ends, child = stdio_pipes()
    try:
        sb = await LocalSandbox.create(policy, runtime, kernel_id or "pool" + uuid.uuid4().hex, python=python,
                                       stdio=child, die_with_parent=die_with_parent, log=create.pop("log", log),
                                       **create)
    except BaseException:
        close_fds(ends.values())
        raise
    finally:
        close_fds(child.values())
    return sb, ends


@dataclass(eq=False)
class _Slot:
    """One sandbox the daemon holds, from its start to its hand-over or discard."""

    decoder: FrameDecoder
    sb: LocalSandbox | None = None
    #: The daemon's pipe ends (see :func:`launch_for_handover`).
    ends: dict[str, int] = field(default_factory=dict)
    started_at: float = field(default_factory=time.time)
    output: bytearray = field(default_factory=bytearray)
    stderr_tail: bytearray = field(default_factory=bytearray)
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    dead: bool = False
    #: ready and announced; from now on a death is handled by _mark_dead, not _fill_one
    filled: bool = False


class PoolDaemon:
    """Keeps ``size`` sandboxes of one policy ready and hands them out over ``socket_path``.

    Parameters
    ----------
    policy : Policy
    size : int
        Sandboxes kept ready.
    socket_path : Path
    runtime : {"auto", "gvisor", "bubblewrap"}
        As ``LocalBackend.runtime``.
    python : str, optional
        As ``LocalBackend.python``; default the interpreter running the daemon.
    runsc_path, gvisor_platform : str
        As ``LocalBackend.runsc_path`` and ``gvisor_platform`` (part of the pool's key).
    idle_exit_s : float, optional
        End after this many seconds in which nobody took a sandbox (a spare pool,
        :mod:`.spares`); None: run until stopped.
    admission : Admission, optional
        Checked before each sandbox is started (a full machine: retried with back-off).
    kernels : (Path, float), optional
        A spare pool's kernels file (:func:`.spares.hold`) and linger, s: end once no
        process has held its lock for that long.  None: kernels are not counted.
    refill_after_s : float
        Seconds after a take before the replacement starts (a spare pool: the kernel
        that took the sandbox answers its first requests without a cold start beside it
        on the same cores).  0: at once.
    """

    def __init__(self, policy: Policy, size: int, socket_path: Path, *, runtime: str = "auto",
                 python: str | None = None, runsc_path: str = "", gvisor_platform: str = "auto",
                 idle_exit_s: float | None = None, admission: Admission | None = None,
                 kernels: tuple[Path, float] | None = None, refill_after_s: float = 0.0):
        self.policy = policy
        self.size = size
        self.socket_path = Path(socket_path)
        self._runtime = resolve_runtime(runtime, runsc_path, gvisor_platform)
        self.runtime = self._runtime.name
        self.python = python or sys.executable
        self.key = policy_key(policy, self._runtime.key, self.python)
        self.slots: list[_Slot] = []
        self.handed = 0
        self.failures = 0
        self._changed = asyncio.Event()
        self._reapers: set[asyncio.Task] = set()
        self._stopping = asyncio.Event()
        self._listener: socket.socket | None = None
        self.idle_exit_s = idle_exit_s
        self.admission = admission
        #: When a sandbox was last taken (or the pool started), ``time.monotonic()``.
        self.last_take = time.monotonic()
        self.kernels = kernels
        self.refill_after_s = refill_after_s
        #: The sandbox launch under way (:meth:`_fill_one`), kept if a stop cut its fill off.
        self._launch: asyncio.Future | None = None
        #: When a kernel of the pool's policy was last seen holding ``kernels``.
        self.last_kernel = time.monotonic()

    # ---- filling ----------------------------------------------------------------

    async def _fill_one(self) -> None:
        slot = _Slot(decoder=FrameDecoder(self.policy.max_frame_bytes))
        self.slots.append(slot)
        # shielded: a stop that cancels this fill waits for the launch in run() and removes
        # what it made (a start cut half-way would leave a state directory or a process)
        self._launch = asyncio.ensure_future(launch_for_handover(self.policy, self._runtime, self.python,
                                                                 admission=self.admission))
        try:
            slot.sb, slot.ends = await asyncio.shield(self._launch)
            self._launch = None  # this fill has it (a cancelled fill leaves it to _end_launch)
        except Exception as err:  # noqa: BLE001  (any start failure: log, back off, retry)
            self._launch = None
            self.slots.remove(slot)
            self.failures += 1
            log.error("could not start a pooled sandbox: %s", err)
            return
        loop = asyncio.get_running_loop()
        for name in ("stdout", "stderr"):
            os.set_blocking(slot.ends[name], False)
        loop.add_reader(slot.ends["stdout"], self._on_stdout, slot)
        loop.add_reader(slot.ends["stderr"], self._on_stderr, slot)
        background(self._watch_exit(slot, slot.sb))
        try:
            await asyncio.wait_for(slot.ready.wait(), READY_TIMEOUT_S)
        except TimeoutError:
            slot.dead = True
        if slot.dead:
            self.failures += 1
            log.error("a pooled sandbox did not become ready: %s",
                      bytes(slot.stderr_tail[-300:]).decode("utf-8", "replace"))
            await self._discard(slot)
            return
        self.failures = 0
        slot.filled = True
        self._changed.set()
        log.info("sandbox %s ready in the pool (%.1f s)", slot.sb.container_id,
                 time.time() - slot.started_at)

    def _on_stdout(self, slot: _Slot) -> None:
        fd = slot.ends["stdout"]
        try:
            data = os.read(fd, 65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data or len(slot.output) + len(data) > MAX_BUFFERED_BYTES:
            self._mark_dead(slot)
            return
        slot.output += data
        if slot.ready.is_set():
            return
        for raw in slot.decoder.feed(data):
            try:
                frame = validate_agent_frame(raw)
            except Exception:  # noqa: BLE001  untrusted bytes: a bad frame just disqualifies the sandbox
                self._mark_dead(slot)
                return
            if frame.op == "ready":
                slot.ready.set()
            elif frame.op == "died":
                self._mark_dead(slot)
                return

    def _on_stderr(self, slot: _Slot) -> None:
        try:
            data = os.read(slot.ends["stderr"], 65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            asyncio.get_running_loop().remove_reader(slot.ends["stderr"])
            return
        slot.stderr_tail += data
        del slot.stderr_tail[:-8192]

    async def _watch_exit(self, slot: _Slot, sb: LocalSandbox) -> None:
        """A held sandbox whose runtime process ended (killed, say) is dead even while
        processes of it still hold its output open: discarded, and so replaced."""
        await sb.proc.wait()
        if slot.sb is sb:  # not handed over meanwhile
            log.warning("pooled sandbox %s ended (its runtime process exited)", sb.container_id)
            self._mark_dead(slot)

    def _mark_dead(self, slot: _Slot) -> None:
        if slot.dead:
            return
        slot.dead = True
        self._remove_readers(slot)
        slot.ready.set()  # wakes _fill_one, which discards it
        if slot.filled and slot in self.slots:
            background(self._discard(slot))

    def _remove_readers(self, slot: _Slot) -> None:
        loop = asyncio.get_running_loop()
        for name in ("stdout", "stderr"):
            fd = slot.ends.get(name)
            if fd is not None:
                with contextlib.suppress(Exception):
                    loop.remove_reader(fd)

    async def _discard(self, slot: _Slot) -> None:
        if slot in self.slots:
            self.slots.remove(slot)
        self._remove_readers(slot)
        close_fds(slot.ends.values())  # stdin EOF: the agent exits
        slot.ends = {}
        sb, slot.sb = slot.sb, None
        if sb is not None:
            with contextlib.suppress(Exception):
                await sb.destroy(log)
        self._changed.set()

    async def _maintain(self) -> None:
        while not self._stopping.is_set():
            if self.idle_exit_s is not None and time.monotonic() - self.last_take > self.idle_exit_s:
                log.info("no sandbox taken for %.0f s: ending (idle_exit_s)", self.idle_exit_s)
                self._stopping.set()
                return
            if self._no_kernels():
                self._stopping.set()
                return
            live = [s for s in self.slots if not s.dead]
            wait_s = self.last_take + self.refill_after_s - time.monotonic() if self.handed else 0.0
            if len(live) < self.size and wait_s > 0:
                await asyncio.sleep(min(wait_s, 1.0))
                continue
            if len(live) < self.size:
                await self._fill_one()
                if self.failures:
                    await asyncio.sleep(min(60.0, 2.0 ** min(self.failures, 6)))
                continue
            self._changed.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._changed.wait(), 1.0 if self.kernels else 5.0)

    def _no_kernels(self) -> bool:
        """A spare pool none of whose policy's kernels has run for its linger: time to end."""
        if self.kernels is None:
            return False
        path, linger_s = self.kernels
        now = time.monotonic()
        if kernels_alive(path):
            self.last_kernel = now
            return False
        if now - self.last_kernel <= linger_s:
            return False
        log.info("no kernel of this policy for %.0f s: ending (spare_linger_s)", linger_s)
        return True

    # ---- serving ------------------------------------------------------------------

    def status(self) -> dict:
        ready = [s for s in self.slots if s.filled and not s.dead]
        return {"ok": True, "protocol": PROTOCOL, "pid": os.getpid(), "key": self.key,
                "runtime": self.runtime, "size": self.size, "ready": len(ready),
                "starting": len(self.slots) - len(ready), "handed": self.handed, "idle_s":
                round(time.monotonic() - self.last_take, 1),
                "container_ids": [s.sb.container_id for s in ready if s.sb is not None],
                "pids": [s.sb.proc.pid for s in ready if s.sb is not None]}

    def _pop_ready(self) -> _Slot | None:
        seeded = None
        for s in list(self.slots):
            if s.filled and not s.dead and s.sb is not None:
                if s.sb.jedi_seed is None:
                    if seeded is None:
                        seeded = jedi_cache.seed(self.python, build_missing=False) is not None
                    if seeded:  # made before the completion cache was built: its first completion
                        s.dead = True  # would be slow (C16); replaced by one that has it
                        background(self._discard(s))
                        continue
                self.slots.remove(s)
                return s
        return None

    async def _serve_one(self, conn: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        try:
            if peer_uid(conn) != os.geteuid():
                return  # the socket is 0600 already; refuse anyone else regardless
            data = b""
            while not data.endswith(b"\n") and len(data) < 65536:
                chunk = await asyncio.wait_for(loop.sock_recv(conn, 65536), 5.0)
                if not chunk:
                    return
                data += chunk
            req = json.loads(data)
            if req.get("op") == "status":
                await loop.sock_sendall(conn, json.dumps(self.status()).encode() + b"\n")
            elif req.get("op") == "take":
                await self._take(conn, req)
            elif req.get("op") == "stop":
                await loop.sock_sendall(conn, b'{"ok": true}\n')
                self._stopping.set()
            else:
                await loop.sock_sendall(conn, b'{"ok": false, "reason": "unknown op"}\n')
        except (TimeoutError, OSError, ValueError) as err:
            log.warning("pool request failed: %s", err)
        finally:
            conn.close()

    async def _take(self, conn: socket.socket, req: dict) -> None:
        loop = asyncio.get_running_loop()
        if req.get("protocol") != PROTOCOL or req.get("key") != self.key:
            reason = ("policy mismatch (pool serves " + self.runtime + ", key " + self.key + ")"
                      if req.get("protocol") == PROTOCOL else "protocol mismatch")
            await loop.sock_sendall(conn, json.dumps({"ok": False, "reason": reason}).encode() + b"\n")
            return
        slot = self._pop_ready()
        if slot is None:
            await loop.sock_sendall(conn, b'{"ok": false, "reason": "no sandbox ready yet"}\n')
            return
        self._changed.set()  # start the replacement whatever happens next
        self.last_take = time.monotonic()
        with contextlib.suppress(OSError):
            os.utime(self.socket_path)  # the least recently used spare pool ends first (.spares)
        sb = slot.sb
        assert sb is not None
        self._remove_readers(slot)
        with contextlib.suppress(BlockingIOError, OSError):  # what arrived since the last wake-up
            while chunk := os.read(slot.ends["stdout"], 65536):
                slot.output += chunk
        try:
            if sb.watchdog_fd is None:  # no dead-man's switch: never handed to a kernel
                raise OSError("the pooled sandbox has no watchdog")
            pidfd = os.pidfd_open(sb.proc.pid)
        except OSError:
            await loop.sock_sendall(conn, b'{"ok": false, "reason": "pooled sandbox ended"}\n')
            await self._discard(slot)
            return
        meta = {"ok": True, "protocol": PROTOCOL, **sb.handoff_info(),
                "output": base64.b64encode(bytes(slot.output)).decode(),
                "stderr_tail": base64.b64encode(bytes(slot.stderr_tail)).decode(),
                "started_at": slot.started_at, "key": self.key}
        fds = [slot.ends["stdin"], slot.ends["stdout"], slot.ends["stderr"], sb.watchdog_fd, pidfd]
        try:
            conn.setblocking(True)
            conn.settimeout(5.0)
            socket.send_fds(conn, [json.dumps(meta).encode() + b"\n"], fds)
        except OSError as err:
            log.warning("hand-off of %s failed (%s); discarding it", sb.container_id, err)
            os.close(pidfd)
            self.slots.append(slot)
            await self._discard(slot)
            return
        # Handed over: close our copies and forget it (never kill, never disarm the watchdog).
        close_fds([*slot.ends.values(), pidfd, sb.watchdog_fd])
        slot.ends = {}
        sb.watchdog_fd = None
        slot.sb = None
        self.handed += 1
        log.info("sandbox %s handed to kernel %s", sb.container_id, str(req.get("kernel_id"))[:32])
        task = asyncio.ensure_future(self._reap(sb.proc))
        self._reapers.add(task)
        task.add_done_callback(self._reapers.discard)

    @staticmethod
    async def _reap(proc) -> None:
        """Collect the exit status of a handed sandbox's runtime process (our child)."""
        await proc.wait()
        with contextlib.suppress(Exception):
            proc._transport.close()

    def _listen(self) -> socket.socket:
        return listen(self.socket_path, 0o600, "pool daemon")

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        self._listener = self._listen()
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            loop.add_signal_handler(sig, self._stopping.set)
        log.info("pool of %d %s sandbox(es) on %s (policy key %s)", self.size, self.runtime,
                 self.socket_path, self.key)
        maintain = asyncio.ensure_future(self._maintain())
        accept = asyncio.ensure_future(self._accept_loop())
        try:
            await self._stopping.wait()
        finally:
            accept.cancel()
            maintain.cancel()
            with contextlib.suppress(BaseException):
                await maintain
            with contextlib.suppress(OSError):
                self.socket_path.unlink()
            self._listener.close()
            for slot in list(self.slots):
                await self._discard(slot)
            await self._end_launch()
            log.info("pool stopped")

    async def _end_launch(self) -> None:
        """A launch the stop cut off from its fill: let it finish, then remove what it made."""
        launch = self._launch
        if launch is None:
            return
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(asyncio.shield(launch), READY_TIMEOUT_S)
        if not launch.done() or launch.cancelled() or launch.exception() is not None:
            return
        sb, ends = launch.result()
        if any(s.sb is sb for s in self.slots):
            return
        close_fds(ends.values())
        with contextlib.suppress(Exception):
            await sb.destroy(log)

    async def _accept_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            assert self._listener is not None  # set by serve() before this loop starts
            conn, _ = await loop.sock_accept(self._listener)
            conn.setblocking(False)
            background(self._serve_one(conn))


def main(policy: Policy, size: int, socket_path: str | None = None, status: bool = False, *,
         runtime: str = "auto", python: str | None = None, runsc_path: str = "",
         gvisor_platform: str = "auto") -> int:
    """``sandbox-kernel pool``: run the daemon until SIGTERM/SIGINT, or print a running
    pool's state (``status``).  Called by :mod:`sandbox_kernel.cli` with the policy and
    the local backend's sandbox options (``LocalBackend.SANDBOX_OPTIONS``) it built from its flags."""
    logging.basicConfig(stream=sys.stderr, level=logging.INFO,
                        format="[sandbox-kernel pool %(levelname)s] %(message)s")
    path = Path(socket_path) if socket_path else default_socket_path()
    if status:
        answer, fds = request(path, {"op": "status"})
        close_fds(fds)
        print(json.dumps(answer, indent=1))
        return 0
    if size < 1:
        raise SystemExit("--size must be at least 1")
    if python is not None and not python.startswith("/"):
        raise SystemExit(f"--python must be an absolute path, not {python!r}")
    asyncio.run(PoolDaemon(policy, size, path, runtime=runtime, python=python, runsc_path=runsc_path,
                           gvisor_platform=gvisor_platform).run())
    return 0
