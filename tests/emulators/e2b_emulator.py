"""A local emulation of E2B's services that the real ``e2b`` SDK talks to.

Two listeners on 127.0.0.1:

* the **sandbox API** (``E2B_API_URL``): create (``POST /v2/sandboxes``),
  list (``GET /v2/sandboxes``), info, kill, ``/timeout``, ``/pause``, connect
  or resume (``POST /v2/sandboxes/{id}/connect``), authenticated by
  ``X-API-KEY``;
* **envd** (``E2B_SANDBOX_URL``), routed by the ``E2b-Sandbox-Id`` header the
  SDK sends and authenticated by ``X-Access-Token``: the process service over
  the Connect protocol (the SDK's own generated ``ProcessASGIApplication``,
  served through :mod:`.asgi_bridge`), ``/files`` and ``/health``.

Behind it, each sandbox is an :class:`~.e2b_vm.EmulatedVM`: commands run in
bubblewrap as uid 65534, never on the host.  With ``vm="gvisor"`` each is a
:class:`~.e2b_gvisor_vm.GvisorVM` instead (one gVisor sandbox, envd inside), which the
copy verbs need: ``POST /sandboxes/{id}/fork`` (``Sandbox.fork(count)``),
``POST /sandboxes/{id}/snapshots`` (``create_snapshot``), a create whose template is a
snapshot's id, and ``DELETE /templates/{id}`` (``delete_snapshot``).  The bubblewrap
VMs refuse them (500, saying why): they cannot copy a process.

Run standalone for manual poking::

    python -m tests.emulators.e2b_emulator --api-key e2b_test
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import datetime as dt
import json
import posixpath
import shutil
import threading
import time
import urllib.parse
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

from aiohttp import web
from connectrpc.code import Code
from connectrpc.errors import ConnectError
from e2b.envd.process import process_connect, process_pb
from protobuf import Oneof
from sandbox_kernel.backends.local.layout import state_base
from sandbox_kernel.policy import Policy

from .asgi_bridge import asgi_handler
from .e2b_gvisor_vm import GvisorVM
from .e2b_vm import PERSISTENT, EmulatedVM, Proc

ENVD_VERSION = "0.6.7"
KEEPALIVE_S = 20.0


def _iso(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).isoformat().replace("+00:00", "Z")


def _err(status: int, message: str) -> web.Response:
    return web.json_response({"code": status, "message": message}, status=status)


class E2BEmulator:
    """The emulated E2B control plane and envd, plus the sandboxes they own.

    Parameters
    ----------
    api_key : str
        The only key accepted in ``X-API-KEY``.
    policy : Policy, optional
        Local sandbox policy of every emulated VM (its ``python`` plays the
        template's ``python3``).
    vm : {"bubblewrap", "gvisor"}
        What stands for a microVM: :class:`~.e2b_vm.EmulatedVM` (each command its own
        bubblewrap sandbox) or :class:`~.e2b_gvisor_vm.GvisorVM` (one gVisor sandbox that
        fork and snapshot copy; root only).
    """

    def __init__(self, api_key: str, policy: Policy | None = None, vm: str = "bubblewrap"):
        self.api_key = api_key
        self.policy = policy or Policy()
        self.vm_kind = vm
        self.vms: dict[str, EmulatedVM | GvisorVM] = {}
        #: Snapshots by id: their image (hard links kept per copy) and process table.
        self.snapshots: dict[str, tuple[Path, dict[int, Proc]]] = {}
        #: Counts of what the copy verbs did, for tests: ``fork``, ``snapshot``, ``restore``.
        self.copies = {"fork": 0, "snapshot": 0, "restore": 0}
        self.created: list[str] = []
        self.requests: list[tuple[str, str]] = []
        self._runners: list[web.AppRunner] = []
        self._reaper: asyncio.Task | None = None
        self.api_url = self.sandbox_url = ""
        #: Until this ``time.monotonic()`` the service answers every request 503 (:meth:`outage`).
        self.down_until = 0.0
        #: Seconds a process's stdin input takes to reach it (the network's latency), s.
        self.input_delay_s = 0.0
        #: ``(marker, done)``, paths inside the sandbox, or None: a pause, once it has dropped
        #: the streams, writes ``marker`` in the VM and waits for the VM to write ``done``
        #: before it freezes (:meth:`EmulatedVM.pause`).  A real pause takes a while too, the
        #: processes running meanwhile; a test widens that window on purpose, so output is
        #: made while no client is attached.
        self.pause_hold: tuple[str, str] | None = None

    # ---- serving -----------------------------------------------------------

    async def start(self, host: str = "127.0.0.1") -> None:
        """Listen on two random ports of ``host``; sets :attr:`api_url`, :attr:`sandbox_url`."""
        api = web.Application(middlewares=[self._log_mw])
        api.add_routes([
            web.post("/v2/sandboxes", self.create),
            web.post("/sandboxes", self.create),
            web.get("/v2/sandboxes", self.list),
            web.get("/sandboxes/{id}", self.info),
            web.delete("/sandboxes/{id}", self.kill),
            web.post("/sandboxes/{id}/timeout", self.set_timeout),
            web.post("/sandboxes/{id}/refreshes", self.refresh),
            web.post("/sandboxes/{id}/pause", self.pause),
            web.post("/v2/sandboxes/{id}/connect", self.connect),
            web.post("/sandboxes/{id}/connect", self.connect),
            web.post("/sandboxes/{id}/resume", self.connect),
            web.post("/sandboxes/{id}/fork", self.fork),
            web.post("/sandboxes/{id}/snapshots", self.create_snapshot),
            web.delete("/templates/{id}", self.delete_snapshot),
        ])
        envd = web.Application(middlewares=[self._log_mw], client_max_size=256 * 1024 * 1024)
        rpc = asgi_handler(process_connect.ProcessASGIApplication(ProcessService(self)),
                           on_open=self._register_stream)
        envd.add_routes([
            web.get("/health", self.health),
            web.post("/files", self.write_files),
            web.get("/files", self.read_file),
            web.post("/process.Process/{method}", rpc),
        ])
        urls = []
        for app in (api, envd):
            runner = web.AppRunner(app, handle_signals=False, access_log=None)
            await runner.setup()
            site = web.TCPSite(runner, host, 0)
            await site.start()
            port = runner.addresses[0][1]
            urls.append(f"http://{host}:{port}")
            self._runners.append(runner)
        self.api_url, self.sandbox_url = urls
        self._reaper = asyncio.ensure_future(self._reap_expired())

    async def close(self) -> None:
        """Kill every sandbox, then stop listening."""
        if self._reaper:
            self._reaper.cancel()
        for vm in list(self.vms.values()):
            await vm.kill()
        self.vms.clear()
        for image, _ in self.snapshots.values():
            shutil.rmtree(image, ignore_errors=True)
        self.snapshots.clear()
        for r in self._runners:
            await r.cleanup()

    async def _reap_expired(self) -> None:
        while True:
            await asyncio.sleep(0.5)
            now = time.time()
            for sid, vm in list(self.vms.items()):
                if vm.state == "running" and vm.end_at < now:
                    self.vms.pop(sid, None)
                    await vm.kill()

    @web.middleware
    async def _log_mw(self, request: web.Request, handler):
        self.requests.append((request.method, request.path))
        if time.monotonic() < self.down_until:
            return _err(503, "service unavailable (emulated outage)")
        return await handler(request)

    # ---- faults (the soak's chaos, bench/chaos_cloud.py) ---------------------

    def outage(self, seconds: float) -> None:
        """Make the service unreachable for ``seconds``: every open stream is cut and
        every request answered 503 until then, as when E2B's edge is down; the
        sandboxes keep running.  Call on the emulator's loop."""
        self.down_until = time.monotonic() + seconds
        for vm in self.vms.values():
            vm.drop_streams()

    async def expire(self, sandbox_id: str) -> None:
        """End a sandbox now, as its timeout does: gone from the API (404), its processes
        killed.  Call on the emulator's loop.  Ended here rather than by setting its
        ``end_at`` for the reaper: a ``set_timeout`` or ``refresh`` landing in the reaper's
        next 0.5 s would move ``end_at`` on again and undo the end (the soak saw that)."""
        vm = self.vms.pop(sandbox_id)
        await vm.kill()

    # ---- sandbox API --------------------------------------------------------

    def _auth(self, request: web.Request) -> web.Response | None:
        if request.headers.get("X-API-KEY") != self.api_key:
            return _err(401, "Invalid API key")
        return None

    def _vm(self, request: web.Request) -> EmulatedVM | None:
        return self.vms.get(request.match_info["id"])

    def _sandbox_body(self, vm: EmulatedVM) -> dict:
        return {"templateID": vm.template, "sandboxID": vm.sandbox_id, "clientID": "emulator",
                "envdVersion": ENVD_VERSION, "envdAccessToken": vm.envd_access_token,
                "trafficAccessToken": None, "domain": None}

    def _detail(self, vm: EmulatedVM) -> dict:
        return {**self._sandbox_body(vm), "startedAt": _iso(vm.started_at), "endAt": _iso(vm.end_at),
                "cpuCount": 2, "memoryMB": 512, "diskSizeMB": 1024, "state": vm.state,
                "metadata": vm.metadata, "allowInternetAccess": vm.allow_internet}

    async def create(self, request: web.Request) -> web.Response:
        if (denied := self._auth(request)) is not None:
            return denied
        body = await request.json()
        network = body.get("network") or {}
        allow = body.get("allow_internet_access", True) and "0.0.0.0/0" not in network.get("denyOut", [])
        sid = "emu" + uuid.uuid4().hex[:17]
        args = (sid, body["templateID"], body.get("metadata") or {}, body.get("envVars") or {},
                float(body.get("timeout", 300)), bool(allow), self.policy)
        vm: EmulatedVM | GvisorVM
        try:
            if body["templateID"] in self.snapshots:
                image, procs = self.snapshots[body["templateID"]]
                vm = await GvisorVM.restored(image, procs, *args)
                self.copies["restore"] += 1
            elif self.vm_kind == "gvisor":
                vm = GvisorVM(*args)
                await self._booted(vm)
            else:
                vm = EmulatedVM(*args)
        except (OSError, RuntimeError, TimeoutError) as err:
            return _err(500, f"the sandbox did not start: {err}")
        vm.network = network  # what the SDK sent, for tests to assert (bubblewrap has no network anyway)
        self.vms[sid] = vm
        self.created.append(sid)
        return web.json_response(self._sandbox_body(vm), status=201)

    @staticmethod
    async def _booted(vm: GvisorVM) -> None:
        try:
            await vm.boot()
        except BaseException:
            await vm.kill()
            raise

    def _copyable(self, request: web.Request) -> GvisorVM | web.Response:
        if (denied := self._auth(request)) is not None:
            return denied
        vm = self._vm(request)
        if vm is None:
            return _err(404, "sandbox not found")
        if not isinstance(vm, GvisorVM):
            return _err(500, "this emulation's sandboxes run each command in bubblewrap and cannot copy "
                             "a process: start the emulator with vm='gvisor'")
        if vm.state != "running":
            return _err(409, f"sandbox is {vm.state}")
        return vm

    async def _image(self, vm: GvisorVM) -> tuple[Path, dict[int, Proc]]:
        """The running VM checkpointed (it goes on, its streams dropped) and its processes."""
        image = state_base() / f"e2b-emu-image-{uuid.uuid4().hex[:12]}"
        procs = dict(vm.procs)
        try:
            await vm.image(image)
        except BaseException:
            shutil.rmtree(image, ignore_errors=True)
            raise
        return image, procs

    async def fork(self, request: web.Request) -> web.Response:
        """``POST /sandboxes/{id}/fork``: one checkpoint, ``count`` sandboxes restored from
        it, each succeeding or failing on its own (201, one result each)."""
        vm = self._copyable(request)
        if isinstance(vm, web.Response):
            return vm
        body = await request.json() if request.can_read_body else {}
        count, timeout_s = int(body.get("count", 1)), float(body.get("timeout", 15))
        try:
            image, procs = await self._image(vm)
        except (OSError, RuntimeError) as err:
            return _err(500, f"the sandbox could not be checkpointed: {err}")
        results: list[dict] = []
        try:
            for _ in range(count):
                sid = "emu" + uuid.uuid4().hex[:17]
                try:
                    new = await GvisorVM.restored(image, procs, sid, vm.template, vm.metadata, vm.env_vars,
                                                  timeout_s, vm.allow_internet, self.policy)
                except (OSError, RuntimeError, TimeoutError) as err:
                    results.append({"error": {"code": 500, "message": f"the fork did not start: {err}"}})
                    continue
                new.network = vm.network
                self.vms[sid] = new
                self.created.append(sid)
                results.append({"sandbox": self._sandbox_body(new)})
        finally:
            shutil.rmtree(image, ignore_errors=True)
        self.copies["fork"] += 1
        return web.json_response(results, status=201)

    async def create_snapshot(self, request: web.Request) -> web.Response:
        """``POST /sandboxes/{id}/snapshots``: the VM checkpointed (it goes on), kept until
        ``DELETE /templates/{id}``; a create naming it as its template restores it."""
        vm = self._copyable(request)
        if isinstance(vm, web.Response):
            return vm
        body = await request.json() if request.can_read_body else {}
        try:
            image, procs = await self._image(vm)
        except (OSError, RuntimeError) as err:
            return _err(500, f"the sandbox could not be checkpointed: {err}")
        snap_id = "emu-snapshot-" + uuid.uuid4().hex[:12]
        self.snapshots[snap_id] = (image, procs)
        self.copies["snapshot"] += 1
        name = body.get("name") or snap_id
        return web.json_response({"snapshotID": snap_id, "names": [f"emulated/{name}:default"]}, status=201)

    async def delete_snapshot(self, request: web.Request) -> web.Response:
        if (denied := self._auth(request)) is not None:
            return denied
        found = self.snapshots.pop(request.match_info["id"], None)
        if found is None:
            return _err(404, "template not found")
        shutil.rmtree(found[0], ignore_errors=True)
        return web.Response(status=204)

    async def list(self, request: web.Request) -> web.Response:
        if (denied := self._auth(request)) is not None:
            return denied
        want_meta = {k: urllib.parse.unquote(v) for k, v in
                     urllib.parse.parse_qsl(request.query.get("metadata", ""))}
        states = set(filter(None, request.query.get("state", "").split(",")))
        out = [self._detail(vm) for vm in self.vms.values()
               if all(vm.metadata.get(k) == v for k, v in want_meta.items())
               and (not states or vm.state in states)]
        return web.json_response(out)

    async def info(self, request: web.Request) -> web.Response:
        if (denied := self._auth(request)) is not None:
            return denied
        vm = self._vm(request)
        return _err(404, "sandbox not found") if vm is None else web.json_response(self._detail(vm))

    async def kill(self, request: web.Request) -> web.Response:
        if (denied := self._auth(request)) is not None:
            return denied
        vm = self.vms.pop(request.match_info["id"], None)
        if vm is None:
            return _err(404, "sandbox not found")
        await vm.kill()
        return web.Response(status=204)

    async def set_timeout(self, request: web.Request) -> web.Response:
        if (denied := self._auth(request)) is not None:
            return denied
        vm = self._vm(request)
        if vm is None:
            return _err(404, "sandbox not found")
        vm.end_at = time.time() + float((await request.json())["timeout"])
        return web.Response(status=204)

    async def refresh(self, request: web.Request) -> web.Response:
        if (denied := self._auth(request)) is not None:
            return denied
        vm = self._vm(request)
        if vm is None:
            return _err(404, "sandbox not found")
        duration = float(((await request.json()) or {}).get("duration", 60))
        vm.end_at = max(vm.end_at, time.time() + duration)
        return web.Response(status=204)

    async def pause(self, request: web.Request) -> web.Response:
        if (denied := self._auth(request)) is not None:
            return denied
        vm = self._vm(request)
        if vm is None:
            return _err(404, "sandbox not found")
        if vm.state == "paused":
            return _err(409, "sandbox is already paused")
        await vm.pause(hold=self.pause_hold)
        return web.Response(status=204)

    async def connect(self, request: web.Request) -> web.Response:
        if (denied := self._auth(request)) is not None:
            return denied
        vm = self._vm(request)
        if vm is None:
            return _err(404, "sandbox not found")
        body = await request.json() if request.can_read_body else {}
        timeout_s = float(body.get("timeout", 300))
        if vm.state == "paused":
            await vm.resume(timeout_s)
            return web.json_response(self._sandbox_body(vm), status=201)
        vm.end_at = max(vm.end_at, time.time() + timeout_s)
        return web.json_response(self._sandbox_body(vm), status=200)

    # ---- envd -----------------------------------------------------------------

    def vm_for_headers(self, headers) -> EmulatedVM:
        """The running sandbox a request to envd is for (as E2B's edge proxy routes it)."""
        vm = self.vms.get(headers.get("e2b-sandbox-id", ""))
        if vm is None or vm.state != "running":
            raise LookupError("sandbox not found or not running")
        if headers.get("x-access-token") != vm.envd_access_token:
            raise PermissionError("bad envd access token")
        return vm

    def _envd_vm(self, request: web.Request) -> EmulatedVM | web.Response:
        try:
            return self.vm_for_headers({k.lower(): v for k, v in request.headers.items()})
        except LookupError as err:
            return _err(502, str(err))
        except PermissionError as err:
            return _err(401, str(err))

    def _register_stream(self, request: web.Request):
        if not request.path.endswith(("/Start", "/Connect")):
            return None
        vm = self.vms.get(request.headers.get("E2b-Sandbox-Id", ""))
        if vm is None or request.transport is None:
            return None
        abort = request.transport.abort
        vm.stream_aborts.add(abort)
        return lambda: vm.stream_aborts.discard(abort)

    async def health(self, request: web.Request) -> web.Response:
        vm = self._envd_vm(request)
        return vm if isinstance(vm, web.Response) else web.Response(status=204)

    @staticmethod
    def _sandbox_path(path: str) -> str | None:
        path = posixpath.normpath(posixpath.join("/home/user", path))
        return path if any(path == d or path.startswith(d + "/") for d in PERSISTENT) else None

    async def write_files(self, request: web.Request) -> web.Response:
        vm = self._envd_vm(request)
        if isinstance(vm, web.Response):
            return vm
        entries: list[tuple[str, bytes]] = []
        if request.content_type == "multipart/form-data":
            reader = await request.multipart()
            async for part in reader:
                name = request.query.get("path") or part.filename
                entries.append((name, bytes(await part.read(decode=False))))
        else:
            entries.append((request.query["path"], await request.read()))
        out = []
        for raw, data in entries:
            path = self._sandbox_path(raw)
            if path is None:
                return _err(403, f"the emulator only writes under {PERSISTENT}: {raw}")
            try:  # inside the sandbox, so links planted by a cell resolve there
                await vm.write_file(path, data)
            except OSError as err:
                return _err(400, str(err))
            out.append({"name": posixpath.basename(path), "type": "file", "path": path})
        return web.json_response(out)

    async def read_file(self, request: web.Request) -> web.Response:
        vm = self._envd_vm(request)
        if isinstance(vm, web.Response):
            return vm
        path = self._sandbox_path(request.query["path"])
        if path is None:
            return _err(404, "file not found")
        try:
            out = await vm.read_file(path)
        except OSError as err:
            return _err(404, str(err))
        return web.Response(body=out, content_type="application/octet-stream")


def _event(kind: str, value) -> process_pb.ProcessEvent:
    return process_pb.ProcessEvent(event=Oneof(kind, value))


def _user(headers) -> str | None:
    """The user a command runs as: envd's ``Authorization: Basic base64(user:)``."""
    auth = headers.get("authorization", "")
    if not auth.startswith("Basic "):
        return None
    return base64.b64decode(auth[6:]).decode("utf-8", "replace").split(":", 1)[0] or None


def _selector_pid(selector) -> int:
    match selector.selector if selector else None:
        case Oneof(field="pid", value=pid):
            return pid
    raise ConnectError(Code.INVALID_ARGUMENT, "select processes by pid")


class ProcessService(process_connect.Process):
    """envd's ``process.Process`` service over emulated sandboxes.

    Subclasses the SDK's generated service protocol, so what is not emulated
    (``Update``, ``StreamInput``: PTY and streamed input) answers UNIMPLEMENTED.
    """

    def __init__(self, emu: E2BEmulator):
        self.emu = emu

    def _vm(self, ctx) -> EmulatedVM:
        try:
            return self.emu.vm_for_headers(ctx.request_headers)
        except LookupError as err:
            raise ConnectError(Code.UNAVAILABLE, str(err)) from err
        except PermissionError as err:
            raise ConnectError(Code.UNAUTHENTICATED, str(err)) from err

    async def list(self, request, ctx) -> process_pb.ListResponse:
        vm = self._vm(ctx)
        return process_pb.ListResponse(processes=[
            process_pb.ProcessInfo(
                config=process_pb.ProcessConfig(cmd=p.cmd, args=p.args, envs=p.envs, cwd=p.cwd),
                pid=p.pid, tag=p.tag)
            for p in vm.procs.values()])

    async def _stream(self, proc, q, wrap) -> AsyncIterator:
        try:
            while True:
                try:
                    ev = await asyncio.wait_for(q.get(), KEEPALIVE_S)
                except TimeoutError:
                    yield wrap(_event("keepalive", process_pb.ProcessEvent.KeepAlive()))
                    continue
                if ev[0] == "end":
                    rc = ev[1]
                    yield wrap(_event("end", process_pb.ProcessEvent.EndEvent(
                        exit_code=rc if rc >= 0 else 128 - rc, exited=rc >= 0,
                        status=f"exit status {rc}" if rc >= 0 else f"signal: {-rc}",
                        error=None if rc == 0 else f"exit status {rc}")))
                    return
                yield wrap(_event("data", process_pb.ProcessEvent.DataEvent(output=Oneof(ev[0], ev[1]))))
        finally:
            proc.unsubscribe(q)

    async def start(self, request, ctx):
        vm = self._vm(ctx)
        cfg = request.process
        proc = await vm.spawn(cfg.cmd, list(cfg.args), dict(cfg.envs), cfg.cwd or None,
                              bool(request.stdin), request.tag or None, user=_user(ctx.request_headers))
        q = proc.subscribe()
        wrap = lambda ev: process_pb.StartResponse(event=ev)
        yield wrap(_event("start", process_pb.ProcessEvent.StartEvent(pid=proc.pid)))
        async for out in self._stream(proc, q, wrap):
            yield out

    async def connect(self, request, ctx):
        vm = self._vm(ctx)
        pid = _selector_pid(request.process)
        proc = vm.procs.get(pid)
        if proc is None:
            raise ConnectError(Code.NOT_FOUND, f"process with pid {pid} not found")
        q = proc.subscribe()
        wrap = lambda ev: process_pb.ConnectResponse(event=ev)
        yield wrap(_event("start", process_pb.ProcessEvent.StartEvent(pid=proc.pid)))
        async for out in self._stream(proc, q, wrap):
            yield out

    async def send_input(self, request, ctx) -> process_pb.SendInputResponse:
        vm = self._vm(ctx)
        pid = _selector_pid(request.process)
        match request.input.input if request.input else None:
            case Oneof(field="stdin", value=data):
                pass
            case _:
                raise ConnectError(Code.INVALID_ARGUMENT, "only stdin input is emulated")
        if self.emu.input_delay_s:
            await asyncio.sleep(self.emu.input_delay_s)
        try:
            await vm.send_stdin(pid, data)
        except KeyError as err:
            raise ConnectError(Code.NOT_FOUND, f"process with pid {pid} not found") from err
        except (BrokenPipeError, ConnectionResetError) as err:
            raise ConnectError(Code.FAILED_PRECONDITION, f"stdin closed: {err}") from err
        return process_pb.SendInputResponse()

    async def send_signal(self, request, ctx) -> process_pb.SendSignalResponse:
        vm = self._vm(ctx)
        pid = _selector_pid(request.process)
        try:
            await vm.signal(pid, request.signal.value)
        except KeyError as err:
            raise ConnectError(Code.NOT_FOUND, f"process with pid {pid} not found") from err
        return process_pb.SendSignalResponse()

    async def close_stdin(self, request, ctx) -> process_pb.CloseStdinResponse:
        vm = self._vm(ctx)
        try:
            await vm.close_stdin(_selector_pid(request.process))
        except KeyError as err:
            raise ConnectError(Code.NOT_FOUND, "process not found") from err
        return process_pb.CloseStdinResponse()


class EmulatorThread:
    """Run an :class:`E2BEmulator` on its own event loop in a daemon thread.

    Tests use it so the emulator keeps serving whatever loop the test runs.
    """

    def __init__(self, api_key: str, policy: Policy | None = None, vm: str = "bubblewrap"):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True,
                                       name="e2b-emulator")
        self.thread.start()
        self.emu = E2BEmulator(api_key, policy, vm)
        self.call(self.emu.start())

    def call(self, coro, timeout_s: float = 60.0):
        """Run ``coro`` on the emulator's loop and return its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def close(self) -> None:
        try:
            self.call(self.emu.close())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)
            if not self.thread.is_alive():  # its epoll fd and self-pipe, else left open (3 fds a test)
                self.loop.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--api-key", default="e2b_emulator_key")
    args = ap.parse_args()

    async def serve() -> None:
        emu = E2BEmulator(args.api_key)
        await emu.start()
        print(json.dumps({"E2B_API_URL": emu.api_url, "E2B_SANDBOX_URL": emu.sandbox_url}), flush=True)
        try:
            await asyncio.Event().wait()
        finally:
            await emu.close()

    asyncio.run(serve())


if __name__ == "__main__":
    main()
