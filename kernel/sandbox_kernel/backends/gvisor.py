"""The gVisor runtime: OCI bundle and runsc argv from the policy.

runsc runs the agent in a user-space kernel (``GVISOR_BOUNDARY``), on the
ptrace platform (KVM hangs in this nested VM), without Docker: the bundle is
an empty read-only root with a mount point per bind, and ``config.json``.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..policy import Policy
from . import limits
from .layout import (
    AGENT_PATH,
    SANDBOX_GID,
    SANDBOX_HOME,
    SANDBOX_UID,
    HostLayout,
    agent_command,
    agent_source_path,
    sandbox_env,
)

#: Environment of the runsc processes themselves (never the proxy's).
RUNSC_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}


def oci_config(policy: Policy, layout: HostLayout, *, etc_dir: str, command: list[str] | None = None,
               cgroup=None) -> dict:
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
            "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 4096, "soft": 4096}, *limits.oci_rlimits(policy)],
        },
        "root": {"path": "rootfs", "readonly": True},
        "hostname": "sandbox",
        "mounts": mounts,
        "linux": {
            "namespaces": [{"type": t} for t in ("pid", "network", "ipc", "uts", "mount")],
            **limits.oci_linux(policy, cgroup),
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
