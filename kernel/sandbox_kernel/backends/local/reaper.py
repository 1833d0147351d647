"""``sandbox-kernel gc``: find local sandboxes whose proxy is gone and remove them.

Every local sandbox has a state directory under :func:`.layout.state_base`
named ``sandbox-kernel-<kernel id>-<suffix>`` holding ``tag.json`` (kernel id,
proxy pid, created at, runtime).  A sandbox is an orphan when its proxy
process no longer exists; it is removed by name
(:meth:`.sandbox.LocalSandbox.reap`), as its watchdog would have.

Local sandboxes only.  Cloud sandboxes end by their provider's server-side
lifetime (E2B's timeout, Modal's ``timeout``/``idle_timeout``), which the
proxy stops refreshing when it dies; their tags (E2B metadata, Modal tags)
let an operator find them in the provider's own listing.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from ..base import TAG
from .layout import state_base
from .procs import alive
from .sandbox import LocalSandbox


def orphans() -> list[tuple[Path, dict]]:
    """State directories whose proxy process is gone, with their tags."""
    found = []
    for d in sorted(state_base().glob(f"{TAG}-*")):
        try:
            tag = json.loads((d / "tag.json").read_text())
        except (OSError, ValueError):
            tag = {}
        pid = tag.get("proxy_pid")
        if not isinstance(pid, int) or not alive(pid):
            found.append((d, tag))
    return found


def reap(d: Path, tag: dict) -> None:
    """Kill and delete one orphaned sandbox (paused, frozen or checkpointed too)."""
    LocalSandbox.found(d, str(tag.get("runtime", ""))).reap()


def collect(dry_run: bool = False, print_fn: Callable[[str], None] = print) -> int:
    """Reap every orphan; return how many were found."""
    found = orphans()
    for d, tag in found:
        print_fn(f"orphan {d.name}: kernel {tag.get('kernel_id', '?')}, proxy pid {tag.get('proxy_pid')} gone")
        if not dry_run:
            reap(d, tag)
    return len(found)
