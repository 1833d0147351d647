"""What stands behind the E2B emulation's "Firecracker microVM": a local sandbox.

Every command of an emulated E2B sandbox runs inside bubblewrap, launched as
the local backend launches it (:func:`sandbox_kernel.backends.local.bwrap.prepare_launch`:
same staging, privilege drop and seccomp filter), as uid 65534, with the
sandbox's persistent directories bound read-write at ``/home/user`` and
``/tmp``.  Nothing here runs sandbox commands or cell code on the host; even
file reads and writes of the files API go through a bubblewrap command, so a
symlink planted by a cell resolves inside the sandbox, never on the host.

What E2B documents and this emulates:

* ``pause`` freezes every process of the sandbox (cgroup v1 freezer when it is
  writable, else ``SIGSTOP`` on each process) and drops open output streams;
  ``resume`` thaws them;
* output produced while no client is connected to a process is dropped;
* a sandbox past its timeout is killed (the dead-man's switch).

Known differences: each command gets its own PID namespace (commands share
files, not a process table), and commands run as uid 65534 rather than as
``user``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from sandbox_kernel.backends.local import layout as local
from sandbox_kernel.backends.local.bwrap import BwrapLaunch, address_space_limit_bytes, prepare_launch
from sandbox_kernel.backends.local.cgroups import SandboxCgroup
from sandbox_kernel.backends.local.procs import descendants
from sandbox_kernel.policy import Policy

FREEZER_ROOT = Path("/sys/fs/cgroup/freezer")
#: Sandbox paths backed by per-sandbox host directories.
PERSISTENT = ("/home/user", "/tmp")
USER_HOME = "/home/user"
#: Longest a held pause waits for the VM's answer (:meth:`EmulatedVM.pause`), seconds.
HOLD_MAX_S = 10.0


def _freezer_usable() -> bool:
    return os.geteuid() == 0 and os.access(FREEZER_ROOT / "cgroup.procs", os.W_OK)


@dataclass
class Proc:
    """One command started through envd's process service."""

    pid: int
    cmd: str
    args: list[str]
    envs: dict[str, str]
    cwd: str
    tag: str | None
    proc: asyncio.subprocess.Process
    stdin_open: bool
    subscribers: set[asyncio.Queue] = field(default_factory=set)
    exit_code: int | None = None
    done: asyncio.Event = field(default_factory=asyncio.Event)
    pumps: list[asyncio.Task] = field(default_factory=list)
    reaper: asyncio.Task | None = None

    def subscribe(self) -> asyncio.Queue:
        """Attach a listener; it sees output produced from now on only."""
        q: asyncio.Queue = asyncio.Queue()
        if self.done.is_set():
            q.put_nowait(("end", self.exit_code))
        self.subscribers.add(q)
        return q

    def unsubscribe(self, q: asyncio.Queue) -> None:
        self.subscribers.discard(q)

    def publish(self, event: tuple) -> None:
        # Nobody listening: E2B drops the output.
        for q in list(self.subscribers):
            q.put_nowait(event)


class VMBase:
    """What every emulated E2B sandbox is to the emulator: its record (ids, metadata, timeout,
    envd token), its processes, its state directory and the open streams a pause drops.

    Parameters
    ----------
    sandbox_id : str
    template : str
    metadata : dict
    env_vars : dict
        Environment given at creation, added to every command's environment.
    timeout_s : float
        Seconds until the sandbox is killed unless :meth:`set_timeout` is called.
    allow_internet : bool
        Recorded only; the emulated sandboxes have no network either way.
    policy : Policy
        Local sandbox policy (``python`` is the template's interpreter).
    """

    def __init__(self, sandbox_id: str, template: str, metadata: dict, env_vars: dict,
                 timeout_s: float, allow_internet: bool, policy: Policy):
        self.sandbox_id = sandbox_id
        self.template = template
        self.metadata = dict(metadata)
        self.env_vars = dict(env_vars)
        self.allow_internet = allow_internet
        self.policy = policy
        self.layout = local.host_layout(policy, sys.executable)
        self.state = "running"
        self.started_at = time.time()
        self.end_at = time.time() + timeout_s
        self.envd_access_token = uuid.uuid4().hex
        self.procs: dict[int, Proc] = {}
        self.state_dir = local.state_base() / f"e2b-emu-{sandbox_id}"
        self.state_dir.mkdir(mode=0o711)
        #: Open streams to drop on pause: callables that abort the connection.
        self.stream_aborts: set = set()
        #: What the SDK sent as ``network`` at creation, for tests to assert.
        self.network: dict = {}

    def drop_streams(self) -> None:
        for abort in list(self.stream_aborts):
            with contextlib.suppress(Exception):
                abort()
        self.stream_aborts.clear()


class EmulatedVM(VMBase):
    """One emulated E2B sandbox of bubblewrap commands: directories, processes, freezer
    and state (parameters: :class:`VMBase`)."""

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self._next_pid = 1000
        local.write_etc(self.state_dir / "etc")
        os.chmod(self.state_dir / "etc", 0o755)
        self.dirs: dict[str, str] = {}
        for i, dest in enumerate(PERSISTENT):
            d = self.state_dir / f"fs{i}"
            d.mkdir(mode=0o700 if dest == USER_HOME else 0o1777)
            if os.geteuid() == 0:
                os.chown(d, local.SANDBOX_UID, local.SANDBOX_GID)
            self.dirs[str(d)] = dest
        self.cgroup: Path | None = None
        if _freezer_usable():
            self.cgroup = FREEZER_ROOT / f"sandbox-kernel-e2b-emu-{self.sandbox_id}"
            self.cgroup.mkdir()

    # ---- spawning -----------------------------------------------------------

    def _launch(self, command: list[str]) -> BwrapLaunch:
        """The local backend's bubblewrap launch, joining this sandbox's freezer first."""
        cgroup = None
        if self.cgroup is not None:
            cgroup = SandboxCgroup(self.cgroup.name, {"freezer": self.cgroup}, self.policy.memory_mib)
        # the VM's memory: RLIMIT_AS per process, as the local backend sets without a cgroup
        return prepare_launch(self.policy, self.layout, self.state_dir, command=command,
                              rw_binds=self.dirs, cgroup=cgroup,
                              rlimit_as_bytes=address_space_limit_bytes(self.policy))

    async def spawn(self, cmd: str, args: list[str], envs: dict[str, str], cwd: str | None,
                    stdin: bool, tag: str | None, user: str | None = None) -> Proc:
        """Start ``cmd args`` inside the sandbox (envd ``Process/Start``); ``user`` is
        not emulated here (every command is uid 65534)."""
        cwd = cwd or USER_HOME
        env = {"HOME": USER_HOME, "USER": "user", **self.env_vars, **envs}
        inner = ["/usr/bin/env", f"--chdir={cwd}", "--"] + [f"{k}={v}" for k, v in env.items()] + [cmd, *args]
        launch = self._launch(inner)
        try:
            proc = await asyncio.create_subprocess_exec(
                *launch.argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE, env={}, pass_fds=launch.pass_fds,
                preexec_fn=launch.preexec_fn, cwd="/", limit=1 << 20)
        finally:
            launch.close()
        self._next_pid += 1
        p = Proc(pid=self._next_pid, cmd=cmd, args=list(args), envs=dict(envs), cwd=cwd, tag=tag,
                 proc=proc, stdin_open=stdin)
        if not stdin:
            proc.stdin.close()
        self.procs[p.pid] = p
        p.pumps = [asyncio.ensure_future(self._pump(p, proc.stdout, "stdout")),
                   asyncio.ensure_future(self._pump(p, proc.stderr, "stderr"))]
        p.reaper = asyncio.ensure_future(self._reap(p))
        return p

    async def _pump(self, p: Proc, stream: asyncio.StreamReader, name: str) -> None:
        while True:
            chunk = await stream.read(65536)
            if not chunk:
                return
            p.publish((name, chunk))

    async def _reap(self, p: Proc) -> None:
        rc = await p.proc.wait()
        if p.proc.stdin is not None:  # its pipe closed on this loop, not at a GC after the loop closed
            p.proc.stdin.close()
        await asyncio.gather(*p.pumps, return_exceptions=True)
        p.exit_code = rc
        p.done.set()
        p.publish(("end", rc))
        self.procs.pop(p.pid, None)

    async def run_helper(self, command: list[str], data: bytes | None = None,
                         timeout_s: float = 30.0) -> tuple[int, bytes, bytes]:
        """Run a short command inside the sandbox; return (rc, stdout, stderr)."""
        launch = self._launch(command)
        try:
            proc = await asyncio.create_subprocess_exec(
                *launch.argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE, env={}, pass_fds=launch.pass_fds,
                preexec_fn=launch.preexec_fn, cwd="/")
        finally:
            launch.close()
        out, err = await asyncio.wait_for(proc.communicate(data), timeout_s)
        return proc.returncode, out, err

    # ---- input and signals ---------------------------------------------------

    async def send_stdin(self, pid: int, data: bytes) -> None:
        p = self.procs[pid]
        if not p.stdin_open or p.proc.stdin is None:
            raise BrokenPipeError("stdin is not open")
        p.proc.stdin.write(data)
        await p.proc.stdin.drain()

    def host_pids(self) -> list[int]:
        """Host pids of every process of the sandbox (cgroup, else process trees)."""
        if self.cgroup is not None:
            with contextlib.suppress(OSError):
                return [int(x) for x in (self.cgroup / "cgroup.procs").read_text().split()]
        return _tree([p.proc.pid for p in self.procs.values()])

    async def close_stdin(self, pid: int) -> None:
        p = self.procs[pid]
        if p.proc.stdin is not None:
            p.proc.stdin.close()
        p.stdin_open = False

    async def write_file(self, path: str, data: bytes) -> None:
        """Write ``path`` through a command inside the sandbox (a link a cell planted
        resolves there, never on the host).

        Raises
        ------
        OSError
            The command failed (its stderr's end)."""
        rc, _, err = await self.run_helper(
            ["/bin/sh", "-c", 'mkdir -p -- "$(dirname -- "$1")" && cat > "$1"', "sh", path], data)
        if rc != 0:
            raise OSError(err.decode("utf-8", "replace")[-500:])

    async def read_file(self, path: str) -> bytes:
        """Read ``path`` through a command inside the sandbox (:meth:`write_file`)."""
        rc, out, err = await self.run_helper(["/bin/cat", "--", path])
        if rc != 0:
            raise OSError(err.decode("utf-8", "replace")[-500:])
        return out

    async def signal(self, pid: int, sig: int) -> None:
        """Deliver ``sig`` to a command and everything it started."""
        p = self.procs.get(pid)
        if p is None:
            raise KeyError(pid)
        for hp in _tree([p.proc.pid]):
            with contextlib.suppress(ProcessLookupError):
                os.kill(hp, sig)

    # ---- lifecycle -------------------------------------------------------------

    async def pause(self, hold: tuple[str, str] | None = None) -> None:
        """Freeze every process and drop every open stream, as E2B does.

        ``hold``: ``(marker, done)`` paths inside the sandbox; once the streams are
        dropped, write ``marker`` and wait for ``done`` (at most :data:`HOLD_MAX_S`)
        before freezing (:attr:`E2BEmulator.pause_hold`)."""
        self.drop_streams()
        if hold is not None:
            await self._hold(*hold)
        if self.cgroup is not None:
            (self.cgroup / "freezer.state").write_text("FROZEN")
            for _ in range(200):
                if (self.cgroup / "freezer.state").read_text().strip() == "FROZEN":
                    break
                await asyncio.sleep(0.01)
        else:
            seen: set[int] = set()
            while True:  # repeat until no new process appears (forks in flight)
                pids = set(self.host_pids()) - seen
                if not pids:
                    break
                for hp in pids:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(hp, signal.SIGSTOP)
                seen |= pids
        self.state = "paused"

    async def _hold(self, marker: str, done: str) -> None:
        """Write ``marker`` and wait until ``done`` exists, both through commands inside
        the sandbox (a link a cell planted resolves there, never on the host)."""
        await self.run_helper(["/bin/sh", "-c", ': > "$1"', "sh", marker])
        deadline = time.monotonic() + HOLD_MAX_S
        while time.monotonic() < deadline:
            rc, _, _ = await self.run_helper(["/bin/sh", "-c", 'test -e "$1"', "sh", done])
            if rc == 0:
                return
            await asyncio.sleep(0.05)

    async def resume(self, timeout_s: float) -> None:
        if self.cgroup is not None:
            (self.cgroup / "freezer.state").write_text("THAWED")
        else:
            for hp in self.host_pids():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(hp, signal.SIGCONT)
        self.state = "running"
        self.end_at = time.time() + timeout_s

    async def kill(self) -> None:
        """Destroy every process, the freezer cgroup and the directories."""
        self.drop_streams()
        self.state = "killed"
        for _ in range(50):
            pids = self.host_pids()
            if not pids:
                break
            for hp in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(hp, signal.SIGKILL)
            if self.cgroup is not None:
                (self.cgroup / "freezer.state").write_text("THAWED")
            await asyncio.sleep(0.05)
        for p in list(self.procs.values()):
            with contextlib.suppress(ProcessLookupError):
                p.proc.kill()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(p.done.wait(), 5)
        if self.cgroup is not None:
            with contextlib.suppress(OSError):
                self.cgroup.rmdir()
        shutil.rmtree(self.state_dir, ignore_errors=True)


def _tree(roots: list[int]) -> list[int]:
    """Host pids of the live ``roots`` and everything below them."""
    return [pid for r in roots if os.path.exists(f"/proc/{r}") for pid in descendants(r)]
