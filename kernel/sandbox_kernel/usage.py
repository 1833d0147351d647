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

The figures come from :meth:`.backends.base.SandboxBackend.usage`.
"""

from __future__ import annotations

import math
import time
from typing import Any

from .backends.base import Usage
from .policy import Policy

MIB = 1 << 20


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
