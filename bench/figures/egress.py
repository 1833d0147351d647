"""Egress through the kernel's filtering proxy (``network=allowlist``), beside a direct fetch.

A loopback HTTP server started here serves a blob and a one-byte file.  On
``stock`` the cell fetches them directly from 127.0.0.1 (the limit); on the
sandbox targets a kernel of its own, with ``allow_domains=["bench.test"]`` and the
operator's override ``egress_resolve={"bench.test": "127.0.0.1:<port>"}``,
fetches ``http://bench.test/...`` through ``HTTP_PROXY`` (the agent's forwarder on
the sandbox's loopback, the unix socket, the proxy's decision, the server).
The cell code is the same; only the URL differs.
"""

from __future__ import annotations

import http.server
import json
import os
import threading
from dataclasses import replace

from bench.figures._registry import Figure, register
from bench.harness import Context, Running

#: Bytes of the blob downloaded per sample.
SIZE = 32 << 20
#: One-byte requests per download sample, for the latency figure.
REQUESTS_PER_SAMPLE = 10

CELL = r'''
import json, time, urllib.request
def _get(url):
    with urllib.request.urlopen(url, timeout=120) as r:
        return r.read()
_get("@BASE@/tiny")
_lat, _mb = [], []
for _ in range(@N@):
    for _ in range(@K@):
        _t0 = time.perf_counter(); _get("@BASE@/tiny"); _lat.append((time.perf_counter() - _t0) * 1000)
    _t0 = time.perf_counter(); _d = _get("@BASE@/blob"); _dt = time.perf_counter() - _t0
    assert len(_d) == @SIZE@, len(_d)
    _mb.append(@SIZE@ / 1048576 / _dt)
print("EGRESS" + json.dumps({"mb": _mb, "lat": _lat}))
'''


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True


def _serve() -> _Server:
    blob = os.urandom(SIZE)

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = blob if self.path == "/blob" else b"x"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    srv = _Server(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


def fig_egress(ctx: Context, n: int) -> dict[str, list[float]]:
    """``n`` downloads of :data:`SIZE` bytes and ``n`` x :data:`REQUESTS_PER_SAMPLE`
    one-byte requests, each on a new connection, timed inside the cell."""
    srv = _serve()
    port = srv.server_address[1]
    k: Running | None = None
    try:
        if ctx.target.name == "stock":
            base, target = f"http://127.0.0.1:{port}", ctx.target
        else:
            from sandbox_kernel.kernelspec import install

            name = f"sandbox-bench-{ctx.target.name}-egress"
            install(name, prefix=ctx.bench.prefix, options={
                "runtime": ctx.target.runtime, "network": "allowlist", "allow_domains": ["bench.test"],
                "egress_resolve": {"bench.test": f"127.0.0.1:{port}"}, "pause_after_s": 0,
                "checkpoint_after_s": 0})
            base, target = "http://bench.test", replace(ctx.target, kernel_name=name)
        k = Running(ctx.bench, target)
        k.first_reply_s()
        k.ensure_iopub()
        code = (CELL.replace("@BASE@", base).replace("@N@", str(n)).replace("@K@", str(REQUESTS_PER_SAMPLE))
                .replace("@SIZE@", str(SIZE)))
        _, _, outputs = k.run(code, timeout=600)
        text = "".join(m["content"].get("text", "") for m in outputs if m["msg_type"] == "stream")
        got = json.loads(text.split("EGRESS", 1)[1].splitlines()[0])
        return {"egress_download_mibps": got["mb"], "egress_request_ms": got["lat"]}
    finally:
        if k is not None:
            k.stop()
        srv.shutdown()


TARGETS = ("stock", "bubblewrap", "gvisor")

register("egress_download_mibps", Figure(
    "HTTP download, 32 MiB, loopback server", "MiB/s", fig_egress, n=5, n_quick=2, kind="fresh",
    higher_is_better=True, targets=TARGETS, rounds=1,
    note="`urllib.request.urlopen(...).read()` of 32 MiB from a loopback HTTP server the bench "
         "starts, timed in the cell. stock: direct to 127.0.0.1. Sandboxes (network=allowlist, "
         "egress_resolve pointing an allowed name at that server): through HTTP_PROXY, the agent's "
         "forwarder on the sandbox's loopback, the unix socket and the kernel's filtering proxy."))
register("egress_request_ms", Figure(
    "HTTP request, 1 byte, new connection", "ms", None, n=0, n_quick=0, produced_by="egress_download_mibps",
    targets=TARGETS,
    note="One GET of a 1-byte file on a new connection, timed in the cell: what the egress path "
         "adds per request (decision, connect, relay), beside stock's direct request."))
