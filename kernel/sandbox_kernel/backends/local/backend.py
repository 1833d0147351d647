"""The local backend: gVisor (``runsc``, default) or bubblewrap on this machine.

What the sandbox sees (both runtimes):

* ``/usr`` (and the ``/bin``, ``/lib``... links into it) read-only;
* a curated ``/etc``: generated ``passwd``, ``group`` and ``hosts``, the
  loader cache and ``alternatives`` read-only; never ``shadow`` or ``ssh``;
* the Python environment of :attr:`Policy.python` (its ``sys.prefix`` and
  ``sys.base_prefix``) read-only at the same paths, so what is pip-installed
  beside the kernel imports inside; intermediate directories appear empty;
* ``/home/sandbox`` (``HOME`` and working directory) and ``/tmp``: tmpfs of
  :attr:`Policy.scratch_mib`, gone with the sandbox;
* the agent at ``/opt/sandbox-kernel/agent.py`` read-only;
* no network interface but loopback, no resolver; an environment built from
  scratch (:func:`sandbox_env`), never inherited; uid 65534.

The argv of each runtime is built by one function from the policy
(:func:`bwrap_argv`, :func:`runsc_argv` and :func:`oci_config`), never as a
shell string.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from ...errors import RuntimeUnavailable, SandboxDied, SandboxKernelError, SandboxStartError
from ...policy import Policy
from ..base import TAG, Capabilities, ExitInfo, SandboxBackend
from . import bwrap
from . import cgroups as limits
from .gvisor import RUNSC_ENV, oci_config, prepare_rootfs, runsc_argv, statx_shim
from .layout import BWRAP_BOUNDARY, GVISOR_BOUNDARY, HostLayout, host_layout, state_base, write_etc

# ----------------------------------------------------------------------------
# Runtime choice
# ----------------------------------------------------------------------------


def resolve_runtime(requested: str) -> str:
    """Map ``auto`` to ``gvisor`` or ``bubblewrap`` and check the program exists.

    Raises
    ------
    RuntimeUnavailable
        With the install command, when the requested runtime is missing.
    """
    have_runsc = shutil.which("runsc") is not None and os.geteuid() == 0
    have_bwrap = shutil.which("bwrap") is not None
    if requested == "gvisor":
        if shutil.which("runsc") is None:
            raise RuntimeUnavailable("gVisor's runsc is not installed: apt-get install runsc "
                                     "(or use --SandboxKernel.runtime=bubblewrap)")
        if os.geteuid() != 0:
            raise RuntimeUnavailable("the gVisor runtime needs root here; use "
                                     "--SandboxKernel.runtime=bubblewrap or run as root")
        return "gvisor"
    if requested == "bubblewrap":
        if not have_bwrap:
            raise RuntimeUnavailable("bubblewrap is not installed: apt-get install bubblewrap")
        return "bubblewrap"
    if have_runsc:
        return "gvisor"
    if have_bwrap:
        return "bubblewrap"
    raise RuntimeUnavailable("no sandbox runtime: apt-get install runsc bubblewrap "
                             "(then run sandbox-kernel doctor)")


# ----------------------------------------------------------------------------
# The backend
# ----------------------------------------------------------------------------


@dataclass
class _Sandbox:
    proc: asyncio.subprocess.Process
    state_dir: Path
    runtime: str
    container_id: str
    stderr_tail: bytearray = field(default_factory=bytearray)
    #: Idle lifecycle (see :mod:`sandbox_kernel.lifecycle`): frozen by pause(),
    #: written to disk by checkpoint(); ``reattached`` is set while ``proc`` is current.
    frozen: bool = False
    checkpointed: bool = False
    stopped_pids: list = field(default_factory=list)
    reattached: asyncio.Event = field(default_factory=asyncio.Event)
    watchdog_fd: int | None = None
    watchdog_proc: asyncio.subprocess.Process | None = None
    cgroup: limits.SandboxCgroup | None = None
    oom_kills_seen: int = 0


class LocalBackend(SandboxBackend):
    """A sandbox on this machine; see the module docstring for what it sees."""

    name = "local"
    #: bubblewrap dies with its parent (the proxy); the warm pool's launcher turns this off,
    #: since its sandboxes outlive the pool daemon once handed to a proxy (the watchdog reaps).
    _bwrap_die_with_parent = True

    def __init__(self, policy: Policy, kernel_id: str, log: logging.Logger | None = None,
                 pool_socket: str | None = None):
        super().__init__(policy, kernel_id, log)
        self.runtime = resolve_runtime(policy.runtime)
        self._sb: _Sandbox | None = None
        self._stderr_task: asyncio.Task | None = None
        #: Unix socket of a warm pool (:mod:`sandbox_kernel.pool`); None or "": cold starts only.
        self.pool_socket = pool_socket
        #: The current sandbox came from the warm pool.
        self.pooled = False

    @property
    def capabilities(self) -> Capabilities:
        if self.runtime == "gvisor":  # runsc pause/resume, runsc checkpoint/restore
            return Capabilities(boundary=GVISOR_BOUNDARY, pause_keeps_memory=True,
                                pause_keeps_files=True, checkpoint=True)
        # freeze (cgroup freezer or SIGSTOP); CRIU fails on this kernel: no checkpoint
        return Capabilities(boundary=BWRAP_BOUNDARY, pause_keeps_memory=True, pause_keeps_files=True)

    def describe(self) -> dict:
        d = super().describe()
        d["runtime"] = self.runtime
        if self._sb:
            d["container_id"] = self._sb.container_id
            d["pooled"] = self.pooled
        return d

    async def start(self) -> None:
        await self.kill()
        self.pooled = False
        if self.pool_socket:
            from .pool import client as pool

            if await pool.start_from_pool(self, self.pool_socket):
                return
        layout = host_layout(self.policy)
        cid = f"{TAG}-{self.kernel_id[:12]}-{uuid.uuid4().hex[:6]}"
        state_dir = state_base() / cid
        state_dir.mkdir(mode=0o711)
        (state_dir / "tag.json").write_text(json.dumps(
            {"kernel_id": self.kernel_id, "proxy_pid": os.getpid(), "created_at": time.time(),
             "runtime": self.runtime, "owner_uid": os.getuid()}))
        cgroup = None
        try:
            write_etc(state_dir / "etc")
            os.chmod(state_dir / "etc", 0o755)
            cgroup = self._make_cgroup(cid)
            if self.runtime == "gvisor":
                proc = await self._start_gvisor(layout, state_dir, cid, cgroup)
            else:
                proc = await self._start_bwrap(layout, state_dir, cgroup)
        except BaseException as err:  # leave nothing behind, whatever failed
            shutil.rmtree(state_dir, ignore_errors=True)
            if cgroup is not None:
                with contextlib.suppress(limits.CgroupError):
                    cgroup.remove()
            if isinstance(err, OSError):
                raise SandboxStartError(f"could not launch the {self.runtime} sandbox: {err}") from err
            raise
        self._sb = _Sandbox(proc=proc, state_dir=state_dir, runtime=self.runtime, container_id=cid,
                            cgroup=cgroup)
        self._sb.reattached.set()
        self._stderr_task = asyncio.ensure_future(self._drain_stderr(self._sb))
        await self._arm_watchdog(self._sb)
        self.log.info("sandbox %s started: %s", cid, self.capabilities.boundary)

    def _stdio(self) -> dict:
        """stdin/stdout/stderr of the runtime process (pipes; the pool passes its own fds)."""
        return {"stdin": asyncio.subprocess.PIPE, "stdout": asyncio.subprocess.PIPE,
                "stderr": asyncio.subprocess.PIPE}

    def _make_cgroup(self, cid: str) -> limits.SandboxCgroup | None:
        """The sandbox's cgroup with the policy's limits, or None where cgroups are unusable
        (not root, cgroup v2 without delegation): then only rlimits and tmpfs sizes hold."""
        if os.geteuid() != 0:
            return None
        ok, why = limits.cgroups_usable()
        if not ok:
            self.log.warning("no cgroup limits for this sandbox: %s", why)
            return None
        return limits.SandboxCgroup.create(cid, self.policy, runtime=self.runtime)

    async def _start_bwrap(self, layout: HostLayout, state_dir: Path,
                           cgroup: limits.SandboxCgroup | None) -> asyncio.subprocess.Process:
        launch = bwrap.prepare_launch(
            self.policy, layout, state_dir, cgroup=cgroup,
            rlimit_as_bytes=limits.address_space_limit_bytes(self.policy))
        argv = launch.argv if self._bwrap_die_with_parent else \
            [a for a in launch.argv if a != "--die-with-parent"]
        try:
            return await asyncio.create_subprocess_exec(
                *argv, **self._stdio(), env={}, pass_fds=launch.pass_fds,
                preexec_fn=launch.preexec_fn, limit=1 << 20, cwd="/",
            )
        finally:
            launch.close()

    async def _start_gvisor(self, layout: HostLayout, state_dir: Path, cid: str,
                            cgroup: limits.SandboxCgroup | None) -> asyncio.subprocess.Process:
        bundle = state_dir / "bundle"
        bundle.mkdir()
        config = oci_config(self.policy, layout, etc_dir=str(state_dir / "etc"), cgroup=cgroup,
                            shim=statx_shim(state_base()))
        prepare_rootfs(bundle / "rootfs", config, layout)
        (bundle / "config.json").write_text(json.dumps(config, indent=1))
        root = state_dir / "runsc"
        root.mkdir(mode=0o700)
        argv = runsc_argv(str(root), runsc=shutil.which("runsc") or "runsc")
        argv += ["run", "--bundle", str(bundle), cid]
        return await asyncio.create_subprocess_exec(
            *argv, **self._stdio(), env=RUNSC_ENV,
            limit=1 << 20, cwd=str(state_dir), start_new_session=True,
        )

    async def _drain_stderr(self, sb: _Sandbox) -> None:
        stream = sb.proc.stderr  # this process's; a restore starts another drain
        assert stream is not None
        while True:
            chunk = await stream.read(65536)
            if not chunk:
                return
            sb.stderr_tail += chunk
            del sb.stderr_tail[:-8192]
            self.log.debug("sandbox stderr: %s", chunk[:2000].decode("utf-8", "replace").rstrip())

    async def read(self) -> bytes:
        while True:
            sb = self._sb
            if sb is None or sb.proc.stdout is None:
                return b""
            proc = sb.proc
            data = await proc.stdout.read(1 << 20)
            if data:
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
            return ExitInfo(cause=sb.cgroup.oom_cause(), oom=True, returncode=rc)
        tail = sb.stderr_tail.decode("utf-8", "replace").strip().splitlines()[-3:]
        if getattr(sb.proc, "exit_status_unknown", False) and rc is not None:
            cause = "the sandbox's runtime process ended (a pooled sandbox: exit status unknown here)"
        elif rc is None:
            cause = "the sandbox stopped answering"
        elif rc < 0:
            cause = f"the sandbox was killed by signal {signal.Signals(-rc).name}"
        else:
            cause = f"the sandbox exited with code {rc}"
        if tail:
            cause += " (" + " | ".join(tail)[-300:] + ")"
        return ExitInfo(cause=cause, returncode=rc)

    async def kill(self) -> None:
        sb, self._sb = self._sb, None
        if sb is None:
            return
        sb.reattached.set()
        await self._unfreeze(sb)
        if sb.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                if sb.runtime == "gvisor":
                    await self._runsc(sb, "kill", sb.container_id, "KILL")
                sb.proc.kill()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(sb.proc.wait(), 10)
        if sb.runtime == "gvisor":
            await self._runsc(sb, "delete", "--force", sb.container_id)
        if self._stderr_task:
            self._stderr_task.cancel()
        self._disarm_watchdog(sb)
        if sb.watchdog_proc is not None:  # reap it on this loop (it exits once disarmed)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(sb.watchdog_proc.wait(), 5)
        if sb.cgroup is not None:
            try:
                sb.cgroup.remove()
            except limits.CgroupError as err:
                self.log.warning("%s; `sandbox-kernel gc` will retry", err)
        shutil.rmtree(sb.state_dir, ignore_errors=True)
        self.log.info("sandbox %s removed", sb.container_id)

    def explain_interpreter_death(self, cause: str) -> str:
        """Name the memory limit when the interpreter was OOM-killed (bubblewrap:
        the cgroup's OOM killer picks the interpreter, the agent survives)."""
        sb = self._sb
        if sb is not None and sb.cgroup is not None and sb.cgroup.oom_detected(since=sb.oom_kills_seen):
            sb.oom_kills_seen = sb.cgroup.oom_kills()
            return f"{sb.cgroup.oom_cause()} ({cause})"
        return cause

    async def _runsc(self, sb: _Sandbox, *args: str) -> int:
        argv = runsc_argv(str(sb.state_dir / "runsc"), runsc=shutil.which("runsc") or "runsc") + list(args)
        proc = await asyncio.create_subprocess_exec(
            *argv, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
            env=RUNSC_ENV)
        try:
            return await asyncio.wait_for(proc.wait(), 30)
        except asyncio.TimeoutError:
            proc.kill()
            return -1

    # ---- idle lifecycle (sandbox_kernel.lifecycle) ----------------------------------------

    async def _arm_watchdog(self, sb: _Sandbox) -> None:
        """Start the dead-man's switch (:mod:`sandbox_kernel.watchdog`) for ``sb``."""
        r, w = os.pipe()  # both ends non-inheritable; only the watchdog gets ``r``
        try:
            sb.watchdog_proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "sandbox_kernel.backends.local.watchdog", "--fd", str(r),
                "--state-dir", str(sb.state_dir), "--runtime", sb.runtime,
                "--container-id", sb.container_id,
                stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.DEVNULL, pass_fds=(r,), start_new_session=True, cwd="/")
        except OSError as err:
            os.close(w)
            self.log.warning("no watchdog for sandbox %s: %s", sb.container_id, err)
        else:
            sb.watchdog_fd = w
        finally:
            os.close(r)

    @staticmethod
    def _disarm_watchdog(sb: _Sandbox) -> None:
        if sb.watchdog_fd is None:
            return
        from . import watchdog

        with contextlib.suppress(OSError):
            os.write(sb.watchdog_fd, watchdog.DISARM)
        with contextlib.suppress(OSError):
            os.close(sb.watchdog_fd)
        sb.watchdog_fd = None

    async def _runsc_checked(self, sb: _Sandbox, *args: str, timeout_s: float = 60) -> None:
        argv = runsc_argv(str(sb.state_dir / "runsc"), runsc=shutil.which("runsc") or "runsc") + list(args)
        proc = await asyncio.create_subprocess_exec(
            *argv, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
            env=RUNSC_ENV)
        try:
            _, err = await asyncio.wait_for(proc.communicate(), timeout_s)
        except asyncio.TimeoutError:
            proc.kill()
            raise SandboxKernelError(f"runsc {args[0]} did not finish in {timeout_s:.0f} s") from None
        if proc.returncode != 0:
            tail = err.decode("utf-8", "replace").strip().splitlines()[-2:]
            raise SandboxKernelError(f"runsc {args[0]} failed (exit {proc.returncode}): "
                                     + " | ".join(tail)[-300:])

    def _freeze_bwrap(self, sb: _Sandbox) -> None:
        if sb.cgroup is not None:
            sb.cgroup.freeze()
            return
        # No per-sandbox cgroup wired: SIGSTOP the whole process tree (see docs/decisions.md).
        from .watchdog import descendants

        pids = descendants(sb.proc.pid)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
        sb.stopped_pids = pids

    async def _unfreeze(self, sb: _Sandbox) -> None:
        if not sb.frozen:
            return
        if sb.runtime == "gvisor":
            with contextlib.suppress(SandboxKernelError):
                await self._runsc_checked(sb, "resume", sb.container_id)
        else:
            if sb.cgroup is not None and not sb.stopped_pids:
                sb.cgroup.thaw()
            for pid in reversed(sb.stopped_pids):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
            sb.stopped_pids = []
        sb.frozen = False

    async def pause(self) -> None:
        """Freeze the sandbox: CPU freed, memory kept (``runsc pause``; cgroup
        freezer or SIGSTOP of the process tree for bubblewrap)."""
        sb = self._sb
        if sb is None or sb.frozen or sb.checkpointed:
            return
        if sb.runtime == "gvisor":
            await self._runsc_checked(sb, "pause", sb.container_id)
        else:
            self._freeze_bwrap(sb)
        sb.frozen = True

    async def checkpoint(self) -> None:
        """Write the container's memory to ``<state>/checkpoint`` and end it
        (``runsc checkpoint``); :meth:`resume` restores it."""
        sb = self._sb
        if sb is None or sb.runtime != "gvisor":
            raise NotImplementedError("only the gVisor runtime can checkpoint")
        if sb.checkpointed:
            return
        image = sb.state_dir / "checkpoint"
        shutil.rmtree(image, ignore_errors=True)
        image.mkdir(mode=0o700)
        await self._unfreeze(sb)  # this runsc does not checkpoint a paused container reliably
        sb.reattached.clear()
        sb.checkpointed = True
        try:
            await self._runsc_checked(sb, "checkpoint", "--image-path", str(image), sb.container_id)
        except SandboxKernelError:
            sb.checkpointed = False
            sb.reattached.set()
            raise
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(sb.proc.wait(), 10)
        with contextlib.suppress(SandboxKernelError):
            await self._runsc_checked(sb, "delete", "--force", sb.container_id)

    async def resume(self) -> None:
        """Thaw a frozen sandbox, or restore a checkpointed one (``runsc restore``
        becomes the new runtime process; :meth:`read` follows it)."""
        sb = self._sb
        if sb is None:
            raise SandboxDied("the sandbox is not running")
        if not sb.checkpointed:
            await self._unfreeze(sb)
            return
        argv = runsc_argv(str(sb.state_dir / "runsc"), runsc=shutil.which("runsc") or "runsc")
        argv += ["restore", "--image-path", str(sb.state_dir / "checkpoint"),
                 "--bundle", str(sb.state_dir / "bundle"), sb.container_id]
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, env=RUNSC_ENV,
            limit=1 << 20, cwd=str(sb.state_dir), start_new_session=True,
        )
        sb.proc = proc
        sb.checkpointed = False
        sb.stderr_tail.clear()
        self._stderr_task = asyncio.ensure_future(self._drain_stderr(sb))
        sb.reattached.set()
