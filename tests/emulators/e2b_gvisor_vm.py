"""An emulated E2B microVM that can be copied: one gVisor sandbox, envd inside it.

E2B's ``Sandbox.fork(count)`` and ``create_snapshot`` copy a running Firecracker
microVM, memory and processes included; a sandbox created from a snapshot (its id as
the template) starts with them.  The bubblewrap VM (:mod:`.e2b_vm`) runs each command
in a sandbox of its own and cannot copy a process.  This one is a single gVisor
sandbox (the local backend's OCI spec, :func:`~sandbox_kernel.backends.local.gvisor.oci_config`)
whose init is an emulated envd (:mod:`.e2b_envd_guest`): it starts the commands as its
children and keeps their pipes, and the emulator talks to it over its stdio.  A copy is
``runsc checkpoint --leave-running`` of the VM, then ``runsc restore`` of that image in
a new sandbox: every process and pipe of the source is in the copy, under the same pids,
and only the emulator's side is new.

What E2B documents and this emulates:

* a fork or snapshot briefly pauses the source (the checkpoint) and drops its open
  output streams, like a pause; its processes go on;
* a copy's processes run on; nobody is connected to them (``commands.connect(pid)``
  attaches), and output produced meanwhile is dropped;
* the home directory and ``/tmp`` are the VM's own (tmpfs, in the image);
* commands run as E2B's ``user`` (uid 1000, home ``/home/user``) or as ``root``.

Needs root (rootless runsc cannot restore).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import os
import shutil
import sys
import time
from pathlib import Path

from sandbox_kernel.backends.local import layout as local
from sandbox_kernel.backends.local.gvisor import AGENT_CAPABILITIES, Runsc, oci_config, prepare_rootfs
from sandbox_kernel.backends.local.procs import kill_mentioning
from sandbox_kernel.backends.local.runsc import RUNSC_ENV, RunscChoice, choose_async

from .e2b_vm import HOLD_MAX_S, USER_HOME, Proc, VMBase

GUEST_ENVD = Path(__file__).with_name("e2b_envd_guest.py")
ENVD_PATH = "/opt/e2b/envd.py"
USER_UID = 1000
#: Longest wait for the guest's answer to one request, seconds.
ANSWER_S = 60.0


class GvisorVM(VMBase):
    """One emulated E2B sandbox in gVisor; the interface of :class:`.e2b_vm.EmulatedVM`,
    plus :meth:`image` (a copy's checkpoint) and :meth:`restored` (a VM from one).

    Parameters: :class:`.e2b_vm.VMBase`'s.
    """

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.state = "starting"
        self.cgroup = None
        self.container_id = self.state_dir.name
        self._proc: asyncio.subprocess.Process | None = None
        self._choice: RunscChoice | None = None
        self._ids = itertools.count(1)
        self._answers: dict[int, asyncio.Future] = {}
        self._reader: asyncio.Task | None = None
        self._ready = asyncio.Event()

    # ---- the sandbox ----------------------------------------------------------

    def _bundle(self) -> Path:
        """This VM's OCI bundle (its own ``/etc``, tmpfs home, envd as init, root)."""
        etc = self.state_dir / "etc"
        local.write_etc(etc)
        (etc / "passwd").write_text("root:x:0:0:root:/root:/bin/bash\n"
                                    f"user:x:{USER_UID}:{USER_UID}:user:{USER_HOME}:/bin/bash\n")
        (etc / "group").write_text(f"root:x:0:\nuser:x:{USER_UID}:\n")
        os.chmod(etc, 0o755)
        config = oci_config(self.policy, self.layout, etc_dir=str(etc),
                            command=[sys.executable, "-I", "-u", ENVD_PATH])
        scratch = f"size={self.policy.scratch_mib}m"
        config["mounts"] = [m for m in config["mounts"] if m["destination"] != local.SANDBOX_HOME] + [
            {"destination": USER_HOME, "type": "tmpfs", "source": "tmpfs",
             "options": ["nosuid", "nodev", "mode=755", f"uid={USER_UID}", f"gid={USER_UID}", scratch]},
            {"destination": ENVD_PATH, "type": "bind", "source": str(GUEST_ENVD),
             "options": ["rbind", "ro", "nosuid", "nodev"]},
        ]
        caps = list(AGENT_CAPABILITIES)
        config["process"].update(
            user={"uid": 0, "gid": 0, "additionalGids": []}, cwd="/",
            capabilities={"bounding": caps, "effective": caps, "permitted": caps, "inheritable": [],
                          "ambient": []})
        bundle = self.state_dir / "bundle"
        prepare_rootfs(bundle / "rootfs", config, self.layout)
        (bundle / "config.json").write_text(json.dumps(config, indent=1))
        (self.state_dir / "runsc").mkdir(mode=0o700)
        return bundle

    async def boot(self, image: Path | None = None) -> None:
        """``runsc run`` (or ``restore`` of ``image``, a copy) and wait for envd."""
        self._choice = await choose_async()
        self._choice.record(self.state_dir)
        bundle = await asyncio.to_thread(self._bundle)
        verb = ["restore", "--image-path", str(image)] if image is not None else ["run"]
        self._proc = await asyncio.create_subprocess_exec(
            *Runsc(self.state_dir, self._choice).argv(*verb, "--bundle", str(bundle), self.container_id),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
            env=RUNSC_ENV, limit=1 << 28, cwd=str(self.state_dir), start_new_session=True)
        self._reader = asyncio.ensure_future(self._read())
        if image is None:
            await asyncio.wait_for(self._ready.wait(), ANSWER_S)
        else:  # a copy says nothing until asked: ask
            await self._ask({"op": "exists", "path": "/"})
        self.state = "running"

    @classmethod
    async def restored(cls, image: Path, procs: dict[int, Proc], *args) -> GvisorVM:
        """A new VM from ``image`` (:meth:`image`), its processes ``procs`` (the source's,
        without their listeners); ``args`` as the constructor's."""
        vm = cls(*args)
        for pid, p in procs.items():
            vm.procs[pid] = Proc(pid=pid, cmd=p.cmd, args=list(p.args), envs=dict(p.envs), cwd=p.cwd,
                                 tag=p.tag, proc=None, stdin_open=p.stdin_open)
        try:
            await vm.boot(image)
        except BaseException:
            await vm.kill()
            raise
        return vm

    async def image(self, dest: Path) -> None:
        """Checkpoint the running VM into ``dest`` (it goes on: ``--leave-running``), its
        open streams dropped first, as E2B's fork and snapshot drop them."""
        self.drop_streams()
        dest.mkdir(mode=0o700, parents=True)
        runsc = Runsc(self.state_dir, self._choice)
        await runsc.call("checkpoint", "--leave-running", *runsc.compression("flate-best-speed"),
                         "--image-path", str(dest), self.container_id, timeout_s=120)

    # ---- the channel to envd ------------------------------------------------------

    async def _read(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        while line := await self._proc.stdout.readline():
            try:
                msg = json.loads(line)
            except ValueError:
                continue  # a line cut by the checkpoint this copy was made from
            if "id" in msg:
                fut = self._answers.pop(msg["id"], None)
                if fut is not None and not fut.done():
                    fut.set_result(msg)
            elif msg.get("ev") == "ready":
                self._ready.set()
            elif (p := self.procs.get(msg.get("pid", -1))) is not None:
                if msg["ev"] == "out":
                    p.publish((msg["stream"], base64.b64decode(msg["data"])))
                elif msg["ev"] == "end":
                    p.exit_code = msg["code"]
                    p.done.set()
                    p.publish(("end", msg["code"]))
                    self.procs.pop(p.pid, None)
        for fut in self._answers.values():
            if not fut.done():
                fut.set_exception(ConnectionError("the VM's envd is gone"))

    async def _ask(self, req: dict) -> dict:
        if self._proc is None or self._proc.stdin is None or self._proc.returncode is not None:
            raise ConnectionError("the VM is not running")
        req["id"] = n = next(self._ids)
        self._answers[n] = fut = asyncio.get_running_loop().create_future()
        self._proc.stdin.write(json.dumps(req).encode() + b"\n")
        await self._proc.stdin.drain()
        answer = await asyncio.wait_for(fut, ANSWER_S)
        if not answer.get("ok"):
            raise OSError(answer.get("error", "failed"))
        return answer

    # ---- envd's services ----------------------------------------------------------------

    async def spawn(self, cmd: str, args: list[str], envs: dict[str, str], cwd: str | None,
                    stdin: bool, tag: str | None, user: str | None = None) -> Proc:
        """Start ``cmd args`` in the VM as ``user`` (envd ``Process/Start``)."""
        cwd = cwd or USER_HOME
        answer = await self._ask({"op": "spawn", "cmd": cmd, "args": list(args), "cwd": cwd,
                                  "envs": {**self.env_vars, **envs}, "stdin": stdin, "user": user or "user"})
        p = Proc(pid=answer["pid"], cmd=cmd, args=list(args), envs=dict(envs), cwd=cwd, tag=tag, proc=None,
                 stdin_open=stdin)
        self.procs[p.pid] = p
        return p

    async def send_stdin(self, pid: int, data: bytes) -> None:
        p = self.procs[pid]
        if not p.stdin_open:
            raise BrokenPipeError("stdin is not open")
        await self._ask({"op": "stdin", "pid": pid, "data": base64.b64encode(data).decode()})

    async def close_stdin(self, pid: int) -> None:
        self.procs[pid].stdin_open = False
        await self._ask({"op": "close_stdin", "pid": pid})

    async def signal(self, pid: int, sig: int) -> None:
        if pid not in self.procs:
            raise KeyError(pid)
        await self._ask({"op": "signal", "pid": pid, "sig": sig})

    async def write_file(self, path: str, data: bytes) -> None:
        await self._ask({"op": "write", "path": path, "data": base64.b64encode(data).decode(), "user": "user"})

    async def read_file(self, path: str) -> bytes:
        return base64.b64decode((await self._ask({"op": "read", "path": path}))["data"])

    def host_pids(self) -> list[int]:
        """The sandbox's host processes (runsc, its sentry and gofer)."""
        from sandbox_kernel.backends.local.procs import processes_mentioning
        return processes_mentioning(str(self.state_dir))

    # ---- lifecycle --------------------------------------------------------------------

    async def pause(self, hold: tuple[str, str] | None = None) -> None:
        """Drop every open stream (``hold``: as :meth:`.e2b_vm.EmulatedVM.pause`), then
        ``runsc pause``."""
        self.drop_streams()
        if hold is not None:
            marker, done = hold
            await self._ask({"op": "write", "path": marker, "data": "", "user": "user"})
            deadline = time.monotonic() + HOLD_MAX_S
            while time.monotonic() < deadline and not (await self._ask({"op": "exists", "path": done}))["exists"]:
                await asyncio.sleep(0.05)
        await Runsc(self.state_dir, self._choice).call("pause", self.container_id)
        self.state = "paused"

    async def resume(self, timeout_s: float) -> None:
        await Runsc(self.state_dir, self._choice).call("resume", self.container_id)
        self.state = "running"
        self.end_at = time.time() + timeout_s

    async def kill(self) -> None:
        """Kill runsc and everything of the sandbox; remove its state."""
        self.drop_streams()
        self.state = "killed"
        await asyncio.to_thread(kill_mentioning, str(self.state_dir))
        if self._proc is not None:
            with contextlib.suppress(asyncio.TimeoutError, ProcessLookupError):
                self._proc.kill()
                await asyncio.wait_for(self._proc.wait(), 10)
            if self._proc.stdin is not None:
                self._proc.stdin.close()
        if self._reader is not None:  # to the pipe's end: the transport then closes itself
            with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(self._reader, 10)
        for p in list(self.procs.values()):
            p.done.set()
            p.publish(("end", -9))
        self.procs.clear()
        if self._choice is not None:
            runsc = Runsc(self.state_dir, self._choice)
            await runsc.call("delete", "--force", self.container_id, check=False, timeout_s=20)
        await asyncio.to_thread(shutil.rmtree, self.state_dir, True)
