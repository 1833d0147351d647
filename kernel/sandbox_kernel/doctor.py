"""``sandbox-kernel doctor``: what works on this machine and what is missing.

Each local runtime is checked for real: a sandbox is started with the agent
and must report a ready interpreter.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from typing import Any

from .policy import Policy


def _version(argv: list[str]) -> str | None:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return (out.stdout or out.stderr).strip().splitlines()[0] if (out.stdout or out.stderr) else None


async def _probe_runtime(runtime: str) -> dict[str, Any]:
    from . import protocol
    from .backends.local import LocalBackend

    result: dict[str, Any] = {"runtime": runtime}
    try:
        backend = LocalBackend(Policy(runtime=runtime), kernel_id=f"doctor-{uuid.uuid4().hex[:8]}")
    except Exception as err:  # RuntimeUnavailable with the install hint
        return {**result, "ok": False, "error": str(err)}
    result["boundary"] = backend.capabilities.boundary
    caps = backend.capabilities
    result["idle_levels"] = {  # docs/lifecycle.md: a missing level falls through to the next
        "pause": "freeze, memory kept" if caps.pause_keeps_memory else "not possible",
        "checkpoint": "to disk, memory freed" if caps.checkpoint else "not possible: becomes a stop",
        "stop": "state lost, the user is told",
    }
    t0 = time.monotonic()
    try:
        await backend.start()
        dec = protocol.FrameDecoder()
        while True:
            data = await asyncio.wait_for(backend.read(), 120)
            if not data:
                info = await backend.exit_info()
                return {**result, "ok": False, "error": info.cause}
            frames = [protocol.validate_agent_frame(f) for f in dec.feed(data)]
            if any(f.op == "ready" for f in frames):
                break
            died = [f for f in frames if f.op == "died"]
            if died:
                return {**result, "ok": False, "error": died[0].body.get("stderr", "")[-300:]}
        result.update(ok=True, start_s=round(time.monotonic() - t0, 2))
    except Exception as err:
        result.update(ok=False, error=f"{type(err).__name__}: {err}")
    finally:
        await backend.kill()
    return result


#: Which idle level applies on each cloud backend (docs/lifecycle.md, docs/backends.md).
CLOUD_IDLE = {
    "e2b": "pause keeps memory and files (E2B pause; resume = Sandbox.connect, reattach, replay)",
    "modal": "stop: state lost, the user is told (memory snapshots if opted in with "
             "backend_options memory_snapshots=True, experimental)",
}


def cloud_report() -> dict[str, dict[str, Any]]:
    """Per cloud backend: SDK, credentials, the backend's own check, the idle level.

    A backend class with a ``doctor()`` coroutine (``E2BBackend.doctor``: key and
    API reachability) is asked; its problems are listed with their next step.
    """
    clouds: dict[str, dict[str, Any]] = {}
    for name, mod, cred in (("e2b", "e2b_code_interpreter", "E2B_API_KEY"), ("modal", "modal", "MODAL_TOKEN_ID")):
        installed = importlib.util.find_spec(mod) is not None
        entry: dict[str, Any] = {
            "sdk_installed": installed,
            "credentials": bool(os.environ.get(cred)) or (name == "modal" and os.path.exists(os.path.expanduser("~/.modal.toml"))),
            "hint": None if installed else f"pip install 'sandbox-kernel[{name}]'",
            "idle": CLOUD_IDLE[name],
        }
        if installed:
            from .backends import load_backend

            try:
                check = getattr(load_backend(name), "doctor", None)
                if check is not None:
                    entry["problems"] = asyncio.run(check())
                    entry["checked"] = True
            except Exception as err:  # a broken SDK install must not break the report
                entry["problems"] = [f"{type(err).__name__}: {err}"]
                entry["checked"] = True
        clouds[name] = entry
    return clouds


def gather() -> dict[str, Any]:
    """Collect the doctor's findings as a dict (what ``--json`` prints)."""
    report: dict[str, Any] = {"python": sys.executable, "euid": os.geteuid(), "runtimes": []}
    report["ipykernel_in_sandbox_env"] = importlib.util.find_spec("ipykernel") is not None
    for runtime, prog, pkg in (("gvisor", "runsc", "runsc"), ("bubblewrap", "bwrap", "bubblewrap")):
        path = shutil.which(prog)
        entry: dict[str, Any] = {"runtime": runtime, "program": path,
                                 "version": _version([path, "--version"]) if path else None}
        if path is None:
            entry.update(ok=False, error=f"{prog} not found; install it: apt-get install {pkg}")
        else:
            entry.update(asyncio.run(_probe_runtime(runtime)))
        report["runtimes"].append(entry)
    from .backends.local.gvisor import statx_shim
    from .backends.local.layout import state_base

    report["gvisor_statx_shim"] = statx_shim(state_base()) or (
        "not built: no C compiler; `ls`/`stat` in ! commands fail under gVisor 20221219 "
        "(apt-get install gcc)")
    working = [r["runtime"] for r in report["runtimes"] if r.get("ok")]
    report["default_runtime"] = working[0] if working else None
    clouds = cloud_report()
    report["clouds"] = clouds
    return report


def run_doctor(as_json: bool = False) -> int:
    """Print the report; exit status 0 when at least one local runtime works."""
    report = gather()
    if as_json:
        print(json.dumps(report, indent=1))
    else:
        print(f"python: {report['python']} (euid {report['euid']})")
        for r in report["runtimes"]:
            mark = "ok  " if r.get("ok") else "FAIL"
            detail = (f"{r.get('boundary')}, interpreter ready in {r.get('start_s')} s"
                      if r.get("ok") else r.get("error"))
            print(f"[{mark}] {r['runtime']:10} {r.get('version') or '':28} {detail}")
            if r.get("idle_levels"):
                print("       idle: " + "; ".join(f"{k}: {v}" for k, v in r["idle_levels"].items()))
        print(f"runtime in force for --SandboxKernel.runtime=auto: {report['default_runtime'] or 'none'}")
        print(f"gVisor statx shim: {report['gvisor_statx_shim']}")
        for name, c in report["clouds"].items():
            state = "SDK installed" if c["sdk_installed"] else c["hint"]
            cred = "credentials found" if c["credentials"] else "no credentials"
            ok = c["sdk_installed"] and c["credentials"] and not c.get("problems")
            checked = ("; API answers" if c.get("checked") and not c.get("problems") else "")
            print(f"[{'ok  ' if ok else 'info'}] {name:10} {state}; {cred}{checked}")
            for problem in c.get("problems") or []:
                print(f"       {problem}")
            print(f"       idle: {c['idle']}")
    return 0 if report["default_runtime"] else 1
