"""The workspace: which host folder a sandbox may see, checked before any sandbox starts.

With ``workspace`` ``ro`` or ``rw`` (:class:`~sandbox_kernel.policy.Policy`), the
host folder ``workspace_path`` (default: the kernel's working directory, which
Jupyter Server sets to the notebook's folder) appears inside the sandbox at
:data:`WORKSPACE_DIR`, the interpreter's working directory.  :func:`resolve`
decides, host side and once per kernel start, whether that folder may be
exposed at all; the backends only ever see the resolved real path.

Also here: the one-line hints after a cell's error (:func:`error_hint`): a
``FileNotFoundError`` when the workspace is ``none`` and the file exists in the
host folder (:func:`missing_file_hint`), and a ``PermissionError`` in the
workspace under rootless gVisor, which cannot map the user's files onto the
sandbox user (``docs/security.md``).
Pure host-side checks: nothing here runs code from the sandbox or follows a
path it named beyond one ``lstat`` of a plain file name.
"""

from __future__ import annotations

import dataclasses
import os
import pwd
import re
from dataclasses import dataclass

from .backends.local.layout import PROTECTED_SUBDIRS, protected_subdirs, state_base
from .errors import PolicyError
from .guest import WORKSPACE_DIR
from .policy import Policy

__all__ = ["PROTECTED_SUBDIRS", "WORKSPACE_DIR", "Workspace", "WorkspaceRefused", "error_hint",
           "missing_file_hint", "protected_subdirs", "refusal", "resolve"]


#: Names whose presence anywhere in a folder (at most :data:`SCAN_LIMIT` entries deep
#: into it) refuses it: credentials and keys a cell must never read.
CREDENTIAL_NAMES = frozenset({
    ".ssh", ".aws", ".gnupg", ".azure", ".kube", ".netrc", ".git-credentials", ".env", ".pypirc",
    ".npmrc", ".pgpass", ".vault-token", ".password-store", ".docker", "id_rsa", "id_dsa",
    "id_ecdsa", "id_ed25519",
})
#: Credential paths of two components (``.config/gcloud``...).
CREDENTIAL_SUBPATHS = (".config/gcloud", ".config/gh", ".config/hub", ".config/rclone")
#: System directories: refused themselves and everything below them.
SYSTEM_TREES = ("/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/proc",
                "/run", "/sbin", "/sys", "/usr", "/var/lib", "/var/log", "/var/run", "/var/spool",
                "/var/cache", "/snap")
#: Directories refused themselves (folders below them are fine).
SYSTEM_DIRS = ("/", "/home", "/tmp", "/var", "/var/tmp", "/opt", "/srv", "/mnt", "/media")
#: Entries looked at when scanning a folder for credentials; past it the scan stops
#: (a refusal is then still possible, never a false "clean": see :func:`scan_credentials`).
SCAN_LIMIT = 50_000


class WorkspaceRefused(PolicyError):
    """The workspace folder may not be exposed to a sandbox (the reason says why)."""


@dataclass(frozen=True)
class Workspace:
    """The workspace in force, for ``kernel_info`` and ``doctor``.

    Attributes
    ----------
    mode : {"none", "ro", "rw"}
    host_path : str
        The resolved real host folder ('' with ``none``).
    sandbox_path : str
        Where it appears inside ('' with ``none``).
    """

    mode: str
    host_path: str = ""
    sandbox_path: str = ""

    @classmethod
    def of(cls, policy: Policy) -> Workspace:
        if policy.workspace == "none":
            return cls("none")
        return cls(policy.workspace, policy.workspace_path, WORKSPACE_DIR)

    def describe(self) -> dict[str, str]:
        return dataclasses.asdict(self)


def _home_dirs() -> set[str]:
    homes = {os.path.realpath(os.path.expanduser("~"))}
    try:
        for pw in pwd.getpwall():
            if pw.pw_dir and pw.pw_dir.startswith("/") and pw.pw_dir != "/":
                homes.add(os.path.realpath(pw.pw_dir))
    except OSError:
        pass
    return homes


def _under(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


def scan_credentials(root: str, limit: int = SCAN_LIMIT) -> str | None:
    """The first credential file or folder found in ``root``, or None.

    Walks ``root`` without following symlinks (a link is judged by its own name),
    breadth first, looking at no more than ``limit`` entries.

    Returns
    -------
    str or None
        The offending path relative to ``root``.
    """
    seen = 0
    queue = [""]
    while queue:
        rel = queue.pop(0)
        for sub in CREDENTIAL_SUBPATHS:
            if os.path.lexists(os.path.join(root, rel, sub)):
                return os.path.join(rel, sub)
        try:
            entries = list(os.scandir(os.path.join(root, rel)))
        except OSError:
            continue
        for e in entries:
            seen += 1
            if e.name in CREDENTIAL_NAMES:
                return os.path.join(rel, e.name)
            if e.is_dir(follow_symlinks=False):
                queue.append(os.path.join(rel, e.name))
        if seen >= limit:
            return None
    return None


def refusal(path: str) -> str | None:
    """Why the real folder ``path`` may not be a workspace, or None when it may.

    Parameters
    ----------
    path : str
        An absolute, resolved (``realpath``) host path.
    """
    if not os.path.isdir(path):
        return "it is not an existing directory"
    homes = _home_dirs()
    if path in homes:
        return ("it is a home directory itself (it holds the user's keys and settings); "
                "expose a project folder below it instead")
    if path in SYSTEM_DIRS or any(_under(path, t) for t in SYSTEM_TREES):
        return "it is the root or a system directory"
    for home in homes:
        if _under(home, path):
            return f"it contains the home directory {home}"
    state = os.path.realpath(state_base())
    if _under(path, state) or _under(state, path):
        return f"it holds sandbox-kernel's own state ({state})"
    found = scan_credentials(path)
    if found is not None:
        return (f"it holds credentials ({found}); move them out of the folder or expose a "
                "subfolder without them")
    return None


def _host_code_dirs() -> set[str]:
    """Folders holding code the host runs: the proxy's Python environment, this package, and
    the IPython directory whose config files (``sandbox_kernel_config.py``,
    ``ipython_config.py``: Python) the proxy executes at each start (``$IPYTHONDIR`` or
    ``~/.ipython``; docs/configuration.md)."""
    import sys

    from IPython.paths import get_ipython_dir

    here = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
    return {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, here, get_ipython_dir())}


def resolve(policy: Policy, cwd: str) -> Policy:
    """The policy with ``workspace_path`` resolved to a real path, and checked.

    Called by the proxy kernel at start, after the policy was built from the
    configuration and before any sandbox starts.

    Parameters
    ----------
    policy : Policy
    cwd : str
        The kernel's working directory (the default folder).

    Returns
    -------
    Policy
        Unchanged with ``workspace`` ``none`` (so that a warm pool's sandboxes,
        made without one, still match).

    Raises
    ------
    WorkspaceRefused
        Naming the folder and the reason.
    """
    if policy.workspace == "none":
        return policy
    path = os.path.realpath(policy.workspace_path or cwd)
    resolved = dataclasses.replace(policy, workspace_path=path)
    why = refusal(path)
    if why is None and policy.workspace == "rw":
        for code in _host_code_dirs():
            if _under(code, path) or _under(path, code):
                why = (f"it holds code the host runs ({code}: the Python environment or package of "
                       "sandbox-kernel, or the IPython directory whose config files the proxy runs), "
                       "which a cell could change; use ro, or a folder without it")
                break
    if why is not None:
        raise WorkspaceRefused("workspace_path", path, f"refused as workspace={policy.workspace}: {why}")
    return resolved


_MISSING = re.compile(r"\[Errno 2\] No such file or directory: '([^'\\/]{1,255})'$")


def missing_file_hint(folder: str, evalue: str) -> str | None:
    """A one-line hint for a ``FileNotFoundError`` of a file that exists in the host folder.

    Only for a plain file name (no ``/``), and
    only one ``lstat`` in the host folder: the sandbox learns whether a name
    exists there, nothing else.

    Parameters
    ----------
    folder : str
        The host folder a workspace would expose (``workspace_path`` or the
        kernel's working directory); the caller passes it only with ``workspace``
        ``none``.
    evalue : str
        The error's ``evalue`` as the inner kernel sent it.
    """
    if not folder:
        return None
    m = _MISSING.search(evalue or "")
    if m is None or m.group(1) in (".", ".."):
        return None
    name = m.group(1)
    if not os.path.lexists(os.path.join(folder, name)):
        return None
    return (f"sandbox-kernel: {name!r} exists in the notebook's folder on the host, which this "
            "sandbox does not see; expose it with --SandboxKernel.workspace=ro (or rw), e.g. "
            "`sandbox-kernel install --workspace ro`.")


#: After a ``PermissionError`` in the workspace under rootless gVisor (:func:`error_hint`).
ROOTLESS_HINT = ("sandbox-kernel: rootless gVisor shows your files to the sandbox as another user's, so a cell "
                 "reads and writes only what others may; for a folder you write as yourself use bubblewrap "
                 "(--LocalBackend.runtime=bubblewrap), root's sandbox service (sandbox-kernel service) or a kernel "
                 "run by root (docs/security.md, \"The workspace\").")
_DENIED = re.compile(r"\[Errno 13\] Permission denied: '([^']{1,4096})'$")


def error_hint(mode: str, folder: str, boundary: str, ename: str, evalue: str) -> str | None:
    """The one-line hint the proxy adds after a cell's error, or None.

    Parameters
    ----------
    mode : {"none", "ro", "rw"}
        The policy's ``workspace``.
    folder : str
        The host folder a workspace would expose (:func:`missing_file_hint`).
    boundary : str
        The sandbox's boundary (``kernel_info``'s): rootless gVisor names itself so.
    ename, evalue : str
        The error as the inner kernel sent it.
    """
    if ename == "FileNotFoundError" and mode == "none":
        return missing_file_hint(folder, evalue)
    if ename == "PermissionError" and mode != "none" and "gVisor" in boundary and "rootless" in boundary:
        m = _DENIED.search(evalue or "")
        if m and (not m.group(1).startswith("/") or m.group(1).startswith(WORKSPACE_DIR + "/")):
            return ROOTLESS_HINT
    return None
