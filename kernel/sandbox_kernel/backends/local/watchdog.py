"""Dead-man's switch for one local sandbox (host side, trusted).

ipykernel's parent poller ends the proxy with ``os._exit`` and a SIGKILL runs
no cleanup at all, so a sandbox cannot rely on its proxy to remove it.  A
frozen sandbox (``runsc pause``, SIGSTOP, cgroup freezer) cannot even notice
that its stdin reached EOF, and a checkpointed one has no process at all.

So every local sandbox gets a watchdog (:meth:`.sandbox.LocalSandbox.create`
starts it): a tiny process started in its own session that holds the read end
of a pipe whose only write end stays with the sandbox's owner (the proxy, or
the warm pool until it hands the sandbox on).  When the owner dies, for
whatever reason, the kernel closes the write end, ``read()`` returns EOF, and
the watchdog reaps the sandbox by name (:meth:`.sandbox.LocalSandbox.reap`): it
resumes a paused gVisor container and kills it, removes the cgroup, kills
every process started for the sandbox (found by the sandbox's unique state
directory in their argv) and removes the state directory.  An owner that
removes the sandbox itself writes to the pipe first (any byte disarms; it
writes ``q``).

Run as ``python -m sandbox_kernel.backends.local.watchdog --fd N --state-dir D
--runtime R --container-id ID``.  While it waits it has imported only the
standard library and this package's ``__init__`` modules, which load nothing
else (``tests/test_imports.py`` checks); the teardown is imported when it fires.
"""

from __future__ import annotations

import argparse
import os
import signal
from pathlib import Path


def wait_for_owner(fd: int) -> bool:
    """Block until the owner's end of the pipe closes (True) or it writes to it (False)."""
    while True:
        try:
            chunk = os.read(fd, 64)
        except InterruptedError:
            continue
        except OSError:
            chunk = b""
        return not chunk


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="sandbox_kernel.backends.local.watchdog")
    ap.add_argument("--fd", type=int, required=True)
    ap.add_argument("--state-dir", required=True)
    ap.add_argument("--runtime", required=True)
    ap.add_argument("--container-id", required=True)
    args = ap.parse_args(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    if not wait_for_owner(args.fd):
        return  # disarmed: the owner removes the sandbox itself
    from .sandbox import LocalSandbox

    LocalSandbox.found(Path(args.state_dir), args.runtime, args.container_id).reap()


if __name__ == "__main__":
    main()
