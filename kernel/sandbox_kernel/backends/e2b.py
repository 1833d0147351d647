"""The E2B backend: the agent in an E2B Firecracker microVM.

Built on :class:`e2b_code_interpreter.AsyncSandbox` (optional extra
``pip install 'sandbox-kernel[e2b]'``; this module and its copy verbs,
:mod:`.e2b_copies`, are the only ones importing the SDK, and only the entry point
``e2b`` imports them).  Snapshot, rewind and fork: :mod:`.e2b_copies`.

How the stream works
--------------------
:meth:`E2BBackend.start` creates a sandbox from the code-interpreter template
(its ``python3`` has ipykernel and jupyter_client), uploads the agent's zipapp with
the files API and starts it with ``commands.run(..., background=True,
stdin=True, timeout=0)``.  The agent's stdout arrives as chunks that do not
align with frames and that the SDK decodes as UTF-8 with replacement; the
framing is ASCII (:mod:`sandbox_kernel.protocol`), so re-encoding the text
gives the original bytes and the proxy re-splits them.  Input goes through
``commands.send_stdin``.

Pause, resume and replay
------------------------
E2B's pause keeps memory and files, and DROPS every open stream; output
produced while nobody listens is lost.  So:

1. the proxy calls :meth:`pause`; the reader sees :meth:`read` return ``b""``
   (the stream is detached) and stops reading;
2. before the next request the proxy calls :meth:`resume`, which reconnects
   (``AsyncSandbox.connect``) and reattaches to the agent with
   ``commands.connect(pid)``;
3. the proxy restarts its reader, then writes
   ``host_op_frame("replay", after=<last seq seen>)``; the agent re-sends every
   frame it buffered after that number, and the proxy drops duplicates by
   ``seq``.

A stream cut by the network (not by a pause) is reattached the same way, from the
reader itself (:meth:`reconnect`, :attr:`reconnect_s`), once E2B says the sandbox runs.

The API key never enters the sandbox: it is passed to the SDK's HTTP calls
only, the sandbox and the agent get a fixed environment (:func:`agent_env`).
"""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import logging
import os
import shlex
import time
from pathlib import Path
from typing import Any

import e2b
from e2b import exceptions as e2b_errors
from e2b_code_interpreter import AsyncSandbox
from traitlets import Unicode, default

from ..egress.rules import cloud_allowlist
from ..errors import (
    BackendError,
    CredentialsMissing,
    SandboxDied,
    SandboxStartError,
    SnapshotError,
)
from ..guest import WORKSPACE_DIR, agent_archive
from ..policy import Policy
from .base import (
    TAG,
    Capabilities,
    ExitInfo,
    SandboxBackend,
    interpreter_env,
    ready_timeout_trait,
    seconds_trait,
    signal_suffix,
)
from .e2b_copies import E2BCopies

#: The user the interpreter runs as (the template's default user); the agent is root.
KERNEL_USER = "user"
#: Where the agent is uploaded inside the sandbox.
AGENT_REMOTE_PATH = "/home/user/.sandbox-kernel/agent.pyz"
#: Working directory of the kernel inside the sandbox.
WORKDIR = "/home/user"
#: Largest ``send_stdin`` call, bytes; bigger writes are split (in order).
STDIN_CHUNK_BYTES = 1 << 20
#: Default dead-man's switch: the sandbox dies this long after the last refresh, seconds.
DEFAULT_DEADMAN_S = 300.0
#: Bytes of the agent's stderr kept to explain its end.
STDERR_TAIL_BYTES = 8192
BOUNDARY = "Firecracker microVM (E2B)"
#: What the SDK raises (not all of it derives from ``SandboxException``).
SDK_ERRORS = (e2b_errors.SandboxException, e2b_errors.AuthenticationException,
              e2b_errors.ServiceBusyException)


def agent_env(policy: Policy) -> dict[str, str]:
    """The agent's whole extra environment: a fixed base plus :attr:`Policy.env`.

    Nothing from the host's environment is passed, so ``E2B_API_KEY`` never
    reaches the sandbox (:data:`~sandbox_kernel.policy.FORBIDDEN_ENV` keeps it
    out of :attr:`Policy.env` too).
    """
    return {**interpreter_env(policy), **policy.env_dict}


def network_options(policy: Policy) -> dict[str, Any]:
    """Map :attr:`Policy.network` and ``allow_domains`` to ``AsyncSandbox.create``'s
    ``allow_internet_access`` and ``network``.

    ``network="none"``, or an allowlist naming nothing: no internet access (E2B's
    ``deny_out=["0.0.0.0/0"]``).  Otherwise everything is denied (``deny_out``) but
    ``allow_out``: the names and ``*.`` wildcards of ``allow_domains`` and its public
    IP literals (E2B's ``allow_out`` wins over ``deny_out``).  E2B matches names only
    on port 80 (the Host header) and 443 (TLS SNI) and lets DNS out to 8.8.8.8
    (docs/security.md, "Egress").

    Returns
    -------
    dict
    """
    allowed = cloud_allowlist(policy)
    if allowed is None:
        return {"allow_internet_access": False}
    return {"allow_internet_access": True, "network": {"allow_out": [*allowed[0], *allowed[1]],
                                                         "deny_out": ["0.0.0.0/0"]}}


def map_sdk_error(err: BaseException, doing: str) -> Exception:
    """Translate an e2b SDK exception into the project's hierarchy.

    Parameters
    ----------
    err : BaseException
        What the SDK raised.
    doing : str
        What was attempted, for the message ("create the sandbox").

    Returns
    -------
    Exception
        :class:`CredentialsMissing`, :class:`SandboxDied` or
        :class:`BackendError`; raise it ``from err``.
    """
    text = f"{type(err).__name__}: {err}"[:500]
    if isinstance(err, e2b_errors.AuthenticationException):
        return CredentialsMissing(
            f"E2B rejected the API key while trying to {doing} ({text}); set E2B_API_KEY "
            "to a valid key from https://e2b.dev/dashboard and run `sandbox-kernel doctor`")
    if isinstance(err, (e2b_errors.NotFoundException, e2b_errors.SandboxNotRunningException)):
        return SandboxDied(
            f"the E2B sandbox is gone (could not {doing}: {text}); it may have passed its "
            "timeout; restart the kernel to get a new one")
    if isinstance(err, e2b_errors.RateLimitException):
        return BackendError(f"E2B rate-limited the request to {doing} ({text}); retry in a "
                            "few seconds or lower the number of concurrent kernels")
    if isinstance(err, e2b_errors.TimeoutException):
        return BackendError(f"E2B did not answer in time to {doing} ({text}); check the "
                            "network with `sandbox-kernel doctor` and retry")
    return BackendError(f"E2B failed to {doing} ({text}); run `sandbox-kernel doctor`, "
                        "then retry or restart the kernel")


class E2BBackend(E2BCopies, SandboxBackend):
    """A sandbox in E2B's cloud running the agent.

    Parameters
    ----------
    policy : Policy
        ``network`` and ``allow_domains`` map to ``allow_internet_access`` and
        ``network`` (:func:`network_options`); ``env`` is added to
        the agent's environment; ``lifetime_s`` caps the refreshed lifetime.
        The memory, CPU, process and scratch limits are the template's own
        (:attr:`enforced_fields`; the kernel warns at start).
    kernel_id : str
        Put in the sandbox's metadata (``kernel_id``) with ``owner`` and a
        ``sandbox-kernel`` tag, so an orphan can be found in E2B's sandbox
        list; it ends when its timeout runs out (``sandbox-kernel gc`` reaps
        local sandboxes only).
    log, **kwargs
        See :class:`SandboxBackend`; the options below are traits
        (``--E2BBackend.template=...``).
    """

    name = "e2b"
    display_name = "E2B"
    enforced_fields = frozenset({"network", "env", "lifetime_s", "workspace", "workspace_path", "allow_domains"})
    egress_enforcement = (
        "E2B's firewall: deny_out 0.0.0.0/0 with allow_out = allow_domains (names and '*.' wildcards "
        "matched only on port 80 by the Host header and on 443 by TLS SNI; public IP literals on every "
        "port); weaker than local: DNS to 8.8.8.8 is let out (a channel for data), other ports and UDP "
        "are matched by address only, a refused TCP connection may look accepted inside; not enforced: "
        "allow_ports, egress_resolve, the per-cell caps; attempts are not reported to the kernel, so no "
        "denial line in the cell and no record in kernel_info")
    credentials_hint = ("E2B_API_KEY in the proxy's environment, or E2BBackend.api_key "
                        "(a key from https://e2b.dev/dashboard)")

    api_key = Unicode(None, allow_none=True, config=True, help="E2B API key, sent to E2B's API "
                      "only, never into the sandbox (a kernelspec holding it must be private). "
                      "Default: the proxy's E2B_API_KEY.")
    template = Unicode(config=True, help="Template name or id; its python must have ipykernel and "
                       "jupyter_client. Default: the SDK's code-interpreter template "
                       f"({AsyncSandbox.default_template}).")
    python = Unicode("python3", config=True, help="Interpreter inside the sandbox. Default: python3.")
    owner = Unicode(config=True, help="The sandbox's metadata 'owner'. Default: the host user name.")
    deadman_s = seconds_trait(DEFAULT_DEADMAN_S, "Sandbox timeout set at creation and by each "
                              "refresh, capped by lifetime_s: the sandbox dies this long after the "
                              "proxy stops. Refreshed at least every deadman_s / 3 (refresh_every_s "
                              "is lowered to that when larger).")
    request_timeout_s = seconds_trait(60.0, "Timeout of each E2B API request.")
    reconnect_s = seconds_trait(30.0, "How long a cut stream to a sandbox E2B still runs is retried "
                                "(the agent then replays what the cut lost: state kept) before the "
                                "sandbox is given up and a fresh one started.")
    ready_timeout_s = ready_timeout_trait(180.0)
    fork_from = Unicode("", config=True, help="Set by the client that starts a fork (never by hand): "
                        "the hand-off naming the running E2B fork this kernel adopts at its first start "
                        "(sandbox_kernel.backends.e2b_copies).")

    @default("template")
    def _default_template(self) -> str:
        return AsyncSandbox.default_template

    @default("owner")
    def _default_owner(self) -> str:
        return _user_name()

    def __init__(self, policy: Policy, kernel_id: str, log: logging.Logger | None = None, **kwargs: Any):
        super().__init__(policy, kernel_id, log, **kwargs)
        # The switch must be refreshed well before it runs out, whatever the two options
        # say: a refresh every 30 s of a 20 s switch lets E2B kill a live sandbox.
        if self.refresh_every_s > self.deadman_s / 3:
            self.log.info("refreshing the E2B sandbox's timeout every %.1f s (deadman_s=%.0f s), "
                          "not every %.1f s", self.deadman_s / 3, self.deadman_s, self.refresh_every_s)
            self.refresh_every_s = self.deadman_s / 3
        self._sbx: AsyncSandbox | None = None
        self._pid: int | None = None
        self._handle: Any = None
        self._queue: asyncio.Queue[bytes] = asyncio.Queue()
        self._watch: asyncio.Task | None = None
        self._write_lock = asyncio.Lock()
        self._stderr_tail = bytearray()
        self._paused = False
        self._created_at = 0.0
        self._end: tuple[int | None, str | None] | None = None
        self._pending = b""  # read by a copy's reseed, for the relay to read first
        self._copying = False  # a fork or snapshot is dropping the stream (E2B's way)
        self._e2b_snaps: dict[str, tuple[str, int]] = {}  # snapshots: ours -> (E2B's id, agent pid)

    # ---- description -----------------------------------------------------------

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(boundary=BOUNDARY, pause_keeps_memory=True)

    def describe(self) -> dict:
        d = super().describe()
        d.update(template=self.template, paused=self._paused)
        if self._sbx is not None:
            d["sandbox_id"] = self._sbx.sandbox_id
        return d

    @property
    def sandbox_id(self) -> str | None:
        """The E2B sandbox id, once started."""
        return self._sbx.sandbox_id if self._sbx is not None else None

    @property
    def agent_pid(self) -> int | None:
        """The agent's process id inside the sandbox (for ``commands.connect``)."""
        return self._pid

    def _key(self) -> str:
        key = self.api_key or os.environ.get("E2B_API_KEY")
        if not key:
            raise CredentialsMissing(
                "no E2B API key: export E2B_API_KEY=e2b_... (from https://e2b.dev/dashboard) "
                "or set --E2BBackend.api_key, then run `sandbox-kernel doctor`")
        return key

    def _opts(self) -> dict:
        return {"api_key": self._key(), "request_timeout": self.request_timeout_s}

    # ---- lifecycle -------------------------------------------------------------

    async def start(self) -> None:
        """Create the sandbox, upload the agent and start it.

        Called by the proxy at kernel start and after the sandbox died or was
        stopped, before any :meth:`write`.

        Raises
        ------
        CredentialsMissing
            No API key, or E2B rejected it.
        SandboxStartError
            The sandbox or the agent did not come up (message says why).
        BackendError
            Any other SDK failure.
        """
        await self.kill()
        if self.fork_from:  # a fork's first start: adopt the running copy (.e2b_copies)
            await self._start_fork()
            return
        await self._open_sandbox()
        assert self._sbx is not None
        try:
            agent = await asyncio.to_thread(lambda: Path(agent_archive()).read_bytes())
            await self._sbx.files.write(AGENT_REMOTE_PATH, agent)
            # The agent runs as root and the interpreter as E2B's "user": the interpreter
            # can then neither open, signal nor trace the agent (docs/security.md).
            cwd = WORKSPACE_DIR if self.policy.workspace != "none" else WORKDIR  # copied in by the proxy
            cmd = shlex.join([self.python, "-u", AGENT_REMOTE_PATH, "--cwd", cwd,
                              "--kernel-user", KERNEL_USER])
            handle = await self._sbx.commands.run(
                cmd, background=True, stdin=True, timeout=0, envs=agent_env(self.policy), user="root",
                cwd=WORKDIR, on_stdout=self._on_stdout, on_stderr=self._on_stderr,
                retain_output=False)
        except SDK_ERRORS as err:
            await self.kill()
            raise _start_error(map_sdk_error(err, "start the agent")) from err
        self._attach(handle)
        self.log.info("E2B sandbox %s started (%s, template %s)", self._sbx.sandbox_id,
                      BOUNDARY, self.template)

    async def _open_sandbox(self, template: str | None = None, sandbox_id: str | None = None) -> None:
        """Create a sandbox from ``template`` (default :attr:`template`; a snapshot's id
        restores it), or connect to the running ``sandbox_id`` (a fork); it becomes this
        kernel's, its lifetime counted from now.

        Raises
        ------
        CredentialsMissing, SandboxStartError
        """
        opts = self._opts()
        self._created_at = 0.0
        try:
            if sandbox_id is not None:
                self._sbx = await AsyncSandbox.connect(sandbox_id, timeout=self._timeout_s(), **opts)
            else:
                metadata = {TAG: "1", "kernel_id": self.kernel_id, "owner": self.owner,
                            "proxy_host": os.uname().nodename}
                self._sbx = await AsyncSandbox.create(
                    template=template or self.template, timeout=self._timeout_s(), metadata=metadata,
                    **network_options(self.policy), **opts)
        except SDK_ERRORS as err:
            doing = f"connect to the fork {sandbox_id}" if sandbox_id else "create the sandbox"
            raise _start_error(map_sdk_error(err, doing)) from err
        self._created_at = time.monotonic()
        self._paused = False

    def _map_copy_error(self, err: BaseException, doing: str) -> SnapshotError:
        """An SDK error of a copy verb, as ``SnapshotFailed`` naming E2B's words."""
        self._copying = False
        return SnapshotError(str(map_sdk_error(err, doing) if isinstance(err, SDK_ERRORS) else
                                 f"E2B failed to {doing} ({type(err).__name__}: {err})"[:600]))

    def _timeout_s(self) -> int:
        """Seconds to grant now: the dead-man's switch, capped by ``lifetime_s``."""
        left = self.policy.lifetime_s - (time.monotonic() - self._created_at if self._created_at else 0)
        return max(1, int(min(self.deadman_s, left)))

    def _attach(self, handle: Any) -> None:
        self._handle = handle
        self._pid = handle.pid
        self._end = None
        self._queue = queue = asyncio.Queue[bytes]()
        self._watch = asyncio.ensure_future(self._watch_end(handle, queue))

    async def _watch_end(self, handle: Any, queue: asyncio.Queue) -> None:
        """Push ``b""`` into ``queue`` when the command stream ends or breaks."""
        try:
            result = await handle.wait()
            self._end = (result.exit_code, None)
        except asyncio.CancelledError:
            pass
        except e2b.CommandExitException as err:
            self._end = (err.exit_code, err.error)
        except Exception as err:  # noqa: BLE001 - the stream broke: pause, network, sandbox gone
            self._end = (None, f"{type(err).__name__}: {err}"[:300])
        finally:
            queue.put_nowait(b"")

    def _on_stdout(self, text: str) -> None:
        # ASCII frames: re-encoding the SDK's text gives the original bytes.
        self._queue.put_nowait(text.encode("utf-8"))

    def _on_stderr(self, text: str) -> None:
        self._stderr_tail += text.encode("utf-8", "replace")
        del self._stderr_tail[:-STDERR_TAIL_BYTES]
        self.log.debug("agent stderr: %s", text[:2000].rstrip())

    async def _detach(self) -> None:
        handle, self._handle = self._handle, None
        if handle is not None:
            with contextlib.suppress(Exception):
                await handle.disconnect()
        if self._watch is not None:
            await asyncio.gather(self._watch, return_exceptions=True)
            self._watch = None
        self._queue.put_nowait(b"")

    async def read(self) -> bytes:
        """Return the next chunk of the agent's stdout (any size, any split).

        Returns ``b""`` when the stream ends: the agent exited, the sandbox
        died, or :meth:`pause`/:meth:`kill` detached it.  After ``b""``, call
        it again only after :meth:`resume` or :meth:`start`; until then it
        returns ``b""`` at once.
        """
        if self._pending:
            data, self._pending = self._pending, b""
            return data
        data = await self._queue.get()
        if not data:
            self._queue.put_nowait(b"")  # stay ended until the next attach
        return data

    async def write(self, data: bytes) -> None:
        """Send whole frames to the agent's stdin, in order.

        Raises
        ------
        SandboxDied
            The sandbox is paused, gone, or the agent exited.
        BackendError
            Another SDK failure.
        """
        sbx, pid = self._sbx, self._pid
        if sbx is None or pid is None or self._handle is None:
            raise SandboxDied("the E2B sandbox is not attached (paused or stopped); "
                              "resume it before writing")
        async with self._write_lock:
            for i in range(0, len(data), STDIN_CHUNK_BYTES):
                try:
                    await sbx.commands.send_stdin(pid, data[i:i + STDIN_CHUNK_BYTES])
                except SDK_ERRORS as err:
                    mapped = map_sdk_error(err, "send input to the agent")
                    if not isinstance(mapped, CredentialsMissing):
                        mapped = SandboxDied(str(mapped))
                    raise mapped from err

    async def pause(self) -> None:
        """Detach the stream and pause the sandbox (E2B keeps memory and files).

        Called by the idle lifecycle after ``pause_after_s``.  :meth:`read`
        returns ``b""`` afterwards; output the agent produces later is
        buffered by the agent for a ``replay``.

        Raises
        ------
        SandboxDied, BackendError
            If E2B cannot pause it.
        """
        if self._sbx is None or self._paused:
            return
        await self._detach()
        try:
            await self._sbx.pause(**self._opts())
        except SDK_ERRORS as err:
            raise map_sdk_error(err, "pause the sandbox") from err
        self._paused = True
        self.log.info("E2B sandbox %s paused", self._sbx.sandbox_id)

    async def resume(self) -> None:
        """Resume the sandbox and reattach to the agent.

        Called by the proxy before relaying the next request after a pause.
        Afterwards :meth:`read` yields the reattached stream; the proxy must
        then send a ``replay`` frame (``after`` = last ``seq`` it saw) because
        E2B dropped whatever the agent wrote while detached.

        Raises
        ------
        SandboxDied
            The sandbox or the agent is gone (e.g. its timeout passed).
        BackendError
            Another SDK failure.
        """
        if self._sbx is None or self._pid is None:
            raise SandboxDied("no E2B sandbox to resume; restart the kernel")
        try:
            await self._sbx.connect(timeout=self._timeout_s(), **self._opts())
        except SDK_ERRORS as err:
            raise map_sdk_error(err, "resume the sandbox") from err
        self._paused = False
        await self._reattach()
        self.log.info("E2B sandbox %s resumed", self._sbx.sandbox_id)

    async def _reattach(self) -> None:
        assert self._sbx is not None and self._pid is not None
        if self._handle is not None:
            await self._detach()
        try:
            handle = await self._sbx.commands.connect(
                self._pid, timeout=0, on_stdout=self._on_stdout, on_stderr=self._on_stderr,
                retain_output=False)
        except SDK_ERRORS as err:
            mapped = map_sdk_error(err, "reattach to the agent")
            raise (SandboxDied(f"the agent is gone: {mapped}")
                   if isinstance(mapped, BackendError) else mapped) from err
        self._attach(handle)

    async def refresh(self) -> None:
        """Extend the sandbox's timeout by ``deadman_s`` (capped by ``lifetime_s``).

        Called periodically by the proxy; when the proxy dies, the sandbox dies
        ``deadman_s`` seconds later.  A paused sandbox is not refreshed.

        Raises
        ------
        SandboxDied, BackendError
            If E2B refuses.
        """
        if self._sbx is None or self._paused:
            return
        try:
            await self._sbx.set_timeout(self._timeout_s(), **self._opts())
        except SDK_ERRORS as err:
            raise map_sdk_error(err, "refresh the sandbox timeout") from err

    async def kill(self) -> None:
        """Destroy the sandbox (idempotent); called at shutdown, restart and stop.

        Errors are logged, not raised: the sandbox's timeout reaps it anyway.
        """
        sbx, self._sbx = self._sbx, None
        self._pending = b""  # a killed copy's reseed output: never read before the next sandbox's
        await self._detach()
        if sbx is None:
            return
        try:
            await sbx.kill(**self._opts())
        except (*SDK_ERRORS, CredentialsMissing) as err:
            self.log.warning("could not kill E2B sandbox %s (%s); its timeout will reap it",
                             sbx.sandbox_id, err)
        self._pid = None
        self._paused = False
        self.log.info("E2B sandbox %s killed", sbx.sandbox_id)

    async def reconnect(self) -> bool:
        """Reattach to the agent after its stream broke (a network cut: E2B's client
        does not resume a stream), while E2B says the sandbox runs, for up to
        :attr:`reconnect_s` seconds.  Not after a pause, a kill (the stream was detached
        on purpose) or the agent's exit (an exit code came).

        Returns
        -------
        bool
            True: reattached, :meth:`read` yields the new stream (the caller asks for a
            replay).  False: the sandbox or the agent is gone, or E2B did not come back
            in time; :meth:`exit_info` says which.
        """
        code, error = self._end or (None, None)
        if self._paused or self._handle is None or self._sbx is None or code is not None or error is None:
            return False
        deadline = time.monotonic() + self.reconnect_s
        while time.monotonic() < deadline:
            state = await self._sandbox_state()
            if state == "gone":
                return False
            if state == "running":
                try:
                    await self._reattach()
                except SandboxDied:
                    return False
                except BackendError as err:
                    self.log.info("reattaching to the agent failed, retrying: %s", err)
                else:
                    (self.log.info if self._copying else self.log.warning)(
                        "the stream from E2B sandbox %s %s (%s); reattached", self._sbx.sandbox_id,
                        "was dropped by E2B's fork or snapshot" if self._copying else "broke", error)
                    self._copying = False
                    return True
            await asyncio.sleep(1.0)
        return False

    async def exit_info(self) -> ExitInfo:
        """Explain why the stream ended; called after an unexpected ``b""``.

        A code above 128 is a signal (the shell's convention, as envd reports a
        killed process); a broken stream is explained by asking E2B whether the
        sandbox still exists (at most 5 s): ended (killed, or past its timeout), or
        alive behind a lost connection, or unknown when E2B does not answer.
        """
        if self._watch is not None:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._watch), 5)
        tail = self._stderr_tail.decode("utf-8", "replace").strip().splitlines()[-3:]
        code, error = self._end or (None, None)
        # a killed agent or a broken stream: did the whole sandbox go?
        state = await self._sandbox_state() if not self._paused and (code is None or code > 128) else ""
        if self._paused:
            cause = "the stream was detached by a pause"
        elif state == "gone":
            cause = ("the E2B sandbox ended: it was killed or passed its timeout "
                     f"(deadman_s={self.deadman_s:g} s, lifetime_s={self.policy.lifetime_s:g} s)")
        elif code is not None and code > 128:
            cause = f"the agent was killed by signal {code - 128}{signal_suffix(code - 128)}"
        elif code is not None:
            cause = f"the agent exited with code {code}"
        elif error and state is None:
            cause = f"the connection to E2B broke and E2B did not say whether the sandbox lives ({error})"
        elif error:
            cause = f"the connection to the E2B sandbox broke while it was {state} ({error})"
        else:
            cause = "the E2B sandbox stopped answering"
        if tail:
            cause += " (" + " | ".join(tail)[-300:] + ")"
        return ExitInfo(cause=cause, returncode=code)

    async def _sandbox_state(self) -> str | None:
        """``"gone"``, E2B's state of the sandbox (``"running"``, ``"paused"``), or None
        when E2B did not answer within 5 s."""
        sbx = self._sbx
        if sbx is None:
            return "gone"
        try:
            info = await asyncio.wait_for(sbx.get_info(api_key=self._key(), request_timeout=5.0), 5)
        except (e2b_errors.NotFoundException, e2b_errors.SandboxNotRunningException):
            return "gone"
        except Exception:  # noqa: BLE001 - unreachable, refused, timed out: unknown
            return None
        state = str(getattr(info, "state", "") or "running")
        return state.rsplit(".", 1)[-1].lower()

    # ---- diagnostics -----------------------------------------------------------

    async def doctor(self) -> list[str]:
        """Check the key and that E2B's API answers (one listing request, at most
        15 s); called by ``sandbox-kernel doctor``.

        Returns
        -------
        list of str
            Problems found, each with a next step; empty when all is well.
        """
        key = self.api_key or os.environ.get("E2B_API_KEY")
        if not key:
            return ["E2B_API_KEY is not set: export it (https://e2b.dev/dashboard) or set E2BBackend.api_key"]
        try:
            await AsyncSandbox.list(api_key=key, request_timeout=min(self.request_timeout_s, 15.0),
                                    limit=1).next_items()
        except SDK_ERRORS as err:
            return [str(map_sdk_error(err, "list sandboxes"))]
        except OSError as err:
            return [f"cannot reach E2B's API ({err}); check the network or E2B_API_URL"]
        return []


def _start_error(err: Exception) -> Exception:
    if isinstance(err, (CredentialsMissing, SandboxStartError)):
        return err
    return SandboxStartError(str(err))


def _user_name() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return str(os.getuid())
