"""The sandbox policy: one frozen dataclass, secure defaults, units in the names.

The operator's policy comes from traitlets configuration (kernelspec argv,
``jupyter_config.py``); a notebook or an agent may only *tighten* it
(:meth:`Policy.tighten`), as gVisor's flag-override allowlist does.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from dataclasses import dataclass, field
from typing import Any, Mapping

from .errors import PolicyError

RUNTIMES = ("auto", "gvisor", "bubblewrap")
NETWORKS = ("none",)
OUTPUT_POLICIES = ("sanitize", "trust")

#: Environment variable names that may never be set inside a sandbox, whatever
#: the operator configures (the frontend's signing key and cloud credentials).
FORBIDDEN_ENV = frozenset(
    {"JPY_SESSION_NAME", "E2B_API_KEY", "MODAL_TOKEN_ID", "MODAL_TOKEN_SECRET", "JUPYTER_TOKEN"}
)

#: Fields where a smaller number is tighter (0 means "no limit" only where noted).
_TIGHTER_IS_SMALLER = (
    "memory_mib",
    "cpu_cores",
    "pids_max",
    "scratch_mib",
    "lifetime_s",
    "max_output_bytes_per_cell",
    "max_output_msgs_per_s",
    "pause_after_s",
    "checkpoint_after_s",
    "stop_after_s",
)
#: Fields where 0 means "off"; tightening may turn them on (any positive value).
_ZERO_IS_OFF = ("cell_timeout_s", "pause_after_s", "checkpoint_after_s", "stop_after_s")


def _default_python() -> str:
    return sys.executable


@dataclass(frozen=True)
class Policy:
    """What a sandbox may do and use.

    Attributes
    ----------
    runtime : {"auto", "gvisor", "bubblewrap"}
        Local runtime.  ``auto`` picks gVisor (``runsc``) when it works here,
        else bubblewrap, and logs which boundary is in force.
    python : str
        Host path of the Python interpreter run inside the sandbox.  Its
        environment (``sys.prefix`` and ``sys.base_prefix``) is bind-mounted
        read-only at the same paths, so packages installed beside the kernel
        are importable inside.  Default: the interpreter running the proxy.
    ro_paths : tuple of str
        Extra host directories mounted read-only at the same path.
    memory_mib : int
        Memory limit of the whole sandbox, MiB.
    cpu_cores : float
        CPU quota, in cores (``1.5`` = 150 % of one core).
    pids_max : int
        Maximum number of processes and threads of the sandboxed processes.
    scratch_mib : int
        Size of the writable scratch space (working directory and ``/tmp``), MiB.
    cell_timeout_s : float
        Wall time of one ``execute_request`` before it is interrupted, seconds;
        ``0`` means no per-cell limit.
    interrupt_grace_s : float
        After a timeout interrupt, seconds to wait for the cell to stop before
        the interpreter is restarted.
    lifetime_s : float
        Longest life of one sandbox, seconds; also the dead-man's switch
        granted to cloud backends, refreshed while the proxy lives.
    network : {"none"}
        Egress.  Only ``none`` exists today: no interface but loopback.
    pause_after_s, checkpoint_after_s, stop_after_s : float
        Idle lifecycle, seconds since the last request; ``0`` disables a level.
    max_output_bytes_per_cell : int
        Bytes of output one cell may send to the frontend before the rest is
        dropped with a notice.
    max_output_msgs_per_s : int
        IOPub messages per second relayed before further ones are dropped.
    max_frame_bytes : int
        Largest single frame accepted from the sandbox, bytes.
    output_policy : {"sanitize", "trust"}
        ``sanitize`` drops JavaScript outputs and strips scripts from HTML;
        ``trust`` relays them as produced (see ``docs/security.md``).
    env : tuple of (str, str)
        Environment of the sandboxed interpreter, beyond the fixed base
        (``HOME``, ``PATH``, ``LANG``...).  Host variables are never inherited.
    """

    runtime: str = "auto"
    python: str = field(default_factory=_default_python)
    ro_paths: tuple[str, ...] = ()
    memory_mib: int = 4096
    cpu_cores: float = 2.0
    pids_max: int = 1024
    scratch_mib: int = 1024
    cell_timeout_s: float = 0.0
    interrupt_grace_s: float = 5.0
    lifetime_s: float = 24 * 3600.0
    network: str = "none"
    pause_after_s: float = 600.0
    checkpoint_after_s: float = 3600.0
    stop_after_s: float = 0.0
    max_output_bytes_per_cell: int = 64 * 1024 * 1024
    max_output_msgs_per_s: int = 2000
    max_frame_bytes: int = 64 * 1024 * 1024
    output_policy: str = "sanitize"
    env: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Check every field.

        Raises
        ------
        PolicyError
            Naming the first bad field and its value.
        """
        if self.runtime not in RUNTIMES:
            raise PolicyError("runtime", self.runtime, f"must be one of {RUNTIMES}")
        if self.network not in NETWORKS:
            raise PolicyError("network", self.network, f"must be one of {NETWORKS}")
        if self.output_policy not in OUTPUT_POLICIES:
            raise PolicyError("output_policy", self.output_policy, f"must be one of {OUTPUT_POLICIES}")
        if not self.python.startswith("/"):
            raise PolicyError("python", self.python, "must be an absolute path")
        for p in self.ro_paths:
            if not p.startswith("/") or p.rstrip("/") in ("", "/proc", "/sys", "/dev"):
                raise PolicyError("ro_paths", p, "must be absolute and not /, /proc, /sys or /dev")
        for name in ("memory_mib", "pids_max", "scratch_mib", "max_output_bytes_per_cell",
                     "max_output_msgs_per_s", "max_frame_bytes"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise PolicyError(name, v, "must be a positive integer")
        if self.memory_mib < 128:
            raise PolicyError("memory_mib", self.memory_mib, "must be at least 128 MiB for a Python kernel")
        if self.pids_max < 64:
            raise PolicyError("pids_max", self.pids_max, "must be at least 64 (the runtime's own threads count)")
        for name in ("cpu_cores", "lifetime_s", "interrupt_grace_s"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise PolicyError(name, v, "must be a positive finite number")
        for name in _ZERO_IS_OFF:
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise PolicyError(name, v, "must be >= 0 (0 disables it)")
        for k, v in self.env:
            if not k or "=" in k or "\0" in k or "\0" in v:
                raise PolicyError("env", k, "names must be non-empty, without '=' or NUL")
            if k in FORBIDDEN_ENV:
                raise PolicyError("env", k, "credentials and signing keys never enter a sandbox")

    @property
    def env_dict(self) -> dict[str, str]:
        """:attr:`env` as a dict."""
        return dict(self.env)

    def tighten(self, overrides: Mapping[str, Any]) -> "Policy":
        """Return a copy with ``overrides`` applied, allowing only tighter values.

        Parameters
        ----------
        overrides : mapping
            Field name to new value, e.g. from notebook metadata or an agent.

        Returns
        -------
        Policy

        Raises
        ------
        PolicyError
            If a field is unknown, may not be overridden, or would be loosened.
        """
        changes: dict[str, Any] = {}
        for name, value in overrides.items():
            if name in _ZERO_IS_OFF:
                cur = getattr(self, name)
                if value == 0 and cur != 0:
                    raise PolicyError(name, value, f"cannot switch off the operator's {name}={cur}")
                if cur and value > cur:
                    raise PolicyError(name, value, f"may only tighten (operator allows at most {cur})")
            elif name in _TIGHTER_IS_SMALLER:
                cur = getattr(self, name)
                if value > cur:
                    raise PolicyError(name, value, f"may only tighten (operator allows at most {cur})")
            elif name == "output_policy":
                if value == "trust" and self.output_policy != "trust":
                    raise PolicyError(name, value, "only the operator can trust sandbox output")
            else:
                raise PolicyError(name, value, "cannot be overridden by a notebook or agent")
            changes[name] = value
        return dataclasses.replace(self, **changes)
