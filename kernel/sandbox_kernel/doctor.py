"""``sandbox-kernel doctor``: what works on this machine and what is missing.

Each local runtime is checked for real: a sandbox is started with the agent
and must report a ready interpreter.  Every backend of the entry-point group
is then asked, through the backend contract, for what it is (``display_name``,
``capabilities``), which policy fields it enforces (``enforced_fields``),
where its credentials come from (``credentials_hint``) and what stops it here
(``doctor()``); no backend is named in this module.
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

from .backends.base import Capabilities, SandboxBackend
from .guest import WORKSPACE_DIR
from .policy import Policy


def _version(argv: list[str]) -> str | None:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return (out.stdout or out.stderr).strip().splitlines()[0] if (out.stdout or out.stderr) else None


async def _probe_runtime(runtime: str, service_socket: str | None = None) -> dict[str, Any]:
    """Start a cold sandbox of ``runtime`` as a kernel would (through the sandbox service at
    ``service_socket``, default the standard one, when not root and it answers)."""
    from . import protocol
    from .backends.local import LocalBackend

    result: dict[str, Any] = {"runtime": runtime}
    try:
        # cold, as the runtime itself starts: no start template, spare pool or warm pool
        traits: dict[str, Any] = {"runtime": runtime, "start_template": False, "spare_sandbox": False,
                                  "pool_socket": "", **({"service_socket": service_socket} if service_socket else {})}
        backend = LocalBackend(Policy(), kernel_id=f"doctor-{uuid.uuid4().hex[:8]}", **traits)
    except Exception as err:  # noqa: BLE001 - RuntimeUnavailable with the install hint
        return {**result, "ok": False, "error": str(err)}
    result["boundary"] = backend.capabilities.boundary
    result["idle_levels"] = idle_levels(backend.capabilities)
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
        # as started: gVisor's runsc version, platform and rootless mode are known now
        result.update(ok=True, start_s=round(time.monotonic() - t0, 2), boundary=backend.capabilities.boundary,
                      idle_levels=idle_levels(backend.capabilities), copies=copy_operations(backend))
    except Exception as err:  # noqa: BLE001 - a report, not a crash
        result.update(ok=False, error=f"{type(err).__name__}: {err}")
    finally:
        await backend.kill()
    return result


def idle_levels(caps: Capabilities) -> dict[str, str]:
    """What each idle level does on a backend with ``caps`` (docs/lifecycle.md: a
    missing level falls through to the next)."""
    return {
        "pause": "freeze, memory kept" if caps.pause_keeps_memory else "not possible",
        "checkpoint": "to disk, memory freed" if caps.checkpoint else "not possible: becomes a stop",
        "stop": "state lost, the user is told",
    }


def copy_operations(backend: SandboxBackend) -> dict[str, str]:
    """What ``backend`` does of snapshot, restore and fork (issue 30): ``"yes"``, or its
    refusal in plain words (:meth:`.backends.base.SandboxBackend.copy_operations`)."""
    return {op: why or "yes" for op, why in backend.copy_operations().items()}


def copies_line(copies: dict[str, str]) -> str:
    """One line for :func:`copy_operations`: operations with the same answer together."""
    answers: dict[str, list[str]] = {}
    for op, answer in copies.items():
        answers.setdefault(answer, []).append(op)
    return "; ".join(f"{', '.join(ops)}: {answer}" for answer, ops in answers.items())


def backend_entry(name: str) -> dict[str, Any]:
    """One backend as ``doctor`` reports it: built with the default policy and no
    configuration, then asked through the contract (never started).

    Returns
    -------
    dict
        ``display_name``, ``available`` (it imports and builds here), ``hint``
        (why not), ``boundary``, ``idle`` (:func:`idle_levels`), ``enforces`` and
        ``ignores`` (policy fields of scope ``"sandbox"``), ``egress`` (what its
        ``network=allowlist`` enforces, ``SandboxBackend.egress_enforcement``), ``credentials`` (where
        they come from, or None), ``copies`` (snapshot, restore, fork: :func:`copy_operations`),
        ``problems`` (``doctor()``'s, each with its next step), ``host`` (whether this
        machine can host its sandboxes, for a backend whose sandboxes run on machines like
        this one: ``SandboxBackend.host_report``).
    """
    from .backends import load_backend
    from .policy import OPTIONS

    entry: dict[str, Any] = {"display_name": name, "available": False, "hint": None, "problems": []}
    try:
        cls = load_backend(name)
    except Exception as err:  # noqa: BLE001 - BackendNotFound: the extra's install command
        return {**entry, "hint": str(err)}
    sandbox_fields = [o.name for o in OPTIONS if o.scope == "sandbox"]
    entry.update(display_name=cls.display_name or name, credentials=cls.credentials_hint,
                 egress=cls.egress_enforcement or "network=allowlist is not supported",
                 enforces=[f for f in sandbox_fields if f in cls.enforced_fields],
                 ignores=[f for f in sandbox_fields if f not in cls.enforced_fields])
    try:
        backend = cls(Policy(), kernel_id=f"doctor-{uuid.uuid4().hex[:8]}")
        entry["workspace"] = (f"mounted at {WORKSPACE_DIR} (ro: a read-only mount)" if cls.workspace_mount
                              else f"copied to {WORKSPACE_DIR} at each start, at most max_file_transfer_bytes; "
                              "rw: changes copied back on sync and at shutdown")
        entry.update(available=True, boundary=backend.capabilities.boundary,
                     idle=idle_levels(backend.capabilities), copies=copy_operations(backend))
        entry["problems"] = asyncio.run(backend.doctor())
        entry["host"] = asyncio.run(backend.host_report())
    except Exception as err:  # noqa: BLE001 - a missing runtime or SDK, a broken install: reported, not raised
        entry["problems"] = [f"{type(err).__name__}: {err}"]
    return entry


def host_lines(name: str, host: dict[str, Any]) -> str:
    """``doctor``'s lines for a backend's :meth:`~.backends.base.SandboxBackend.host_report`.

    >>> print(host_lines("ray", {"can_host": False, "facts": ["ray 2.60.0"], "problems": ["runsc not found"],
    ...                          "notes": []}))
           this machine can NOT host ray sandboxes:
             problem: runsc not found
             found: ray 2.60.0
    """
    lines = [f"       this machine can {'' if host['can_host'] else 'NOT '}host {name} sandboxes"
             + (f" ({host['runtime']})" if host.get("runtime") else "") + ":"]
    lines += [f"         problem: {p}" for p in host["problems"]]
    lines += [f"         found: {f}" for f in host["facts"]]
    lines += [f"         note: {n}" for n in host["notes"]]
    return "\n".join(lines)


def backend_report() -> dict[str, dict[str, Any]]:
    """:func:`backend_entry` for every backend of the ``sandbox_kernel.backends`` group."""
    from .backends import available_backends

    return {name: backend_entry(name) for name in available_backends()}


def gather(service_socket: str | None = None) -> dict[str, Any]:
    """Collect the doctor's findings as a dict (what ``--json`` prints); ``service_socket``:
    the sandbox service asked (default its standard socket, ``LocalBackend.service_socket``)."""
    report: dict[str, Any] = {"python": sys.executable, "euid": os.geteuid(), "runtimes": []}
    report["ipykernel_in_sandbox_env"] = importlib.util.find_spec("ipykernel") is not None
    report["agent"] = agent_report()
    from .backends.local.runsc import find_runsc, have_runsc

    for runtime, prog, pkg in (("gvisor", "runsc", "runsc"), ("bubblewrap", "bwrap", "bubblewrap")):
        path = (find_runsc() if have_runsc() else None) if runtime == "gvisor" else shutil.which(prog)
        entry: dict[str, Any] = {"runtime": runtime, "program": path,
                                 "version": _version([path, "--version"]) if path else None}
        if path is None:
            entry.update(ok=False, error=f"{prog} not found; install it: apt-get install {pkg}")
        else:
            entry.update(asyncio.run(_probe_runtime(runtime, service_socket)))
        report["runtimes"].append(entry)
    report["gvisor"] = _gvisor_choice()
    report["privilege"] = privilege_report(os.geteuid())
    working = [r["runtime"] for r in report["runtimes"] if r.get("ok")]
    report["default_runtime"] = working[0] if working else None
    report["privilege"].update(local_path_report(os.geteuid(), report["default_runtime"], service_socket))
    report["backends"] = backend_report()
    report["workspace"] = workspace_report(os.getcwd())
    report["start_templates"] = start_templates_report()
    report["spare_pools"] = spare_pools_report()
    return report


def agent_report() -> dict[str, Any]:
    """The sandbox side every backend ships: ``version`` (its content hash) and ``archive``
    (the zipapp's path, built now if this version has none yet), or ``error``."""
    from .guest import agent_archive, agent_version

    try:
        return {"version": agent_version(), "archive": agent_archive()}
    except OSError as err:
        return {"version": agent_version(), "archive": None, "error": str(err)}


def start_templates_report() -> dict[str, Any]:
    """This user's start templates (``LocalBackend.start_template``): ``dir``, ``count``,
    ``mib`` (blocks allocated), ``in_use`` (restored sandboxes holding links to one) and
    ``in_memory`` (on a tmpfs: admission counts them)."""
    from .backends.local import admission, template

    found = template.report()
    found["in_memory"] = admission.in_memory_fs(template.base_dir())
    return found


def spare_pools_report() -> list[dict[str, Any]]:
    """This user's spare pools (``LocalBackend.spare_sandbox``): each one's ``key``,
    ``runtime``, ``ready``, ``starting``, ``handed``, ``pid`` and ``idle_s``."""
    from .backends.local.pool import spares

    return spares.report()


#: What each local runtime lacks when the kernel runs as an ordinary user (no cgroups).
AS_USER_LACKS = {
    "gvisor": "rootless runsc (--rootless --ignore-cgroups): no cgroup, so cpu_cores is not enforced; "
              "memory_mib holds per process (RLIMIT_AS in the guest: MemoryError) and for the sandbox as "
              "a whole by a watch of its memory every 0.25 s (ended above it, the limit named), not by "
              "the kernel's OOM killer; pids_max holds (RLIMIT_NPROC in the guest); pause works, "
              "checkpoint does not (rootless runsc refuses restore): the checkpoint level becomes a "
              "stop (state lost, the user told), and snapshot, restore (rewind) and fork are refused "
              "(SnapshotUnsupported, saying so; the sandbox service or root does them)",
    "bubblewrap": "no cgroup: cpu_cores and the sandbox's total memory are not enforced, only RLIMIT_AS "
                  "per process; pause is SIGSTOP of its processes (no freezer)",
}


def privilege_report(euid: int) -> dict[str, Any]:
    """What running as ``euid`` costs each backend: ``{"as": "root"|"user", "lacks":
    {runtime: sentence}, "clouds": sentence}`` (``lacks`` is empty as root)."""
    clouds = "E2B and Modal need no root here: the sandbox runs in their cloud"
    if euid == 0:
        return {"as": "root", "lacks": {}, "clouds": clouds}
    return {"as": "user", "lacks": dict(AS_USER_LACKS), "clouds": clouds}


def local_path_report(euid: int, default_runtime: str | None, service_socket: str | None = None) -> dict[str, Any]:
    """Which path a local kernel of ``euid`` takes: ``{"in_force": "root" | "service" |
    "rootless gVisor" | "bubblewrap" | None, "service": {"socket", "answers", "boundary"}}``.

    Not root, a kernel has its sandboxes made by the sandbox service when it answers
    at ``service_socket`` (default :data:`.backends.local.service.wire.SERVICE_SOCKET`),
    else runs rootless gVisor or bubblewrap as this user.
    """
    from .backends.local.service.client import hello
    from .backends.local.service.wire import SERVICE_SOCKET

    path = service_socket or SERVICE_SOCKET
    answer = hello(path) if euid != 0 else None
    service = {"socket": path, "answers": answer is not None,
               "boundary": answer.get("boundary") if answer else None}
    if euid == 0:
        in_force: str | None = "root"
    elif answer is not None:
        in_force = "service"
    else:
        in_force = {"gvisor": "rootless gVisor", "bubblewrap": "bubblewrap"}.get(default_runtime or "")
    return {"in_force": in_force, "service": service}


def workspace_report(cwd: str) -> dict[str, Any]:
    """What ``SandboxKernel.workspace`` would expose of ``cwd`` (a kernel's default
    folder): its real path, where it appears inside, and why it would be refused (or None)."""
    from .workspace import refusal

    real = os.path.realpath(cwd)
    return {"default": "none", "sandbox_path": WORKSPACE_DIR, "folder": real, "refused": refusal(real)}


def run_doctor(as_json: bool = False, service_socket: str | None = None) -> int:
    """Print the report; exit status 0 when at least one local runtime works."""
    report = gather(service_socket)
    if as_json:
        print(json.dumps(report, indent=1))
    else:
        print(f"python: {report['python']} (euid {report['euid']})")
        a = report["agent"]
        print(f"sandbox side: version {a['version']}, " + (f"shipped as {a['archive']}" if a["archive"] else
                                                          f"no archive: {a.get('error')}"))
        for r in report["runtimes"]:
            mark = "ok  " if r.get("ok") else "FAIL"
            detail = (f"{r.get('boundary')}, interpreter ready in {r.get('start_s')} s (cold)"
                      if r.get("ok") else r.get("error"))
            print(f"[{mark}] {r['runtime']:10} {r.get('version') or '':28} {detail}")
            if r.get("idle_levels"):
                print("       idle: " + "; ".join(f"{k}: {v}" for k, v in r["idle_levels"].items()))
            if r.get("copies"):
                print(f"       {copies_line(r['copies'])}")
        print(f"runtime in force for --LocalBackend.runtime=auto: {report['default_runtime'] or 'none'}")
        priv = report["privilege"]
        if priv["as"] == "user":
            svc = priv["service"]
            if priv["in_force"] == "service":
                print(f"running as uid {report['euid']}, not root: local kernels go through the sandbox service "
                      f"at {svc['socket']} ({svc['boundary']}): cgroup limits, pause, checkpoint and restore")
            else:
                print(f"running as uid {report['euid']}, not root, no sandbox service at {svc['socket']}: "
                      f"local kernels run {priv['in_force'] or 'nothing'} as this user; what each local "
                      "runtime lacks then (root can run `sandbox-kernel service` to lift it):")
                for runtime, lack in priv["lacks"].items():
                    print(f"       {runtime}: {lack}")
        print(f"       {priv['clouds']}")
        g = report["gvisor"]
        if "error" in g:
            print(f"gVisor: {g['error']}")
        else:
            print(f"gVisor: runsc {g['version'] or '?'} at {g['runsc']}, {g['platform']} platform ({g['why']}); "
                  f"statx shim: {g['statx_shim']}")
        for name, b in report["backends"].items():
            ok = b["available"] and not b["problems"]
            print(f"[{'ok  ' if ok else 'info'}] {name:10} {b.get('boundary') or b['hint']}")
            for problem in b["problems"]:
                print(f"       {problem}")
            if b.get("credentials"):
                print(f"       credentials: {b['credentials']}")
            if "enforces" in b:
                print(f"       enforces: {', '.join(b['enforces']) or 'none'}; not enforced (the "
                      f"sandbox's own limits apply): {', '.join(b['ignores']) or 'none'}")
            if b.get("idle"):
                print("       idle: " + "; ".join(f"{k}: {v}" for k, v in b["idle"].items()))
            if b.get("copies"):
                print(f"       {copies_line(b['copies'])}")
            if b.get("workspace"):
                print(f"       workspace: {b['workspace']}")
            if b.get("egress"):
                print(f"       egress (network=allowlist): {b['egress']}")
            if b.get("host"):
                print(host_lines(name, b["host"]))
        t = report["start_templates"]
        print(f"start templates (gVisor as root, network none: a kernel with no spare sandbox restores "
              f"its policy's first kernel's image): {t['count']} kept, {t['mib']} MiB in {t['dir']}, "
              f"{t['in_use']} sandbox(es) restored from one alive"
              + ("; on a tmpfs, so admission counts them as memory in use" if t["in_memory"] else "")
              + "; `sandbox-kernel gc --templates` removes them")
        pools = report["spare_pools"]
        print(f"spare pools (one started sandbox kept per policy in use, counted by admission, ended "
              f"spare_linger_s after the policy's last kernel, after spare_idle_s unused, or by "
              f"`sandbox-kernel gc`): {len(pools)} running"
              + "".join(f"\n       policy {p['key']}: stopping (removing its sandbox)" if p["stopping"] else
                        f"\n       {p['runtime']} policy {p['key']}: {p['ready']} ready, {p['starting']} "
                        f"starting, {p['handed']} handed over, unused for {p['idle_s']} s (pid {p['pid']})"
                        for p in pools))
        w = report["workspace"]
        print(f"workspace (default {w['default']}; --workspace ro|rw exposes the kernel's folder at "
              f"{w['sandbox_path']}): here {w['folder']} " +
              (f"would be refused: {w['refused']}" if w["refused"] else "may be exposed"))
    return 0 if report["default_runtime"] else 1


def _gvisor_choice() -> dict[str, Any]:
    """The runsc and platform a gVisor kernel would get with the default options, and the shim."""
    from .backends.local.layout import state_base
    from .backends.local.runsc import choose, have_runsc, statx_shim
    from .errors import SandboxKernelError

    if not have_runsc():
        return {"error": "runsc not found (bash scripts/setup.sh installs a current one)"}
    try:
        c = choose()
    except SandboxKernelError as err:
        return {"error": str(err)}
    shim = "not needed by this runsc"
    if c.statx_shim:
        shim = statx_shim(state_base()) or ("not built: no C compiler; `ls`/`stat` in ! commands fail "
                                            "under this runsc (apt-get install gcc)")
    return {"runsc": c.path, "version": c.version, "platform": c.platform, "why": c.why, "statx_shim": shim}
