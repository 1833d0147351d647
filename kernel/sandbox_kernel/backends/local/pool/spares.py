"""Spare sandboxes on demand: a warm pool of one per user and policy, started by a kernel,
ended when its policy's kernels are gone.

With ``LocalBackend.spare_sandbox`` (on by default) a kernel whose sandbox nobody else could
serve (``network=none``, no workspace folder) takes a started sandbox from its policy's
**spare pool** instead of starting cold (or restoring its start template): the warm pool's own daemon
(:class:`.daemon.PoolDaemon`, size 1), detached from the kernels, on
``<state dir>/spares/<key>.sock`` where ``key`` is the pool's policy key
(:func:`.wire.policy_key`: every sandbox field, the runtime and the interpreter).  The take
costs 20-60 ms and the pool starts a replacement.  Nobody starts or stops anything by hand:

* **Started where it will be used.**  A cold kernel starts its policy's pool once it is
  ready if a kernel of that policy was seen within ``LocalBackend.spare_linger_s`` (the
  second notebook, a restart, an agent's next ``Sandbox()``), else once it has lived
  ``LocalBackend.spare_after_s``: a one-off kernel costs no spare.
* **One per key.**  A spare pool holds ``<key>.lock`` (``flock``) for its lifetime; a second
  one started for the same key (two kernels at once) finds it held and exits.
* **Ended with its kernels.**  Every kernel of the policy holds a shared ``flock`` on
  ``<key>.kernels`` while it has a sandbox (its process's end releases it, however it
  ends); a pool that finds no holder for ``spare_linger_s`` ends, and its sandbox with it.
  A pool whose spare nobody took for ``spare_idle_s`` ends too.
* **Out of the new kernel's way.**  The replacement starts ``refill_after_s`` (3 s) after
  a take, so the kernel that took the spare answers its first requests (the first
  completion: case C16) without a cold start beside it on the same cores; and as root
  the pool runs at nice :data:`SPARE_NICE`, so a spare starting meanwhile yields the cores
  to the kernels (the kernel that takes it sets its threads back to 0).
* **Bounded.**  At most ``LocalBackend.spare_pools_max`` per user: starting one more asks
  the least recently used to end (op ``stop``).
* **Counted, and first to go.**  A spare is a sandbox in this user's state base, so
  admission counts its memory for every later kernel; the pool itself passes admission
  before each start and waits (backing off) while the machine is full; and a kernel that
  admission refuses while spares are kept ends them (:func:`stop_all`) and asks again.
* **Never crosses a user or a policy.**  The directory is the user's own (0700), the socket
  0600 and checked by peer uid (``SO_PEERCRED``), the key is compared on every ``take``.
* **Visible.**  ``sandbox-kernel doctor`` lists the spare pools (:func:`report`);
  ``kernel_info["sandbox"]["pooled"]`` says a kernel took a spare; ``sandbox-kernel gc``
  ends them (:func:`stop_all`).

The pool is started with a clean environment (``PATH``, the state directory, the locale):
none of the kernel's variables, API keys or the frontend's signing key.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ....policy import Policy
from ..admission import Admission
from ..layout import state_base
from .daemon import PoolDaemon, kernels_alive
from .wire import close_fds, request

log = logging.getLogger("sandbox_kernel.spares")

#: Subdirectory of the state base holding the spare pools' sockets, locks and logs.
SPARES = "spares"
#: Environment variables a spare pool is started with (when set), besides the state directory
#: (``SANDBOX_KERNEL_STATE_DIR``, the kernel's own): nothing else of the kernel's.
KEPT_ENV = ("PATH", "LANG", "LC_ALL", "HOME", "TMPDIR")
#: The nice value a spare pool (as root) starts its sandboxes at: under contention the
#: kernels running and starting get the cores first; a kernel that takes a spare sets its
#: threads back to 0 (``LocalBackend.adopt``: they are in the sandbox's cgroup).
SPARE_NICE = 10


@dataclasses.dataclass(frozen=True)
class SpareSpec:
    """What a spare pool is started with (sent to it as JSON on its stdin).

    Attributes
    ----------
    key : str
        The policy key (:func:`.wire.policy_key`) its sandboxes must match.
    policy : dict
        The policy's sandbox fields (:meth:`Policy.sandbox_fields`).
    runtime, runsc_path, gvisor_platform, python : str
        As the ``LocalBackend`` options of the kernel that started it.
    admission : dict
        The kernel's :class:`..admission.Admission` fields.
    idle_s : float
        Seconds without a ``take`` after which it ends.
    linger_s : float
        Seconds without a kernel of its policy (:func:`hold`) after which it ends.
    refill_after_s : float
        Seconds after a take before the replacement starts.
    """

    key: str
    policy: dict
    runtime: str
    runsc_path: str
    gvisor_platform: str
    python: str
    admission: dict
    idle_s: float
    linger_s: float = 60.0
    refill_after_s: float = 3.0


def spares_dir() -> Path:
    """``<state dir>/spares`` (made 0700 if missing)."""
    d = state_base() / SPARES
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    return d


def socket_path(key: str) -> Path:
    """The socket of the spare pool for policy key ``key``."""
    return state_base() / SPARES / f"{key}.sock"


def kernels_path(key: str) -> Path:
    """The file every kernel of policy ``key`` holds a shared lock on (:func:`hold`)."""
    return state_base() / SPARES / f"{key}.kernels"


def hold(key: str, seen_within_s: float) -> tuple[int, bool]:
    """Count this process as a kernel of policy ``key`` for its spare pool: a shared
    ``flock`` on :func:`kernels_path`, held until :func:`release` (or the process's end).

    Returns
    -------
    (int, bool)
        The descriptor holding the lock, and whether a kernel of ``key`` was seen before
        it: one holds the lock now, or one started or ended within ``seen_within_s``
        seconds (the file's mtime, touched by each hold and release).

    Raises
    ------
    OSError
        The state directory or the file could not be made.
    """
    path = spares_dir() / f"{key}.kernels"
    try:
        seen = time.time() - path.stat().st_mtime <= seen_within_s or kernels_alive(path)
    except FileNotFoundError:
        seen = False
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        os.utime(fd)
    except OSError:
        os.close(fd)
        raise
    return fd, seen


def release(fd: int) -> None:
    """End :func:`hold` (the kernel's sandbox is gone); its policy's pool lingers from now."""
    with contextlib.suppress(OSError):
        os.utime(fd)
    os.close(fd)


def _held(lock: Path) -> bool:
    """Whether a live spare pool holds ``lock``."""
    try:
        fd = os.open(lock, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def _live() -> list[Path]:
    """The sockets of this user's live spare pools, least recently used first (a pool
    touches its socket on each hand-over)."""
    d = state_base() / SPARES
    if not d.is_dir():
        return []
    socks = [d / f"{lock.stem}.sock" for lock in d.glob("*.lock") if _held(lock)]

    def used(p: Path) -> float:
        try:
            return p.stat().st_mtime
        except OSError:
            return 0.0
    return sorted(socks, key=used)


def _stop(sock: Path) -> bool:
    with contextlib.suppress(OSError, ValueError):
        answer, fds = request(sock, {"op": "stop"}, 5.0)
        close_fds(fds)
        return bool(answer.get("ok"))
    return False


def ensure(spec: SpareSpec, max_pools: int) -> bool:
    """Start the spare pool of ``spec.key`` unless one runs; first end the least recently
    used beyond ``max_pools - 1``.  Returns whether one was started.

    Raises
    ------
    OSError
        The state directory or the process could not be made.
    """
    d = spares_dir()
    if _held(d / f"{spec.key}.lock"):
        return False
    live = _live()
    for sock in live[:max(0, len(live) - (max_pools - 1))]:
        log.info("ending the least recently used spare pool %s (spare_pools_max=%d)", sock.stem, max_pools)
        _stop(sock)
    env = {k: os.environ[k] for k in KEPT_ENV if k in os.environ}
    env["SANDBOX_KERNEL_STATE_DIR"] = str(state_base())
    with open(d / f"{spec.key}.log", "ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "sandbox_kernel.backends.local.pool.spares"],
                                stdin=subprocess.PIPE, stdout=out, stderr=subprocess.STDOUT, env=env,
                                cwd="/", start_new_session=True, close_fds=True)
    assert proc.stdin is not None
    proc.stdin.write(json.dumps(dataclasses.asdict(spec)).encode())
    proc.stdin.close()
    return True


def report() -> list[dict[str, Any]]:
    """Each live spare pool's status (the pool's ``status`` answer: ``key``, ``runtime``,
    ``ready``, ``starting``, ``handed``, ``pid``, ``idle_s`` (seconds since a sandbox was
    last taken), ``container_ids`` and ``pids`` of its ready sandboxes, ``stopping``), for
    ``sandbox-kernel doctor``.  A pool that holds its lock but no longer answers is
    stopping (removing its sandboxes: it unlinks its socket first) and is listed with
    ``stopping`` true and only its ``key``: it is not over until its process is."""
    out = []
    for sock in _live():
        answer: dict[str, Any] = {}
        with contextlib.suppress(OSError, ValueError):
            answer, fds = request(sock, {"op": "status"}, 5.0)
            close_fds(fds)
        if answer.get("ok"):
            out.append({**{k: answer.get(k) for k in ("key", "runtime", "ready", "starting", "handed", "pid",
                                                      "idle_s", "container_ids", "pids")}, "stopping": False})
        else:
            out.append({"key": sock.stem, "runtime": None, "ready": 0, "starting": 0, "handed": None,
                        "pid": None, "idle_s": None, "container_ids": [], "pids": [], "stopping": True})
    return out


def stop_all(wait_s: float = 30.0) -> int:
    """End every spare pool of this user (``sandbox-kernel gc``) and wait up to ``wait_s``
    for them to have removed their sandboxes and exited; how many were asked."""
    asked = sum(_stop(sock) for sock in _live())
    deadline = time.monotonic() + wait_s
    while _live() and time.monotonic() < deadline:
        time.sleep(0.1)
    return asked


def main() -> int:
    """A spare pool's process: read its :class:`SpareSpec`, hold its lock, run the pool."""
    import asyncio

    logging.basicConfig(stream=sys.stderr, level=logging.INFO,
                        format="%(asctime)s [sandbox-kernel spare pool %(levelname)s] %(message)s")
    spec = SpareSpec(**json.loads(sys.stdin.read()))
    d = spares_dir()
    lock = os.open(d / f"{spec.key}.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        log.info("a spare pool for %s runs already", spec.key)
        return 0
    if os.geteuid() == 0:  # background work: the spares start below the kernels (renice(0) on take)
        os.nice(SPARE_NICE)
    fields: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in spec.policy.items()}
    daemon = PoolDaemon(Policy(**fields), 1, d / f"{spec.key}.sock", runtime=spec.runtime,
                        python=spec.python, runsc_path=spec.runsc_path, gvisor_platform=spec.gvisor_platform,
                        idle_exit_s=spec.idle_s, admission=Admission(**spec.admission),
                        kernels=(d / f"{spec.key}.kernels", spec.linger_s), refill_after_s=spec.refill_after_s)
    if daemon.key != spec.key:  # the kernel's key and the pool's must be one, or no take ever matches
        log.error("policy key %s is not the kernel's %s: not started", daemon.key, spec.key)
        return 1
    try:
        asyncio.run(daemon.run())
    finally:
        with contextlib.suppress(OSError):
            (d / f"{spec.key}.lock").unlink()
        os.close(lock)
    return 0


if __name__ == "__main__":
    sys.exit(main())
