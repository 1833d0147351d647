"""The gVisor runtime: OCI bundle and runsc argv from the policy.

runsc runs the agent in a user-space kernel (``GVISOR_BOUNDARY``), on the
ptrace platform (KVM hangs in this nested VM), without Docker: the bundle is
an empty read-only root with a mount point per bind, and ``config.json``.
"""

from __future__ import annotations

import os
from pathlib import Path

from ...guest import AGENT_PATH, agent_source_path, statx_shim_source
from ...policy import Policy
from . import cgroups as limits
from .layout import (
    SANDBOX_GID,
    SANDBOX_HOME,
    SANDBOX_UID,
    HostLayout,
    agent_command,
    sandbox_env,
)

#: Environment of the runsc processes themselves (never the proxy's).
RUNSC_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
#: Where the statx shim (:func:`statx_shim`) is mounted inside.
SHIM_PATH = "/opt/sandbox-kernel/statx-shim.so"
#: The agent's capabilities inside the sandbox (it runs as uid 0 of the sandbox, the
#: interpreter as :data:`SANDBOX_UID` with none): start the interpreter under that uid,
#: hand it its socket directory, reach its sockets and signal its process group.
AGENT_CAPABILITIES = ["CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_KILL", "CAP_SETGID", "CAP_SETUID"]


def statx_shim(cache_dir: Path) -> str | None:
    """Build (once) and return the host path of the statx compatibility shim.

    Debian's runsc 20221219 answers ``statx(..., AT_NO_AUTOMOUNT)`` with
    EINVAL, which breaks ``ls`` and ``stat`` in ``!`` commands; the shim
    (``resources/statx_shim.c``), preloaded in the sandbox, clears that flag.
    It is compiled from our own source with the host's C compiler into
    ``cache_dir``, keyed by the source's hash.

    Returns
    -------
    str or None
        None when no C compiler is available (``doctor`` says so); the sandbox
        then works without it, and coreutils' ``ls``/``stat`` fail inside.
    """
    import hashlib
    import shutil
    import subprocess

    src = statx_shim_source()
    out = Path(cache_dir) / f"statx-shim-{hashlib.sha256(src).hexdigest()[:12]}.so"
    if out.exists():
        return str(out)
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None
    tmp = out.with_suffix(f".{os.getpid()}.tmp")
    c_file = tmp.with_suffix(".c")
    c_file.write_bytes(src)
    try:
        subprocess.run([cc, "-shared", "-fPIC", "-O2", "-o", str(tmp), str(c_file)], check=True,
                       capture_output=True, timeout=60, env=RUNSC_ENV)
        os.chmod(tmp, 0o644)
        os.replace(tmp, out)
    except (OSError, subprocess.SubprocessError):
        return None
    finally:
        c_file.unlink(missing_ok=True)
        tmp.unlink(missing_ok=True)
    return str(out)


def oci_config(policy: Policy, layout: HostLayout, *, etc_dir: str, command: list[str] | None = None,
               cgroup=None, shim: str | None = None) -> dict:
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
    mounts.append(ro(agent_source_path(), AGENT_PATH))
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
            "cwd": SANDBOX_HOME,
            "noNewPrivileges": True,
            "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 4096, "soft": 4096}, *oci_rlimits(policy)],
        },
        "root": {"path": "rootfs", "readonly": True},
        "hostname": "sandbox",
        "mounts": mounts,
        "linux": {
            "namespaces": [{"type": t} for t in ("pid", "network", "ipc", "uts", "mount")],
            **oci_linux(policy, cgroup),
        },
    }


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
            os.chmod(d, 0o755)


def runsc_argv(state_root: str, *, runsc: str = "runsc", platform: str = "ptrace") -> list[str]:
    """runsc's global flags (before the subcommand), from the policy's network setting."""
    return [runsc, "--root", state_root, "--network=none", f"--platform={platform}"]


# ----------------------------------------------------------------------------
# gVisor: the OCI spec's part
# ----------------------------------------------------------------------------


def oci_rlimits(policy: Policy) -> list[dict]:
    """Entries to append to the spec's ``process.rlimits`` for gVisor.

    ``RLIMIT_NPROC`` = :attr:`Policy.pids_max`: the sentry enforces it per
    guest user (every sandboxed process is uid 65534 inside), so a fork bomb
    gets ``EAGAIN`` while the sandbox lives (measured: 185 forks at a limit of
    200, then ``BlockingIOError``).  Not for bubblewrap, where the same rlimit
    would count every uid-65534 process on the host.
    """
    return [{"type": "RLIMIT_NPROC", "hard": policy.pids_max, "soft": policy.pids_max}]


def oci_resources(policy: Policy) -> dict:
    """The OCI ``linux.resources`` object for the policy.

    runsc applies it only to cgroups it creates itself; with a pre-created
    :class:`SandboxCgroup` (the recommended path) our limits stand and this
    documents them in ``config.json``.

    Returns
    -------
    dict
        ``memory.limit`` and ``memory.swap`` in bytes (equal: no swap),
        ``cpu.quota``/``cpu.period`` in microseconds, ``pids.limit`` (host
        tasks, :func:`host_pids_max`).
    """
    mem = policy.memory_mib * 1024 * 1024
    return {
        "memory": {"limit": mem, "swap": mem},
        "cpu": {"quota": max(1000, round(policy.cpu_cores * limits.CFS_PERIOD_US)), "period": limits.CFS_PERIOD_US},
        "pids": {"limit": limits.host_pids_max(policy, "gvisor")},
    }


def oci_linux(policy: Policy, cgroup: "limits.SandboxCgroup | None") -> dict:
    """Keys to merge into the spec's ``linux`` object: ``resources`` and ``cgroupsPath``.

    Parameters
    ----------
    policy : Policy
    cgroup : SandboxCgroup or None
        The sandbox's pre-created cgroup.  ``None`` gives no ``cgroupsPath``:
        runsc then creates no cgroup and enforces nothing (measured).

    Returns
    -------
    dict
    """
    out: dict = {"resources": oci_resources(policy)}
    if cgroup is not None:
        out["cgroupsPath"] = cgroup.relative_path
    return out


def gvisor_exit_cause(cgroup: "limits.SandboxCgroup | None", returncode: int | None) -> str | None:
    """Name the limit that ended a gVisor sandbox, if one did.

    Measured: a memory breach SIGKILLs the sandbox process; ``runsc run``
    then exits 137 and the cgroup's ``oom_kill`` counter is 1.

    Returns
    -------
    str or None
        ``"memory limit N MiB exceeded"`` or None.
    """
    if cgroup is not None and cgroup.oom_detected():
        return cgroup.oom_cause()
    return None
