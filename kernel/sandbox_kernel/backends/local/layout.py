"""What a local sandbox sees, computed from the policy: mounts, /etc, environment.

Shared by both local runtimes (:mod:`.bwrap`, :mod:`.gvisor`) and by the cloud
emulations in the tests.  See :mod:`sandbox_kernel.backends.local` for the
picture of the sandbox as a whole.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ...errors import SandboxStartError
from ...guest import AGENT_PATH, EGRESS_DIR, EGRESS_PORT, PIP_PREFIX, WORKSPACE_DIR
from ...policy import Policy
from ..base import interpreter_env

SANDBOX_UID = 65534
SANDBOX_GID = 65534
SANDBOX_HOME = "/home/sandbox"

#: ``/etc`` entries bound read-only when they exist on the host.
ETC_ALLOWLIST = (
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "alternatives",
    "localtime",
    "mime.types",
    "os-release",
    "ssl",
    "ca-certificates",
    "fonts",
    "nsswitch.conf",
    "matplotlibrc",
)

#: Before a runsc is chosen; a started sandbox names its runsc version and platform (:mod:`.runsc`).
GVISOR_BOUNDARY = "gVisor user-space kernel (runsc)"
#: Folders of a read-write workspace that stay read-only inside (bound over it) and are
#: never copied back (E2B, Modal): what the host runs on its own (git hooks and config).
PROTECTED_SUBDIRS = (".git", ".hg")

BWRAP_BOUNDARY = "shared Linux kernel: namespaces + seccomp (bubblewrap)"


def state_base() -> Path:
    """Directory holding per-sandbox state (bundles, runsc root, checkpoint images).

    As root ``/run/sandbox-kernel``, 0711 (traversable, not listable, by the sandbox
    user bubblewrap drops to).  As an ordinary user ``/tmp/sandbox-kernel-<uid>``, 0700:
    the sandboxes run as that user, and no other user may read their state.

    Raises
    ------
    SandboxStartError
        The directory is a symlink or belongs to another user (made in a shared
        ``/tmp`` before us): it is not used.
    """
    uid = os.geteuid()
    base = Path(os.environ.get("SANDBOX_KERNEL_STATE_DIR") or
                ("/run/sandbox-kernel" if uid == 0 else Path(tempfile.gettempdir()) / f"sandbox-kernel-{uid}"))
    base.mkdir(parents=True, exist_ok=True, mode=0o700)
    st = os.lstat(base)
    if stat.S_ISLNK(st.st_mode) or st.st_uid != uid:
        raise SandboxStartError(f"the state directory {base} is a symlink or belongs to uid {st.st_uid}, "
                                 f"not {uid}: remove it, or set SANDBOX_KERNEL_STATE_DIR")
    os.chmod(base, 0o711 if uid == 0 else 0o700)  # root: traversed by the sandbox user
    return base


# ----------------------------------------------------------------------------
# What to mount
# ----------------------------------------------------------------------------


@dataclass(frozen=True)
class HostLayout:
    """Host paths a sandbox needs, derived once per policy.

    Attributes
    ----------
    python : str
        Interpreter path used inside (same path as on the host).
    ro_dirs : tuple of str
        Host directories bound read-only at the same path (Python env, extras).
    etc_entries : tuple of str
        Names under ``/etc`` bound read-only.
    usr_links : tuple of (str, str)
        Top-level links such as ``("/bin", "usr/bin")`` on merged-/usr hosts.
    usr_dirs : tuple of str
        Top-level system dirs bound read-only where they are not links.
    jedi_seed : str or None
        Host directory of the jedi cache built for :attr:`python`, bound
        read-only at :data:`~sandbox_kernel.guest.JEDI_SEED_PATH`
        (:func:`sandbox_kernel.backends.local.jedi_cache.seed`); None: none yet.
    workspace : str or None
        The resolved host folder bound at :data:`~sandbox_kernel.workspace.WORKSPACE_DIR`
        (:func:`sandbox_kernel.workspace.resolve` checked it); None: no workspace.
    workspace_rw : bool
        Bound read-write (``workspace=rw``), else read-only.
    workspace_ro_subdirs : tuple of str
        Subfolders of a read-write workspace bound read-only over it
        (:data:`sandbox_kernel.workspace.PROTECTED_SUBDIRS`: ``.git``...).
    workspace_copied : bool
        A workspace with no host folder here (``workspace`` ``ro`` or ``rw`` and an empty
        ``workspace_path``: a Ray node's sandbox, whose folder is on the proxy's machine):
        nothing is bound; the agent makes :data:`~sandbox_kernel.guest.WORKSPACE_DIR` inside,
        empty, as its working directory, and the proxy copies the folder in
        (:mod:`sandbox_kernel.workspace_copy`), as for E2B and Modal.
    egress_dir : str or None
        Host directory holding the kernel's egress proxy socket, bound read-only
        at :data:`~sandbox_kernel.guest.EGRESS_DIR` (``network=allowlist``); None:
        no egress.
    """

    python: str
    ro_dirs: tuple[str, ...]
    etc_entries: tuple[str, ...]
    usr_links: tuple[tuple[str, str], ...]
    usr_dirs: tuple[str, ...] = ("/usr",)
    jedi_seed: str | None = None
    workspace: str | None = None
    workspace_rw: bool = False
    workspace_ro_subdirs: tuple[str, ...] = ()
    workspace_copied: bool = False
    egress_dir: str | None = None


def _python_prefixes(python: str) -> list[str]:
    if os.path.abspath(python) == os.path.abspath(sys.executable):  # not realpath: venvs share one binary
        prefixes = [sys.prefix, sys.base_prefix]
    else:
        # The operator's configured interpreter (a trusted host binary, not cell code).
        out = subprocess.run(
            [python, "-I", "-c", "import sys; print(sys.prefix); print(sys.base_prefix)"],
            capture_output=True, text=True, timeout=30, env={"PATH": "/usr/bin:/bin"}, check=True,
        ).stdout.split("\n")
        prefixes = [out[0], out[1]]
    prefixes.append(str(Path(os.path.realpath(python)).parent.parent))
    return prefixes


def _minimal(paths: list[str]) -> tuple[str, ...]:
    """Drop paths covered by another (or by /usr), keep order stable."""
    out: list[str] = []
    for p in sorted({os.path.normpath(p) for p in paths if p}, key=len):
        if p in ("/", "/usr") or p.startswith("/usr/") or any(p == q or p.startswith(q + "/") for q in out):
            continue
        out.append(p)
    return tuple(out)


def protected_subdirs(path: str) -> tuple[str, ...]:
    """The :data:`PROTECTED_SUBDIRS` that are real directories (not links) in ``path``."""
    return tuple(d for d in PROTECTED_SUBDIRS
                 if os.path.isdir(os.path.join(path, d)) and not os.path.islink(os.path.join(path, d)))


def host_layout(policy: Policy, python: str, prefixes: list[str] | None = None) -> HostLayout:
    """Compute the mounts for ``policy`` and the interpreter ``python`` on this host.

    ``prefixes``: the interpreter's environment directories when the caller found
    them (the sandbox service, running ``python`` as the requesting user); default:
    ask ``python`` (:func:`_python_prefixes`).

    Raises
    ------
    SandboxStartError
        If the configured interpreter does not run.
    """
    try:
        if prefixes is None:
            prefixes = _python_prefixes(python)
    except (OSError, subprocess.SubprocessError) as err:
        raise SandboxStartError(
            f"cannot run the sandbox interpreter {python}: {err}; "
            "set --LocalBackend.python to a Python with ipykernel installed"
        ) from err
    links, dirs = [], ["/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            links.append((top, os.readlink(top)))
        elif os.path.isdir(top):
            dirs.append(top)
    etc = tuple(e for e in ETC_ALLOWLIST if os.path.lexists(f"/etc/{e}"))
    ws = policy.workspace_path if policy.workspace != "none" and policy.workspace_path else None
    return HostLayout(
        python=python,
        ro_dirs=_minimal([*prefixes, *policy.ro_paths]),
        etc_entries=etc,
        usr_links=tuple(links),
        usr_dirs=tuple(dirs),
        workspace=ws,
        workspace_rw=policy.workspace == "rw",
        workspace_ro_subdirs=protected_subdirs(ws) if ws and policy.workspace == "rw" else (),
        workspace_copied=policy.workspace != "none" and not policy.workspace_path,
    )


def sandbox_env(policy: Policy, layout: HostLayout) -> dict[str, str]:
    """The sandbox's whole environment: a fixed base, the egress proxy's settings
    (``network=allowlist``), then :attr:`Policy.env`.

    Nothing from the host's environment is inherited.
    """
    bindir = os.path.dirname(layout.python)
    env = {
        "HOME": SANDBOX_HOME,
        "USER": "sandbox",
        "LOGNAME": "sandbox",
        # The shell `!cmd` runs (agent._shell: bash when present), as on a
        # typical Jupyter host where SHELL is the user's login shell.
        "SHELL": "/bin/bash" if os.path.exists("/bin/bash") else "/bin/sh",
        "PATH": f"{bindir}:/usr/local/bin:/usr/bin:/bin",
        "TMPDIR": "/tmp",
        **interpreter_env(policy),
    }
    if layout.egress_dir is not None:
        env.update(egress_env(f"http://127.0.0.1:{EGRESS_PORT}"))
    env.update(policy.env_dict)
    return env


def egress_env(proxy_url: str) -> dict[str, str]:
    """What points HTTP clients inside at the egress proxy (``proxy_url``): both spellings
    of the proxy variables (curl reads ``http_proxy`` only in lower case), loopback
    excepted, pip's own, and pip allowed to use an index (``PIP_NO_INDEX`` is not set).

    Parameters
    ----------
    proxy_url : str
        ``http://127.0.0.1:<port>``, the agent's forwarder.
    """
    env = {name: proxy_url for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy",
                                         "PIP_PROXY")}
    env.update(NO_PROXY="localhost,127.0.0.1,::1", no_proxy="localhost,127.0.0.1,::1")
    return env


def agent_command(layout: HostLayout, *, kernel_uid: int | None = None) -> list[str]:
    """Argv of the agent inside the sandbox.

    Parameters
    ----------
    kernel_uid : int, optional
        Where the agent starts as root inside (gVisor), the uid (and gid) its
        interpreter runs as, so that the interpreter cannot reach the agent's
        channel (``docs/security.md``).
    """
    cwd = WORKSPACE_DIR if layout.workspace or layout.workspace_copied else SANDBOX_HOME
    argv = [layout.python, "-u", AGENT_PATH, "--cwd", cwd]
    if layout.egress_dir is not None:
        argv += ["--egress-socket", f"{EGRESS_DIR}/proxy.sock", "--egress-port", str(EGRESS_PORT),
                 "--pip-prefix", PIP_PREFIX]
    if kernel_uid is not None:
        argv += ["--kernel-user", str(kernel_uid)]
    return argv


def workspace_fsize_bytes(policy: Policy) -> int | None:
    """``RLIMIT_FSIZE`` of the sandboxed processes, bytes, with a read-write workspace:
    no file written inside may exceed ``scratch_mib`` (the host folder has no quota of
    its own); a larger write fails with ``OSError(EFBIG)`` in the cell (Python ignores
    ``SIGXFSZ``).  None without one."""
    return policy.scratch_mib * 1024 * 1024 if policy.workspace == "rw" else None


def write_etc(dest: Path) -> None:
    """Write the generated ``/etc`` files into ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "passwd").write_text(
        "root:x:0:0:root:/root:/usr/sbin/nologin\n"
        f"sandbox:x:{SANDBOX_UID}:{SANDBOX_GID}:sandbox:{SANDBOX_HOME}:/bin/sh\n"
    )
    (dest / "group").write_text(f"root:x:0:\nsandbox:x:{SANDBOX_GID}:\n")
    (dest / "hosts").write_text("127.0.0.1 localhost sandbox\n::1 localhost\n")
    (dest / "hostname").write_text("sandbox\n")
