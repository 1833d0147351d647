"""Per-sandbox cgroups (v1) for local sandboxes: limits, OOM accounting, freezer, removal.

What this machine allows (measured; see ``docs/decisions.md``, "Resource
limits on this machine"): cgroup v1 controllers mounted one per directory
under ``/sys/fs/cgroup`` (``memory``, ``pids``, ``cpu``, ``freezer``...), with
an almost empty cgroup v2 hierarchy at ``/sys/fs/cgroup/unified``.  As root we
may create child cgroups under our own cgroup in each controller, and every
file used here works: ``memory.limit_in_bytes``, ``memory.memsw.*``,
``memory.oom_control`` (with its ``oom_kill`` counter), ``pids.max``,
``pids.events``, ``cpu.cfs_quota_us`` and ``freezer.state``.

One :class:`SandboxCgroup` per sandbox, created by the proxy *before* the
runtime starts, serves both runtimes:

* **bubblewrap**: the launching child joins it in its ``preexec_fn``
  (:meth:`SandboxCgroup.preexec_join`) *before* dropping to uid 65534, since an
  unprivileged process cannot move itself.  A memory breach makes the kernel's
  OOM killer pick the biggest process, the interpreter; the agent survives and
  reports the death.
* **gVisor**: the same cgroup is named as the spec's relative ``cgroupsPath``
  (:func:`sandbox_kernel.backends.local.gvisor.oci_linux`).  runsc finds it already there, joins it, leaves our
  limits alone and does not delete it, so the ``oom_kill`` counter is still
  readable after a breach has killed the whole sandbox.  The sentry also reads
  the limit to size the guest's ``MemTotal``.

cgroup v2 is detected but not supported yet (:class:`CgroupError` says so);
creating children of our own v2 cgroup needs a delegated subtree.

The freezer and removal wait for the kernel with short sleeps: they block, so
the local backend calls them in a thread (``asyncio.to_thread``).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import signal
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from ...errors import SandboxStartError
from ...policy import Policy

#: v1 controllers every sandbox cgroup is created in.
CONTROLLERS = ("memory", "pids", "cpu", "freezer")
#: CFS scheduling period written with the quota, microseconds (the kernel default).
CFS_PERIOD_US = 100_000
#: Host tasks runsc needs before the guest runs anything (measured 133-138 for
#: the agent plus an idle ipykernel on the ptrace platform, 2 CPUs; at 128 the
#: sandbox dies with exit code 2 on the first cell).
GVISOR_HOST_PIDS_BASE = 256
#: Host tasks per guest process on the ptrace platform (measured ~8: 185 guest
#: processes took the host count from 138 to 1624).
GVISOR_HOST_PIDS_PER_TASK = 10


class CgroupError(SandboxStartError):
    """A sandbox cgroup could not be created, configured or removed.

    The message names the file and what to do (run as root, or choose a
    runtime and policy that need no cgroup).
    """


# ----------------------------------------------------------------------------
# Where our cgroups are
# ----------------------------------------------------------------------------


@dataclass(frozen=True)
class CgroupLayout:
    """Where per-sandbox cgroups are created on this host.

    Attributes
    ----------
    version : {1, 2}
        1 when every controller in :data:`CONTROLLERS` is on a v1 hierarchy.
    bases : mapping of str to str
        Controller name -> host directory of *our own* cgroup in it; sandbox
        cgroups are made as its children so our parent's limits and
        accounting still cover them.  For version 2 the single key ``""``.
    """

    version: int
    bases: Mapping[str, str]


def _parse_mountinfo(text: str) -> list[tuple[str, str, str, set[str]]]:
    """Return ``(root, mount_point, fstype, super_options)`` of cgroup mounts."""
    out = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        fields, rfields = left.split(), right.split()
        if len(fields) < 5 or len(rfields) < 3 or rfields[0] not in ("cgroup", "cgroup2"):
            continue
        out.append((fields[3], fields[4], rfields[0], set(rfields[2].split(","))))
    return out


def _own_cgroups(proc_cgroup: str) -> dict[str, str]:
    """Controller -> our cgroup path, from ``/proc/self/cgroup`` text (v2: key ``""``)."""
    own: dict[str, str] = {}
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            for ctl in parts[1].split(",") if parts[1] else [""]:
                own[ctl] = parts[2]
    return own


def detect_layout(proc_cgroup: str | None = None, mountinfo: str | None = None) -> CgroupLayout | None:
    """Find our own cgroup in each controller.

    Parameters
    ----------
    proc_cgroup, mountinfo : str, optional
        Contents of ``/proc/self/cgroup`` and ``/proc/self/mountinfo``; read
        from the running process when omitted (tests pass text).

    Returns
    -------
    CgroupLayout or None
        None when no cgroup filesystem carrying the controllers is mounted.
    """
    if proc_cgroup is None:
        proc_cgroup = Path("/proc/self/cgroup").read_text()
    if mountinfo is None:
        mountinfo = Path("/proc/self/mountinfo").read_text()
    own = _own_cgroups(proc_cgroup)
    mounts = _parse_mountinfo(mountinfo)
    bases: dict[str, str] = {}
    for ctl in CONTROLLERS:
        for root, point, fstype, opts in mounts:
            if fstype == "cgroup" and ctl in opts and ctl in own:
                rel = os.path.relpath(own[ctl], root) if own[ctl] != root else "."
                if rel.startswith(".."):  # our cgroup lies outside this mount's view
                    continue
                bases[ctl] = os.path.normpath(os.path.join(point, rel))
                break
    if len(bases) == len(CONTROLLERS):
        return CgroupLayout(version=1, bases=bases)
    for root, point, fstype, _ in mounts:
        if fstype == "cgroup2" and "" in own:
            ctls = set()
            with contextlib.suppress(OSError):
                ctls = set(Path(point, "cgroup.controllers").read_text().split())
            if {"memory", "pids", "cpu"} <= ctls:
                rel = os.path.relpath(own[""], root)
                return CgroupLayout(version=2, bases={"": os.path.normpath(os.path.join(point, rel))})
    return None


def _runtime_owned_dirs(name: str) -> list[Path]:
    """``name`` under our cgroup in every *other* v1 controller (cpuset, blkio,
    devices...): runsc creates those itself and leaves them behind when it
    dies abnormally (measured)."""
    try:
        paths = _own_cgroups(Path("/proc/self/cgroup").read_text())
        mounts = _parse_mountinfo(Path("/proc/self/mountinfo").read_text())
    except OSError:
        return []
    out = []
    for root, point, fstype, opts in mounts:
        ctls = [c for c in opts if c in paths and c not in CONTROLLERS]
        if fstype == "cgroup" and ctls:
            rel = os.path.relpath(paths[ctls[0]], root)
            if not rel.startswith(".."):
                out.append(Path(os.path.normpath(os.path.join(point, rel)), name))
    return out


def cgroups_usable(layout: CgroupLayout | None = None) -> tuple[bool, str]:
    """Say whether :meth:`SandboxCgroup.create` can work here, and why not.

    Called by ``sandbox-kernel doctor`` and by the local backend before it
    decides to start a sandbox without cgroup limits.

    Returns
    -------
    (bool, str)
        ``(True, "cgroup v1: memory, pids, cpu, freezer")`` or ``(False, reason)``.
    """
    layout = layout or detect_layout()
    if layout is None:
        return False, "no cgroup filesystem with memory, pids, cpu and freezer is mounted"
    if layout.version != 1:
        return False, "cgroup v2 is not supported yet (needs a delegated subtree)"
    for base in layout.bases.values():
        if not os.access(base, os.W_OK):
            return False, f"cannot create cgroups in {base} (run the kernel as root)"
    return True, "cgroup v1: " + ", ".join(CONTROLLERS)


def host_pids_max(policy: Policy, runtime: str) -> int:
    """The host ``pids.max`` of a sandbox cgroup.

    bubblewrap: :attr:`Policy.pids_max` itself; a fork bomb gets ``EAGAIN``
    (``BlockingIOError``) and the kernel survives (measured).  gVisor: the
    sentry's own threads count on the host and a refused thread kills the
    whole sandbox (exit code 2, measured), so the guest is limited by
    ``RLIMIT_NPROC`` inside (:func:`sandbox_kernel.backends.local.gvisor.oci_rlimits`) and the host cgroup is a
    backstop: ``GVISOR_HOST_PIDS_BASE + GVISOR_HOST_PIDS_PER_TASK * pids_max``.
    """
    if runtime == "gvisor":
        return GVISOR_HOST_PIDS_BASE + GVISOR_HOST_PIDS_PER_TASK * policy.pids_max
    return policy.pids_max


# ----------------------------------------------------------------------------
# One sandbox's cgroup
# ----------------------------------------------------------------------------


def _read_kv(path: Path) -> dict[str, int]:
    out = {}
    for line in path.read_text().splitlines():
        k, _, v = line.partition(" ")
        with contextlib.suppress(ValueError):
            out[k] = int(v)
    return out


class SandboxCgroup:
    """One sandbox's cgroup in each of :data:`CONTROLLERS` (cgroup v1).

    Create it with :meth:`create` before the runtime starts; remove it with
    :meth:`remove` after the sandbox is gone.

    Parameters
    ----------
    name : str
        Directory name under each controller's base, e.g. the container id.
    paths : mapping of str to Path
        Controller -> directory of this cgroup.
    memory_mib : int
        The memory limit written, MiB (quoted in :meth:`oom_cause`).
    """

    def __init__(self, name: str, paths: Mapping[str, Path], memory_mib: int):
        self.name = name
        self.paths = dict(paths)
        self.memory_mib = memory_mib

    # -- creation ------------------------------------------------------------

    @classmethod
    def create(cls, name: str, policy: Policy, layout: CgroupLayout | None = None, *,
               runtime: str = "bubblewrap") -> "SandboxCgroup":
        """Make the cgroup and write the policy's limits into it.

        Called by :meth:`LocalSandbox.create` once per sandbox, before
        launching either runtime.  Limits written: ``memory.limit_in_bytes`` and
        ``memory.memsw.limit_in_bytes`` = :attr:`Policy.memory_mib` (no swap
        beyond it), ``memory.swappiness`` 0, ``pids.max`` =
        :attr:`Policy.pids_max`, ``cpu.cfs_quota_us`` = :attr:`Policy.cpu_cores`
        x :data:`CFS_PERIOD_US`.  The freezer starts THAWED.

        Parameters
        ----------
        name : str
            A fresh directory name (letters, digits, ``-_.``), e.g. the container id.
        policy : Policy
        layout : CgroupLayout, optional
            Defaults to :func:`detect_layout`.
        runtime : {"bubblewrap", "gvisor"}
            Chooses the host ``pids.max`` (:func:`host_pids_max`).

        Returns
        -------
        SandboxCgroup

        Raises
        ------
        CgroupError
            If cgroups are unusable here, the name exists or is unsafe, or a
            limit cannot be written; nothing is left behind.
        """
        if not name or name in (".", "..") or not all(c.isalnum() or c in "-_." for c in name):
            raise CgroupError(f"bad cgroup name {name!r}: use letters, digits, '-', '_' and '.'")
        layout = layout or detect_layout()
        ok, why = cgroups_usable(layout)
        if not ok:
            raise CgroupError(f"cannot apply resource limits: {why}")
        assert layout is not None
        cg = cls(name, {ctl: Path(layout.bases[ctl], name) for ctl in CONTROLLERS}, policy.memory_mib)
        made: list[Path] = []
        try:
            for path in cg.paths.values():
                path.mkdir(mode=0o755)
                made.append(path)
            mem = policy.memory_mib * 1024 * 1024
            cg._write("memory", "memory.limit_in_bytes", mem)
            with contextlib.suppress(FileNotFoundError):  # absent when swap accounting is off
                cg._write("memory", "memory.memsw.limit_in_bytes", mem)
            with contextlib.suppress(OSError):
                cg._write("memory", "memory.swappiness", 0)
            cg._write("pids", "pids.max", host_pids_max(policy, runtime))
            cg._write("cpu", "cpu.cfs_period_us", CFS_PERIOD_US)
            cg._write("cpu", "cpu.cfs_quota_us", max(1000, round(policy.cpu_cores * CFS_PERIOD_US)))
        except OSError as err:
            for path in reversed(made):
                with contextlib.suppress(OSError):
                    path.rmdir()
            raise CgroupError(f"cannot set up cgroup {name}: {err}; run `sandbox-kernel doctor`") from err
        return cg

    @classmethod
    def existing(cls, name: str, layout: CgroupLayout | None = None) -> "SandboxCgroup | None":
        """The cgroup ``name`` made earlier (by another process), or None if absent.

        Used by :meth:`LocalSandbox.reap` (the watchdog, ``sandbox-kernel gc``)
        to thaw, kill and remove an orphaned sandbox's cgroup (frozen v1 tasks
        die only once thawed), and to adopt a pooled sandbox's cgroup.
        """
        layout = layout or detect_layout()
        if layout is None or not all(c.isalnum() or c in "-_." for c in name):
            return None
        paths = {ctl: Path(layout.bases[ctl], name) for ctl in CONTROLLERS if ctl in layout.bases}
        if len(paths) != len(CONTROLLERS) or not any(p.is_dir() for p in paths.values()):
            return None
        return cls(name, paths, 0)

    def _write(self, ctl: str, file: str, value: int | str) -> None:
        (self.paths[ctl] / file).write_text(str(value))

    # -- placing processes -----------------------------------------------------

    @property
    def relative_path(self) -> str:
        """The spec's ``linux.cgroupsPath`` for runsc: relative, so runsc
        resolves it under its own (= the proxy's) cgroup in every controller."""
        return self.name

    def preexec_join(self, then: Callable[[], None] | None = None) -> Callable[[], None]:
        """Return a ``preexec_fn`` that moves the child into this cgroup, then calls ``then``.

        For bubblewrap: pass the privilege-dropping preexec as ``then``; the
        move must happen first, while the child is still root.  Everything
        the child execs (bwrap, the agent, the interpreter) inherits the cgroup.
        The function only opens and writes pre-computed paths.

        Raises
        ------
        OSError
            Inside the child, which makes ``subprocess`` fail the launch.
        """
        targets = [str(p / "cgroup.procs") for p in self.paths.values()]

        def join() -> None:
            pid = str(os.getpid()).encode()
            for t in targets:
                fd = os.open(t, os.O_WRONLY)
                try:
                    os.write(fd, pid)
                finally:
                    os.close(fd)
            if then is not None:
                then()

        return join

    def pids(self) -> list[int]:
        """Host pids of the processes in the cgroup (pids controller view)."""
        try:
            text = (self.paths["pids"] / "cgroup.procs").read_text()
        except FileNotFoundError:
            return []
        return [int(x) for x in text.split()]

    def renice(self, value: int) -> int:
        """Set the nice value of every thread in the cgroup (a spare sandbox, started at a
        low priority, taken by a kernel: back to ``value``).  Needs root to lower it;
        returns how many threads were set."""
        try:
            tids = (self.paths["pids"] / "tasks").read_text().split()
        except OSError:
            return 0
        done = 0
        for tid in tids:
            with contextlib.suppress(OSError):
                os.setpriority(os.PRIO_PROCESS, int(tid), value)
                done += 1
        return done

    # -- reading back ----------------------------------------------------------

    def oom_kills(self) -> int:
        """OOM kills in this cgroup since creation (``memory.oom_control`` ``oom_kill``)."""
        try:
            return _read_kv(self.paths["memory"] / "memory.oom_control").get("oom_kill", 0)
        except OSError:
            return 0

    def memory_used_mib(self) -> int:
        """Memory the cgroup's processes use now (``memory.usage_in_bytes``), MiB; 0 if unreadable."""
        try:
            return int((self.paths["memory"] / "memory.usage_in_bytes").read_text()) >> 20
        except (OSError, ValueError):
            return 0

    def memory_used_bytes(self) -> int | None:
        """``memory.usage_in_bytes`` of the cgroup, bytes; None if unreadable."""
        try:
            return int((self.paths["memory"] / "memory.usage_in_bytes").read_text())
        except (OSError, ValueError):
            return None

    def memory_peak_bytes(self) -> int | None:
        """``memory.max_usage_in_bytes``: the most the cgroup held since the last
        :meth:`reset_memory_peak` (or its creation), bytes; None if unreadable."""
        try:
            return int((self.paths["memory"] / "memory.max_usage_in_bytes").read_text())
        except (OSError, ValueError):
            return None

    def reset_memory_peak(self) -> None:
        """Start :meth:`memory_peak_bytes` again from the memory in use now (best effort)."""
        with contextlib.suppress(OSError):
            (self.paths["memory"] / "memory.max_usage_in_bytes").write_text("0")

    def cpu_seconds(self) -> float:
        """CPU time, s, of the cgroup's processes and the children they reaped
        (``/proc/<pid>/stat`` utime + stime + cutime + cstime; this layout mounts no
        ``cpuacct`` beside ``cpu``).  A process that ends takes its share with it,
        unless its parent in the cgroup reaped it."""
        tick = os.sysconf("SC_CLK_TCK")
        total = 0
        for pid in self.pids():
            try:
                stat = Path(f"/proc/{pid}/stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2:].split()
            total += sum(int(x) for x in fields[11:15])  # utime stime cutime cstime (fields 14-17)
        return total / tick

    def oom_detected(self, since: int = 0) -> bool:
        """Did the memory limit kill a process since the counter read ``since``?

        Parameters
        ----------
        since : int
            :meth:`oom_kills` taken earlier (e.g. when a cell started); 0 for
            "ever".  Under gVisor any kill means the whole sandbox died; under
            bubblewrap it usually means the interpreter died and the agent lives.
        """
        return self.oom_kills() > since

    async def wait_for_oom(self, since: int, poll_s: float = 1.0) -> None:
        """Return once :meth:`oom_kills` exceeds ``since``.

        Woken by the memory cgroup's OOM notification (an eventfd registered in
        ``cgroup.event_control`` for ``memory.oom_control``, cgroup v1); where
        that cannot be registered, the counter is read every ``poll_s`` seconds.
        """
        loop = asyncio.get_running_loop()
        efd = self._oom_eventfd()
        woke = asyncio.Event()
        if efd is not None:
            loop.add_reader(efd, woke.set)
        try:
            while True:
                # consume the notifications first, then read the counter: an OOM after the
                # read notifies anew (reading first lost it to the drain: 30 s late, seen
                # under load in the soak run)
                woke.clear()
                if efd is not None:
                    with contextlib.suppress(BlockingIOError):
                        os.eventfd_read(efd)
                if self.oom_kills() > since:
                    return
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(woke.wait(), poll_s if efd is None else 30.0)
        finally:
            if efd is not None:
                loop.remove_reader(efd)
                os.close(efd)

    def _oom_eventfd(self) -> int | None:
        mem = self.paths.get("memory")
        if mem is None:
            return None
        efd = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
        try:
            ofd = os.open(mem / "memory.oom_control", os.O_RDONLY | os.O_CLOEXEC)
            try:
                (mem / "cgroup.event_control").write_text(f"{efd} {ofd}")
            finally:
                os.close(ofd)
        except OSError:
            os.close(efd)
            return None
        return efd

    def oom_cause(self) -> str:
        """The user-facing cause, e.g. ``"memory limit 2048 MiB exceeded"``."""
        return f"memory limit {self.memory_mib} MiB exceeded"

    # -- freezer ---------------------------------------------------------------

    def freeze(self, timeout_s: float = 5.0) -> None:
        """Stop every process in the cgroup (``freezer.state`` FROZEN).

        Called by the bubblewrap runtime's pause (:meth:`.bwrap.Bubblewrap.pause`,
        in a thread); memory stays charged.

        Raises
        ------
        CgroupError
            If the cgroup is not FROZEN within ``timeout_s`` seconds.
        """
        self._set_freezer("FROZEN", timeout_s)

    def thaw(self, timeout_s: float = 5.0) -> None:
        """Let frozen processes run again (``freezer.state`` THAWED).

        Raises
        ------
        CgroupError
            If the cgroup is not THAWED within ``timeout_s`` seconds.
        """
        self._set_freezer("THAWED", timeout_s)

    def freezer_state(self) -> str:
        """``THAWED``, ``FREEZING`` or ``FROZEN``."""
        return (self.paths["freezer"] / "freezer.state").read_text().strip()

    def _set_freezer(self, state: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        try:
            while True:
                self._write("freezer", "freezer.state", state)
                if self.freezer_state() == state:
                    return
                if time.monotonic() > deadline:
                    raise CgroupError(f"cgroup {self.name} did not become {state} in {timeout_s} s")
                time.sleep(0.01)
        except OSError as err:
            raise CgroupError(f"cannot set freezer of cgroup {self.name}: {err}") from err

    # -- teardown --------------------------------------------------------------

    def kill_all(self) -> int:
        """SIGKILL every process left in the cgroup (thawing it so they can die).

        Returns
        -------
        int
            Number of processes signalled.
        """
        n = 0
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                n += 1
        with contextlib.suppress(OSError, CgroupError):
            if self.freezer_state() != "THAWED":
                self._write("freezer", "freezer.state", "THAWED")
        return n

    def remove(self, timeout_s: float = 5.0) -> None:
        """Kill what is left inside and delete the cgroup in every controller.

        Called by :meth:`LocalSandbox.destroy` after the runtime has exited
        (in a thread: it blocks) and by :meth:`LocalSandbox.reap`.  Also
        removes the same name in the other v1 controllers, where runsc leaves
        its own cgroups behind when it crashes.  Idempotent.

        Raises
        ------
        CgroupError
            If a directory is still busy after ``timeout_s`` seconds (a
            process that cannot be killed; ``sandbox-kernel gc`` retries).
        """
        deadline = time.monotonic() + timeout_s
        for ctl in ("freezer", *[c for c in CONTROLLERS if c != "freezer"]):
            path = self.paths[ctl]
            while True:
                try:
                    path.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError as err:
                    if err.errno != errno.EBUSY or time.monotonic() > deadline:
                        raise CgroupError(f"cannot remove cgroup {path}: {err}") from err
                    self.kill_all()
                    time.sleep(0.02)
        for extra in _runtime_owned_dirs(self.name):
            with contextlib.suppress(OSError):
                extra.rmdir()

    def __repr__(self) -> str:
        return f"SandboxCgroup({self.name!r}, memory_mib={self.memory_mib})"
