"""The warm pool: sandboxes started ahead of time, handed to new kernels over a unix socket.

gVisor needs seconds to start an ipykernel (Python imports under ptrace), so a
new kernel on the local backend can instead take a sandbox that is already up:

* ``sandbox-kernel pool --size N [--runtime R] [policy options]`` runs
  :class:`PoolDaemon`.  It keeps ``N`` sandboxes started by the local backend's
  own code (:class:`_PoolLauncher`, a :class:`LocalBackend`), each with its
  agent's ``ready`` frame read and kept, and listens on a unix socket
  (:func:`default_socket_path`, mode 0600; peers must have the daemon's uid).
* A proxy's :meth:`LocalBackend.start` calls :func:`sandbox_kernel.pool_client.start_from_pool` first.
  The daemon answers a ``take`` whose policy key (:func:`policy_key`) matches
  its own by passing the runtime process's stdin/stdout/stderr pipe ends, the
  watchdog's arming pipe and a pidfd with ``SCM_RIGHTS``, plus the container
  id, state directory, cgroup name and every byte the agent wrote so far (its
  ``ready`` frame).  Then it closes its copies and forgets the sandbox; it
  only reaps the process once it exits (it is the daemon's child).
* The proxy adopts the sandbox (:func:`sandbox_kernel.pool_client.adopt`): it now holds the only write
  end of the watchdog pipe (so the dead-man's switch is armed by the new
  owner: if the proxy dies, the watchdog reaps the sandbox), and kill, pause
  and checkpoint work through the state directory and container id as for a
  cold start.  The process is not the proxy's child: its end is seen as EOF on
  the agent's stream and on the pidfd (:class:`sandbox_kernel.pool_client.AdoptedProcess`), not ``wait()``.

A pooled sandbox has never run code: nothing but the ready handshake has
passed through it, it goes to exactly one kernel (the daemon drops it before
anything else can ask), and the daemon starts a replacement right away.  A
policy mismatch, an empty pool or an unreachable daemon mean a normal cold
start; the proxy logs which.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
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

from ....policy import Policy

log = logging.getLogger("sandbox_kernel.pool")

from .client import (  # noqa: E402,F401  (shared with the client; re-exported)
    FD_NAMES,
    MAX_BUFFERED_BYTES,
    PROTOCOL,
    READY_TIMEOUT_S,
    SOCKET_NAME,
    TAKE_TIMEOUT_S,
    _close_fds,
    _peer_uid,
    default_socket_path,
    policy_key,
    request,
    start_from_pool,
)

# ---------------------------------------------------------------------------------------
# daemon side
# ---------------------------------------------------------------------------------------


def _make_launcher(policy: Policy):
    from ..backend import LocalBackend

    class _PoolLauncher(LocalBackend):
        """The local backend's own start, with pipes whose ends can be passed on, no
        ``--die-with-parent`` for bubblewrap, and stderr drained by the daemon."""

        _bwrap_die_with_parent = False

        def __init__(self) -> None:
            super().__init__(policy, "pool" + uuid.uuid4().hex, log=log)
            self.ends: dict[str, int] = {}
            self._child_ends: list[int] = []

        def _stdio(self) -> dict:
            in_r, in_w = os.pipe()
            out_r, out_w = os.pipe()
            err_r, err_w = os.pipe()
            self.ends = {"stdin": in_w, "stdout": out_r, "stderr": err_r}
            self._child_ends = [in_r, out_w, err_w]
            return {"stdin": in_r, "stdout": out_w, "stderr": err_w}

        async def _spawn(self, start, *args):
            try:
                return await start(*args)
            except BaseException:
                _close_fds(self.ends.values())
                self.ends = {}
                raise
            finally:
                _close_fds(self._child_ends)
                self._child_ends = []

        async def _start_gvisor(self, *args):
            return await self._spawn(super()._start_gvisor, *args)

        async def _start_bwrap(self, *args):
            return await self._spawn(super()._start_bwrap, *args)

        async def _drain_stderr(self, sb) -> None:
            return None  # the daemon reads the raw fd (PoolDaemon._on_stderr)

    return _PoolLauncher()


@dataclass(eq=False)
class _Slot:
    launcher: Any
    started_at: float = field(default_factory=time.time)
    output: bytearray = field(default_factory=bytearray)
    stderr_tail: bytearray = field(default_factory=bytearray)
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    dead: bool = False
    #: ready and announced; from now on a death is handled by _mark_dead, not _fill_one
    filled: bool = False
    decoder: Any = None


class PoolDaemon:
    """Keeps ``size`` sandboxes of one policy ready and hands them out over ``socket_path``."""

    def __init__(self, policy: Policy, size: int, socket_path: Path):
        from ....protocol import FrameDecoder
        from ..backend import resolve_runtime

        self.policy = policy
        self.size = size
        self.socket_path = Path(socket_path)
        self.runtime = resolve_runtime(policy.runtime)
        self.key = policy_key(policy, self.runtime)
        self.slots: list[_Slot] = []
        self.handed = 0
        self.failures = 0
        self._decoder_cls = FrameDecoder
        self._changed = asyncio.Event()
        self._reapers: set[asyncio.Task] = set()
        self._stopping = asyncio.Event()
        self._listener: socket.socket | None = None

    # ---- filling ----------------------------------------------------------------

    async def _fill_one(self) -> None:
        launcher = _make_launcher(self.policy)
        slot = _Slot(launcher=launcher, decoder=self._decoder_cls(self.policy.max_frame_bytes))
        self.slots.append(slot)
        try:
            await launcher.start()
        except Exception as err:  # noqa: BLE001  (any start failure: log, back off, retry)
            self.slots.remove(slot)
            self.failures += 1
            log.error("could not start a pooled sandbox: %s", err)
            return
        loop = asyncio.get_running_loop()
        for name in ("stdout", "stderr"):
            os.set_blocking(launcher.ends[name], False)
        loop.add_reader(launcher.ends["stdout"], self._on_stdout, slot)
        loop.add_reader(launcher.ends["stderr"], self._on_stderr, slot)
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
        log.info("sandbox %s ready in the pool (%.1f s)", launcher._sb.container_id,
                 time.time() - slot.started_at)

    def _on_stdout(self, slot: _Slot) -> None:
        from ....protocol import validate_agent_frame

        fd = slot.launcher.ends["stdout"]
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
            data = os.read(slot.launcher.ends["stderr"], 65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            asyncio.get_running_loop().remove_reader(slot.launcher.ends["stderr"])
            return
        slot.stderr_tail += data
        del slot.stderr_tail[:-8192]

    def _mark_dead(self, slot: _Slot) -> None:
        if slot.dead:
            return
        slot.dead = True
        self._remove_readers(slot)
        slot.ready.set()  # wakes _fill_one, which discards it
        if slot.filled and slot in self.slots:
            asyncio.ensure_future(self._discard(slot))

    def _remove_readers(self, slot: _Slot) -> None:
        loop = asyncio.get_running_loop()
        for name in ("stdout", "stderr"):
            fd = slot.launcher.ends.get(name)
            if fd is not None:
                with contextlib.suppress(Exception):
                    loop.remove_reader(fd)

    async def _discard(self, slot: _Slot) -> None:
        if slot in self.slots:
            self.slots.remove(slot)
        self._remove_readers(slot)
        _close_fds(slot.launcher.ends.values())  # stdin EOF: the agent exits
        slot.launcher.ends = {}
        with contextlib.suppress(Exception):
            await slot.launcher.kill()
        self._changed.set()

    async def _maintain(self) -> None:
        while not self._stopping.is_set():
            live = [s for s in self.slots if not s.dead]
            if len(live) < self.size:
                await self._fill_one()
                if self.failures:
                    await asyncio.sleep(min(60.0, 2.0 ** min(self.failures, 6)))
                continue
            self._changed.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._changed.wait(), 5.0)

    # ---- serving ------------------------------------------------------------------

    def status(self) -> dict:
        ready = [s for s in self.slots if s.filled and not s.dead]
        return {"ok": True, "protocol": PROTOCOL, "pid": os.getpid(), "key": self.key,
                "runtime": self.runtime, "size": self.size, "ready": len(ready),
                "starting": len(self.slots) - len(ready), "handed": self.handed,
                "container_ids": [s.launcher._sb.container_id for s in ready if s.launcher._sb]}

    def _pop_ready(self) -> _Slot | None:
        for s in self.slots:
            if s.filled and not s.dead and s.launcher._sb is not None:
                self.slots.remove(s)
                return s
        return None

    async def _serve_one(self, conn: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        try:
            if _peer_uid(conn) != os.geteuid():
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
        launcher, sb = slot.launcher, slot.launcher._sb
        self._remove_readers(slot)
        with contextlib.suppress(BlockingIOError, OSError):  # what arrived since the last wake-up
            while chunk := os.read(launcher.ends["stdout"], 65536):
                slot.output += chunk
        try:
            pidfd = os.pidfd_open(sb.proc.pid)
        except OSError:
            await loop.sock_sendall(conn, b'{"ok": false, "reason": "pooled sandbox ended"}\n')
            await self._discard(slot)
            return
        meta = {"ok": True, "protocol": PROTOCOL, "container_id": sb.container_id,
                "state_dir": str(sb.state_dir), "runtime": sb.runtime, "pid": sb.proc.pid,
                "cgroup": sb.cgroup.name if sb.cgroup is not None else None,
                "output": base64.b64encode(bytes(slot.output)).decode(),
                "stderr_tail": base64.b64encode(bytes(slot.stderr_tail)).decode(),
                "started_at": slot.started_at, "key": self.key}
        fds = [launcher.ends["stdin"], launcher.ends["stdout"], launcher.ends["stderr"],
               sb.watchdog_fd, pidfd]
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
        _close_fds([*launcher.ends.values(), pidfd, sb.watchdog_fd])
        launcher.ends = {}
        sb.watchdog_fd = None
        launcher._sb = None
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
        path = self.socket_path
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists() or path.is_symlink():
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                probe.settimeout(1.0)
                probe.connect(str(path))
            except OSError:
                path.unlink()  # stale
            else:
                raise SystemExit(f"a pool daemon is already listening on {path}")
            finally:
                probe.close()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            sock.bind(str(path))
        finally:
            os.umask(old)
        os.chmod(path, 0o600)
        sock.listen(64)
        sock.setblocking(False)
        return sock

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
            log.info("pool stopped")

    async def _accept_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            conn, _ = await loop.sock_accept(self._listener)
            conn.setblocking(False)
            asyncio.ensure_future(self._serve_one(conn))


def policy_from_args(args: argparse.Namespace) -> Policy:
    from ....cli import POLICY_FLAGS

    fields = {k: getattr(args, k) for k in POLICY_FLAGS if getattr(args, k, None) is not None}
    return Policy(**fields)


def main(args: argparse.Namespace) -> int:
    """``sandbox-kernel pool``: run the daemon until SIGTERM/SIGINT."""
    logging.basicConfig(stream=sys.stderr, level=logging.INFO,
                        format="[sandbox-kernel pool %(levelname)s] %(message)s")
    if args.status:
        path = args.socket or default_socket_path()
        answer, fds = request(path, {"op": "status"})
        _close_fds(fds)
        print(json.dumps(answer, indent=1))
        return 0
    if args.size < 1:
        raise SystemExit("--size must be at least 1")
    policy = policy_from_args(args)
    daemon = PoolDaemon(policy, args.size, Path(args.socket) if args.socket else default_socket_path())
    asyncio.run(daemon.run())
    return 0
