"""One running kernel per target: cell, completion, stdout, image and syscall costs."""

from __future__ import annotations

import json

from bench.cells import NESTED_CELL
from bench.figures._registry import WARMUP, Figure, register
from bench.harness import Context


def fig_trivial_rtt(ctx: Context, n: int) -> list[float]:
    s = ctx.session
    for _ in range(WARMUP):
        s.run("pass")
    return [s.run("pass")[0] * 1000 for _ in range(n)]


COMPLETE_CODE = "pri"


def fig_completion(ctx: Context, n: int) -> list[float]:
    s = ctx.session
    send = lambda: s.kc.complete(COMPLETE_CODE, len(COMPLETE_CODE))  # noqa: E731
    for _ in range(WARMUP):
        _, reply = s.timer.request(send, wait_idle=False)
    if "print" not in reply["content"]["matches"]:
        raise RuntimeError(f"unexpected completion: {reply['content']['matches'][:5]}")
    return [s.timer.request(send, wait_idle=False)[0] * 1000 for _ in range(n)]


STDOUT_LINE = "x" * 99  # + the newline print adds: 100 bytes a line


def stdout_mb(quick: bool) -> int:
    """MB printed by the stdout figure (also quoted by the report's "Why")."""
    return 5 if quick else 20


def fig_stdout(ctx: Context, n: int) -> list[float]:
    s = ctx.session
    mb = stdout_mb(ctx.bench.quick)
    lines = mb * 1_000_000 // 100
    code = f"_l = {STDOUT_LINE!r}\nfor _i in range({lines}):\n    print(_l)\n"
    s.run("for _i in range(1000):\n    print(_l if '_l' in dir() else 'warm')")
    out = []
    for _ in range(n):
        got = [0]

        def on(m: dict) -> None:
            if m["msg_type"] == "stream" and m["content"]["name"] == "stdout":
                got[0] += len(m["content"]["text"].encode())

        dt, _reply = s.timer.execute(code, on_iopub=on, timeout=600)
        if got[0] < lines * 100:
            raise RuntimeError(f"stdout lost: {got[0]} of {lines * 100} bytes reached the client")
        out.append(got[0] / 1e6 / dt)
    return out


#: A 1 MiB PNG (random RGB noise, stored uncompressed so its size is exact), built by
#: the stdlib inside the kernel under test.
PNG_SETUP = r'''
import os as _os, struct as _st, zlib as _z
def _chunk(t, d):
    return _st.pack(">I", len(d)) + t + d + _st.pack(">I", _z.crc32(t + d) & 0xffffffff)
_w, _h = 512, 682
_raw = b"".join(b"\0" + _os.urandom(_w * 3) for _ in range(_h))
_png = (b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", _st.pack(">IIBBBBB", _w, _h, 8, 2, 0, 0, 0))
        + _chunk(b"IDAT", _z.compress(_raw, 0)) + _chunk(b"IEND", b""))
from IPython.display import Image as _Image, display as _display
print(len(_png))
'''
PNG_CELL = "_display(_Image(data=_png))"


def fig_image(ctx: Context, n: int) -> list[float]:
    s = ctx.session
    _, _, outs = s.run(PNG_SETUP)
    size = int("".join(o["content"]["text"] for o in outs if o["msg_type"] == "stream"))
    if not 1_000_000 <= size <= 1_100_000:
        raise RuntimeError(f"PNG is {size} bytes")
    out = []
    for i in range(WARMUP + n):
        dt, _r, outs = s.run(PNG_CELL)
        imgs = [o for o in outs if o["msg_type"] == "display_data" and "image/png" in o["content"]["data"]]
        if not imgs:
            raise RuntimeError("the image did not reach the client")
        if i >= WARMUP:
            out.append(dt * 1000)
    return out


def fig_runtime_rtt(ctx: Context, n: int) -> list[float]:
    s = ctx.session
    _, _, outs = s.run(NESTED_CELL.replace("@N@", str(n)).replace("@WARM@", str(WARMUP)),
                       timeout=600)
    text = "".join(o["content"]["text"] for o in outs if o["msg_type"] == "stream")
    line = next(ln for ln in text.splitlines() if ln.startswith("NESTED"))
    return [x * 1000 for x in json.loads(line[len("NESTED"):])]


SYSCALLS = 100_000
SYSCALL_CELL = (f"import os as _os, time as _ti\n_t = _ti.perf_counter()\n"
                f"for _ in range({SYSCALLS}):\n    _os.getpid()\n"
                f"print((_ti.perf_counter() - _t) / {SYSCALLS} * 1e6)")


def fig_syscall(ctx: Context, n: int) -> list[float]:
    out = []
    for _ in range(n):
        _, _, outs = ctx.session.run(SYSCALL_CELL)
        out.append(float("".join(o["content"]["text"] for o in outs if o["msg_type"] == "stream")))
    return out


register("trivial_rtt", Figure(
    "Trivial cell round trip", "ms", fig_trivial_rtt, n=400, n_quick=100,
    note="`pass`: execute_request until execute_reply and status idle, one kernel, "
         f"after {WARMUP} warm-up cells."))
register("completion_rtt", Figure(
    "Completion round trip", "ms", fig_completion, n=60, n_quick=15,
    note=f"complete_request on {COMPLETE_CODE!r} (cursor at the end) until complete_reply. "
         "Dominated by IPython's completer (jedi) in the kernel, the same code everywhere."))
register("stdout_throughput", Figure(
    "stdout throughput", "MB/s", fig_stdout, n=5, n_quick=2, higher_is_better=True,
    note="A cell printing 100-byte lines (20 MB; 5 MB with --quick); bytes of stream text "
         "received by the client / time from execute_request to idle. MB = 10^6 bytes."))
register("image_rtt", Figure(
    "1 MB PNG display round trip", "ms", fig_image, n=30, n_quick=8,
    note="`display(Image(data=_png))` of a 1.0 MB PNG made in the kernel by an earlier cell: "
         "execute_request until reply + idle, the display_data received."))
register("runtime_rtt", Figure(
    "Stock ipykernel RTT next to the kernel (runtime cost)", "ms", fig_runtime_rtt,
    n=200, n_quick=50, rounds=1,
    note="A cell starts a second, stock ipykernel in the same place (inside the sandbox for "
         "the proxy targets) and times `pass` against it with the same timer, client "
         "included. On gVisor the client also runs under gVisor, so this over-states "
         "what the runtime alone costs a host client."))
register("syscall_us", Figure(
    "One syscall in the kernel (os.getpid)", "µs", fig_syscall, n=3, n_quick=2, rounds=3,
    note=f"Mean time of one os.getpid() over {SYSCALLS:,} calls in a cell: what the runtime "
         "charges per system call (ipykernel's OutStream.write makes one per write, so "
         "two per print)."))
