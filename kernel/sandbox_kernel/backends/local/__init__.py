"""The local backend: gVisor (``runsc``, default) or bubblewrap on this machine.

One package for everything local: the backend (:mod:`.backend`), the runtimes
(:mod:`.gvisor`, :mod:`.bwrap`), what a sandbox sees (:mod:`.layout`, and of
its CPUs and memory :mod:`.resource_view`), the completion cache it starts with
(:mod:`.jedi_cache`), its limits (:mod:`.cgroups`, :mod:`.seccomp`), its dead-man's switch
(:mod:`.watchdog`), ``sandbox-kernel gc`` (:mod:`.reaper`) and the warm pool
(:mod:`.pool`).

``LocalBackend`` (the entry point ``sandbox_kernel.backends.local:LocalBackend``)
is imported on first use, so that the watchdog, which runs as
``python -m sandbox_kernel.backends.local.watchdog`` beside every sandbox,
loads none of it while it waits.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .backend import LocalBackend, resolve_runtime

__all__ = ["LocalBackend", "resolve_runtime"]


def __getattr__(name: str) -> Any:
    """``LocalBackend`` and ``resolve_runtime`` from :mod:`.backend`, on first use."""
    if name in __all__:
        from . import backend

        return getattr(backend, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
