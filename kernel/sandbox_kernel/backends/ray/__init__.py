"""The Ray backend: sandboxes on the nodes of a Ray cluster (issue 31).

:mod:`.backend` is the proxy's side (``RayBackend``, the entry point
``sandbox_kernel.backends.ray:RayBackend``), :mod:`.owner` the node's (the
actor that owns one local sandbox), :mod:`.cluster` connecting and placement.
``RayBackend`` is imported on first use; no module here imports Ray at import time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .backend import RayBackend

__all__ = ["RayBackend"]


def __getattr__(name: str) -> Any:
    """``RayBackend`` from :mod:`.backend`, on first use."""
    if name == "RayBackend":
        from . import backend

        return backend.RayBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
