"""Sandbox backends, found through the ``sandbox_kernel.backends`` entry-point group.

A fourth backend (Kubernetes, Daytona...) is a new module and one line in
``pyproject.toml``; importing this package imports no cloud SDK.

Importing this package is cheap on purpose: the local watchdog
(``python -m sandbox_kernel.backends.local.watchdog``, one per sandbox) imports
it while it waits, so the contract (:mod:`.base`) and ``importlib.metadata`` are
loaded on first use only.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from ..errors import BackendNotFound

if TYPE_CHECKING:
    from .base import Capabilities, ExitInfo, SandboxBackend

GROUP = "sandbox_kernel.backends"

__all__ = ["Capabilities", "ExitInfo", "SandboxBackend", "available_backends", "load_backend"]


def __getattr__(name: str) -> Any:
    """The contract's names (:mod:`.base`), imported on first use."""
    if name in ("Capabilities", "ExitInfo", "SandboxBackend"):
        from . import base

        return getattr(base, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def available_backends() -> list[str]:
    """Names registered in the entry-point group, sorted."""
    from importlib.metadata import entry_points

    return sorted(ep.name for ep in entry_points(group=GROUP))


@functools.cache
def load_backend(name: str) -> type[SandboxBackend]:
    """Import and return the backend class registered as ``name`` (looked up once per
    process: reading every installed distribution's entry points takes ~50 ms).

    Raises
    ------
    BackendNotFound
        If no entry point has that name, or its optional extra is missing.
    """
    from importlib.metadata import entry_points

    eps = [ep for ep in entry_points(group=GROUP) if ep.name == name]
    if not eps:
        raise BackendNotFound(
            f"no sandbox backend named {name!r}; available: {', '.join(available_backends())}"
        )
    try:
        return eps[0].load()
    except ImportError as err:
        raise BackendNotFound(
            f"backend {name!r} needs its extra: pip install 'sandbox-kernel[{name}]' ({err})"
        ) from err
