"""Memory of a process tree, read from ``/proc`` (Linux only).

The ``/proc/<pid>/stat`` walk in :func:`process_tree` is the same as
``sandbox_kernel.backends.local.procs.descendants`` and the parse in its ``alive``;
it is kept here so the bench does not depend on where those land in the package.
"""

from __future__ import annotations

import os
from pathlib import Path


def process_tree(root: int) -> list[int]:
    """``root`` and all its descendants, from ``/proc/*/stat``."""
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        children.setdefault(ppid, []).append(int(d))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def kib(path: str, key: str) -> int:
    """The ``key:`` line of a ``/proc`` file such as ``status`` or ``meminfo``, in KiB (0 if absent)."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def meminfo_mib(key: str) -> float:
    """A ``/proc/meminfo`` value (``MemAvailable``...), MiB."""
    return kib("/proc/meminfo", key) / 1024


def tree_memory_mib(root: int) -> tuple[float, float, int]:
    """(sum of VmRSS, sum of Pss, process count) over the tree of ``root``, MiB."""
    pids = process_tree(root)
    rss = sum(kib(f"/proc/{p}/status", "VmRSS") for p in pids)
    pss = sum(kib(f"/proc/{p}/smaps_rollup", "Pss") for p in pids)
    return rss / 1024, pss / 1024, len(pids)


def tree_memory_parts(root: int) -> dict[str, float]:
    """Memory of a proxy kernel's tree, MiB: the whole tree (``rss``, ``pss``), and the
    sandbox alone (``sandbox_pss``: the runtime and the sandboxed processes, i.e. without
    the proxy itself and its watchdog), with process counts."""
    out = {"rss": 0.0, "pss": 0.0, "sandbox_rss": 0.0, "sandbox_pss": 0.0, "procs": 0, "sandbox_procs": 0}
    for p in process_tree(root):
        rss = kib(f"/proc/{p}/status", "VmRSS") / 1024
        pss = kib(f"/proc/{p}/smaps_rollup", "Pss") / 1024
        try:
            with open(f"/proc/{p}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        out["rss"] += rss
        out["pss"] += pss
        out["procs"] += 1
        if p != root and b"sandbox_kernel.backends.local.watchdog" not in cmd:
            out["sandbox_rss"] += rss
            out["sandbox_pss"] += pss
            out["sandbox_procs"] += 1
    return out


def du_mib(path: Path) -> float:
    """Allocated size of the files under ``path``, MiB."""
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for fn in files:
            try:
                total += os.stat(os.path.join(dirpath, fn)).st_blocks * 512
            except OSError:
                pass
    return total / 2**20
