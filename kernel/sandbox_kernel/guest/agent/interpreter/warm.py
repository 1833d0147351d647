"""What the inner kernel does before its first request so the user does not wait for it:
shared lazy imports, a throw-away traceback, the host-built jedi cache and matplotlib font
list, and ``%pip``'s explanation.

Runs inside the user's interpreter.
"""

from __future__ import annotations

import json
import os
import sys
import time

#: The host-built jedi cache, read-only, where local sandboxes have one
#: (``sandbox_kernel.guest.JEDI_SEED_PATH``; :func:`seed_jedi_cache`).
JEDI_SEED_DIR = "/opt/sandbox-kernel/jedi-cache"

def import_shared_lazy_modules() -> None:
    """Import, on the kernel's main thread, what :func:`warm_tracebacks` and the
    first requests would otherwise import concurrently.

    Two threads importing pygments for the first time break it: the main
    thread's first ``inspect_request`` failed with ``ImportError: cannot import
    name 'PythonLexer' from 'pygments.lexers'`` while the traceback warm-up
    imported ``pygments.formatters``, and ipykernel then sends no
    ``inspect_reply`` at all (seen 1 start in 8 under gVisor).  Measured cost:
    0.06-0.10 s under gVisor.
    """
    try:
        import pygments.formatters.html
        import pygments.lexers.python
        import pygments.styles.default  # noqa: F401
        import stack_data  # noqa: F401
        from IPython.core import oinspect, ultratb  # noqa: F401
    except ImportError:  # an IPython without them imports nothing lazily either
        pass


def warm_tracebacks() -> None:
    """Format one throw-away traceback in the background once the shell exists.

    The first traceback of a process costs about 1.2 s under gVisor: IPython's
    ``VerboseTB`` calls ``inspect.getmodule``, which ``realpath``s the file of
    every loaded module (thousands of slow ``lstat`` calls), and imports
    ``stack_data``.  Without this, the first interrupt or timeout of a session
    (C01, C02, C06) ends that much late.  A private ``VerboseTB`` keeps the
    shell's own formatter untouched.
    """
    try:
        from IPython import get_ipython
        from IPython.core import ultratb

        for _ in range(600):
            if get_ipython() is not None:
                break
            time.sleep(0.05)
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            ultratb.VerboseTB().structured_traceback(*sys.exc_info())
    except Exception:  # noqa: BLE001 - best effort; the first traceback is just slower
        pass


def explain_pip(shell) -> None:
    """``%pip install X`` for a package that is not there: say why it cannot work
    here (no network, read-only environment) and what to run on the host.  Not
    installed with egress (``SANDBOX_KERNEL_EGRESS``), where pip installs into the
    scratch space."""
    if shell is None:
        return
    try:  # IPython loads these lazily; load them now and wrap the instance's method
        from IPython.core.magics.packaging import PackagingMagics

        if "PackagingMagics" not in shell.magics_manager.registry:
            shell.register_magics(PackagingMagics)
        orig = shell.magics_manager.registry["PackagingMagics"].pip
    except (ImportError, KeyError, AttributeError):
        return

    def pip(line: str):
        args = line.split()
        if "install" in args:
            from importlib import metadata

            missing = []
            for arg in args[args.index("install") + 1:]:
                name = arg.split("[")[0].split(";")[0]
                for sep in "<>=!~":
                    name = name.split(sep)[0]
                if arg.startswith("-") or not name:
                    continue
                try:
                    metadata.distribution(name)
                except metadata.PackageNotFoundError:
                    missing.append(arg)
            if missing:
                print("sandbox-kernel: this sandbox has no network and a read-only Python "
                      f"environment. Install on the host instead: {sys.prefix}/bin/pip install "
                      f"{' '.join(missing)} -- then restart the kernel.", file=sys.stderr)
        return orig(line)

    shell.magics_manager.magics["line"]["pip"] = pip


def seed_jedi_cache(seed: str = JEDI_SEED_DIR) -> int:
    """Link the host-built jedi cache's entries into this user's own jedi cache.

    IPython's completer (jedi) keeps parsed stubs and sources as pickles in
    ``~/.cache/jedi``; the sandbox's home starts empty, so the first completion
    of a session parsed the standard library again (2.0 s under gVisor, C16).
    The host builds the cache once and binds it read-only at ``seed``, with
    ``manifest.json`` naming each pickle's source file.  Each entry whose
    source is not newer is symlinked into the writable cache, where parso
    reads it and writes new entries of its own.  A stale entry is left out:
    parso would re-parse it and write through the link into the read-only
    seed.  The parso lock file is created so that parso does not prune the
    links at its first save (it removes entries unread for 30 days).

    Parameters
    ----------
    seed : str
        The read-only cache directory; absent outside local sandboxes.

    Returns
    -------
    int
        How many entries were linked.
    """
    try:
        with open(os.path.join(seed, "manifest.json")) as f:
            files = json.load(f)["files"]
        items = list(files.items())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return 0
    cache = os.path.expanduser(os.path.join(os.environ.get("XDG_CACHE_HOME") or "~/.cache", "jedi"))
    linked = 0
    for rel, src in items:
        rel = os.path.normpath(str(rel))
        if rel.startswith(("/", "..")) or not isinstance(src, str):
            continue
        target, link = os.path.join(seed, rel), os.path.join(cache, rel)
        try:
            if os.path.getmtime(src) > os.path.getmtime(target):
                continue
            os.makedirs(os.path.dirname(link), exist_ok=True)
            os.symlink(target, link)
            linked += 1
        except OSError:  # gone, or linked by an earlier interpreter of this sandbox
            continue
    try:
        with open(os.path.join(cache, "PARSO-CACHE-LOCK"), "a"):
            pass
    except OSError:
        pass
    return linked


def seed_matplotlib_fonts(seed: str = JEDI_SEED_DIR) -> bool:
    """Copy the host-built matplotlib font list into this sandbox's ``$MPLCONFIGDIR``.

    matplotlib scans every font on its first use and keeps the result in
    ``$MPLCONFIGDIR/fontlist-v<version>.json``; in a fresh sandbox that scan took
    1.4 s of a kernel's first plot under gVisor, and past 5 s (a loaded host)
    matplotlib also prints "Matplotlib is building the font cache" into the cell,
    which a stock kernel with its cache does not.  The host builds the list with
    the jedi cache (``seed/matplotlib/``); a copy, not a link, since matplotlib
    rewrites the file when a font it names is gone.  An existing file is kept.

    Returns
    -------
    bool
        Whether a font list was copied.
    """
    target_dir = os.environ.get("MPLCONFIGDIR")
    try:
        names = [n for n in os.listdir(os.path.join(seed, "matplotlib")) if n.startswith("fontlist-")]
    except OSError:
        return False
    if not target_dir or not names:
        return False
    copied = False
    for name in names:
        target = os.path.join(target_dir, name)
        if os.path.exists(target):
            continue
        try:
            os.makedirs(target_dir, mode=0o700, exist_ok=True)
            with open(os.path.join(seed, "matplotlib", name), "rb") as src, \
                    open(target + ".part", "wb") as dst:
                dst.write(src.read(8 << 20))
            os.replace(target + ".part", target)
            copied = True
        except OSError:
            continue
    return copied
