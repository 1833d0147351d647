"""The sandbox's end of egress (``network=allowlist``): the forwarder (local backends) and
pip's prefix on the scratch space.

Runs in the agent process only, on a thread of its own.
"""

from __future__ import annotations

import os
import sys


class EgressForwarder:
    """The sandbox's end of egress (``network=allowlist``, local backends): a TCP listener on
    the sandbox's own loopback (``HTTP_PROXY=http://127.0.0.1:<port>``) forwarding each
    connection, byte for byte, to the host's egress proxy socket bound into the sandbox.

    One thread, non-blocking sockets and a selector: hundreds of connections cost no
    threads.  The agent never parses these bytes; the host decides on each request.
    """

    #: Bytes buffered toward one side before reading from the other pauses.
    LIMIT = 1 << 20
    #: Bytes read at once.
    CHUNK = 256 * 1024

    def __init__(self, port: int, socket_path: str):
        import selectors
        import socket

        self.socket, self.selectors, self.path = socket, selectors, socket_path
        self.listener = socket.create_server(("127.0.0.1", port), backlog=512)
        self.listener.setblocking(False)
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.listener, selectors.EVENT_READ)
        self.other: dict = {}
        self.buf: dict = {}
        self.read_eof: set = set()
        self.shut_after: set = set()
        #: socket -> the events it is registered for (absent: not registered)
        self.registered: dict = {}

    def start(self) -> None:
        import threading

        threading.Thread(target=self.run, name="egress-forwarder", daemon=True).start()

    def run(self) -> None:
        while True:
            for key, events in self.sel.select():
                s = key.fileobj
                try:
                    if s is self.listener:
                        self._accept()
                    elif s in self.other:
                        self._service(s, events)
                except OSError:
                    self._close(s)
                except Exception as err:  # noqa: BLE001 - one connection's bug must not stop egress
                    print(f"agent: egress forwarder: {type(err).__name__}: {err}", file=sys.stderr)
                    self._close(s)

    def _accept(self) -> None:
        try:
            client, _ = self.listener.accept()
        except OSError:
            return
        up = self.socket.socket(self.socket.AF_UNIX, self.socket.SOCK_STREAM)
        try:
            up.settimeout(2)  # the proxy's backlog is long: a connect waits only if the host is stuck
            up.connect(self.path)
        except OSError:
            up.close()
            client.close()
            return
        for a, b in ((client, up), (up, client)):
            a.setblocking(False)
            self.other[a], self.buf[a] = b, bytearray()
            self.sel.register(a, self.selectors.EVENT_READ)
            self.registered[a] = self.selectors.EVENT_READ

    def _service(self, s, events: int) -> None:
        o = self.other[s]
        if events & self.selectors.EVENT_WRITE:
            self._flush(s)
        if events & self.selectors.EVENT_READ:
            data = s.recv(self.CHUNK)
            if data:
                self.buf[o] += data
            else:  # pass the half-close on once what is buffered is written
                self.read_eof.add(s)
                self.shut_after.add(o)
            self._flush(o)
        if s in self.read_eof and o in self.read_eof and not self.buf[s] and not self.buf[o]:
            self._close(s)
            return
        self._interest(s)
        self._interest(o)

    def _flush(self, s) -> None:
        b = self.buf[s]
        if b:
            try:
                del b[:s.send(b)]
            except BlockingIOError:
                return
        if not b and s in self.shut_after:
            self.shut_after.discard(s)
            s.shutdown(self.socket.SHUT_WR)

    def _interest(self, s) -> None:
        """Read while the other side's buffer has room and no EOF came; write while
        something waits; otherwise out of the selector (an EOF is always readable)."""
        ev = 0
        if s not in self.read_eof and len(self.buf[self.other[s]]) < self.LIMIT:
            ev |= self.selectors.EVENT_READ
        if self.buf[s]:
            ev |= self.selectors.EVENT_WRITE
        now = self.registered.get(s)
        if ev == now:
            return
        if ev and now:
            self.sel.modify(s, ev)
        elif ev:
            self.sel.register(s, ev)
        else:
            self.sel.unregister(s)
        if ev:
            self.registered[s] = ev
        else:
            del self.registered[s]

    def _close(self, s) -> None:
        for x in (s, self.other.get(s)):
            if x is None or x not in self.other:
                continue
            del self.other[x], self.buf[x]
            self.read_eof.discard(x)
            self.shut_after.discard(x)
            if self.registered.pop(x, None):
                self.sel.unregister(x)
            x.close()


def pip_prefix_env(prefix: str, owner: tuple[int, int] | None) -> dict[str, str]:
    """The interpreter's environment for ``pip install`` into ``prefix`` (the scratch space,
    with egress), importable at once: its site-packages made now (an import path that does
    not exist yet is cached as missing), owned by ``owner`` (uid, gid; None: the agent's),
    and first on the interpreter's path.  The agent's own path is left alone: nothing a
    cell installs can shadow a module the agent imports."""
    import sysconfig

    scheme = sysconfig.get_preferred_scheme("prefix")
    paths = [sysconfig.get_path(k, scheme, vars={"base": prefix, "platbase": prefix})
             for k in ("purelib", "platlib")]
    for d in dict.fromkeys([*paths, os.path.join(prefix, "bin")]):
        os.makedirs(d, exist_ok=True)
        if owner is not None:
            head = d
            while head.startswith(prefix) and head != os.path.dirname(prefix):
                os.chown(head, *owner)
                head = os.path.dirname(head)
    return {"PIP_PREFIX": prefix,
            "PYTHONPATH": os.pathsep.join(dict.fromkeys(paths)),
            "PATH": os.path.join(prefix, "bin") + os.pathsep + os.environ.get("PATH", "")}
