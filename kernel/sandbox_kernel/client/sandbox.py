"""``AsyncSandbox`` and its sync facade ``Sandbox``: one call per cell for agents.

A client of the kernel like any frontend: it speaks the Jupyter protocol
(through ``jupyter_client`` or a Jupyter Server), never the in-sandbox
agent's.  The cells run wherever the kernel runs them: a sandbox-kernel
kernelspec runs them in its sandbox (gVisor, bubblewrap, E2B, Modal).

Examples
--------
::

    from sandbox_kernel import Sandbox

    with Sandbox("sandbox-local") as sbx:
        sbx.run("x = 1")
        print(sbx.run("x + 1").results[0].text)        # '2'
        ex = sbx.run("import time; time.sleep(10)", timeout=2)
        print(ex.error.ename, ex.error.timed_out)       # TimeoutError True
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import os
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from ..aio import background
from .execution import Callback, Collector, Execution, ExecutionError
from .files import FileComm, SandboxChannel
from .info import InputCallback, SandboxInfo
from .snapshots import SnapshotError, SnapshotVerbs
from .transport import KernelTransport, Transport

log = logging.getLogger("sandbox_kernel.client")

#: The kernelspec started when none is named (``sandbox-kernel install`` writes it).
DEFAULT_KERNEL = "sandbox-local"

#: Seconds between liveness checks while a cell is silent.
_LIVENESS_S = 5.0
#: Seconds a restart waits, after a ``kernel_info_reply``, for that request's IOPub status.
_NUDGE_S = 0.5
#: Seconds a cell that has its ``execute_reply`` waits for more of its IOPub (its ``idle``)
#: before it ends without it (nbclient's ``iopub_timeout`` is 4 s); each message restarts it.
IOPUB_GRACE_S = 30.0

T = TypeVar("T")


class CellJob:
    """A cell sent to the kernel; its :attr:`execution` fills in while it runs.

    Attributes
    ----------
    msg_id : str
        The ``execute_request``'s id.
    started : float
        ``time.monotonic()`` when it was sent, seconds.
    execution : Execution
        Partial while the cell runs (``done`` False), complete after.
    """

    def __init__(self, msg_id: str, execution: Execution):
        self.msg_id = msg_id
        self.execution = execution
        self.task: asyncio.Future | None = None
        #: ``time.monotonic()`` when the cell was sent.
        self.started = time.monotonic()

    def done(self) -> bool:
        """True once the cell finished (or failed to)."""
        return self.execution.done

    async def wait(self, timeout_s: float | None = None) -> bool:
        """Wait up to ``timeout_s`` seconds (None: until done); True if done.  The cell keeps running."""
        assert self.task is not None
        with_timeout = asyncio.wait_for(asyncio.shield(self.task), timeout_s)
        try:
            await with_timeout
        except TimeoutError:
            return False
        return True


async def _maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


class AsyncSandbox(SnapshotVerbs):
    """A sandboxed kernel for one agent or script (async; :class:`Sandbox` is the sync twin).

    Give one of: a kernelspec name (started here and shut down by :meth:`close`),
    ``connection_file`` (a running kernel; :meth:`close` only disconnects),
    or ``url`` and ``token`` of a Jupyter Server (a kernel of ``kernel_name``
    started there and deleted by :meth:`close`, or ``kernel_id`` of a running one).

    Parameters
    ----------
    kernel_name : str, optional
        Kernelspec name, default ``"sandbox-local"`` (``sandbox-kernel list``).
    connection_file : str, optional
        Path of a running kernel's connection file.
    url, token : str, optional
        A Jupyter Server's base URL and token.
    kernel_id : str, optional
        With ``url``: a kernel already running on that server.
    on_input : callable(prompt: str, password: bool) -> str, optional
        Answers ``input()`` and ``getpass()`` in cells.  Without it a cell
        calling ``input()`` fails at once with ``StdinNotImplementedError``.
    start_timeout_s : float
        Seconds to wait for the kernel (and its first sandbox) to be ready.
    interrupt_grace_s : float
        Seconds a timed-out cell gets to stop after the interrupt before
        :meth:`run` gives up waiting (the error then says so).
    transport : Transport, optional
        A ready-made connection (tests, other servers); overrides the others.
    """

    def __init__(self, kernel_name: str | None = None, *, connection_file: str | os.PathLike | None = None,
                 url: str | None = None, token: str | None = None, kernel_id: str | None = None,
                 on_input: InputCallback | None = None, start_timeout_s: float = 180.0,
                 interrupt_grace_s: float = 30.0, cwd: str | None = None, transport: Transport | None = None):
        if transport is None:
            if url is not None:
                from .remote import ServerTransport

                if not token:
                    raise ValueError("a Jupyter Server URL needs its token (token=...)")
                transport = ServerTransport(url, token, kernel_name=None if kernel_id else
                                            (kernel_name or DEFAULT_KERNEL), kernel_id=kernel_id)
            elif connection_file is not None:
                transport = KernelTransport(connection_file=os.fspath(connection_file))
            else:
                transport = KernelTransport(kernel_name=kernel_name or DEFAULT_KERNEL, cwd=cwd)
        self.transport = transport
        self.on_input = on_input
        self.start_timeout_s = start_timeout_s
        self.interrupt_grace_s = interrupt_grace_s
        self._routes: dict[str, asyncio.Queue] = {}
        self._jobs: set[CellJob] = set()
        self._channel = SandboxChannel(self)
        self._files = FileComm(self._channel)
        self.started = False

    # ---- lifecycle ------------------------------------------------------------------

    async def start(self) -> AsyncSandbox:
        """Start (or reach) the kernel; returns self.

        Raises
        ------
        TimeoutError
            The kernel was not ready within ``start_timeout_s``.
        ConnectionError
            The Jupyter Server refused (bad token, unknown kernel).
        """
        if not self.started:
            await self.transport.start(self._deliver, self.start_timeout_s)
            self.started = True
        return self

    async def __aenter__(self) -> AsyncSandbox:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Shut the kernel down (and its sandbox) if this client started it, else disconnect.
        Cells still running end with a ``KernelClosed`` error.  Idempotent."""
        self._fail_jobs("KernelClosed", "the client was closed while this cell ran")
        if self.started:
            self.started = False
            await self.transport.close()

    def route(self, msg_id: str) -> asyncio.Queue:
        """A queue that gets ``(channel, msg)`` for every message parented to ``msg_id``
        (and ``("client", {"ename", "evalue"})`` if a cell's route is failed), until
        :meth:`unroute`.  Called by :class:`~.files.SandboxChannel` before it sends a request."""
        queue: asyncio.Queue = asyncio.Queue()
        self._routes[msg_id] = queue
        return queue

    def unroute(self, msg_id: str) -> None:
        """Stop routing the messages parented to ``msg_id`` (see :meth:`route`)."""
        self._routes.pop(msg_id, None)

    def _deliver(self, channel: str, msg: dict[str, Any]) -> None:
        queue = self._routes.get((msg.get("parent_header") or {}).get("msg_id", ""))
        if queue is not None:
            queue.put_nowait((channel, msg))

    def _fail_jobs(self, ename: str, evalue: str) -> None:
        for job in list(self._jobs):
            queue = self._routes.get(job.msg_id)
            if queue is not None:
                queue.put_nowait(("client", {"ename": ename, "evalue": evalue}))

    async def _request(self, channel: str, msg_type: str, content: dict[str, Any], timeout_s: float) -> dict:
        """Send a request and return its reply's content."""
        if not self.started:
            await self.start()
        msg = self.transport.message(msg_type, content)
        msg_id = msg["header"]["msg_id"]
        queue = self.route(msg_id)
        try:
            self.transport.send(channel, msg)
            deadline = time.monotonic() + timeout_s
            while True:
                ch, reply = await asyncio.wait_for(queue.get(), max(0.0, deadline - time.monotonic()))
                if ch == channel and reply.get("msg_type") == msg_type.replace("_request", "_reply"):
                    return reply["content"]
        finally:
            self.unroute(msg_id)

    # ---- cells ----------------------------------------------------------------------

    async def submit(self, code: str, *, timeout: float | None = None,  # noqa: ASYNC109 (public API name)
                     on_stdout: Callback | None = None,
                     on_stderr: Callback | None = None, on_result: Callback | None = None,
                     on_input: InputCallback | None = None) -> CellJob:
        """Send a cell and return at once; the returned :class:`CellJob` fills in as it runs.

        Same parameters as :meth:`run`.
        """
        if not self.started:
            await self.start()
        answer = on_input or self.on_input
        msg = self.transport.message("execute_request", {
            "code": code, "silent": False, "store_history": True, "user_expressions": {},
            "allow_stdin": answer is not None, "stop_on_error": False})
        job = CellJob(msg["header"]["msg_id"], Execution())
        queue: asyncio.Queue = asyncio.Queue()
        self._routes[job.msg_id] = queue
        self._jobs.add(job)
        collector = Collector(job.execution, on_stdout, on_stderr, on_result)
        t0 = time.monotonic()
        self.transport.send("shell", msg)
        job.task = background(self._follow(job, queue, collector, t0, timeout, answer))
        return job

    async def run(self, code: str, *, timeout: float | None = None,  # noqa: ASYNC109 (public API name)
                  on_stdout: Callback | None = None,
                  on_stderr: Callback | None = None, on_result: Callback | None = None,
                  on_input: InputCallback | None = None) -> Execution:
        """Run one cell and return what it produced.

        Parameters
        ----------
        code : str
            The cell's source.
        timeout : float, optional
            Seconds; past it the cell is interrupted (the kernel and its
            variables are kept) and ``error.ename`` is ``"TimeoutError"`` with
            ``error.timed_out`` True.  None: wait as long as the cell runs.
        on_stdout, on_stderr : callable(str), optional
            Called with each chunk of output as it arrives (may be async;
            with :class:`Sandbox`, called on the client's own thread).
        on_result : callable(Result), optional
            Called with each rich output (``execute_result``, ``display_data``).
        on_input : callable(prompt, password) -> str, optional
            Overrides the sandbox's ``on_input`` for this cell.

        Returns
        -------
        Execution
            ``stdout``, ``stderr``, ``results``, ``error``, ``execution_count``,
            ``duration_s`` (seconds).  A cell error is returned, not raised.

        Raises
        ------
        TimeoutError
            The kernel could not be started (``start_timeout_s``).
        """
        job = await self.submit(code, timeout=timeout, on_stdout=on_stdout, on_stderr=on_stderr,
                                on_result=on_result, on_input=on_input)
        await job.wait()
        return job.execution

    async def _follow(self, job: CellJob, queue: asyncio.Queue, collector: Collector, t0: float,
                      timeout_s: float | None, answer: InputCallback | None) -> None:
        ex = job.execution
        deadline = None if timeout_s is None else t0 + timeout_s
        replied, last_iopub = False, t0
        try:
            while not (replied and collector.idle):
                wait_s = _LIVENESS_S if deadline is None else min(_LIVENESS_S, deadline - time.monotonic())
                if replied:
                    wait_s = min(wait_s, last_iopub + IOPUB_GRACE_S - time.monotonic())
                try:
                    channel, msg = await asyncio.wait_for(queue.get(), max(0.0, wait_s))
                except TimeoutError:
                    if replied and time.monotonic() - last_iopub >= IOPUB_GRACE_S:
                        log.warning("cell %s: no IOPub idle within %.0f s of its execute_reply from %s; "
                                    "its output may be incomplete", job.msg_id, IOPUB_GRACE_S,
                                    self.transport.where)
                        return
                    if deadline is not None and time.monotonic() >= deadline:
                        if ex.error is not None and ex.error.timed_out:
                            ex.error.evalue += (f"; it did not stop within {self.interrupt_grace_s} s of the "
                                                "interrupt (it may still run: call restart())")
                            return
                        deadline = await self._on_timeout(ex, timeout_s)
                    elif not await self.transport.is_alive():
                        ex.error = ExecutionError("KernelDied", f"the kernel ({self.transport.where}) ended "
                                                  "while this cell ran; call restart() or start a new Sandbox")
                        return
                    continue
                if channel == "iopub":
                    collector.apply(msg)
                    last_iopub = time.monotonic()
                elif channel == "shell" and msg.get("msg_type") == "execute_reply":
                    replied, last_iopub = True, time.monotonic()
                    collector.apply_reply(msg.get("content") or {}, msg.get("metadata"))
                elif channel == "stdin" and msg.get("msg_type") == "input_request":
                    await self._answer_input(msg.get("content") or {}, answer)
                elif channel == "client":
                    ex.error = ExecutionError(msg["ename"], msg["evalue"])
                    return
                for pending in collector.pending:
                    await _maybe_await(pending)
                collector.pending.clear()
        finally:
            self._finish(job, ex, t0, answer)

    async def _on_timeout(self, ex: Execution, timeout_s: float | None) -> float:
        """The cell ran past its timeout: interrupt it; return the grace's deadline."""
        await self.transport.interrupt()
        ex.error = ExecutionError("TimeoutError", f"the cell ran longer than its timeout of {timeout_s} s and "
                                  "was interrupted; the kernel and its variables are kept", timed_out=True)
        return time.monotonic() + self.interrupt_grace_s

    def _finish(self, job: CellJob, ex: Execution, t0: float, answer: InputCallback | None) -> None:
        ex.duration_s = time.monotonic() - t0
        if ex.error is not None and ex.error.ename == "StdinNotImplementedError" and answer is None:
            ex.error.evalue += " (the cell called input(): pass on_input= to Sandbox or run() to answer it)"
        ex.done = True
        self._routes.pop(job.msg_id, None)
        self._jobs.discard(job)

    async def _answer_input(self, content: dict[str, Any], answer: InputCallback | None) -> None:
        prompt, password = str(content.get("prompt", "")), bool(content.get("password", False))
        value = "" if answer is None else str(await _maybe_await(answer(prompt, password)))
        self.transport.send("stdin", self.transport.message("input_reply", {"value": value}))

    # ---- the kernel -----------------------------------------------------------------

    async def interrupt(self) -> None:
        """Interrupt the running cell (``KeyboardInterrupt`` in it); the state is kept."""
        await self.transport.interrupt()

    async def restart(self, timeout_s: float | None = None) -> None:
        """Restart the interpreter: every variable is lost.  Running cells end with
        ``KernelRestarted``; returns once the kernel answers again.

        Raises
        ------
        RuntimeError
            The kernel was reached by connection file (its owner must restart it).
        """
        self._fail_jobs("KernelRestarted", "the kernel was restarted while this cell ran")
        await self.transport.restart()
        await self._until_iopub_connected(timeout_s or self.start_timeout_s)

    async def _until_iopub_connected(self, timeout_s: float) -> None:
        """Send ``kernel_info_request`` until its IOPub status arrives too (jupyter_client's
        ``wait_for_ready``, Jupyter Server's "nudge").

        After a restart the shell socket reconnects and queues, but the IOPub subscription
        reconnects on its own (a zmq SUB, every 100 ms): a cell sent the moment the shell
        answers could publish its output, and its ``idle``, before anyone subscribed again.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            msg = self.transport.message("kernel_info_request", {})
            queue = self.route(msg["header"]["msg_id"])
            try:
                self.transport.send("shell", msg)
                replied = published = False
                # one try: the reply, then its IOPub status within _NUDGE_S
                try_until = deadline
                while not (replied and published):
                    left = min(deadline, try_until) - time.monotonic()
                    if left <= 0:
                        break
                    try:
                        channel, _ = await asyncio.wait_for(queue.get(), left)
                    except TimeoutError:
                        break
                    if channel == "shell" and not replied:
                        replied, try_until = True, time.monotonic() + _NUDGE_S
                    published = published or channel == "iopub"
                if replied and published:
                    return
            finally:
                self.unroute(msg["header"]["msg_id"])
            if time.monotonic() >= deadline:
                raise TimeoutError(f"the kernel ({self.transport.where}) did not answer within {timeout_s} s "
                                   "of its restart")

    async def info(self, timeout_s: float = 60.0) -> SandboxInfo:
        """Where and how cells run: backend, boundary, state, limits, egress.

        From ``kernel_info_reply["sandbox"]``, which the proxy answers itself
        (it does not wake a paused sandbox).
        """
        return SandboxInfo.from_kernel_info(await self._request("shell", "kernel_info_request", {}, timeout_s))

    # ---- files (the kernel's file comm, docs/files.md; the protocol is client/files.py) ---------

    async def upload(self, src: str | os.PathLike | bytes, dest: str) -> dict[str, Any]:
        """Copy ``src`` (a host path, read chunk by chunk, or bytes) to ``dest`` in the sandbox,
        through the kernel's file comm (``docs/files.md``); served even while a cell runs.

        Returns
        -------
        dict
            ``path`` (inside the sandbox), ``size`` (bytes), ``sha256`` (hex), as checked inside.

        Raises
        ------
        FileNotFoundError, PermissionError, FileExistsError, ValueError
            As the sandbox refused (outside its writable areas, a symlink, a read-only workspace).
        sandbox_kernel.files.FileTransferError
            Over the kernel's size limit (``ename`` ``FileTooLarge``) or a failed transfer.
        NotImplementedError
            Over a Jupyter Server connection (no binary message buffers in this client yet).
        """
        await self._channel.ready()
        return await self._files.upload(dest, src)

    async def download(self, path: str, *, max_bytes: int | None = None) -> bytes:
        """The bytes of ``path`` in the sandbox, checked against the kernel's size and SHA-256.

        Parameters
        ----------
        max_bytes : int, optional
            Refuse a larger file (``ValueError``) before any byte moves.

        Raises
        ------
        FileNotFoundError, PermissionError, ValueError
            As the sandbox refused (missing, a symlink, a special file, outside its areas), or
            over ``max_bytes``.
        sandbox_kernel.files.FileTransferError
            Over the kernel's size limit, or bytes that do not add up.
        NotImplementedError
            Over a Jupyter Server connection (no binary message buffers in this client yet).
        """
        await self._channel.ready()
        return bytes(await self._files.download(path, max_bytes=max_bytes))

    async def list_files(self, path: str = ".") -> list[dict[str, Any]]:
        """The entries of the directory ``path`` in the sandbox: ``name``, ``type`` (file,
        directory, symlink, other), ``size`` (bytes), ``mtime`` (s since the epoch), ``mode``.

        Raises
        ------
        FileNotFoundError, NotADirectoryError, PermissionError
            As the sandbox refused.
        NotImplementedError
            Over a Jupyter Server connection (no binary message buffers in this client yet).
        """
        await self._channel.ready()
        return list((await self._files.list_files(path))["entries"])

    async def stat(self, path: str) -> dict[str, Any]:
        """``path`` in the sandbox (a symlink not followed): ``path``, ``type``, ``size``
        (bytes), ``mtime`` (s since the epoch), ``mode``.  Raises as :meth:`list_files`."""
        await self._channel.ready()
        return await self._files.stat(path)

    async def remove(self, path: str) -> dict[str, Any]:
        """Remove a regular file or an empty directory in the sandbox; returns ``path`` and
        ``removed`` (``"file"`` or ``"directory"``).  Raises as :meth:`list_files`."""
        await self._channel.ready()
        return await self._files.remove(path)

    async def sync(self) -> dict[str, Any]:
        """Copy the sandbox's changes to a copied workspace (E2B, Modal with ``workspace=rw``)
        back to the host folder now; a mounted workspace (local) needs none.

        Returns
        -------
        dict
            ``files``: one ``path``, ``action`` (``updated``, ``created``, ``kept-both``: the host
            file changed meanwhile and ``detail`` names the sandbox's version beside it, or
            ``skipped``), ``detail`` per file; ``note`` when there was nothing to copy.
        """
        await self._channel.ready()
        return await self._files.sync()


class _Loop:
    """An event loop on a thread of its own, for the sync facade (works inside a running loop too)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="sandbox-kernel-client", daemon=True)
        self.thread.start()

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def stop(self) -> None:
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join()
            self.loop.close()


class Sandbox:
    """The sync twin of :class:`AsyncSandbox`: same parameters, same methods, blocking.

    Its async core runs on a thread of its own, so it also works inside a
    notebook; callbacks (``on_stdout``, ``on_input``, ...) are called on that thread.
    """

    def __init__(self, kernel_name: str | None = None, **kwargs: Any):
        self._loop = _Loop()
        self.aio = AsyncSandbox(kernel_name, **kwargs)

    def __enter__(self) -> Sandbox:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """See :meth:`AsyncSandbox.close`; also stops the client's thread."""
        if self._loop.loop.is_closed():
            return
        try:
            self._loop.call(self.aio.close())
        finally:
            self._loop.stop()

    def start(self) -> Sandbox:
        """See :meth:`AsyncSandbox.start`; on failure the client's thread is stopped too."""
        try:
            self._loop.call(self.aio.start())
        except BaseException:
            self.close()
            raise
        return self

    @classmethod
    def _of(cls, aio: AsyncSandbox) -> Sandbox:
        sbx = cls.__new__(cls)
        sbx._loop, sbx.aio = _Loop(), aio
        return sbx

    def fork(self, n: int = 1, timeout_s: float = 120.0) -> list[Sandbox]:
        """Blocking :meth:`AsyncSandbox.fork`: ``n`` new kernels from this one's current state,
        each a :class:`Sandbox` with a thread of its own, started side by side.

        Raises
        ------
        SnapshotError
            As :meth:`AsyncSandbox.fork` (the forks started are closed again).
        """
        forks = [Sandbox._of(self.aio.forked(a)) for a in self._loop.call(self.aio.fork_arguments(n, timeout_s))]
        started = [asyncio.run_coroutine_threadsafe(f.aio.start_as_fork(), f._loop.loop) for f in forks]
        failed = [err for err in (fut.exception() for fut in started) if err is not None]
        if failed:
            for f in forks:
                f.close()
            raise failed[0] if isinstance(failed[0], SnapshotError) else SnapshotError(
                "ForkFailed", f"a fork did not start: {failed[0]!r}") from failed[0]
        return forks


def _blocking(name: str) -> Callable[..., Any]:
    coro_fn = getattr(AsyncSandbox, name)

    @functools.wraps(coro_fn)
    def method(self: Sandbox, *args: Any, **kwargs: Any) -> Any:
        return self._loop.call(getattr(self.aio, name)(*args, **kwargs))

    method.__doc__ = f"Blocking :meth:`AsyncSandbox.{name}`.\n\n{inspect.getdoc(coro_fn) or ''}"
    return method


#: The verbs generated for :class:`Sandbox` from :class:`AsyncSandbox` (never hand-kept twins).
SYNC_VERBS = ("run", "interrupt", "restart", "info", "upload", "download", "list_files", "stat", "remove",
              "sync", "snapshot", "restore", "snapshots")
for _name in SYNC_VERBS:
    setattr(Sandbox, _name, _blocking(_name))
