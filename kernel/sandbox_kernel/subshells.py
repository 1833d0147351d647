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

:class:`Subshells` answers the control channel's subshell requests and gives each
relayed request its inner header; it reaches the kernel through
:class:`~sandbox_kernel.kernel_face.KernelFace`.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .features import unsupported

if TYPE_CHECKING:
    from .kernel_face import KernelFace


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


class Subshells:
    """The proxy's subshell requests: ``create_subshell_request``,
    ``delete_subshell_request`` and ``list_subshell_request`` (JEP 91, on control), and
    the inner subshell of each relayed request.

    Parameters
    ----------
    kernel : KernelFace
        The proxy kernel: its own subshells, the relay to the sandbox's, the replies.

    Attributes
    ----------
    map : SubshellMap
        Proxy id -> inner id, per interpreter generation.
    """

    def __init__(self, kernel: KernelFace):
        self.kernel = kernel
        self.map = SubshellMap()

    async def create_request(self, stream: Any, ident: Any, parent: dict[str, Any]) -> None:
        """``create_subshell_request`` on control: a subshell in the sandbox's ipykernel,
        then the proxy's own (ipykernel's), mapped; the frontend gets the proxy's id."""
        k = self.kernel
        if "kernel subshells" not in k.inner_features():
            unsupported(k, stream, ident, parent)
            return
        inner_id = await k.on_main_loop(self._create_inner(parent))
        if inner_id is None:
            content: dict[str, Any] = {"status": "error", "ename": "SubshellError", "traceback": [],
                                       "evalue": "the sandbox's interpreter could not create a subshell"}
        else:
            content = k.own_subshells({"type": "create"}) or {}
            if content.get("status") == "ok":
                self.map.add(content["subshell_id"], inner_id)
        k.send_reply(stream, "create_subshell_reply", content, parent, ident)

    async def _create_inner(self, parent: dict[str, Any]) -> str | None:
        """A new subshell in the sandbox's ipykernel (on the main loop); its id, or None."""
        k = self.kernel
        request = k.new_message("create_subshell_request", {}, parent=parent.get("header") or {})
        _, content, _ = await k.relayed_reply([], request, "control")
        sid = content.get("subshell_id") if content.get("status") == "ok" else None
        return sid if isinstance(sid, str) else None

    async def delete_request(self, stream: Any, ident: Any, parent: dict[str, Any]) -> None:
        """``delete_subshell_request`` on control: the proxy's subshell, then the sandbox's
        (if it belongs to the current interpreter)."""
        k = self.kernel
        proxy_id = str((parent.get("content") or {}).get("subshell_id", ""))
        content = k.own_subshells({"type": "delete", "subshell_id": proxy_id})
        if content is None:
            unsupported(k, stream, ident, parent)
            return
        inner_id = self.map.remove(proxy_id)
        if inner_id is not None:
            request = k.new_message("delete_subshell_request", {"subshell_id": inner_id})
            await k.on_main_loop(k.relayed_reply([], request, "control"))
        k.send_reply(stream, "delete_subshell_reply", content, parent, ident)

    async def list_request(self, stream: Any, ident: Any, parent: dict[str, Any]) -> None:
        """``list_subshell_request`` on control: the proxy's subshells (their ids are the
        ones the frontend holds)."""
        content = self.kernel.own_subshells({"type": "list"}) or {"status": "ok", "subshell_id": []}
        self.kernel.send_reply(stream, "list_subshell_reply", content, parent, ident)

    async def inner_header(self, parent: dict[str, Any]) -> dict[str, Any] | None:
        """The inner header fields of a request on a subshell: the sandbox's id for it,
        made anew there when the interpreter restarted since (:class:`SubshellMap`); None
        for a request on the main shell.  Run on the main loop."""
        proxy_id = parent["header"].get("subshell_id")
        if not proxy_id:
            return None
        inner_id = self.map.inner(proxy_id)
        if inner_id is None and self.map.known(proxy_id):
            inner_id = await self._create_inner(parent)
            if inner_id is not None:
                self.map.add(proxy_id, inner_id)
        return {"subshell_id": inner_id}
