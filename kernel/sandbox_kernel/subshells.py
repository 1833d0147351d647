"""Kernel subshells (JEP 91, ipykernel 7) through the relay.

A frontend creates a subshell on the control channel and then sends shell
requests whose header carries its ``subshell_id``; each subshell runs its
requests in order, concurrently with the main shell and with other subshells.
Through the proxy that takes two subshells per id: one in the proxy (ipykernel's
own, so the proxy's dispatch of that subshell's requests runs beside the main
shell's instead of queueing behind a running cell) and one in the sandbox's
ipykernel (so the cells really run concurrently there).  The frontend is given
the proxy's id; :class:`SubshellMap` translates it to the inner one as each
request is relayed.

The inner subshells end with the interpreter (a restart, a replaced sandbox);
the proxy's live on.  Each inner id is stamped with the interpreter's
generation: a request for a subshell whose inner half belongs to an earlier
interpreter first creates a new one there, so a subshell id a frontend holds
stays usable across restarts.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass


@dataclass
class _Inner:
    subshell_id: str
    generation: int


class SubshellMap:
    """Proxy subshell id -> the sandbox ipykernel's, per interpreter generation.

    Thread-safe: the control thread creates and deletes, the main loop translates.

    >>> m = SubshellMap()
    >>> m.add("p1", "i1"); m.inner("p1")
    'i1'
    >>> m.new_interpreter(); m.inner("p1") is None and m.known("p1")
    True
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._map: dict[str, _Inner] = {}
        self.generation = 0

    def add(self, proxy_id: str, inner_id: str) -> None:
        """Record a subshell created in both places (or re-created inside)."""
        with self._lock:
            self._map[proxy_id] = _Inner(inner_id, self.generation)

    def remove(self, proxy_id: str) -> str | None:
        """Forget ``proxy_id``; its inner id if it belongs to the current interpreter."""
        with self._lock:
            inner = self._map.pop(proxy_id, None)
        return inner.subshell_id if inner is not None and inner.generation == self.generation else None

    def known(self, proxy_id: str) -> bool:
        with self._lock:
            return proxy_id in self._map

    def inner(self, proxy_id: str) -> str | None:
        """The inner id of ``proxy_id`` in the current interpreter; None if it has none yet
        (created before a restart) or is unknown."""
        with self._lock:
            inner = self._map.get(proxy_id)
        return inner.subshell_id if inner is not None and inner.generation == self.generation else None

    def new_interpreter(self) -> None:
        """A fresh interpreter started: every inner subshell is gone."""
        with self._lock:
            self.generation += 1
