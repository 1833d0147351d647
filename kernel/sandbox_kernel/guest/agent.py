"""The in-sandbox agent: starts a stock ipykernel and relays it over stdio.

This file runs INSIDE the sandbox and is shipped there as a single file (bind
mount, E2B file upload, Modal image layer).  It imports only the standard
library, ``zmq`` and ``jupyter_client``, never a host-side module of this
package.  The host treats everything it says as hostile; the agent trusts the
host.

Usage inside the sandbox::

    python agent.py [--cwd DIR] [--kernel-user USER]   # the relay, framed protocol on stdio
    python agent.py --kernel -f CONN     # the inner kernel (ipykernel, patched)

The agent guards its channel from the interpreter it starts (``docs/security.md``,
"The agent's channel"): it makes itself non-dumpable (no ``/proc/<pid>/fd``,
``mem``, ``ptrace`` or ``process_vm_readv`` from the same uid on Linux); started
as root with ``--kernel-user``, it runs the interpreter as that user, so
the interpreter can neither open, signal nor trace it on any kernel (gVisor
included); as PID 1 of its namespace it installs no handler for catchable
signals, so the interpreter's signals to it are discarded.  What holds is
reported to the host in the ``ready`` frame (``guard``).

The framing (one ASCII JSON object per line) is described in
``sandbox_kernel/protocol.py``.
"""

from __future__ import annotations

import base64
import builtins
import collections
import contextlib
import hmac
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from typing import Any

#: Bytes of already-sent frames kept for replay after a detach.
REPLAY_BUFFER_BYTES = 64 * 1024 * 1024
#: Bytes of the inner kernel's stderr kept to explain its death.
STDERR_TAIL_BYTES = 4096
READY_TIMEOUT_S = 120.0
#: Frames queued in one loop pass are written together; a pass that drains a flood
#: of messages writes every this many bytes.
WRITE_BATCH_BYTES = 256 * 1024
#: While the loop is busy, the inner kernel's exit status and stderr are checked at
#: most this often (and whenever its stderr is readable or the poll times out).
REAP_INTERVAL_S = 0.2
#: ZMQ's delimiter between routing identities and a Jupyter message.
DELIM = b"<IDS|MSG>"
#: ``prctl`` option (linux/prctl.h).
PR_SET_DUMPABLE = 4
#: The host-built jedi cache, read-only, where local sandboxes have one
#: (``sandbox_kernel.guest.JEDI_SEED_PATH``; :func:`_seed_jedi_cache`).
JEDI_SEED_DIR = "/opt/sandbox-kernel/jedi-cache"
#: The completion the agent asks for before it reports ``ready`` (:meth:`Agent._warm_completer`):
#: besides the builtins' stubs it loads those of ``collections`` and ``collections.abc``,
#: which most typeshed stubs import (``docs/decisions.md``, C16).
WARM_COMPLETION = "from collections import abc; abc.Ma"
#: Longest the agent waits for that completion, seconds.
WARM_TIMEOUT_S = 10.0


# --------------------------------------------------------------------------
# The inner kernel's bootstrap (``--kernel``): stock ipykernel, patched below
# (twelve attributes of ipykernel 7.4 and IPython; each function says why).
# --------------------------------------------------------------------------


def _patch_ipykernel() -> None:
    """Make ipykernel's file-descriptor capture lossless and TCP-free.

    1. ``OutStream._watch_pipe_fd`` decodes each ``read()`` on its own with
       ``errors="replace"``, so a UTF-8 character split across two writes
       becomes U+FFFD.  An incremental decoder keeps the partial character.
    2. ``IOPubThread`` binds a TCP listener on 127.0.0.1 for forked children;
       an IPC socket does the same job, keeps the sandbox free of TCP listeners
       and lets gVisor checkpoint it.
    3. ``OutStream.flush`` first waits for fd-level output already in the pipe,
       so it is published before the cell's reply and idle status (C07).
    4. ``!cmd`` and ``x = !cmd`` run without a pseudo-terminal, stdin at EOF
       (:func:`_system`, C08, C09).
    5. ``OutStream.write`` calls ``os.getpid()`` on every write (twice per
       ``print``) to tell a forked child from the kernel.  Under gVisor each is
       a system call the Sentry serves (2-25 µs on systrap), which held stdout
       to a fifth of stock ipykernel's MB/s (measured, ``docs/decisions.md``).
       The pid is read once and read again in a forked child
       (``os.register_at_fork``), the only way it changes for Python code.
    """
    import codecs
    import select
    import threading

    from ipykernel import iostream

    def _watch_pipe_fd(self):
        if self._fid is None:
            return
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        # Each chunk is read and handed to write() under this lock, so flush() can
        # tell "nothing left in the pipe" from "a chunk is between read and write".
        lock = self._sk_lock = threading.Lock()
        poller = select.poll()
        poller.register(self._fid, select.POLLIN)
        try:
            while True:
                poller.poll()
                with lock:
                    bts = os.read(self._fid, iostream.PIPE_BUFFER_SIZE)
                    if not bts or not self._should_watch:
                        break
                    text = decoder.decode(bts)
                    if text:
                        self.write(text)
            tail = decoder.decode(b"", final=True)
            if tail:
                self.write(tail)
        except Exception:  # noqa: BLE001 - kept for ipykernel to re-raise, as it does
            self._exc = sys.exc_info()

    def _drain_fd(self, limit_s: float = 2.0) -> None:
        """Wait until fd-level output already written (``!cmd``, children, C code)
        has passed through write(), so flush() publishes it before the cell's
        reply and idle status instead of after them."""
        lock = getattr(self, "_sk_lock", None)
        if lock is None or self._fid is None or not self._is_master_process():
            return
        if self.watch_fd_thread is threading.current_thread():
            return
        import fcntl
        import termios

        buf = bytearray(4)
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            with lock:
                try:
                    fcntl.ioctl(self._fid, termios.FIONREAD, buf)
                except OSError:
                    return
                if not int.from_bytes(buf, sys.byteorder):
                    return
            time.sleep(0.001)

    _flush = iostream.OutStream.flush

    def flush(self):
        _drain_fd(self)
        _flush(self)

    pid = [os.getpid()]
    os.register_at_fork(after_in_child=lambda: pid.__setitem__(0, os.getpid()))

    def _is_master_process(self):
        return pid[0] == self._master_pid

    iostream.OutStream._watch_pipe_fd = _watch_pipe_fd
    iostream.OutStream.flush = flush
    iostream.OutStream._is_master_process = _is_master_process
    iostream.IOPubThread._is_master_process = _is_master_process
    _patch_shell_commands()
    _patch_async_interrupt()
    _patch_comm_status()

    import zmq
    from zmq.eventloop.zmqstream import ZMQStream

    def _setup_pipe_in(self):
        ctx = self.socket.context
        self._pipe_uuid = os.urandom(16)
        pipe_in = ctx.socket(zmq.PULL)
        pipe_in.linger = 0
        self._pipe_addr = "ipc://{}/iopub-pipe-{}".format(
            os.environ.get("SANDBOX_KERNEL_RUNTIME_DIR", tempfile.gettempdir()),
            uuid.uuid4().hex[:12],
        )
        pipe_in.bind(self._pipe_addr)
        self._pipe_port = 0
        self._pipe_in = ZMQStream(pipe_in, self.io_loop)
        self._pipe_in.on_recv(self._handle_pipe_msg)

    def _setup_pipe_out(self):
        ctx = zmq.Context()
        pipe_out = ctx.socket(zmq.PUSH)
        pipe_out.linger = 3000
        pipe_out.connect(self._pipe_addr)
        return ctx, pipe_out

    iostream.IOPubThread._setup_pipe_in = _setup_pipe_in
    iostream.IOPubThread._setup_pipe_out = _setup_pipe_out


def _shell() -> str:
    """The shell of ``!cmd``: bash when the image has it (what ``!`` runs on a typical
    Jupyter server, where ``SHELL`` is the user's login shell; ``printf '\\xc3'`` and
    other bashisms in notebooks rely on it), else ``$SHELL``, else ``/bin/sh``."""
    import shutil

    sh = os.environ.get("SHELL", "")
    if os.path.basename(sh) == "bash" and os.access(sh, os.X_OK):
        return sh  # as IPython names it (pexpect.which($SHELL)): "/bin/bash", not "/usr/bin/bash"
    return shutil.which("bash") or sh or "/bin/sh"


def _system(cmd: str) -> int:
    """``!cmd``: the shell command with stdin at end-of-file and its output on fd 1.

    IPython runs ``!cmd`` under pexpect in a pseudo-terminal: a command that reads
    stdin (``!cat``) waits forever for a terminal nobody types into (C09), each
    chunk is decoded on its own so a split UTF-8 character becomes U+FFFD (C08),
    and newlines become ``\r\n``.  Here the child writes straight to the fd
    ipykernel captures (decoded incrementally, see ``_watch_pipe_fd``), its stderr
    merged into its stdout as the terminal merges them for stock (IPython 8, 9).  An
    interrupt ends the command, not the cell, as IPython's own ``system`` does: the
    cell goes on and its reply is ``ok`` (so Run All goes on too); the exit status
    is the command's (``-2`` for SIGINT), in ``_exit_code``.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    proc = subprocess.Popen([_shell(), "-c", cmd], stdin=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        return proc.wait()
    except KeyboardInterrupt:
        # The interrupt reached the whole process group, the command included.
        try:
            proc.wait(0.5)
        except (subprocess.TimeoutExpired, KeyboardInterrupt):  # impatient users press it twice
            proc.kill()
            proc.wait()
        return proc.returncode
    finally:
        sys.stdout.flush()
        sys.stderr.flush()


def _getoutput(cmd: str) -> str:
    """``x = !cmd``: like IPython's, without a pseudo-terminal (stdin at EOF)."""
    out = subprocess.run([_shell(), "-c", cmd], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, check=False).stdout
    return out.decode("utf-8", "replace")


def _patch_shell_commands() -> None:
    from ipykernel import zmqshell
    from IPython.core import interactiveshell

    zmqshell.system = _system
    interactiveshell.getoutput = _getoutput  # type: ignore[assignment]


def _patch_async_interrupt() -> None:
    """Make an interrupt stop a cell that awaits (``await asyncio.sleep(3600)``, C06).

    ipykernel's ``_cancel_on_sigint`` installs a SIGINT handler that schedules the
    cancellation with tornado's ``add_callback``; called from a signal handler on
    the loop's own thread that is a plain ``call_soon``, which does not wake the
    loop from ``epoll_wait``, so the cell (and every cell queued behind it) waits
    until some timer fires: an hour here.  ``call_soon_threadsafe`` wakes it.
    The cancellation is then reported as the ``KeyboardInterrupt`` the user
    asked for (traceback and reply), not as ``CancelledError``.
    """
    import asyncio
    from contextlib import contextmanager

    from ipykernel.ipkernel import IPythonKernel

    def _show_interrupt(shell, etype, value, tb, tb_offset=None):
        if getattr(shell, "_sk_interrupted", False):
            shell._sk_interrupted = False
            shell.showtraceback((KeyboardInterrupt, KeyboardInterrupt(), tb), tb_offset=tb_offset)
        else:
            shell.showtraceback((etype, value, tb), tb_offset=tb_offset)

    @contextmanager
    def _cancel_on_sigint(self, future):
        loop = asyncio.get_event_loop()
        shell = self.shell
        ours = shell.custom_exceptions in ((), (asyncio.CancelledError,))
        if ours:
            shell.set_custom_exc((asyncio.CancelledError,), _show_interrupt)
        fired = []

        def cancel():
            if not future.done():
                fired.append(True)
                shell._sk_interrupted = ours
                future.cancel()

        def handle_sigint(*_args):
            loop.call_soon_threadsafe(cancel)

        saved = signal.signal(signal.SIGINT, handle_sigint)
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, saved)
            shell._sk_interrupted = False
            if fired and ours and future.done() and not future.cancelled() and future.exception() is None:
                res = future.result()
                if isinstance(getattr(res, "error_in_exec", None), asyncio.CancelledError):
                    res.error_in_exec = KeyboardInterrupt()

    IPythonKernel._cancel_on_sigint = _cancel_on_sigint


def _patch_comm_status() -> None:
    """Give a comm message handled beside an awaiting cell a ``busy`` and ``idle``.

    ipykernel 7.4 dispatches a comm message that comes while a cell awaits (a
    widget's reply, ``await asyncio.sleep``) at once, beside the cell
    (``dispatch_shell(concurrent=True)``), and publishes no status for it.  The
    proxy knows a relayed comm message was handled only by its idle (there is no
    reply): without one it waited for ever, the request stayed pending (the idle
    sandbox was then never paused) and the frontend never saw the idle of the
    comm message the proxy had shown busy (issue 33).  Only the proxy reads these
    statuses (it publishes its own: ``sandbox_kernel.dispatch`` on the host does
    the same there).  An ipykernel without ``concurrent`` queues comm messages
    behind the cell, each with its statuses: nothing to do.
    """
    import inspect

    from ipykernel.kernelbase import Kernel

    dispatch = Kernel.dispatch_shell
    if "concurrent" not in inspect.signature(dispatch).parameters:
        return

    async def dispatch_shell(self, msg, /, subshell_id=None, *, concurrent=False):
        if not concurrent:
            return await dispatch(self, msg, subshell_id=subshell_id)
        try:
            _, frames = self.session.feed_identities(msg, copy=False)
            parent = {"header": self.session.deserialize(frames, content=False, copy=False)["header"]}
        except Exception:  # noqa: BLE001 - an invalid message: ipykernel logs it and drops it
            return await dispatch(self, msg, subshell_id=subshell_id, concurrent=True)
        self._publish_status("busy", "shell", parent=parent)
        try:
            return await dispatch(self, msg, subshell_id=subshell_id, concurrent=True)
        finally:
            self._publish_status("idle", "shell", parent=parent)

    Kernel.dispatch_shell = dispatch_shell


def _import_shared_lazy_modules() -> None:
    """Import, on the kernel's main thread, what :func:`_warm_tracebacks` and the
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


def _warm_tracebacks() -> None:
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


def _explain_pip(shell) -> None:
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


def _seed_jedi_cache(seed: str = JEDI_SEED_DIR) -> int:
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


def _seed_matplotlib_fonts(seed: str = JEDI_SEED_DIR) -> bool:
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


# --------------------------------------------------------------------------
# Clone correctness: the ONE place for what a copy of an interpreter (a start
# template's restore, and issue 30's fork/rewind) redraws, keeps, and cannot
# change.  Kept in this file because agent.py is the single file every backend
# ships (gvisor/bwrap mount it, E2B uploads it, Modal adds it); docs/lifecycle.md
# holds the table.
# --------------------------------------------------------------------------

#: Sent by the agent to the interpreter restored from a start template (the host's
#: ``reseed``): :func:`after_clone`.
RESEED_SIGNAL = signal.SIGUSR2
_USER_SEEDED: set[str] = set()  # "random", "numpy": seeded by the user since start


def track_seeds() -> None:
    """Note from now on when the user seeds ``random`` or numpy's legacy generator.

    Called by :func:`run_inner_kernel` at interpreter start and by
    :func:`after_clone`; wraps ``random.seed``/``setstate`` (and
    ``numpy.random.seed``/``set_state`` right after the import that loads numpy,
    through a ``builtins.__import__`` wrapper that removes itself then) so that
    an explicit, non-``None`` seed marks the generator as the user's.
    """
    import random

    def wrap(mod, name, key, explicit):
        fn = getattr(mod, name, None)
        if fn is None or getattr(fn, "_sbk_tracked", False):
            return

        def tracked(*args, **kwargs):
            if explicit(args, kwargs):
                _USER_SEEDED.add(key)
            return fn(*args, **kwargs)
        tracked._sbk_tracked = True  # type: ignore[attr-defined]
        setattr(mod, name, tracked)

    def seeded(args, kwargs):
        return (args[0] if args else kwargs.get("a", kwargs.get("seed"))) is not None

    wrap(random, "seed", "random", seeded)
    wrap(random, "setstate", "random", lambda a, k: True)

    def wrap_numpy() -> bool:
        legacy = sys.modules.get("numpy.random")
        if legacy is None or not hasattr(legacy, "set_state"):  # absent, or half imported
            return False
        wrap(legacy, "seed", "numpy", seeded)
        wrap(legacy, "set_state", "numpy", lambda a, k: True)
        return True

    if wrap_numpy() or getattr(builtins.__import__, "_sbk_tracked", False):
        return
    original = builtins.__import__

    def importing(*args, **kwargs):  # until numpy.random is loaded, then gone
        module = original(*args, **kwargs)
        if builtins.__import__ is importing and wrap_numpy():
            builtins.__import__ = original
        return module
    importing._sbk_tracked = True  # type: ignore[attr-defined]
    builtins.__import__ = importing


def after_clone(*_args) -> None:
    """Make this interpreter its own after it was copied (restore from a start
    template; fork or rewind, issue 30), from ``os.urandom``.

    Called in the interpreter by :data:`RESEED_SIGNAL` (the agent's ``reseed`` op).
    Redrawn: ``random``'s global generator and numpy's legacy global
    ``RandomState`` unless the user seeded them (:func:`track_seeds`), tempfile's
    name sequence, multiprocessing's ``current_process().authkey``.  Fine as they
    are: ``secrets``, ``random.SystemRandom``, ``uuid.uuid4`` (``os.urandom`` per
    call), ``numpy.random.default_rng()`` (seeded per call).  Cannot change in a
    live interpreter: ``hash()`` randomisation (``PYTHONHASHSEED``), so copies
    share str/bytes hash order.  Clocks are the runtime's: gVisor restores keep
    ``CLOCK_MONOTONIC`` going forward and ``time.time()`` is the host's.

    Parameters
    ----------
    *_args
        The signal number and frame when called as a signal handler; ignored.
    """
    import random

    if "random" not in _USER_SEEDED:
        random.seed()
    tempfile._name_sequence = None  # type: ignore[attr-defined]  # remade, freshly seeded, at the next name
    legacy = sys.modules.get("numpy.random")
    if legacy is not None and "numpy" not in _USER_SEEDED:
        try:
            legacy.seed()
        except Exception:  # noqa: BLE001 - a numpy without the legacy generator
            pass
    mp = sys.modules.get("multiprocessing.process")
    if mp is not None:
        mp.current_process().authkey = os.urandom(32)
    track_seeds()


def run_inner_kernel(argv: list[str]) -> None:
    """Entry point of the inner kernel process."""
    track_seeds()
    signal.signal(RESEED_SIGNAL, after_clone)
    _seed_jedi_cache()
    _seed_matplotlib_fonts()
    _patch_ipykernel()
    import threading

    from ipykernel import kernelapp

    start = kernelapp.IPKernelApp.start

    def start_then_warm(self):
        # Only once initialize() has imported IPython on this thread: a second
        # thread importing it concurrently made the kernel exit at start (code 1).
        _import_shared_lazy_modules()
        threading.Thread(target=_warm_tracebacks, name="warm-tracebacks", daemon=True).start()
        if not os.environ.get("SANDBOX_KERNEL_EGRESS"):  # with egress, pip may install
            _explain_pip(self.shell)
        return start(self)

    kernelapp.IPKernelApp.start = start_then_warm
    kernelapp.launch_new_instance(argv=argv)


# --------------------------------------------------------------------------
# The relay.
# --------------------------------------------------------------------------


def _json_default(obj):
    if hasattr(obj, "isoformat"):
        return obj.isoformat()
    if isinstance(obj, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(obj)).decode("ascii")
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def _ascii_json(part: bytes) -> bytes:
    """A JSON object from the inner kernel as ASCII JSON on one line: ``part`` itself
    when it already is (the usual case), else decoded and re-encoded."""
    if part.isascii() and part[:1] == b"{" and b"\n" not in part and b"\r" not in part:
        return part
    obj = json.loads(part.decode("utf-8", "replace"))
    if not isinstance(obj, dict):
        raise ValueError("a message part is not a JSON object")
    return json.dumps(obj, ensure_ascii=True, separators=(",", ":"),
                      default=_json_default).encode("ascii")


def _describe_exit(returncode: int) -> str:
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = str(-returncode)
        return f"killed by signal {name}"
    return f"exit code {returncode}"


# --------------------------------------------------------------------------
# File transfer (the host's ``file`` frames; sandbox_kernel/files.py is the host side).
# --------------------------------------------------------------------------

#: Bytes of file data per ``file_data`` frame (base64 in the frame).
FILE_CHUNK_BYTES = 1 << 20
#: Entries one ``list`` returns at most (``truncated`` says when there were more).
FILE_LIST_MAX = 10_000


class FileOpError(Exception):
    """A refused file operation: ``ename`` is the builtin exception it maps to on the host."""

    def __init__(self, ename: str, text: str):
        super().__init__(text)
        self.ename = ename


def _kind(mode: int) -> str:
    import stat

    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "directory"
    if stat.S_ISLNK(mode):
        return "symlink"
    return "other"


class FileOps:
    """Upload, download, list, stat and remove inside the sandbox's writable areas.

    Paths are relative to the interpreter's working directory or absolute under
    one of ``roots``; ``..``, symlinks (in any component: each is opened with
    ``O_NOFOLLOW`` from ``/``) and special files are refused.  Files the agent
    creates belong to the interpreter's user (``owner``).  Every answer is a
    ``file`` frame (``ok``, ``error``/``ename`` or ``result``); a download sends
    ``file_data`` frames first, then its size and SHA-256.
    """

    def __init__(self, emit, cwd: str, roots: tuple[str, ...], hidden: tuple[str, ...],
                 owner: tuple[int, int] | None):
        self.emit = emit
        self.cwd = cwd
        self.roots = roots
        self.hidden = hidden
        self.owner = owner
        self.uploads: dict[str, dict] = {}

    def handle(self, frame: dict) -> None:
        fid = str(frame.get("id", ""))[:64]
        action = frame.get("action")
        try:
            handler = getattr(self, f"do_{action}", None) if isinstance(action, str) else None
            if handler is None:
                raise FileOpError("ValueError", f"unknown file action {str(action)[:40]!r}")
            result = handler(fid, frame)
        except FileOpError as err:
            self.emit("file", id=fid, ok=False, ename=err.ename, error=str(err))
        except OSError as err:
            self.emit("file", id=fid, ok=False, ename=type(err).__name__,
                      error=f"{os.strerror(err.errno) if err.errno else err}: {frame.get('path', '')!r}")
        except Exception as err:  # noqa: BLE001 - never let a request end the agent
            self.emit("file", id=fid, ok=False, ename="OSError", error=f"{type(err).__name__}: {err}")
        else:
            if result is not None:
                self.emit("file", id=fid, ok=True, result=result)

    # ---- paths ------------------------------------------------------------

    def _full(self, path) -> str:
        if not isinstance(path, str) or not path or "\0" in path or len(path) > 4096:
            raise FileOpError("ValueError", "a path must be a non-empty string")
        if ".." in path.split("/"):
            raise FileOpError("PermissionError", f"{path!r}: '..' is not allowed")
        full = os.path.normpath(path if path.startswith("/") else os.path.join(self.cwd, path))
        inside = any(full == r or full.startswith(r.rstrip("/") + "/") for r in self.roots)
        if not inside or any(full == h or full.startswith(h + "/") for h in self.hidden):
            raise FileOpError("PermissionError", f"{path!r} is outside the sandbox's writable areas "
                              f"({', '.join(self.roots)})")
        return full

    def _parent(self, path, make: bool = False) -> tuple[int, str, str]:
        """``(dir fd, name, full path)``: the parent opened component by component
        without following any symlink; ``make``: missing folders are made on the way
        (an upload into ``new dir/sub/``), owned as uploaded files are."""
        full = self._full(path)
        parts = [p for p in full.split("/") if p]
        if not parts:
            raise FileOpError("PermissionError", f"{path!r} is outside the sandbox's writable areas")
        fd = os.open("/", os.O_RDONLY | os.O_DIRECTORY)
        try:
            for i, part in enumerate(parts[:-1]):
                flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
                try:
                    try:
                        nfd = os.open(part, flags, dir_fd=fd)
                    except FileNotFoundError:
                        if not make:
                            raise
                        with contextlib.suppress(FileExistsError):  # made meanwhile: opened below
                            os.mkdir(part, 0o755, dir_fd=fd)  # a name that exists (a symlink too) is left
                        nfd = os.open(part, flags, dir_fd=fd)
                        if self.owner is not None:
                            os.fchown(nfd, *self.owner)
                except OSError as err:
                    import errno

                    if err.errno in (errno.ELOOP, errno.ENOTDIR):
                        where = "/" + "/".join(parts[:i + 1])
                        raise FileOpError("PermissionError", f"{path!r}: {where} is a symlink or not a "
                                          "directory; symlinks are not followed") from None
                    raise
                os.close(fd)
                fd = nfd
        except BaseException:
            os.close(fd)
            raise
        return fd, parts[-1], full

    def _lstat(self, dfd: int, name: str, path):
        try:
            return os.stat(name, dir_fd=dfd, follow_symlinks=False)
        except FileNotFoundError:
            raise FileOpError("FileNotFoundError", f"{path!r} does not exist in the sandbox") from None

    @staticmethod
    def _describe(st) -> dict:
        return {"type": _kind(st.st_mode), "size": st.st_size, "mtime": st.st_mtime,
                "mode": st.st_mode & 0o7777}

    # ---- actions ------------------------------------------------------------

    def do_stat(self, fid: str, frame: dict) -> dict:
        dfd, name, full = self._parent(frame.get("path"))
        try:
            return {"path": full, **self._describe(self._lstat(dfd, name, frame.get("path")))}
        finally:
            os.close(dfd)

    def do_list(self, fid: str, frame: dict) -> dict:
        path = frame.get("path") or "."
        if os.path.normpath(path if path.startswith("/") else os.path.join(self.cwd, path)) == "/":
            raise FileOpError("PermissionError", "'/' is outside the sandbox's writable areas")
        dfd, name, full = self._parent(path)
        try:
            fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dfd)
        except OSError as err:
            import errno

            if err.errno in (errno.ELOOP, errno.ENOTDIR):
                raise FileOpError("NotADirectoryError", f"{path!r} is not a directory (symlinks are "
                                  "not followed)") from None
            raise
        finally:
            os.close(dfd)
        entries: list[dict] = []
        truncated = False
        try:
            with os.scandir(fd) as it:
                for e in it:
                    if len(entries) >= FILE_LIST_MAX:
                        truncated = True
                        break
                    try:
                        entries.append({"name": e.name, **self._describe(e.stat(follow_symlinks=False))})
                    except OSError:
                        continue
        finally:
            os.close(fd)
        entries.sort(key=lambda d: d["name"])
        return {"path": full, "entries": entries, "truncated": truncated}

    def do_remove(self, fid: str, frame: dict) -> dict:
        dfd, name, full = self._parent(frame.get("path"))
        try:
            st = self._lstat(dfd, name, frame.get("path"))
            kind = _kind(st.st_mode)
            if kind == "directory":
                os.rmdir(name, dir_fd=dfd)
            elif kind == "file":
                os.unlink(name, dir_fd=dfd)
            else:
                raise FileOpError("PermissionError", f"{frame.get('path')!r} is a {kind}; only regular "
                                  "files and empty directories are removed")
        finally:
            os.close(dfd)
        return {"path": full, "removed": kind}

    def do_mkdir(self, fid: str, frame: dict) -> dict:
        dfd, name, full = self._parent(frame.get("path"))
        try:
            try:
                os.mkdir(name, 0o755, dir_fd=dfd)
                if self.owner is not None:
                    os.chown(name, *self.owner, dir_fd=dfd, follow_symlinks=False)
            except FileExistsError:
                st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
                if _kind(st.st_mode) != "directory":
                    raise FileOpError("FileExistsError", f"{frame.get('path')!r} exists and is a "
                                      f"{_kind(st.st_mode)}") from None
        finally:
            os.close(dfd)
        return {"path": full}

    def do_get(self, fid: str, frame: dict) -> dict:
        import hashlib
        import stat

        limit = int(frame.get("max_bytes", 0))
        dfd, name, full = self._parent(frame.get("path"))
        try:
            try:
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dfd)
            except FileNotFoundError:
                raise FileOpError("FileNotFoundError", f"{frame.get('path')!r} does not exist in the "
                                  "sandbox") from None
            except OSError as err:
                import errno

                if err.errno == errno.ELOOP:
                    raise FileOpError("PermissionError", f"{frame.get('path')!r} is a symlink; symlinks "
                                      "are not followed") from None
                raise
        finally:
            os.close(dfd)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise FileOpError("PermissionError", f"{frame.get('path')!r} is a {_kind(st.st_mode)}, "
                                  "not a regular file")
            if st.st_size > limit:
                raise FileOpError("FileTooLarge", f"{frame.get('path')!r} is {st.st_size} bytes, over "
                                  f"the transfer limit of {limit} bytes")
            digest, offset = hashlib.sha256(), 0
            while True:
                data = os.read(fd, FILE_CHUNK_BYTES)
                if not data:
                    break
                if offset + len(data) > limit:
                    raise FileOpError("FileTooLarge", f"{frame.get('path')!r} grew over the transfer "
                                      f"limit of {limit} bytes while it was read")
                digest.update(data)
                self.emit("file_data", id=fid, offset=offset, data=base64.b64encode(data).decode("ascii"))
                offset += len(data)
        finally:
            os.close(fd)
        return {"path": full, "size": offset, "sha256": digest.hexdigest()}

    def do_put_open(self, fid: str, frame: dict) -> dict:
        import hashlib

        if fid in self.uploads:
            raise FileOpError("ValueError", f"upload {fid!r} is already open")
        dfd, name, full = self._parent(frame.get("path"), make=True)
        try:
            try:
                st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            except FileNotFoundError:
                st = None
            if st is not None and _kind(st.st_mode) != "file":
                raise FileOpError("PermissionError", f"{frame.get('path')!r} exists and is a "
                                  f"{_kind(st.st_mode)}; only regular files are replaced")
            if st is not None and not frame.get("overwrite", True):
                raise FileOpError("FileExistsError", f"{frame.get('path')!r} exists (overwrite=False)")
            tmp = f".{name[:200]}.sk-upload-{uuid.uuid4().hex[:8]}"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644, dir_fd=dfd)
            if self.owner is not None:
                os.fchown(fd, *self.owner)
            if isinstance(frame.get("mode"), int):
                os.fchmod(fd, frame["mode"] & 0o777)
        except BaseException:
            os.close(dfd)
            raise
        self.uploads[fid] = {"fd": fd, "dfd": dfd, "name": name, "tmp": tmp, "full": full, "size": 0,
                             "sha": hashlib.sha256(), "limit": int(frame.get("size", 0)), "error": None}
        return {"path": full}

    def do_put_data(self, fid: str, frame: dict) -> None:
        up = self.uploads.get(fid)
        if up is None or up["error"] is not None:
            return None
        data = base64.b64decode(frame.get("data", ""))
        if int(frame.get("offset", -1)) != up["size"] or up["size"] + len(data) > up["limit"]:
            up["error"] = ("ValueError", "chunks out of order or over the announced size")
            return None
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(up["fd"], view):]
        except OSError as err:
            up["error"] = (type(err).__name__, f"{os.strerror(err.errno) if err.errno else err}: "
                           f"{up['full']!r}")
            return None
        up["sha"].update(data)
        up["size"] += len(data)
        return None

    def do_put_close(self, fid: str, frame: dict) -> dict:
        up = self.uploads.pop(fid, None)
        if up is None:
            raise FileOpError("ValueError", f"no upload {fid!r} is open")
        ok = False
        try:
            if up["error"] is not None:
                raise FileOpError(*up["error"])
            if up["size"] != frame.get("size") or up["sha"].hexdigest() != frame.get("sha256"):
                raise FileOpError("ValueError", f"upload of {up['full']!r}: {up['size']} bytes "
                                  "written, not what the host sent")
            os.fsync(up["fd"])
            os.rename(up["tmp"], up["name"], src_dir_fd=up["dfd"], dst_dir_fd=up["dfd"])
            ok = True
        finally:
            os.close(up["fd"])
            if not ok:
                try:
                    os.unlink(up["tmp"], dir_fd=up["dfd"])
                except OSError:
                    pass
            os.close(up["dfd"])
        return {"path": up["full"], "size": up["size"], "sha256": up["sha"].hexdigest()}

    def do_put_abort(self, fid: str, frame: dict) -> dict:
        up = self.uploads.get(fid)
        if up is not None:
            up["error"] = ("ValueError", "aborted by the host")
            try:
                self.do_put_close(fid, frame)
            except FileOpError:
                pass
        return {"aborted": True}


class EgressForwarder:
    """The sandbox's end of egress (``network=allowlist``, local backends): a TCP listener on
    the sandbox's own loopback (``HTTP_PROXY=http://127.0.0.1:<port>``) forwarding each
    connection, byte for byte, to the host's egress proxy socket bound into the sandbox.

    One thread, non-blocking sockets and a selector: hundreds of connections cost no
    threads.  The agent never parses these bytes; the host decides on each request.
    """

    #: Bytes buffered toward one side before reading from the other pauses.
    LIMIT = 1 << 20
    #: Bytes read at once.
    CHUNK = 256 * 1024

    def __init__(self, port: int, socket_path: str):
        import selectors
        import socket

        self.socket, self.selectors, self.path = socket, selectors, socket_path
        self.listener = socket.create_server(("127.0.0.1", port), backlog=512)
        self.listener.setblocking(False)
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.listener, selectors.EVENT_READ)
        self.other: dict = {}
        self.buf: dict = {}
        self.read_eof: set = set()
        self.shut_after: set = set()
        #: socket -> the events it is registered for (absent: not registered)
        self.registered: dict = {}

    def start(self) -> None:
        import threading

        threading.Thread(target=self.run, name="egress-forwarder", daemon=True).start()

    def run(self) -> None:
        while True:
            for key, events in self.sel.select():
                s = key.fileobj
                try:
                    if s is self.listener:
                        self._accept()
                    elif s in self.other:
                        self._service(s, events)
                except OSError:
                    self._close(s)
                except Exception as err:  # noqa: BLE001 - one connection's bug must not stop egress
                    print(f"agent: egress forwarder: {type(err).__name__}: {err}", file=sys.stderr)
                    self._close(s)

    def _accept(self) -> None:
        try:
            client, _ = self.listener.accept()
        except OSError:
            return
        up = self.socket.socket(self.socket.AF_UNIX, self.socket.SOCK_STREAM)
        try:
            up.settimeout(2)  # the proxy's backlog is long: a connect waits only if the host is stuck
            up.connect(self.path)
        except OSError:
            up.close()
            client.close()
            return
        for a, b in ((client, up), (up, client)):
            a.setblocking(False)
            self.other[a], self.buf[a] = b, bytearray()
            self.sel.register(a, self.selectors.EVENT_READ)
            self.registered[a] = self.selectors.EVENT_READ

    def _service(self, s, events: int) -> None:
        o = self.other[s]
        if events & self.selectors.EVENT_WRITE:
            self._flush(s)
        if events & self.selectors.EVENT_READ:
            data = s.recv(self.CHUNK)
            if data:
                self.buf[o] += data
            else:  # pass the half-close on once what is buffered is written
                self.read_eof.add(s)
                self.shut_after.add(o)
            self._flush(o)
        if s in self.read_eof and o in self.read_eof and not self.buf[s] and not self.buf[o]:
            self._close(s)
            return
        self._interest(s)
        self._interest(o)

    def _flush(self, s) -> None:
        b = self.buf[s]
        if b:
            try:
                del b[:s.send(b)]
            except BlockingIOError:
                return
        if not b and s in self.shut_after:
            self.shut_after.discard(s)
            s.shutdown(self.socket.SHUT_WR)

    def _interest(self, s) -> None:
        """Read while the other side's buffer has room and no EOF came; write while
        something waits; otherwise out of the selector (an EOF is always readable)."""
        ev = 0
        if s not in self.read_eof and len(self.buf[self.other[s]]) < self.LIMIT:
            ev |= self.selectors.EVENT_READ
        if self.buf[s]:
            ev |= self.selectors.EVENT_WRITE
        now = self.registered.get(s)
        if ev == now:
            return
        if ev and now:
            self.sel.modify(s, ev)
        elif ev:
            self.sel.register(s, ev)
        else:
            self.sel.unregister(s)
        if ev:
            self.registered[s] = ev
        else:
            del self.registered[s]

    def _close(self, s) -> None:
        for x in (s, self.other.get(s)):
            if x is None or x not in self.other:
                continue
            del self.other[x], self.buf[x]
            self.read_eof.discard(x)
            self.shut_after.discard(x)
            if self.registered.pop(x, None):
                self.sel.unregister(x)
            x.close()


class Agent:
    """Relay between the host (stdio frames) and one inner ipykernel (ZMQ, IPC)."""

    def __init__(self, cwd: str | None = None, kernel_user: str | None = None,
                 egress: tuple[int, str] | None = None, pip_prefix: str | None = None,
                 host_silence_s: float = 0.0):
        import zmq
        from jupyter_client.session import Session

        #: Seconds without a frame from the host after which the agent ends (0: never):
        #: the dead-man's switch where stdin never reaches EOF when the proxy dies (Modal,
        #: whose exec stream outlives the client); the host sends ``keepalive`` meanwhile.
        self.host_silence_s = host_silence_s
        self.last_host_at = time.monotonic()

        self.zmq = zmq
        self.cwd = cwd or os.getcwd()
        self.kernel_ids = _resolve_user(kernel_user) if kernel_user and os.geteuid() == 0 else None
        if not os.path.isdir(self.cwd):  # a copied workspace (E2B, Modal): made here, the interpreter's
            os.makedirs(self.cwd, exist_ok=True)
            if self.kernel_ids is not None:
                os.chown(self.cwd, self.kernel_ids[0], self.kernel_ids[1])
        #: (uid, gid, home) the interpreter runs as (:attr:`kernel_ids`, above); None: as the agent.
        self.guard = harden_self()
        self.guard["uid_separated"] = self.kernel_ids is not None
        self.ctx = zmq.Context()
        self.seq = 0
        self.sent: collections.deque[tuple[int, bytes]] = collections.deque()
        self.sent_bytes = 0
        self.out_fd = sys.stdout.fileno()
        self.in_fd = sys.stdin.fileno()
        self.inbuf = bytearray()
        # One read(2) per wake-up: os.read(fd, 1 MiB) also maps and unmaps its buffer.
        self.in_file = open(self.in_fd, "rb", buffering=0, closefd=False)
        self.in_chunk = bytearray(1 << 20)
        self.next_reap = 0.0
        self.session = Session(key=uuid.uuid4().hex.encode(), username="sandbox")
        self.runtime_dir = tempfile.mkdtemp(prefix="sk-agent-")
        os.environ["SANDBOX_KERNEL_RUNTIME_DIR"] = self.runtime_dir
        self.kernel: subprocess.Popen | None = None
        self.sockets: dict[str, Any] = {}
        self.own_msg_ids: set[str] = set()
        self.stderr_tail = b""
        self.running = True
        #: Frames emitted but not written yet (see :meth:`flush`); None = write at once.
        self.outq: list[bytes] | None = None
        self.outq_bytes = 0
        self.poller: Any = None
        self.poller_kernel: Any = None
        home = (self.kernel_ids[2] if self.kernel_ids is not None else None) or os.path.expanduser("~")
        roots = tuple(dict.fromkeys(r for r in (self.cwd, home, "/tmp") if r and r != "/"))
        self.files = FileOps(self.emit, self.cwd, roots, hidden=(self.runtime_dir,),
                             owner=self.kernel_ids[:2] if self.kernel_ids is not None else None)
        #: Environment the interpreter gets beyond the agent's own (egress: pip's prefix).
        self.kernel_env: dict[str, str] = {}
        if egress is not None:
            EgressForwarder(*egress).start()
            self.kernel_env["SANDBOX_KERNEL_EGRESS"] = "allowlist"
            if pip_prefix:
                self.kernel_env.update(self._pip_prefix(pip_prefix))

    def _pip_prefix(self, prefix: str) -> dict[str, str]:
        """``pip install`` into ``prefix`` (the scratch space), importable at once: its
        site-packages made now (an import path that does not exist yet is cached as
        missing) and first on the interpreter's path.  The agent's own path is left
        alone: nothing a cell installs can shadow a module the agent imports."""
        import sysconfig

        scheme = sysconfig.get_preferred_scheme("prefix")
        paths = [sysconfig.get_path(k, scheme, vars={"base": prefix, "platbase": prefix})
                 for k in ("purelib", "platlib")]
        for d in dict.fromkeys([*paths, os.path.join(prefix, "bin")]):
            os.makedirs(d, exist_ok=True)
            if self.kernel_ids is not None:
                head = d
                while head.startswith(prefix) and head != os.path.dirname(prefix):
                    os.chown(head, self.kernel_ids[0], self.kernel_ids[1])
                    head = os.path.dirname(head)
        return {"PIP_PREFIX": prefix,
                "PYTHONPATH": os.pathsep.join(dict.fromkeys(paths)),
                "PATH": os.path.join(prefix, "bin") + os.pathsep + os.environ.get("PATH", "")}

    # ---- output to the host -------------------------------------------------

    def emit(self, op: str, **fields) -> None:
        self.seq += 1
        line = (
            json.dumps({"seq": self.seq, "op": op, **fields}, ensure_ascii=True,
                       separators=(",", ":"), default=_json_default).encode("ascii")
            + b"\n"
        )
        self._queue(line)

    def _queue(self, line: bytes) -> None:
        """Keep ``line`` (frame number ``self.seq``) for replay and send it: now, or at
        the next :meth:`flush` while the main loop batches."""
        self.sent.append((self.seq, line))
        self.sent_bytes += len(line)
        while self.sent_bytes > REPLAY_BUFFER_BYTES and len(self.sent) > 1:
            _, old = self.sent.popleft()
            self.sent_bytes -= len(old)
        if self.outq is None:
            self._write(line)
            return
        self.outq.append(line)
        self.outq_bytes += len(line)
        if self.outq_bytes >= WRITE_BATCH_BYTES:
            self.flush()

    def flush(self) -> None:
        """Write the queued frames in one go (one pipe write, one wake-up of the host)."""
        if self.outq:
            data = b"".join(self.outq)
            self.outq.clear()
            self.outq_bytes = 0
            self._write(data)

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            try:
                n = os.write(self.out_fd, view)
            except BlockingIOError:
                time.sleep(0.001)
                continue
            except (BrokenPipeError, OSError):
                return  # host detached; frames stay in self.sent for replay
            view = view[n:]

    def ack(self, upto: int) -> None:
        while self.sent and self.sent[0][0] <= upto:
            _, old = self.sent.popleft()
            self.sent_bytes -= len(old)

    def replay(self, after: int) -> None:
        for seq, line in list(self.sent):
            if seq > after:
                self._write(line)

    # ---- the inner kernel ----------------------------------------------------

    def start_kernel(self) -> None:
        from jupyter_client.connect import write_connection_file

        zmq = self.zmq
        conn_file = os.path.join(self.runtime_dir, f"kernel-{uuid.uuid4().hex[:8]}.json")
        key = uuid.uuid4().hex
        write_connection_file(conn_file, transport="ipc", ip=os.path.join(self.runtime_dir, "k"),
                              key=key.encode(), signature_scheme="hmac-sha256")
        with open(conn_file) as f:
            info = json.load(f)
        self.session.key = key.encode()
        env = {**os.environ, **self.kernel_env}
        env.pop("SANDBOX_KERNEL_AGENT", None)
        ids: dict = {}
        if self.kernel_ids is not None:
            uid, gid, home = self.kernel_ids
            for path in (self.runtime_dir, conn_file):  # the interpreter binds its sockets here
                os.chown(path, uid, gid)
            ids = {"user": uid, "group": gid, "extra_groups": []}
            if home:
                env["HOME"] = home
        self.kernel = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--kernel", "-f", conn_file],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            cwd=self.cwd,
            env=env,
            start_new_session=True,
            **ids,
        )
        assert self.kernel.stderr is not None
        os.set_blocking(self.kernel.stderr.fileno(), False)
        self.stderr_tail = b""
        for s in self.sockets.values():
            s.close(linger=0)
        base = f"ipc://{info['ip']}-"
        self.sockets = {}
        # One identity for every channel, as jupyter_client does: ipykernel sends
        # input_request to the identity the execute_request came from.
        ident = uuid.uuid4().hex.encode()
        for name, kind in (("shell", zmq.DEALER), ("control", zmq.DEALER), ("stdin", zmq.DEALER),
                           ("iopub", zmq.SUB)):
            s = self.ctx.socket(kind)
            s.linger = 0
            if kind == zmq.SUB:
                s.setsockopt(zmq.SUBSCRIBE, b"")
            else:
                s.setsockopt(zmq.IDENTITY, ident)
            s.connect(base + str(info[f"{name}_port"]))
            self.sockets[name] = s
        self._wait_ready()

    def _wait_ready(self) -> None:
        """Send kernel_info_request until both the reply and an IOPub message arrive."""
        zmq = self.zmq
        deadline = time.monotonic() + READY_TIMEOUT_S
        reply = None
        iopub_seen = False
        poller = zmq.Poller()
        poller.register(self.sockets["shell"], zmq.POLLIN)
        poller.register(self.sockets["iopub"], zmq.POLLIN)
        last_sent = 0.0
        kernel = self.kernel
        assert kernel is not None
        while time.monotonic() < deadline:
            if kernel.poll() is not None:
                self._kernel_died()
                return
            self._drain_stderr()
            if time.monotonic() - last_sent > 1.0 and not (reply and iopub_seen):
                msg = self.session.msg("kernel_info_request", {})
                self.own_msg_ids.add(msg["header"]["msg_id"])
                self.session.send(self.sockets["shell"], msg)
                last_sent = time.monotonic()
            for sock, _ in poller.poll(100):
                frames = sock.recv_multipart()
                m = self._deserialize(frames)
                if m is None:
                    continue
                if sock is self.sockets["iopub"]:
                    iopub_seen = True
                elif m["header"]["msg_type"] == "kernel_info_reply":
                    reply = m
            if reply is not None and iopub_seen:
                warm_s = self._warm_completer()
                if self.kernel is None:
                    return  # it died meanwhile (reported)
                self.emit("ready", kernel_info=reply["content"], pid=self.kernel.pid, guard=self.guard,
                          warm_s=round(warm_s, 4))
                return
        self.emit("log", level="error", text=f"inner kernel not ready after {READY_TIMEOUT_S:.0f} s")
        self._kill_kernel()
        self._kernel_died()

    def _warm_completer(self) -> float:
        """Ask the inner kernel for :data:`WARM_COMPLETION` and wait for the reply.

        The first completion of a process imports jedi and loads its grammar
        and the builtins' stubs: 1.0-1.3 s under gVisor with the host's jedi
        cache (1.9-2.2 s without), 0.3 s under bubblewrap (C16, measured with
        the traceback warm-up running alongside).  Done before ``ready``, the
        user's first completion does not pay it, nor wait behind it.  The
        request goes through the inner kernel's own shell socket with the
        agent's msg id (its replies are never relayed), so jedi only ever runs
        on the kernel's own thread.

        Returns
        -------
        float
            Seconds it took (:data:`WARM_TIMEOUT_S` at most; a later reply is dropped).
        """
        zmq = self.zmq
        code = WARM_COMPLETION
        msg = self.session.msg("complete_request", {"code": code, "cursor_pos": len(code)})
        msg_id = msg["header"]["msg_id"]
        self.own_msg_ids.add(msg_id)
        t0 = time.monotonic()
        self.session.send(self.sockets["shell"], msg)
        poller = zmq.Poller()
        poller.register(self.sockets["shell"], zmq.POLLIN)
        poller.register(self.sockets["iopub"], zmq.POLLIN)
        while time.monotonic() - t0 < WARM_TIMEOUT_S:
            if self.kernel is None:
                break
            if self.kernel.poll() is not None:
                self._kernel_died()
                break
            self._drain_stderr()
            for sock, _ in poller.poll(100):
                m = self._deserialize(sock.recv_multipart())  # the agent's own: not relayed
                if (m is not None and sock is self.sockets["shell"]
                        and m["parent_header"].get("msg_id") == msg_id):
                    return time.monotonic() - t0
        return time.monotonic() - t0

    def _deserialize(self, frames):
        try:
            _, msg_list = self.session.feed_identities(frames)
            return self.session.deserialize(msg_list, content=True)
        except Exception as err:  # noqa: BLE001 - a cell can write garbage to our sockets
            self.emit("log", level="warning", text=f"bad message from inner kernel: {err}")
            return None

    def _drain_stderr(self) -> None:
        if self.kernel is None or self.kernel.stderr is None:
            return
        try:
            data = self.kernel.stderr.read()
        except (BlockingIOError, ValueError, OSError):
            return
        if data:
            self.stderr_tail = (self.stderr_tail + data)[-STDERR_TAIL_BYTES:]

    def _kernel_died(self) -> None:
        self._drain_stderr()
        kernel = self.kernel
        assert kernel is not None
        rc = kernel.wait()
        try:
            os.killpg(kernel.pid, signal.SIGKILL)  # reap its children too
        except OSError:
            pass
        self.emit("died", returncode=rc, cause=_describe_exit(rc),
                  stderr=self.stderr_tail.decode("utf-8", "replace"))
        self.kernel = None

    def _kill_kernel(self) -> None:
        if self.kernel is None:
            return
        try:
            os.killpg(self.kernel.pid, signal.SIGKILL)
        except OSError:
            pass
        self.kernel.wait()
        self.kernel = None

    # ---- input from the host ---------------------------------------------------

    def handle_host_frame(self, frame: dict) -> None:
        op = frame.get("op")
        if op == "msg":
            sock = self.sockets.get(frame["channel"])
            if sock is None or self.kernel is None:
                return
            msg = frame["msg"]
            buffers = [base64.b64decode(b) for b in frame.get("buffers", [])]
            self.session.send(sock, msg, buffers=list(buffers) or None)
        elif op == "interrupt":
            if self.kernel is not None:
                try:
                    os.killpg(self.kernel.pid, signal.SIGINT)
                except OSError:
                    pass
        elif op == "ack":
            self.ack(int(frame["seq"]))
        elif op == "replay":
            self.replay(int(frame["after"]))
            self.emit("replayed", after=int(frame["after"]))
        elif op == "ping":
            self.emit("pong")
        elif op == "keepalive":
            pass  # only resets the host-silence clock (_read_host)
        elif op == "reseed":
            # restored from a start template: the interpreter reseeds (after_clone) before
            # its next Python instruction, so before the next request it handles; then the
            # completer is warmed again (a restored process faults in the pages it touches)
            if self.kernel is not None:
                try:
                    os.kill(self.kernel.pid, RESEED_SIGNAL)
                except OSError:
                    pass
                else:
                    self._warm_completer()
        elif op == "restart":
            self._kill_kernel()
            self.start_kernel()
        elif op == "file":
            self.files.handle(frame)
        elif op == "shutdown":
            self.running = False

    def _read_host(self) -> bool:
        try:
            n = self.in_file.readinto(self.in_chunk)
        except BlockingIOError:
            return True
        except OSError:
            n = 0
        if n is None:
            return True  # nothing to read after all
        if not n:
            return False
        self.last_host_at = time.monotonic()
        self.inbuf += memoryview(self.in_chunk)[:n]
        while True:
            nl = self.inbuf.find(b"\n")
            if nl < 0:
                break
            line = bytes(self.inbuf[:nl])
            del self.inbuf[: nl + 1]
            if line.strip():
                self.handle_host_frame(json.loads(line))
        return True

    def relay_inner(self, name: str, sock) -> None:
        """Relay one message of the inner kernel to the host as a ``msg`` frame.

        The message is only relayed, so it is not deserialised: its signature is
        checked (as ``Session.deserialize`` does), ``parent_header`` is parsed (to
        recognise the agent's own probes), and the four JSON parts are spliced into
        the frame as they are when they already fit it (ASCII, one line, an object:
        what ``json.dumps`` makes of ASCII text).  Others are decoded and re-encoded
        with ``ensure_ascii``.  The host parses and checks every frame anyway.
        """
        frames = sock.recv_multipart()
        session = self.session
        try:
            parts = frames[frames.index(DELIM) + 1:]
            if len(parts) < 5:
                raise ValueError("malformed message, must have at least 5 elements")
            signature = parts[0]
            if not signature:
                raise ValueError("Unsigned Message")
            if signature in session.digest_history:
                raise ValueError(f"Duplicate Signature: {signature!r}")
            session._add_digest(signature)
            if not hmac.compare_digest(signature, session.sign(parts[1:5])):
                raise ValueError(f"Invalid Signature: {signature!r}")
            parent = json.loads(parts[2])
            if not isinstance(parent, dict):
                raise ValueError("parent_header is not an object")
            header, metadata, content = (_ascii_json(parts[i]) for i in (1, 3, 4))
            parent_json = _ascii_json(parts[2])
        except Exception as err:  # noqa: BLE001 - a cell can write garbage to our sockets
            self.emit("log", level="warning", text=f"bad message from inner kernel: {err}")
            return
        if parent.get("msg_id") in self.own_msg_ids:
            return  # answers to the agent's own readiness probes
        buffers = b",".join(b'"' + base64.b64encode(b) + b'"' for b in parts[5:])
        self.seq += 1
        self._queue(b"".join((
            b'{"seq":%d,"op":"msg","channel":"%s","msg":{"header":' % (self.seq, name.encode("ascii")),
            header, b',"parent_header":', parent_json, b',"metadata":', metadata,
            b',"content":', content, b'},"buffers":[', buffers, b"]}\n")))

    def _current_poller(self):
        """The poller over stdin, the inner kernel's sockets and its stderr; rebuilt
        only when the inner kernel (and with it the sockets) changed."""
        if self.poller is None or self.poller_kernel is not self.kernel:
            zmq = self.zmq
            poller = zmq.Poller()
            poller.register(self.in_fd, zmq.POLLIN)
            for s in self.sockets.values():
                poller.register(s, zmq.POLLIN)
            if self.kernel is not None and self.kernel.stderr is not None:
                poller.register(self.kernel.stderr.fileno(), zmq.POLLIN)
            self.poller, self.poller_kernel = poller, self.kernel
        return self.poller

    def run(self) -> None:
        zmq = self.zmq
        os.set_blocking(self.in_fd, False)
        self.start_kernel()
        while self.running:
            events = dict(self._current_poller().poll(200))
            if self.in_fd in events and not self._read_host():
                break  # host gone: dead-man's switch
            if self.host_silence_s and time.monotonic() - self.last_host_at > self.host_silence_s:
                sys.stderr.write(f"agent: no frame from the host for {self.host_silence_s:g} s: the proxy "
                                 "is gone; ending (dead-man's switch)\n")
                break
            # iopub first: a reply must never overtake the outputs it follows.
            # Frames relayed in this pass go out in one write.
            self.outq = []
            try:
                for name in ("iopub", "stdin", "shell", "control"):
                    s = self.sockets.get(name)
                    if s is not None and s in events:
                        while s.getsockopt(zmq.EVENTS) & zmq.POLLIN:
                            self.relay_inner(name, s)
            finally:
                self.flush()
                self.outq = None
            # Each check is a few system calls (ptrace stops under gVisor): not on every pass.
            stderr = self.kernel.stderr if self.kernel is not None else None
            now = time.monotonic()
            if not events or now >= self.next_reap or (stderr is not None and stderr.fileno() in events):
                self.next_reap = now + REAP_INTERVAL_S
                self._drain_stderr()
                if self.kernel is not None and self.kernel.poll() is not None:
                    self._kernel_died()
                self._reap_orphans()
        self._kill_kernel()

    def _reap_orphans(self) -> None:
        """As PID 1, collect the exit status of orphaned processes (a daemonised
        ``!cmd &``, a pool worker that outlived its parent) so they do not stay
        zombies; the interpreter itself is left to :class:`subprocess.Popen`."""
        if os.getpid() != 1:
            return
        while True:
            try:
                info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except (ChildProcessError, OSError):
                return
            if info is None or (self.kernel is not None and info.si_pid == self.kernel.pid):
                return
            try:
                os.waitpid(info.si_pid, 0)
            except ChildProcessError:
                return


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "--kernel":
        # ipykernel sleeps 0.5 ms before each execute_reply so outputs reach clients
        # first (its FIXME); the proxy sends a reply only after the inner kernel's idle
        # status, which follows every output, so the sleep (1-2 ms under gVisor) buys nothing.
        run_inner_kernel([*argv[1:], "--HistoryManager.hist_file=:memory:", "--IPythonKernel._execute_sleep=0"])
        return
    import argparse

    parser = argparse.ArgumentParser(prog="agent.py")
    parser.add_argument("--cwd")
    parser.add_argument("--kernel-user", help="run the interpreter as this user (name or uid) "
                        "when the agent is root")
    parser.add_argument("--egress-socket", help="the host's egress proxy socket, forwarded from "
                        "127.0.0.1:--egress-port")
    parser.add_argument("--egress-port", type=int, default=3128)
    parser.add_argument("--pip-prefix", help="where pip installs (egress only)")
    parser.add_argument("--host-silence-s", type=float, default=0.0, help="end after this many seconds "
                        "without a frame from the host (0: never; the host sends keepalive frames)")
    args = parser.parse_args(argv)
    egress = (args.egress_port, args.egress_socket) if args.egress_socket else None
    agent = Agent(cwd=args.cwd, kernel_user=args.kernel_user, egress=egress, pip_prefix=args.pip_prefix,
                  host_silence_s=args.host_silence_s)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if os.getpid() != 1:
        # As PID 1 no handler: an unhandled signal from inside the namespace is discarded.
        signal.signal(signal.SIGTERM, lambda *_: setattr(agent, "running", False))
    agent.run()


def _resolve_user(user: str) -> tuple[int, int, str | None]:
    """``(uid, gid, home)`` of a user name or numeric uid (gid = uid when unknown)."""
    import pwd

    try:
        pw = pwd.getpwuid(int(user)) if user.isdigit() else pwd.getpwnam(user)
    except KeyError:
        if not user.isdigit():
            raise SystemExit(f"agent: no user {user!r} in this sandbox") from None
        return int(user), int(user), None
    return pw.pw_uid, pw.pw_gid, None if user.isdigit() else pw.pw_dir


def harden_self() -> dict:
    """Make this process non-dumpable and say what guards the channel.

    Non-dumpable, Linux refuses ``/proc/<pid>/fd``, ``/proc/<pid>/mem``,
    ``ptrace`` and ``process_vm_readv`` to processes of the same uid without
    ``CAP_SYS_PTRACE`` (gVisor 2022-12 still opens ``/proc/<pid>/fd``: there
    the separate uid does the job).

    Returns
    -------
    dict
        ``non_dumpable`` (bool), ``pid1`` (bool: signals from inside are
        discarded), ``agent_uid`` (int).
    """
    guard = {"agent_uid": os.getuid(), "pid1": os.getpid() == 1, "non_dumpable": False}
    try:
        import ctypes

        guard["non_dumpable"] = ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) == 0
    except (OSError, AttributeError):
        pass
    return guard


if __name__ == "__main__":
    main()
