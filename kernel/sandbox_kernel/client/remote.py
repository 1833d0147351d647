"""A kernel on a Jupyter Server, through its REST API and the kernel's WebSocket.

REST (``/api/kernels``: start, interrupt, restart, delete) and the channels
WebSocket (``/api/kernels/<id>/channels``, JSON text frames carrying a
``channel`` key: the default protocol of Jupyter Server's
``ZMQChannelsWebsocketConnection``), both with tornado's clients and the
server's token in an ``Authorization: token ...`` header.  Messages are built
and ids kept by ``jupyter_client``'s :class:`~jupyter_client.session.Session`
(unsigned: the server signs toward the kernel).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

from jupyter_client.jsonutil import json_default
from jupyter_client.session import Session
from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest
from tornado.websocket import WebSocketClientConnection, websocket_connect

from ..aio import background
from .transport import Deliver, Transport

log = logging.getLogger("sandbox_kernel.client")

#: Largest WebSocket message accepted from the server, bytes (a big image output fits).
MAX_WS_MESSAGE_BYTES = 256 * 1024 * 1024


class ServerTransport(Transport):
    """A kernel on a Jupyter Server at ``url``.

    Parameters
    ----------
    url : str
        The server's base URL, e.g. ``http://127.0.0.1:8888/`` (a base path is kept).
    token : str
        The server's token (``--IdentityProvider.token``), sent in a header, never in the URL.
    kernel_name : str, optional
        A kernelspec the server starts; :meth:`close` deletes that kernel.
    kernel_id : str, optional
        A kernel already running on the server; :meth:`close` only disconnects.
    request_timeout_s : float
        Seconds for each REST call (starting a sandbox takes seconds).
    """

    def __init__(self, url: str, token: str, kernel_name: str | None = None, kernel_id: str | None = None,
                 request_timeout_s: float = 120.0):
        if (kernel_name is None) == (kernel_id is None):
            raise ValueError("give exactly one of kernel_name and kernel_id")
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https"):
            raise ValueError(f"a Jupyter Server URL starts with http:// or https://, not {url!r}")
        self.base = url.rstrip("/")
        self.ws_base = urlunsplit(("wss" if parts.scheme == "https" else "ws", parts.netloc,
                                   parts.path.rstrip("/"), "", ""))
        self.token = token
        self.kernel_name = kernel_name
        self.kernel_id = kernel_id
        self.owns_kernel = kernel_name is not None
        self.request_timeout_s = request_timeout_s
        self.session = Session(key=b"", username="sandbox-kernel-client")
        self.where = f"{self.base} ({kernel_name or kernel_id})"
        self.ws: WebSocketClientConnection | None = None
        self._reader: asyncio.Future | None = None
        self._closed = False

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"token {self.token}"}

    async def _rest(self, method: str, path: str, body: dict | None = None) -> Any:
        req = HTTPRequest(f"{self.base}{path}", method=method, headers=self._headers(),
                          body=None if body is None and method != "POST" else json.dumps(body or {}),
                          request_timeout=self.request_timeout_s)
        try:
            resp = await AsyncHTTPClient().fetch(req)
        except HTTPClientError as err:
            detail = err.response.body.decode(errors="replace")[:500] if err.response is not None else ""
            hint = " (wrong token?)" if err.code in (401, 403) else ""
            raise ConnectionError(f"{method} {self.base}{path}: HTTP {err.code}{hint} {detail}") from err
        return json.loads(resp.body) if resp.body else None

    async def start(self, deliver: Deliver, timeout_s: float) -> None:
        if self.kernel_id is None:
            model = await self._rest("POST", "/api/kernels", {"name": self.kernel_name})
            self.kernel_id = model["id"]
            self.where = f"{self.base} (kernel {self.kernel_id}, {self.kernel_name})"
        url = (f"{self.ws_base}/api/kernels/{quote(str(self.kernel_id))}/channels"
               f"?session_id={quote(self.session.session)}")
        try:
            self.ws = await websocket_connect(HTTPRequest(url, headers=self._headers()),
                                              max_message_size=MAX_WS_MESSAGE_BYTES)
        except Exception:
            await self.close()
            raise
        self._reader = background(self._read(deliver))

    async def _read(self, deliver: Deliver) -> None:
        assert self.ws is not None
        while True:
            raw = await self.ws.read_message()
            if raw is None:
                if not self._closed:
                    log.warning("the WebSocket to %s closed", self.where)
                return
            if isinstance(raw, bytes):
                # binary frames carry buffers (widgets); the client's outputs do not use them
                log.debug("skipping a binary WebSocket message (%d bytes)", len(raw))
                continue
            msg = json.loads(raw)
            deliver(str(msg.pop("channel", "")), msg)

    def message(self, msg_type: str, content: dict[str, Any]) -> dict[str, Any]:
        return self.session.msg(msg_type, content)

    def send(self, channel: str, msg: dict[str, Any]) -> None:
        if self.ws is None:
            raise ConnectionError(f"not connected to {self.where}")
        self.ws.write_message(json.dumps({**msg, "channel": channel}, default=json_default))

    async def interrupt(self) -> None:
        await self._rest("POST", f"/api/kernels/{quote(str(self.kernel_id))}/interrupt")

    async def restart(self) -> None:
        await self._rest("POST", f"/api/kernels/{quote(str(self.kernel_id))}/restart")

    async def is_alive(self) -> bool:
        return self.ws is not None and self.ws.protocol is not None

    async def close(self) -> None:
        self._closed = True
        if self.ws is not None:
            self.ws.close()
            self.ws = None
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(BaseException):
                await self._reader
            self._reader = None
        if self.owns_kernel and self.kernel_id is not None:
            with contextlib.suppress(ConnectionError):
                await self._rest("DELETE", f"/api/kernels/{quote(str(self.kernel_id))}")
            self.kernel_id = None
