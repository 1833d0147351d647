"""Which runsc, on which platform: found, probed once, recorded per sandbox.

gVisor's cost per system call is its *platform*'s: ``ptrace`` (every
platform of every runsc; about 20-45 µs a syscall), ``systrap`` (runsc 2023 and
later; under 1 µs a syscall where the host allows it) or ``kvm`` (needs
``/dev/kvm``; it hangs in nested VMs like ours, so only when asked).  Debian 12
ships runsc 20221219, which has no systrap and answers ``statx`` with
``AT_NO_AUTOMOUNT`` wrongly (the statx shim); ``scripts/setup.sh`` then
installs Debian 13's runsc at :data:`PRIVATE_RUNSC`, outside ``PATH``, and
:func:`find_runsc` prefers it.

:func:`choose` resolves ``LocalBackend.runsc_path`` and
``LocalBackend.gvisor_platform`` to a :class:`RunscChoice`; what it learns by
running the binary (``runsc --version``, whether systrap runs, whether the shim
is needed) is probed with ``runsc do`` once per binary and cached beside the
state directories.  A sandbox's choice is written into its state directory
(``runsc.json``), so every later call on it (``pause``, ``restore``, the
watchdog, ``gc``) uses the same binary and platform.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from ...errors import SandboxKernelError
from ...guest import statx_shim_source
from .layout import state_base

#: Environment of the runsc processes themselves (never the proxy's).
RUNSC_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
#: Where ``scripts/setup.sh`` installs Debian 13's runsc when the system's is too old for systrap.
PRIVATE_RUNSC = "/usr/local/lib/sandbox-kernel/runsc"
#: ``LocalBackend.gvisor_platform`` values.
PLATFORMS = ("auto", "systrap", "ptrace", "kvm")
#: A sandbox's record of its runsc (in its state directory).
RECORD = "runsc.json"
#: Seconds one probe (``runsc do``) may take; a platform that hangs (kvm in a nested VM) fails it.
PROBE_TIMEOUT_S = 20.0


@dataclass(frozen=True)
class RunscChoice:
    """The runsc binary and platform a gVisor sandbox runs with.

    Attributes
    ----------
    path : str
        Absolute path of the runsc binary.
    version : str
        What ``runsc --version`` says (``0.0~20240729.0``, ``release-20240729.0``), or ``""``.
    platform : str
        ``systrap``, ``ptrace`` or ``kvm``.
    why : str
        One line: why this platform (for the log, ``doctor`` and ``kernel_info``).
    statx_shim : bool
        This runsc needs the statx shim (:func:`statx_shim`) for ``ls``/``stat``.
    rootless : bool
        runsc runs as this ordinary user (``--rootless --ignore-cgroups``): no cgroup
        limits and no ``restore`` (:func:`rootless_here`, ``docs/security.md``).
    compression : bool
        ``runsc checkpoint`` takes ``--compression`` (Debian 12's runsc does not: it
        always compresses).
    """

    path: str
    version: str
    platform: str
    why: str
    statx_shim: bool
    rootless: bool = False
    compression: bool = False

    @property
    def boundary(self) -> str:
        """The boundary as ``kernel_info["sandbox"]["boundary"]`` names it."""
        mode = ", rootless" if self.rootless else ""
        return f"gVisor user-space kernel (runsc {self.version or '?'}, {self.platform} platform{mode})"

    def record(self, state_dir: Path) -> None:
        """Write this choice into a sandbox's state directory (``runsc.json``)."""
        (Path(state_dir) / RECORD).write_text(json.dumps(asdict(self)))

    @classmethod
    def recorded(cls, state_dir: Path) -> RunscChoice | None:
        """The choice a sandbox was started with, or None (no record, or unreadable)."""
        try:
            return cls(**json.loads((Path(state_dir) / RECORD).read_text()))
        except (OSError, ValueError, TypeError):
            return None


def find_runsc(configured: str = "") -> str:
    """The runsc binary: ``configured`` if given, else :data:`PRIVATE_RUNSC` if
    installed, else ``runsc`` on ``PATH`` (or :data:`RUNSC_ENV`'s), else ``"runsc"``.

    Raises
    ------
    SandboxKernelError
        ``configured`` is not an executable file.
    """
    if configured:
        if not (os.path.isfile(configured) and os.access(configured, os.X_OK)):
            raise SandboxKernelError(f"LocalBackend.runsc_path={configured!r} is not an executable file")
        return os.path.abspath(configured)
    if os.access(PRIVATE_RUNSC, os.X_OK):
        return PRIVATE_RUNSC
    return shutil.which("runsc") or shutil.which("runsc", path=RUNSC_ENV["PATH"]) or "runsc"


def have_runsc(configured: str = "") -> bool:
    """A runsc binary is there (:func:`find_runsc` finds an executable)."""
    try:
        path = find_runsc(configured)
    except SandboxKernelError:
        return False
    return os.path.isabs(path) or shutil.which(path) is not None


def _run(argv: list[str], timeout_s: float) -> tuple[int, str]:
    try:
        p = subprocess.run(argv, capture_output=True, timeout=timeout_s, env=RUNSC_ENV, check=False,
                           stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return -1, "timed out"
    except OSError as err:
        return -2, str(err)
    return p.returncode, (p.stdout + p.stderr).decode("utf-8", "replace")


def rootless_here() -> bool:
    """runsc runs rootless in this process (it is not root): ``--rootless
    --ignore-cgroups``.  Measured as uid 65534 with runsc 20240729: it runs, pauses,
    resumes and checkpoints a container, and refuses ``restore``; without cgroups,
    limits come from the guest's rlimits and a watch of its memory file (gvisor.py)."""
    return os.geteuid() != 0


def _do(runsc: str, platform: str, *argv: str) -> int:
    """``runsc do`` one command in a throwaway root; its exit status (-1: timed out)."""
    with tempfile.TemporaryDirectory(prefix="runsc-probe-") as root:
        rc, _ = _run([*runsc_argv(root, runsc=runsc, platform=platform, rootless=rootless_here()), "do", *argv],
                     PROBE_TIMEOUT_S)
    return rc


def probe(runsc: str) -> dict:
    """What ``runsc`` can do here, by running it; cached per binary (path, size, mtime).

    Returns
    -------
    dict
        ``version`` (str), ``systrap`` (bool: ``runsc do /bin/true`` on systrap
        exits 0), ``runs`` (bool: on systrap or else ptrace; as this user, rootless
        when not root), ``statx_ok`` (bool: ``stat /`` works without the shim),
        ``compression`` (bool: ``runsc checkpoint --help`` lists ``-compression``).
    """
    try:
        st = os.stat(runsc)
    except OSError:
        return {"version": "", "systrap": False, "statx_ok": False}
    key = hashlib.sha256(f"{os.path.realpath(runsc)}:{st.st_size}:{st.st_mtime_ns}:{os.geteuid()}:v2"
                         .encode()).hexdigest()[:16]
    cache = state_base() / f"runsc-probe-{key}.json"
    try:
        return dict(json.loads(cache.read_text()))
    except (OSError, ValueError):
        pass
    rc, out = _run([runsc, "--version"], 10)
    m = re.search(r"runsc version (\S+)", out)
    found = {
        "version": m.group(1) if m and rc == 0 else "",
        "systrap": _do(runsc, "systrap", "/bin/true") == 0,
    }
    found["runs"] = found["systrap"] or _do(runsc, "ptrace", "/bin/true") == 0
    found["statx_ok"] = _do(runsc, "systrap" if found["systrap"] else "ptrace", "/usr/bin/stat", "/") == 0
    found["compression"] = "-compression" in _run([runsc, "checkpoint", "--help"], 10)[1]
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_text(json.dumps(found))
    except OSError:
        pass
    return found


def choose(runsc_path: str = "", platform: str = "auto") -> RunscChoice:
    """Resolve ``LocalBackend.runsc_path`` and ``gvisor_platform`` (blocking: may probe).

    ``auto`` is systrap when this runsc runs it here, else ptrace; ``kvm`` is
    taken only when asked (it needs ``/dev/kvm`` and hangs in nested VMs).

    Raises
    ------
    SandboxKernelError
        ``runsc_path`` is not executable, or ``systrap`` was asked of a runsc that cannot run it.
    """
    path = find_runsc(runsc_path)
    found = probe(path)
    rootless = rootless_here()
    if not found.get("runs", True):
        who = f"rootless, as uid {os.geteuid()}" if rootless else "as root"
        raise SandboxKernelError(f"gVisor ({path}, runsc {found['version'] or '?'}) does not run here {who}: "
                                 "`runsc do /bin/true` failed on systrap and on ptrace (sandbox-kernel "
                                 "doctor says more; --LocalBackend.runtime=bubblewrap is the fallback)")
    if platform == "auto":
        chosen = "systrap" if found["systrap"] else "ptrace"
        why = ("auto: this runsc runs systrap here" if found["systrap"] else
               "auto: this runsc has no working systrap platform (too old, or the host refuses it)")
    else:
        if platform == "systrap" and not found["systrap"]:
            raise SandboxKernelError(f"LocalBackend.gvisor_platform='systrap', but {path} "
                                     f"(runsc {found['version'] or '?'}) cannot run it here; a runsc "
                                     "from 2023 or later is needed (scripts/setup.sh installs one)")
        chosen, why = platform, f"asked (LocalBackend.gvisor_platform={platform!r})"
    return RunscChoice(path=path, version=found["version"], platform=chosen, why=why,
                       statx_shim=not found["statx_ok"], rootless=rootless,
                       compression=bool(found.get("compression")))


async def choose_async(runsc_path: str = "", platform: str = "auto") -> RunscChoice:
    """:func:`choose` off the event loop (a first probe runs runsc for about a second)."""
    return await asyncio.to_thread(choose, runsc_path, platform)


def runsc_argv(state_root: str, *, runsc: str = "runsc", platform: str = "ptrace",
               rootless: bool = False) -> list[str]:
    """runsc and its global flags (before the subcommand) for one sandbox's state root.

    ``--network=none`` (the sandbox has no interface but loopback) and the
    platform, for every subcommand: runsc needs the same global flags for
    ``run``, ``pause``, ``checkpoint``, ``restore``, ``kill`` and ``delete``;
    ``rootless`` adds ``--rootless --ignore-cgroups`` (:func:`rootless_here`).
    """
    mode = ["--rootless", "--ignore-cgroups"] if rootless else []
    return [runsc, "--root", state_root, "--network=none", f"--platform={platform}", *mode]


def statx_shim(cache_dir: Path) -> str | None:
    """Build (once) and return the host path of the statx compatibility shim.

    Debian's runsc 20221219 answers ``statx(..., AT_NO_AUTOMOUNT)`` with
    EINVAL, which breaks ``ls`` and ``stat`` in ``!`` commands; the shim
    (``guest/statx_shim.c``), preloaded in the sandbox, clears that flag.
    It is compiled from our own source (``guest/statx_shim.c``) with the
    host's C compiler into ``cache_dir``, keyed by the source's hash.
    Blocking (the compiler runs up to 60 s): async callers run it in a thread.

    Returns
    -------
    str or None
        None when no C compiler is available (``doctor`` says so); the sandbox
        then works without it, and coreutils' ``ls``/``stat`` fail inside.
    """
    import hashlib

    src = statx_shim_source()
    out = Path(cache_dir) / f"statx-shim-{hashlib.sha256(src).hexdigest()[:12]}.so"
    if out.exists():
        return str(out)
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None
    tmp = out.with_suffix(f".{os.getpid()}.tmp")
    c_file = tmp.with_suffix(".c")
    c_file.write_bytes(src)
    try:
        subprocess.run([cc, "-shared", "-fPIC", "-O2", "-o", str(tmp), str(c_file)], check=True,
                       capture_output=True, timeout=60, env=RUNSC_ENV)
        os.chmod(tmp, 0o644)
        os.replace(tmp, out)
    except (OSError, subprocess.SubprocessError):
        return None
    finally:
        c_file.unlink(missing_ok=True)
        tmp.unlink(missing_ok=True)
    return str(out)
