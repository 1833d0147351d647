"""What a peer of the sandbox service may ask for, checked in one place.

The service is root; its peers are ordinary users.  A request is authorised by
the peer's uid as the kernel recorded it (``SO_PEERCRED``, read by the server),
never by anything the client says.  Here: the policy a peer sends
(:func:`policy_from_fields`: only the sandbox fields, none the service cannot
serve safely, no environment that would steer the sandbox's root), and the
interpreter and folders it names (:func:`peer_prefixes`: checked *as the peer*, by a
process run with its uid, gid and groups, so root's own access proves nothing), and
the workspace folder it passes as an fd (:func:`peer_folder`: root never opens a path
the peer names).
"""

from __future__ import annotations

import fcntl
import os
import pwd
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

from ....errors import PolicyError
from ....policy import OPTIONS_BY_NAME, Policy
from .. import idmap
from ..idmap import NO_ACCOUNT_ID, Folder
from ..layout import SANDBOX_GID, SANDBOX_UID

#: Seconds a check run as the peer may take (the interpreter answering its prefixes).
PEER_CHECK_TIMEOUT_S = 30.0
#: Printed by the peer's own interpreter, run as the peer: its environment directories.
_PREFIXES = "import os, sys; print(sys.prefix); print(sys.base_prefix); print(os.path.realpath(sys.executable))"
#: The interpreter that runs the checks below as the peer: the base one (``/usr/bin/python3``
#: for a venv), which the peer can run wherever the service's venv lives.
CHECK_PYTHON = getattr(sys, "_base_executable", "") or sys.executable
#: Run by the service's interpreter as the peer: is every argument a directory the peer may read?
_READABLE = ("import os, sys\n"
             "bad = [p for p in sys.argv[1:] if not (os.path.isdir(p) and os.access(p, os.R_OK | os.X_OK))]\n"
             "print('\\n'.join(bad)); sys.exit(1 if bad else 0)")
#: Run by the service's interpreter as the peer: the first path under the arguments (the
#: interpreter's environment) that the peer owns or may write, if any.  The agent runs that
#: interpreter as uid 0 of the sandbox with CAP_DAC_OVERRIDE: it must not be the peer's code.
_UNWRITABLE = ("import os, stat, sys\n"
               "uid = os.getuid()\n"
               "def mine(p):\n"
               "    st = os.lstat(p)\n"
               "    if stat.S_ISLNK(st.st_mode):\n"
               "        return st.st_uid == uid  # a link's own bits mean nothing; its target is walked or absent\n"
               "    return st.st_uid == uid or os.access(p, os.W_OK)\n"
               "for top in sys.argv[1:]:\n"
               "    up = os.path.dirname(top)\n"
               "    while up != '/':  # an ancestor the peer owns lets it swap the tree\n"
               "        if os.lstat(up).st_uid == uid:\n"
               "            print(up); sys.exit(1)\n"
               "        up = os.path.dirname(up)\n"
               "    for d, dirs, files in os.walk(top):\n"
               "        for p in (d, *(os.path.join(d, n) for n in files + dirs)):\n"
               "            if mine(p):\n"
               "                print(p); sys.exit(1)\n")


#: Environment names the service refuses in a policy's ``env``: they steer what the agent,
#: uid 0 of the sandbox with CAP_DAC_OVERRIDE, loads (the dynamic loader, Python's import
#: system and start-up, glibc's locale and iconv modules, Jupyter's and IPython's paths).
STEERING_ENV_PREFIXES = ("LD_", "PYTHON", "GCONV", "GLIBC_", "MALLOC_", "JUPYTER", "IPYTHON", "JPY_")
STEERING_ENV = frozenset({"LOCPATH", "NLSPATH", "HOSTALIASES", "RES_OPTIONS", "LOCALDOMAIN", "PATH", "HOME",
                          "TMPDIR", "SHELL"})


class Refused(Exception):
    """A request the service will not do; the message is the client's answer."""


def _tuples(value: Any) -> Any:
    """JSON's lists back to the policy's tuples, nested (``env`` is pairs)."""
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def policy_from_fields(fields: Any) -> Policy:
    """The policy a client sent (:meth:`Policy.sandbox_fields`), checked as any policy is.

    Raises
    ------
    Refused
        Not a dict, an unknown field, a bad value, or a network or ``ro_paths`` the
        service does not serve yet.  A workspace is served from the folder's fd alone
        (:func:`peer_folder`).
    """
    if not isinstance(fields, dict):
        raise Refused("policy must be an object of the policy's sandbox fields")
    values: dict[str, Any] = {}
    for name, value in fields.items():
        opt = OPTIONS_BY_NAME.get(name)
        if opt is None or opt.scope != "sandbox":
            raise Refused(f"unknown policy field {name!r}")
        values[name] = _tuples(value)
    try:
        policy = Policy(**values)
    except (PolicyError, TypeError, ValueError) as err:
        raise Refused(f"bad policy: {err}") from err
    if policy.network != "none":
        raise Refused("network=allowlist is not served by the sandbox service yet (the kernel's egress "
                      "socket lives in the user's proxy): use network=none, or --LocalBackend.service_socket=''")
    if policy.ro_paths:  # mounted where the agent is root with CAP_DAC_OVERRIDE: only checked trees
        raise Refused("ro_paths is not served by the sandbox service yet (a folder the user names would be "
                      "mounted where the sandbox's root reads past its modes): use "
                      "--LocalBackend.service_socket='' (rootless gVisor) for it")
    steering = sorted(k for k in policy.env_dict if k.startswith(STEERING_ENV_PREFIXES) or k in STEERING_ENV)
    if steering:
        raise Refused(f"env {', '.join(steering)} is not served by the sandbox service: it would steer what the "
                      "sandbox's root (the agent) loads or runs; use --LocalBackend.service_socket='' for it")
    return policy


def _as_peer(uid: int, gid: int, argv: list[str]) -> subprocess.CompletedProcess:
    """Run ``argv`` as the peer (its uid, primary gid and supplementary groups), blocking."""
    try:
        groups = os.getgrouplist(pwd.getpwuid(uid).pw_name, gid)
    except KeyError:
        groups = [gid]
    return subprocess.run(argv, user=uid, group=gid, extra_groups=groups, capture_output=True, text=True,
                          timeout=PEER_CHECK_TIMEOUT_S, env={"PATH": "/usr/bin:/bin"}, cwd="/",
                          stdin=subprocess.DEVNULL, check=False)


def peer_prefixes(uid: int, gid: int, python: str, ro_paths: tuple[str, ...]) -> tuple[list[str], tuple[str, ...]]:
    """The interpreter's environment directories and ``ro_paths``, resolved (real
    paths), each checked readable *by the peer* (run as the peer: not the service's
    root access).  Blocking.

    Returns
    -------
    (list of str, tuple of str)
        The environment directories and the resolved ``ro_paths``.

    Raises
    ------
    Refused
        ``python`` is not absolute or does not run as the peer, or a directory is not
        readable by the peer (named).
    """
    if not python.startswith("/"):
        raise Refused(f"python must be an absolute path, not {python!r}")
    try:
        out = _as_peer(uid, gid, [python, "-I", "-c", _PREFIXES])
    except (OSError, subprocess.SubprocessError) as err:
        raise Refused(f"the interpreter {python} does not run as uid {uid}: {err}") from err
    lines = out.stdout.split("\n")
    if out.returncode != 0 or len(lines) < 3:
        raise Refused(f"the interpreter {python} does not run as uid {uid}: {out.stderr.strip()[-300:]}")
    prefixes = [os.path.realpath(lines[0]), os.path.realpath(lines[1]), str(Path(lines[2]).parent.parent)]
    ro = tuple(os.path.realpath(p) for p in ro_paths)
    wanted = [*prefixes, *ro]
    check = _as_peer(uid, gid, [CHECK_PYTHON, "-I", "-c", _READABLE, *wanted])
    if check.returncode != 0:
        bad = check.stdout.strip().replace("\n", ", ") or check.stderr.strip()[-200:]
        raise Refused(f"not readable by uid {uid}, so not mounted for it: {bad}")
    envs = sorted({p for p in prefixes if p != "/usr" and not p.startswith("/usr/")})
    given = os.path.normpath(python)  # what the agent execs inside: within a checked tree
    if not any(given == top or given.startswith(top.rstrip("/") + "/") for top in [*envs, "/usr"]):
        raise Refused(f"the interpreter {python} is not inside its environment ({', '.join(envs) or '/usr'}): "
                      "give the path within it (e.g. <venv>/bin/python)")
    check = _as_peer(uid, gid, [CHECK_PYTHON, "-I", "-c", _UNWRITABLE, *envs])
    if check.returncode != 0:
        raise Refused(f"the interpreter's environment is writable by uid {uid} ({check.stdout.strip()[:200]}): "
                      "the sandbox's agent runs it as the sandbox's root, so through the service it must be one "
                      "the user cannot change (a venv root installed, e.g. under /opt); a user's own venv runs "
                      "with --LocalBackend.service_socket='' (rootless gVisor)")
    return prefixes, ro


def _owner_name(uid: int) -> str:
    try:
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except KeyError:
        return f"uid {uid}"


def peer_folder(fds: list[int], uid: int, gid: int, workspace: str) -> Folder | None:
    """The workspace folder the peer passed (``SCM_RIGHTS``), checked: one fd, opened for
    reading (not ``O_PATH``: its open proves the peer may read it), a directory, owned by
    the peer.  None without a workspace.  The fd becomes the returned folder's (the
    caller's to close when refused).

    Raises
    ------
    Refused
        No fd or more than one, not a readable directory, another owner's, or a peer
        the mapping cannot stand for (the sandbox user's own ids).
    """
    if workspace == "none":
        if fds:
            raise Refused("fds are passed with a create only for a workspace folder")
        return None
    if len(fds) != 1:
        raise Refused(f"workspace={workspace} through the sandbox service takes the folder as one fd "
                      "(opened by the kernel's proxy, passed with SCM_RIGHTS): the service opens no path it is sent")
    fd = fds[0]
    st = os.fstat(fd)
    flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    if flags & os.O_PATH or flags & os.O_ACCMODE == os.O_WRONLY or not stat.S_ISDIR(st.st_mode):
        raise Refused("the workspace fd must be a directory opened for reading (O_RDONLY | O_DIRECTORY), not O_PATH")
    if st.st_uid != uid:
        raise Refused(f"the workspace folder is owned by {_owner_name(st.st_uid)}, not by you ({_owner_name(uid)}): "
                      "the sandbox service maps only a folder its user owns onto the sandbox user; choose a folder "
                      "of your own, or run this kernel without the service (--LocalBackend.service_socket='')")
    if {uid, gid} & {SANDBOX_UID, SANDBOX_GID, NO_ACCOUNT_ID}:
        raise Refused(f"uid {uid} / gid {gid} is the sandbox user's own id (or the mapping's reserved one): its "
                      "folder cannot be mapped onto the sandbox user")
    return Folder.open_protected(fd, uid, gid, workspace == "rw")


def folder_again(fds: list[int], owner_uid: int, state_dir: Path) -> Folder | None:
    """The workspace folder a ``restore`` passes again, for a sandbox whose folder the
    service no longer holds (it was started again since the ``create``): taken only if it
    passes :func:`peer_folder`'s checks for the sandbox's owner and is the very folder the
    sandbox was made with (the record's device and inode).  None: no fd, or the sandbox
    was not made with a passed folder.  As with :func:`peer_folder`, the fd becomes the
    returned folder's; the caller closes the fds otherwise (refused included).

    Raises
    ------
    Refused
        Not the sandbox's folder, or not its owner's.
    """
    rec = idmap.folder_record(state_dir)
    if not fds or rec is None:
        return None
    st = os.fstat(fds[0])
    if len(fds) == 1 and (st.st_dev, st.st_ino) != (rec.get("dev"), rec.get("ino")):
        raise Refused("the workspace folder passed with the restore is not the one the sandbox was made with: "
                      "not mapped (the sandbox stays checkpointed)")
    return peer_folder(fds, owner_uid, int(rec["gid"]), "rw" if rec.get("rw") else "ro")
