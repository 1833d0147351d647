"""Host processes of local sandboxes, read from ``/proc`` (standard library only).

Used to freeze a bubblewrap sandbox without a cgroup (SIGSTOP of its process
tree), to reap a sandbox by name (:meth:`.sandbox.LocalSandbox.reap`: every
process whose argv names its state directory) and to tell whether a sandbox's
proxy still runs (:mod:`.reaper`).
"""

from __future__ import annotations

import os
import signal
import time


def _stat_fields(stat: bytes) -> list[bytes]:
    """Fields of ``/proc/<pid>/stat`` after the command name (state, ppid, ...)."""
    return stat[stat.rfind(b")") + 2:].split()


def alive(pid: int) -> bool:
    """True if ``pid`` runs (a zombie, dead but not yet reaped, counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return _stat_fields(stat)[:1] != [b"Z"]


def processes_mentioning(needle: str) -> list[int]:
    """Pids whose argv contains ``needle`` (a sandbox's state directory), not this process."""
    me = os.getpid()
    found = []
    key = needle.encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if key in f.read():
                    found.append(int(entry))
        except OSError:
            continue
    return found


def parent(pid: int) -> int | None:
    """``pid``'s parent pid, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(_stat_fields(f.read())[1])
    except (OSError, IndexError, ValueError):
        return None


def executable_name(pid: int) -> str:
    """The base name of ``pid``'s ``argv[0]``, or "" when it is gone."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv0 = f.read().split(b"\0", 1)[0]
    except OSError:
        return ""
    return os.path.basename(argv0.decode("utf-8", "replace"))


def descendants(root: int) -> list[int]:
    """``root`` and every process below it, parents first (from ``/proc/*/stat``)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        children.setdefault(int(_stat_fields(stat)[1]), []).append(int(entry))
    out, todo = [], [root]
    while todo:
        pid = todo.pop(0)
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def signal_mentioning(needle: str, sig: int) -> int:
    """Send ``sig`` to every process naming ``needle`` and everything below it; how many."""
    n = 0
    for root in processes_mentioning(needle):
        for pid in descendants(root):
            try:
                os.kill(pid, sig)
                n += 1
            except OSError:
                pass
    return n


def kill_mentioning(needle: str, rounds: int = 3, pause_s: float = 0.2) -> None:
    """SIGKILL (then SIGCONT, for stopped ones) every process naming ``needle`` and
    everything below it, children first; repeat until none is left or ``rounds`` ran out.

    Blocking (it sleeps ``pause_s`` between rounds): for the watchdog and ``gc``.
    """
    for _ in range(rounds):
        pids = processes_mentioning(needle)
        if not pids:
            return
        for root in pids:
            for pid in reversed(descendants(root)):
                for sig in (signal.SIGKILL, signal.SIGCONT):
                    try:
                        os.kill(pid, sig)
                    except OSError:
                        pass
        time.sleep(pause_s)
