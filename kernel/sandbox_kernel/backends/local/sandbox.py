"""One local sandbox, from creation to teardown: :class:`LocalSandbox`.

A local sandbox is a state directory ``<state base>/sandbox-kernel-<kernel
id>-<suffix>`` (``tag.json``, the generated ``/etc``, the runtime's bundle and
root), a cgroup of the same name (root only), one runtime process running the
agent, and a watchdog process that reaps all of it if its owner dies.  This
module is the only place that makes or removes those:

* :meth:`LocalSandbox.create` makes them in order and removes what it made if
  a step fails (``LocalBackend.start``, the warm pool's daemon);
* :meth:`LocalSandbox.destroy` is the owner's teardown, with the process in
  hand (``LocalBackend.kill``, the pool discarding a sandbox);
* :meth:`LocalSandbox.reap` is the teardown by name alone, for whoever finds
  the sandbox orphaned (the watchdog when its owner died, ``sandbox-kernel gc``).

What differs between gVisor and bubblewrap is asked of the sandbox's
:class:`.runtime.Runtime` (:func:`resolve_runtime`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import shutil
import signal
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...errors import RuntimeUnavailable, SandboxStartError
from ...policy import Policy
from ..base import TAG
from . import jedi_cache, procs, template
from .admission import CHECKPOINTED_MARK, Admission
from .bwrap import Bubblewrap
from .cgroups import CgroupError, SandboxCgroup, cgroups_usable
from .gvisor import Gvisor
from .idmap import Folder
from .layout import host_layout, state_base, write_etc
from .runsc import find_runsc, have_runsc, probe
from .runtime import PIPES, Runtime

log = logging.getLogger("sandbox_kernel.backends.local")

#: The watchdog's module, run as ``python -m`` beside every sandbox (:mod:`.watchdog`).
WATCHDOG_MODULE = "sandbox_kernel.backends.local.watchdog"
#: What the owner writes to the watchdog's pipe before it removes the sandbox itself.
DISARM = b"q"


def resolve_runtime(requested: str, runsc_path: str = "", gvisor_platform: str = "auto") -> Runtime:
    """The runtime for ``LocalBackend.runtime``: ``auto`` means gVisor where runsc
    works (installed; as root, or rootless where this runsc runs so for this user:
    probed once, :func:`.runsc.probe`), else bubblewrap.

    Parameters
    ----------
    requested : {"auto", "gvisor", "bubblewrap"}
    runsc_path, gvisor_platform : str
        ``LocalBackend.runsc_path`` and ``gvisor_platform`` for a gVisor runtime
        (resolved at its first launch, :meth:`.gvisor.Gvisor.resolve`).

    Raises
    ------
    RuntimeUnavailable
        With the install command, when the requested runtime is missing; naming
        ``runsc_path`` when one is set and is not an executable (also for ``auto``,
        which never falls back to bubblewrap past an operator's choice of runsc).
    """
    runsc_there = have_runsc(runsc_path)
    have_bwrap = shutil.which("bwrap") is not None
    if runsc_path and not runsc_there and requested != "bubblewrap":
        raise RuntimeUnavailable(f"LocalBackend.runsc_path={runsc_path!r} is not an executable file")
    if requested == "gvisor":
        if not runsc_there:
            raise RuntimeUnavailable("gVisor's runsc is not installed: bash scripts/setup.sh, or apt-get "
                                     "install runsc (or use --LocalBackend.runtime=bubblewrap)")
        return Gvisor(runsc_path, gvisor_platform)  # rootless when not root (.runsc.rootless_here)
    if requested == "bubblewrap":
        if not have_bwrap:
            raise RuntimeUnavailable("bubblewrap is not installed: apt-get install bubblewrap")
        return Bubblewrap()
    if runsc_there and (os.geteuid() == 0 or probe(find_runsc(runsc_path)).get("runs", False)):
        return Gvisor(runsc_path, gvisor_platform)  # not root: rootless, where this runsc runs so
    if have_bwrap:
        return Bubblewrap()
    raise RuntimeUnavailable("no sandbox runtime: apt-get install runsc bubblewrap "
                             "(then run sandbox-kernel doctor)")


def runtime_named(name: str) -> Runtime:
    """The runtime a sandbox was made with, from ``tag.json`` or the watchdog's argv.

    Anything but ``"gvisor"`` (a bubblewrap sandbox, or a tag that could not be
    read) reaps as bubblewrap: by killing every process that names the state
    directory, which covers runsc's processes too.
    """
    return Gvisor() if name == Gvisor.name else Bubblewrap()


@dataclass(eq=False)
class LocalSandbox:
    """The record of one local sandbox; see the module docstring.

    Attributes
    ----------
    runtime : Runtime
    container_id : str
        ``sandbox-kernel-<kernel id[:12]>-<6 hex>``; also the state directory's
        and the cgroup's name.
    state_dir : Path
    cgroup : SandboxCgroup or None
        None where cgroups are unusable (not root, cgroup v2).
    proc : asyncio.subprocess.Process or AdoptedProcess or None
        The runtime process (``runsc run``/``restore`` or ``bwrap``); None
        before launch and for a sandbox found by name.
    frozen, checkpointed : bool
        Idle lifecycle: frozen by :meth:`freeze`, written to disk by :meth:`checkpoint`.
    reattached : asyncio.Event
        Set while :attr:`proc` is current (cleared during a checkpoint).
    """

    runtime: Runtime
    container_id: str
    state_dir: Path
    cgroup: SandboxCgroup | None = None
    proc: Any = None
    stderr_tail: bytearray = field(default_factory=bytearray)
    frozen: bool = False
    checkpointed: bool = False
    stopped_pids: list[int] = field(default_factory=list)
    reattached: asyncio.Event = field(default_factory=asyncio.Event)
    watchdog_fd: int | None = None
    watchdog_proc: asyncio.subprocess.Process | None = None
    oom_kills_seen: int = 0
    #: Its memory limit, MiB, recorded in ``tag.json`` for admission (:mod:`.admission`).
    memory_mib: int = 0
    #: Which of the runtime's helper processes died (``watches.end_on_helper_death``).
    helper_died: str | None = None
    #: Why the memory watch of a sandbox without a cgroup ended it (``watches.end_on_memory``).
    memory_breach: str | None = None
    #: Start templates (:mod:`.template`): the key this sandbox's template has; the agent's
    #: output kept until its ready frame while a template is to be made from it (else None);
    #: output to hand the proxy before the runtime's own (a restored template's ready frame).
    template_key: str | None = None
    capture: bytearray | None = None
    replay: bytes = b""
    #: Restored from a start template (``kernel_info["sandbox"]["from_template"]``).
    from_template: bool = False
    #: The jedi cache build bound into it (:func:`.jedi_cache.seed`), or None.
    jedi_seed: str | None = None
    #: The sandbox service's workspace folder, as its owner's fds (:class:`.idmap.Folder`);
    #: the service keeps and closes it.  None: a workspace by name (or none).
    folder: Folder | None = None

    def helper_pids(self) -> dict[int, str]:
        """Pid -> name of the runtime's helper processes running now (:attr:`.runtime.Runtime.helpers`).

        Not a helper's own child: gVisor's gofer and sentry fork children while they boot,
        which carry their parent's name for a few milliseconds (until their exec or exit;
        seen as root and rootless, runsc 20240729)."""
        named = {}
        for pid in procs.processes_mentioning(str(self.state_dir)):
            name = procs.executable_name(pid)
            if name in self.runtime.helpers:
                named[pid] = self.runtime.helpers[name]
        return {pid: what for pid, what in named.items() if procs.parent(pid) not in named}

    # ---- creation -------------------------------------------------------------------

    @classmethod
    async def create(cls, policy: Policy, runtime: Runtime, kernel_id: str, *, python: str,
                     stdio: Mapping[str, int] = PIPES, die_with_parent: bool = True,
                     admission: Admission | None = None,
                     egress: Callable[[Path], Awaitable[str]] | None = None,
                     prefixes: list[str] | None = None, tag: dict[str, Any] | None = None,
                     template_base_key: str | None = None, snapshot_image: Path | None = None,
                     folder: Folder | None = None, log: logging.Logger = log) -> LocalSandbox:
        """Make a sandbox and start the agent in it, with its watchdog armed.

        Called by ``LocalBackend.start`` (cold start) and by the warm pool's
        daemon.  In order: the mounts (:func:`host_layout`, with the jedi cache
        built for the interpreter: :func:`.jedi_cache.seed`), the watchdog, the
        state directory with ``tag.json`` and ``/etc``, the cgroup, the runtime
        process.  If a step fails, what was made is removed.

        Parameters
        ----------
        python : str
            Host path of the interpreter run inside (``LocalBackend.python``).
        stdio : mapping
            The runtime process's stdin/stdout/stderr: pipes to this process by
            default; the pool passes fds it hands on later.
        die_with_parent : bool
            See :meth:`Runtime.launch`.
        admission : Admission, optional
            Check what the machine can still give before the state directory is made
            (:meth:`.admission.Admission.reserve`); None: no check (the warm pool, whose
            size the operator chose; its sandboxes still count for everyone else).
        egress : callable, optional
            ``network=allowlist``: the kernel's egress proxy's ``listen``, called with
            ``<state dir>/egress`` before the launch; that directory (its socket) is
            bound into the sandbox.
        prefixes : list of str, optional
            The interpreter's environment directories, found and checked by the
            caller (the sandbox service, as the requesting user): ``python`` is then
            not run here, and no jedi cache is bound.  Default: ask ``python``.
        tag : dict, optional
            More ``tag.json`` fields (the service's ``owner_uid`` and ``proxy_pid``).
        template_base_key : str, optional
            Start templates (:mod:`.template`, gVisor, ``network=none``): restore the
            template of this key and the layout's jedi cache when there is one
            (:attr:`from_template`, :attr:`replay`), else start as usual and keep the
            agent's output until ``ready`` (:attr:`capture`) for the backend to make it.
        snapshot_image : Path, optional
            Restore this snapshot's image (:mod:`.snapshots`: a rewind) instead; its
            links are made as a template's (:func:`.template.link_image`), or, on another
            file system, it is read in place.
        folder : Folder, optional
            The sandbox service's workspace (``policy.workspace`` ``ro``/``rw``): the
            peer's folder as fds, bound through its id-mapped clone
            (:func:`.idmap.stage_folder`); ``policy.workspace_path`` is then not read.

        Raises
        ------
        AdmissionRefused
            The machine cannot hold the sandbox (nothing was made).
        SandboxStartError
            The interpreter does not run, the runtime could not be launched, or
            the cgroup could not be set up (:class:`CgroupError`).
        """
        # the service's folder is its owner's fds: no name of it is looked at here
        layout = await asyncio.to_thread(host_layout, policy if folder is None else
                                         dataclasses.replace(policy, workspace_path=""), python, prefixes)
        if prefixes is None:  # the jedi cache is built by running ``python``: not for the service
            seed = await asyncio.to_thread(jedi_cache.seed, python)  # may start its build
            layout = dataclasses.replace(layout, jedi_seed=seed)
        cid = f"{TAG}-{kernel_id[:12]}-{uuid.uuid4().hex[:6]}"
        base = state_base()
        sb = cls(runtime=runtime, container_id=cid, state_dir=base / cid, memory_mib=policy.memory_mib,
                 jedi_seed=layout.jedi_seed, folder=folder)
        if folder is not None:
            layout = dataclasses.replace(layout, workspace=str(sb.state_dir / "workspace"), workspace_copied=False,
                                         workspace_ro_subdirs=tuple(folder.protected))

        def make_state_dir() -> None:
            sb.state_dir.mkdir(mode=0o711)
            sb.write_tag(kernel_id, **(tag or {}))

        # The watchdog first: from the state directory's first byte on, an owner that
        # dies (os._exit at shutdown, SIGKILL) leaves nothing behind.
        await sb._arm_watchdog(log)
        try:
            if admission is None:
                make_state_dir()
            else:
                may_checkpoint = runtime.capabilities.checkpoint and policy.checkpoint_after_s > 0
                await asyncio.to_thread(admission.reserve, base, policy.memory_mib, make_state_dir,
                                        checkpoint_mib=policy.memory_mib if may_checkpoint else 0)
            write_etc(sb.state_dir / "etc")
            os.chmod(sb.state_dir / "etc", 0o755)  # noqa: S103 - the generated /etc the sandbox reads
            sb.cgroup = _make_cgroup(cid, policy, runtime, log)
            if egress is not None:
                await egress(sb.state_dir / "egress")
                layout = dataclasses.replace(layout, egress_dir=str(sb.state_dir / "egress"))
            found = None
            if snapshot_image is not None:
                found = template.Template(image=snapshot_image, ready=b"")
            elif template_base_key is not None and layout.jedi_seed is not None:
                sb.template_key = await asyncio.to_thread(template.template_key, template_base_key, layout)
                found = template.find(sb.template_key)
            image = None
            if snapshot_image is not None and found is not None:
                try:
                    image = await asyncio.to_thread(template.link_image, found, cid, sb.state_dir)
                except OSError as err:  # another file system: the image in place
                    log.info("snapshot image not linked (%s): restoring it in place", err)
                    image = snapshot_image
            elif found is not None and sb.template_key is not None:
                try:
                    image = await asyncio.to_thread(template.link_image, found, cid, sb.state_dir)
                    template.touch(sb.template_key)
                except OSError as err:  # removed since find(): start cold
                    log.info("start template %s went away before its restore (%s): starting cold",
                             sb.template_key, err)
            if found is not None and image is not None:
                sb.proc = await runtime.launch_from_image(sb, policy, layout, stdio, image)
                sb.replay, sb.from_template = found.ready, snapshot_image is None
            else:
                sb.proc = await runtime.launch(sb, policy, layout, stdio, die_with_parent=die_with_parent)
                sb.capture = bytearray() if sb.template_key is not None else None
        except BaseException as err:  # leave nothing behind, whatever failed
            await sb.destroy(log)
            if isinstance(err, OSError):
                raise SandboxStartError(f"could not launch the {runtime.name} sandbox: {err}") from err
            raise
        sb.reattached.set()
        return sb

    def write_tag(self, kernel_id: str, **extra: Any) -> None:
        """Write ``tag.json``: who owns the sandbox, for ``gc`` and the pool's hand-over."""
        (self.state_dir / "tag.json").write_text(json.dumps(
            {"kernel_id": kernel_id, "proxy_pid": os.getpid(), "created_at": time.time(),
             "runtime": self.runtime.name, "owner_uid": os.getuid(), "memory_mib": self.memory_mib,
             **extra}))

    def handoff_info(self) -> dict[str, Any]:
        """What another process needs to adopt this sandbox (``LocalBackend.adopt``),
        besides the fds: container id, state directory, runtime, pid, cgroup name."""
        return {"container_id": self.container_id, "state_dir": str(self.state_dir),
                "runtime": self.runtime.name, "pid": self.proc.pid,
                "cgroup": self.cgroup.name if self.cgroup is not None else None}

    async def _arm_watchdog(self, log: logging.Logger) -> None:
        """Start the dead-man's switch (:mod:`.watchdog`): it holds the read end of a
        pipe whose only write end is :attr:`watchdog_fd`; EOF means the owner is gone."""
        r, w = os.pipe()  # both ends non-inheritable; only the watchdog gets ``r``
        try:
            self.watchdog_proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", WATCHDOG_MODULE, "--fd", str(r),
                "--state-dir", str(self.state_dir), "--runtime", self.runtime.name,
                "--container-id", self.container_id,
                stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.DEVNULL, pass_fds=(r,), start_new_session=True, cwd="/")
        except OSError as err:
            os.close(w)
            log.warning("no watchdog for sandbox %s: %s", self.container_id, err)
        else:
            self.watchdog_fd = w
        finally:
            os.close(r)

    def _disarm_watchdog(self) -> None:
        if self.watchdog_fd is None:
            return
        with contextlib.suppress(OSError):
            os.write(self.watchdog_fd, DISARM)
        with contextlib.suppress(OSError):
            os.close(self.watchdog_fd)
        self.watchdog_fd = None

    # ---- idle lifecycle ---------------------------------------------------------------

    async def freeze(self) -> None:
        """Stop every process, memory kept (:meth:`Runtime.pause`)."""
        await self.runtime.pause(self)
        self.frozen = True

    async def thaw(self) -> None:
        """Undo :meth:`freeze`; nothing if not frozen."""
        if not self.frozen:
            return
        await self.runtime.resume(self)
        self.frozen = False

    async def checkpoint(self, compression: str = "flate-best-speed") -> None:
        """Write the memory to disk and end the processes (:meth:`Runtime.checkpoint`, the
        image compressed or not); :meth:`restore` brings it back.  A frozen sandbox is
        thawed first (this runsc does not checkpoint a paused container reliably)."""
        await self.thaw()
        self.reattached.clear()
        self.checkpointed = True
        try:
            await self.runtime.checkpoint(self, compression)
        except BaseException:
            self.checkpointed = False
            self.reattached.set()
            raise
        with contextlib.suppress(OSError):  # admission: its memory is on disk now
            (self.state_dir / CHECKPOINTED_MARK).touch()

    def reserve_restore(self, admission: Admission | None) -> None:
        """Before :meth:`restore`: take its memory back for admission (the
        ``checkpointed`` mark removed), under the machine's admission lock.  Blocking.

        Raises
        ------
        AdmissionRefused
            The machine cannot hold it now; it stays checkpointed.
        """
        self.runtime.reserve_restore(self, admission)

    async def restore(self, stdio: Mapping[str, int] = PIPES) -> None:
        """Start a new runtime process from the checkpoint; it becomes :attr:`proc`
        (``stdio``: see :meth:`create`)."""
        self.proc = await self.runtime.restore(self, stdio)
        self.checkpointed = False
        self.stderr_tail.clear()
        self.reattached.set()

    # ---- teardown ---------------------------------------------------------------------

    async def destroy(self, log: logging.Logger = log) -> None:
        """The owner's teardown: end the processes, disarm the watchdog, remove the cgroup
        and the state directory.  Idempotent.

        Called by ``LocalBackend.kill``, by :meth:`create` when a step failed and by the
        warm pool when it discards a sandbox.  Processes of the sandbox stopped from
        outside (SIGSTOP) are continued first, so the runtime can end them; any process
        still naming the state directory afterwards is killed.
        """
        t0 = time.monotonic()
        steps: list[str] = []

        def step(name: str) -> None:
            steps.append(f"{name} {time.monotonic() - t0:.3f}")

        self.reattached.set()  # a reader waiting for a restore sees the end
        await self.thaw()
        # a process stopped from outside (SIGSTOP) cannot be asked to end: run on first
        await asyncio.to_thread(procs.signal_mentioning, str(self.state_dir), signal.SIGCONT)
        step("continued")
        if self.proc is not None:
            await self.runtime.kill(self)
        step("runtime ended")
        self._disarm_watchdog()
        if self.watchdog_proc is not None:  # reap it on this loop (it exits once disarmed)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.watchdog_proc.wait(), 5)
        step("watchdog ended")
        # whatever the runtime left running (a helper it lost track of): as the watchdog would
        await asyncio.to_thread(procs.kill_mentioning, str(self.state_dir))
        step("leftovers killed")
        if self.cgroup is not None:
            try:
                await asyncio.to_thread(self.cgroup.remove)
            except CgroupError as err:
                log.warning("%s; `sandbox-kernel gc` will retry", err)
        step("cgroup removed")
        await asyncio.to_thread(shutil.rmtree, self.state_dir, True)
        await asyncio.to_thread(template.release, self.container_id)
        step("state removed")
        # a slow teardown is worth an operator's eye: it delays a shutdown or a restart
        log.log(logging.INFO if time.monotonic() - t0 > 1.0 else logging.DEBUG,
                "teardown of %s (s since start): %s", self.container_id, ", ".join(steps))

    @classmethod
    def found(cls, state_dir: Path, runtime: str, container_id: str | None = None) -> LocalSandbox:
        """The record of a sandbox known only by its state directory (no process handle),
        for :meth:`reap`."""
        return cls(runtime=runtime_named(runtime), container_id=container_id or Path(state_dir).name,
                   state_dir=Path(state_dir))

    def reap(self) -> None:
        """Teardown by name, blocking: kill everything of the sandbox, frozen, paused or
        checkpointed, and delete its state directory.  Idempotent.

        Called by the watchdog when the owner died and by ``sandbox-kernel gc``
        (:mod:`.reaper`).  The runtime ends what it keeps (:meth:`Runtime.reap`: a
        paused gVisor container is resumed, killed and deleted), the cgroup is thawed,
        emptied and removed, and every host process whose argv names the state
        directory is killed.
        """
        self.runtime.reap(self)
        try:
            cgroup = self.cgroup or SandboxCgroup.existing(self.container_id)
            if cgroup is not None:
                cgroup.remove()
        except (OSError, CgroupError):
            pass
        procs.kill_mentioning(str(self.state_dir))
        shutil.rmtree(self.state_dir, ignore_errors=True)
        template.release(self.container_id)


def _make_cgroup(cid: str, policy: Policy, runtime: Runtime, log: logging.Logger) -> SandboxCgroup | None:
    """The sandbox's cgroup with the policy's limits, or None where cgroups are unusable
    (not root, cgroup v2 without delegation): then only rlimits and tmpfs sizes hold."""
    if os.geteuid() != 0:
        return None
    ok, why = cgroups_usable()
    if not ok:
        log.warning("no cgroup limits for this sandbox: %s", why)
        return None
    return SandboxCgroup.create(cid, policy, runtime=runtime.name)
