"""``usage_request`` answered with the sandbox's resources, never the host's.

JupyterLab's resource panel (jupyter-resource-usage) sends ``usage_request`` on the
control channel every few seconds.  ipykernel's own handler, which the proxy would
inherit, answers with the host: its name, CPU count and memory, and the proxy's own
process.  The proxy answers instead with what the sandbox is allowed and what it uses:

* ``hostname``: the sandbox's (``sandbox``);
* ``cpu_count``: the policy's ``cpu_cores``, rounded up;
* ``kernel_cpu``: percent of one CPU the sandbox's processes used since the previous
  request (as psutil's ``cpu_percent``: 0.0 on the first);
* ``kernel_memory``: bytes the sandbox holds now;
* ``host_cpu_percent``: ``kernel_cpu`` over the sandbox's ``cpu_cores`` (what "the
  machine" is from inside);
* ``host_virtual_memory``: ``total`` = the sandbox's memory limit, ``used``,
  ``available``, ``free``, ``percent`` against it;
* ``sandbox``: the same for an agent, with units in the names and ``measured``
  (False where the backend cannot read its sandbox's use: then only the limits are
  given, and the use fields are left out rather than filled with the host's).

Each cell's ``execute_reply`` carries what the cell cost in its metadata,
``sandbox_usage`` (:func:`cell_usage`): the CPU seconds the sandbox used while it ran,
the most memory the sandbox held meanwhile and what it holds at the end, beside the
limits.  Figures of the sandbox, not of the cell alone: a background thread's work, or
a subshell's cell running at the same time, counts too.

The figures come from :meth:`.backends.base.SandboxBackend.usage`, read by
:class:`SandboxUsage`, which also answers ``usage_request`` (it reaches the kernel
through :class:`~sandbox_kernel.kernel_face.KernelFace`).
"""

from __future__ import annotations

import logging
import math
import time
from typing import TYPE_CHECKING, Any

from .backends.base import Usage
from .policy import Policy

if TYPE_CHECKING:
    from .kernel_face import KernelFace

MIB = 1 << 20

log = logging.getLogger("sandbox_kernel")


class UsageReporter:
    """Builds ``usage_reply`` contents; keeps the previous CPU reading between requests."""

    def __init__(self) -> None:
        self._last: tuple[float, float] | None = None  # (monotonic s, cpu s)

    def reply(self, policy: Policy, usage: Usage | None) -> dict[str, Any]:
        """The ``usage_reply`` content for ``policy``'s sandbox using ``usage`` (None: not
        measurable, or no sandbox running now)."""
        limit = policy.memory_mib * MIB
        cores = max(1, math.ceil(policy.cpu_cores))
        sandbox: dict[str, Any] = {"memory_limit_bytes": limit, "cpu_cores": policy.cpu_cores,
                                   "measured": usage is not None}
        content: dict[str, Any] = {"hostname": "sandbox", "cpu_count": cores}
        if usage is None:
            self._last = None
            content["host_virtual_memory"] = {"total": limit}
            content["sandbox"] = sandbox
            return content
        now = time.monotonic()
        cpu_percent = 0.0
        if self._last is not None and now > self._last[0] and usage.cpu_s >= self._last[1]:
            cpu_percent = round(100.0 * (usage.cpu_s - self._last[1]) / (now - self._last[0]), 1)
        self._last = (now, usage.cpu_s)
        used = min(usage.memory_bytes, limit)
        content.update({
            "kernel_cpu": cpu_percent,
            "kernel_memory": usage.memory_bytes,
            "host_cpu_percent": round(cpu_percent / policy.cpu_cores, 1) if policy.cpu_cores > 0 else cpu_percent,
            "host_virtual_memory": {"total": limit, "used": used, "available": limit - used, "free": limit - used,
                                    "percent": round(100.0 * used / limit, 1) if limit else 0.0},
        })
        sandbox.update({"memory_used_bytes": usage.memory_bytes, "cpu_percent": cpu_percent,
                        "cpu_seconds": round(usage.cpu_s, 3), "source": usage.source})
        content["sandbox"] = sandbox
        return content


def cell_usage(policy: Policy, before: Usage | None, after: Usage | None, wall_s: float) -> dict[str, Any]:
    """``execute_reply`` metadata ``sandbox_usage``: what the sandbox used while a cell ran.

    Parameters
    ----------
    policy : Policy
        The kernel's policy (its limits are given beside the figures).
    before, after : Usage or None
        :meth:`.backends.base.SandboxBackend.usage` at the cell's start (asked with
        ``reset_peak``) and end; None where not measurable.
    wall_s : float
        Seconds from the request's relay to its reply.

    Returns
    -------
    dict
        ``measured`` (bool), ``wall_s``, ``memory_limit_bytes``, ``cpu_cores``; when measured
        also ``cpu_s`` (CPU seconds of the sandbox's processes during the cell),
        ``cpu_percent`` (of one CPU), ``memory_bytes`` (held at the end) and
        ``memory_peak_bytes`` (the most held during the cell, where the backend reads it).
    """
    out: dict[str, Any] = {"measured": before is not None and after is not None, "wall_s": round(wall_s, 3),
                           "memory_limit_bytes": policy.memory_mib * MIB, "cpu_cores": policy.cpu_cores}
    if before is None or after is None:
        return out
    cpu = max(0.0, after.cpu_s - before.cpu_s)
    out.update({"cpu_s": round(cpu, 3), "cpu_percent": round(100.0 * cpu / wall_s, 1) if wall_s > 0 else 0.0,
                "memory_bytes": after.memory_bytes})
    if after.memory_peak_bytes is not None:
        out["memory_peak_bytes"] = max(after.memory_peak_bytes, after.memory_bytes)
    return out


class SandboxUsage:
    """The sandbox's use as the kernel reads it, and its ``usage_request`` handler.

    Parameters
    ----------
    kernel : KernelFace
        The proxy kernel: its backend (read at each call: a kernel with a bad
        configuration has none), its policy, its replies.
    """

    def __init__(self, kernel: KernelFace):
        self.kernel = kernel
        self._reporter = UsageReporter()

    def read(self, reset_peak: bool = False) -> Usage | None:
        """The backend's :meth:`~.backends.base.SandboxBackend.usage` now; None where it is
        not measurable, with no backend, or if reading failed (logged: a figure must never
        cost the user a cell)."""
        sandbox = self.kernel.sandbox
        try:
            return sandbox.usage(reset_peak) if sandbox is not None else None
        except Exception:  # a figure must never cost the user a cell
            log.exception("reading the sandbox's usage failed")
            return None

    async def request(self, stream: Any, ident: Any, parent: dict[str, Any]) -> None:
        """Handler of ``usage_request`` (jupyter-resource-usage): the sandbox's limits and
        use; never wakes or starts a sandbox.

        Called by ipykernel's control dispatch (``control_handlers``), on the control thread.
        """
        backend = self.kernel.sandbox
        content = self._reporter.reply(backend.policy if backend is not None else self.kernel.policy, self.read())
        self.kernel.send_reply(stream, "usage_reply", content, parent, ident)

