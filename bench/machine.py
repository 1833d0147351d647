"""The machine a run is measured on, as recorded in the results and the report."""

from __future__ import annotations

import datetime as _dt
import os
import platform
import subprocess
from typing import Any

from bench import ROOT
from bench.procmem import kib


def _first_line(argv: list[str]) -> str:
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=20)
        return (p.stdout or p.stderr).strip().splitlines()[0]
    except Exception as err:
        return f"unavailable ({err.__class__.__name__})"


def machine() -> dict[str, Any]:
    """CPU, memory, kernel, runtimes, library versions, git commit and load of this machine."""
    from importlib.metadata import version
    cpu = "unknown"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem_kib = kib("/proc/meminfo", "MemTotal")
    try:
        commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                                capture_output=True, text=True).stdout.strip()
    except OSError:
        commit = ""
    return {
        "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": round(mem_kib / 1024 / 1024, 1),
        "kernel": platform.release(),
        "os": _first_line(["sh", "-c", ". /etc/os-release && echo $PRETTY_NAME"]),
        "runsc": _runsc(),
        "bwrap": _first_line(["bwrap", "--version"]),
        "python": platform.python_version(),
        "ipykernel": version("ipykernel"),
        "jupyter_client": version("jupyter_client"),
        "pyzmq": version("pyzmq"),
        "sandbox_kernel": version("sandbox-kernel") if _has_dist("sandbox-kernel") else "?",
        "git_commit": commit,
        "git_dirty_kernel": bool(subprocess.run(
            ["git", "-C", str(ROOT), "status", "--porcelain", "--", "kernel"],
            capture_output=True, text=True).stdout.strip()),
        "OPENBLAS_CORETYPE": os.environ.get("OPENBLAS_CORETYPE", ""),
        "loadavg_at_start": " ".join(f"{x:.2f}" for x in os.getloadavg()),
    }


def _has_dist(name: str) -> bool:
    from importlib.metadata import PackageNotFoundError, version
    try:
        version(name)
        return True
    except PackageNotFoundError:
        return False


def _runsc() -> str:
    """The runsc the gVisor target runs (and the platform auto chose), beside the system's."""
    try:
        from sandbox_kernel.backends.local.runsc import choose
        c = choose()
    except Exception as err:
        return f"? ({err})"
    system = _first_line(["runsc", "--version"])
    return f"{c.version} ({c.platform}) at {c.path}" + (f"; system: {system}" if c.version not in system else "")
