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
import ctypes
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import RuntimeUnavailable, SandboxDied, SandboxKernelError, SandboxStartError
from ..policy import Policy
from . import seccomp
from .base import Capabilities, ExitInfo, SandboxBackend

SANDBOX_UID = 65534
SANDBOX_GID = 65534
SANDBOX_HOME = "/home/sandbox"
AGENT_PATH = "/opt/sandbox-kernel/agent.py"
#: Prefix of every state directory and container id; ``gc`` looks for it.
TAG = "sandbox-kernel"

#: ``/etc`` entries bound read-only when they exist on the host.
ETC_ALLOWLIST = (
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "alternatives",
    "localtime",
    "mime.types",
    "os-release",
    "ssl",
    "ca-certificates",
    "fonts",
    "nsswitch.conf",
    "matplotlibrc",
)

GVISOR_BOUNDARY = "gVisor user-space kernel (runsc, ptrace platform)"
BWRAP_BOUNDARY = "shared Linux kernel: namespaces + seccomp (bubblewrap)"


def agent_source_path() -> str:
    """Host path of ``agent.py``, the file shipped into every sandbox."""
    return str(Path(__file__).resolve().parent.parent / "agent.py")


def state_base() -> Path:
    """Directory holding per-sandbox state (bundles, runsc root), created 0711."""
    base = Path(os.environ.get("SANDBOX_KERNEL_STATE_DIR") or
                ("/run/sandbox-kernel" if os.geteuid() == 0 else
                 Path(tempfile.gettempdir()) / f"sandbox-kernel-{os.geteuid()}"))
    base.mkdir(parents=True, exist_ok=True)
    os.chmod(base, 0o711)
    return base


# ----------------------------------------------------------------------------
# What to mount
# ----------------------------------------------------------------------------


@dataclass(frozen=True)
class HostLayout:
    """Host paths a sandbox needs, derived once per policy.

    Attributes
    ----------
    python : str
        Interpreter path used inside (same path as on the host).
    ro_dirs : tuple of str
        Host directories bound read-only at the same path (Python env, extras).
    etc_entries : tuple of str
        Names under ``/etc`` bound read-only.
    usr_links : tuple of (str, str)
        Top-level links such as ``("/bin", "usr/bin")`` on merged-/usr hosts.
    usr_dirs : tuple of str
        Top-level system dirs bound read-only where they are not links.
    """

    python: str
    ro_dirs: tuple[str, ...]
    etc_entries: tuple[str, ...]
    usr_links: tuple[tuple[str, str], ...]
    usr_dirs: tuple[str, ...] = ("/usr",)


def _python_prefixes(python: str) -> list[str]:
    if os.path.realpath(python) == os.path.realpath(sys.executable):
        prefixes = [sys.prefix, sys.base_prefix]
    else:
        # The operator's configured interpreter (a trusted host binary, not cell code).
        out = subprocess.run(
            [python, "-I", "-c", "import sys; print(sys.prefix); print(sys.base_prefix)"],
            capture_output=True, text=True, timeout=30, env={"PATH": "/usr/bin:/bin"}, check=True,
        ).stdout.split("\n")
        prefixes = [out[0], out[1]]
    prefixes.append(str(Path(os.path.realpath(python)).parent.parent))
    return prefixes


def _minimal(paths: list[str]) -> tuple[str, ...]:
    """Drop paths covered by another (or by /usr), keep order stable."""
    out: list[str] = []
    for p in sorted({os.path.normpath(p) for p in paths if p}, key=len):
        if p in ("/", "/usr") or p.startswith("/usr/") or any(p == q or p.startswith(q + "/") for q in out):
            continue
        out.append(p)
    return tuple(out)


def host_layout(policy: Policy) -> HostLayout:
    """Compute the mounts for ``policy`` on this host.

    Raises
    ------
    SandboxStartError
        If the configured interpreter does not run.
    """
    try:
        prefixes = _python_prefixes(policy.python)
    except (OSError, subprocess.SubprocessError) as err:
        raise SandboxStartError(
            f"cannot run the sandbox interpreter {policy.python}: {err}; "
            "set --SandboxKernel.python to a Python with ipykernel installed"
        ) from err
    links, dirs = [], ["/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            links.append((top, os.readlink(top)))
        elif os.path.isdir(top):
            dirs.append(top)
    etc = tuple(e for e in ETC_ALLOWLIST if os.path.lexists(f"/etc/{e}"))
    return HostLayout(
        python=policy.python,
        ro_dirs=_minimal([*prefixes, *policy.ro_paths]),
        etc_entries=etc,
        usr_links=tuple(links),
        usr_dirs=tuple(dirs),
    )


def sandbox_env(policy: Policy, layout: HostLayout) -> dict[str, str]:
    """The sandbox's whole environment: a fixed base plus :attr:`Policy.env`.

    Nothing from the host's environment is inherited.
    """
    bindir = os.path.dirname(layout.python)
    env = {
        "HOME": SANDBOX_HOME,
        "USER": "sandbox",
        "LOGNAME": "sandbox",
        "SHELL": "/bin/sh",
        "PATH": f"{bindir}:/usr/local/bin:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "TMPDIR": "/tmp",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYDEVD_DISABLE_FILE_VALIDATION": "1",
        "MPLCONFIGDIR": "/tmp/.matplotlib",
    }
    env.update(policy.env_dict)
    return env


def agent_command(layout: HostLayout) -> list[str]:
    """Argv of the agent inside the sandbox."""
    return [layout.python, "-u", AGENT_PATH, "--cwd", SANDBOX_HOME]


def write_etc(dest: Path) -> None:
    """Write the generated ``/etc`` files into ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "passwd").write_text(
        "root:x:0:0:root:/root:/usr/sbin/nologin\n"
        f"sandbox:x:{SANDBOX_UID}:{SANDBOX_GID}:sandbox:{SANDBOX_HOME}:/bin/sh\n"
    )
    (dest / "group").write_text(f"root:x:0:\nsandbox:x:{SANDBOX_GID}:\n")
    (dest / "hosts").write_text("127.0.0.1 localhost sandbox\n::1 localhost\n")
    (dest / "hostname").write_text("sandbox\n")


# ----------------------------------------------------------------------------
# bubblewrap
# ----------------------------------------------------------------------------


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

    Returns
    -------
    list of str
    """
    sources = sources or {}
    scratch = str(policy.scratch_mib * 1024 * 1024)
    argv = [
        bwrap,
        "--unshare-all", "--unshare-user", "--disable-userns",
        "--die-with-parent", "--new-session", "--clearenv",
        "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_GID),
        "--hostname", "sandbox",
    ]
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
        "--ro-bind", sources.get(AGENT_PATH, agent_source_path()), AGENT_PATH,
        "--proc", "/proc",
        "--dev", "/dev",
        "--perms", "1777", "--size", scratch, "--tmpfs", "/tmp",
        "--perms", "0700", "--size", scratch, "--tmpfs", SANDBOX_HOME,
    ]
    for host, dest in (rw_binds or {}).items():
        argv += ["--bind", host, dest]
    argv += ["--chdir", SANDBOX_HOME]
    for k, v in sandbox_env(policy, layout).items():
        argv += ["--setenv", k, v]
    argv += ["--seccomp", str(seccomp_fd), "--"]
    argv += command if command is not None else agent_command(layout)
    return argv


_libc = ctypes.CDLL(None, use_errno=True)
_CLONE_NEWNS = 0x00020000
_MS_BIND, _MS_REC, _MS_PRIVATE = 4096, 16384, 1 << 18


def _check(rc: int, what: str) -> None:
    if rc != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"{what}: {os.strerror(e)}")


def _drop_privileges_preexec(stage: dict[str, str]):
    """Return a ``preexec_fn`` that stages bind mounts, then drops to uid 65534.

    Run as root, bubblewrap would map the sandbox user to host uid 0 (root's
    files readable inside).  So the child first enters a private mount
    namespace, bind-mounts directories root can reach but uid 65534 cannot
    (``/root`` is 0700) onto world-traversable staging points, then becomes
    uid 65534 and execs bubblewrap unprivileged.  The host's mount table is
    untouched; the staged mounts vanish with the namespace.
    """

    def preexec() -> None:
        _check(_libc.unshare(_CLONE_NEWNS), "unshare(CLONE_NEWNS)")
        _check(_libc.mount(b"none", b"/", None, _MS_REC | _MS_PRIVATE, None), "make / private")
        for src, point in stage.items():
            _check(_libc.mount(src.encode(), point.encode(), None, _MS_BIND | _MS_REC, None),
                   f"bind {src}")
        os.setgroups([])
        os.setgid(SANDBOX_GID)
        os.setuid(SANDBOX_UID)

    return preexec


# ----------------------------------------------------------------------------
# gVisor
# ----------------------------------------------------------------------------


def oci_config(policy: Policy, layout: HostLayout, *, etc_dir: str, command: list[str] | None = None) -> dict:
    """Build the OCI runtime spec (``config.json``) for runsc from the policy.

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
    ]

    def ro(src: str, dst: str) -> dict:
        return {"destination": dst, "type": "bind", "source": src, "options": ["rbind", "ro", "nosuid", "nodev"]}

    mounts += [ro(d, d) for d in layout.usr_dirs]
    mounts += [ro(f"{etc_dir}/{n}", f"/etc/{n}") for n in ("passwd", "group", "hosts", "hostname")]
    mounts += [ro(f"/etc/{n}", f"/etc/{n}") for n in layout.etc_entries]
    mounts += [ro(d, d) for d in layout.ro_dirs]
    mounts.append(ro(agent_source_path(), AGENT_PATH))
    env = sandbox_env(policy, layout)
    return {
        "ociVersion": "1.0.2",
        "process": {
            "terminal": False,
            "user": {"uid": SANDBOX_UID, "gid": SANDBOX_GID, "additionalGids": []},
            "args": command if command is not None else agent_command(layout),
            "env": [f"{k}={v}" for k, v in env.items()],
            "cwd": SANDBOX_HOME,
            "capabilities": {k: [] for k in ("bounding", "effective", "inheritable", "permitted", "ambient")},
            "noNewPrivileges": True,
            "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 4096, "soft": 4096}],
        },
        "root": {"path": "rootfs", "readonly": True},
        "hostname": "sandbox",
        "mounts": mounts,
        "linux": {
            "namespaces": [{"type": t} for t in ("pid", "network", "ipc", "uts", "mount")],
        },
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
            os.chmod(d, 0o755)


def runsc_argv(state_root: str, *, runsc: str = "runsc", platform: str = "ptrace") -> list[str]:
    """runsc's global flags (before the subcommand), from the policy's network setting."""
    return [runsc, "--root", state_root, "--network=none", f"--platform={platform}"]


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


class LocalBackend(SandboxBackend):
    """A sandbox on this machine; see the module docstring for what it sees."""

    name = "local"

    def __init__(self, policy: Policy, kernel_id: str, log: logging.Logger | None = None):
        super().__init__(policy, kernel_id, log)
        self.runtime = resolve_runtime(policy.runtime)
        self._sb: _Sandbox | None = None
        self._stderr_task: asyncio.Task | None = None

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
        return d

    async def start(self) -> None:
        await self.kill()
        layout = host_layout(self.policy)
        cid = f"{TAG}-{self.kernel_id[:12]}-{uuid.uuid4().hex[:6]}"
        state_dir = state_base() / cid
        state_dir.mkdir(mode=0o711)
        (state_dir / "tag.json").write_text(json.dumps(
            {"kernel_id": self.kernel_id, "proxy_pid": os.getpid(), "created_at": time.time(),
             "runtime": self.runtime, "owner_uid": os.getuid()}))
        write_etc(state_dir / "etc")
        os.chmod(state_dir / "etc", 0o755)
        try:
            if self.runtime == "gvisor":
                proc = await self._start_gvisor(layout, state_dir, cid)
            else:
                proc = await self._start_bwrap(layout, state_dir)
        except OSError as err:
            shutil.rmtree(state_dir, ignore_errors=True)
            raise SandboxStartError(f"could not launch the {self.runtime} sandbox: {err}") from err
        self._sb = _Sandbox(proc=proc, state_dir=state_dir, runtime=self.runtime, container_id=cid)
        self._sb.reattached.set()
        self._stderr_task = asyncio.ensure_future(self._drain_stderr(self._sb))
        await self._arm_watchdog(self._sb)
        self.log.info("sandbox %s started: %s", cid, self.capabilities.boundary)

    async def _start_bwrap(self, layout: HostLayout, state_dir: Path) -> asyncio.subprocess.Process:
        r, w = os.pipe()
        prog = seccomp.build_filter()
        os.write(w, prog)
        os.close(w)
        sources: dict[str, str] = {}
        preexec = None
        if os.geteuid() == 0:
            stage_root = state_dir / "stage"
            stage_root.mkdir(mode=0o755)
            stage: dict[str, str] = {}
            for i, d in enumerate([*layout.ro_dirs, AGENT_PATH]):
                src = agent_source_path() if d == AGENT_PATH else d
                point = stage_root / str(i)
                if os.path.isdir(src):
                    point.mkdir(mode=0o755)
                else:
                    point.touch(mode=0o644)
                stage[src] = str(point)
                sources[d] = str(point)
            preexec = _drop_privileges_preexec(stage)
        argv = bwrap_argv(self.policy, layout, etc_dir=str(state_dir / "etc"),
                          seccomp_fd=r, sources=sources, bwrap=shutil.which("bwrap") or "bwrap")
        try:
            return await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE, env={}, pass_fds=(r,), preexec_fn=preexec,
                limit=1 << 20, cwd="/",
            )
        finally:
            os.close(r)

    async def _start_gvisor(self, layout: HostLayout, state_dir: Path, cid: str) -> asyncio.subprocess.Process:
        bundle = state_dir / "bundle"
        bundle.mkdir()
        config = oci_config(self.policy, layout, etc_dir=str(state_dir / "etc"))
        prepare_rootfs(bundle / "rootfs", config, layout)
        (bundle / "config.json").write_text(json.dumps(config, indent=1))
        root = state_dir / "runsc"
        root.mkdir(mode=0o700)
        argv = runsc_argv(str(root), runsc=shutil.which("runsc") or "runsc")
        argv += ["run", "--bundle", str(bundle), cid]
        return await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
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
        tail = sb.stderr_tail.decode("utf-8", "replace").strip().splitlines()[-3:]
        if rc is None:
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
        shutil.rmtree(sb.state_dir, ignore_errors=True)
        self.log.info("sandbox %s removed", sb.container_id)

    async def _runsc(self, sb: _Sandbox, *args: str) -> int:
        argv = runsc_argv(str(sb.state_dir / "runsc"), runsc=shutil.which("runsc") or "runsc") + list(args)
        proc = await asyncio.create_subprocess_exec(
            *argv, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
            env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})
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
            await asyncio.create_subprocess_exec(
                sys.executable, "-m", "sandbox_kernel.watchdog", "--fd", str(r),
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
        from .. import watchdog

        with contextlib.suppress(OSError):
            os.write(sb.watchdog_fd, watchdog.DISARM)
        with contextlib.suppress(OSError):
            os.close(sb.watchdog_fd)
        sb.watchdog_fd = None

    async def _runsc_checked(self, sb: _Sandbox, *args: str, timeout_s: float = 60) -> None:
        argv = runsc_argv(str(sb.state_dir / "runsc"), runsc=shutil.which("runsc") or "runsc") + list(args)
        proc = await asyncio.create_subprocess_exec(
            *argv, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
            env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})
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
        cgroup = getattr(sb, "cgroup", None)
        if cgroup is not None and hasattr(cgroup, "freeze"):
            cgroup.freeze()
            return
        # No per-sandbox cgroup wired: SIGSTOP the whole process tree (see docs/decisions.md).
        from ..watchdog import descendants

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
            cgroup = getattr(sb, "cgroup", None)
            if cgroup is not None and hasattr(cgroup, "thaw") and not sb.stopped_pids:
                cgroup.thaw()
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
            stderr=asyncio.subprocess.PIPE, env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
            limit=1 << 20, cwd=str(sb.state_dir), start_new_session=True,
        )
        sb.proc = proc
        sb.checkpointed = False
        sb.stderr_tail.clear()
        self._stderr_task = asyncio.ensure_future(self._drain_stderr(sb))
        sb.reattached.set()
