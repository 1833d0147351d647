"""The node side of the Ray backend: a Ray actor that owns one local sandbox.

:class:`SandboxOwner` runs in a Ray worker process on whichever node Ray's
scheduler placed it (:class:`.backend.RayBackend` creates it with the policy's
memory and CPUs and the operator's custom resources as its demand).  It holds a
:class:`~sandbox_kernel.backends.local.LocalBackend`, so the sandbox is made by
the same runtime code as on a single machine (gVisor by default, bubblewrap if
the operator says so), runs the same agent zipapp, and gets the same limits and
the same dead-man's switch: the local watchdog reaps the sandbox when this
worker process ends, which Ray makes happen when the proxy (the actor's owner)
dies.

The actor carries the framed channel and nothing else: :meth:`SandboxOwner.write`
passes whole frames to the agent's stdin, :meth:`SandboxOwner.read` returns the
next chunk of its stdout (at most ``max_bytes``; it waits on the pipe, never
polls).  It parses none of it: the proxy does, as for every backend.

This module imports neither ray nor anything host-only beyond the local
backend; Ray imports it on the node by reference (``ray.remote(SandboxOwner)``
in the proxy pickles the class by its module path), so the node needs
sandbox-kernel installed, as ``scripts/setup.sh`` does.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import socket
from typing import Any

from ...policy import Policy

#: Options of :class:`~sandbox_kernel.backends.local.LocalBackend` an actor's sandbox
#: always gets: no warm pool, spare sandbox or start template (each a process or a cache
#: of the node's, kept for a later kernel of the same user on the same machine, which a
#: cluster's placement does not give).
FIXED_LOCAL_OPTIONS: dict[str, Any] = {"pool_socket": "", "spare_sandbox": False, "start_template": False}

#: The most bytes one :meth:`SandboxOwner.read` returns (its ``max_bytes`` is capped to it).
MAX_READ_BYTES = 1 << 20


def node_policy(policy: Policy) -> Policy:
    """The policy the node's sandbox is made with: ``policy`` without host paths.

    ``ro_paths`` and ``workspace_path`` name folders of the proxy's machine, which
    mean nothing (or something else) on a cluster node; they are dropped, and the
    kernel reports them as not enforced (:attr:`.backend.RayBackend.enforced_fields`).

    Returns
    -------
    Policy
    """
    return dataclasses.replace(policy, ro_paths=(), workspace="none")


class SandboxOwner:
    """One local sandbox on this Ray node, driven by a proxy elsewhere.

    Created by :meth:`.backend.RayBackend.start` as a Ray actor (async: its methods
    run on one event loop in the worker, several at a time, so a pending
    :meth:`read` never holds up a :meth:`write`).

    Parameters
    ----------
    policy : Policy
        The kernel's policy (validated by the proxy); host paths are dropped
        (:func:`node_policy`).
    kernel_id : str
        Put on the sandbox's name, as locally (``sandbox-kernel gc`` on the node
        finds an orphan by it).
    local_options : dict
        Traits of :class:`~sandbox_kernel.backends.local.LocalBackend` (``runtime``,
        ``runsc_path``, ``gvisor_platform``); :data:`FIXED_LOCAL_OPTIONS` win.
    """

    def __init__(self, policy: Policy, kernel_id: str, local_options: dict[str, Any]):
        from ..local import LocalBackend

        logging.basicConfig(level=logging.INFO)
        self._backend = LocalBackend(node_policy(policy), kernel_id, log=logging.getLogger("sandbox_kernel.ray.owner"),
                                     **{**local_options, **FIXED_LOCAL_OPTIONS})
        self._pending = b""
        self._read_lock = asyncio.Lock()

    async def start(self) -> dict[str, Any]:
        """Make the sandbox and start the agent in it; called once, by the proxy's
        :meth:`~.backend.RayBackend.start` right after the actor was placed.

        Returns
        -------
        dict
            :meth:`where` (what the proxy's ``describe`` reports).

        Raises
        ------
        SandboxStartError
            As :meth:`LocalBackend.start` (``AdmissionRefused`` when the node's own
            admission refuses it).
        """
        await self._backend.start()
        return self.where()

    def where(self) -> dict[str, Any]:
        """Where the sandbox runs and what it is: ``node_id``, ``node_ip``, ``node_host`` (the
        node's host name: a KubeRay pod's name), ``worker_pid``, ``runtime``, ``boundary``,
        ``container_id`` and, under gVisor, ``gvisor``."""
        import ray

        ctx = ray.get_runtime_context()
        local = self._backend.describe()
        keep = ("runtime", "boundary", "container_id", "gvisor")
        return {"node_id": ctx.get_node_id(), "node_ip": ray.util.get_node_ip_address(),
                "node_host": socket.gethostname(), "worker_pid": os.getpid(),
                **{k: local[k] for k in keep if k in local}}

    async def read(self, max_bytes: int) -> bytes:
        """The next chunk of the agent's stdout, at most ``max_bytes`` (capped to
        :data:`MAX_READ_BYTES`); waits until there is one.  ``b""``: the stream ended.

        Called in a loop by the proxy's :meth:`~.backend.RayBackend.read`, one call at a
        time; calls are served in turn (a lock), so no chunk is split between two.
        """
        max_bytes = max(1, min(int(max_bytes), MAX_READ_BYTES))
        async with self._read_lock:
            if not self._pending:
                self._pending = await self._backend.read()  # at most 1 MiB: the pipe keeps the rest
            data, self._pending = self._pending[:max_bytes], self._pending[max_bytes:]
            return data

    async def write(self, data: bytes) -> None:
        """Send whole frames to the agent's stdin; called by the proxy's
        :meth:`~.backend.RayBackend.write`, one call at a time.

        Raises
        ------
        SandboxDied
            The sandbox is gone.
        """
        await self._backend.write(data)

    async def exit_info(self) -> tuple[str, int | None]:
        """``(cause, returncode)`` of the sandbox's end (:meth:`LocalBackend.exit_info`)."""
        info = await self._backend.exit_info()
        return info.cause, info.returncode

    def explain_interpreter_death(self, cause: str) -> str:
        """The agent's report of an interpreter death with the limit it hit, if any
        (:meth:`LocalBackend.explain_interpreter_death`)."""
        return self._backend.explain_interpreter_death(cause)

    async def kill(self) -> None:
        """Destroy the sandbox (:meth:`LocalBackend.kill`); called by the proxy before it
        kills this actor.  Idempotent."""
        await self._backend.kill()
