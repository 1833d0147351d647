"""Every request's ``status`` under its own parent header, however requests overlap.

ipykernel publishes a shell request's ``busy`` and ``idle`` with the parent it
reads back from an ambient "current parent": a ``ContextVar`` that
:meth:`~ipykernel.kernelbase.Kernel.set_parent` writes, living in *one*
context that every message of a shell (the main one, each subshell) is
dispatched in (``ipykernel.utils._async_in_context``).  In a stock kernel the
handlers are short and a cell blocks its loop, so requests do not overlap.  In
the proxy every handler awaits a round trip to the sandbox, so they do:

* a comm message that arrives while a cell is relayed is dispatched beside it
  (ipykernel's ``shell_main``, for a cell that may wait on a widget's reply),
  with no ``busy``/``idle`` of its own, and when it ends ipykernel restores
  the parent it saw when it began.  The inner kernel, busy in the cell,
  handles the comm after it, often once the *next* cell runs, whose ``idle``
  then went out under the previous cell's parent (issue 33: 12 of 20 cells on bubblewrap, 15
  of 20 on gVisor, none on a stock ipykernel);
* the comm message itself got no ``status`` at all, where a stock kernel,
  busy in a cell, handles it after the cell with a ``busy``/``idle`` pair of
  its own (the frontend's only sign that a reply-less message was handled:
  messaging spec, "Kernel status").

:class:`OwnParentDispatch` dispatches each shell message in a context of its
own, so no request reads a parent another one wrote, and gives a comm
dispatched beside a running request its own ``busy``/``idle``.  Control
requests need nothing: ipykernel handles them one at a time
(``_control_lock``), each with its own parent from start to end.
"""

from __future__ import annotations

import asyncio
import contextvars
from typing import Any


class OwnParentDispatch:
    """Mixin for a :class:`ipykernel.kernelbase.Kernel` subclass whose handlers await
    (put it before ``Kernel`` in the bases): shell messages dispatched with their own
    parent, each, for every ``status`` they cause."""

    async def shell_main(self, subshell_id: str | None, msg: Any) -> None:
        """Dispatch one shell message (ipykernel's ``shell_main``) in a copy of the shell's
        context, so the parent it sets is its own and stays so.

        Called by ipykernel for each message of the main shell and of each subshell
        (``shell_main`` is the receiver it installs in ``Kernel.start`` and for each
        subshell), on that shell's thread.
        """
        base: Any = super()
        await asyncio.create_task(base.shell_main(subshell_id, msg), context=contextvars.copy_context())

    async def dispatch_shell(self, msg: Any, /, subshell_id: str | None = None, *,
                             concurrent: bool = False) -> None:
        """ipykernel's ``dispatch_shell``; a comm message it dispatches beside a running
        request (``concurrent``: it publishes no status then) gets ``busy`` and ``idle``
        with its own parent, the idle once its handler is done (the sandbox handled it).

        Called by ipykernel's ``shell_main`` (through :meth:`shell_main`).
        """
        base: Any = super()
        parent = self._own_parent(msg) if concurrent else None
        if parent is None:
            await base.dispatch_shell(msg, subshell_id=subshell_id, concurrent=concurrent)
            return
        kernel: Any = self
        kernel._publish_status("busy", "shell", parent=parent)
        try:
            await base.dispatch_shell(msg, subshell_id=subshell_id, concurrent=True)
        finally:
            kernel._publish_status("idle", "shell", parent=parent)

    def _own_parent(self, msg: Any) -> dict[str, Any] | None:
        """The parent a status of the serialized message ``msg`` carries: its header
        (as ``Session.send`` takes a parent); None if it cannot be read (ipykernel logs
        that when it dispatches it)."""
        session = getattr(self, "session", None)
        if session is None:
            return None
        try:
            _, frames = session.feed_identities(msg, copy=False)
            header = session.deserialize(frames, content=False, copy=False)["header"]
        except Exception:  # noqa: BLE001 - an invalid message: ipykernel says so and drops it
            return None
        return {"header": header} if isinstance(header, dict) and header else None
