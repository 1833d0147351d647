"""What the proxy's components use of the proxy kernel: one narrow face.

The proxy kernel (:class:`~sandbox_kernel.proxy.SandboxKernel`, an ipykernel
``Kernel`` subclass) hands the parts that answer the frontend beside it (the
cells' bookkeeping in :mod:`.cells`, the subshell handlers in :mod:`.subshells`,
the debugger's in :mod:`.features`, the resource panel's in :mod:`.usage`, the
file comm in :mod:`.files_comm`, the IPython setup's runner in
:mod:`.interpreter_config`) itself, seen as a :class:`KernelFace`: the few
verbs they need (send to the frontend under the right parent, wait for the
sandbox, relay a request, hop to the main loop) and the few parts they read (the
policy, the relay, the backend).  None of them reaches ipykernel's or the
proxy's private members, and none imports :mod:`.proxy`, not even for a type
(``tests/test_imports.py``).

Every message a component sends goes through the kernel's ``Session``, so it is
signed with the frontend's key; the sandbox never holds that key.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from .backends.base import SandboxBackend
    from .policy import Policy
    from .relay import Relay
    from .workspace_copy import WorkspaceCopy

__all__ = ["KernelFace"]


class KernelFace(Protocol):
    """The proxy kernel as its components see it.

    A ``parent`` is a frontend's request as ipykernel hands it to a handler (a
    message dict: ``header``, ``content``...); what is sent for it carries that
    request's header as its parent header (messaging spec, "Parent header").
    A ``stream`` and an ``ident`` are the ones the handler was called with (the
    shell or control stream, and the request's ZMQ routing identities).
    """

    @property
    def policy(self) -> Policy:
        """The kernel's policy: limits, caps, timeouts (``cell_timeout_s``...)."""

    @property
    def sandbox(self) -> SandboxBackend | None:
        """The backend; None when the configuration is bad (then no sandbox starts)."""

    @property
    def relay(self) -> Relay | None:
        """The link to the sandbox; None before the kernel started it (or with a bad
        configuration)."""

    @property
    def workspace_copy(self) -> WorkspaceCopy | None:
        """The workspace copied in and out (E2B, Modal); None if mounted or none."""

    @property
    def config_error(self) -> str | None:
        """Why the configuration cannot work (a bad option), told instead of an answer;
        None when it is sound."""

    def publish(self, msg_type: str, content: dict[str, Any], parent: dict[str, Any], *,
                topic: str | None = None, metadata: dict[str, Any] | None = None,
                buffers: list[Any] | None = None) -> None:
        """Sign and send one IOPub message.

        Parameters
        ----------
        msg_type : str
            The IOPub message type (``stream``, ``display_data``, ``comm_msg``...).
        content : dict
        parent : dict
            The request it answers; ``{}`` for none (a ``starting`` status).
        topic : str, optional
            The IOPub topic's last part; default ``msg_type``.
        metadata : dict, optional
        buffers : list of bytes-like, optional
            Binary buffers (comm messages, widgets).
        """

    def send_stderr(self, parent: dict[str, Any], text: str) -> None:
        """Show ``text`` (a notice, a hint) as the request's ``stderr`` stream, ending
        with one newline."""

    def forget_notice(self, text: str) -> None:
        """Not show ``text``, a lifecycle notice kept for the next cell, after all: the cell
        that caused it said so itself (``%rewind``)."""

    def send_reply(self, stream: Any, msg_type: str, content: dict[str, Any], parent: dict[str, Any],
                   ident: Any, *, metadata: dict[str, Any] | None = None) -> None:
        """Sign and send a reply on ``stream`` (shell or control), routed to ``ident``."""

    def new_message(self, msg_type: str, content: dict[str, Any],
                    parent: dict[str, Any] | None = None) -> dict[str, Any]:
        """A new message of the kernel's own (``Session.msg``: a fresh ``msg_id``), for
        a request the proxy makes to the sandbox's interpreter itself; ``parent`` is a
        header."""

    async def ready(self) -> str | None:
        """Wait until the sandbox is running (starting or waking it).

        Returns
        -------
        str or None
            A notice for the user (state was lost...), if any.

        Raises
        ------
        SandboxKernelError
            If no sandbox can be started, the configuration is bad, or the kernel is
            shutting down (``KernelShuttingDown``).
        """

    async def on_main_loop(self, coro: Awaitable[Any]) -> Any:
        """Await ``coro`` on the kernel's main loop (where the relay lives) from whichever
        loop calls: control requests run on ipykernel's control thread."""

    async def relayed_reply(self, ident: Any, parent: dict[str, Any],
                            channel: str) -> tuple[str, dict[str, Any], dict[str, Any]]:
        """Relay the request ``parent`` to the inner kernel's ``channel`` (``"shell"`` or
        ``"control"``) and wait for its reply, as every relayed request is (notices,
        caps, timeout, firewall); run on the main loop.

        Returns
        -------
        tuple of (str, dict, dict)
            ``(reply_type, content, metadata)``; an error reply when the sandbox could
            not answer (never raises for that).
        """

    def inner_features(self) -> list[str]:
        """The inner kernel's ``supported_features`` this proxy carries
        (:data:`.features.RELAYED_FEATURES`); empty until its interpreter answered
        ``kernel_info``."""

    def own_subshells(self, request: dict[str, Any]) -> dict[str, Any] | None:
        """Create, delete or list the proxy's own subshells (ipykernel's subshell manager).

        Parameters
        ----------
        request : dict
            ipykernel's own form: ``{"type": "create"}``, ``{"type": "delete",
            "subshell_id": ...}`` or ``{"type": "list"}``.

        Returns
        -------
        dict or None
            The reply's content; None when the proxy's ipykernel has no subshells.
        """
