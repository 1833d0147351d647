"""envd's process and file services INSIDE an emulated E2B microVM on gVisor.

The init process of a :class:`~.e2b_gvisor_vm.GvisorVM` (uid 0 of the sandbox, the
local backend's agent capabilities): it starts the sandbox's commands as its own
children, keeps their pipes, and speaks to the emulator over its stdin and stdout,
one JSON object per line, bytes in base64.  Because the commands' pipes live in the
guest, a copy of the VM (``runsc checkpoint`` then ``runsc restore``: E2B's fork or a
sandbox made from a snapshot) keeps every process and its pipes, and only the
emulator's side of each stream is new, as in a Firecracker copy whose envd lost its
client connections.

Requests (from the emulator) carry an ``id``, answered by ``{"id": .., "ok": ..}``:
``spawn`` (cmd, args, envs, cwd, user, stdin), ``stdin`` (pid, data), ``close_stdin``,
``signal`` (pid, sig: to the command's process group), ``write`` (path, data, user),
``read`` (path), ``exists`` (path).  Events: ``{"ev": "out", "pid", "stream", "data"}``
and ``{"ev": "end", "pid", "code"}`` (a signal as its negative number).

Standard library only: it runs on the host's Python, bound read-only into the sandbox.
"""

import asyncio
import base64
import json
import os
import pwd
import sys

procs = {}
#: Tasks running (kept so that none is collected before it ends).
tasks = set()


def spawned(coro):
    task = asyncio.ensure_future(coro)
    tasks.add(task)
    task.add_done_callback(tasks.discard)


def emit(obj):
    sys.stdout.buffer.write(json.dumps(obj).encode() + b"\n")
    sys.stdout.buffer.flush()


def ids(user):
    pw = pwd.getpwnam(user or "user")
    return pw.pw_uid, pw.pw_gid, pw.pw_dir


async def pump(pid, stream, name):
    while True:
        chunk = await stream.read(65536)
        if not chunk:
            return
        emit({"ev": "out", "pid": pid, "stream": name, "data": base64.b64encode(chunk).decode()})


async def reap(pid, proc, pumps):
    rc = await proc.wait()
    await asyncio.gather(*pumps, return_exceptions=True)
    procs.pop(pid, None)
    emit({"ev": "end", "pid": pid, "code": rc})


async def spawn(req):
    uid, gid, home = ids(req.get("user"))
    env = {"HOME": home, "USER": req.get("user") or "user", "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
           **req.get("envs", {})}

    def drop():
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)

    proc = await asyncio.create_subprocess_exec(
        req["cmd"], *req.get("args", []), stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env=env, cwd=req.get("cwd") or home, preexec_fn=drop,
        start_new_session=True, limit=1 << 20)
    if not req.get("stdin"):
        proc.stdin.close()
    procs[proc.pid] = proc
    pumps = [asyncio.ensure_future(pump(proc.pid, proc.stdout, "stdout")),
             asyncio.ensure_future(pump(proc.pid, proc.stderr, "stderr"))]
    spawned(reap(proc.pid, proc, pumps))
    return {"pid": proc.pid}


async def handle(req):
    op = req["op"]
    if op == "spawn":
        return await spawn(req)
    if op in ("stdin", "close_stdin", "signal"):
        proc = procs.get(req["pid"])
        if proc is None:
            raise LookupError(f"process with pid {req['pid']} not found")
        if op == "stdin":
            proc.stdin.write(base64.b64decode(req["data"]))
            await proc.stdin.drain()
        elif op == "close_stdin":
            proc.stdin.close()
        else:
            os.killpg(proc.pid, req["sig"])
        return {}
    path = req["path"]
    if op == "write":
        uid, gid, _ = ids(req.get("user"))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(base64.b64decode(req["data"]))
        os.chown(path, uid, gid)
        return {}
    if op == "read":
        with open(path, "rb") as f:
            return {"data": base64.b64encode(f.read()).decode()}
    if op == "exists":
        return {"exists": os.path.exists(path)}
    raise ValueError(f"unknown op {op!r}")


async def answer(req):
    try:
        emit({"id": req["id"], "ok": True, **await handle(req)})
    except Exception as err:
        emit({"id": req["id"], "ok": False, "error": f"{type(err).__name__}: {err}"})


async def main():
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=1 << 28)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    emit({"ev": "ready"})
    while True:
        line = await reader.readline()
        if not line:
            # the emulator's side of stdin is gone: in a copy being made, a new one comes
            # with the restore; wait for it rather than end the VM
            await asyncio.sleep(0.05)
            continue
        try:
            req = json.loads(line)
        except ValueError:
            continue  # a line cut by a checkpoint
        spawned(answer(req))


if __name__ == "__main__":
    asyncio.run(main())
