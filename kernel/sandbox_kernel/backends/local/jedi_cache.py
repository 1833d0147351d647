"""The jedi cache local sandboxes start with: built once on the host, bound read-only (C16).

IPython completes with jedi, which parses the standard library's stubs and
sources with parso and keeps the parsed trees as pickles in ``~/.cache/jedi``.
A sandbox's home is a fresh tmpfs, so every kernel started with an empty cache
and its first completion took 2.0 s under gVisor (1.2 s under bubblewrap).

The host, which is trusted, builds that cache once per interpreter
(:func:`build`): it runs jedi *statically* on :data:`SNIPPETS` with the
sandbox's interpreter (jedi and parso parse files; the only modules imported
are the standard library's built-in ones jedi introspects).  Where matplotlib
is installed, the same build makes its font list (``matplotlib/``): matplotlib
scans the fonts a fresh sandbox would otherwise scan at its first plot (1.4 s
under gVisor).  That imports matplotlib on the host: the operator's install,
which the host's own Jupyter runs too, read-only to every sandbox, run with an
empty environment and home.  Nothing a sandbox wrote is ever read here.
The result is bound read-only into each sandbox at
:data:`~sandbox_kernel.guest.JEDI_SEED_PATH`; the inner kernel's bootstrap
(``guest/agent/interpreter/warm.py``, ``seed_jedi_cache``) links its entries into the
sandbox's own writable ``~/.cache/jedi``.  A writable cache is never shared:
pickles one sandbox wrote would be loaded by another, a channel for running
code across sandboxes (``docs/security.md``).

On disk, under ``<state base>/jedi-cache/<key>/`` (:func:`cache_dir`): one
immutable directory per build (``b-<time>-<pid>/``: parso's version
directories and ``manifest.json``, which names each pickle's source file) and
``current``, a symlink to the build in use.  A build is made by ``sandbox-kernel
install`` and, when missing or stale, by :func:`seed` in a background thread
at a kernel's start.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from .layout import state_base

log = logging.getLogger("sandbox_kernel.backends.local")

#: Standard-library modules whose first completion the cache makes fast.  No
#: third-party package: for those jedi would import their compiled modules, on
#: the host.
MODULES = (
    "argparse", "asyncio", "base64", "collections", "copy", "csv", "dataclasses", "datetime",
    "decimal", "enum", "functools", "glob", "hashlib", "inspect", "io", "itertools", "json",
    "logging", "math", "operator", "os", "pathlib", "pickle", "random", "re", "shutil",
    "statistics", "string", "subprocess", "sys", "tempfile", "textwrap", "threading", "time",
    "typing", "urllib.request", "uuid", "warnings", "zipfile",
)
#: What the build completes: builtins, then ``import m; m.`` for each of :data:`MODULES`.
SNIPPETS = ("str.", "[].", "{}.", "pri", *(f"import {m}; {m}." for m in MODULES))
#: Longest a build may take, seconds (measured: ~12 s for :data:`MODULES` on a
#: busy 2-core host).
BUILD_TIMEOUT_S = 300.0
#: A build no longer ``current`` is removed once it has been superseded this
#: long, seconds: a sandbox started before may still have it bound (a
#: sandbox's default ``lifetime_s`` is 24 h).
KEEP_SUPERSEDED_S = 2 * 24 * 3600.0
#: A stale build is rebuilt at most this often, seconds (a source whose
#: modification time lies in the future would otherwise rebuild it at every start).
REBUILD_INTERVAL_S = 3600.0

#: Run by the sandbox's interpreter (``-I``) in an empty ``XDG_CACHE_HOME``:
#: completes each snippet (argv[1:], JSON) and writes the manifest.
_BUILD_SCRIPT = r"""
import json, os, sys
from pathlib import Path
import jedi, parso, parso.cache
for code in json.loads(sys.argv[1]):
    try:
        for c in jedi.Interpreter(code, [{}]).complete()[:30]:
            c.type  # what IPython asks of each completion
    except Exception as err:  # a snippet jedi cannot handle here costs only its speed-up
        print(f"{code!r}: {err}", file=sys.stderr)
root = jedi.settings.cache_directory
files = {}
for grammar_hash, items in parso.cache.parser_cache.items():
    for path in items:
        if path is None:
            continue
        pickle = parso.cache._get_hashed_path(grammar_hash, path, cache_path=Path(root))
        if os.path.isfile(pickle):
            files[os.path.relpath(pickle, root)] = str(path)
# matplotlib's font list, where matplotlib is installed: a fresh sandbox would scan
# every font at its first plot (guest/agent/interpreter/warm.py, seed_matplotlib_fonts)
import importlib.util
mpl = None
if importlib.util.find_spec("matplotlib") is not None:
    os.environ["MPLCONFIGDIR"] = os.path.join(root, "matplotlib")
    try:
        import matplotlib, matplotlib.font_manager
        mpl = matplotlib.__version__
    except Exception as err:  # no font list costs only the first plot's speed
        print(f"matplotlib font list: {err}", file=sys.stderr)
with open(os.path.join(root, "manifest.json"), "w") as f:
    json.dump({"jedi": jedi.__version__, "parso": parso.__version__, "python": sys.version,
               "files": files, "matplotlib": mpl}, f, indent=0, sort_keys=True)
"""

_building: set[str] = set()
_building_lock = threading.Lock()


def cache_dir(python: str, root: Path | None = None) -> Path:
    """Where the builds for ``python`` live: ``<root>/<key>``, the key a hash of the
    interpreter's path (each venv has its own), its real path, size and modification
    time (a new Python, a new key).

    Parameters
    ----------
    root : Path, optional
        Defaults to ``<state base>/jedi-cache``.
    """
    real = os.path.realpath(python)
    st = os.stat(real)
    ident = f"{os.path.abspath(python)}\0{real}\0{st.st_size}\0{st.st_mtime_ns}"
    key = hashlib.sha256(ident.encode()).hexdigest()[:16]
    return Path(root or state_base() / "jedi-cache") / key


def stale_entries(build_dir: Path) -> int | None:
    """How many pickles of a build are older than their source (or lost it).

    Returns
    -------
    int or None
        None when the build has no readable manifest.
    """
    try:
        manifest = json.loads((build_dir / "manifest.json").read_text())
        files = manifest["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    stale = 0 if "matplotlib" in manifest else 1  # built before the font list was: rebuild
    for rel, src in files.items():
        try:
            if os.path.getmtime(src) > os.path.getmtime(build_dir / rel):
                stale += 1
        except OSError:
            stale += 1
    return stale


def build(python: str, root: Path | None = None, *, snippets: tuple[str, ...] = SNIPPETS,
          timeout_s: float = BUILD_TIMEOUT_S) -> Path | None:
    """Build the cache for ``python`` and make it ``current``; blocking.

    Runs ``python -I`` at the lowest CPU priority with an empty environment
    but ``XDG_CACHE_HOME`` (a new directory), then moves the result into
    place and removes builds superseded more than :data:`KEEP_SUPERSEDED_S`
    ago.  One build at a time per interpreter (an exclusive ``flock``);
    another process's build in progress makes this one return at once.

    Parameters
    ----------
    python : str
        The sandbox's interpreter (``LocalBackend.python``), with jedi installed.
    root : Path, optional
        See :func:`cache_dir`.
    snippets : tuple of str
        Code completed at its end.
    timeout_s : float
        Longest the build may run, seconds.

    Returns
    -------
    Path or None
        The new build's directory; None when another build was in progress
        or this one failed (logged: completions are then only slower).
    """
    base = cache_dir(python, root)
    base.mkdir(parents=True, exist_ok=True)
    for d in (base.parent, base):
        os.chmod(d, 0o755)  # noqa: S103 - the sandbox user (bubblewrap) reads the binds through them
    with open(base / ".lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return None
        t0 = time.monotonic()
        tmp = Path(tempfile.mkdtemp(prefix="build-", dir=base))
        try:
            proc = subprocess.run(
                [python, "-I", "-c", _BUILD_SCRIPT, json.dumps(list(snippets))],
                env={"XDG_CACHE_HOME": str(tmp), "HOME": str(tmp), "PATH": "/usr/bin:/bin"},
                cwd=str(tmp), capture_output=True, text=True, timeout=timeout_s,
                preexec_fn=lambda: os.nice(19), check=False)
            made = tmp / "jedi"
            if proc.returncode != 0 or not (made / "manifest.json").is_file():
                log.warning("jedi cache for %s not built (exit %s): %s", python, proc.returncode,
                            proc.stderr.strip()[-300:])
                return None
            for walked, _, files in os.walk(made):
                os.chmod(walked, 0o755)  # noqa: S103 - read-only cache the sandbox reads
                for f in files:
                    os.chmod(os.path.join(walked, f), 0o644)
            new = base / f"b-{time.time_ns()}-{os.getpid()}"
            os.rename(made, new)
            _make_current(base, new)
        except (OSError, subprocess.SubprocessError) as err:
            log.warning("jedi cache for %s not built: %s", python, err)
            return None
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        _remove_superseded(base)
        log.info("jedi cache for %s built in %.1f s: %s", python, time.monotonic() - t0, new)
        return new


def _make_current(base: Path, new: Path) -> None:
    """Point ``current`` at ``new`` atomically; mark the previous build superseded
    (its directory's modification time, for :func:`_remove_superseded`)."""
    old = _current(base)
    link = base / f".current-{os.getpid()}"
    with contextlib.suppress(FileNotFoundError):
        link.unlink()
    os.symlink(new.name, link)
    os.rename(link, base / "current")
    if old is not None and old != new:
        with contextlib.suppress(OSError):
            os.utime(old)


def _current(base: Path) -> Path | None:
    try:
        target = base / os.readlink(base / "current")
    except OSError:
        return None
    return target if target.is_dir() else None


def _remove_superseded(base: Path, keep_s: float = KEEP_SUPERSEDED_S) -> None:
    """Remove builds superseded more than ``keep_s`` seconds ago, and leftovers of
    builds whose process died (``build-*`` older than :data:`BUILD_TIMEOUT_S`)."""
    current = _current(base)
    now = time.time()
    for d in [*base.glob("b-*"), *base.glob("build-*")]:
        try:
            age = now - d.stat().st_mtime
            if d != current and age > (keep_s if d.name.startswith("b-") else BUILD_TIMEOUT_S):
                shutil.rmtree(d)
        except OSError:
            continue


def seed(python: str, root: Path | None = None, *, build_missing: bool = True) -> str | None:
    """The build to bind into a new sandbox for ``python``, or None.

    Called at every local sandbox's creation (``LocalSandbox.create``).  When
    there is no build, or the current one has stale entries (a package was
    upgraded), a build is started in a background thread (at most one per
    process; :func:`build` also excludes other processes); this sandbox gets
    the current build, if any (the bootstrap skips stale entries).

    Parameters
    ----------
    python : str
        The sandbox's interpreter.
    root : Path, optional
        See :func:`cache_dir`.
    build_missing : bool
        Start the background build when needed.

    Returns
    -------
    str or None
        Host path of the build directory.
    """
    try:
        base = cache_dir(python, root)
    except OSError:
        return None
    current = _current(base)
    stale = stale_entries(current) if current is not None else None
    if build_missing and (stale is None or (stale > 0 and _age_s(current) > REBUILD_INTERVAL_S)):
        _build_in_background(python, root)
    return str(current) if current is not None and stale is not None else None


def _age_s(build_dir: Path | None) -> float:
    try:
        return time.time() - build_dir.stat().st_mtime if build_dir is not None else float("inf")
    except OSError:
        return float("inf")


def _build_in_background(python: str, root: Path | None) -> None:
    key = f"{python}\0{root}"
    with _building_lock:
        if key in _building:
            return
        _building.add(key)

    def run() -> None:
        try:
            build(python, root)
        finally:
            with _building_lock:
                _building.discard(key)

    threading.Thread(target=run, name="jedi-cache-build", daemon=True).start()
