"""``python -m sandbox_kernel``: the IPKernelApp that runs :class:`~.proxy.SandboxKernel`.

Its own part is the exit: after ``shutdown_request`` the process ends within the
frontend's grace period (jupyter_client sends SIGTERM 2.5 s after the request), with
ipykernel's sockets closed in an order that does not race the control thread.
"""

from __future__ import annotations

import contextlib
import ctypes
import faulthandler
import logging
import os
import sys
import threading
import types

from ipykernel.kernelapp import IPKernelApp
from traitlets import default

from .prestart import HANDOVER_FD_ENV, await_handover, sockets_bound, warm_up
from .proxy import SandboxKernel

log = logging.getLogger("sandbox_kernel")

#: Seconds the process may take to exit once the kernel's loop stopped after a shutdown
#: (closing ZMQ sockets and threads: normally ~0.1 s; ipykernel's sockets linger up to
#: 1 s to flush the last messages).  Past it the thread stacks are logged and the process
#: exits: the sandbox was already removed, nothing is lost.
EXIT_GRACE_S = 1.2


#: The proxy's glibc malloc settings (``mallopt(3)``): blocks up to this many bytes come
#: from the heap, not from a mapping of their own...
PROXY_MMAP_THRESHOLD_BYTES = 32 << 20
#: ...and up to this many bytes of freed memory at the heap's top are kept for reuse.
PROXY_TRIM_THRESHOLD_BYTES = 16 << 20
#: ``mallopt`` parameter numbers (glibc's ``malloc.h``).
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3


def keep_freed_blocks() -> bool:
    """Make glibc keep the proxy's large freed blocks for reuse (``mallopt(3)``).

    Every output passes through the proxy as a JSON line, a parsed message and a
    re-serialised one: a 1 MB image is three or four ~1.4 MB buffers, freed as soon
    as it is relayed.  With glibc's defaults each went back to the kernel (a block
    above the mmap threshold, or the heap's top above the trim threshold) and the
    next image faulted its pages in again, a page fault per 4 KiB.  Measured on
    bubblewrap (interleaved, 30 images each): 66.5 → 62.1 ms per image from this alone
    (with a 64 MiB trim threshold), 67.3 → 54.2 ms with this and the sandbox's
    :data:`~.backends.base.MALLOC_ENV` as shipped (docs/decisions.md).  The cost is at
    most :data:`PROXY_TRIM_THRESHOLD_BYTES` of freed heap kept resident.  An operator's ``MALLOC_MMAP_THRESHOLD_`` or
    ``MALLOC_TRIM_THRESHOLD_`` in the proxy's environment is left in force.

    Returns
    -------
    bool
        True when both settings took effect; False without glibc (its ``mallopt``
        missing) or when the environment sets either.
    """
    if "MALLOC_MMAP_THRESHOLD_" in os.environ or "MALLOC_TRIM_THRESHOLD_" in os.environ:
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, PROXY_MMAP_THRESHOLD_BYTES)) and \
        bool(mallopt(_M_TRIM_THRESHOLD, PROXY_TRIM_THRESHOLD_BYTES))


def _exit_backstop(grace_s: float) -> threading.Timer:
    def overdue() -> None:
        log.error("exit still not done %.1f s after shutdown (the sandbox is already removed); "
                  "thread stacks follow, then the process exits", grace_s)
        with contextlib.suppress(Exception):
            faulthandler.dump_traceback(file=2, all_threads=True)
        os._exit(0)

    timer = threading.Timer(grace_s, overdue)
    timer.daemon = True
    timer.start()
    return timer


class SandboxKernelApp(IPKernelApp):
    """``python -m sandbox_kernel``: the IPKernelApp with the proxy kernel, no IPython shell."""

    name = "sandbox-kernel"
    kernel_class = SandboxKernel
    #: Not IPKernelApp's ``install`` (a stock, unsandboxed kernelspec): :func:`main` hands
    #: ``python -m sandbox_kernel install ...`` to ``sandbox-kernel install``.
    subcommands: dict = {}

    @default("parent_handle")
    def _parent_from_environment(self) -> int:
        """ipykernel reads ``JPY_PARENT_PID`` when it is imported; a pre-started proxy
        (:mod:`.prestart`) is imported before its hand-over sets it.  Read at start, so the
        kernel ends with the process that launched it, as a stock kernel does."""
        return int(os.environ.get("JPY_PARENT_PID") or 0)

    @default("capture_fd_output")
    def _no_fd_capture(self) -> bool:
        return False

    def init_io(self) -> None:
        """The proxy prints nothing to the frontend: keep the process's own stdio."""
        self.displayhook = types.SimpleNamespace(get_execution_count=None)

    def write_connection_file(self, **kwargs) -> None:
        """ipykernel's, called once the sockets are bound; then a pre-started proxy tells its
        provisioner so (:func:`~.prestart.sockets_bound`)."""
        super().write_connection_file(**kwargs)
        sockets_bound()

    def init_gui_pylab(self) -> None:
        """No IPython shell in the proxy."""

    def start(self) -> None:
        """Run the kernel until ``shutdown_request``; then exit within :data:`EXIT_GRACE_S`.

        A frontend waits 2.5 s after ``shutdown_request`` before SIGTERM (jupyter_client's
        ``shutdown_wait_time`` / 2); a process that hung closing ZMQ after the sandbox was
        removed would be killed and reported as a crash.
        """
        super().start()
        kernel = self.kernel
        if isinstance(kernel, SandboxKernel) and kernel._shutting_down:
            _exit_backstop(EXIT_GRACE_S)
        self._end_control_thread()

    def close(self) -> None:
        """ipykernel's orderly close, with the control thread ended first (see
        :meth:`_end_control_thread`)."""
        self._end_control_thread()
        super().close()

    def _end_control_thread(self) -> None:
        """End the control thread, waiting up to :data:`EXIT_GRACE_S`, before IOPub stops.

        After ``shutdown_reply`` the control thread still publishes the ``idle`` status
        through its own IOPub event pipe, while the main loop is already stopped.  At the
        interpreter's exit IOPub's own ``atexit`` stop (registered after :meth:`close`, so
        run before it) closes every thread's event pipe: a control thread still behind
        (a loaded machine) then failed with "Socket operation on non-socket", a traceback
        in the frontend's log and no ``idle`` for the shutdown.  So it is ended here, as
        the main loop returns, before any ``atexit`` handler runs.
        """
        thread = self.control_thread
        if thread is not None and thread.is_alive():
            thread.stop()
            thread.join(EXIT_GRACE_S)


def main(argv: list[str] | None = None) -> None:
    """Launch the proxy kernel (called by the kernelspec); ``python -m sandbox_kernel
    <command>`` with a ``sandbox-kernel`` command (``install``, ``doctor``...) runs that
    command instead, never ipykernel's ``install`` of a stock kernelspec."""
    args = sys.argv[1:] if argv is None else argv
    if args and not args[0].startswith("-"):
        from . import cli

        sys.exit(cli.main(args))
    keep_freed_blocks()
    handover_fd = os.environ.pop(HANDOVER_FD_ENV, None)
    if handover_fd is not None:  # a spare proxy (prestart.py): wait to be handed a kernel
        argv = sys.argv[1:] if argv is None else argv
        warm_up(argv)
        argv = await_handover(int(handover_fd), argv)
        if argv is None:
            return
    logging.basicConfig(stream=sys.__stderr__, level=logging.INFO,
                        format="[sandbox-kernel %(levelname)s] %(message)s")
    SandboxKernelApp.launch_instance(argv=argv)
