"""The bubblewrap runtime: argv from the policy, privilege drop, launch, freeze.

bubblewrap isolates with namespaces and a seccomp deny-list on the shared host
kernel (``BWRAP_BOUNDARY``).  Run as root it would map the sandbox user to host
uid 0, so :func:`prepare_launch` stages the read-only binds in a private mount
namespace and drops to uid 65534 before exec'ing it with an empty environment.
:class:`Bubblewrap` is the runtime's strategy: launch, and pause by the
sandbox's cgroup freezer (or SIGSTOP of its process tree without one).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import resource
import shutil
import signal
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from ...guest import AGENT_PATH, EGRESS_DIR, JEDI_SEED_PATH, WORKSPACE_DIR, agent_archive
from ...policy import Policy
from ..base import Capabilities
from . import idmap, procs, seccomp
from .layout import (
    BWRAP_BOUNDARY,
    SANDBOX_GID,
    SANDBOX_HOME,
    SANDBOX_UID,
    HostLayout,
    agent_command,
    sandbox_env,
    workspace_fsize_bytes,
)
from .resource_view import VIEW_FILES, ResourceView, sandbox_cpus, write_resource_view
from .runtime import Runtime, SandboxRecord

#: Address space granted beyond ``memory_mib`` by :func:`address_space_limit_bytes`,
#: MiB.  Measured: an idle ipykernel with numpy, pandas and matplotlib imported
#: maps ~1000 MiB of address space for ~125 MiB resident (thread stacks, malloc
#: arenas, OpenBLAS buffers).
ADDRESS_SPACE_HEADROOM_MIB = 1536


def bwrap_argv(
    policy: Policy,
    layout: HostLayout,
    *,
    etc_dir: str,
    seccomp_fd: int,
    sources: dict[str, str] | None = None,
    command: list[str] | None = None,
    rw_binds: dict[str, str] | None = None,
    bwrap: str = "bwrap",
    die_with_parent: bool = True,
    view: ResourceView | None = None,
) -> list[str]:
    """Build bubblewrap's argv from the policy, in one ordered list.

    Parameters
    ----------
    policy, layout
        What to allow and where it lives on the host.
    etc_dir : str
        Host directory holding the generated ``passwd``/``group``/``hosts``.
    seccomp_fd : int
        Inherited fd carrying :func:`seccomp.build_filter`'s program.
    sources : dict, optional
        Host source to bind for each of ``layout.ro_dirs`` when it differs
        (staged bind mounts that an unprivileged uid can reach).
    command : list of str, optional
        What to run inside; the agent by default.
    rw_binds : dict, optional
        Host directory -> sandbox path bound read-write, mounted last (after
        the scratch tmpfs); used by the cloud emulations for a sandbox's
        persistent filesystem.
    die_with_parent : bool
        ``--die-with-parent``: the sandbox ends with the process that started
        it (the proxy).  The warm pool turns it off (its watchdog reaps).
    view : ResourceView, optional
        The sandbox's generated ``/proc/meminfo``, ``/proc/cpuinfo`` and
        ``/sys/devices/system/cpu/{online,possible,present}``, bound over the
        host's (:mod:`.resource_view`, case C15).

    Returns
    -------
    list of str
    """
    sources = sources or {}
    scratch = str(policy.scratch_mib * 1024 * 1024)
    argv = [
        bwrap,
        "--unshare-all", "--unshare-user", "--disable-userns",
        *(["--die-with-parent"] if die_with_parent else []), "--new-session", "--clearenv",
        # the agent is PID 1: the interpreter's signals to it are discarded (no handlers)
        "--as-pid-1",
        "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_GID),
        "--hostname", "sandbox",
        # scratch first: a bind below /tmp (a venv in /tmp/...) must land on top of it
        "--proc", "/proc",
        *_view_binds(view),
        "--dev", "/dev",
        "--perms", "1777", "--size", scratch, "--tmpfs", "/tmp",
        "--perms", "0700", "--size", scratch, "--tmpfs", SANDBOX_HOME,
    ]
    for host, dest in (rw_binds or {}).items():  # before the read-only binds that may sit below them
        argv += ["--bind", host, dest]
    if layout.workspace is not None:  # resolved and checked (sandbox_kernel.workspace.resolve)
        src = sources.get(layout.workspace, layout.workspace)
        argv += ["--bind" if layout.workspace_rw else "--ro-bind", src, WORKSPACE_DIR]
        for sub in layout.workspace_ro_subdirs:  # .git: hooks the host would run
            argv += ["--ro-bind", f"{src}/{sub}", f"{WORKSPACE_DIR}/{sub}"]
    for d in layout.usr_dirs:
        argv += ["--ro-bind", d, d]
    for link, target in layout.usr_links:
        argv += ["--symlink", target, link]
    argv += ["--dir", "/etc"]
    for name in ("passwd", "group", "hosts", "hostname"):
        argv += ["--ro-bind", f"{etc_dir}/{name}", f"/etc/{name}"]
    for name in layout.etc_entries:
        argv += ["--ro-bind", f"/etc/{name}", f"/etc/{name}"]
    for d in layout.ro_dirs:
        argv += ["--ro-bind", sources.get(d, d), d]
    argv += [
        "--ro-bind", sources.get(AGENT_PATH) or agent_archive(), AGENT_PATH,
    ]
    if layout.jedi_seed is not None:
        argv += ["--ro-bind", layout.jedi_seed, JEDI_SEED_PATH]
    if layout.egress_dir is not None:  # the kernel's egress proxy socket, nothing else of the host
        argv += ["--ro-bind", layout.egress_dir, EGRESS_DIR]
    # bwrap's root is a tmpfs writable by the sandbox user (/, /etc, /opt...);
    # make it read-only like gVisor's ("root": {"readonly": true}).  Only the
    # root mount: /tmp and the home tmpfs stay writable.
    argv += ["--remount-ro", "/"]
    argv += ["--chdir", WORKSPACE_DIR if layout.workspace is not None else SANDBOX_HOME]
    for k, v in sandbox_env(policy, layout).items():
        argv += ["--setenv", k, v]
    argv += ["--seccomp", str(seccomp_fd), "--"]
    argv += command if command is not None else agent_command(layout)
    return argv


def _view_binds(view: ResourceView | None) -> list[str]:
    """bubblewrap options binding ``view``'s files over ``/proc`` and a fresh ``/sys``
    (no ``/sys`` of the host is mounted otherwise)."""
    if view is None:
        return []
    out = []
    for dest, name in VIEW_FILES.items():
        if dest.startswith("/sys/") and "--dir" not in out:
            out += ["--dir", os.path.dirname(dest)]
        out += ["--ro-bind", f"{view.dir}/{name}", dest]
    return out


_libc = ctypes.CDLL(None, use_errno=True)
_CLONE_NEWNS = 0x00020000
_MS_BIND, _MS_REC, _MS_PRIVATE = 4096, 16384, 1 << 18


def _check(rc: int, what: str) -> None:
    if rc != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"{what}: {os.strerror(e)}")


def _drop_privileges_preexec(stage: dict[str, str], workspace: idmap.Staged | None = None):
    """Return a ``preexec_fn`` that stages bind mounts, then drops to uid 65534.

    Run as root, bubblewrap would map the sandbox user to host uid 0 (root's
    files readable inside).  So the child first enters a private mount
    namespace, bind-mounts directories root can reach but uid 65534 cannot
    (``/root`` is 0700) onto world-traversable staging points, mounts the
    ``workspace``'s id-mapped clone (:mod:`.idmap`: the kernel's user's files as
    uid 65534's, in that mount only), then becomes uid 65534 and execs bubblewrap
    unprivileged.  The host's mount table is untouched; the staged mounts vanish
    with the namespace.
    """

    def preexec() -> None:
        _check(_libc.unshare(_CLONE_NEWNS), "unshare(CLONE_NEWNS)")
        _check(_libc.mount(b"none", b"/", None, _MS_REC | _MS_PRIVATE, None), "make / private")
        for src, point in stage.items():
            _check(_libc.mount(src.encode(), point.encode(), None, _MS_BIND | _MS_REC, None),
                   f"bind {src}")
        if workspace is not None:
            workspace.mount()
        os.setgroups([])
        os.setgid(SANDBOX_GID)
        os.setuid(SANDBOX_UID)

    return preexec


@dataclass
class BwrapLaunch:
    """Everything ``create_subprocess_exec`` needs to start one bubblewrap sandbox.

    Attributes
    ----------
    argv : list of str
    preexec_fn : callable or None
        Joins the cgroup, sets ``RLIMIT_AS``, stages binds and drops to uid
        65534, in that order (root only).
    pass_fds : tuple of int
        The seccomp program's pipe; close it with :meth:`close` after the spawn.
    """

    argv: list[str]
    preexec_fn: Callable[[], None] | None
    pass_fds: tuple[int, ...]
    workspace: idmap.Staged | None = None

    def close(self) -> None:
        """Close the parent's copies of :attr:`pass_fds` and the workspace's mapping (call
        once spawned)."""
        for fd in self.pass_fds:
            try:
                os.close(fd)
            except OSError:
                pass
        if self.workspace is not None:
            self.workspace.close()


def prepare_launch(
    policy: Policy,
    layout: HostLayout,
    state_dir: Path,
    *,
    command: list[str] | None = None,
    rw_binds: dict[str, str] | None = None,
    cgroup=None,
    rlimit_as_bytes: int | None = None,
    agent_source: str | None = None,
    die_with_parent: bool = True,
    view: ResourceView | None = None,
) -> BwrapLaunch:
    """Build argv, ``preexec_fn`` and inherited fds for one bubblewrap sandbox.

    Parameters
    ----------
    policy, layout
        What to allow and where it lives on the host.
    state_dir : Path
        Per-sandbox host directory holding ``etc/`` (from ``write_etc``); the
        staging points are created under it.
    command : list of str, optional
        What to run inside (default: the agent).
    rw_binds : dict, optional
        Host directory -> sandbox path, bound read-write.
    cgroup : SandboxCgroup, optional
        Joined before the privilege drop (:mod:`.cgroups`).
    rlimit_as_bytes : int, optional
        ``RLIMIT_AS`` for the sandboxed processes, bytes.
    agent_source : str, optional
        Host file bound at ``AGENT_PATH`` instead of this package's
        agent zipapp (the cloud emulations bind the agent their client uploaded).
    die_with_parent : bool
        See :func:`bwrap_argv`.
    view : ResourceView, optional
        Bound by :func:`bwrap_argv`; its CPUs become the process's affinity
        (:func:`preexec_affinity`), root or not.

    Returns
    -------
    BwrapLaunch
        Spawn with ``env={}`` (bubblewrap's PID 1 keeps its own environment).
    """
    r, w = os.pipe()
    os.write(w, seccomp.build_filter(no_setid=layout.workspace_rw))
    os.close(w)
    agent_src = agent_source or agent_archive()
    sources: dict[str, str] = {AGENT_PATH: agent_src}
    step: Callable[[], None] | None = None
    ws: idmap.Staged | None = None
    if os.geteuid() == 0:
        stage_root = Path(state_dir) / f"stage-{os.urandom(3).hex()}"
        stage_root.mkdir(mode=0o755)
        stage: dict[str, str] = {}
        if layout.workspace is not None:  # the kernel's user's files as the sandbox user's
            ws = idmap.stage(stage_root, layout.workspace)
            if ws is not None:
                sources[layout.workspace] = ws.point
        plain = [layout.workspace] if layout.workspace is not None and ws is None else []  # not id-mappable
        for i, d in enumerate([*layout.ro_dirs, AGENT_PATH, *plain]):
            src = agent_src if d == AGENT_PATH else d
            point = stage_root / str(i)
            if os.path.isdir(src):
                point.mkdir(mode=0o755)
            else:
                point.touch(mode=0o644)
            stage[src] = str(point)
            sources[d] = str(point)
        step = _drop_privileges_preexec(stage, ws)
        if rlimit_as_bytes is not None:
            step = preexec_rlimit_as(rlimit_as_bytes, step)
        if cgroup is not None:
            step = cgroup.preexec_join(step)
    if view is not None:  # any uid may narrow its own affinity
        step = preexec_affinity(view.cpus, step)
    fsize = workspace_fsize_bytes(policy)
    if fsize is not None:  # any uid may lower its own limit
        step = preexec_rlimit(resource.RLIMIT_FSIZE, fsize, step)
    argv = bwrap_argv(policy, layout, etc_dir=str(Path(state_dir) / "etc"), seccomp_fd=r,
                      sources=sources, command=command, rw_binds=rw_binds,
                      bwrap=shutil.which("bwrap") or "bwrap", die_with_parent=die_with_parent,
                      view=view)
    return BwrapLaunch(argv=argv, preexec_fn=step, pass_fds=(r,), workspace=ws)


# ----------------------------------------------------------------------------
# Address-space limit
# ----------------------------------------------------------------------------


def address_space_limit_bytes(policy: Policy, headroom_mib: int = ADDRESS_SPACE_HEADROOM_MIB) -> int:
    """``RLIMIT_AS`` for each sandboxed process, bytes: ``memory_mib + headroom_mib``.

    Under bubblewrap the cgroup limit SIGKILLs the interpreter, while an
    address-space limit makes one oversized allocation fail cleanly with
    ``MemoryError``.  Address space exceeds resident memory by the
    interpreter's fixed mappings (:data:`ADDRESS_SPACE_HEADROOM_MIB`), so a
    limit at ``memory_mib`` itself would break imports; with headroom it
    catches the common "one array bigger than the limit" case, and gradual
    growth still meets the cgroup.  Not for gVisor: runsc's own mappings are
    far larger than its guest's.
    """
    return (policy.memory_mib + headroom_mib) * 1024 * 1024


def preexec_rlimit_as(limit_bytes: int, then: Callable[[], None] | None = None) -> Callable[[], None]:
    """Return a ``preexec_fn`` setting ``RLIMIT_AS`` (soft = hard) then calling ``then``.

    Chain it inside :meth:`SandboxCgroup.preexec_join`'s ``then`` so the order
    is: join cgroup, set rlimit, drop privileges.
    """

    def setlimit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, limit_bytes))
        if then is not None:
            then()

    return setlimit


def preexec_rlimit(which: int, limit: int, then: Callable[[], None] | None = None) -> Callable[[], None]:
    """Return a ``preexec_fn`` setting rlimit ``which`` to ``limit`` (soft = hard), then
    calling ``then``."""

    def setlimit() -> None:
        resource.setrlimit(which, (limit, limit))
        if then is not None:
            then()

    return setlimit


def preexec_affinity(cpus: tuple[int, ...], then: Callable[[], None] | None = None) -> Callable[[], None]:
    """Return a ``preexec_fn`` pinning the process (and all it starts) to ``cpus``, then
    calling ``then``.

    What ``os.sched_getaffinity(0)`` shows inside (case C15).  The interpreter
    may widen it again (``sched_setaffinity`` is not filtered), which grants
    no CPU time: the cgroup's CFS quota is the limit.
    """

    def pin() -> None:
        os.sched_setaffinity(0, cpus)
        if then is not None:
            then()

    return pin


# ----------------------------------------------------------------------------
# The runtime's strategy
# ----------------------------------------------------------------------------


class Bubblewrap(Runtime):
    """The bubblewrap runtime: one ``bwrap`` process, the agent as its PID 1.

    Pause freezes the sandbox's cgroup (or, without one, SIGSTOPs its process
    tree; ``docs/decisions.md``); CRIU fails on this kernel, so there is no
    checkpoint.  A memory breach makes the cgroup's OOM killer pick the
    interpreter; the agent survives and reports the death.
    """

    name = "bubblewrap"
    capabilities = Capabilities(boundary=BWRAP_BOUNDARY, pause_keeps_memory=True)

    async def launch(self, sb: SandboxRecord, policy: Policy, layout: HostLayout,
                     stdio: Mapping[str, int], *, die_with_parent: bool) -> asyncio.subprocess.Process:
        view = await asyncio.to_thread(write_resource_view, sb.state_dir / "view", policy,
                                       sandbox_cpus(policy, sb.container_id))
        launch = prepare_launch(policy, layout, sb.state_dir, cgroup=sb.cgroup,
                                rlimit_as_bytes=address_space_limit_bytes(policy),
                                die_with_parent=die_with_parent, view=view)
        try:
            return await asyncio.create_subprocess_exec(
                *launch.argv, stdin=stdio["stdin"], stdout=stdio["stdout"], stderr=stdio["stderr"],
                env={}, pass_fds=launch.pass_fds,
                preexec_fn=launch.preexec_fn, limit=1 << 20, cwd="/",
            )
        finally:
            launch.close()

    async def pause(self, sb: SandboxRecord) -> None:
        if sb.cgroup is not None:
            await asyncio.to_thread(sb.cgroup.freeze)
            return
        assert sb.proc is not None
        pids = procs.descendants(sb.proc.pid)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
        sb.stopped_pids = pids

    async def resume(self, sb: SandboxRecord) -> None:
        if sb.cgroup is not None and not sb.stopped_pids:
            await asyncio.to_thread(sb.cgroup.thaw)
        for pid in reversed(sb.stopped_pids):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        sb.stopped_pids = []
