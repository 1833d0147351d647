"""Run a cloud emulation's sandbox commands inside bubblewrap on this machine.

The cloud emulations (Modal, E2B) stand in for a remote service; what runs
"in the sandbox" must still never run on the host.  Every command goes through
:func:`sandbox_kernel.backends.local.bwrap.prepare_launch` as uid 65534: the same
argv, staging, privilege drop and seccomp filter as the local backend.  The
"image" is the host Python environment the local backend mounts read-only; a per-sandbox directory stands for the sandbox's writable
filesystem and is bound at the home directory of every command of that
sandbox, so files persist from one exec to the next, as in a container.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
import tempfile
from pathlib import Path

from sandbox_kernel.backends.local.bwrap import address_space_limit_bytes, prepare_launch
from sandbox_kernel.backends.local.layout import (
    SANDBOX_GID,
    SANDBOX_HOME,
    SANDBOX_UID,
    host_layout,
    write_etc,
)
from sandbox_kernel.guest import AGENT_PATH
from sandbox_kernel.policy import Policy


class LocalSandboxFS:
    """One emulated sandbox's host-side state: generated ``/etc``, files, home.

    Parameters
    ----------
    policy : Policy
        Environment, mounts and scratch size of every command (runtime is
        always bubblewrap here).
    files : dict of str to bytes, optional
        Files the client shipped into the image (a mount), by sandbox path.
        Only :data:`~sandbox_kernel.guest.AGENT_PATH` can be placed
        (bubblewrap binds it read-only); others are kept for inspection.
    """

    def __init__(self, policy: Policy, files: dict[str, bytes] | None = None):
        self.policy = policy
        self.layout = host_layout(policy, sys.executable)
        self.root = Path(tempfile.mkdtemp(prefix="modal-emu-"))
        os.chmod(self.root, 0o711)
        write_etc(self.root / "etc")
        os.chmod(self.root / "etc", 0o755)
        self.home = self.root / "home"
        self.home.mkdir(mode=0o700)
        if os.geteuid() == 0:
            os.chown(self.home, SANDBOX_UID, SANDBOX_GID)
        self.files: dict[str, Path] = {}
        fdir = self.root / "files"
        fdir.mkdir(mode=0o755)
        for i, (path, data) in enumerate(sorted((files or {}).items())):
            host = fdir / str(i)
            host.write_bytes(data)
            os.chmod(host, 0o644)
            self.files[path] = host

    async def spawn(self, command: list[str], env: dict[str, str] | None = None) -> asyncio.subprocess.Process:
        """Start ``command`` in a fresh bubblewrap sandbox sharing this home.

        Parameters
        ----------
        command : list of str
            Argv inside the sandbox (``PATH`` lookup inside).
        env : dict, optional
            Extra environment beyond the fixed base; checked by
            :class:`Policy` (``MODAL_TOKEN_*`` and the like are refused).

        Returns
        -------
        asyncio.subprocess.Process
            With piped stdin, stdout and stderr; killing it ends every process
            of that command (bubblewrap is the pid namespace's parent).
        """
        policy = self.policy
        if env:
            policy = Policy(**{**_fields(policy), "env": tuple(sorted({**policy.env_dict, **env}.items()))})
        launch = prepare_launch(policy, self.layout, self.root, command=command,
                                rw_binds={str(self.home): SANDBOX_HOME},
                                rlimit_as_bytes=address_space_limit_bytes(policy),  # the container's memory
                                agent_source=str(self.files[AGENT_PATH]) if AGENT_PATH in self.files else None)
        try:
            return await asyncio.create_subprocess_exec(
                *launch.argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE, env={}, pass_fds=launch.pass_fds,
                preexec_fn=launch.preexec_fn, limit=1 << 20, cwd="/")
        finally:
            launch.close()

    def remove(self) -> None:
        """Delete the host-side state (call after every process ended)."""
        shutil.rmtree(self.root, ignore_errors=True)


def _fields(policy: Policy) -> dict:
    import dataclasses

    return {f.name: getattr(policy, f.name) for f in dataclasses.fields(policy)}
