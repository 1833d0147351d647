"""The inner kernel's patches of ipykernel and IPython: one function per patch.

Each names the release it was written for and the attributes it replaces
(:func:`targets`); :func:`apply_all` checks those attributes exist before it applies
a patch, and says on the interpreter's stderr which patch it left out and why, so a
kernel on another ipykernel or IPython runs stock where a patch no longer fits
instead of failing at start.

Runs inside the user's interpreter.
"""

from __future__ import annotations

import importlib
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable

#: The registered patches, in the order :func:`apply_all` applies them.
PATCHES: list[Callable[[], None]] = []


def targets(package: str, version: str, *attrs: str) -> Callable[[Callable[[], None]], Callable[[], None]]:
    """Register a patch written for ``package`` ``version`` that replaces ``attrs``.

    Parameters
    ----------
    package : str
        The distribution whose code it patches (``"ipykernel"``, ``"IPython"``).
    version : str
        The release it was written and tested against.
    *attrs : str
        What it replaces, as ``"module:Qualified.name"`` (``"module:name"`` for a function).
    """
    def register(fn: Callable[[], None]) -> Callable[[], None]:
        fn.target = (package, version, attrs)  # type: ignore[attr-defined]
        PATCHES.append(fn)
        return fn
    return register


def missing_targets(attrs: tuple[str, ...]) -> list[str]:
    """Those of ``attrs`` (``"module:Qualified.name"``) that do not resolve here."""
    missing = []
    for attr in attrs:
        module, _, path = attr.partition(":")
        try:
            obj = importlib.import_module(module)
            for part in path.split("."):
                obj = getattr(obj, part)
        except (ImportError, AttributeError):
            missing.append(attr)
    return missing


def apply_all() -> list[str]:
    """Apply every registered patch whose targets all exist.

    Returns
    -------
    list of str
        The names of the patches left out, each also said on stderr with the
        installed version and what it lacks.
    """
    from importlib import metadata

    skipped = []
    for patch in PATCHES:
        package, version, attrs = patch.target  # type: ignore[attr-defined]
        missing = missing_targets(attrs)
        if missing:
            try:
                installed = metadata.version(package)
            except metadata.PackageNotFoundError:
                installed = "(not installed)"
            sys.stderr.write(f"sandbox-kernel: patch {patch.__name__} (written for {package} {version}) "
                             f"not applied: {package} {installed} has no {', '.join(missing)}\n")
            skipped.append(patch.__name__)
            continue
        patch()
    return skipped


@targets("ipykernel", "7.4", "ipykernel.iostream:OutStream._watch_pipe_fd", "ipykernel.iostream:OutStream.flush")
def lossless_fd_capture() -> None:
    """Make ipykernel's file-descriptor capture lossless and ordered.

    1. ``OutStream._watch_pipe_fd`` decodes each ``read()`` on its own with
       ``errors="replace"``, so a UTF-8 character split across two writes
       becomes U+FFFD.  An incremental decoder keeps the partial character.
    2. ``OutStream.flush`` first waits for fd-level output already in the pipe,
       so it is published before the cell's reply and idle status (C07).
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

    iostream.OutStream._watch_pipe_fd = _watch_pipe_fd
    iostream.OutStream.flush = flush


@targets("ipykernel", "7.4", "ipykernel.iostream:OutStream._is_master_process",
         "ipykernel.iostream:IOPubThread._is_master_process")
def pid_read_once() -> None:
    """Read the process id once, not on every write.

    ``OutStream.write`` calls ``os.getpid()`` on every write (twice per
    ``print``) to tell a forked child from the kernel.  Under gVisor each is
    a system call the Sentry serves (2-25 µs on systrap), which held stdout
    to a fifth of stock ipykernel's MB/s (measured, ``docs/decisions.md``).
    The pid is read once and read again in a forked child
    (``os.register_at_fork``), the only way it changes for Python code.
    """
    from ipykernel import iostream

    pid = [os.getpid()]
    os.register_at_fork(after_in_child=lambda: pid.__setitem__(0, os.getpid()))

    def _is_master_process(self):
        return pid[0] == self._master_pid

    iostream.OutStream._is_master_process = _is_master_process
    iostream.IOPubThread._is_master_process = _is_master_process


@targets("ipykernel", "7.4", "ipykernel.iostream:IOPubThread._setup_pipe_in",
         "ipykernel.iostream:IOPubThread._setup_pipe_out")
def iopub_pipe_over_ipc() -> None:
    """Give forked children's output an IPC socket, not a TCP listener.

    ``IOPubThread`` binds a TCP listener on 127.0.0.1 for forked children; an
    IPC socket does the same job, keeps the sandbox free of TCP listeners and
    lets gVisor checkpoint it.
    """
    import zmq
    from ipykernel import iostream
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
    ipykernel captures (decoded incrementally, :func:`lossless_fd_capture`), its stderr
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



@targets("IPython", "9.x", "ipykernel.zmqshell:system", "IPython.core.interactiveshell:getoutput")
def shell_commands_without_pty() -> None:
    """``!cmd`` and ``x = !cmd`` run without a pseudo-terminal, stdin at EOF
    (:func:`_system`, :func:`_getoutput`; C08, C09)."""
    from ipykernel import zmqshell
    from IPython.core import interactiveshell

    zmqshell.system = _system
    interactiveshell.getoutput = _getoutput  # type: ignore[assignment]


@targets("ipykernel", "7.4", "ipykernel.ipkernel:IPythonKernel._cancel_on_sigint")
def interrupt_awaiting_cell() -> None:
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



@targets("ipykernel", "7.4", "ipykernel.kernelbase:Kernel.dispatch_shell")
def comm_status() -> None:
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

