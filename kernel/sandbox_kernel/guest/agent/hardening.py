"""The agent's guard of its channel (``docs/security.md``, "The agent's channel"): it makes
itself non-dumpable and runs the interpreter as another user.

Runs in the agent process only.
"""

from __future__ import annotations

import os

#: ``prctl`` option (linux/prctl.h).
PR_SET_DUMPABLE = 4


def resolve_user(user: str) -> tuple[int, int, str | None]:
    """``(uid, gid, home)`` of a user name or numeric uid (gid = uid when unknown)."""
    import pwd

    try:
        pw = pwd.getpwuid(int(user)) if user.isdigit() else pwd.getpwnam(user)
    except KeyError:
        if not user.isdigit():
            raise SystemExit(f"agent: no user {user!r} in this sandbox") from None
        return int(user), int(user), None
    return pw.pw_uid, pw.pw_gid, None if user.isdigit() else pw.pw_dir


def harden_self() -> dict:
    """Make this process non-dumpable and say what guards the channel.

    Non-dumpable, Linux refuses ``/proc/<pid>/fd``, ``/proc/<pid>/mem``,
    ``ptrace`` and ``process_vm_readv`` to processes of the same uid without
    ``CAP_SYS_PTRACE`` (gVisor 2022-12 still opens ``/proc/<pid>/fd``: there
    the separate uid does the job).

    Returns
    -------
    dict
        ``non_dumpable`` (bool), ``pid1`` (bool: signals from inside are
        discarded), ``agent_uid`` (int).
    """
    guard = {"agent_uid": os.getuid(), "pid1": os.getpid() == 1, "non_dumpable": False}
    try:
        import ctypes

        guard["non_dumpable"] = ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) == 0
    except (OSError, AttributeError):
        pass
    return guard
