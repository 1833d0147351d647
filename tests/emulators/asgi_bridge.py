"""Serve an ASGI application (connectrpc's generated server) from aiohttp.

Only what connectrpc's ``ConnectASGIApplication`` needs: one request body,
a streamed response, and ``http.disconnect`` once the client is gone.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from aiohttp import web


def asgi_handler(app, on_open: Callable[[web.Request], Callable[[], None] | None] | None = None):
    """Return an aiohttp handler running ``app`` for each request.

    Parameters
    ----------
    app : ASGI application
    on_open : callable, optional
        Called with the request before ``app`` runs; may return a function
        called when the exchange ends (to unregister stream bookkeeping).
    """

    async def handler(request: web.Request) -> web.StreamResponse:
        transport = request.transport
        scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "1.1",
            "method": request.method,
            "scheme": "http",
            "path": request.path,
            "raw_path": request.raw_path.split("?")[0].encode(),
            "root_path": "",
            "query_string": request.query_string.encode(),
            "headers": [(k.lower().encode("latin-1"), v.encode("latin-1"))
                        for k, v in request.headers.items()],
            "client": transport.get_extra_info("peername") if transport else None,
            "server": transport.get_extra_info("sockname") if transport else None,
            "extensions": {},
        }
        body_read = False
        response: web.StreamResponse | None = None

        async def receive() -> dict:
            nonlocal body_read
            if not body_read:
                body_read = True
                return {"type": "http.request", "body": await request.read(), "more_body": False}
            while transport is not None and not transport.is_closing():
                await asyncio.sleep(0.1)
            return {"type": "http.disconnect"}

        async def send(msg: dict) -> None:
            nonlocal response
            if msg["type"] == "http.response.start":
                response = web.StreamResponse(status=msg["status"])
                for k, v in msg.get("headers", []):
                    name = k.decode("latin-1")
                    if name.lower() in ("content-length", "transfer-encoding"):
                        continue
                    response.headers.add(name, v.decode("latin-1"))
                await response.prepare(request)
            elif msg["type"] == "http.response.body":
                assert response is not None
                if transport is None or transport.is_closing():
                    return  # the client left (or a pause dropped the stream)
                try:
                    if msg.get("body"):
                        await response.write(msg["body"])
                    if not msg.get("more_body"):
                        await response.write_eof()
                except ConnectionError:
                    return

        done = on_open(request) if on_open else None
        try:
            await app(scope, receive, send)
        finally:
            if done:
                done()
        if response is None:
            response = web.Response(status=500)
        return response

    return handler

