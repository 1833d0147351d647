"""The proxy kernel in this process, over the scripted backend (the fast tier).

:class:`ProxyHarness` builds a real :class:`~sandbox_kernel.proxy.SandboxKernel`
(traits, policy, firewall, caps, timeouts, relay, lifecycle), swaps its
backend for a :class:`~fakes.backend.FakeBackend`, and records everything the
kernel would sign and send instead of touching ZMQ.  Requests go straight to
the kernel's handlers, as ipykernel's dispatcher would call them.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import zmq
from ipykernel.utils import _async_in_context
from jupyter_client.session import Session
from sandbox_kernel.proxy import SandboxKernel

from .backend import FakeBackend, jupyter_msg

SHELL = object()  # stands for ipykernel's shell stream


@dataclass
class Sent:
    """One message the kernel sent: where, what, and for which request."""

    where: str
    msg_type: str
    content: dict
    parent_msg_id: str | None


class ProxyHarness:
    """A started proxy kernel with a scripted sandbox.

    Parameters
    ----------
    fake : FakeBackend, optional
    **traits
        ``SandboxKernel`` options (``cell_timeout_s=0.2``...).
    """

    def __init__(self, fake: FakeBackend | None = None, **traits: Any):
        self.sent: list[Sent] = []
        session = Session(key=b"test-key")
        self.kernel = SandboxKernel(session=session, runtime="bubblewrap", **traits)
        self.fake = fake or FakeBackend(policy=self.kernel.policy)
        self.kernel.sandbox = self.fake
        self.kernel.iopub_socket = "iopub"
        session.send = self._record  # type: ignore[method-assign]
        self.kernel._abort_queues = lambda subshell_id=None: None  # type: ignore[method-assign]

    def _record(self, stream, msg_type, content=None, parent=None, ident=None, **kw):
        where = "iopub" if stream == "iopub" else "shell" if stream is SHELL else str(stream)
        pid = (parent or {}).get("header", {}).get("msg_id") if isinstance(parent, dict) else None
        self.sent.append(Sent(where, msg_type, content or {}, pid))

    async def start(self) -> None:
        self.kernel.start_sandbox()
        await self.kernel._start_task

    async def request(self, msg_type: str, content: dict) -> tuple[dict, list[Sent]]:
        """Send one shell request; return its reply content and the IOPub it caused."""
        parent = {**jupyter_msg(msg_type, content), "buffers": []}
        await self.kernel._relay_request(SHELL, [b"frontend"], parent)
        mine = [m for m in self.sent if m.parent_msg_id == parent["header"]["msg_id"]]
        reply = [m for m in mine if m.where == "shell"]
        assert len(reply) == 1, [m.msg_type for m in mine]
        return reply[0].content, [m for m in mine if m.where == "iopub"]

    async def execute(self, code: str, **kw: Any) -> tuple[dict, list[Sent]]:
        content = {"code": code, "silent": False, "store_history": True, "user_expressions": {},
                   "allow_stdin": False, "stop_on_error": True, **kw}
        return await self.request("execute_request", content)

    def shell_receiver(self) -> Callable[[dict], Awaitable[None]]:
        """A frontend's shell socket into ipykernel's own dispatch of the main shell
        (``shell_main`` in one persistent context, as ``Kernel.start`` installs it), rather
        than straight into a handler: what that dispatch publishes (``status``) is recorded.
        Returns ``send(msg)``, which ends when the message is handled."""
        # the stand-in stream, past the trait's type check: the relay then tells shell from
        # control (None here) as with real streams
        self.kernel._trait_values["shell_stream"] = SHELL
        self.kernel.log = logging.getLogger("sandbox_kernel")  # ipykernel's dispatch logs
        receive = _async_in_context(partial(self.kernel.shell_main, None))

        async def send(msg: dict) -> None:
            session = self.kernel.session
            await receive([zmq.Frame(f) for f in session.serialize(msg, ident=[b"frontend"])])

        return send

    async def stop(self) -> None:
        await self.kernel.do_shutdown(False)
        if self.kernel.lifecycle is not None:
            self.kernel.lifecycle.stop()


def stderr(iopub: list[Sent]) -> str:
    return "".join(m.content["text"] for m in iopub if m.msg_type == "stream" and m.content["name"] == "stderr")


def stdout(iopub: list[Sent]) -> str:
    return "".join(m.content["text"] for m in iopub if m.msg_type == "stream" and m.content["name"] == "stdout")
