"""Run as an ordinary user by tests/test_nonroot.py: start a kernel with jupyter_client,
follow a plan of steps, print what each step saw as one JSON document.

argv: kernel name, then the plan as JSON: a list of steps, each
``{"run": code}``, ``{"interrupt_after": seconds, "run": code}``, ``{"info": true}``,
``{"wait_state": name, "timeout": seconds}``, ``{"hold_until": path}`` (write
``path + ".ready"`` with the sandbox's state directory, then wait for ``path``) or
``{"download": path}`` (the files comm: ``downloaded`` text, or ``error``).
Never any cell code outside the kernel: this process is the frontend only.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

from jupyter_client.manager import KernelManager
from sandbox_kernel.client.transport import local_manager


def main() -> None:
    name, plan = sys.argv[1], json.loads(sys.argv[2])
    km = local_manager(name, KernelManager)  # IPC endpoints: no TCP port another start can take
    km.start_kernel()
    kc = km.client()
    kc.start_channels()
    kc.wait_for_ready(timeout=180)
    seen: list[dict] = []
    try:
        for step in plan:
            seen.append(_step(km, kc, step))
    finally:
        print(json.dumps(seen))
        sys.stdout.flush()
        km.shutdown_kernel(now=False)


def _info(kc) -> dict:
    msg_id = kc.kernel_info()
    while True:
        m = kc.get_shell_msg(timeout=60)
        if m["parent_header"].get("msg_id") == msg_id:
            return m["content"].get("sandbox") or {}


def _step(km, kc, step: dict) -> dict:
    if step.get("info"):
        return {"info": _info(kc)}
    if "wait_state" in step:
        deadline = time.monotonic() + step.get("timeout", 60)
        while (state := _info(kc).get("state")) != step["wait_state"] and time.monotonic() < deadline:
            time.sleep(0.3)
        return {"state": state}
    if "hold_until" in step:
        info = _info(kc)
        ready = step["hold_until"] + ".ready"
        with open(ready + ".part", "w") as f:  # renamed into place: the test never reads it half written
            json.dump(info, f)
        os.replace(ready + ".part", ready)
        while not os.path.exists(step["hold_until"]):
            time.sleep(0.2)
        return {"held": True}
    if "download" in step:  # through the files comm: the agent reads it inside the sandbox
        from sandbox_kernel import files_client

        try:
            return {"downloaded": files_client.download(kc, step["download"]).decode()}
        except Exception as err:  # what the user would see
            return {"error": f"{type(err).__name__}: {err}"}
    out: dict = {"stdout": "", "stderr": "", "error": ""}

    def hook(m: dict) -> None:
        c = m["content"]
        if m["msg_type"] == "stream":
            out[c["name"]] += c["text"]
        elif m["msg_type"] == "error":
            out["error"] = f"{c['ename']}: {c['evalue']}"
        elif m["msg_type"] == "execute_input" and "interrupt_after" in step:
            # counted from the cell's start, never from the request (tests/kernels.py: execute)
            threading.Timer(step["interrupt_after"], km.interrupt_kernel).start()

    reply = kc.execute_interactive(step["run"], output_hook=hook, timeout=step.get("timeout", 180))
    out["status"] = reply["content"]["status"]
    return out


if __name__ == "__main__":
    main()
