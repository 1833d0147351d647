"""What runs INSIDE the sandbox, on the untrusted side of the boundary.

This folder holds the code every backend ships into its sandbox:

* ``agent/``: the sandbox side, a package split by process (the agent, which starts
  a stock ipykernel and relays it over stdio; what runs in the user's interpreter),
  shipped as one zipapp (:func:`agent_archive`); ``docs/security.md`` draws the boundary;
* ``statx_shim.c``: a small ``LD_PRELOAD`` library the gVisor runtime builds on
  the host and preloads inside (:func:`sandbox_kernel.backends.local.runsc.statx_shim`).

Nothing in this folder imports from the host package (``tests/test_guest.py``
holds it to that).  This ``__init__`` is the host's lookup only: where the
files are on the host and where they go inside.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import marshal
import os
import tempfile
import zipfile
from importlib import resources
from pathlib import Path

#: Where the agent's zipapp is placed inside a local or Modal sandbox (E2B uploads it elsewhere).
AGENT_PATH = "/opt/sandbox-kernel/agent.pyz"
#: The sandbox side's package name inside the zipapp (unlike ``agent``, no name a user's
#: own module in the interpreter's folder would have: the archive is first on its path).
AGENT_PACKAGE = "sandbox_kernel_agent"
#: Where the workspace (``SandboxKernel.workspace``) appears inside every sandbox, and the
#: interpreter's working directory when there is one (``docs/decisions.md``).
WORKSPACE_DIR = "/home/sandbox/work"
#: Where a local sandbox finds the host-built jedi cache, read-only (the agent's
#: ``JEDI_SEED_DIR``; :mod:`sandbox_kernel.backends.local.jedi_cache`).
JEDI_SEED_PATH = "/opt/sandbox-kernel/jedi-cache"
#: Where a local sandbox with ``network=allowlist`` finds its kernel's egress proxy socket
#: (``proxy.sock``), read-only (:mod:`sandbox_kernel.egress.server`).
EGRESS_DIR = "/opt/sandbox-kernel/egress"
#: The port on the sandbox's own loopback where the agent forwards to that socket:
#: ``HTTP_PROXY=http://127.0.0.1:3128`` inside.
EGRESS_PORT = 3128
#: Where ``pip install`` inside a sandbox with egress puts packages (``PIP_PREFIX``),
#: on the scratch space; importable at once (the read-only environment stays untouched).
PIP_PREFIX = "/home/sandbox/.local"


def _agent_sources() -> list[tuple[str, bytes]]:
    """``(path inside the package, source)`` of every module of ``agent/``, sorted."""
    root = Path(__file__).resolve().parent / "agent"
    return [(p.relative_to(root).as_posix(), p.read_bytes()) for p in sorted(root.rglob("*.py"))]


@functools.cache
def agent_version() -> str:
    """The content hash the sandbox side's archive is named by (hex, 16 digits).

    SHA-256 of the package's sources and of this interpreter's bytecode magic
    number (the archive holds bytecode for it); computed once per process.
    """
    h = hashlib.sha256(importlib.util.MAGIC_NUMBER)
    for rel, data in _agent_sources():
        h.update(rel.encode() + b"\0" + hashlib.sha256(data).digest())
    return h.hexdigest()[:16]


def agent_cache_dir() -> Path:
    """Where this user's agent archives are kept: ``$XDG_CACHE_HOME/sandbox-kernel/agent``
    (default ``~/.cache``), or, where that cannot be made, a folder of this uid's in the
    system's temporary folder."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "sandbox-kernel" / "agent"
    try:
        cache.mkdir(parents=True, exist_ok=True)
        if os.access(cache, os.W_OK | os.X_OK):
            return cache
    except OSError:
        pass
    cache = Path(tempfile.gettempdir()) / f"sandbox-kernel-{os.getuid()}" / "agent"
    cache.mkdir(parents=True, mode=0o700, exist_ok=True)
    return cache


def agent_archive(cache_dir: str | os.PathLike[str] | None = None) -> str:
    """Host path of the sandbox side's zipapp, the one file every backend ships.

    ``agent-<agent_version()>.pyz`` in ``cache_dir`` (default :func:`agent_cache_dir`),
    built there the first time a version is asked for (``sandbox-kernel install`` and
    ``scripts/setup.sh`` ask, so no kernel's start builds it) and kept: the name
    changes with the content, so a file of that name is never stale.  The archive
    holds ``__main__.py`` and :data:`AGENT_PACKAGE` with each module's source and its
    bytecode for this interpreter (unchecked hash-based ``.pyc``: ``zipimport`` loads
    it without compiling; another Python version compiles the source).

    Returns
    -------
    str
        The archive's path (mode 0644), run inside as ``python agent.pyz``.

    Raises
    ------
    OSError
        The cache folder cannot be written.
    """
    folder = Path(cache_dir) if cache_dir is not None else agent_cache_dir()
    path = folder / f"agent-{agent_version()}.pyz"
    if path.is_file():
        return str(path)
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".agent-", suffix=".pyz", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f, zipfile.ZipFile(f, "w", zipfile.ZIP_STORED) as zf:
            def add(name: str, data: bytes) -> None:
                zf.writestr(zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0)), data)

            add("__main__.py", f"from {AGENT_PACKAGE}.main import main\n\nmain()\n".encode())
            for rel, data in _agent_sources():
                name = f"{AGENT_PACKAGE}/{rel}"
                add(name, data)
                code = compile(data, name, "exec", dont_inherit=True)
                # PEP 552: magic, flags (hash-based, source unchecked), the source's hash, the code
                add(name[:-3] + ".pyc", importlib.util.MAGIC_NUMBER + (0b01).to_bytes(4, "little")
                    + importlib.util.source_hash(data) + marshal.dumps(code))
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return str(path)


def statx_shim_source() -> bytes:
    """The C source of the statx shim (``statx_shim.c``), as shipped in the package."""
    return resources.files(__name__).joinpath("statx_shim.c").read_bytes()
