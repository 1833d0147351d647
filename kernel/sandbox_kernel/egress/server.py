"""The local backend's egress proxy: HTTP ``CONNECT`` and absolute-URI requests, filtered.

One per kernel, in the proxy kernel's process and loop.  It listens on a unix
socket bound into each sandbox (nothing else of the host is reachable through
it); inside, the agent forwards the sandbox's ``127.0.0.1:3128`` to it.  Per
connection it reads one request head (at most :data:`MAX_HEAD_BYTES`, within
``head_timeout_s``: a slowloris client is cut), asks :class:`~.rules.EgressRules`,
records the attempt (:class:`~.record.EgressLog`) and then either answers
``403`` with the denial line or connects to the checked address and relays
bytes both ways, counting them against the cell's cap.

Only two request forms are served (RFC 9110 section 9.3.6, RFC 9112 section 3.2.2):
``CONNECT host:port`` (a TLS tunnel: the proxy never sees inside) and
``GET http://host[:port]/path`` (plain HTTP, sent on with ``Connection: close``
so one connection carries one request to one checked host).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import struct
from pathlib import Path
from urllib.parse import urlsplit

from .record import EgressAttempt, EgressLog
from .rules import Decision, EgressRules, normalize_host

log = logging.getLogger("sandbox_kernel.egress")

#: Pending connections the socket queues before the proxy accepts them: the agent's
#: forwarder connects as fast as cells open connections.
BACKLOG = 1024
#: Longest request line plus headers accepted, bytes.
MAX_HEAD_BYTES = 16 * 1024
#: Host uids whose connections are served: root (gVisor's Sentry, or gofer, connects on the
#: sandbox's behalf), the sandbox user (bubblewrap run as root drops to it) and our own uid
#: (bubblewrap run by a user).  Anyone else who finds the socket is refused.
def _peer_uids() -> frozenset[int]:
    return frozenset({0, 65534, os.getuid()})


#: Connections open at once through one kernel's proxy; more are answered 503.
MAX_OPEN = 512
#: Headers a client sends to the proxy itself, never forwarded (RFC 9110 section 7.6.1).
HOP_BY_HOP = frozenset({b"connection", b"proxy-connection", b"keep-alive", b"proxy-authorization",
                        b"proxy-authenticate", b"te", b"trailer", b"transfer-encoding", b"upgrade"})
#: Bytes read at once while relaying (and the remote side's buffer, twice that).
CHUNK = 256 * 1024


def _peer_uid(writer: asyncio.StreamWriter) -> int | None:
    """The host uid of the process at the other end of a unix socket (``SO_PEERCRED``)."""
    sock = writer.get_extra_info("socket")
    try:
        _pid, uid, _gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                              struct.calcsize("3i")))
    except (OSError, AttributeError):
        return None
    return uid


class _Refused(Exception):
    """A request the proxy answers itself: status and one line of text."""

    def __init__(self, status: str, text: str):
        super().__init__(text)
        self.status, self.text = status, text


class EgressProxy:
    """A filtering HTTP proxy serving one kernel's sandboxes over unix sockets.

    Parameters
    ----------
    rules : EgressRules
    record : EgressLog
        Where attempts go (and, through it, the denial notices).
    max_connections_per_cell : int
        Attempts one cell may make (``max_egress_connections_per_cell``).
    max_bytes_per_cell : int
        Bytes, both directions, one cell may move (``max_egress_bytes_per_cell``);
        past it the cell's connections are cut.
    head_timeout_s : float
        Time a client has to send its request head, seconds.
    connect_timeout_s : float
        Time to connect to the remote address, seconds.
    idle_timeout_s : float
        A relayed connection silent both ways this long is closed, seconds.
    """

    def __init__(self, rules: EgressRules, record: EgressLog, *, max_connections_per_cell: int,
                 max_bytes_per_cell: int, head_timeout_s: float = 10.0, connect_timeout_s: float = 15.0,
                 idle_timeout_s: float = 300.0):
        self.rules, self.record = rules, record
        self.max_connections_per_cell = max_connections_per_cell
        self.max_bytes_per_cell = max_bytes_per_cell
        self.head_timeout_s, self.connect_timeout_s = head_timeout_s, connect_timeout_s
        self.idle_timeout_s = idle_timeout_s
        self._servers: dict[str, asyncio.AbstractServer] = {}
        self._tasks: set[asyncio.Task] = set()
        #: Connections open now (served or being decided).
        self.open = 0

    async def listen(self, directory: Path) -> str:
        """Serve on ``<directory>/proxy.sock`` (the directory is made, mode 0711; the
        socket 0666, so the sandbox's unprivileged user may connect).

        Called by the local backend before each sandbox is launched.

        Returns
        -------
        str
            The socket's host path.

        Raises
        ------
        OSError
            If the socket cannot be made.
        """
        directory.mkdir(mode=0o711, exist_ok=True)  # noqa: ASYNC240 - one mkdir before the launch
        path = str(directory / "proxy.sock")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        self._servers[path] = await asyncio.start_unix_server(self._serve, path, limit=MAX_HEAD_BYTES,
                                                              backlog=BACKLOG)
        os.chmod(path, 0o666)  # noqa: S103 - reachable only through the sandbox's bind mount (dir 0711)
        return path

    async def unlisten(self, path: str) -> None:
        """Stop serving ``path`` (the sandbox is gone); its connections end with it."""
        server = self._servers.pop(path, None)
        if server is not None:
            server.close()
        with contextlib.suppress(OSError):
            os.unlink(path)

    async def close(self) -> None:
        """Stop every listener and cut every connection."""
        for path in list(self._servers):
            await self.unlisten(path)
        for t in list(self._tasks):
            t.cancel()

    # ---- one connection --------------------------------------------------------------

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        self.open += 1
        try:
            if _peer_uid(writer) not in _peer_uids():
                log.warning("egress proxy: refused a connection from host uid %s", _peer_uid(writer))
                return
            if self.open > MAX_OPEN:
                raise _Refused("503 Service Unavailable", f"egress proxy busy: more than {MAX_OPEN} "
                               "connections open")
            await self._handle(reader, writer)
        except _Refused as r:
            body = (r.text + "\n").encode()
            with contextlib.suppress(OSError):
                writer.write(f"HTTP/1.1 {r.status}\r\nContent-Type: text/plain\r\nContent-Length: "
                             f"{len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
                await asyncio.wait_for(writer.drain(), 5)
        except (TimeoutError, OSError, asyncio.IncompleteReadError):
            pass
        except Exception:  # a bug here must cost one connection, never the kernel
            log.exception("egress proxy: a connection failed")
        finally:
            self.open -= 1
            if task is not None:
                self._tasks.discard(task)
            writer.close()

    async def _read_head(self, reader: asyncio.StreamReader) -> tuple[bytes, bytes, list[bytes]]:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), self.head_timeout_s)
        except TimeoutError:
            raise _Refused("408 Request Timeout", f"egress proxy: no complete request head within "
                           f"{self.head_timeout_s:g} s") from None
        except asyncio.LimitOverrunError:
            raise _Refused("431 Request Header Fields Too Large", f"egress proxy: request head over "
                           f"{MAX_HEAD_BYTES} bytes") from None
        lines = head[:-4].split(b"\r\n")
        parts = lines[0].split(b" ")
        if len(parts) != 3 or not parts[2].startswith(b"HTTP/1.") or not lines[0].isascii():
            raise _Refused("400 Bad Request", "egress proxy: not an HTTP/1.x request")
        return parts[0], parts[1], lines[1:]

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        method, target, headers = await self._read_head(reader)
        text = target.decode("ascii")
        if method == b"CONNECT":
            host, sep, port_s = text.rpartition(":")
            if not sep or not port_s.isdigit():
                raise _Refused("400 Bad Request", "egress proxy: CONNECT needs host:port")
            port, request = int(port_s), None
        elif text.lower().startswith("http://"):
            url = urlsplit(text)
            try:
                port = url.port or 80
            except ValueError:
                raise _Refused("400 Bad Request", "egress proxy: bad port in the URL") from None
            host = url.hostname or ""
            path = (url.path or "/") + (f"?{url.query}" if url.query else "")
            request = self._forwarded_head(method, path.encode("ascii"), url.netloc.encode("ascii"), headers)
        else:
            raise _Refused("400 Bad Request", "egress proxy: only CONNECT host:port and absolute "
                           "http:// URLs are served (set HTTPS_PROXY/HTTP_PROXY)")
        decision = await self._decide(host, port)
        attempt = self.record.record(decision, method.decode("ascii", "replace"))
        if not decision.allowed:
            raise _Refused("403 Forbidden", decision.line)
        assert decision.address is not None
        try:
            up_r, up_w = await asyncio.wait_for(asyncio.open_connection(*decision.address, limit=CHUNK),
                                                self.connect_timeout_s)
        except (TimeoutError, OSError) as err:
            attempt.reason += f"; connect failed: {err or type(err).__name__}"
            raise _Refused("502 Bad Gateway", f"egress proxy: could not connect to {decision.host}:"
                           f"{decision.port}: {err or type(err).__name__}") from None
        try:
            if request is None:
                writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            else:
                up_w.write(request)
                attempt.bytes_out += len(request)
            await self._relay(reader, writer, up_r, up_w, attempt)
        finally:
            up_w.close()
            self.record.closed(attempt)

    async def _decide(self, host: str, port: int) -> Decision:
        cell = self.record.current_cell()
        if self.record.use(cell).connections >= self.max_connections_per_cell:
            return Decision(normalize_host(host), port, False, f"exceeds max_egress_connections_per_cell="
                            f"{self.max_connections_per_cell} for this cell")
        if self.record.use(cell).bytes >= self.max_bytes_per_cell:
            return Decision(normalize_host(host), port, False, f"exceeds max_egress_bytes_per_cell="
                            f"{self.max_bytes_per_cell} for this cell")
        return await self.rules.decide(host, port)

    @staticmethod
    def _forwarded_head(method: bytes, path: bytes, netloc: bytes, headers: list[bytes]) -> bytes:
        out = [method + b" " + path + b" HTTP/1.1", b"Host: " + netloc.rpartition(b"@")[2]]
        for h in headers:
            name = h.split(b":", 1)[0].strip().lower()
            if name not in HOP_BY_HOP and name != b"host":
                out.append(h)
        out.append(b"Connection: close")
        return b"\r\n".join(out) + b"\r\n\r\n"

    async def _relay(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter, ur: asyncio.StreamReader,
                     uw: asyncio.StreamWriter, a: EgressAttempt) -> None:
        use = self.record.use(a.cell)

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter, outgoing: bool) -> None:
            while True:
                data = await asyncio.wait_for(src.read(CHUNK), self.idle_timeout_s)
                if not data:
                    with contextlib.suppress(OSError):
                        if dst.can_write_eof():
                            dst.write_eof()
                    return
                use.bytes += len(data)
                if outgoing:
                    a.bytes_out += len(data)
                else:
                    a.bytes_in += len(data)
                if use.bytes > self.max_bytes_per_cell:
                    a.reason += f"; cut at max_egress_bytes_per_cell={self.max_bytes_per_cell}"
                    raise ConnectionAbortedError("byte cap")
                dst.write(data)
                await dst.drain()

        tasks = [asyncio.ensure_future(pump(cr, uw, True)), asyncio.ensure_future(pump(ur, cw, False))]
        try:
            done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            if any(t.exception() for t in done):
                return
            if pending:  # one side ended (its end was passed on): the other gets a grace to finish
                await asyncio.wait(pending, timeout=30.0)
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
