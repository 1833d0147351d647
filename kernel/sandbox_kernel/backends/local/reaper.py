"""``sandbox-kernel gc``: find sandboxes whose proxy is gone and remove them.

Every local sandbox has a state directory under :func:`state_base` named
``sandbox-kernel-<kernel id>-<suffix>`` holding ``tag.json`` (kernel id, proxy
pid, created at, runtime).  A sandbox is an orphan when its proxy process no
longer exists.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Callable

from ..base import TAG
from .layout import state_base


def _alive(pid: int) -> bool:
    """True if ``pid`` runs (a zombie, dead but not yet reaped, counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2:][:1] != b"Z"


def orphans() -> list[tuple[Path, dict]]:
    """State directories whose proxy process is gone, with their tags."""
    found = []
    for d in sorted(state_base().glob(f"{TAG}-*")):
        try:
            tag = json.loads((d / "tag.json").read_text())
        except (OSError, ValueError):
            tag = {}
        pid = tag.get("proxy_pid")
        if not isinstance(pid, int) or not _alive(pid):
            found.append((d, tag))
    return found


def reap(d: Path, tag: dict) -> None:
    """Kill and delete one orphaned sandbox (paused, frozen or checkpointed too)."""
    from .watchdog import kill_sandbox

    kill_sandbox(d, str(tag.get("runtime", "")), d.name)  # runsc, cgroup, every process naming d
    shutil.rmtree(d, ignore_errors=True)


def collect(dry_run: bool = False, print_fn: Callable[[str], None] = print) -> int:
    """Reap every orphan; return how many were found."""
    found = orphans()
    for d, tag in found:
        print_fn(f"orphan {d.name}: kernel {tag.get('kernel_id', '?')}, proxy pid {tag.get('proxy_pid')} gone")
        if not dry_run:
            reap(d, tag)
    return len(found)
