"""The local backend: gVisor (``runsc``, default) or bubblewrap on this machine.

What the sandbox sees (both runtimes):

* ``/usr`` (and the ``/bin``, ``/lib``... links into it) read-only;
* a curated ``/etc``: generated ``passwd``, ``group`` and ``hosts``, the
  loader cache and ``alternatives`` read-only; never ``shadow`` or ``ssh``;
* the Python environment of :attr:`LocalBackend.python` (its ``sys.prefix`` and
  ``sys.base_prefix``) read-only at the same paths, so what is pip-installed
  beside the kernel imports inside; intermediate directories appear empty;
* ``/home/sandbox`` (``HOME`` and working directory) and ``/tmp``: tmpfs of
  :attr:`Policy.scratch_mib`, gone with the sandbox;
* the agent's zipapp at ``/opt/sandbox-kernel/agent.pyz`` read-only;
* no network interface but loopback, no resolver; an environment built from
  scratch (:func:`.layout.sandbox_env`), never inherited; uid 65534.

The argv of each runtime is built by one function from the policy
(:func:`.bwrap.bwrap_argv`, :func:`.gvisor.runsc_argv` and
:func:`.gvisor.oci_config`), never as a shell string.  A sandbox's creation and
teardown are :class:`.sandbox.LocalSandbox`'s; what differs between the
runtimes is their strategy's (:class:`.gvisor.Gvisor`, :class:`.bwrap.Bubblewrap`).

A proxy that is not root and finds the sandbox service answering
(:attr:`LocalBackend.service_socket`, :mod:`.service`) has its gVisor
sandboxes made and driven by root there: its runtime becomes a
:class:`.service.client.ServiceRuntime`, whose verbs are requests to the
service, and the sandbox is adopted as a warm pool's is (:meth:`LocalBackend.adopt`).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import os
import signal
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

from ...aio import background
from ...egress.rules import EgressRules
from ...egress.server import EgressProxy
from ...errors import AdmissionRefused, SandboxDied, SandboxKernelError
from ...policy import Policy
from ..base import (
    TAG,
    Capabilities,
    ExitInfo,
    Usage,
)
from . import early, template, watches
from .admission import Admission, disk_free_mib, in_memory_fs
from .cgroups import SandboxCgroup
from .config import LocalBackendConfig
from .forks import LocalForks
from .gvisor import Gvisor
from .layout import state_base
from .pool import client as pool_client
from .pool import spares
from .pool.wire import close_fds, default_socket_path
from .sandbox import LocalSandbox, resolve_runtime
from .service import client as service_client
from .spare_use import SpareUse

_SIGNAL_NUMBERS = frozenset(int(s) for s in signal.Signals)
#: Bytes of the runtime's stderr kept to explain a sandbox's end.
STDERR_TAIL_BYTES = 8192


class LocalBackend(LocalForks, SpareUse, LocalBackendConfig):
    """A sandbox on this machine; see the module docstring for what it sees.

    Parameters
    ----------
    policy, kernel_id, log, **kwargs
        See :class:`SandboxBackend`; the options are traits of :class:`.config.LocalBackendConfig`
        (``--LocalBackend.runtime=bubblewrap``).

    Raises
    ------
    RuntimeUnavailable
        If the requested runtime (or, for ``auto``, any) cannot run here.
    traitlets.TraitError
        For an option of the wrong type or value.
    """

    name = "local"
    display_name = "local"
    workspace_mount = True
    enforced_fields = frozenset({"ro_paths", "memory_mib", "cpu_cores", "pids_max", "scratch_mib",
                                 "network", "env", "workspace", "workspace_path", "allow_domains",
                                 "allow_ports", "egress_resolve", "max_egress_connections_per_cell",
                                 "max_egress_bytes_per_cell"})
    egress_enforcement = (
        "HTTP CONNECT and absolute-URI http:// only, through the kernel's filtering proxy on the host "
        "(a unix socket, the sandbox has no other interface): names and *.wildcards of allow_domains, "
        "ports of allow_ports, names resolved on the host with loopback, private, link-local, "
        "multicast and reserved answers refused unless egress_resolve names them, IP literals refused "
        "unless listed, no DNS inside, per-cell connection and byte caps; every attempt recorded")

    def __init__(self, policy: Policy, kernel_id: str, log: logging.Logger | None = None, **kwargs: Any):
        super().__init__(policy, kernel_id, log, **kwargs)
        self._runtime = resolve_runtime(self.runtime, self.runsc_path, self.gvisor_platform)
        self._sb: LocalSandbox | None = None
        self._stderr_task: asyncio.Task | None = None
        self._oom_task: asyncio.Task | None = None
        self._helpers_task: asyncio.Task | None = None
        #: The kernel's egress proxy (``network=allowlist``), made at the first start.
        self._egress: EgressProxy | None = None
        #: The current sandbox came from the warm pool.
        self.pooled = False
        #: The current sandbox was started beside the proxy's imports (:mod:`.early`).
        self.started_early = False
        #: The sandbox service was asked about (:meth:`_use_service`).
        self._service_checked = False
        #: A spare pool to start once this (cold) sandbox is ready (:meth:`on_ready`).
        self._spare_to_start: spares.SpareSpec | None = None
        #: This kernel's hold on its policy's spare pool (:func:`.spares.hold`), and
        #: whether a kernel of the policy was seen before it.
        self._spare_hold: int | None = None
        self._spare_seen = False

    @property
    def admission(self) -> Admission:
        """The admission check with this backend's headroom options (:mod:`.admission`)."""
        return Admission(**{name: getattr(self, name) for name in self.ADMISSION_OPTIONS})

    @property
    def runtime_name(self) -> str:
        """The runtime in force: ``"gvisor"`` or ``"bubblewrap"`` (:attr:`runtime` resolved)."""
        return self._runtime.name

    @property
    def runtime_key(self) -> str:
        """What a warm pool's sandboxes must match besides the policy (``Runtime.key``)."""
        return self._runtime.key

    @property
    def pool_path(self) -> str | None:
        """The warm pool socket asked at start, or None (:attr:`pool_socket` resolved)."""
        if self.pool_socket is None:
            return str(default_socket_path())
        return self.pool_socket or None

    @property
    def capabilities(self) -> Capabilities:
        """The runtime's: gVisor pauses (``runsc pause``) and checkpoints; bubblewrap
        freezes (cgroup freezer or SIGSTOP) and cannot checkpoint (CRIU fails here)."""
        return self._runtime.capabilities

    def describe(self) -> dict:
        d = super().describe()
        d["runtime"] = self.runtime_name
        choice = getattr(self._runtime, "choice", None)
        if choice is not None:
            d["gvisor"] = {"runsc": choice.path, "version": choice.version, "platform": choice.platform,
                           "why": choice.why, "statx_shim": choice.statx_shim}
        if self._sb:
            d["container_id"] = self._sb.container_id
            d["pooled"] = self.pooled
            d["started_early"] = self.started_early
            d["from_template"] = self._sb.from_template
        return d

    def _template_base_key(self) -> str | None:
        """:attr:`start_template`'s key before the layout, or None (:func:`.template.base_key`)."""
        if not self.start_template or not self.capabilities.checkpoint:
            return None
        return template.base_key(self.policy, self.runtime_key, getattr(self._runtime, "choice", None), self.python)

    async def _use_service(self) -> bool:
        """Not root and the sandbox service answers at :attr:`service_socket`: switch to
        its runtime (once; the first start decides).  False: this runtime stays."""
        if isinstance(self._runtime, service_client.ServiceRuntime):
            return True
        if self._service_checked or os.geteuid() == 0 or not self.service_socket:
            return False
        self._service_checked = True
        hello = await asyncio.to_thread(service_client.hello, self.service_socket)
        if hello is None:
            self.log.info("no sandbox service answers at %s: %s", self.service_socket,
                          "running sandboxes as this user")
            return False
        self._runtime = service_client.ServiceRuntime(self.service_socket, hello)
        return True

    async def start(self) -> None:
        await self.kill()
        self.pooled = self.started_early = False
        service = await self._use_service()
        if service:
            early.release_unclaimed()
        else:
            await self._runtime.resolve()
        if self.fork_from:  # a fork's first sandbox: its source's image restored (.forks), here or by the service
            return await self._start_fork()
        if service:
            assert isinstance(self._runtime, service_client.ServiceRuntime)
            await service_client.start_from_service(self, self._runtime)
            return
        if await early.adopt_early(self):
            return
        pool = self.pool_path
        # A pooled sandbox was made without this kernel's egress socket: allowlist starts cold.
        if pool and self.policy.network == "none" and await pool_client.start_from_pool(self, pool):
            return
        self._spare_to_start = None
        spare = self._spare_spec()
        if spare is not None:
            self._hold_spare(spare.key)
            if await pool_client.start_from_pool(self, str(spares.socket_path(spare.key))):
                return
        sb = await self._create()
        self._own(sb)
        self._spare_to_start = spare
        if sb.from_template:  # its generators are the template's: reseeded before any request
            assert sb.proc.stdout is not None
            sb.replay += await template.reseed(sb.proc.stdout, self.write, self.log, sb.container_id)
        self.log.info("sandbox %s started%s: %s", sb.container_id,
                      " from its policy's start template" if sb.from_template else "",
                      self.capabilities.boundary)

    async def _create(self) -> LocalSandbox:
        """A cold (or template) start; a refusal by admission while this user keeps spare
        sandboxes ends them (they are the first to go) and asks once more."""
        def create() -> Awaitable[LocalSandbox]:
            return LocalSandbox.create(
                self.policy, self._runtime, self.kernel_id, python=self.python, admission=self.admission,
                egress=self._egress_proxy().listen if self.policy.network != "none" else None,
                template_base_key=self._template_base_key(), log=self.log)
        try:
            return await create()
        except AdmissionRefused as err:
            if not await asyncio.to_thread(spares.stop_all):
                raise
            self.log.warning("%s; ended this user's spare sandboxes to make room, asking again", err)
        return await create()

    @property
    def holds_ready(self) -> bool:
        """A start template is to be made from this sandbox, or a spare pool started once
        it is ready (:meth:`on_ready`)."""
        return self._sb is not None and (self._sb.capture is not None or self._spare_to_start is not None)

    async def on_ready(self) -> None:
        """This cold sandbox is ready: start its policy's spare pool (in the background,
        so not beside the interpreter's own start), or make its start template."""
        spare, self._spare_to_start = self._spare_to_start, None
        if spare is not None:
            background(self._start_spare_pool(spare, 0.0 if self._spare_seen else self.spare_after_s))
        await self._make_template()

    async def _make_template(self) -> None:
        """Make the start template of a sandbox started with :attr:`start_template` and none
        found (:func:`.template.make`): checkpoint it, running on, before any request reaches it."""
        sb, runtime = self._sb, self._runtime
        if sb is None or sb.capture is None or sb.template_key is None:
            return
        capture, sb.capture = bytes(sb.capture), None
        assert isinstance(runtime, Gvisor)
        await template.make(capture, sb.template_key, sb.container_id,
                            lambda image: runtime.snapshot(sb, image, self.image_compression(image.parent)),
                            self.start_templates_max, self.log)

    async def adopt(self, info: dict[str, Any], fds: dict[str, int], *, base: str | None = None) -> None:
        """Take over a sandbox another process started and handed over: the warm pool's,
        or the sandbox service's.

        Called by :func:`.pool.client.start_from_pool` from :meth:`start`, with the
        daemon's answer (``LocalSandbox.handoff_info()`` plus the agent's output so
        far) and the fds it passed (the shape of jupyter_client's
        ``KernelProvisionerBase.load_provisioner_info``).  From then on the sandbox
        is this backend's as if it had started it: the watchdog's only write end is
        here, ``tag.json`` names this proxy, kill/pause/checkpoint work as usual.

        Parameters
        ----------
        info : dict
            ``container_id``, ``state_dir``, ``runtime``, ``pid``, ``cgroup``,
            ``output`` and ``stderr_tail`` (base64), ``started_at``.
        fds : dict of str to int
            ``stdin``, ``stdout``, ``stderr``, ``watchdog``, ``pidfd``; owned by
            this backend from the call on, whatever happens.
        base : str, optional
            The state base the sandbox's directory must be in: the sandbox service's
            (root's); default this process's (:func:`.layout.state_base`).

        Raises
        ------
        ValueError
            If ``info`` does not fit this backend; nothing is adopted, the fds are
            closed and the sandbox's watchdog reaps it.
        """
        try:
            if self._sb is not None:  # not kill() alone: it would end this start's spare-pool hold
                await self.kill()
            cid, state_dir = str(info.get("container_id", "")), Path(str(info.get("state_dir", "")))
            if (not cid.startswith(f"{TAG}-") or state_dir.name != cid
                    or state_dir.parent != (Path(base) if base else state_base())
                    or not state_dir.is_dir()):  # noqa: ASYNC240 - one stat, before any await
                raise ValueError(f"unexpected sandbox location {state_dir} ({cid})")
            if info.get("runtime") != self.runtime_name:
                raise ValueError(f"pooled sandbox runs {info.get('runtime')}, this kernel wants {self.runtime_name}")
            cgroup = SandboxCgroup.existing(str(info["cgroup"])) if info.get("cgroup") else None
            if cgroup is not None:
                cgroup.memory_mib = self.policy.memory_mib
                if os.geteuid() == 0:  # a spare was started at a low priority (.pool.spares): now it is ours
                    cgroup.renice(0)
            proc = pool_client.AdoptedProcess(int(info["pid"]), fds["pidfd"])
            await proc.attach(fds["stdin"], fds["stdout"], fds["stderr"],
                              base64.b64decode(info.get("output", "")))
        except BaseException:
            close_fds(fds.values())
            raise
        sb = LocalSandbox(runtime=self._runtime, container_id=cid, state_dir=state_dir, proc=proc,
                          cgroup=cgroup, watchdog_fd=fds["watchdog"], memory_mib=self.policy.memory_mib)
        sb.stderr_tail += base64.b64decode(info.get("stderr_tail", ""))[-STDERR_TAIL_BYTES:]
        sb.reattached.set()
        self._own(sb)
        if base:  # the service's: it wrote tag.json (owner uid, this proxy's pid)
            return
        with contextlib.suppress(OSError):  # gc: this proxy is the owner now
            sb.write_tag(self.kernel_id, pooled=True, pool_started_at=info.get("started_at"))
        self.pooled = True

    def _egress_proxy(self) -> EgressProxy:
        """The kernel's egress proxy, made once (it serves each sandbox's socket in turn)."""
        if self._egress is None:
            p = self.policy
            self._egress = EgressProxy(EgressRules.from_policy(p), self.egress_log,
                                       max_connections_per_cell=p.max_egress_connections_per_cell,
                                       max_bytes_per_cell=p.max_egress_bytes_per_cell)
        return self._egress

    def _own(self, sb: LocalSandbox) -> None:
        """Make ``sb`` the current sandbox and drain its runtime's stderr into its tail."""
        self._sb = sb
        self._stderr_task = asyncio.ensure_future(self._drain_stderr(sb))
        if self._runtime.oom_ends_sandbox and sb.cgroup is not None:
            self._oom_task = asyncio.ensure_future(
                watches.end_on_oom(sb, lambda: self._sb is sb, self.log, since=sb.oom_kills_seen))
        elif sb.cgroup is None and self._runtime.measures_guest_memory:
            self._oom_task = asyncio.ensure_future(
                watches.end_on_memory(sb, self._runtime, self.policy.memory_mib, lambda: self._sb is sb, self.log))
        self._watch(sb)

    def _watch(self, sb: LocalSandbox) -> None:
        """Watch the runtime's helper processes of ``sb`` (:func:`.watches.end_on_helper_death`)."""
        if self._runtime.helpers:
            if self._helpers_task is not None:
                self._helpers_task.cancel()
            self._helpers_task = asyncio.ensure_future(
                watches.end_on_helper_death(sb, self._runtime, lambda: self._sb is sb, self.log))

    async def _drain_stderr(self, sb: LocalSandbox) -> None:
        stream = sb.proc.stderr  # this process's; a restore starts another drain
        assert stream is not None
        while True:
            chunk = await stream.read(65536)
            if not chunk:
                return
            sb.stderr_tail += chunk
            del sb.stderr_tail[:-STDERR_TAIL_BYTES]
            self.log.debug("sandbox stderr: %s", chunk[:2000].decode("utf-8", "replace").rstrip())

    async def read(self) -> bytes:
        while True:
            sb = self._sb
            if sb is None or sb.proc.stdout is None:
                return b""
            if sb.replay:
                data, sb.replay = sb.replay, b""
                return data
            proc = sb.proc
            data = await proc.stdout.read(1 << 20)
            if data:
                if sb.capture is not None and len(sb.capture) < template.MAX_READY_BYTES:
                    sb.capture += data
                return data
            if self._sb is not sb:
                return b""
            if sb.proc is not proc:
                continue  # restored: follow the new runtime process
            if not sb.checkpointed:
                return b""
            await sb.reattached.wait()  # checkpointed: the stream comes back with restore

    async def write(self, data: bytes) -> None:
        sb = self._sb
        if sb is None or sb.proc.stdin is None or sb.proc.returncode is not None:
            raise SandboxDied("the sandbox is not running")
        try:
            sb.proc.stdin.write(data)
            await sb.proc.stdin.drain()
        except (BrokenPipeError, ConnectionResetError) as err:
            raise SandboxDied("the sandbox closed its input") from err

    async def exit_info(self) -> ExitInfo:
        sb = self._sb
        if sb is None:
            return ExitInfo(cause="the sandbox was not running")
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(sb.proc.wait(), 5)
        rc = sb.proc.returncode
        if sb.cgroup is not None and sb.cgroup.oom_detected(since=sb.oom_kills_seen):
            sb.oom_kills_seen = sb.cgroup.oom_kills()
            return ExitInfo(cause=sb.cgroup.oom_cause(), returncode=rc)
        if sb.memory_breach:
            return ExitInfo(cause=sb.memory_breach, returncode=rc)
        if sb.helper_died:
            return ExitInfo(cause=f"the sandbox was ended: {sb.helper_died}", returncode=rc)
        tail = sb.stderr_tail.decode("utf-8", "replace").strip().splitlines()[-3:]
        if getattr(sb.proc, "exit_status_unknown", False) and rc is not None:
            cause = "the sandbox's runtime process ended (a pooled sandbox: exit status unknown here)"
        elif rc is None:
            cause = "the sandbox stopped answering"
        elif rc < 0:
            cause = f"the sandbox was killed by signal {signal.Signals(-rc).name}"
        else:
            cause = f"the sandbox exited with code {rc}"
            if rc > 128 and rc - 128 in _SIGNAL_NUMBERS:  # runsc passes on a killed process's 128 + n
                cause += f" (128 + {signal.Signals(rc - 128).name}: a process of the sandbox was killed)"
        if tail:
            cause += " (" + " | ".join(tail)[-300:] + ")"
        return ExitInfo(cause=cause, returncode=rc)

    async def kill(self) -> None:
        sb, self._sb = self._sb, None
        self._release_spare()  # held again by the next start()
        if sb is None:
            return
        # this sandbox's tasks, taken now: a new sandbox may be started (and own new ones)
        # while this one is destroyed
        watches, drain = (self._oom_task, self._helpers_task), self._stderr_task
        self._oom_task = self._helpers_task = self._stderr_task = None
        for t in watches:
            if t is not None:
                t.cancel()
        if self._egress is not None:
            await self._egress.unlisten(str(sb.state_dir / "egress" / "proxy.sock"))
        await sb.destroy(self.log)
        if drain is not None:
            drain.cancel()
        self.log.info("sandbox %s removed", sb.container_id)

    def usage(self, reset_peak: bool = False) -> Usage | None:
        """From the sandbox's cgroup (memory in use and its peak, its processes' CPU
        time); None with no cgroup (rootless, or cgroups not usable) or no running sandbox."""
        sb = self._sb
        if sb is None or sb.cgroup is None or sb.checkpointed:
            return None
        memory = sb.cgroup.memory_used_bytes()
        if memory is None:
            return None
        peak = sb.cgroup.memory_peak_bytes()
        if reset_peak:
            sb.cgroup.reset_memory_peak()
        return Usage(memory, sb.cgroup.cpu_seconds(), "cgroup", peak)

    def explain_interpreter_death(self, cause: str) -> str:
        """Name the memory limit when the interpreter was OOM-killed (bubblewrap:
        the cgroup's OOM killer picks the interpreter, the agent survives)."""
        sb = self._sb
        if sb is not None and sb.cgroup is not None and sb.cgroup.oom_detected(since=sb.oom_kills_seen):
            sb.oom_kills_seen = sb.cgroup.oom_kills()
            return f"{sb.cgroup.oom_cause()} ({cause})"
        return cause

    # ---- idle lifecycle (sandbox_kernel.lifecycle) ----------------------------------------

    async def pause(self) -> None:
        """Freeze the sandbox: CPU freed, memory kept (``runsc pause``; cgroup
        freezer or SIGSTOP of the process tree for bubblewrap)."""
        sb = self._sb
        if sb is None or sb.frozen or sb.checkpointed:
            return
        await sb.freeze()

    async def checkpoint(self) -> None:
        """Write the container's memory to ``<state>/checkpoint`` and end it
        (``runsc checkpoint``); :meth:`resume` restores it."""
        sb = self._sb
        if sb is None or not self.capabilities.checkpoint:
            raise NotImplementedError("only the gVisor runtime can checkpoint")
        if sb.checkpointed:
            return
        self._check_checkpoint_disk(sb)
        await sb.checkpoint(self.image_compression(sb.state_dir))

    def checkpoint_image(self) -> Path | None:
        """The image directory of the checkpointed sandbox (what :meth:`checkpoint` wrote and
        :meth:`resume` restores), or None when it is not checkpointed; read by the Ray
        backend's owner on the node, which moves the image to wherever the restore lands."""
        sb = self._sb
        return sb.state_dir / "checkpoint" if sb is not None and sb.checkpointed else None

    def image_compression(self, state_dir: Path) -> str:
        """``checkpoint_compression`` for an image under ``state_dir``: ``auto`` is ``none``
        on a disk, ``flate-best-speed`` on a tmpfs or ramfs (memory)."""
        if self.checkpoint_compression != "auto":
            return str(self.checkpoint_compression)
        return "flate-best-speed" if in_memory_fs(state_dir) else "none"

    def _check_checkpoint_disk(self, sb: LocalSandbox) -> None:
        """Refuse a checkpoint the disk cannot hold, before runsc writes any of it.

        Disk taken since the sandbox was admitted (another kernel's image, a user's
        file) would make ``runsc checkpoint`` fail with ENOSPC half-way: the sandbox
        ended and a partial image filling the disk other kernels checkpoint to.  The
        image is at most about the cgroup's memory in use (measured with 10 MiB of random
        bytes in the interpreter: 132 MiB in use, a 34 MiB image; runsc compresses it).

        Raises
        ------
        SandboxKernelError
            Naming the free and needed MiB; the idle lifecycle skips the level (the
            sandbox stays paused until the stop that replaces it, which says so).
        """
        used = sb.cgroup.memory_used_mib() if sb.cgroup is not None else 0
        free = disk_free_mib(sb.state_dir.parent)  # the parent: a service's sandbox directory is root's
        if free < used:
            raise SandboxKernelError(f"not enough disk for the checkpoint: {free} MiB free under "
                                     f"{sb.state_dir.parent}, its image may take up to {used} MiB "
                                     "(the sandbox's memory in use)")

    async def _admit_restore(self, sb: LocalSandbox) -> None:
        """Take the memory a restore needs, retrying every second for :attr:`restore_wait_s`
        while the machine is full (nobody else's sandbox is touched); :attr:`notice` says so.

        Raises
        ------
        AdmissionRefused
            Still full after the wait; the sandbox stays checkpointed.
        """
        loop = asyncio.get_running_loop()
        t0, refused = loop.time(), False
        try:
            while True:
                try:
                    await asyncio.to_thread(sb.reserve_restore, self.admission)
                except AdmissionRefused as err:
                    waited = loop.time() - t0
                    if waited >= self.restore_wait_s:
                        raise AdmissionRefused(
                            f"{err}; waited {waited:.0f} s for memory to restore this kernel's checkpoint. "
                            "Its state is kept on disk: run the cell again once memory is free",
                            **err.details) from err  # type: ignore[arg-type]
                    if not refused:
                        self.log.warning("restore of %s waits for memory: %s", sb.container_id, err)
                    refused = True
                    self.waiting_for = (f"memory to restore this kernel (the machine is full: {err}; "
                                        f"retrying for up to {self.restore_wait_s:.0f} s)")
                    await asyncio.sleep(1.0)
                    continue
                if refused:
                    self.notice = (f"waited {loop.time() - t0:.0f} s for memory to restore this kernel "
                                   "(the machine was full)")
                return
        finally:
            self.waiting_for = None

    async def resume(self) -> None:
        """Thaw a frozen sandbox, or restore a checkpointed one (``runsc restore``
        becomes the new runtime process; :meth:`read` follows it)."""
        sb = self._sb
        if sb is None:
            raise SandboxDied("the sandbox is not running")
        if not sb.checkpointed:
            await sb.thaw()
            return
        await self._admit_restore(sb)
        await sb.restore()
        self._stderr_task = asyncio.ensure_future(self._drain_stderr(sb))
        self._watch(sb)  # the restore's own helpers
