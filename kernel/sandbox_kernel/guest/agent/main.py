"""The sandbox side's command line (the zipapp's ``__main__``).

Usage inside the sandbox::

    python agent.pyz [--cwd DIR] [--kernel-user USER]   # the agent: framed protocol on stdio
    python agent.pyz --kernel -f CONN                   # the inner kernel (ipykernel, patched)

Each process imports only its own side: the agent never loads the interpreter's
patches, the interpreter never loads the agent's loop.
"""

from __future__ import annotations

import os
import signal
import sys


def main(argv: list[str] | None = None) -> None:
    """Run the agent, or with ``--kernel`` the inner kernel; ``argv`` defaults to ``sys.argv[1:]``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "--kernel":
        from .interpreter.run import run_inner_kernel

        # ipykernel sleeps 0.5 ms before each execute_reply so outputs reach clients
        # first (its FIXME); the proxy sends a reply only after the inner kernel's idle
        # status, which follows every output, so the sleep (1-2 ms under gVisor) buys nothing.
        run_inner_kernel([*argv[1:], "--HistoryManager.hist_file=:memory:", "--IPythonKernel._execute_sleep=0"])
        return
    import argparse

    from .core import Agent

    parser = argparse.ArgumentParser(prog="agent.pyz")
    parser.add_argument("--cwd")
    parser.add_argument("--kernel-user", help="run the interpreter as this user (name or uid) "
                        "when the agent is root")
    parser.add_argument("--egress-socket", help="the host's egress proxy socket, forwarded from "
                        "127.0.0.1:--egress-port")
    parser.add_argument("--egress-port", type=int, default=3128)
    parser.add_argument("--pip-prefix", help="where pip installs (egress only)")
    parser.add_argument("--host-silence-s", type=float, default=0.0, help="end after this many seconds "
                        "without a frame from the host (0: never; the host sends keepalive frames)")
    args = parser.parse_args(argv)
    egress = (args.egress_port, args.egress_socket) if args.egress_socket else None
    agent = Agent(cwd=args.cwd, kernel_user=args.kernel_user, egress=egress, pip_prefix=args.pip_prefix,
                  host_silence_s=args.host_silence_s, spawn_first=True)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if os.getpid() != 1:
        # As PID 1 no handler: an unhandled signal from inside the namespace is discarded.
        signal.signal(signal.SIGTERM, lambda *_: setattr(agent, "running", False))
    agent.run()
