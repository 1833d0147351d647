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

Templates live in :func:`base_dir`, on disk by default so that they outlast a
reboot (``/var/cache/sandbox-kernel/templates`` as root; the first kernel of a
policy after a boot restores instead of starting cold), 0700, the proxy's user:
``<key>/image/`` (the checkpoint) and ``<key>/ready.bin``, whose mtime is the
template's last use.  A template is never written by the sandbox: runsc writes the
image from the host, and ``ready.bin`` is what the proxy read before any user code ran.

At most ``LocalBackend.start_templates_max`` are kept: publishing one removes the
least recently used beyond that (:func:`prune`).  A restore never reads the
template's directory itself: its image files are hard-linked first into
``<base>/.linked/<container id>/`` (:func:`link_image`, the template's own file
system), which the sandbox's removal deletes (:func:`release`), so a template
removed meanwhile (``prune``, ``gc --templates``) cannot fail a restore in progress;
one removed before the links are made means a cold start.  Admission counts the
templates' blocks as memory where they lie on a tmpfs (:func:`held_mib`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import json
import logging
import os
import shutil
import stat
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ... import guest
from ...errors import SandboxKernelError
from ...protocol import FrameDecoder, encode_frame
from ..base import interpreter_env
from .layout import state_base
from .pool.wire import policy_key

if TYPE_CHECKING:
    from ...policy import Policy
    from .layout import HostLayout
    from .runsc import RunscChoice

#: Subdirectory of the state base holding the templates when ``SANDBOX_KERNEL_STATE_DIR`` is set.
TEMPLATES = "templates"
#: Subdirectory of :func:`base_dir` holding the images linked for sandboxes restored from a template.
LINKED = ".linked"
#: Where root's templates are kept (on disk: they outlast a reboot, unlike ``/run``).
ROOT_BASE = Path("/var/cache/sandbox-kernel/templates")
#: Longest a restored sandbox's agent may take to confirm its reseed (:func:`reseed`), seconds.
RESEED_WAIT_S = 15.0
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
    """Where this user's start templates are kept.

    ``SANDBOX_KERNEL_TEMPLATE_DIR`` if set; else ``<state dir>/templates`` when
    ``SANDBOX_KERNEL_STATE_DIR`` is set (a state directory chosen on purpose keeps all
    of the sandboxes' files together); else on disk, so that the first kernel of a
    policy after a reboot restores its template: as root :data:`ROOT_BASE`, as another
    user ``$XDG_CACHE_HOME/sandbox-kernel/templates`` (``~/.cache`` by default).  Not
    made here (:func:`make_dir` makes it, 0700).
    """
    if explicit := os.environ.get("SANDBOX_KERNEL_TEMPLATE_DIR"):
        return Path(explicit)
    if os.environ.get("SANDBOX_KERNEL_STATE_DIR"):
        return state_base() / TEMPLATES
    if os.geteuid() == 0:
        return ROOT_BASE
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "sandbox-kernel" / "templates"


@functools.cache
def _agent_hash() -> str:
    """SHA-256 of the artefact shipped into sandboxes, the agent's zipapp (read once per process)."""
    return hashlib.sha256(Path(guest.agent_archive()).read_bytes()).hexdigest()


def base_key(policy: Policy, runtime_key: str, choice: RunscChoice | None, python: str) -> str | None:
    """A start template's key before the layout (:func:`template_key`), or None when the
    kernel cannot use one: not gVisor (``choice`` None), a runsc older than 2023 (Debian
    12's: its restore of a template into another sandbox failed the first cell; told by
    its checkpoint lacking ``--compression``), egress (its socket is the kernel's), or a
    workspace folder.  The caller checks the option and that checkpoints work at all."""
    if choice is None or not choice.compression or policy.network != "none" or policy.workspace != "none":
        return None
    runsc = [choice.path, choice.version, choice.platform, choice.statx_shim]
    # and the environment this code gives the sandbox's processes: a template made by a
    # version that set others must not be resumed with them
    env = sorted(interpreter_env(policy).items())
    return policy_key(policy, f"{runtime_key}:{runsc}:{env}", python)


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
    base.mkdir(mode=0o700, parents=True, exist_ok=True)
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


def link_image(found: Template, container_id: str, owner: Path) -> Path:
    """Hard-link the files of ``found``'s image into ``<base>/.linked/<container_id>/image``
    (the template's own file system, whatever the state directory's) and return that.
    The links keep the image's data while a restore reads it and while the sandbox
    lives, whatever happens to the template; :func:`release` removes them.

    Parameters
    ----------
    found : Template
        What :func:`find` returned.
    container_id : str
        The restoring sandbox's container id.
    owner : Path
        Its state directory: the links are stale once that is gone (:func:`prune`).

    Raises
    ------
    OSError
        The template was removed before its files were linked (then start cold).
    """
    home = base_dir() / LINKED / container_id
    home.mkdir(mode=0o700, parents=True)
    (home / "owner").write_text(str(owner))
    dest = home / "image"
    try:
        link_tree(found.image, dest)
    except OSError:
        release(container_id)
        raise
    return dest


def link_tree(src: Path, dest: Path) -> None:
    """Make ``dest`` (0700, new) a tree of hard links to the files below ``src`` (an
    image: the same file system).  Also for a fork's hand-offs (:mod:`.forks`).

    Raises
    ------
    OSError
        A link failed (another file system), or ``src`` holds no file (gone).
    """
    dest.mkdir(mode=0o700)
    for root, dirs, files in os.walk(src):
        rel = Path(root).relative_to(src)
        for d in dirs:
            (dest / rel / d).mkdir(mode=0o700)
        for f in files:
            os.link(Path(root) / f, dest / rel / f)
    if not any(dest.iterdir()):
        raise FileNotFoundError(f"image {src} is gone")


def release(container_id: str) -> None:
    """Remove the image linked for the sandbox ``container_id`` (its teardown); nothing
    if it was not restored from a template."""
    shutil.rmtree(base_dir() / LINKED / container_id, ignore_errors=True)


def _release_stale() -> None:
    """Remove linked images whose sandbox's state directory is gone (its proxy died
    unreaped, or the machine rebooted with the state directory on a tmpfs)."""
    linked = base_dir() / LINKED
    for home in linked.iterdir() if linked.is_dir() else ():
        try:
            owner = Path((home / "owner").read_text())
        except OSError:
            owner = None
        if owner is None or not owner.is_dir():
            shutil.rmtree(home, ignore_errors=True)


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
    _release_stale()
    by_use = sorted(_templates(), key=last_use, reverse=True)
    return [d.name for d in by_use[max(0, keep):] if _remove(d)]


def allocated_bytes(path: Path) -> int:
    """Blocks allocated to the files below ``path``, bytes, each file once however many
    links it has there (0 if it is not there)."""
    total, seen = 0, set()
    for root, _dirs, files in os.walk(path):
        for f in files:
            with contextlib.suppress(OSError):
                st = os.lstat(os.path.join(root, f))
                if (st.st_dev, st.st_ino) not in seen:
                    seen.add((st.st_dev, st.st_ino))
                    total += st.st_blocks * 512
    return total


#: Folders beside the templates holding images of live kernels: this user's snapshots and fork
#: hand-offs (:mod:`.snapshots`, :mod:`.forks`) and, as root, the sandbox service's (:mod:`.service.copies`).
COPIES = ("snapshots", "service-snapshots")


def held_mib() -> int:
    """Blocks allocated to this user's templates and the images linked from them, MiB
    (what they hold in memory when :func:`base_dir` is a tmpfs)."""
    return allocated_bytes(base_dir()) // (1 << 20)


def report() -> dict:
    """What this user's templates hold, for ``sandbox-kernel doctor``.

    Returns
    -------
    dict
        ``dir`` (str), ``count`` (int), ``mib`` (int: blocks allocated, MiB) and
        ``in_use`` (int: sandboxes restored from one, alive or unreaped).
    """
    linked = base_dir() / LINKED
    return {"dir": str(base_dir()), "count": len(_templates()), "mib": held_mib(),
            "in_use": sum(1 for _ in linked.iterdir()) if linked.is_dir() else 0}


def remove_all() -> int:
    """Remove every template of this user (``sandbox-kernel gc --templates``); how many."""
    base = base_dir()
    n = sum(_remove(d) for d in _templates())
    for d in base.glob(".*") if base.is_dir() else ():  # unfinished or half-removed
        if d.name != LINKED:  # those of live sandboxes stay until their teardown
            shutil.rmtree(d, ignore_errors=True)
    _release_stale()
    return n


async def make(capture: bytes, key: str, name: str, snapshot: Callable[[Path], Awaitable[None]], keep: int,
               log: logging.Logger) -> None:
    """Make a start template from a sandbox just ready, running on, before any request
    reaches it.  Best effort: a failure is logged and the kernel goes on without one.

    Parameters
    ----------
    capture : bytes
        The agent's output so far (its frames up to ``ready``: :func:`ready_frames`).
    key : str
        The template's key (:func:`template_key`).
    name : str
        The sandbox's name, for the log.
    snapshot : callable
        ``await snapshot(image_dir)`` checkpoints the sandbox into ``image_dir``.
    keep : int
        How many templates to keep (:func:`prune`, least recently used first).
    log : logging.Logger
        Where the outcome is told.
    """
    ready = ready_frames(capture)
    if ready is None:
        return
    try:
        new = await asyncio.to_thread(make_dir)
        try:
            await snapshot(new / "image")
            await asyncio.to_thread(publish, new, key, ready)
            removed = await asyncio.to_thread(prune, keep)
        except BaseException:
            await asyncio.to_thread(shutil.rmtree, new, True)
            raise
    except (OSError, SandboxKernelError) as err:
        log.warning("no start template made from sandbox %s: %s", name, err)
        return
    log.info("start template %s made from sandbox %s%s", key, name,
             f"; least recently used removed (start_templates_max={keep}): {', '.join(removed)}" if removed else "")


async def reseed(stdout: asyncio.StreamReader, write: Callable[[bytes], Awaitable[None]],
                 log: logging.Logger, name: str) -> bytes:
    """Make an interpreter just restored from a start template its own, before any
    request reaches it.

    The agent reseeds the interpreter (``reseed``: its generators are the
    template's) and warms its completer again, as a cold start does before
    ``ready``: a restored process faults in every page it touches, and the first
    completion took up to 1.7 s under load without it (C16).  The agent's ``pong``
    to the ``ping`` sent after says both are done.

    Parameters
    ----------
    stdout : asyncio.StreamReader
        The agent's output, not yet read by anyone else.
    write : callable
        Writes bytes to the agent (the backend's ``write``).
    log : logging.Logger
        Where a reseed unconfirmed after :data:`RESEED_WAIT_S` seconds is told; the
        kernel goes on (a sandbox that died meanwhile is found by the relay).
    name : str
        The sandbox's name, for that log line.

    Returns
    -------
    bytes
        What the agent wrote meanwhile, for the proxy to read after the replayed frames.
    """
    await write(encode_frame({"op": "reseed"}))
    await write(encode_frame({"op": "ping"}))
    decoder, got = FrameDecoder(), bytearray()
    deadline = time.monotonic() + RESEED_WAIT_S
    try:
        while (left := deadline - time.monotonic()) > 0:
            data = await asyncio.wait_for(stdout.read(1 << 20), left)
            if not data:
                break
            got += data
            if any(f.get("op") == "pong" for f in decoder.feed(data)):
                break
    except TimeoutError:
        log.warning("sandbox %s, restored from a start template, did not confirm its reseed in %.0f s",
                    name, RESEED_WAIT_S)
    return bytes(got)
