"""A local stand-in for Modal's API that the real ``modal`` client talks to.

Point the client at it with ``MODAL_SERVER_URL=http://127.0.0.1:PORT`` and any
``MODAL_TOKEN_ID``/``MODAL_TOKEN_SECRET``.  One grpclib server serves both
services the client uses: the control plane (``modal.client.ModalClient``:
hello, auth token, environment, app, image, mount, sandbox create/wait/
terminate) and the task command router (``TaskCommandRouter``: exec start,
stdin write, stdio read, poll, wait), which real Modal runs on the worker;
``SandboxGetCommandRouterAccess`` hands out this same address over plain HTTP,
which the client accepts for localhost.

Behind it, "the sandbox" is local: each exec is a command run inside
bubblewrap as uid 65534 (:class:`local_sandbox.LocalSandboxFS`), so the real
agent and a real ipykernel run, never on the host.  Methods the client calls
that are not implemented are answered ``UNIMPLEMENTED`` and recorded in
:attr:`ModalEmulator.unimplemented`, which is how the set below was found.

Use :class:`ModalEmulator` (``start()`` / ``stop()``); it runs its own event
loop in a thread, so the client's loop (synchronicity's) never shares it.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import os
import signal
import threading
import time
import uuid
from dataclasses import dataclass, field

import grpclib.server
from grpclib import GRPCError, Status
from modal_proto import api_grpc, api_pb2, task_command_router_grpc
from modal_proto import task_command_router_pb2 as sr_pb2
from sandbox_kernel.policy import Policy

from .local_sandbox import LocalSandboxFS

log = logging.getLogger("modal_emulator")

OK = api_pb2.GenericResult.GENERIC_STATUS_SUCCESS
FAILURE = api_pb2.GenericResult.GENERIC_STATUS_FAILURE
TERMINATED = api_pb2.GenericResult.GENERIC_STATUS_TERMINATED
TIMEOUT = api_pb2.GenericResult.GENERIC_STATUS_TIMEOUT
CHUNK = 64 * 1024


def _fake_jwt(sub: str, ttl_s: float = 3600.0) -> str:
    def enc(obj: dict) -> str:
        return base64.urlsafe_b64encode(json.dumps(obj).encode()).rstrip(b"=").decode()

    return f"{enc({'alg': 'none', 'typ': 'JWT'})}.{enc({'sub': sub, 'exp': int(time.time() + ttl_s)})}.sig"


# ----------------------------------------------------------------------------
# State
# ----------------------------------------------------------------------------


@dataclass
class EmuExec:
    """One process started by ``TaskExecStart`` (or a sandbox entrypoint)."""

    exec_id: str
    argv: list[str]
    env: dict[str, str]
    proc: asyncio.subprocess.Process
    stdout: bytearray = field(default_factory=bytearray)
    stderr: bytearray = field(default_factory=bytearray)
    stdin_offset: int = 0
    stdin_closed: bool = False
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)
    pumps_done: int = 0
    returncode: int | None = None
    done: asyncio.Event = field(default_factory=asyncio.Event)
    tasks: list[asyncio.Task] = field(default_factory=list)


@dataclass
class EmuSandbox:
    """One sandbox: its definition, files, processes and result."""

    sandbox_id: str
    task_id: str
    app_id: str
    definition: api_pb2.Sandbox
    env: dict[str, str]
    fs: LocalSandboxFS
    jwt: str
    execs: dict[str, EmuExec] = field(default_factory=dict)
    result: api_pb2.GenericResult | None = None
    done: asyncio.Event = field(default_factory=asyncio.Event)
    last_activity: float = field(default_factory=time.monotonic)
    watchdog: asyncio.Task | None = None


class EmulatorState:
    """Everything the emulated service holds; inspected by tests."""

    def __init__(self, url_getter):
        self.url = url_getter
        self.calls: list[str] = []
        self.unimplemented: list[str] = []
        self.credentials_seen: set[tuple[str, str]] = set()
        self.apps: dict[str, str] = {}
        self.images: dict[str, api_pb2.Image] = {}
        self.blobs: dict[str, bytes] = {}
        self.mounts: dict[str, dict[str, bytes]] = {}
        self.sandboxes: dict[str, EmuSandbox] = {}
        self.auth_tokens: set[str] = set()
        #: When set, ``(token_id, token_secret)`` the control plane accepts.
        self.require_credentials: tuple[str, str] | None = None
        #: Until this ``time.monotonic()`` every RPC fails UNAVAILABLE (:meth:`outage`).
        self.down_until = 0.0

    # -- faults (the soak's chaos, bench/chaos_cloud.py) ------------------
    def down(self) -> bool:
        """Whether an :meth:`outage` is under way."""
        return time.monotonic() < self.down_until

    async def outage(self, seconds: float) -> None:
        """Make the service unreachable for ``seconds``: every RPC, and every open
        output stream, fails ``UNAVAILABLE`` until then; the sandboxes keep running."""
        self.down_until = time.monotonic() + seconds
        for sb in self.sandboxes.values():
            for ex in sb.execs.values():
                async with ex.changed:
                    ex.changed.notify_all()

    # -- helpers ---------------------------------------------------------
    def record(self, name: str, stream: grpclib.server.Stream) -> None:
        self.calls.append(name)
        if self.down():
            raise GRPCError(Status.UNAVAILABLE, "service unavailable (emulated outage)")
        md = stream.metadata or {}
        tid, tsec = md.get("x-modal-token-id"), md.get("x-modal-token-secret")
        if tid or tsec:
            self.credentials_seen.add((str(tid), str(tsec)))
            if self.require_credentials and (tid, tsec) != self.require_credentials:
                raise GRPCError(Status.UNAUTHENTICATED, "Token ID or secret is invalid")

    def image_files(self, image_id: str, seen: set | None = None) -> dict[str, bytes]:
        seen = seen or set()
        if image_id in seen or image_id not in self.images:
            return {}
        seen.add(image_id)
        img = self.images[image_id]
        files: dict[str, bytes] = {}
        for base in img.base_images:
            files.update(self.image_files(base.image_id, seen))
        if img.context_mount_id:
            files.update(self.mounts.get(img.context_mount_id, {}))
        return files

    def sandbox(self, sandbox_id: str = "", task_id: str = "") -> EmuSandbox:
        for sb in self.sandboxes.values():
            if sb.sandbox_id == sandbox_id or (task_id and sb.task_id == task_id):
                return sb
        raise GRPCError(Status.NOT_FOUND, f"sandbox {sandbox_id or task_id} not found")

    async def start_exec(self, sb: EmuSandbox, exec_id: str, argv: list[str], env: dict[str, str]) -> EmuExec:
        if sb.result is not None:
            raise GRPCError(Status.NOT_FOUND, f"sandbox {sb.sandbox_id} has finished")
        try:
            proc = await sb.fs.spawn(argv, env={**sb.env, **env})
        except (OSError, ValueError) as err:
            raise GRPCError(Status.INVALID_ARGUMENT, f"exec failed: {err}") from err
        ex = EmuExec(exec_id=exec_id, argv=argv, env=env, proc=proc)
        sb.execs[exec_id] = ex
        ex.tasks = [asyncio.ensure_future(self._pump(ex, proc.stdout, ex.stdout)),
                    asyncio.ensure_future(self._pump(ex, proc.stderr, ex.stderr)),
                    asyncio.ensure_future(self._reap(sb, ex))]
        sb.last_activity = time.monotonic()
        return ex

    async def _pump(self, ex: EmuExec, pipe, buf: bytearray) -> None:
        while True:
            data = await pipe.read(CHUNK)
            async with ex.changed:
                if data:
                    buf += data
                else:
                    ex.pumps_done += 1
                ex.changed.notify_all()
            if not data:
                return

    async def _reap(self, sb: EmuSandbox, ex: EmuExec) -> None:
        ex.returncode = await ex.proc.wait()
        if ex.proc.stdin is not None:  # its pipe closed on this loop, not at a GC after the loop closed
            ex.proc.stdin.close()
        async with ex.changed:
            ex.changed.notify_all()
        ex.done.set()
        sb.last_activity = time.monotonic()
        if ex.exec_id == "entrypoint":
            await self.finish(sb, api_pb2.GenericResult(
                status=OK if ex.returncode == 0 else FAILURE, exitcode=ex.returncode or 0))

    async def finish(self, sb: EmuSandbox, result: api_pb2.GenericResult) -> None:
        """End a sandbox: kill every process, keep the first result."""
        if sb.result is None:
            sb.result = result
        for ex in sb.execs.values():
            if ex.proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    ex.proc.send_signal(signal.SIGKILL)
        for ex in sb.execs.values():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(ex.done.wait(), 10)
        if sb.watchdog and sb.watchdog is not asyncio.current_task():
            sb.watchdog.cancel()
        sb.fs.remove()
        sb.done.set()

    async def watchdog(self, sb: EmuSandbox) -> None:
        """Server-side lifetime: ``timeout_secs`` and ``idle_timeout_secs``."""
        d = sb.definition
        created = time.monotonic()
        while sb.result is None:
            await asyncio.sleep(0.2)
            now = time.monotonic()
            if d.timeout_secs and now - created > d.timeout_secs:
                await self.finish(sb, api_pb2.GenericResult(status=TIMEOUT, exception="sandbox timeout"))
                return
            running = any(ex.returncode is None for ex in sb.execs.values())
            if running:
                sb.last_activity = now
            elif d.idle_timeout_secs and now - sb.last_activity > d.idle_timeout_secs:
                await self.finish(sb, api_pb2.GenericResult(status=TERMINATED, exception="idle timeout"))
                return


# ----------------------------------------------------------------------------
# Services
# ----------------------------------------------------------------------------


def _fill_unimplemented(cls, state_attr: str = "state"):
    """Answer every abstract RPC with UNIMPLEMENTED and record its name."""
    for name in list(getattr(cls, "__abstractmethods__", ())):
        def make(name=name):
            async def handler(self, stream) -> None:
                getattr(self, state_attr).unimplemented.append(name)
                log.warning("unimplemented RPC called: %s", name)
                raise GRPCError(Status.UNIMPLEMENTED, f"{name} is not emulated")
            return handler
        setattr(cls, name, make())
    cls.__abstractmethods__ = frozenset()
    return cls


class ControlPlane(api_grpc.ModalClientBase):
    """``modal.client.ModalClient``: the RPCs app lookup, image build, sandbox
    create/wait/terminate and the command-router handshake call."""

    def __init__(self, state: EmulatorState):
        self.state = state

    async def _req(self, stream, name: str):
        req = await stream.recv_message()
        self.state.record(name, stream)
        return req

    async def ClientHello(self, stream) -> None:
        await self._req(stream, "ClientHello")
        await stream.send_message(api_pb2.ClientHelloResponse())

    async def AuthTokenGet(self, stream) -> None:
        await self._req(stream, "AuthTokenGet")
        token = _fake_jwt("client")
        self.state.auth_tokens.add(token)
        await stream.send_message(api_pb2.AuthTokenGetResponse(token=token))

    async def EnvironmentGetOrCreate(self, stream) -> None:
        req = await self._req(stream, "EnvironmentGetOrCreate")
        settings = api_pb2.EnvironmentSettings(image_builder_version="2025.06", webhook_suffix="emu")
        await stream.send_message(api_pb2.EnvironmentGetOrCreateResponse(
            environment_id="en-emulated",
            metadata=api_pb2.EnvironmentMetadata(name=req.deployment_name or "main", settings=settings)))

    async def AppGetOrCreate(self, stream) -> None:
        req = await self._req(stream, "AppGetOrCreate")
        app_id = self.state.apps.setdefault(req.app_name, f"ap-{uuid.uuid4().hex[:20]}")
        await stream.send_message(api_pb2.AppGetOrCreateResponse(
            app_id=app_id, handle_metadata=api_pb2.AppHandleMetadata(app_id=app_id)))

    async def ImageGetOrCreate(self, stream) -> None:
        req = await self._req(stream, "ImageGetOrCreate")
        key = req.image.SerializeToString(deterministic=True)
        image_id = f"im-{uuid.uuid5(uuid.NAMESPACE_OID, key.hex()).hex[:20]}"
        self.state.images[image_id] = req.image
        await stream.send_message(api_pb2.ImageGetOrCreateResponse(
            image_id=image_id, result=api_pb2.GenericResult(status=OK)))

    async def ImageJoinStreaming(self, stream) -> None:
        await self._req(stream, "ImageJoinStreaming")
        await stream.send_message(api_pb2.ImageJoinStreamingResponse(
            result=api_pb2.GenericResult(status=OK), eof=True))

    async def MountBatchedCheckExistence(self, stream) -> None:
        req = await self._req(stream, "MountBatchedCheckExistence")
        missing = [h for h in req.sha256_hex_hashes if h not in self.state.blobs]
        await stream.send_message(api_pb2.MountBatchedCheckExistenceResponse(missing_sha256_hex_hashes=missing))

    async def MountPutFile(self, stream) -> None:
        req = await self._req(stream, "MountPutFile")
        if req.WhichOneof("data_oneof") == "data":
            self.state.blobs[req.sha256_hex] = req.data
        await stream.send_message(api_pb2.MountPutFileResponse(exists=req.sha256_hex in self.state.blobs))

    async def MountGetOrCreate(self, stream) -> None:
        req = await self._req(stream, "MountGetOrCreate")
        mount_id = f"mo-{uuid.uuid4().hex[:20]}"
        self.state.mounts[mount_id] = {f.filename: self.state.blobs.get(f.sha256_hex, b"") for f in req.files}
        await stream.send_message(api_pb2.MountGetOrCreateResponse(
            mount_id=mount_id, handle_metadata=api_pb2.MountHandleMetadata()))

    async def SandboxCreateV2(self, stream) -> None:
        req = await self._req(stream, "SandboxCreateV2")
        d = req.definition
        env: dict[str, str] = dict(d.environment_variables.contents)
        for src in req.secret_sources:
            if src.WhichOneof("source") == "env":
                env.update(src.env.contents)
            else:
                raise GRPCError(Status.INVALID_ARGUMENT, "named secrets are not emulated")
        files = self.state.image_files(d.image_id)
        for mid in d.mount_ids:
            files.update(self.state.mounts.get(mid, {}))
        policy = Policy(memory_mib=max(128, d.resources.memory_mb or 4096),
                        cpu_cores=(d.resources.milli_cpu or 2000) / 1000)
        try:
            fs = await asyncio.to_thread(LocalSandboxFS, policy, files)
        except Exception as err:  # the emulated service reports, never crashes
            raise GRPCError(Status.INTERNAL, f"could not prepare the sandbox: {err}") from err
        n = uuid.uuid4().hex
        sb = EmuSandbox(sandbox_id=f"sb-{n[:24]}", task_id=f"ta-{n[:20]}V", app_id=req.app_id,
                        definition=d, env=env, fs=fs, jwt=_fake_jwt(n))
        self.state.sandboxes[sb.sandbox_id] = sb
        if d.entrypoint_args:
            await self.state.start_exec(sb, "entrypoint", list(d.entrypoint_args), {})
        sb.watchdog = asyncio.ensure_future(self.state.watchdog(sb))
        await stream.send_message(api_pb2.SandboxCreateV2Response(
            sandbox_id=sb.sandbox_id, task_id=sb.task_id,
            command_router_access=api_pb2.CommandRouterAccess(url=self.state.url(), jwt=sb.jwt),
            metadata=api_pb2.SandboxHandleMetadata(app_id=req.app_id)))

    async def SandboxGetCommandRouterAccess(self, stream) -> None:
        req = await self._req(stream, "SandboxGetCommandRouterAccess")
        sb = self.state.sandbox(req.sandbox_id, req.task_id)
        await stream.send_message(api_pb2.SandboxGetCommandRouterAccessResponse(url=self.state.url(), jwt=sb.jwt))

    async def SandboxGetTaskId(self, stream) -> None:
        req = await self._req(stream, "SandboxGetTaskId")
        sb = self.state.sandbox(req.sandbox_id)
        resp = api_pb2.SandboxGetTaskIdResponse(task_id=sb.task_id if sb.result is None else "")
        if sb.result is not None:
            resp.task_result.CopyFrom(sb.result)
        await stream.send_message(resp)

    async def _wait(self, stream, name: str) -> None:
        req = await self._req(stream, name)
        sb = self.state.sandbox(req.sandbox_id)
        if req.timeout > 0:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(sb.done.wait(), min(req.timeout, 50))
        resp = api_pb2.SandboxWaitResponse()
        if sb.result is not None:
            resp.result.CopyFrom(sb.result)
            resp.metadata.result.CopyFrom(sb.result)
        await stream.send_message(resp)

    async def SandboxWaitV2(self, stream) -> None:
        await self._wait(stream, "SandboxWaitV2")

    async def SandboxWait(self, stream) -> None:
        await self._wait(stream, "SandboxWait")

    async def _terminate(self, stream, name: str) -> None:
        req = await self._req(stream, name)
        sb = self.state.sandbox(req.sandbox_id)
        await self.state.finish(sb, api_pb2.GenericResult(status=TERMINATED, exception="terminated"))
        await stream.send_message(api_pb2.SandboxTerminateResponse(existing_result=sb.result))

    async def SandboxTerminateV2(self, stream) -> None:
        await self._terminate(stream, "SandboxTerminateV2")

    async def SandboxTerminate(self, stream) -> None:
        await self._terminate(stream, "SandboxTerminate")


class CommandRouter(task_command_router_grpc.TaskCommandRouterBase):
    """``TaskCommandRouter``: exec with stdin/stdout, as on a Modal worker."""

    def __init__(self, state: EmulatorState):
        self.state = state

    async def _req(self, stream, name: str):
        req = await stream.recv_message()
        self.state.record(name, stream)
        return req

    def _exec(self, stream, task_id: str, exec_id: str) -> tuple[EmuSandbox, EmuExec]:
        sb = self.state.sandbox(task_id=task_id)
        if (stream.metadata or {}).get("authorization") != f"Bearer {sb.jwt}":
            raise GRPCError(Status.UNAUTHENTICATED, "bad command router token")
        ex = sb.execs.get(exec_id)
        if ex is None:
            raise GRPCError(Status.NOT_FOUND, f"exec {exec_id} not found")
        return sb, ex

    async def TaskExecStart(self, stream) -> None:
        req = await self._req(stream, "TaskExecStart")
        sb = self.state.sandbox(task_id=req.task_id)
        if (stream.metadata or {}).get("authorization") != f"Bearer {sb.jwt}":
            raise GRPCError(Status.UNAUTHENTICATED, "bad command router token")
        if req.exec_id not in sb.execs:
            env = dict(req.env)
            for src in req.secret_sources:
                if src.WhichOneof("source") == "env":
                    env.update(src.env.contents)
            await self.state.start_exec(sb, req.exec_id, list(req.command_args), env)
        await stream.send_message(sr_pb2.TaskExecStartResponse())

    async def TaskExecStdinWrite(self, stream) -> None:
        req = await self._req(stream, "TaskExecStdinWrite")
        sb, ex = self._exec(stream, req.task_id, req.exec_id)
        sb.last_activity = time.monotonic()
        stdin = ex.proc.stdin
        # Offsets make retries idempotent: skip what was already written.
        skip = ex.stdin_offset - req.offset
        if skip < 0:
            raise GRPCError(Status.INVALID_ARGUMENT, f"stdin gap: at {ex.stdin_offset}, got {req.offset}")
        data = req.data[skip:]
        if data and not ex.stdin_closed and stdin is not None:
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                stdin.write(data)
                await stdin.drain()
            ex.stdin_offset += len(data)
        if req.eof and not ex.stdin_closed and stdin is not None:
            ex.stdin_closed = True
            stdin.close()
        await stream.send_message(sr_pb2.TaskExecStdinWriteResponse())

    async def TaskExecStdioRead(self, stream) -> None:
        req = await self._req(stream, "TaskExecStdioRead")
        _, ex = self._exec(stream, req.task_id, req.exec_id)
        stdout = req.file_descriptor == sr_pb2.TASK_EXEC_STDIO_FILE_DESCRIPTOR_STDOUT
        offset = req.offset
        while True:
            async with ex.changed:
                buf = ex.stdout if stdout else ex.stderr
                while offset >= len(buf) and not (ex.pumps_done >= 2 and ex.returncode is not None):
                    if self.state.down():
                        raise GRPCError(Status.UNAVAILABLE, "service unavailable (emulated outage)")
                    await ex.changed.wait()
                if self.state.down():
                    raise GRPCError(Status.UNAVAILABLE, "service unavailable (emulated outage)")
                chunk = bytes(buf[offset:offset + CHUNK])
            if not chunk:
                return
            offset += len(chunk)
            await stream.send_message(sr_pb2.TaskExecStdioReadResponse(data=chunk))

    def _status(self, ex: EmuExec, resp_cls):
        rc = ex.returncode
        if rc is None:
            return resp_cls()
        return resp_cls(signal=-rc) if rc < 0 else resp_cls(code=rc)

    async def TaskExecPoll(self, stream) -> None:
        req = await self._req(stream, "TaskExecPoll")
        _, ex = self._exec(stream, req.task_id, req.exec_id)
        await stream.send_message(self._status(ex, sr_pb2.TaskExecPollResponse))

    async def TaskExecWait(self, stream) -> None:
        req = await self._req(stream, "TaskExecWait")
        _, ex = self._exec(stream, req.task_id, req.exec_id)
        try:
            await asyncio.wait_for(ex.done.wait(), 55)
        except TimeoutError:
            raise GRPCError(Status.DEADLINE_EXCEEDED, "still running") from None
        await stream.send_message(self._status(ex, sr_pb2.TaskExecWaitResponse))


_fill_unimplemented(ControlPlane)
_fill_unimplemented(CommandRouter)


# ----------------------------------------------------------------------------
# Runner
# ----------------------------------------------------------------------------


class ModalEmulator:
    """The emulated Modal service on ``127.0.0.1``, in its own thread and loop.

    Parameters
    ----------
    port : int
        TCP port; ``0`` picks a free one.

    Attributes
    ----------
    url : str
        ``http://127.0.0.1:PORT``, for ``MODAL_SERVER_URL``.
    state : EmulatorState
        Calls, credentials seen, sandboxes; read it from tests (after the
        calls of interest returned).
    """

    def __init__(self, port: int = 0):
        self._port = port
        self.url = ""
        self.state = EmulatorState(lambda: self.url)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="modal-emulator", daemon=True)
        self._server: grpclib.server.Server | None = None

    @property
    def unimplemented(self) -> list[str]:
        return self.state.unimplemented

    def _call(self, coro, timeout: float = 60):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def start(self) -> str:
        """Start serving; returns :attr:`url`."""
        self._thread.start()

        async def serve() -> int:
            self._server = grpclib.server.Server([ControlPlane(self.state), CommandRouter(self.state)])
            await self._server.start("127.0.0.1", self._port)
            return self._server._server.sockets[0].getsockname()[1]

        self.url = f"http://127.0.0.1:{self._call(serve())}"
        return self.url

    def run(self, coro, timeout: float = 60):
        """Run a coroutine on the emulator's loop (to inspect or alter state)."""
        return self._call(coro, timeout)

    def terminate_all(self) -> None:
        """End every sandbox still running (fixture cleanup)."""
        async def go() -> None:
            for sb in list(self.state.sandboxes.values()):
                if not sb.done.is_set():
                    await self.state.finish(sb, api_pb2.GenericResult(status=TERMINATED, exception="cleanup"))
        self._call(go())

    def running(self) -> list[str]:
        """Ids of sandboxes not yet finished."""
        return [sid for sid, sb in self.state.sandboxes.items() if sb.result is None]

    def stop(self) -> None:
        """Terminate every sandbox, stop the server and the thread."""
        if not self._thread.is_alive():
            return
        self.terminate_all()

        async def close() -> None:
            if self._server is not None:
                self._server.close()
                await self._server.wait_closed()
        with contextlib.suppress(Exception):
            self._call(close(), 15)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(15)
        self._loop.close()


if __name__ == "__main__":  # manual use: python -m emulators.modal_emulator
    logging.basicConfig(level=logging.INFO)
    emu = ModalEmulator(int(os.environ.get("PORT", "0")))
    print(emu.start(), flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        emu.stop()
