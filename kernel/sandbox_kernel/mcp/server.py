"""``sandbox-kernel mcp``: an MCP server whose tools run code in a sandboxed kernel.

Built on the official ``mcp`` SDK's ``FastMCP`` (the ``agents`` extra).  Each
MCP session gets its own kernel (an :class:`~sandbox_kernel.client.AsyncSandbox`
of ``--kernel-name``), started on the first tool call that needs it and shut
down, with its sandbox, when the session ends: the SDK enters the server's
lifespan once per session (stdio: the process; streamable HTTP: each
``Mcp-Session-Id``), and :func:`session_kernel` is that lifespan.

Transports: stdio (default), or streamable HTTP on a loopback address only,
every request carrying ``Authorization: Bearer <token>`` (:mod:`.http`).

Tools: ``execute_code``, ``get_result``, ``wait``, ``interrupt``, ``restart``,
``sandbox_info``, ``list_files``, ``read_file``, ``write_file``, ``snapshot``,
``restore``, ``list_snapshots``, ``fork`` and ``close_fork``.  A fork is a new kernel
of the same session, named by a handle (``fork-1``...) that ``execute_code`` and
``interrupt`` take as ``kernel``; it is shut down by ``close_fork`` or with the session.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections import OrderedDict
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass
from typing import Annotated, Any

from mcp.server.fastmcp import Context, FastMCP
from mcp.server.fastmcp.exceptions import ToolError
from mcp.types import CallToolResult, ContentBlock, ImageContent, TextContent
from pydantic import Field

from ..aio import background
from ..client import AsyncSandbox, CellJob, SnapshotError
from .output import MAX_OUTPUT_BYTES, cap, images, summary, transcript, window

#: Handles kept per session (oldest finished ones forgotten first).
MAX_HANDLES = 200

#: Forks a session may hold at once (``fork``; ``close_fork`` frees them).
MAX_FORKS = 16

#: Largest file ``read_file`` returns and ``write_file`` accepts, bytes.
MAX_FILE_BYTES = 1024 * 1024


@dataclass(frozen=True)
class ServerOptions:
    """The server's settings (the ``sandbox-kernel mcp`` flags).

    Attributes
    ----------
    kernel_name : str
        Kernelspec each session's kernel is started from.
    idle_shutdown_s : float
        Seconds without a tool call (and no cell running) after which the
        session's kernel is shut down; the next call starts a new one and says
        the variables were lost.  0: never.
    max_output_bytes : int
        Cap on the text of one tool result (UTF-8 bytes); the rest is cut with
        a marker and stays readable through ``get_result``.
    default_budget_s : float
        Seconds ``execute_code`` and ``wait`` wait by default before returning a handle.
    start_timeout_s : float
        Seconds to wait for a kernel (and its sandbox) to start.
    """

    kernel_name: str = "sandbox-local"
    idle_shutdown_s: float = 0.0
    max_output_bytes: int = MAX_OUTPUT_BYTES
    default_budget_s: float = 30.0
    start_timeout_s: float = 180.0


class SessionKernel:
    """One MCP session's kernel and its cells' handles.

    Parameters
    ----------
    options : ServerOptions
        Which kernel, when to free it.
    """

    def __init__(self, options: ServerOptions):
        self.options = options
        self.sandbox: AsyncSandbox | None = None
        self.handles: OrderedDict[str, CellJob] = OrderedDict()
        self.last_used = time.monotonic()
        self.freed_note = ""
        self._ids = itertools.count(1)
        self._lock = asyncio.Lock()
        self._watch: asyncio.Future | None = None
        self._in_use = 0
        #: The session's forks, by handle (``fork-1``...): kernels of their own.
        self.forks: OrderedDict[str, AsyncSandbox] = OrderedDict()
        self._fork_ids = itertools.count(1)

    @contextlib.asynccontextmanager
    async def use(self) -> AsyncIterator[AsyncSandbox]:
        """The session's kernel, started (or started anew after an idle shutdown) if needed,
        held for the ``async with`` block: the idle shutdown never closes a kernel a tool
        call is using, and the idle time counts from the end of the last call (not its start,
        which may have waited seconds for a sandbox to start)."""
        self._in_use += 1
        try:
            async with self._lock:
                if self.sandbox is None:
                    sbx = AsyncSandbox(self.options.kernel_name, start_timeout_s=self.options.start_timeout_s)
                    await sbx.start()
                    self.sandbox = sbx
                    if self.options.idle_shutdown_s > 0 and self._watch is None:
                        self._watch = background(self._idle_watch())
                sbx = self.sandbox
            yield sbx
        finally:
            self._in_use -= 1
            self.last_used = time.monotonic()

    @contextlib.asynccontextmanager
    async def kernel(self, name: str | None) -> AsyncIterator[AsyncSandbox]:
        """The session's kernel (``name`` None or ``"main"``: :meth:`use`) or one of its forks."""
        if name in (None, "", "main"):
            async with self.use() as sbx:
                yield sbx
            return
        self.last_used = time.monotonic()
        fork = self.forks.get(str(name))
        if fork is None:
            raise ToolError(f"no kernel {name!r} in this session (kernels: main"
                            f"{''.join(', ' + k for k in self.forks)})")
        yield fork

    async def fork(self, n: int) -> list[str]:
        """Fork the session's kernel ``n`` times; the new kernels' handles.

        Raises
        ------
        SnapshotError
            The kernel refused (its runtime, ``n``, admission) or a fork did not start.
        ToolError
            The session would hold more than :data:`MAX_FORKS` forks.
        """
        if len(self.forks) + n > MAX_FORKS:
            raise ToolError(f"fork: this session holds {len(self.forks)} forks, at most {MAX_FORKS}: "
                            "close_fork the ones no longer needed")
        async with self.use() as sbx:
            forks = await sbx.fork(n)
        names = [f"fork-{next(self._fork_ids)}" for _ in forks]
        self.forks.update(zip(names, forks, strict=True))
        return names

    def keep(self, job: CellJob) -> str:
        """A new handle for ``job``; the oldest finished handles beyond :data:`MAX_HANDLES` are dropped."""
        handle = f"cell-{next(self._ids)}"
        self.handles[handle] = job
        for old in [h for h, j in self.handles.items() if j.done()][: max(0, len(self.handles) - MAX_HANDLES)]:
            del self.handles[old]
        return handle

    def job(self, handle: str) -> CellJob:
        self.last_used = time.monotonic()
        try:
            return self.handles[handle]
        except KeyError:
            raise ToolError(f"no cell with handle {handle!r} in this session (handles: "
                            f"{', '.join(list(self.handles)[-5:]) or 'none yet'})") from None

    async def _idle_watch(self) -> None:
        idle_s = self.options.idle_shutdown_s
        while True:
            await asyncio.sleep(min(idle_s / 4, 5.0))
            if self._idle(idle_s):
                async with self._lock:
                    sbx = self.sandbox
                    if sbx is None or not self._idle(idle_s):  # a call came while the lock was held
                        continue
                    self.sandbox = None
                    self.freed_note = (f"(the previous kernel was shut down after {idle_s:g} s idle: "
                                       "a new one was started and earlier variables are gone)\n")
                    await sbx.close()

    def _idle(self, idle_s: float) -> bool:
        busy = self._in_use or any(not j.done() for j in self.handles.values())
        return self.sandbox is not None and not busy and time.monotonic() - self.last_used > idle_s

    async def close(self) -> None:
        """Shut the kernel and its sandbox down (the session ended)."""
        if self._watch is not None:
            self._watch.cancel()
        forks, self.forks = list(self.forks.values()), OrderedDict()
        await asyncio.gather(*(f.close() for f in forks), return_exceptions=True)
        if self.sandbox is not None:
            sbx, self.sandbox = self.sandbox, None
            await sbx.close()


def _session(ctx: Context) -> SessionKernel:
    return ctx.request_context.lifespan_context


def _result(sk: SessionKernel, handle: str, job: CellJob, offset: int | None = None) -> CallToolResult:
    """A cell's tool result: capped text, images, the structured summary."""
    ex = job.execution
    full = transcript(ex)
    limit = sk.options.max_output_bytes
    if offset is None:
        text, cut = cap(full, limit, handle)
        extra: dict[str, Any] = {}
    else:
        text, nxt = window(full, offset, limit)
        cut = len(full.encode()) - len(text.encode())
        extra = {"offset": offset, "next_offset": nxt}
    if not ex.done:
        text += (f"\n[still running after {time.monotonic() - job.started:.0f} s: call wait(handle={handle!r}) "
                 "or get_result; interrupt() stops it]")
    content: list[ContentBlock] = [TextContent(type="text", text=text or "(no output)")]
    if offset is None:
        content += [ImageContent(type="image", data=data, mimeType=mime) for mime, data in images(ex)]
    return CallToolResult(content=content, structuredContent={**summary(ex, handle, cut), **extra},
                          isError=False)


@contextlib.asynccontextmanager
async def session_kernel(options: ServerOptions) -> AsyncIterator[SessionKernel]:
    """The per-session lifespan: a :class:`SessionKernel`, closed when the session ends."""
    sk = SessionKernel(options)
    try:
        yield sk
    finally:
        await sk.close()


def build_server(options: ServerOptions) -> FastMCP:
    """The MCP server with its tools; serve it with ``run_stdio_async()`` or :mod:`.http`."""
    mcp = FastMCP("sandbox-kernel", log_level="WARNING", lifespan=lambda app: session_kernel(options), instructions=(
        "Python in a sandboxed Jupyter kernel: variables persist across execute_code calls within this "
        "session; the last expression's value and figures are returned; a long cell returns a handle "
        "(wait/get_result). The sandbox has no network unless its operator allowed it."))

    @mcp.tool()
    async def execute_code(
        code: Annotated[str, Field(description="Python source of one cell (IPython syntax: magics, !shell)")],
        ctx: Context,
        budget_s: Annotated[float | None, Field(ge=0, le=3600, description=(
            "seconds this call waits; a cell still running then keeps running and a handle is returned "
            "(default: the server's --budget-s)"))] = None,
        timeout_s: Annotated[float | None, Field(gt=0, description=(
            "seconds after which the cell is interrupted (variables kept); default: none"))] = None,
        kernel: Annotated[str | None, Field(max_length=40, description=(
            "a fork's handle (from the fork tool); default: the session's kernel"))] = None,
    ) -> CallToolResult:
        """Run Python in the session's sandboxed kernel (or a fork of it); returns its output, images and error."""
        sk = _session(ctx)
        async with sk.kernel(kernel) as sbx:
            note, sk.freed_note = sk.freed_note, ""
            job = await sbx.submit(code, timeout=timeout_s)
            handle = sk.keep(job)
        await job.wait(sk.options.default_budget_s if budget_s is None else budget_s)
        res = _result(sk, handle, job)
        if note:
            first = res.content[0]
            assert isinstance(first, TextContent)
            first.text = note + first.text
        return res

    @mcp.tool()
    async def get_result(
        handle: Annotated[str, Field(description="a handle from execute_code")], ctx: Context,
        offset: Annotated[int | None, Field(ge=0, description=(
            "byte offset into the cell's full output (to read what a cap cut); default: the capped view"))] = None,
    ) -> CallToolResult:
        """Output so far of a cell (done or not), without waiting."""
        sk = _session(ctx)
        return _result(sk, handle, sk.job(handle), offset)

    @mcp.tool()
    async def wait(
        handle: Annotated[str, Field(description="a handle from execute_code")], ctx: Context,
        timeout_s: Annotated[float | None, Field(ge=0, le=3600, description=(
            "seconds to wait at most (default: the server's --budget-s)"))] = None,
    ) -> CallToolResult:
        """Wait for a running cell to finish (up to timeout_s), then return its output so far."""
        sk = _session(ctx)
        job = sk.job(handle)
        await job.wait(sk.options.default_budget_s if timeout_s is None else timeout_s)
        return _result(sk, handle, job)

    @mcp.tool()
    async def interrupt(ctx: Context, kernel: Annotated[str | None, Field(max_length=40, description=(
            "a fork's handle; default: the session's kernel"))] = None) -> str:
        """Interrupt the running cell (KeyboardInterrupt in it); variables are kept."""
        async with _session(ctx).kernel(kernel) as sbx:
            await sbx.interrupt()
        return "interrupted"

    @mcp.tool()
    async def restart(ctx: Context) -> str:
        """Restart the interpreter: every variable and import is lost."""
        async with _session(ctx).use() as sbx:
            await sbx.restart()
        return "restarted: the interpreter is fresh, earlier variables are gone"

    @mcp.tool()
    async def snapshot(ctx: Context) -> dict[str, Any]:
        """Keep the kernel's whole state (variables, files, processes) under a new id; the
        kernel goes on. Returns id, created (ISO 8601), size_mib. gVisor kernels, local or on Ray."""
        snap = await _snapshots(ctx, "snapshot")
        return {"id": snap.id, "created": snap.created, "size_mib": snap.size_mib, "removed": snap.removed}

    @mcp.tool()
    async def restore(snapshot_id: Annotated[str, Field(max_length=64)], ctx: Context) -> str:
        """Rewind the kernel in place to a snapshot: its variables, files and processes as
        they were then; a running cell is ended."""
        snap = await _snapshots(ctx, "restore", snapshot_id)
        return f"rewound to snapshot {snap.id} (taken {snap.created}): what ran after it is undone"

    @mcp.tool()
    async def list_snapshots(ctx: Context) -> list[dict[str, Any]]:
        """The kernel's snapshots, oldest first: id, created, size_mib."""
        return [{"id": s.id, "created": s.created, "size_mib": s.size_mib}
                for s in await _snapshots(ctx, "snapshots")]

    @mcp.tool()
    async def fork(ctx: Context, n: Annotated[int, Field(ge=1, le=MAX_FORKS, description=(
            "how many new kernels"))] = 1) -> dict[str, Any]:
        """Start n new kernels from the session's kernel as it is now (variables, modules, files),
        each independent, with its own random draws; returns their handles for execute_code's
        `kernel`. The session's kernel goes on. gVisor kernels, local or on Ray."""
        try:
            names = await _session(ctx).fork(n)
        except SnapshotError as err:
            raise ToolError(f"fork: {err.ename}: {err.evalue}") from err
        return {"kernels": names}

    @mcp.tool()
    async def close_fork(kernel: Annotated[str, Field(max_length=40)], ctx: Context) -> str:
        """Shut a fork (and its sandbox) down."""
        sk = _session(ctx)
        sbx = sk.forks.pop(kernel, None)
        if sbx is None:
            raise ToolError(f"no fork {kernel!r} in this session (forks: {', '.join(sk.forks) or 'none'})")
        await sbx.close()
        return f"{kernel} shut down"

    @mcp.tool()
    async def sandbox_info(ctx: Context) -> dict[str, Any]:
        """Where code runs: backend, isolation boundary, state, limits (units in names), egress."""
        async with _session(ctx).use() as sbx:
            return asdict(await sbx.info())

    @mcp.tool()
    async def list_files(ctx: Context, path: Annotated[str, Field(max_length=4096)] = ".") -> list[dict]:
        """Entries of a directory in the sandbox: name, type, size (bytes)."""
        return await _files(ctx, "list_files", path)

    @mcp.tool()
    async def read_file(path: Annotated[str, Field(max_length=4096)], ctx: Context) -> str:
        """A text file's content from the sandbox (at most 1 MiB)."""
        data = await _files(ctx, "download", path, max_bytes=MAX_FILE_BYTES)
        return data.decode(errors="replace")

    @mcp.tool()
    async def write_file(path: Annotated[str, Field(max_length=4096)],
                         content: Annotated[str, Field(max_length=MAX_FILE_BYTES)], ctx: Context) -> str:
        """Write a text file in the sandbox (at most 1 MiB)."""
        await _files(ctx, "upload", content.encode(), path)
        return f"wrote {len(content.encode())} bytes to {path}"

    return mcp


async def _files(ctx: Context, verb: str, *args: Any, **kwargs: Any) -> Any:
    """The file tools' one call into the client's file comm (``client/files.py``); the
    sandbox's refusals (missing file, outside its areas, too large) become tool errors."""
    try:
        async with _session(ctx).use() as sbx:
            return await getattr(sbx, verb)(*args, **kwargs)
    except (NotImplementedError, OSError, ValueError) as err:
        raise ToolError(f"{verb} {args[-1] if verb == 'upload' else args[0]!r}: "
                        f"{type(err).__name__}: {err}") from err


async def _snapshots(ctx: Context, verb: str, *args: Any) -> Any:
    """The snapshot tools' one call into the client; a refusal (this runtime cannot, an
    unknown id, one already under way) becomes a tool error naming its cause."""
    try:
        async with _session(ctx).use() as sbx:
            return await getattr(sbx, verb)(*args)
    except SnapshotError as err:
        raise ToolError(f"{verb}: {err.ename}: {err.evalue}") from err


def serve_stdio(options: ServerOptions) -> None:
    """Serve on stdin/stdout until the client closes them."""
    asyncio.run(build_server(options).run_stdio_async())
