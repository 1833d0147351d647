"""Sandbox backends, found through the ``sandbox_kernel.backends`` entry-point group.

A fourth backend (Kubernetes, Daytona...) is a new module and one line in
``pyproject.toml``; importing this package imports no cloud SDK.
"""

from __future__ import annotations

from importlib.metadata import entry_points

from ..errors import BackendNotFound
from .base import Capabilities, ExitInfo, SandboxBackend

GROUP = "sandbox_kernel.backends"

__all__ = ["Capabilities", "ExitInfo", "SandboxBackend", "available_backends", "load_backend"]


def available_backends() -> list[str]:
    """Names registered in the entry-point group, sorted."""
    return sorted(ep.name for ep in entry_points(group=GROUP))


def load_backend(name: str) -> type[SandboxBackend]:
    """Import and return the backend class registered as ``name``.

    Raises
    ------
    BackendNotFound
        If no entry point has that name, or its optional extra is missing.
    """
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
