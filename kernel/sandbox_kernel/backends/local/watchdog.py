"""Dead-man's switch for one local sandbox (host side, trusted).

ipykernel's parent poller ends the proxy with ``os._exit`` and a SIGKILL runs
no cleanup at all, so a sandbox cannot rely on its proxy to remove it.  A
frozen sandbox (``runsc pause``, SIGSTOP, cgroup freezer) cannot even notice
that its stdin reached EOF, and a checkpointed one has no process at all.

So every local sandbox gets a watchdog: a tiny process started in its own
session that holds the read end of a pipe whose only write end stays in the
proxy.  When the proxy dies, for whatever reason, the kernel closes the write
end, ``read()`` returns EOF, and the watchdog reaps the sandbox: it resumes a
paused gVisor container and kills it, kills every process started for the
sandbox (found by the sandbox's unique state directory in their argv) and
removes the state directory.  A proxy that removes the sandbox itself writes
``q`` first (disarm).

Run as ``python -m sandbox_kernel.backends.local.watchdog --fd N --state-dir D --runtime R
--container-id ID``; imports only the standard library.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

DISARM = b"q"
RUNSC_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}


def processes_mentioning(needle: str) -> list[int]:
    """Pids whose argv contains ``needle`` (the sandbox's state directory)."""
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
        ppid = int(stat[stat.rfind(b")") + 2:].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [root]
    while todo:
        pid = todo.pop(0)
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def _runsc(state_dir: Path, *args: str) -> None:
    runsc = shutil.which("runsc", path=RUNSC_ENV["PATH"]) or "runsc"
    argv = [runsc, "--root", str(state_dir / "runsc"), "--network=none", "--platform=ptrace", *args]
    try:
        subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=RUNSC_ENV,
                       timeout=30, check=False)
    except (OSError, subprocess.SubprocessError):
        pass


def _remove_cgroup(container_id: str) -> None:
    """Thaw, kill and remove the sandbox's cgroup, if it has one (root only)."""
    from . import cgroups as limits

    try:
        cg = limits.SandboxCgroup.existing(container_id)
        if cg is not None:
            cg.remove()
    except (OSError, limits.CgroupError):
        pass


def kill_sandbox(state_dir: Path, runtime: str, container_id: str) -> None:
    """Kill everything of one sandbox (idempotent); the state directory stays."""
    if runtime == "gvisor" and (state_dir / "runsc").is_dir():
        _runsc(state_dir, "resume", container_id)  # a paused container ignores kill
        _runsc(state_dir, "kill", container_id, "KILL")
        _runsc(state_dir, "delete", "--force", container_id)
    _remove_cgroup(container_id)
    for _ in range(3):
        pids = processes_mentioning(str(state_dir))
        if not pids:
            return
        for root in pids:
            for pid in reversed(descendants(root)):
                for sig in (signal.SIGKILL, signal.SIGCONT):
                    try:
                        os.kill(pid, sig)
                    except OSError:
                        pass
        time.sleep(0.2)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="sandbox_kernel.backends.local.watchdog")
    ap.add_argument("--fd", type=int, required=True)
    ap.add_argument("--state-dir", required=True)
    ap.add_argument("--runtime", required=True)
    ap.add_argument("--container-id", required=True)
    args = ap.parse_args(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    data = b""
    while True:
        try:
            chunk = os.read(args.fd, 64)
        except InterruptedError:
            continue
        except OSError:
            chunk = b""
        if not chunk:
            break
        data += chunk
        if DISARM in data:
            return
    state_dir = Path(args.state_dir)
    kill_sandbox(state_dir, args.runtime, args.container_id)
    shutil.rmtree(state_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
