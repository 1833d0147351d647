"""A/B of a cold kernel start between two checkouts of this project, interleaved.

For a change on the start path too small for the bench's run-to-run spread (issue 29's
zipapp): both checkouts' kernels start in turns (A, B, A, B, ...), so load on the
machine falls on both alike.  Each checkout installs its own kernelspec (no spare
sandbox, no start template, a new proxy process: every start is cold) and its kernels
run with its own package first on ``PYTHONPATH``.  Every cell is ``pass``, inside the
sandbox.

Figures per start: ``first_reply_s`` (``KernelManager.start_kernel`` until the
execute_reply of ``pass`` sent right after ``start_channels``), ``sandbox_s`` (the
relay's own ``timings_s.start_s`` from ``kernel_info``: sandbox start until the agent's
``ready``, the inner kernel and its warm-up included) and ``trivial_cell_ms`` (the
median round trip of ``--cells`` ``pass`` cells after it, one at a time).

Usage::

    .venv/bin/python -m bench.ab_start --a /path/to/before --b /path/to/after \\
        --runtime gvisor --n 12 --out bench/ab_agent_archive.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from jupyter_client.manager import KernelManager


def install(checkout: Path, name: str, prefix: str, runtime: str) -> None:
    code = ("from sandbox_kernel.kernelspec import install; "
            f"install({name!r}, options={{'runtime': {runtime!r}, 'spare_sandbox': False, "
            f"'start_template': False}}, prefix={prefix!r})")
    subprocess.run([sys.executable, "-c", code], check=True, env={**os.environ, "PYTHONPATH": str(checkout / "kernel")})


def _reply(kc: Any, msg_id: str, timeout: float) -> dict:
    while True:
        reply = kc.get_shell_msg(timeout=timeout)
        if reply["parent_header"].get("msg_id") == msg_id:
            return reply


def one_start(checkout: Path, name: str, cells: int = 0) -> dict[str, float]:
    km = KernelManager(kernel_name=name)
    t0 = time.perf_counter()
    km.start_kernel(env={**os.environ, "PYTHONPATH": str(checkout / "kernel")})
    kc = km.client()
    kc.start_channels()
    try:
        reply = _reply(kc, kc.execute("pass", store_history=False), 180)
        first = time.perf_counter() - t0
        if reply["content"]["status"] != "ok":
            raise RuntimeError(f"first cell failed: {reply['content']}")
        info = _reply(kc, kc.kernel_info(), 60)
        sandbox_s = info["content"].get("sandbox", {}).get("timings_s", {}).get("start_s", float("nan"))
        out = {"first_reply_s": first, "sandbox_s": float(sandbox_s)}
        rtts = []
        for _ in range(cells):  # execute_request to execute_reply of `pass`, one at a time
            t = time.perf_counter()
            _reply(kc, kc.execute("pass", store_history=False), 60)
            rtts.append(time.perf_counter() - t)
        if rtts:
            out["trivial_cell_ms"] = statistics.median(rtts) * 1000
        return out
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def summary(xs: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(xs), 4), "min": round(min(xs), 4), "max": round(max(xs), 4),
            "n": len(xs)}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--a", type=Path, required=True, help="checkout A (before)")
    ap.add_argument("--b", type=Path, required=True, help="checkout B (after)")
    ap.add_argument("--runtime", default="gvisor", choices=("gvisor", "bubblewrap"))
    ap.add_argument("--n", type=int, default=12, help="starts per checkout (after one unmeasured each)")
    ap.add_argument("--cells", type=int, default=20, help="trivial cells after each start (median RTT, ms)")
    ap.add_argument("--out", type=Path, help="results JSON (appended to, by runtime)")
    args = ap.parse_args(argv)
    prefix = tempfile.mkdtemp(prefix="sbk-ab-")
    os.environ["JUPYTER_PATH"] = os.pathsep.join([f"{prefix}/share/jupyter",
                                                  *filter(None, [os.environ.get("JUPYTER_PATH")])])
    sides = {side: (path.resolve(), f"sandbox-ab-{side}-{args.runtime}")
             for side, path in (("a", args.a), ("b", args.b))}
    for checkout, name in sides.values():
        install(checkout, name, prefix, args.runtime)
        one_start(checkout, name)  # unmeasured: caches (jedi, templates off, page cache) warm for both
    samples: dict[str, list[dict[str, float]]] = {"a": [], "b": []}
    for i in range(args.n):
        for side in ("a", "b") if i % 2 == 0 else ("b", "a"):
            samples[side].append(one_start(*sides[side], cells=args.cells))
            print(side, samples[side][-1], flush=True)
    load = os.getloadavg()[0]
    result = {side: {"checkout": str(sides[side][0]),
                     "commit": subprocess.run(["git", "-C", str(sides[side][0]), "rev-parse", "--short", "HEAD"],
                                              capture_output=True, text=True).stdout.strip(),
                     **{k: summary([s[k] for s in samples[side]]) for k in samples[side][0]}}
              for side in sides}
    result["cells"] = args.cells
    result["loadavg_1min_at_end"] = round(load, 2)
    result["measured_at"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    print(json.dumps(result, indent=1))
    if args.out:
        old = json.loads(args.out.read_text()) if args.out.exists() else {}
        old[args.runtime] = result
        args.out.write_text(json.dumps(old, indent=1) + "\n")


if __name__ == "__main__":
    main()
