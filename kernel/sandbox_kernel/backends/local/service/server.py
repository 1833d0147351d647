"""``sandbox-kernel service``: the sandbox service itself (:class:`SandboxService`), run by root;
what it does and why: :mod:`sandbox_kernel.backends.local.service`."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import pwd
import re
import signal
import socket
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ....aio import background
from ....errors import AdmissionRefused, SandboxKernelError
from ....policy import Policy
from ...base import TAG
from .. import watches
from ..admission import CHECKPOINTED_MARK, Admission, disk_free_mib
from ..cgroups import SandboxCgroup
from ..gvisor import Runsc
from ..idmap import Folder
from ..layout import state_base
from ..pool.daemon import launch_for_handover, stdio_pipes
from ..pool.wire import close_fds, listen, peer_cred, policy_key
from ..runsc import RUNSC_ENV
from ..runtime import Runtime
from ..sandbox import LocalSandbox, resolve_runtime
from .copies import MAX_IMAGES_PER_UID, ServiceCopies, collect
from .peers import Refused, folder_again, peer_folder, peer_prefixes, policy_from_fields
from .wire import SERVICE_PROTOCOL, SERVICE_SOCKET, read_request

log = logging.getLogger("sandbox_kernel.service")

#: Seconds between two looks for sandboxes reaped by their watchdog (:meth:`SandboxService._sweep`).
SWEEP_S = 5.0
#: Seconds the warm pool waits before starting again after a pooled sandbox failed to start.
POOL_RETRY_S = 10.0
_KERNEL_ID = re.compile(r"[A-Za-z0-9_.-]{1,128}")


@dataclass(eq=False)
class Owned:
    """A sandbox the service made: its record, owner and the tasks that watch it."""

    sb: LocalSandbox
    owner_uid: int
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    tasks: set[asyncio.Task] = field(default_factory=set)


@dataclass(eq=False)
class Pooled:
    """A sandbox of the service's warm pool: started, owned by nobody, never run code."""

    sb: LocalSandbox
    #: The service's ends of its stdin/stdout/stderr pipes (handed over with it).
    ends: dict[str, int]
    #: Its interpreter's environment directories (:func:`peer_prefixes`).
    prefixes: list[str]
    started_at: float = field(default_factory=time.time)


@dataclass(frozen=True)
class PoolSpec:
    """What the service's warm pool starts sandboxes for.

    Parameters
    ----------
    size : int
        Sandboxes kept started (0: no pool).
    policy : Policy
        The kernels' policy (their ``SandboxKernel`` options, resolved).
    python : str
        The kernels' interpreter (``LocalBackend.python``): absolute, in an
        environment no user can change (as any interpreter the service runs).
    """

    size: int = 0
    policy: Policy = field(default_factory=Policy)
    python: str = ""

    def key(self, runtime: str) -> str:
        return policy_key(self.policy, runtime, self.python)


class SandboxService:
    """Makes gVisor sandboxes for local users and drives them on their owners' requests.

    Parameters
    ----------
    socket_path : Path
        Where to listen (mode 0666).
    runsc_path, gvisor_platform : str
        As ``LocalBackend.runsc_path`` and ``gvisor_platform``.
    admission : Admission, optional
        The machine's headroom (``--memory-headroom-mib``...); default :class:`Admission`'s.
    max_images_per_uid : int
        Snapshots and fork hand-offs kept for one user (``--max-images-per-uid``, :mod:`.copies`).
    """

    def __init__(self, socket_path: Path, *, runsc_path: str = "", gvisor_platform: str = "auto",
                 admission: Admission | None = None, pool: PoolSpec | None = None,
                 max_images_per_uid: int = MAX_IMAGES_PER_UID):
        self.socket_path = Path(socket_path)
        self._runtime: Runtime = resolve_runtime("gvisor", runsc_path, gvisor_platform)
        self.admission = admission or Admission(set_by="service")
        self.sandboxes: dict[str, Owned] = {}
        #: Snapshots and forks of its sandboxes, in its own state (:mod:`.copies`).
        self.copies = ServiceCopies(self._runtime, self.admission, max_images_per_uid)
        self.pool_spec = pool or PoolSpec()
        if self.pool_spec.size and self.pool_spec.policy.workspace != "none":
            raise SystemExit("the sandbox service's warm pool serves kernels with workspace=none only (a folder "
                             "is its user's, passed by their proxy at create)")
        #: The warm pool's ready sandboxes, oldest first.
        self.pool: list[Pooled] = []
        self._pool_wanted = asyncio.Event()
        self._stopping = asyncio.Event()
        self._listener: socket.socket | None = None

    # ---- requests --------------------------------------------------------------------

    async def handle(self, req: dict, pid: int, uid: int, gid: int,
                     passed: list[int] | None = None) -> tuple[dict, list[int]]:
        """Answer one request of the peer ``uid``; (answer, fds to pass, closed after sending).
        ``passed``: the fds that came with it (the workspace folder of a ``create``, or of a
        ``restore``: :func:`.peers.folder_again`), removed from the list when taken; the
        caller closes the rest.

        Raises
        ------
        Refused
            The request is not allowed or not well-formed (the message says why).
        """
        op, passed = req.get("op"), passed if passed is not None else []
        if req.get("protocol") != SERVICE_PROTOCOL:
            raise Refused(f"protocol mismatch (the service speaks {SERVICE_PROTOCOL})")
        if op == "hello":
            choice = await self._runtime.resolve()
            return {"ok": True, "base": str(state_base()), "runtime": self._runtime.name,
                    "boundary": getattr(choice, "boundary", self._runtime.capabilities.boundary),
                    "pool": {"size": self.pool_spec.size, "ready": len(self.pool)}}, []
        if op == "create":
            return await self._create(req, pid, uid, gid, passed)
        if passed and op != "restore":
            raise Refused("fds are passed only with a create or a restore (its workspace folder)")
        if op == "remove_snapshots":
            return await asyncio.to_thread(self.copies.remove, req, uid)
        verbs: dict[str, Callable[[Owned, dict], Awaitable[tuple[dict, list[int]]]]] = {
            "pause": self._pause, "resume": self._resume, "checkpoint": self._checkpoint,
            "restore": self._restore, "kill": self._kill, "snapshot": self.copies.snapshot, "fork": self.copies.fork}
        if op not in verbs:
            raise Refused(f"unknown op {op!r}")
        owned = self._owned_by(req.get("container_id"), uid)
        async with owned.lock:
            if op == "restore" and owned.sb.folder is None:  # taken back since: its folder again, from the peer
                owned.sb.folder = folder_again(passed, owned.owner_uid, owned.sb.state_dir)
                if owned.sb.folder is not None:
                    passed.clear()  # the folder's now
            return await verbs[op](owned, req)

    def _owned_by(self, cid: Any, uid: int) -> Owned:
        """The sandbox ``cid`` if ``uid`` owns it (or is root).

        Raises
        ------
        Refused
            No such sandbox of this service (its directory must still be under the
            state base), or another uid's.
        """
        owned = self.sandboxes.get(cid) if isinstance(cid, str) else None
        if owned is not None and not owned.sb.state_dir.is_dir():
            self._forget(owned)  # reaped by its watchdog: the owner died
            owned = None
        if owned is None:
            raise Refused(f"no sandbox {str(cid)[:80]!r} of this service")
        if uid not in (0, owned.owner_uid):
            log.warning("uid %d refused on sandbox %s of uid %d", uid, cid, owned.owner_uid)
            raise Refused(f"sandbox {cid} belongs to another user")
        return owned

    async def _create(self, req: dict, pid: int, uid: int, gid: int, passed: list[int]) -> tuple[dict, list[int]]:
        policy = policy_from_fields(req.get("policy"))
        kernel_id, python = str(req.get("kernel_id", "")), req.get("python")
        if not _KERNEL_ID.fullmatch(kernel_id):
            raise Refused("kernel_id must be 1 to 128 letters, digits, '.', '_' or '-'")
        if not isinstance(python, str):
            raise Refused("python must be a string")
        prefixes, ro = await asyncio.to_thread(peer_prefixes, uid, gid, python, policy.ro_paths)
        folder = peer_folder(passed, uid, gid, policy.workspace)  # the peer's fd, or None; its path is never read
        passed.clear()
        try:
            source = req.get("from")
            if source is not None and folder is not None:  # as locally: a copy keeps no folder's mount
                raise Refused("a snapshot or a fork is not restored with a workspace folder: its mounts are "
                              "its sandbox's own")
            return await self._create_checked(dataclasses.replace(policy, ro_paths=ro, workspace_path=""), pid, uid,
                                              kernel_id, python, prefixes, folder, source)
        except BaseException:
            if folder is not None:
                folder.close()
            raise

    async def _create_checked(self, policy: Policy, pid: int, uid: int, kernel_id: str, python: str,
                              prefixes: list[str], folder: Folder | None, source: Any = None
                              ) -> tuple[dict, list[int]]:
        tag = {"owner_uid": uid, "proxy_pid": pid, "service": True}
        copy = await self.copies.open(source, uid)  # a rewind's or a fork's image, the peer's
        pooled = self._take_pooled(policy, python, prefixes) if copy.image is None and folder is None else None
        if pooled is not None:
            sb, ends = pooled.sb, pooled.ends
            try:
                sb.write_tag(kernel_id, **tag, pooled=True, pool_started_at=pooled.started_at)
            except OSError:
                await self._discard(pooled)
                raise
        else:
            try:
                sb, ends = await launch_for_handover(policy, self._runtime, python, kernel_id, admission=self.admission,
                                                     prefixes=prefixes, tag=tag, snapshot_image=copy.image,
                                                     folder=folder, log=log)
            finally:
                copy.close()  # a fork's hand-off: removed, used or not
        owned = Owned(sb=sb, owner_uid=uid)
        self.sandboxes[sb.container_id] = owned
        os.chmod(sb.state_dir, 0o700)  # root's alone: the owner drives it through the service
        try:
            pidfd = os.pidfd_open(sb.proc.pid)
        except OSError:
            close_fds(ends.values())
            await self._destroy(owned)
            raise
        fds = [ends["stdin"], ends["stdout"], ends["stderr"], sb.watchdog_fd, pidfd]
        sb.watchdog_fd = None  # the owner's alone once sent (our copy is closed with the others)
        sb.watchdog_proc = None  # it exits when the owner disarms it or dies: not ours to wait for
        if pooled is None:
            self._watch(owned, sb.proc)  # a pooled one's is watched since its start
        if sb.cgroup is not None:
            self._task(owned, self._end_on_oom(owned))
        log.info("sandbox %s %s uid %d (pid %d, kernel %s)", sb.container_id,
                 "from the warm pool for" if pooled else "made for", uid, pid, kernel_id[:32])
        return {"ok": True, **sb.handoff_info(), "output": "", "stderr_tail": "", "owner_uid": uid,
                "pooled": pooled is not None, **copy.answer()}, [fd for fd in fds if fd is not None]

    # ---- the warm pool ------------------------------------------------------------------

    def _take_pooled(self, policy: Policy, python: str, prefixes: list[str]) -> Pooled | None:
        """A ready sandbox of the pool for this request, removed from the pool (no await
        between the look and the removal: it goes to one kernel), or None: no pool, a
        policy or interpreter of its own (it starts cold), or none ready."""
        spec = self.pool_spec
        if not spec.size or policy_key(policy, self._runtime.name, python) != spec.key(self._runtime.name):
            return None
        while self.pool:
            pooled = self.pool.pop(0)
            self._pool_wanted.set()
            if pooled.prefixes == prefixes and pooled.sb.proc is not None and pooled.sb.proc.returncode is None:
                return pooled
            log.warning("pooled sandbox %s dropped: %s", pooled.sb.container_id,
                        "it ended" if pooled.sb.proc is None or pooled.sb.proc.returncode is not None
                        else "its interpreter's environment differs from the requesting user's view")
            background(self._discard(pooled))
        return None

    async def _discard(self, pooled: Pooled) -> None:
        close_fds(pooled.ends.values())
        await pooled.sb.destroy(log)

    async def _start_pooled(self) -> Pooled:
        """One sandbox for the pool, made as a cold ``create`` makes one (the service's
        own checks of the interpreter, run as ``nobody``: readable, unchangeable)."""
        spec = self.pool_spec
        try:
            nobody = pwd.getpwnam("nobody")
            uid, gid = nobody.pw_uid, nobody.pw_gid
        except KeyError:
            uid = gid = 65534
        prefixes, _ = await asyncio.to_thread(peer_prefixes, uid, gid, spec.python, ())
        sb, ends = await launch_for_handover(spec.policy, self._runtime, spec.python, admission=self.admission,
                                             prefixes=prefixes, tag={"owner_uid": 0, "service": True, "pool": True},
                                             log=log)
        os.chmod(sb.state_dir, 0o700)
        self._watch(Owned(sb=sb, owner_uid=0), sb.proc)
        return Pooled(sb=sb, ends=ends, prefixes=prefixes)

    async def _keep_pool(self) -> None:
        """Keep :attr:`pool` at its size: start one whenever it is short (after a failed
        start, wait :data:`POOL_RETRY_S`: the failure is logged, kernels start cold)."""
        spec = self.pool_spec
        while True:
            for gone in [p for p in self.pool if p.sb.proc is None or p.sb.proc.returncode is not None]:
                log.warning("pooled sandbox %s ended before it was taken", gone.sb.container_id)
                self.pool.remove(gone)
                await self._discard(gone)
            if len(self.pool) >= spec.size:
                self._pool_wanted.clear()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._pool_wanted.wait(), SWEEP_S)
                continue
            t0 = time.monotonic()
            try:
                pooled = await self._start_pooled()
            except Exception as err:  # noqa: BLE001 - whatever it was, kernels start cold meanwhile
                log.warning("warm pool: could not start a sandbox (%s: %s); retrying in %.0f s",
                            type(err).__name__, err, POOL_RETRY_S)
                await asyncio.sleep(POOL_RETRY_S)
                continue
            self.pool.append(pooled)
            log.info("warm pool: sandbox %s ready in %.2f s (%d of %d)", pooled.sb.container_id,
                     time.monotonic() - t0, len(self.pool), spec.size)

    async def _pause(self, owned: Owned, req: dict) -> tuple[dict, list[int]]:
        if owned.sb.checkpointed:
            raise Refused(f"sandbox {owned.sb.container_id} is checkpointed")
        if not owned.sb.frozen:
            await owned.sb.freeze()
        return {"ok": True}, []

    async def _resume(self, owned: Owned, req: dict) -> tuple[dict, list[int]]:
        await owned.sb.thaw()
        return {"ok": True}, []

    async def _checkpoint(self, owned: Owned, req: dict) -> tuple[dict, list[int]]:
        sb = owned.sb
        compression = req.get("compression", "none")
        if compression not in ("none", "flate-best-speed"):
            raise Refused(f"compression must be none or flate-best-speed, not {compression!r}")
        if sb.checkpointed:
            return {"ok": True}, []
        used = sb.cgroup.memory_used_mib() if sb.cgroup is not None else 0
        free = disk_free_mib(sb.state_dir)
        if free < used:
            raise Refused(f"not enough disk for the checkpoint: {free} MiB free under {sb.state_dir.parent}, "
                          f"its image may take up to {used} MiB (the sandbox's memory in use)")
        await sb.checkpoint(compression)
        return {"ok": True}, []

    async def _restore(self, owned: Owned, req: dict) -> tuple[dict, list[int]]:
        sb = owned.sb
        if not sb.checkpointed:
            raise Refused(f"sandbox {sb.container_id} is not checkpointed")
        try:
            await asyncio.to_thread(sb.reserve_restore, self.admission)
        except AdmissionRefused as err:
            return {"ok": False, "admission": err.details, "reason": str(err)}, []
        ends, child = stdio_pipes()
        try:
            await sb.restore(child)
            pidfd = os.pidfd_open(sb.proc.pid)
        except BaseException:
            close_fds(ends.values())
            raise
        finally:
            close_fds(child.values())
        self._watch(owned, sb.proc)
        return {"ok": True, "pid": sb.proc.pid}, [ends["stdin"], ends["stdout"], ends["stderr"], pidfd]

    async def _kill(self, owned: Owned, req: dict) -> tuple[dict, list[int]]:
        await self._destroy(owned)
        return {"ok": True}, []

    async def _destroy(self, owned: Owned) -> None:
        self._forget(owned)
        await owned.sb.destroy(log)
        log.info("sandbox %s of uid %d removed", owned.sb.container_id, owned.owner_uid)

    def _forget(self, owned: Owned) -> None:
        """No longer this service's: out of :attr:`sandboxes`, its watches cancelled, its
        workspace folder's fds closed (it is never mapped again)."""
        self.sandboxes.pop(owned.sb.container_id, None)
        for t in list(owned.tasks):
            t.cancel()
        if owned.sb.folder is not None:
            owned.sb.folder.close()

    # ---- watching ---------------------------------------------------------------------

    def _task(self, owned: Owned, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        owned.tasks.add(task)
        task.add_done_callback(owned.tasks.discard)

    def _watch(self, owned: Owned, proc: Any) -> None:
        """Collect the runtime process's exit status (our child), whoever ends it."""
        async def reap() -> None:
            await proc.wait()
            with contextlib.suppress(Exception):
                proc._transport.close()
        background(reap())

    def _end_on_oom(self, owned: Owned) -> Awaitable[None]:
        """End the sandbox at its cgroup's first OOM kill (its owner cannot write the cgroup):
        the local backend's own watch (:func:`..watches.end_on_oom`)."""
        return watches.end_on_oom(owned.sb, lambda: self.sandboxes.get(owned.sb.container_id) is owned, log)

    async def recover(self) -> int:
        """Take back the sandboxes an earlier run of the service made and left running
        (it was killed, not stopped): from their ``tag.json`` (``service``, owner uid),
        their cgroup, checkpoint mark and ``runsc state``.  Their runtime process is no
        longer this service's child: a checkpoint does not wait for it, a kill ends it
        by name.  Returns how many were taken back.
        """
        n = 0
        for d in sorted(state_base().glob(f"{TAG}-*")):
            try:
                tag = json.loads((d / "tag.json").read_text())
            except (OSError, ValueError):
                continue
            if not tag.get("service") or not isinstance(tag.get("owner_uid"), int) or d.name in self.sandboxes:
                continue
            if tag.get("pool"):  # never handed over: its watchdog (our pipe, closed) reaps it
                continue
            sb = LocalSandbox(runtime=self._runtime, container_id=d.name, state_dir=d,
                              memory_mib=int(tag.get("memory_mib", 0)))
            sb.cgroup = SandboxCgroup.existing(d.name)
            if sb.cgroup is not None:
                sb.cgroup.memory_mib = sb.memory_mib
            sb.checkpointed = (d / CHECKPOINTED_MARK).exists()
            if not sb.checkpointed:
                sb.frozen = await self._runsc_status(sb) == "paused"
            owned = Owned(sb=sb, owner_uid=tag["owner_uid"])
            self.sandboxes[d.name] = owned
            if sb.cgroup is not None:
                self._task(owned, self._end_on_oom(owned))
            n += 1
            log.info("took back sandbox %s of uid %d (%s)", d.name, owned.owner_uid,
                     "checkpointed" if sb.checkpointed else "paused" if sb.frozen else "running")
        return n

    @staticmethod
    async def _runsc_status(sb: LocalSandbox) -> str:
        """``runsc state``'s status of the container (``running``, ``paused``...), or ``""``."""
        proc = await asyncio.create_subprocess_exec(
            *Runsc(sb.state_dir).argv("state", sb.container_id), stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL, env=RUNSC_ENV)
        try:
            out, _ = await asyncio.wait_for(proc.communicate(), 30)
            return str(json.loads(out).get("status", ""))
        except (TimeoutError, ValueError, AttributeError):
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            return ""

    async def _sweep(self, every_s: float = SWEEP_S) -> None:
        """Forget the sandboxes whose directory is gone (their owner died and the watchdog
        reaped them), and stop watching them."""
        while True:
            await asyncio.sleep(every_s)
            await asyncio.to_thread(collect)  # the images of kernels whose proxy is gone
            for cid, owned in list(self.sandboxes.items()):
                if not owned.sb.state_dir.is_dir() and not owned.lock.locked():
                    self._forget(owned)
                    log.info("sandbox %s of uid %d was reaped by its watchdog (its proxy ended)", cid,
                             owned.owner_uid)

    # ---- serving ------------------------------------------------------------------------

    async def _serve_one(self, conn: socket.socket) -> None:
        fds: list[int] = []
        passed: list[int] = []  # with the request: a workspace folder's fd, taken by a create
        try:
            pid, uid, gid = peer_cred(conn)
            data = await read_request(conn, passed)
            if data is None:
                return
            try:
                req = json.loads(data)
                if not isinstance(req, dict):
                    raise Refused("a request is a JSON object")
                answer, fds = await self.handle(req, pid, uid, gid, passed)
            except Refused as err:  # refused, not failed: the client's ename says which
                answer = {"ok": False, "reason": str(err), "refused": True}
            except (SandboxKernelError, OSError, ValueError) as err:
                log.warning("request of uid %d failed: %s", uid, err)
                answer = {"ok": False, "reason": f"{type(err).__name__}: {err}"[:500]}
            except Exception as err:
                log.exception("request of uid %d failed", uid)
                answer = {"ok": False, "reason": f"internal error of the sandbox service: {type(err).__name__}"}
            conn.setblocking(True)
            conn.settimeout(10.0)
            socket.send_fds(conn, [json.dumps(answer).encode() + b"\n"], fds) if fds else \
                conn.sendall(json.dumps(answer).encode() + b"\n")
        except (TimeoutError, OSError) as err:
            log.warning("service request failed: %s", err)
        finally:
            close_fds(fds + passed)  # sent (the peer has its copies) or not, and fds not taken: ours go
            conn.close()

    def _listen(self) -> socket.socket:
        # 0666: every local user may ask; each request is authorised by SO_PEERCRED
        return listen(self.socket_path, 0o666, "sandbox service")

    async def run(self) -> None:
        """Serve until SIGTERM/SIGINT/SIGHUP; then remove every sandbox still held."""
        loop = asyncio.get_running_loop()
        state_base()  # made (0711, root's) before anyone asks
        self._listener = self._listen()
        await self.recover()
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            loop.add_signal_handler(sig, self._stopping.set)
        log.info("sandbox service on %s (state under %s)", self.socket_path, state_base())
        accept = asyncio.ensure_future(self._accept_loop())
        sweep = asyncio.ensure_future(self._sweep())
        keep = asyncio.ensure_future(self._keep_pool()) if self.pool_spec.size else None
        if keep is not None:
            log.info("warm pool of %d for %s (policy key %s)", self.pool_spec.size, self.pool_spec.python,
                     self.pool_spec.key(self._runtime.name)[:12])
        try:
            await self._stopping.wait()
        finally:
            accept.cancel()
            sweep.cancel()
            if keep is not None:
                keep.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await keep
            for pooled in self.pool:
                with contextlib.suppress(Exception):
                    await self._discard(pooled)
            self.pool.clear()
            with contextlib.suppress(OSError):
                self.socket_path.unlink()
            self._listener.close()
            for owned in list(self.sandboxes.values()):
                with contextlib.suppress(Exception):
                    await self._destroy(owned)
            self.copies.remove_all()
            log.info("sandbox service stopped")

    async def _accept_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            assert self._listener is not None
            conn, _ = await loop.sock_accept(self._listener)
            conn.setblocking(False)
            background(self._serve_one(conn))


UNIT = """[Unit]
Description=sandbox-kernel service: gVisor sandboxes with cgroup limits and checkpoint for users' kernels
After=local-fs.target

[Service]
Type=simple
ExecStart={exe} service
Restart=on-failure
KillMode=mixed

[Install]
WantedBy=multi-user.target
"""


def unit_text(exe: str) -> str:
    """The systemd unit running ``exe service`` (``exe``: the ``sandbox-kernel`` script)."""
    return UNIT.format(exe=exe)


def main(socket_path: str | None = None, *, install_unit: str | None = None, **options: Any) -> int:
    """``sandbox-kernel service``: run the service as root until SIGTERM, or write its
    systemd unit (``install_unit``: the unit file's path); ``options``: :class:`SandboxService`'s.

    Raises
    ------
    SystemExit
        Not root, or a service already listens on the socket.
    """
    if install_unit is not None:
        exe = str(Path(sys.executable).parent / "sandbox-kernel")
        Path(install_unit).write_text(unit_text(exe))
        print(f"wrote {install_unit} (ExecStart={exe} service); then: systemctl daemon-reload && "
              "systemctl enable --now sandbox-kernel.service")
        return 0
    if os.geteuid() != 0:
        raise SystemExit("sandbox-kernel service makes sandboxes as root for other users: run it as root "
                         "(systemctl start sandbox-kernel)")
    logging.basicConfig(stream=sys.stderr, level=logging.INFO,
                        format="[sandbox-kernel service %(levelname)s] %(message)s")
    path = Path(socket_path) if socket_path else Path(SERVICE_SOCKET)
    asyncio.run(SandboxService(path, **options).run())
    return 0
