"""The MCP server over streamable HTTP: loopback only, a bearer token on every request.

The SDK's Starlette app (``FastMCP.streamable_http_app``, with its DNS
rebinding protection for loopback hosts) behind :class:`TokenGate`, served by
uvicorn on a socket bound here so that ``--port 0`` can report the port it got.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import os
import secrets
import socket
import sys
from typing import Any

#: The environment variable holding the token (not argv: other users see a process's argv).
TOKEN_ENV = "SANDBOX_KERNEL_MCP_TOKEN"  # noqa: S105 (a variable name, not a token)


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback addresses.

    >>> is_loopback("127.0.0.1"), is_loopback("::1"), is_loopback("0.0.0.0")
    (True, True, False)
    """
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class TokenGate:
    """ASGI middleware: HTTP requests without ``Authorization: Bearer <token>`` get 401.

    Parameters
    ----------
    app : ASGI app
        The MCP app; lifespan events pass through untouched.
    token : str
        Compared in constant time (``hmac.compare_digest``).
    """

    def __init__(self, app: Any, token: str):
        if len(token) < 16:
            raise ValueError("the MCP token must be at least 16 characters")
        self.app = app
        self.expected = f"Bearer {token}".encode()

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            given = dict(scope.get("headers") or []).get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):
                await send({"type": "http.response.start", "status": 401,
                            "headers": [(b"content-type", b"text/plain"), (b"www-authenticate", b"Bearer")]})
                await send({"type": "http.response.body",
                            "body": b"sandbox-kernel mcp: missing or wrong bearer token\n"})
                return
        await self.app(scope, receive, send)


def token_from_env() -> tuple[str, bool]:
    """The token from :data:`TOKEN_ENV`, or a new random one; and whether it was generated."""
    token = os.environ.get(TOKEN_ENV, "")
    return (token, False) if token else (secrets.token_urlsafe(32), True)


def serve_http(mcp: Any, host: str, port: int, token: str, announce_token: bool) -> None:
    """Serve ``mcp`` (a FastMCP) on ``http://host:port/mcp`` until interrupted.

    Raises
    ------
    ValueError
        ``host`` is not a loopback address.
    """
    import uvicorn

    if not is_loopback(host):
        raise ValueError(f"the MCP HTTP server binds loopback addresses only, not {host!r} "
                         "(reach it from elsewhere through an SSH tunnel or a proxy you trust)")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)  # connections wait in the backlog until uvicorn serves: the port is usable once printed
    bound = sock.getsockname()[1]
    app = TokenGate(mcp.streamable_http_app(), token)
    config = uvicorn.Config(app, log_level="warning", lifespan="on")
    shown = host if family == socket.AF_INET else f"[{host}]"
    print(f"sandbox-kernel mcp: listening on http://{shown}:{bound}/mcp", file=sys.stderr, flush=True)
    if announce_token:
        print(f"sandbox-kernel mcp: token (Authorization: Bearer ...): {token}", file=sys.stderr, flush=True)
    asyncio.run(uvicorn.Server(config).serve(sockets=[sock]))
