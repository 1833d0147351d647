"""The gVisor runtime: OCI bundle and runsc argv from the policy, and every runsc call.

runsc runs the agent in a user-space kernel, on the platform
:mod:`.runsc` chose (systrap where the runsc has it, else ptrace), without Docker: the bundle is
an empty read-only root with a mount point per bind, and ``config.json``.
:class:`Gvisor` is the runtime's strategy (launch, ``runsc pause``/``resume``,
``checkpoint``/``restore``, ``kill``/``delete``); every runsc invocation goes
through :func:`runsc_argv` and :class:`Runsc`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

from ...errors import SandboxKernelError
from ...guest import AGENT_PATH, EGRESS_DIR, JEDI_SEED_PATH, WORKSPACE_DIR, agent_archive
from ...policy import Policy
from ..base import Capabilities
from . import cgroups, idmap, procs, seccomp
from .admission import in_memory_fs
from .bwrap import address_space_limit_bytes
from .layout import (
    GVISOR_BOUNDARY,
    SANDBOX_GID,
    SANDBOX_HOME,
    SANDBOX_UID,
    HostLayout,
    agent_command,
    sandbox_env,
    state_base,
    workspace_fsize_bytes,
)
from .resource_view import cpu_list, sandbox_cpus
from .runsc import RUNSC_ENV, RunscChoice, choose_async, rootless_here, runsc_argv, statx_shim
from .runtime import PIPES, Runtime, SandboxRecord

log = logging.getLogger("sandbox_kernel.backends.local")

#: Where the statx shim (:func:`statx_shim`) is mounted inside.
SHIM_PATH = "/opt/sandbox-kernel/statx-shim.so"
#: The agent's capabilities inside the sandbox (it runs as uid 0 of the sandbox, the
#: interpreter as :data:`SANDBOX_UID` with none): start the interpreter under that uid,
#: hand it its socket directory, reach its sockets and signal its process group.
AGENT_CAPABILITIES = ["CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_KILL", "CAP_SETGID", "CAP_SETUID"]


def oci_config(policy: Policy, layout: HostLayout, *, etc_dir: str, command: list[str] | None = None,
               cgroup=None, shim: str | None = None, cpus: tuple[int, ...] | None = None,
               rootless: bool = False, workspace_source: str | None = None,
               protected_sources: Mapping[str, str] | None = None) -> dict:
    """Build the OCI runtime spec (``config.json``) for runsc from the policy.

    Parameters
    ----------
    workspace_source : str, optional
        The host path bound as the workspace instead of ``layout.workspace``: its
        id-mapped clone (:mod:`.idmap`).  A ``rw`` workspace adds ``linux.seccomp``
        (:func:`.seccomp.oci_setid_profile`; ``runsc --oci-seccomp``, :func:`oci_flags`).
    protected_sources : mapping of str to str, optional
        A protected subfolder's own read-only clone (``.git`` -> its point: the sandbox
        service's, :func:`.idmap.stage_folder`), bound instead of ``<workspace_source>/.git``.
    cpus : tuple of int, optional
        Host CPUs of the sandbox (:func:`.resource_view.sandbox_cpus`), see :func:`oci_linux`.
    rootless : bool
        runsc runs rootless (no cgroup): the guest's rlimits carry the memory limit
        too (:func:`oci_rlimits`).

    Returns
    -------
    dict
        OCI runtime-spec 1.0 document; ``root.path`` is ``"rootfs"`` relative
        to the bundle (see :func:`prepare_rootfs`).
    """
    scratch = f"size={policy.scratch_mib}m"
    mounts = [
        {"destination": "/proc", "type": "proc", "source": "proc"},
        {"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "mode=755"]},
        {"destination": "/tmp", "type": "tmpfs", "source": "tmpfs",
         "options": ["nosuid", "nodev", "mode=1777", scratch]},
        {"destination": SANDBOX_HOME, "type": "tmpfs", "source": "tmpfs",
         "options": ["nosuid", "nodev", "mode=700", f"uid={SANDBOX_UID}", f"gid={SANDBOX_GID}", scratch]},
        # POSIX semaphores and shared memory (multiprocessing): memory of the sandbox
        {"destination": "/dev/shm", "type": "tmpfs", "source": "shm",
         "options": ["nosuid", "nodev", "noexec", "mode=1777", scratch]},
    ]

    def ro(src: str, dst: str) -> dict:
        return {"destination": dst, "type": "bind", "source": src, "options": ["rbind", "ro", "nosuid", "nodev"]}

    mounts += [ro(d, d) for d in layout.usr_dirs]
    mounts += [ro(f"{etc_dir}/{n}", f"/etc/{n}") for n in ("passwd", "group", "hosts", "hostname")]
    mounts += [ro(f"/etc/{n}", f"/etc/{n}") for n in layout.etc_entries]
    mounts += [ro(d, d) for d in layout.ro_dirs]
    mounts.append(ro(agent_archive(), AGENT_PATH))
    if layout.workspace is not None:  # resolved and checked (sandbox_kernel.workspace.resolve)
        ws = workspace_source or layout.workspace
        mounts.append({"destination": WORKSPACE_DIR, "type": "bind", "source": ws,
                       "options": ["rbind", "rw" if layout.workspace_rw else "ro", "nosuid", "nodev"]})
        mounts += [ro((protected_sources or {}).get(sub, f"{ws}/{sub}"), f"{WORKSPACE_DIR}/{sub}")
                   for sub in layout.workspace_ro_subdirs]  # .git: hooks the host runs
    if layout.jedi_seed is not None:
        mounts.append(ro(layout.jedi_seed, JEDI_SEED_PATH))
    if layout.egress_dir is not None:  # the kernel's egress proxy socket (runsc --host-uds=open)
        mounts.append(ro(layout.egress_dir, EGRESS_DIR))
    env = sandbox_env(policy, layout)
    if shim is not None:
        mounts.append(ro(shim, SHIM_PATH))
        env["LD_PRELOAD"] = SHIM_PATH
    return {
        "ociVersion": "1.0.2",
        "process": {
            "terminal": False,
            **_identity(agent=command is None),
            "args": command if command is not None else agent_command(layout, kernel_uid=SANDBOX_UID),
            "env": [f"{k}={v}" for k, v in env.items()],
            "cwd": WORKSPACE_DIR if layout.workspace is not None else SANDBOX_HOME,
            "noNewPrivileges": True,
            "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 4096, "soft": 4096}, *oci_rlimits(policy, rootless=rootless)],
        },
        "root": {"path": "rootfs", "readonly": True},
        "hostname": "sandbox",
        "mounts": mounts,
        "linux": {
            "namespaces": [{"type": t} for t in ("pid", "network", "ipc", "uts", "mount")],
            **oci_linux(policy, cgroup, cpus),
            **({"seccomp": seccomp.oci_setid_profile()} if layout.workspace_rw else {}),
        },
    }


def recharge_image(image: Path) -> None:
    """Rewrite each file of a checkpoint image held on a tmpfs from this process, so its
    memory is charged to the proxy's cgroup, not to the sandbox's.

    The sentry writes the image, and a tmpfs page stays charged to the memory cgroup of
    the process that wrote it for as long as the file exists: left so, the image (tens
    of MiB, compressed) counts against the restored sandbox's own ``memory_mib`` beside
    the state it inflates, and a kernel whose state fitted before the checkpoint was
    ended by the OOM killer on restore (seen: 256 MiB, 600,000 strings).  A copy made
    here and renamed over the original moves the charge; the original's pages are
    freed with its last link (the sentry that wrote it has exited).  About 30 ms for
    30 MiB.  Blocking.

    Best effort: a file that cannot be copied (the tmpfs too full to hold a second copy
    of it) is left as it was, charged to the sandbox as before, and logged; the image
    stays whole either way.
    """
    for path in sorted(p for p in image.rglob("*") if p.is_file() and not p.is_symlink()):
        fresh = path.with_name(path.name + ".recharged")
        try:
            shutil.copyfile(path, fresh)
            shutil.copymode(path, fresh)
            os.replace(fresh, path)
        except OSError as err:
            fresh.unlink(missing_ok=True)
            log.warning("checkpoint image %s left charged to its sandbox's memory cgroup: %s", path, err)


def oci_flags(config: dict) -> list[str]:
    """runsc's global flags for ``run``/``restore`` of a spec: ``--host-uds=open`` with egress
    (the one host socket mounted is the kernel's egress proxy; connect only, never create),
    ``--oci-seccomp`` with a ``linux.seccomp`` (a ``rw`` workspace's set-id guard)."""
    uds = any(m["destination"] == EGRESS_DIR for m in config.get("mounts", ()))
    return [*(["--host-uds=open"] if uds else []),
            *(["--oci-seccomp"] if "seccomp" in config.get("linux", {}) else [])]


def _identity(*, agent: bool) -> dict:
    """``process.user`` and ``process.capabilities`` of the spec.

    The agent is uid 0 of the sandbox with :data:`AGENT_CAPABILITIES` only and
    runs the interpreter as :data:`SANDBOX_UID` with none, which then cannot
    open, signal or trace it (``docs/security.md``, "The agent's channel").
    Any other command (tests' probes) runs as :data:`SANDBOX_UID` with none.
    """
    uid, gid, caps = (0, 0, list(AGENT_CAPABILITIES)) if agent else (SANDBOX_UID, SANDBOX_GID, [])
    return {
        "user": {"uid": uid, "gid": gid, "additionalGids": []},
        "capabilities": {"bounding": caps, "effective": caps, "permitted": caps,
                         "inheritable": [], "ambient": []},
    }


def prepare_rootfs(rootfs: Path, config: dict, layout: HostLayout) -> None:
    """Create the empty read-only root with a mount point for every mount."""
    rootfs.mkdir(parents=True, exist_ok=True)
    for link, target in layout.usr_links:
        os.symlink(target, rootfs / link.lstrip("/"))
    for m in config["mounts"]:
        dst = rootfs / m["destination"].lstrip("/")
        src = m["source"]
        if m["type"] == "bind" and os.path.isfile(src):
            dst.parent.mkdir(parents=True, exist_ok=True)
            dst.touch()
        else:
            dst.mkdir(parents=True, exist_ok=True)
    for d in [rootfs, *rootfs.rglob("*")]:
        if d.is_dir() and not d.is_symlink():
            os.chmod(d, 0o755)  # noqa: S103 - the rootfs' mount points, read by the sandbox


# ----------------------------------------------------------------------------
# gVisor: the OCI spec's part
# ----------------------------------------------------------------------------


def oci_rlimits(policy: Policy, *, rootless: bool = False) -> list[dict]:
    """Entries to append to the spec's ``process.rlimits`` for gVisor.

    ``RLIMIT_NPROC`` = :attr:`Policy.pids_max`: the sentry enforces it per
    guest user (every sandboxed process is uid 65534 inside), so a fork bomb
    gets ``EAGAIN`` while the sandbox lives (measured: 185 forks at a limit of
    200, then ``BlockingIOError``).  Not for bubblewrap, where the same rlimit
    would count every uid-65534 process on the host.

    ``rootless`` (no cgroup): also ``RLIMIT_AS`` of :func:`.bwrap.address_space_limit_bytes`,
    enforced by the sentry on each guest process (its own mappings are not the
    guest's): an allocation past it is a ``MemoryError`` in the cell.  The sandbox's
    total is watched by :func:`guest_memory_bytes` (``LocalBackend``).
    """
    out = [{"type": "RLIMIT_NPROC", "hard": policy.pids_max, "soft": policy.pids_max}]
    if rootless:
        limit = address_space_limit_bytes(policy)
        out.append({"type": "RLIMIT_AS", "hard": limit, "soft": limit})
    fsize = workspace_fsize_bytes(policy)
    if fsize is not None:
        out.append({"type": "RLIMIT_FSIZE", "hard": fsize, "soft": fsize})
    return out


def oci_resources(policy: Policy, cpus: tuple[int, ...] | None = None) -> dict:
    """The OCI ``linux.resources`` object for the policy.

    runsc applies it only to cgroups it creates itself; with a pre-created
    :class:`SandboxCgroup` (the recommended path) our limits stand and this
    documents them in ``config.json``.  The cpuset is one runsc creates: it
    writes ``cpu.cpus`` there, and the sentry reports that many CPUs
    (``os.cpu_count()``, affinity, ``/sys``, ``/proc/cpuinfo``; measured with
    runsc 20221219, case C15).  ``runsc --cpu-num-from-quota`` would report
    ``ceil(quota)`` but never fewer than 2.

    Parameters
    ----------
    cpus : tuple of int, optional
        Host CPUs of the sandbox; none: no ``cpu.cpus`` (all of ours).

    Returns
    -------
    dict
        ``memory.limit`` and ``memory.swap`` in bytes (equal: no swap),
        ``cpu.quota``/``cpu.period`` in microseconds and ``cpu.cpus`` (a CPU
        list such as ``"1"`` or ``"0-3"``), ``pids.limit`` (host tasks,
        :func:`host_pids_max`).
    """
    mem = policy.memory_mib * 1024 * 1024
    cpu: dict = {"quota": max(1000, round(policy.cpu_cores * cgroups.CFS_PERIOD_US)),
                 "period": cgroups.CFS_PERIOD_US}
    if cpus:
        cpu["cpus"] = cpu_list(cpus)
    return {
        "memory": {"limit": mem, "swap": mem},
        "cpu": cpu,
        "pids": {"limit": cgroups.host_pids_max(policy, "gvisor")},
    }


def oci_linux(policy: Policy, cgroup: "cgroups.SandboxCgroup | None",
              cpus: tuple[int, ...] | None = None) -> dict:
    """Keys to merge into the spec's ``linux`` object: ``resources`` and ``cgroupsPath``.

    Parameters
    ----------
    policy : Policy
    cgroup : SandboxCgroup or None
        The sandbox's pre-created cgroup.  ``None`` gives no ``cgroupsPath``:
        runsc then creates no cgroup and enforces nothing (measured), and the
        sentry reports all the host's CPUs whatever ``cpus`` says (it ignores
        the affinity of ``runsc run``; measured).
    cpus : tuple of int, optional
        See :func:`oci_resources`.

    Returns
    -------
    dict
    """
    out: dict = {"resources": oci_resources(policy, cpus)}
    if cgroup is not None:
        out["cgroupsPath"] = cgroup.relative_path
    return out


def guest_memory_bytes(sentry_pid: int) -> int | None:
    """Bytes of memory the sandbox's guest holds: the blocks allocated in the sentry's
    memory file (``/memfd:runsc-memory``, where every guest page lives; measured with
    runsc 20240729: a 300 MiB array shows as 304 MiB).  None when the file is not
    found (the sentry is gone, or another user's).  Rootless gVisor has no cgroup,
    so ``LocalBackend`` polls this against the memory limit."""
    fd_dir = f"/proc/{sentry_pid}/fd"
    try:
        fds = os.listdir(fd_dir)
    except OSError:
        return None
    for fd in fds:
        path = f"{fd_dir}/{fd}"
        try:
            if os.readlink(path).startswith("/memfd:runsc-memory"):
                return os.stat(path).st_blocks * 512
        except OSError:
            continue
    return None


# ----------------------------------------------------------------------------
# runsc invocations and the runtime's strategy
# ----------------------------------------------------------------------------


class Runsc:
    """runsc for one sandbox: ``<state dir>/runsc`` as its root, :data:`.runsc.RUNSC_ENV`.

    Parameters
    ----------
    state_dir : Path
        The sandbox's state directory.
    choice : RunscChoice, optional
        The binary and platform; default the sandbox's record (``runsc.json``,
        written at launch), else the system's runsc on ptrace (a sandbox of an
        older sandbox-kernel, for ``gc``).
    """

    def __init__(self, state_dir: Path, choice: RunscChoice | None = None):
        self.root = Path(state_dir) / "runsc"
        self.choice = choice or RunscChoice.recorded(state_dir)

    def argv(self, *args: str) -> list[str]:
        """The whole command line for subcommand ``args``."""
        c = self.choice
        if c is None:
            return [*runsc_argv(str(self.root), runsc=shutil.which("runsc", path=RUNSC_ENV["PATH"]) or "runsc",
                                rootless=rootless_here()),
                    *args]
        return [*runsc_argv(str(self.root), runsc=c.path, platform=c.platform, rootless=c.rootless), *args]

    def compression(self, compression: str) -> list[str]:
        """``--compression=<compression>`` for ``checkpoint``, where this runsc takes it
        (Debian 12's does not, and always compresses)."""
        return [f"--compression={compression}"] if self.choice is not None and self.choice.compression else []

    async def call(self, *args: str, timeout_s: float = 60, check: bool = True) -> int:
        """Run one subcommand to its end.

        Returns
        -------
        int
            runsc's exit status; -1 when it did not finish in ``timeout_s`` seconds
            (it is killed) and ``check`` is false.

        Raises
        ------
        SandboxKernelError
            With ``check``: runsc failed (its stderr's last lines) or timed out.
        """
        proc = await asyncio.create_subprocess_exec(
            *self.argv(*args), stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
            env=RUNSC_ENV)
        try:
            _, err = await asyncio.wait_for(proc.communicate(), timeout_s)
        except TimeoutError:
            proc.kill()
            if check:
                raise SandboxKernelError(f"runsc {args[0]} did not finish in {timeout_s:.0f} s") from None
            return -1
        if check and proc.returncode != 0:
            tail = err.decode("utf-8", "replace").strip().splitlines()[-2:]
            raise SandboxKernelError(f"runsc {args[0]} failed (exit {proc.returncode}): "
                                     + " | ".join(tail)[-300:])
        return proc.returncode if proc.returncode is not None else -1

    def call_blocking(self, *args: str, timeout_s: float = 30) -> None:
        """Run one subcommand, ignoring how it ends (the watchdog and ``gc``)."""
        try:
            subprocess.run(self.argv(*args), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           env=RUNSC_ENV, timeout=timeout_s, check=False)
        except (OSError, subprocess.SubprocessError):
            pass


class Gvisor(Runtime):
    """The gVisor runtime: ``runsc run`` on an OCI bundle in the state directory.

    Pause is ``runsc pause`` (memory kept), checkpoint is ``runsc checkpoint``
    to ``<state dir>/checkpoint`` and restore is ``runsc restore`` as a new
    runtime process.  A memory breach ends the whole sandbox: on ptrace the
    host's OOM killer takes the sentry (``runsc run`` exits 137); on systrap it
    takes the interpreter's stub process and the sentry stays at the limit
    (measured, runsc 20240729), so the backend ends the sandbox on the cgroup's
    OOM event (:attr:`oom_ends_sandbox`); either way the cgroup's ``oom_kill``
    counter names the cause.
    """

    #: An OOM kill in the sandbox's cgroup leaves it unusable: end it (``LocalBackend``).
    oom_ends_sandbox = True
    #: A killed gofer left the sandbox running without its files (seen in the soak run):
    #: the backend ends it (``watches.end_on_helper_death``).
    helpers = {"runsc-gofer": "gofer (runsc-gofer, its file server)",
               "runsc-sandbox": "sentry (runsc-sandbox, its kernel)"}

    name = "gvisor"
    capabilities = Capabilities(boundary=GVISOR_BOUNDARY, pause_keeps_memory=True, checkpoint=True)

    def __init__(self, runsc_path: str = "", platform: str = "auto"):
        #: ``LocalBackend.runsc_path`` and ``gvisor_platform``, resolved at the first launch.
        self.asked = (runsc_path, platform)
        self.choice: RunscChoice | None = None

    @property
    def key(self) -> str:
        """What a warm pool's sandboxes must match: the runtime and the runsc asked for."""
        return f"gvisor:{self.asked[1]}:{self.asked[0]}"

    async def resolve(self) -> RunscChoice:
        """The runsc and platform of this backend's sandboxes (probed once per binary).

        Raises
        ------
        SandboxKernelError
            The configured runsc or platform cannot run here.
        """
        if self.choice is None:
            self.choice = await choose_async(*self.asked)
            # rootless runsc refuses ``restore``: pause is the deepest idle level kept
            self.capabilities = replace(type(self).capabilities, boundary=self.choice.boundary,
                                        checkpoint=not self.choice.rootless)
        return self.choice

    @property
    def measures_guest_memory(self) -> bool:
        """Rootless runsc: no cgroup, so the sentry's memory file is watched."""
        return self.choice is not None and self.choice.rootless

    def guest_memory(self, sb: SandboxRecord) -> int | None:
        """Rootless only (no cgroup): :func:`guest_memory_bytes` of the sandbox's sentry."""
        if not self.measures_guest_memory:
            return None
        for pid, what in sb.helper_pids().items():
            if what == self.helpers["runsc-sandbox"]:
                return guest_memory_bytes(pid)
        return None

    async def launch(self, sb: SandboxRecord, policy: Policy, layout: HostLayout,
                     stdio: Mapping[str, int], *, die_with_parent: bool,
                     image: Path | None = None) -> asyncio.subprocess.Process:
        """``runsc run`` in a new session (``die_with_parent`` has no runsc equivalent);
        with ``image`` (a start template's checkpoint, :mod:`.template`), ``runsc restore``
        of it instead: the same bundle, this sandbox's own mounts, cgroup and id."""
        choice = await self.resolve()
        bundle = sb.state_dir / "bundle"
        bundle.mkdir()
        shim = await asyncio.to_thread(statx_shim, state_base()) if choice.statx_shim else None
        ws = layout.workspace
        staged: idmap.Staged | None
        if sb.folder is not None:  # the sandbox service's: from its owner's fds, never a name
            staged = await asyncio.to_thread(idmap.stage_folder, sb.state_dir, sb.folder)
        else:
            staged = await asyncio.to_thread(idmap.stage, sb.state_dir, ws) if ws and idmap.needed(ws) else None
        try:
            config = oci_config(policy, layout, etc_dir=str(sb.state_dir / "etc"), cgroup=sb.cgroup, shim=shim,
                                cpus=sandbox_cpus(policy, sb.container_id), rootless=choice.rootless,
                                workspace_source=staged.point if staged else None,
                                protected_sources=staged.protected if staged else None)
            prepare_rootfs(bundle / "rootfs", config, layout)
            (bundle / "config.json").write_text(json.dumps(config, indent=1))
            (sb.state_dir / "runsc").mkdir(mode=0o700)
            choice.record(sb.state_dir)
            verb = ["restore", "--image-path", str(image)] if image is not None else ["run"]
            return await asyncio.create_subprocess_exec(
                *Runsc(sb.state_dir, choice).argv(*oci_flags(config), *verb, "--bundle", str(bundle),
                                                  sb.container_id),
                stdin=stdio["stdin"], stdout=stdio["stdout"], stderr=stdio["stderr"], env=RUNSC_ENV,
                limit=1 << 20, cwd=str(sb.state_dir), start_new_session=True,
                preexec_fn=staged.preexec() if staged else None)
        finally:
            if staged:
                staged.close()

    async def launch_from_image(self, sb: SandboxRecord, policy: Policy, layout: HostLayout,
                                stdio: Mapping[str, int], image: Path) -> asyncio.subprocess.Process:
        return await self.launch(sb, policy, layout, stdio, die_with_parent=False, image=image)

    async def snapshot(self, sb: SandboxRecord, image: Path, compression: str) -> None:
        """``runsc checkpoint --leave-running`` to ``image`` (a start template): the
        sandbox pauses for the write (about 0.1 s) and goes on running.

        Raises
        ------
        SandboxKernelError
            runsc failed; the sandbox goes on as it was.
        """
        runsc = Runsc(sb.state_dir)
        await runsc.call("checkpoint", "--leave-running", *runsc.compression(compression),
                         "--image-path", str(image), sb.container_id)
        if sb.cgroup is not None and in_memory_fs(image):
            await asyncio.to_thread(recharge_image, image)  # not the running sandbox's memory

    async def pause(self, sb: SandboxRecord) -> None:
        await Runsc(sb.state_dir).call("pause", sb.container_id)

    async def resume(self, sb: SandboxRecord) -> None:
        """``runsc resume``; a failure is ignored (the sandbox is then killed or dies on its own)."""
        with contextlib.suppress(SandboxKernelError):
            await Runsc(sb.state_dir).call("resume", sb.container_id)

    async def checkpoint(self, sb: SandboxRecord, compression: str = "flate-best-speed") -> None:
        """``runsc checkpoint --compression`` of a running (thawed) container, then ``delete``."""
        image = sb.state_dir / "checkpoint"
        shutil.rmtree(image, ignore_errors=True)
        image.mkdir(mode=0o700)
        runsc = Runsc(sb.state_dir)
        await runsc.call("checkpoint", *runsc.compression(compression), "--image-path", str(image),
                         sb.container_id)
        if sb.proc is not None:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(sb.proc.wait(), 10)
        with contextlib.suppress(SandboxKernelError):
            await runsc.call("delete", "--force", sb.container_id)
        if sb.cgroup is not None and in_memory_fs(image):
            await asyncio.to_thread(recharge_image, image)

    async def restore(self, sb: SandboxRecord, stdio: Mapping[str, int] = PIPES) -> asyncio.subprocess.Process:
        """``runsc restore`` of the sandbox's checkpoint, its id-mapped workspace made again."""
        bundle = sb.state_dir / "bundle"
        flags = oci_flags(json.loads((bundle / "config.json").read_text()))
        argv = Runsc(sb.state_dir).argv(*flags, "restore", "--image-path", str(sb.state_dir / "checkpoint"),
                                        "--bundle", str(bundle), sb.container_id)
        staged = await asyncio.to_thread(idmap.restage, sb.state_dir, sb.folder)
        try:
            return await asyncio.create_subprocess_exec(
                *argv, stdin=stdio["stdin"], stdout=stdio["stdout"], stderr=stdio["stderr"], env=RUNSC_ENV,
                limit=1 << 20, cwd=str(sb.state_dir), start_new_session=True,
                preexec_fn=staged.preexec() if staged else None)
        finally:
            if staged:
                staged.close()

    async def kill(self, sb: SandboxRecord) -> None:
        """SIGKILL to every process of the sandbox, then wait for ``runsc run``.

        ``runsc run``, the sentry, the gofer (each names the state directory in its
        ``--root``) and everything below them (the sentry's stub processes) are killed
        directly.  Not ``runsc kill`` and ``runsc delete``: each is a Go program started
        and reading the container's state, 1.6-2.1 s together on a 2-core machine, which
        put a shutdown close to the frontend's SIGTERM (2.5 s after ``shutdown_request``),
        and all ``delete`` would clean lies in the state directory that
        :meth:`LocalSandbox.destroy` removes next.  :meth:`reap` (no process handle,
        the container possibly paused) still goes through runsc.
        """
        await asyncio.to_thread(procs.kill_mentioning, str(sb.state_dir))
        await super().kill(sb)

    def reap(self, sb: SandboxRecord) -> None:
        """``runsc resume`` (a paused container ignores kill), ``kill``, ``delete``."""
        if not (sb.state_dir / "runsc").is_dir():
            return
        runsc = Runsc(sb.state_dir)
        runsc.call_blocking("resume", sb.container_id)
        runsc.call_blocking("kill", sb.container_id, "KILL")
        runsc.call_blocking("delete", "--force", sb.container_id)
