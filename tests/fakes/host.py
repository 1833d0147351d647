"""The proxy's side of the relay (:class:`sandbox_kernel.relay.RelayHost`), recorded.

For tests that drive a :class:`~sandbox_kernel.relay.Relay` directly, over the
scripted backend or a real one: every IOPub message and lifecycle event is kept,
and :func:`run_cell` runs one ``execute_request`` to its reply.
"""

from __future__ import annotations

import asyncio
from typing import Any

from sandbox_kernel.relay import Relay

from .backend import jupyter_msg


class RecordingHost:
    """Keeps what the relay hands the proxy: IOPub frames and lifecycle events."""

    def __init__(self) -> None:
        #: ``(msg_type, pending msg_id or None)`` of every IOPub message, in order.
        self.iopub: list[tuple[str, str | None]] = []
        #: The IOPub frames themselves, by the request's msg_id.
        self.outputs: dict[str, list[Any]] = {}
        self.events: list[tuple[str, str]] = []
        self.input_requests: list[Any] = []

    def on_iopub(self, frame, pending) -> None:
        self.iopub.append((frame.msg_type, pending.msg_id if pending else None))
        if pending is not None:
            self.outputs.setdefault(pending.msg_id, []).append(frame)

    def on_input_request(self, frame, pending) -> None:
        self.input_requests.append(frame)

    def on_lifecycle(self, event, detail: str) -> None:
        self.events.append((getattr(event, "value", event), detail))


def request(code: str = "1", msg_type: str = "execute_request") -> dict:
    """A frontend's request message, as ipykernel hands it to a handler."""
    content = {"code": code, "silent": False, "store_history": True, "user_expressions": {},
               "allow_stdin": False, "stop_on_error": True}
    return {**jupyter_msg(msg_type, content), "buffers": []}


async def run_cell(relay: Relay, code: str = "1", timeout: float = 5):
    """Relay one cell (waking or starting the sandbox first); return its reply frame."""
    await relay.ensure_running()
    p = await relay.send_request("shell", request(code), [])
    return await asyncio.wait_for(relay.wait(p), timeout)


def result_text(host: RecordingHost, reply) -> str | None:
    """``text/plain`` of the cell's ``execute_result``, if any."""
    for f in host.outputs.get(reply.parent_msg_id, []):
        if f.msg_type == "execute_result":
            return f.msg["content"]["data"].get("text/plain")
    return None


def stdout(host: RecordingHost, reply) -> str:
    return "".join(f.msg["content"]["text"] for f in host.outputs.get(reply.parent_msg_id, [])
                   if f.msg_type == "stream" and f.msg["content"]["name"] == "stdout")
