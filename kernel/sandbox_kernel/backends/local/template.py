"""Start templates: a new gVisor kernel restored from a checkpoint of a fresh one.

A cold start spends most of its time in the sandbox importing ipykernel and
IPython through gVisor (``docs/benchmarks.md``).  With
``LocalBackend.start_template`` the first kernel of a policy is checkpointed the
moment its agent reports ``ready`` (``runsc checkpoint --leave-running``: it
pauses about 0.1 s and goes on), before any request reaches it, so the image
holds a freshly started interpreter and nothing a user ran.  Later kernels of
the same policy, interpreter, runsc, agent and jedi cache restore that image
(``runsc restore``) into their own sandbox: their own state directory, bundle,
mounts, cgroup and container id; the agent's output up to its ``ready`` frame,
kept beside the image, is replayed to the new proxy as if the agent had just
sent it.

Every restored kernel starts from the same memory, so what the interpreter drew
at start is the same in each: the proxy then asks the agent to reseed it
(``reseed``: the inner kernel's ``random``, numpy's legacy generator if loaded
and ``tempfile``'s names, from ``os.urandom``), before the first request.
``hash()`` of strings keeps the template's ``PYTHONHASHSEED``, shared by the
kernels of one template (``docs/security.md``).

Templates live in ``<state dir>/templates/<key>/`` (0700, the proxy's user):
``image/`` (the checkpoint) and ``ready.bin``, whose mtime is the template's last
use.  A template is never written by the sandbox: runsc writes the image from the
host, and ``ready.bin`` is what the proxy read before any user code ran.

At most ``LocalBackend.start_templates_max`` are kept: publishing one removes the
least recently used beyond that (:func:`prune`).  A restore never reads the
template's directory itself: its image files are hard-linked into the restoring
sandbox's state directory first (:func:`link_image`), so a template removed
meanwhile (``prune``, ``gc --templates``) cannot fail a restore in progress; one
removed before the links are made means a cold start.  Admission counts the
templates' blocks as memory where they lie on a tmpfs (:func:`held_mib`).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import shutil
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ... import guest
from .layout import state_base

if TYPE_CHECKING:
    from .layout import HostLayout

#: Subdirectory of the state base holding the templates.
TEMPLATES = "templates"
#: Longest agent output kept up to its ready frame, bytes.
MAX_READY_BYTES = 1 << 20


@dataclass(frozen=True)
class Template:
    """A start template found on disk.

    Attributes
    ----------
    image : Path
        The checkpoint image directory (``runsc restore --image-path``).
    ready : bytes
        The agent's frames up to and including ``ready``, to replay.
    """

    image: Path
    ready: bytes


def base_dir() -> Path:
    """``<state dir>/templates``."""
    return state_base() / TEMPLATES


@functools.cache
def _agent_hash() -> str:
    """SHA-256 of the agent shipped into sandboxes (read once per process)."""
    return hashlib.sha256(Path(guest.__file__).with_name("agent.py").read_bytes()).hexdigest()


def template_key(base_key: str, layout: HostLayout) -> str:
    """The key of the template for a sandbox.

    Parameters
    ----------
    base_key : str
        What the backend knows before the sandbox's layout: policy, runtime
        (runsc binary, version, platform) and interpreter
        (``LocalBackend._template_base_key``).
    layout : HostLayout
        The sandbox's mounts: its jedi cache build, and the environment directories
        whose ``site-packages`` change (``st_mtime_ns``) when a package is installed,
        upgraded or removed, so a template never resumes code older than the files.
    """
    packages = {}
    for prefix in layout.ro_dirs:
        for sp in sorted(Path(prefix).glob("lib/python*/site-packages")):
            with contextlib.suppress(OSError):
                packages[str(sp)] = sp.stat().st_mtime_ns
    key = {"base": base_key, "agent": _agent_hash(), "jedi_seed": layout.jedi_seed, "packages": packages}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:32]


def find(key: str) -> Template | None:
    """The template for ``key``, or None (absent, incomplete, or not this user's own)."""
    d = base_dir() / key
    try:
        st = os.lstat(d)
        ready = (d / "ready.bin").read_bytes()
    except OSError:
        return None
    if (not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077
            or not ready or len(ready) > MAX_READY_BYTES or not (d / "image").is_dir()):
        return None
    return Template(image=d / "image", ready=ready)


def ready_frames(output: bytes) -> bytes | None:
    """The agent's output up to and including its ``ready`` frame (one JSON line each),
    or None when ``output`` holds no complete ``ready`` frame."""
    start = 0
    while (end := output.find(b"\n", start)) >= 0:
        try:
            frame = json.loads(output[start:end])
        except ValueError:
            return None
        if isinstance(frame, dict) and frame.get("op") == "ready":
            return output[:end + 1]
        start = end + 1
    return None


def make_dir() -> Path:
    """A new, empty directory to write a template into (``<templates>/.new-*``, 0700)."""
    base = base_dir()
    base.mkdir(mode=0o700, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=".new-", dir=base))


def publish(new: Path, key: str, ready: bytes) -> None:
    """Write ``ready.bin`` into ``new`` (holding ``image/``) and rename it to the key's
    place; when another proxy published one first, ``new`` is removed."""
    (new / "ready.bin").write_bytes(ready)
    try:
        os.rename(new, base_dir() / key)
    except OSError:  # ENOTEMPTY/EEXIST: one is there already
        shutil.rmtree(new, ignore_errors=True)


def touch(key: str) -> None:
    """Record a use of the template ``key`` (``ready.bin``'s mtime, read by :func:`prune`)."""
    with contextlib.suppress(OSError):
        os.utime(base_dir() / key / "ready.bin")


def link_image(found: Template, dest: Path) -> Path:
    """Hard-link the files of ``found``'s image into ``dest`` (a new directory, on the same
    file system: both are under the state base) and return it.  The links keep the image's
    data while a restore reads it, whatever happens to the template.

    Raises
    ------
    OSError
        The template was removed before its files were linked (then start cold).
    """
    dest.mkdir(mode=0o700)
    for root, dirs, files in os.walk(found.image):
        rel = Path(root).relative_to(found.image)
        for d in dirs:
            (dest / rel / d).mkdir(mode=0o700)
        for f in files:
            os.link(Path(root) / f, dest / rel / f)
    if not any(dest.iterdir()):
        raise FileNotFoundError(f"start template image {found.image} is gone")
    return dest


def _templates() -> list[Path]:
    base = base_dir()
    return [d for d in base.glob("*") if not d.name.startswith(".")] if base.is_dir() else []


def _remove(d: Path) -> bool:
    """Remove a template directory: renamed out of :func:`find`'s reach first, so a
    concurrent ``find`` sees the whole template or none.  False if another got there first."""
    gone = d.with_name(f".old-{os.getpid()}-{d.name}")
    try:
        os.rename(d, gone)
    except OSError:
        return False
    shutil.rmtree(gone, ignore_errors=True)
    return True


def prune(keep: int) -> list[str]:
    """Remove the least recently used templates beyond ``keep`` (by :func:`touch`'s time);
    the keys removed."""
    def last_use(d: Path) -> float:
        try:
            return (d / "ready.bin").stat().st_mtime
        except OSError:
            return 0.0
    by_use = sorted(_templates(), key=last_use, reverse=True)
    return [d.name for d in by_use[max(0, keep):] if _remove(d)]


def allocated_bytes(path: Path) -> int:
    """Blocks allocated to the files below ``path``, bytes (0 if it is not there)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, f)).st_blocks * 512
    return total


def held_mib(state_base: Path) -> int:
    """Blocks allocated to the templates under ``state_base`` (its ``templates``), MiB."""
    return allocated_bytes(state_base / TEMPLATES) // (1 << 20)


def report() -> dict:
    """What this user's templates hold, for ``sandbox-kernel doctor``.

    Returns
    -------
    dict
        ``dir`` (str), ``count`` (int) and ``mib`` (int: blocks allocated, MiB).
    """
    return {"dir": str(base_dir()), "count": len(_templates()), "mib": held_mib(state_base())}


def remove_all() -> int:
    """Remove every template of this user (``sandbox-kernel gc --templates``); how many."""
    base = base_dir()
    n = sum(_remove(d) for d in _templates())
    for d in base.glob(".*") if base.is_dir() else ():  # unfinished or half-removed
        shutil.rmtree(d, ignore_errors=True)
    return n
