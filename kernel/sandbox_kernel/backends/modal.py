"""The Modal backend: the agent in a ``modal.Sandbox`` (a gVisor container).

What the sandbox is:

* an image built from ``modal.Image.debian_slim`` with ``ipykernel`` and
  ``jupyter_client`` pip-installed and the agent's source added at
  :data:`~sandbox_kernel.guest.AGENT_PATH` (or the operator's own
  ``image``, which must contain both packages);
* ``block_network=True`` (the policy's ``network="none"``), CPU and memory
  from the policy (``cpu_cores``, ``memory_mib``), an optional GPU;
* a server-side dead-man's switch: ``timeout`` (the policy's ``lifetime_s``,
  at most Modal's 24 h) and ``idle_timeout`` (seconds without an exec or
  stdin; the running agent counts as activity, so it reaps a sandbox whose
  agent died while the proxy's own idle policy decides everything else);
* tagged with the kernel id, so an orphan can be found in Modal's sandbox
  list; it ends at its ``timeout`` or ``idle_timeout`` (``sandbox-kernel gc``
  reaps local sandboxes only).

The agent runs through ``Sandbox.exec`` in bytes mode.  :meth:`read` yields
its stdout; every write goes through one writer task (``stdin.write`` then
``drain``), so frames never interleave; stderr is drained into a tail for
:meth:`exit_info`, so the process never blocks on it.  Modal's client reads
stdout by byte offset and writes stdin by offset, retrying both on transient
errors, so a network blip between the host and Modal loses nothing; if the
stream is lost for good, :meth:`read` returns ``b""`` and :meth:`exit_info`
says so.

Modal credentials are read on the host (``~/.modal.toml`` or
``MODAL_TOKEN_ID``/``MODAL_TOKEN_SECRET``) and used only by the client; the
sandbox's environment is built from the policy alone.

The ``modal`` SDK is imported in this module only (``pip install
'sandbox-kernel[modal]'``); importing :mod:`sandbox_kernel` never imports it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from traitlets import Any as AnyTrait
from traitlets import Bool, Float, Integer, List, Unicode

from .. import protocol
from ..egress.rules import cloud_allowlist
from ..errors import BackendError, BackendNotFound, CredentialsMissing, SandboxDied, SandboxStartError
from ..guest import AGENT_PATH, WORKSPACE_DIR, agent_archive
from ..policy import FORBIDDEN_ENV, Policy
from .base import Capabilities, ExitInfo, SandboxBackend, interpreter_env, ready_timeout_trait, signal_suffix

MODAL_BOUNDARY = "gVisor container (Modal)"
#: Modal's longest sandbox lifetime, seconds.
MODAL_MAX_TIMEOUT_S = 24 * 3600
#: Packages installed in the default image (the agent needs both).
DEFAULT_PACKAGES = ("ipykernel>=6.29", "jupyter_client>=8.6")
#: Seconds of silence from the proxy after which the agent ends (:attr:`ModalBackend.deadman_s`).
DEFAULT_DEADMAN_S = 60.0
#: Bytes of the agent's stderr kept for :meth:`ModalBackend.exit_info`.
STDERR_TAIL_BYTES = 8192


def _modal():
    """Import the Modal SDK (never at package import time)."""
    try:
        import modal
        import modal.exception
    except ImportError as err:
        raise BackendNotFound("the modal backend needs its extra: pip install 'sandbox-kernel[modal]'") from err
    return modal


def sandbox_env(policy: Policy) -> dict[str, str]:
    """The environment given to the sandbox: a fixed base plus :attr:`Policy.env`.

    Nothing from the host is inherited; names in
    :data:`~sandbox_kernel.policy.FORBIDDEN_ENV` and any ``MODAL_*`` name are
    dropped even if they got into the policy.
    """
    env = {**interpreter_env(policy), **policy.env_dict}
    return {k: v for k, v in env.items() if k not in FORBIDDEN_ENV and not k.startswith("MODAL_")}


def network_kwargs(policy: Policy) -> dict[str, Any]:
    """``modal.Sandbox.create``'s network arguments for the policy.

    ``network="none"``, or an allowlist naming nothing: ``block_network=True``.
    Otherwise ``outbound_domain_allowlist`` (the names and ``*.`` wildcards of
    ``allow_domains``) and ``outbound_cidr_allowlist`` (its public IP literals, as
    ``/32`` or ``/128``; non-public ones are left out, as the local proxy refuses them).

    Returns
    -------
    dict
    """
    allowed = cloud_allowlist(policy)
    if allowed is None:
        return {"block_network": True}
    names, cidrs = allowed
    return {"block_network": False, "outbound_domain_allowlist": names,
            "outbound_cidr_allowlist": [f"{c}/{32 if '.' in c else 128}" for c in cidrs]}


class ModalBackend(SandboxBackend):
    """One Modal sandbox running the agent; see the module docstring.

    Parameters
    ----------
    policy : Policy
        ``cpu_cores`` (cores), ``memory_mib`` (MiB), ``lifetime_s`` (seconds,
        capped at 86400) and ``env`` are used; ``network`` and ``allow_domains``
        map to Modal's ``block_network`` and outbound allowlists (:func:`network_kwargs`).
        ``pids_max`` and ``scratch_mib`` are not (:attr:`enforced_fields`;
        the kernel warns at start).
    kernel_id : str
        Put in the sandbox's tags (``sandbox-kernel.kernel_id``).
    log, **kwargs
        See :class:`SandboxBackend`; the options below are traits
        (``--ModalBackend.gpu=T4``), except ``image`` and ``client``, which
        only Python code can pass (objects, not configuration).

    Raises
    ------
    BackendNotFound
        If the ``modal`` package is not installed.
    """

    name = "modal"
    display_name = "Modal"
    enforced_fields = frozenset({"memory_mib", "cpu_cores", "lifetime_s", "network", "env", "workspace",
                                 "workspace_path", "allow_domains"})
    egress_enforcement = (
        "Modal's outbound_domain_allowlist (allow_domains' names, '*.' wildcards as Modal matches them) "
        "and outbound_cidr_allowlist (public IP literals, /32 or /128), enforced by Modal outside the "
        "container; every port of an allowed name, DNS as Modal's resolver answers it; not enforced: "
        "allow_ports, egress_resolve, the per-cell caps; attempts are not reported to the kernel, so no "
        "denial line in the cell and no record in kernel_info")
    credentials_hint = ("~/.modal.toml, or MODAL_TOKEN_ID and MODAL_TOKEN_SECRET in the proxy's "
                        "environment (`modal token new`)")
    copies_unsupported = ("Modal's snapshot_filesystem keeps the files, not the interpreter, and its "
                          "memory snapshots (Sandbox._experimental_snapshot, used by the idle pause with "
                          "ModalBackend.memory_snapshots) are experimental and not yet used for this")

    app_name = Unicode("sandbox-kernel", config=True, help="Modal app the sandboxes belong to "
                       "(looked up, created if missing). Default: sandbox-kernel.")
    gpu = Unicode(None, allow_none=True, config=True, help="Modal GPU spec such as 'T4' or "
                  "'A10G:2'. Default: none.")
    idle_timeout_s = Integer(600, config=True, help="Server-side idle timeout, the backstop that "
                             "reaps a sandbox whose agent exited; 0 disables it. Unit: s. Default: 600.")
    deadman_s = Float(DEFAULT_DEADMAN_S, min=0.0, config=True, help="The agent ends after this many "
                      "seconds without a frame from the proxy, which sends a keepalive every deadman_s / 3: "
                      "a killed proxy's sandbox then ends idle_timeout_s later instead of running to its "
                      "timeout (Modal's exec stream outlives the client). 0 disables it. Unit: s. Default: 60.")
    python_version = Unicode(None, allow_none=True, config=True, help="Python of the default image "
                             "(e.g. '3.12'). Default: Modal's default.")
    packages = List(Unicode(), config=True, help="Extra pip requirements for the default image. "
                    "Default: none.")
    memory_snapshots = Bool(False, config=True, help="Opt-in, experimental: pause takes a memory "
                            "snapshot (_experimental_snapshot), so idle sandboxes keep their state. "
                            "Default: False (idle sandboxes are stopped with a notice).")
    workdir = Unicode(None, allow_none=True, config=True, help="Working directory of the agent and "
                      "the kernel. Default: the image's.")
    ready_timeout_s = ready_timeout_trait(180.0)
    image = AnyTrait(None, allow_none=True, help="A modal.Image to use instead of the default; its "
                     "python must have ipykernel and jupyter_client. The agent is added to it.")
    client = AnyTrait(None, allow_none=True, help="A modal.Client to use. Default: one built from "
                      "the host's Modal configuration.")

    def __init__(self, policy: Policy, kernel_id: str, log: logging.Logger | None = None, **kwargs: Any):
        super().__init__(policy, kernel_id, log, **kwargs)
        self._m = _modal()
        self._client = self.client
        self._own_client = self.client is None
        self._sb: Any = None
        self._proc: Any = None
        self._snapshot: Any = None
        self._out: asyncio.Queue[bytes] | None = None
        self._writes: asyncio.Queue | None = None
        self._tasks: list[asyncio.Task] = []
        self._stderr_tail = bytearray()
        self._stream_error: str | None = None

    # -- what it is --------------------------------------------------------

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(boundary=MODAL_BOUNDARY, pause_keeps_memory=self.memory_snapshots)

    async def doctor(self) -> list[str]:
        """Check that Modal credentials are configured on the host (no request is
        made); called by ``sandbox-kernel doctor``.

        Returns
        -------
        list of str
            Problems found, each with a next step; empty when all is well.
        """
        cfg = self._m.config.config
        if not (cfg.get("token_id") and cfg.get("token_secret")):
            return ["no Modal credentials: run `modal token new`, or set MODAL_TOKEN_ID and "
                    "MODAL_TOKEN_SECRET in the proxy's environment"]
        return []

    def describe(self) -> dict:
        d = super().describe()
        if self._sb is not None:
            d["sandbox_id"] = self._sb.object_id
        d["app"] = self.app_name
        if self.gpu:
            d["gpu"] = self.gpu
        return d

    def sandbox_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of ``modal.Sandbox.create`` derived from the policy.

        Returns
        -------
        dict
            ``cpu`` (cores), ``memory`` (MiB), ``timeout`` and
            ``idle_timeout`` (seconds), ``block_network`` or the outbound
            allowlists (:func:`network_kwargs`), ``gpu``, ``env``,
            ``tags``.
        """
        p = self.policy
        kw: dict[str, Any] = {
            "cpu": float(p.cpu_cores),
            "memory": int(p.memory_mib),
            "timeout": int(min(max(p.lifetime_s, 60), MODAL_MAX_TIMEOUT_S)),
            **network_kwargs(p),
            "env": sandbox_env(p),
            "tags": {"sandbox-kernel.kernel_id": self.kernel_id},
        }
        if self.idle_timeout_s > 0:
            kw["idle_timeout"] = self.idle_timeout_s
        if self.gpu:
            kw["gpu"] = self.gpu
        if self.workdir:
            kw["workdir"] = self.workdir
        return kw

    def build_image(self) -> Any:
        """The sandbox image: debian_slim + ipykernel + jupyter_client + the agent."""
        m = self._m
        image = self.image
        if image is None:
            image = m.Image.debian_slim(python_version=self.python_version).pip_install(
                *DEFAULT_PACKAGES, *self.packages)
        return image.add_local_file(agent_archive(), AGENT_PATH)

    # -- lifecycle ----------------------------------------------------------

    async def _get_client(self) -> Any:
        if self._client is not None:
            return self._client
        m = self._m
        cfg = m.config.config
        token_id, token_secret = cfg.get("token_id"), cfg.get("token_secret")
        try:
            if token_id and token_secret:
                self._client = await m.Client.from_credentials.aio(token_id, token_secret)
            else:
                self._client = await m.Client.from_env.aio()
                self._own_client = False  # the SDK's shared singleton: never close it
        except m.exception.AuthError as err:
            raise CredentialsMissing(
                f"Modal credentials missing or rejected ({err}); run `modal token new` or set "
                "MODAL_TOKEN_ID and MODAL_TOKEN_SECRET on the host") from err
        except Exception as err:
            raise self._map_error(err, "connect to Modal") from err
        return self._client

    async def start(self) -> None:
        """Create the sandbox and start the agent in it.

        Called by the proxy at kernel start and after the sandbox died or was
        stopped.

        Raises
        ------
        CredentialsMissing
            No Modal token on the host, or Modal rejected it.
        SandboxStartError
            The image, the sandbox or the agent's exec failed (capacity,
            invalid option); the message names the next step.
        BackendError
            Modal's API could not be reached.
        """
        await self.kill()
        m = self._m
        client = await self._get_client()
        try:
            if self._snapshot is not None:
                sb = await m.Sandbox._experimental_from_snapshot.aio(self._snapshot, client=client)
                self._snapshot = None
            else:
                app = await m.App.lookup.aio(self.app_name, create_if_missing=True, client=client)
                sb = await m.Sandbox.create.aio(app=app, image=self.build_image(), client=client,
                                                **self.sandbox_kwargs())
            self._sb = sb
            cwd = WORKSPACE_DIR if self.policy.workspace != "none" else self.workdir  # copied in by the proxy
            cmd = ["python", "-u", AGENT_PATH] + (["--cwd", cwd] if cwd else [])
            if self.deadman_s > 0:
                cmd += ["--host-silence-s", f"{self.deadman_s:g}"]
            self._proc = await sb.exec.aio(*cmd, text=False, bufsize=-1)
        except BaseException as err:
            if self._sb is not None:
                with contextlib.suppress(Exception):
                    await self._sb.terminate.aio()
                self._sb = None
            raise self._map_error(err, "start the Modal sandbox") from err
        self._stderr_tail.clear()
        self._stream_error = None
        self._out = asyncio.Queue()
        self._writes = asyncio.Queue()
        self._tasks = [asyncio.ensure_future(self._pump_stdout(self._proc, self._out)),
                       asyncio.ensure_future(self._drain_stderr(self._proc)),
                       asyncio.ensure_future(self._writer(self._proc, self._writes))]
        if self.deadman_s > 0:
            self._tasks.append(asyncio.ensure_future(self._keepalive(self.deadman_s / 3)))
        self.log.info("Modal sandbox %s started: %s", sb.object_id, MODAL_BOUNDARY)

    async def _keepalive(self, every_s: float) -> None:
        """A ``keepalive`` frame every ``every_s`` seconds: the agent's dead-man's switch
        (``--host-silence-s``) stays off while this proxy lives, idle or not."""
        frame = protocol.host_op_frame("keepalive")
        while True:
            await asyncio.sleep(every_s)
            with contextlib.suppress(SandboxDied):
                await self.write(frame)

    def _map_error(self, err: BaseException, doing: str) -> BaseException:
        """Translate an SDK exception into :mod:`sandbox_kernel.errors` (caller raises ``from``)."""
        exc = self._m.exception
        if isinstance(err, (asyncio.CancelledError, KeyboardInterrupt, SystemExit)):
            return err
        if isinstance(err, (CredentialsMissing, SandboxStartError, BackendError, SandboxDied)):
            return err
        if isinstance(err, (exc.AuthError, exc.PermissionDeniedError)):
            return CredentialsMissing(f"could not {doing}: Modal refused the credentials ({err}); "
                                      "run `modal token new` or check MODAL_TOKEN_ID/MODAL_TOKEN_SECRET")
        if isinstance(err, exc.ResourceExhaustedError):
            return SandboxStartError(f"could not {doing}: no Modal capacity ({err}); retry later or "
                                     "ask for less cpu_cores/memory_mib or another gpu")
        if isinstance(err, (exc.InvalidError, exc.NotFoundError, exc.ImageBuildError, exc.ExecutionError)):
            return SandboxStartError(f"could not {doing}: {type(err).__name__}: {err}; check the "
                                     "backend options (gpu, image, app_name) and `sandbox-kernel doctor`")
        if isinstance(err, (exc.SandboxTerminatedError, exc.SandboxTimeoutError)):
            return SandboxDied(f"the Modal sandbox ended ({type(err).__name__}); the next cell starts a new one")
        return BackendError(f"could not {doing}: Modal's API failed ({type(err).__name__}: {err}); "
                            "check the network and `modal token info`, then restart the kernel")

    async def _pump_stdout(self, proc: Any, out: asyncio.Queue) -> None:
        try:
            async for chunk in proc.stdout:
                if chunk:
                    out.put_nowait(bytes(chunk))
        except asyncio.CancelledError:
            raise
        except Exception as err:  # noqa: BLE001 - the stream is gone: say why in exit_info
            self._stream_error = f"{type(err).__name__}: {err}"
            self.log.warning("lost the agent's stdout stream: %s", self._stream_error)
        finally:
            out.put_nowait(b"")

    async def _drain_stderr(self, proc: Any) -> None:
        with contextlib.suppress(Exception):
            async for chunk in proc.stderr:
                self._stderr_tail += chunk
                del self._stderr_tail[:-STDERR_TAIL_BYTES]
                self.log.debug("sandbox stderr: %s", bytes(chunk[:2000]).decode("utf-8", "replace").rstrip())

    async def _writer(self, proc: Any, writes: asyncio.Queue) -> None:
        """The only task that touches the agent's stdin: frames never interleave."""
        while True:
            data, fut = await writes.get()
            try:
                proc.stdin.write(data)
                await proc.stdin.drain.aio()
            except asyncio.CancelledError:
                if not fut.done():
                    fut.set_exception(SandboxDied("the sandbox was stopped"))
                raise
            except Exception as err:  # noqa: BLE001 - handed to the caller through the future
                if not fut.done():
                    fut.set_exception(err)
            else:
                if not fut.done():
                    fut.set_result(None)

    async def read(self) -> bytes:
        """Next chunk of the agent's stdout; ``b""`` once the stream ended.

        Called in a loop by the proxy's reader task.
        """
        out = self._out
        if out is None:
            return b""
        data = await out.get()
        if not data:
            out.put_nowait(b"")  # stay at EOF for later reads
        return data

    async def write(self, data: bytes) -> None:
        """Send whole frames to the agent's stdin, through the writer task.

        Raises
        ------
        SandboxDied
            If the sandbox or the agent's exec is gone.
        """
        writes = self._writes
        if writes is None or self._sb is None:
            raise SandboxDied("the Modal sandbox is not running")
        fut = asyncio.get_running_loop().create_future()
        writes.put_nowait((bytes(data), fut))
        try:
            await fut
        except SandboxDied:
            raise
        except Exception as err:
            raise SandboxDied(f"could not write to the agent in the Modal sandbox ({type(err).__name__}: "
                              f"{err}); the next cell starts a new sandbox") from err

    async def exit_info(self) -> ExitInfo:
        """Why the stream ended; waits up to 5 s for the agent's exit status.

        Called by the proxy after :meth:`read` returned ``b""`` unexpectedly.
        """
        if self._sb is None or self._proc is None:
            return ExitInfo(cause="the Modal sandbox was not running")
        rc = None
        with contextlib.suppress(Exception):
            rc = await asyncio.wait_for(self._proc.poll.aio(), 5)
        sb_rc = None
        with contextlib.suppress(Exception):
            sb_rc = await asyncio.wait_for(self._sb.poll.aio(), 5)
        if sb_rc is not None:
            cause = f"the Modal sandbox ended (exit status {sb_rc}: terminated, timed out or idle)"
        elif rc is not None and rc > 128:
            cause = f"the agent was killed by signal {rc - 128}{signal_suffix(rc - 128)}"
        elif rc is not None:
            cause = f"the agent exited with code {rc}"
        elif self._stream_error:
            cause = f"lost the connection to the Modal sandbox ({self._stream_error})"
        else:
            cause = "the Modal sandbox stopped answering"
        if rc == 137 and b"MemoryError" in self._stderr_tail:  # the breach names its limit
            cause = f"memory limit {self.policy.memory_mib} MiB exceeded ({cause})"
        tail = self._stderr_tail.decode("utf-8", "replace").strip().splitlines()[-3:]
        if tail:
            cause += " (" + " | ".join(tail)[-300:] + ")"
        return ExitInfo(cause=cause, returncode=rc if rc is not None else sb_rc)

    async def pause(self) -> None:
        """Snapshot the sandbox's memory, then terminate it (opt-in).

        Called by the idle lifecycle, only when ``memory_snapshots=True``
        (:attr:`Capabilities.pause_keeps_memory`).  Modal's memory snapshots
        are experimental (``Sandbox._experimental_snapshot``).

        Raises
        ------
        BackendError
            If the snapshot failed; the sandbox is left running.
        """
        if not self.memory_snapshots:
            raise NotImplementedError("modal pauses only with memory_snapshots=True")
        if self._sb is None:
            return
        try:
            snap = await self._sb._experimental_snapshot.aio()
        except Exception as err:
            raise self._map_error(err, "snapshot the Modal sandbox") from err
        await self.kill()
        self._snapshot = snap

    async def resume(self) -> None:
        """Restore the sandbox from the memory snapshot taken by :meth:`pause`
        and reattach a fresh agent exec; called before the next request."""
        if self._snapshot is None:
            raise SandboxDied("no Modal memory snapshot to resume from")
        await self.start()

    async def kill(self) -> None:
        """Terminate the sandbox (``Sandbox.terminate``).  Idempotent; called at
        shutdown, restart and stop.  Errors are logged, never raised: Modal's
        ``timeout``/``idle_timeout`` reap a sandbox this call could not reach."""
        tasks, self._tasks = self._tasks, []
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(BaseException):
                await t
        sb, self._sb, self._proc = self._sb, None, None
        self._out = self._writes = None
        if sb is not None:
            try:
                await sb.terminate.aio()
            except Exception as err:  # noqa: BLE001 - best effort; the sandbox's own timeout ends it
                self.log.warning("could not terminate Modal sandbox %s (its timeout will): %s",
                                 sb.object_id, err)
            else:
                self.log.info("Modal sandbox %s terminated", sb.object_id)
            with contextlib.suppress(Exception):
                await sb.detach.aio()
