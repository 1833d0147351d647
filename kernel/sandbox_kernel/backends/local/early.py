"""The kernel's first sandbox, started beside the proxy's own start.

A new proxy process spends 0.3-0.9 s importing ipykernel, jupyter_client and zmq before
:meth:`.LocalBackend.start` runs, and only then starts the sandbox, whose interpreter
needs about as long again.  Where neither a spare sandbox nor a start template is there
to take (the first kernel of a bubblewrap policy after a boot), that is the whole wait.
So ``python -m sandbox_kernel`` calls :func:`begin` before those imports: a thread reads
the kernel's options from its command line, builds the same :class:`.LocalBackend` the
kernel will, and starts the sandbox with the warm pool's own code
(:func:`.pool.daemon.launch_for_handover`); the proxy's imports run meanwhile.  Once the
kernel's backend starts, it **claims** that sandbox (:func:`claim`) by its policy key
(:func:`.pool.wire.policy_key`) and adopts it as it adopts a pooled one
(:meth:`.LocalBackend.adopt`).  A sandbox whose key differs from the kernel's (options
from a configuration file the thread does not read) is never adopted: it is removed, and
the kernel starts its own.  One that nobody claims is removed once the kernel's first
start took another way (:func:`release_unclaimed`), or after :data:`UNCLAIMED_S`; if the
proxy dies first, its watchdog reaps it.

Only where the sandbox is the kernel's alone and nothing faster is at hand: the local
backend, ``network=none`` and ``workspace=none`` (an egress socket or a workspace is made
by the kernel), no start template to restore or to make (gVisor's default: a restore is
faster; a fork restores its source's image), no warm pool or spare pool answering for the
policy, no sandbox service in use
(a non-root user with one), a command line of ``-f <file>`` and ``--Class.name=value``
options only, and no configuration file of the proxy's application where IPython reads
them (:func:`config_files`; so the thread's options are the kernel's).  ``SANDBOX_KERNEL_EARLY_START=0`` in the
kernel's environment turns it off.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: Set to ``0`` in a kernel's environment (kernelspec ``env``) to start no sandbox early.
DISABLE_ENV = "SANDBOX_KERNEL_EARLY_START"
#: Seconds :func:`claim` waits for a launch still under way (normally a few ms: it
#: started before the proxy's imports) before the kernel starts its own.
CLAIM_WAIT_S = 30.0
#: Seconds a sandbox started early waits to be claimed before it is removed (the
#: kernel's start asks within a second or two of its imports).
UNCLAIMED_S = 120.0
#: The proxy application's configuration files (``<name>.py`` or ``.json``, :func:`config_files`).
CONFIG_NAMES = ("ipython_config", "sandbox_kernel_config")

log = logging.getLogger("sandbox_kernel.early")


@dataclass
class EarlyStart:
    """One early launch: the thread's result, read by the kernel's backend.

    Attributes
    ----------
    key : str or None
        The started sandbox's policy key; None when nothing was started.
    info : dict
        ``LocalSandbox.handoff_info()`` plus ``started_at`` (:meth:`.LocalBackend.adopt`).
    fds : dict of str to int
        ``stdin``, ``stdout``, ``stderr``, ``watchdog``, ``pidfd``: owned by whoever claims.
    reason : str
        Why nothing was started (or why the start failed), for the kernel's log.
    started_s : float
        Seconds from :func:`begin` to the sandbox's runtime process running.
    """

    key: str | None = None
    info: dict[str, Any] = field(default_factory=dict)
    fds: dict[str, int] = field(default_factory=dict)
    reason: str = ""
    started_s: float = 0.0
    done: threading.Event = field(default_factory=threading.Event)
    #: "adopted" or "removed": set once by the kernel; the thread then lets go or removes.
    decision: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)


_current: EarlyStart | None = None


def begin(argv: list[str]) -> EarlyStart | None:
    """Start the kernel's sandbox in a thread, before the proxy's imports, if it may be.

    Parameters
    ----------
    argv : list of str
        The proxy's command line without the interpreter (``-f <connection file>``
        and ``--Class.name=value`` options).

    Returns
    -------
    EarlyStart or None
        None when off (:data:`DISABLE_ENV`) or the command line has anything else.
    """
    global _current
    if os.environ.get(DISABLE_ENV, "1") == "0" or _current is not None:
        return None
    options = command_line_options(argv)
    if options is None:
        return None
    early = _current = EarlyStart()
    t0 = time.monotonic()
    try:  # here, not in the thread: alone on the CPU, the launch starts ~0.2 s sooner
        found = config_files()
        made = _backend(options) if not found else \
            f"a configuration file may set the kernel's options ({found[0]})"
    except Exception as err:  # noqa: BLE001  the kernel's own start says it again, in full
        made = f"early start failed: {err}"
    if isinstance(made, str):
        early.reason = made
        early.done.set()
        return early
    threading.Thread(target=_run, args=(early, made, t0), name="sandbox-early-start", daemon=True).start()
    return early


def command_line_options(argv: list[str]) -> list[str] | None:
    """The ``--Class.name=value`` options of a kernel's command line, or None if it has
    anything but those and ``-f``/``--f`` (the connection file)."""
    options, args = [], iter(argv)
    for arg in args:
        if arg in ("-f", "--f"):
            if next(args, None) is None:
                return None
        elif arg.startswith(("-f=", "--f=")):
            continue
        elif arg.startswith("--") and "=" in arg and "." in arg.split("=", 1)[0]:
            options.append(arg)
        else:
            return None
    return options


def config_files(cwd: str | None = None) -> list[Path]:
    """Configuration files the proxy's application would read, where IPython looks for them.

    The proxy is an IPython application named ``sandbox-kernel``: it reads
    ``ipython_config`` and ``sandbox_kernel_config`` (``.py`` or ``.json``) from its
    profile folder (``profile_default`` in the working folder, else in ``$IPYTHONDIR``
    or ``~/.ipython``), ``<sys.prefix>/etc/ipython``, ``/usr/local/etc/ipython`` and
    ``/etc/ipython`` (IPython's ``ENV_CONFIG_DIRS`` and ``SYSTEM_CONFIG_DIRS``).
    ``ipython_kernel_config`` is the inner interpreter's (``forward_ipython_config``),
    not the proxy's: it does not count.
    """
    ipython_dir = Path(os.environ.get("IPYTHONDIR") or Path.home() / ".ipython")
    folders = [Path(cwd or os.getcwd()) / "profile_default", ipython_dir / "profile_default",
               Path(sys.prefix) / "etc" / "ipython", Path("/usr/local/etc/ipython"), Path("/etc/ipython")]
    return [f / (n + ext) for f in folders for n in CONFIG_NAMES for ext in (".py", ".json")
            if (f / (n + ext)).is_file()]


def _run(early: EarlyStart, backend: Any, t0: float) -> None:
    try:
        asyncio.run(_launch(early, backend, t0))
    except BaseException as err:  # noqa: BLE001  a thread's end: said through the kernel's log
        early.reason = early.reason or f"early start failed: {err}"
    finally:
        early.done.set()


async def _launch(early: EarlyStart, backend: Any, t0: float) -> None:
    from .pool.daemon import launch_for_handover
    from .pool.wire import close_fds, policy_key

    await backend._runtime.resolve()
    key = policy_key(backend.policy, backend.runtime_key, backend.python)  # as the kernel's, once resolved
    try:
        # die_with_parent: this thread lives until the sandbox ends (it reaps it below), so
        # the sandbox dies with its runtime process, as a kernel's own does (bwrap killed)
        sb, ends = await launch_for_handover(backend.policy, backend._runtime, backend.python,
                                             kernel_id="early" + uuid.uuid4().hex, die_with_parent=True,
                                             admission=backend.admission)
    except Exception as err:  # noqa: BLE001  the kernel's own start says it again, in full
        early.reason = f"early start failed: {err}"
        return
    try:
        pidfd = os.pidfd_open(sb.proc.pid)
    except OSError as err:
        close_fds(ends.values())
        await sb.destroy(log)
        early.reason = f"the sandbox ended at once: {err}"
        return
    assert sb.watchdog_fd is not None
    early.info = {**sb.handoff_info(), "started_at": time.time()}
    early.fds = {**ends, "watchdog": sb.watchdog_fd, "pidfd": pidfd}
    early.key, early.started_s = key, time.monotonic() - t0
    early.done.set()
    try:
        decision = await asyncio.wait_for(asyncio.wrap_future(early.decision), UNCLAIMED_S)
    except TimeoutError:  # the kernel never asked: it started otherwise, or not at all
        _decide(early, "removed")
        decision = "removed"
    if decision == "adopted":  # the fds are the kernel's now; this thread only reaps its children
        sb.watchdog_fd = None
        await sb.proc.wait()
        with contextlib.suppress(Exception):
            sb.proc._transport.close()
    else:  # stdin EOF: the agent exits; destroy() disarms the watchdog (still armed by its fd)
        close_fds([early.fds[name] for name in ("stdin", "stdout", "stderr", "pidfd")])
        await sb.destroy(log)
    if sb.watchdog_proc is not None:  # it ends once the sandbox is removed; reaped on this loop
        await sb.watchdog_proc.wait()


def _backend(options: list[str]) -> Any:
    """The kernel's local backend built from ``options`` as the kernel builds it, or (a str)
    why the sandbox is not started early."""
    from traitlets.config import Configurable
    from traitlets.config.loader import KVArgParseConfigLoader

    from ... import workspace
    from ...options import KernelOptions
    from .pool import daemon, spares  # noqa: F401  (daemon: imported here, alone on the CPU)
    from .pool.wire import policy_key

    class SandboxKernel(KernelOptions, Configurable):
        """The kernel's options alone, under its class name (``--SandboxKernel.x=...``)."""

    config = KVArgParseConfigLoader(argv=options, aliases={}, flags={}).load_config()
    kernel = SandboxKernel(config=config)
    policy = workspace.resolve(kernel.build_policy(), os.getcwd())
    backend: Any = kernel.build_backend(policy, "early", log)  # a LocalBackend, checked by name
    if backend.name != "local":
        return f"the {backend.name} backend starts its own sandboxes"
    if backend.fork_from:
        return "a fork restores its source's image"
    if policy.network != "none" or policy.workspace != "none":
        return "the kernel makes its egress socket or workspace itself"
    if backend.start_template and backend.runtime_name == "gvisor":  # checked before runsc is probed
        return "a start template is restored (or made) instead"
    if os.geteuid() != 0 and backend.service_socket and os.path.exists(backend.service_socket):
        return "the sandbox service starts this user's sandboxes"
    pool = backend.pool_path
    if (pool and os.path.exists(pool)) or spares.socket_path(policy_key(policy, backend.runtime_key,
                                                                        backend.python)).exists():
        return "a warm or spare pool holds a started sandbox"
    return backend


async def claim(key: str, timeout_s: float = CLAIM_WAIT_S) -> EarlyStart | None:
    """The sandbox started early for policy ``key``, now the caller's; or None.

    Blocks until the early launch is over (it began before the proxy's imports, so
    normally it is).  A sandbox of another key is removed, never handed over.

    Parameters
    ----------
    key : str
        The kernel's policy key (:func:`.pool.wire.policy_key`).
    timeout_s : float
        Seconds to wait for a launch under way.

    Returns
    -------
    EarlyStart or None
        With ``info`` and ``fds`` (the caller owns the fds); None, with the reason in
        :func:`last_reason`, when there is none to take.
    """
    early = _current
    if early is None or early.decision.done():
        return None
    await asyncio.to_thread(early.done.wait, timeout_s)
    if early.key is None:
        _decide(early, "removed")
        return None
    if early.key != key:
        early.reason = "started for other options than the kernel's (a configuration file?); removed"
        _decide(early, "removed")
        return None
    _decide(early, "adopted")
    if early.decision.result() != "adopted":  # removed meanwhile (unclaimed too long)
        return None
    return early


def last_reason() -> str:
    """Why no sandbox was started early, or ``""``."""
    return _current.reason if _current is not None else ""


def release_unclaimed() -> None:
    """Remove the sandbox started early, if any, unclaimed: the kernel's start took
    another way (the sandbox service)."""
    early = _current
    if early is not None and not early.decision.done():
        _decide(early, "removed")


def _decide(early: EarlyStart, decision: str) -> None:
    with contextlib.suppress(concurrent.futures.InvalidStateError):
        early.decision.set_result(decision)


async def adopt_early(backend: Any) -> bool:
    """Give ``backend`` (a :class:`.LocalBackend` starting its sandbox) the sandbox started
    early for its policy key, as a cold start of its own would be (its spare pool counted
    and started at ready); False: it starts another way (a sandbox that could not be
    adopted is logged and left to its watchdog).
    """
    from .pool.wire import policy_key

    got = await claim(policy_key(backend.policy, backend.runtime_key, backend.python))
    if got is None:
        if last_reason():
            backend.log.debug("no sandbox started early: %s", last_reason())
        return False
    spare = backend._spare_spec()
    if spare is not None:
        backend._hold_spare(spare.key)
    try:
        await backend.adopt(got.info, got.fds)
    except Exception as err:  # noqa: BLE001  the fds are closed; the sandbox's watchdog reaps it
        backend.log.warning("could not adopt the sandbox started early: %s", err)
        return False
    backend.pooled, backend.started_early = False, True
    backend._spare_to_start = spare
    backend.log.info("sandbox %s started %.2f s after the proxy's launch, beside its imports: %s",
                     got.info.get("container_id"), got.started_s, backend.capabilities.boundary)
    return True
