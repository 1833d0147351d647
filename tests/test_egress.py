"""Egress by domain (issue 17), on the host: the decision, the record and the proxy.

Traffic goes only to loopback servers these tests start.  The addresses that must
be refused (the metadata address, private ranges, a name whose DNS answer is
private) are decided from the decision log with a stub resolver: no packet is
ever sent to them.  The sandboxed end is tested in ``tests/test_egress_kernel.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import threading
import time
from pathlib import Path

import pytest
from sandbox_kernel.egress.record import EgressLog
from sandbox_kernel.egress.rules import EgressRules
from sandbox_kernel.egress.server import EgressProxy
from sandbox_kernel.errors import PolicyError
from sandbox_kernel.policy import Policy

FORBIDDEN = {"169.254.169.254", "10.0.0.1", "::1", "127.0.0.1", "192.168.1.1", "fe80::1", "100.64.0.1"}


def stub_resolver(answers: dict[str, list[str]], asked: list[str]):
    async def resolve(host: str) -> list[str]:
        asked.append(host)
        if host not in answers:
            raise OSError(-2, "Name or service not known")
        return answers[host]
    return resolve


def decide(rules: EgressRules, host: str, port: int):
    return asyncio.run(rules.decide(host, port))


# ---- the decision ------------------------------------------------------------------------------


@pytest.fixture
def rules():
    asked: list[str] = []
    r = EgressRules(
        ["pypi.org", "*.example.org", "rebind.test", "93.184.215.14", "169.254.169.254", "local.test"],
        [443, 80],
        [("local.test", "127.0.0.1:8080")],
        stub_resolver({"pypi.org": ["151.101.0.223"], "a.example.org": ["93.184.215.14"],
                       "rebind.test": ["151.101.0.223", "10.1.2.3"]}, asked))
    r.asked = asked  # type: ignore[attr-defined]
    return r


@pytest.mark.parametrize(("host", "why"), [
    ("169.254.169.254", "link-local address"),
    ("10.0.0.1", "IP literal the operator did not allow"),
    ("[::1]", "IP literal the operator did not allow"),
    ("127.0.0.1", "IP literal"),
    ("2130706433", "not a valid host name"),
    ("example.org", "not in allow_domains"),
    ("evil.com", "not in allow_domains"),
    ("pypi.org.evil.com", "not in allow_domains"),
])
def test_literals_and_names_refused_without_resolving(rules, host, why):
    d = decide(rules, host, 443)
    assert not d.allowed and why in d.reason, d
    assert rules.asked == []  # decided before any lookup


@pytest.mark.parametrize("answer", ["10.1.2.3", "127.0.0.1", "169.254.169.254", "::1", "fe80::1",
                                    "192.168.0.7", "::ffff:127.0.0.1", "224.0.0.1", "0.0.0.0", "100.64.0.1"])
def test_allowed_name_resolving_to_a_non_public_address_is_refused(answer):
    r = EgressRules(["pypi.org"], [443], (), stub_resolver({"pypi.org": [answer]}, []))
    d = decide(r, "pypi.org", 443)
    assert not d.allowed and f"resolves to {answer}" in d.reason and "egress_resolve" in d.reason, d


def test_rebinding_any_private_answer_refuses(rules):
    d = decide(rules, "rebind.test", 443)
    assert not d.allowed and "10.1.2.3" in d.reason


def test_allowed_decisions(rules):
    d = decide(rules, "PyPI.org.", 443)
    assert d.allowed and d.address == ("151.101.0.223", 443) and d.reason == "dns"
    assert decide(rules, "a.example.org", 80).address == ("93.184.215.14", 80)
    assert decide(rules, "93.184.215.14", 443).reason == "literal"
    over = decide(rules, "local.test", 80)  # the operator's override: loopback allowed, port changed
    assert over.allowed and over.address == ("127.0.0.1", 8080) and over.reason == "egress_resolve"


def test_port_and_unlisted_override(rules):
    d = decide(rules, "pypi.org", 22)
    assert not d.allowed and d.line == "egress denied: pypi.org:22 uses port 22, not in allow_ports (80, 443)"
    r = EgressRules(["pypi.org"], [80], [("other.test", "127.0.0.1")], stub_resolver({}, []))
    assert decide(r, "other.test", 80).line == "egress denied: other.test:80 is not in allow_domains"
    assert decide(r, "nowhere.pypi.org", 80).allowed is False


def test_policy_options_validated_and_only_narrowed():
    p = Policy(network="allowlist", allow_domains=("pypi.org", "*.pythonhosted.org"),
               egress_resolve=(("pypi.test", "[::1]:8080"),))
    assert p.allow_ports == (443, 80)
    assert p.tighten({"allow_domains": ["pypi.org"], "allow_ports": [443]}).allow_ports == (443,)
    assert p.tighten({"network": "none"}).network == "none"
    for bad in ({"network": "allowlist"},):
        with pytest.raises(PolicyError):
            Policy().tighten(bad)
    for bad_o in ({"allow_domains": ["evil.com"]}, {"allow_ports": [22]}, {"egress_resolve": {}}):
        with pytest.raises(PolicyError):
            p.tighten(bad_o)
    for kw in ({"allow_domains": ("http://x",)}, {"allow_ports": (0,)},
               {"egress_resolve": (("x.test", "nope"),)}, {"allow_domains": ("*.",)}):
        with pytest.raises(PolicyError):
            Policy(**kw)


def test_install_flags(tmp_path):
    from sandbox_kernel.cli import build_parser

    args = build_parser().parse_args(
        ["install", "--network", "allowlist", "--allow-domain", "pypi.org", "--allow-domain",
         "*.pythonhosted.org", "--allow-port", "443", "--egress-resolve", "pypi.test=127.0.0.1:8080"])
    assert args.allow_domains == ["pypi.org", "*.pythonhosted.org"] and args.allow_ports == [443]
    assert args.egress_resolve == [("pypi.test", "127.0.0.1:8080")]


# ---- the proxy ---------------------------------------------------------------------------------


class _Index(http.server.SimpleHTTPRequestHandler):
    log: list[str]

    def log_message(self, fmt, *args):  # the access log the tests read
        type(self).log.append(self.requestline)


def serve(directory: Path) -> tuple[http.server.ThreadingHTTPServer, list[str]]:
    """A loopback HTTP server over ``directory``; its access log."""
    handler = type("H", (_Index,), {"log": []})
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), lambda *a: handler(*a, directory=str(directory)))
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, handler.log


@contextlib.asynccontextmanager
async def proxy(tmp_path: Path, rules: EgressRules, **kw):
    log = EgressLog()
    denied: list[tuple[str | None, str]] = []
    log.observe(lambda: "cell-1", lambda cell, line: denied.append((cell, line)))
    p = EgressProxy(rules, log, max_connections_per_cell=kw.pop("conns", 1000),
                    max_bytes_per_cell=kw.pop("bytes_", 1 << 30), **kw)
    path = await p.listen(tmp_path / "egress")
    p.denied = denied  # type: ignore[attr-defined]
    try:
        yield p, path
    finally:
        await p.close()


async def ask(path: str, request: bytes, read_all: bool = True) -> bytes:
    r, w = await asyncio.open_unix_connection(path)
    w.write(request)
    await w.drain()
    data = await asyncio.wait_for(r.read() if read_all else r.readuntil(b"\r\n\r\n"), 10)
    w.close()
    return data


def test_proxy_http_connect_and_denial(tmp_path):
    (tmp_path / "www").mkdir()
    (tmp_path / "www" / "hello.txt").write_text("hello through the proxy\n")
    srv, access = serve(tmp_path / "www")
    other, other_access = serve(tmp_path / "www")
    port = srv.server_address[1]
    rules = EgressRules(["index.test"], [80, 443],
                        [("index.test", f"127.0.0.1:{port}"), ("blocked.test", f"127.0.0.1:{other.server_address[1]}")])

    async def main():
        async with proxy(tmp_path, rules) as (p, path):
            got = await ask(path, b"GET http://index.test/hello.txt HTTP/1.1\r\nHost: index.test\r\n"
                            b"Proxy-Connection: keep-alive\r\n\r\n")
            assert got.startswith(b"HTTP/1.0 200") and got.endswith(b"hello through the proxy\n"), got
            # a TLS-style tunnel: CONNECT, then bytes both ways (plain HTTP inside here)
            r, w = await asyncio.open_unix_connection(path)
            w.write(b"CONNECT index.test:443 HTTP/1.1\r\nHost: index.test:443\r\n\r\n")
            assert (await r.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
            w.write(b"GET /hello.txt HTTP/1.0\r\n\r\n")
            assert (await asyncio.wait_for(r.read(), 10)).endswith(b"hello through the proxy\n")
            w.close()
            denied = await ask(path, b"GET http://blocked.test/hello.txt HTTP/1.1\r\nHost: blocked.test\r\n\r\n")
            assert denied.startswith(b"HTTP/1.1 403") and b"egress denied: blocked.test:80 is not in allow_domains" in denied
            assert p.denied == [("cell-1", "egress denied: blocked.test:80 is not in allow_domains")]
            recent = p.record.describe()["recent"]
            assert [(a["host"], a["verdict"]) for a in recent] == [
                ("index.test", "allowed"), ("index.test", "allowed"), ("blocked.test", "denied")]
            assert recent[0]["bytes_in"] > 0 and recent[0]["cell"] == "cell-1"
            assert p.open == 0

    try:
        asyncio.run(main())
    finally:
        srv.shutdown()
        other.shutdown()
    assert len(access) == 2 and other_access == []


def test_proxy_refuses_without_sending(tmp_path):
    """Denied targets never get a connection: the decision log says why."""
    asked: list[str] = []
    rules = EgressRules(["pypi.org", "169.254.169.254"], [443],
                        (), stub_resolver({"pypi.org": ["10.0.0.1"]}, asked))

    async def main():
        async with proxy(tmp_path, rules) as (p, path):
            for target in ("169.254.169.254:443", "10.0.0.1:443", "[::1]:443", "pypi.org:443", "pypi.org:8443"):
                got = await ask(path, f"CONNECT {target} HTTP/1.1\r\n\r\n".encode())
                assert got.startswith(b"HTTP/1.1 403"), (target, got)
            return [a["reason"] for a in p.record.describe()["recent"]]

    with _no_connect():
        reasons = asyncio.run(main())
    assert "link-local" in reasons[0] and "IP literal" in reasons[1] and "IP literal" in reasons[2]
    assert "resolves to 10.0.0.1" in reasons[3] and "not in allow_ports" in reasons[4]
    assert asked == ["pypi.org"]


@contextlib.contextmanager
def _no_connect():
    """Fail the test if anything opens a TCP connection while it runs."""
    orig = asyncio.open_connection

    async def refuse(*a, **k):
        raise AssertionError(f"a connection was attempted to {a}")

    asyncio.open_connection = refuse  # type: ignore[assignment]
    try:
        yield
    finally:
        asyncio.open_connection = orig  # type: ignore[assignment]


def test_proxy_survives_garbage_slowloris_and_200_connections(tmp_path):
    """Bad heads are refused with their status; a head never finished gets a 408 after
    ``head_timeout_s``, each of 200 such at once too, and none stays open; 200 partial
    heads held open at once do not stop a good request.  Decided by events, not by the
    pace of the machine: the 200 are opened one by one, so the first may time out
    before the last opens under load (CI saw 76 of 200 still open after 0.1 s); the
    held ones are held by a proxy whose head timeout no test run reaches."""
    (tmp_path / "www").mkdir()
    (tmp_path / "www" / "x").write_text("x")
    srv, _ = serve(tmp_path / "www")
    rules = EgressRules(["index.test"], [80], [("index.test", f"127.0.0.1:{srv.server_address[1]}")])
    partial = b"CONNECT index.test:80 HTTP/1.1\r\n"

    async def until(what, deadline_s: float = 60.0) -> None:
        deadline = time.monotonic() + deadline_s
        while not what():
            assert time.monotonic() < deadline
            await asyncio.sleep(0.02)

    async def main():
        async with proxy(tmp_path, rules, head_timeout_s=0.5) as (p, path):
            assert (await ask(path, b"\x16\x03\x01garbage\r\n\r\n")).startswith(b"HTTP/1.1 400")
            assert (await ask(path, b"GET /relative HTTP/1.1\r\n\r\n")).startswith(b"HTTP/1.1 400")
            assert (await ask(path, b"A" * 20000)).startswith(b"HTTP/1.1 431")
            slow = await ask(path, b"GET http://index.test/x HTTP/1.1\r\nHost: ind")  # never finished
            assert slow.startswith(b"HTTP/1.1 408") and b"no complete request head within 0.5 s" in slow
            conns = [await asyncio.open_unix_connection(path) for _ in range(200)]
            for _, w in conns:
                w.write(partial)
            answers = [await asyncio.wait_for(r.read(), 60) for r, _ in conns]
            assert all(a.startswith(b"HTTP/1.1 408") for a in answers), {a[:40] for a in answers}
            await until(lambda: p.open == 0)
            for _, w in conns:
                w.close()
        async with proxy(tmp_path, rules, head_timeout_s=3600) as (p, path):
            conns = [await asyncio.open_unix_connection(path) for _ in range(200)]
            for _, w in conns:
                w.write(partial)
            await until(lambda: p.open == 200)
            ok = await ask(path, b"GET http://index.test/x HTTP/1.1\r\nHost: index.test\r\n\r\n")
            assert ok.startswith(b"HTTP/1.0 200")
            await until(lambda: p.open == 200)  # the good request's connection ends; the held ones stay
            for _, w in conns:
                w.close()
            await until(lambda: p.open == 0)  # each one's end is seen

    try:
        asyncio.run(main())
    finally:
        srv.shutdown()


def test_per_cell_caps(tmp_path):
    (tmp_path / "www").mkdir()
    (tmp_path / "www" / "big").write_bytes(b"b" * 200_000)
    srv, _ = serve(tmp_path / "www")
    rules = EgressRules(["index.test"], [80], [("index.test", f"127.0.0.1:{srv.server_address[1]}")])
    req = b"GET http://index.test/big HTTP/1.1\r\nHost: index.test\r\n\r\n"

    async def main():
        async with proxy(tmp_path, rules, conns=2, bytes_=100_000) as (p, path):
            cut = await ask(path, req)
            assert len(cut) < 200_000
            refused = await ask(path, req)
            assert b"max_egress_bytes_per_cell" in refused
            refused = await ask(path, req)
            assert b"max_egress_connections_per_cell" in refused

    try:
        asyncio.run(main())
    finally:
        srv.shutdown()
