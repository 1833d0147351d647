"""The optional features the proxy carries when the sandbox's ipykernel has them.

A kernel lists optional protocol features in ``kernel_info_reply``'s
``supported_features`` (messaging spec, "Kernel info").  The proxy lists only
those of the sandbox's ipykernel that it relays (:data:`RELAYED_FEATURES`,
:func:`carried`): the debugger, whose ``debug_request``/``debug_reply``/
``debug_event`` (spec, "Debug request" and "Debug event") go through to the
sandbox's own ipykernel (:class:`Debugger`: debugpy runs inside the sandbox,
never in the proxy), and kernel subshells (JEP 91), made in both the proxy and
the sandbox (:mod:`.subshells`).  A request for a feature not listed is
answered with why (:func:`unsupported`), rather than left to ipykernel's base
class, which logs an exception and stays silent.

The handlers reach the kernel through :class:`~sandbox_kernel.kernel_face.KernelFace`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .kernel_face import KernelFace

__all__ = ["RELAYED_FEATURES", "Debugger", "carried", "unsupported"]

#: Features of the inner kernel's ``supported_features`` the relay carries.
RELAYED_FEATURES = ("kernel subshells", "debugger")


def carried(inner_kernel_info: dict[str, Any] | None, own_subshells: bool) -> list[str]:
    """The ``supported_features`` the proxy lists.

    Parameters
    ----------
    inner_kernel_info : dict or None
        The sandbox interpreter's ``kernel_info_reply`` content; None before it answered.
    own_subshells : bool
        Whether the proxy's own ipykernel has subshells (both halves are needed).

    Returns
    -------
    list of str
        Those of :data:`RELAYED_FEATURES` the inner kernel lists, in that order; empty
        until it has answered.
    """
    features = (inner_kernel_info or {}).get("supported_features")
    own = {"kernel subshells": own_subshells}
    return [f for f in RELAYED_FEATURES if isinstance(features, list) and f in features and own.get(f, True)]


def unsupported(kernel: KernelFace, stream: Any, ident: Any, parent: dict[str, Any]) -> None:
    """Reply to ``parent``, a request for a feature this kernel does not list: an
    unsuccessful Debug Adapter Protocol response for a ``debug_request``, else an error
    reply (``ename`` ``NotSupported``) saying why."""
    msg_type = parent["header"]["msg_type"]
    why = (f"{msg_type} is not supported here: kernel_info_reply's supported_features does not "
           "list it (the sandbox's ipykernel lacks it: the debugger needs debugpy there, subshells "
           "ipykernel 7)")
    if msg_type == "debug_request":  # a Debug Adapter Protocol response
        req = parent.get("content") or {}
        content: dict[str, Any] = {"type": "response", "request_seq": req.get("seq", 0),
                                   "success": False, "command": req.get("command", ""),
                                   "message": why}
    else:
        content = {"status": "error", "ename": "NotSupported", "evalue": why, "traceback": []}
    kernel.send_reply(stream, msg_type.replace("_request", "_reply"), content, parent, ident)


class Debugger:
    """``debug_request`` on the control channel, relayed to the sandbox's ipykernel.

    Parameters
    ----------
    kernel : KernelFace
        The proxy kernel: relays the request and sends the reply.
    """

    def __init__(self, kernel: KernelFace):
        self.kernel = kernel

    async def request(self, stream: Any, ident: Any, parent: dict[str, Any]) -> None:
        """Handler of ``debug_request`` (a Debug Adapter Protocol request, spec "Debug
        request"): relayed to the inner kernel's control channel when its ipykernel has a
        debugger (debugpy inside the sandbox), else an unsuccessful DAP response.

        Called by ipykernel's control dispatch (``control_handlers``), on the control thread.
        """
        k = self.kernel
        if "debugger" not in k.inner_features():
            unsupported(k, stream, ident, parent)
            return
        reply_type, content, metadata = await k.on_main_loop(k.relayed_reply(ident, parent, "control"))
        k.send_reply(stream, reply_type, content, parent, ident, metadata=metadata)
