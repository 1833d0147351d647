"""The proxy's side of the sandbox service (:mod:`sandbox_kernel.backends.local.service`): a :class:`.runtime.Runtime`
whose verbs are requests to the root service.

``LocalBackend.start``, not root and with a service socket that answers
(``LocalBackend.service_socket``), switches its runtime to a
:class:`ServiceRuntime` and takes its sandbox from the service
(:func:`start_from_service`, then ``LocalBackend.adopt`` as for the warm pool).
From then on :class:`.sandbox.LocalSandbox` drives it as any other: its
``freeze``/``thaw``/``checkpoint``/``restore``/``destroy`` call this runtime's
``pause``/``resume``/``checkpoint``/``restore``/``kill``, each one request to
the service naming the container id; the service checks that this uid owns it.
Where no service answers, the backend keeps its own runtime (rootless gVisor).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import time
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ....errors import AdmissionRefused, SandboxKernelError, SandboxStartError
from ...base import Capabilities
from ..layout import GVISOR_BOUNDARY
from ..pool.client import AdoptedProcess, Adopter
from ..pool.wire import close_fds, request
from ..runtime import PIPES, Runtime, SandboxRecord
from .wire import CREATE_FDS, RESTORE_FDS, SERVICE_PROTOCOL, SLOW_TIMEOUT_S

if TYPE_CHECKING:
    from ....policy import Policy
    from ..admission import Admission
    from ..layout import HostLayout

#: Seconds the first question to the service (``hello``) may take before the proxy
#: goes on without it (rootless gVisor).
HELLO_TIMEOUT_S = 3.0
VIA = "via the sandbox service"


class ServiceRefused(SandboxKernelError):
    """The sandbox service refused or failed a request; the message is its reason.

    Attributes
    ----------
    refused : bool
        True where the service said it refused (a bound, a check, a bad id: its answer's
        ``refused``), False where it tried and failed (runsc) or said neither (an older
        service).
    """

    def __init__(self, message: str, refused: bool = False):
        super().__init__(message)
        self.refused = refused


def call(path: str, op: str, timeout_s: float = SLOW_TIMEOUT_S, send: tuple[int, ...] = (),
         **fields: Any) -> tuple[dict, list[int]]:
    """One request to the service at ``path`` (which must be root's), with the fds ``send``
    (``SCM_RIGHTS``; the caller's to close); blocking.

    Returns
    -------
    (dict, list of int)
        Its answer (``ok`` true) and the fds it passed (the caller's to close).

    Raises
    ------
    OSError
        The service is unreachable, too slow, or not run by root.
    ServiceRefused
        It answered ``ok: false`` (:class:`AdmissionRefused` for a restore the
        machine cannot hold now; ``refused`` where it refused rather than failed).
    """
    answer, fds = request(path, {"op": op, "protocol": SERVICE_PROTOCOL, **fields}, timeout_s, peer=0, send=send)
    if not answer.get("ok"):
        close_fds(fds)
        reason = str(answer.get("reason", "refused"))
        details = answer.get("admission")
        if isinstance(details, dict):
            try:
                raise AdmissionRefused(reason, **details)
            except TypeError:
                pass
            raise AdmissionRefused(reason, resource="memory", need=0, available=0, unit="MiB")
        raise ServiceRefused(f"the sandbox service refused {op}: {reason}", refused=answer.get("refused") is True)
    return answer, fds


class ServiceRuntime(Runtime):
    """gVisor sandboxes made and driven by the root sandbox service at :attr:`path`.

    Parameters
    ----------
    path : str
        The service's socket.
    hello : dict
        Its answer to ``hello``: ``base`` (its state base), ``boundary``.
    """

    name = "gvisor"
    capabilities = Capabilities(boundary=f"{GVISOR_BOUNDARY} {VIA}", pause_keeps_memory=True,
                                checkpoint=True)
    #: The service ends a sandbox at its cgroup's OOM kill (this uid cannot write the cgroup).
    oom_ends_sandbox = False

    def __init__(self, path: str, hello: dict):
        self.path = path
        #: The kernel's policy, set by :func:`start_from_service`: its workspace folder is
        #: opened again for each ``restore`` (a service started again since holds none).
        self.policy: Policy | None = None
        self.base = str(hello.get("base", ""))
        self.capabilities = replace(type(self).capabilities,
                                    boundary=f"{hello.get('boundary') or GVISOR_BOUNDARY} {VIA}")

    @property
    def key(self) -> str:
        return f"service:{self.path}"

    async def _call(self, op: str, sb: SandboxRecord, **fields: Any) -> tuple[dict, list[int]]:
        return await asyncio.to_thread(call, self.path, op, container_id=sb.container_id, **fields)

    async def launch(self, sb: SandboxRecord, policy: Policy, layout: HostLayout,
                     stdio: Mapping[str, int], *, die_with_parent: bool) -> asyncio.subprocess.Process:
        """Not here: the service makes the sandbox (:func:`start_from_service`)."""
        raise SandboxStartError("a sandbox of the sandbox service is made by the service, not launched here")

    async def pause(self, sb: SandboxRecord) -> None:
        await self._call("pause", sb)

    async def resume(self, sb: SandboxRecord) -> None:
        await self._call("resume", sb)

    async def checkpoint(self, sb: SandboxRecord, compression: str = "flate-best-speed") -> None:
        await self._call("checkpoint", sb, compression=compression)

    def reserve_restore(self, sb: SandboxRecord, admission: Admission | None) -> None:
        """Nothing here: the service admits the restore (its answer may be :class:`AdmissionRefused`)."""

    async def restore(self, sb: SandboxRecord, stdio: Mapping[str, int] = PIPES) -> Any:
        """Ask the service to restore; the new runtime process's pipes and pidfd come back.
        The workspace folder (if any) goes with the request, opened again here: the
        service uses it only when it no longer holds the one of the ``create`` and it is
        the same folder.

        Raises
        ------
        AdmissionRefused
            The machine cannot hold it now (it stays checkpointed).
        ServiceRefused
            Any other refusal or failure of the service.
        """
        folder = None
        with contextlib.suppress(SandboxStartError):  # moved or gone: the service may still hold its fd
            folder = open_folder(self.policy) if self.policy is not None else None
        try:
            answer, fds = await self._call("restore", sb, send=() if folder is None else (folder,))
        finally:
            close_fds([folder])
        if len(fds) != len(RESTORE_FDS):
            close_fds(fds)
            raise ServiceRefused(f"the sandbox service passed {len(fds)} fds for a restore, not {len(RESTORE_FDS)}")
        got = dict(zip(RESTORE_FDS, fds))
        old = sb.proc
        proc = AdoptedProcess(int(answer["pid"]), got["pidfd"])
        try:
            await proc.attach(got["stdin"], got["stdout"], got["stderr"], b"")
        except BaseException:
            close_fds(fds)
            raise
        if old is not None:
            with contextlib.suppress(Exception):
                old.close()
        return proc

    async def kill(self, sb: SandboxRecord) -> None:
        """Ask the service to remove the sandbox.  If it cannot be asked, the watchdog's
        pipe is closed without disarming it: the watchdog (root's) reaps the sandbox."""
        try:
            await self._call("kill", sb, timeout_s=30.0)
        except (OSError, ValueError, SandboxKernelError):
            close_fds([sb.watchdog_fd])
            sb.watchdog_fd = None
        sb.cgroup = None  # removed by the service (root's)
        if sb.proc is not None:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(sb.proc.wait(), 10)

    def reap(self, sb: SandboxRecord) -> None:
        """Nothing: a service sandbox is reaped by its watchdog or root's ``gc``."""


def hello(path: str) -> dict | None:
    """The service's ``hello`` answer, or None when no service answers at ``path``; blocking."""
    if not os.path.exists(path):
        return None
    try:
        return call(path, "hello", HELLO_TIMEOUT_S)[0]
    except (OSError, ValueError, SandboxKernelError):
        return None


def open_folder(policy: Policy) -> int | None:
    """The workspace folder (``ro``/``rw``; resolved and checked by
    :func:`sandbox_kernel.workspace.resolve`), opened by this process, as the user, for
    the service: it maps the folder from this fd, never from its name.  Not ``O_PATH``:
    a read open is the proof that the user may read it.  None without a workspace.

    Raises
    ------
    SandboxStartError
        The folder cannot be opened (gone, or replaced by a link since it was checked).
    """
    if policy.workspace == "none" or not policy.workspace_path:
        return None
    try:
        return os.open(policy.workspace_path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as err:
        raise SandboxStartError(f"cannot open the workspace folder {policy.workspace_path} for the sandbox "
                                f"service: {err}") from err


async def start_from_service(backend: Adopter, runtime: ServiceRuntime, copy_from: str | None = None) -> dict:
    """Have the service make ``backend``'s sandbox and adopt it; its answer.

    ``copy_from``: restore it from this snapshot id or fork hand-off of this user's
    (:mod:`.copies`); the answer's ``copy`` is then a hand-off's ``fork.json``.

    Raises
    ------
    ServiceRefused
        The service refused (its reason: a directory not readable by this uid, a
        workspace folder of another owner, the machine full...).
    SandboxStartError
        The service could not be reached, or passed the wrong fds.
    """
    t0 = time.monotonic()
    runtime.policy = backend.policy
    folder = open_folder(backend.policy)
    try:
        answer, fds = await asyncio.to_thread(
            call, runtime.path, "create", SLOW_TIMEOUT_S, () if folder is None else (folder,),
            policy=backend.policy.sandbox_fields(), kernel_id=backend.kernel_id, python=backend.python,
            **({"from": copy_from} if copy_from else {}))
    except (OSError, ValueError) as err:
        raise SandboxStartError(f"the sandbox service at {runtime.path} did not answer: {err}") from err
    finally:
        close_fds([folder])
    if len(fds) != len(CREATE_FDS):
        close_fds(fds)
        raise SandboxStartError(f"the sandbox service passed {len(fds)} fds, not {len(CREATE_FDS)}")
    answer.setdefault("output", base64.b64encode(b"").decode())
    await backend.adopt(answer, dict(zip(CREATE_FDS, fds)), base=runtime.base)
    backend.pooled = bool(answer.get("pooled"))
    backend.log.info("sandbox %s from the sandbox service%s at %s in %.0f ms: %s", answer.get("container_id"),
                     "'s warm pool" if backend.pooled else "", runtime.path, (time.monotonic() - t0) * 1000,
                     runtime.capabilities.boundary)
    return answer
