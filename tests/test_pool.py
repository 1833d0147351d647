"""The warm pool (``sandbox-kernel pool``) through real sandboxes and a real daemon.

Each test module run starts its own daemon per runtime, listening on a unix
socket in a temporary directory; kernels reach it through a kernelspec whose
``pool_socket`` points there.  Every cell runs inside a sandbox.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from kernels import RUNTIMES, Kernel, kernel_name_for
from sandbox_kernel.backends.local import LocalBackend
from sandbox_kernel.backends.local import cgroups as limits
from sandbox_kernel.backends.local.layout import state_base
from sandbox_kernel.backends.local.pool.wire import request
from sandbox_kernel.backends.local.procs import processes_mentioning

SIZE = 2


class Daemon:
    """A ``sandbox-kernel pool`` process started by the test."""

    def __init__(self, runtime: str, socket_path: Path, size: int = SIZE, *extra: str):
        self.runtime = runtime
        self.socket = socket_path
        self.log = open(socket_path.with_suffix(".log"), "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sandbox_kernel.cli", "pool", "--size", str(size),
             "--runtime", runtime, "--socket", str(socket_path), *extra],
            stdout=self.log, stderr=subprocess.STDOUT)
        self.wait_ready(size)

    def status(self) -> dict:
        answer, fds = request(self.socket, {"op": "status"}, timeout_s=10)
        assert fds == []
        return answer

    def wait_ready(self, n: int, timeout: float = 240) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, Path(self.log.name).read_text()
            if self.socket.exists():
                st = self.status()
                if st["ready"] >= n:
                    return st
            time.sleep(0.3)
        raise TimeoutError(f"pool not refilled to {n}: {Path(self.log.name).read_text()[-2000:]}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(60)
        self.log.close()


def _gone(container_id: str, timeout: float = 30) -> bool:
    """True once nothing of the sandbox is left: state dir, processes, cgroup."""
    d = state_base() / container_id
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not d.exists() and not processes_mentioning(str(d)) and \
                limits.SandboxCgroup.existing(container_id) is None:
            return True
        time.sleep(0.2)
    return False


@pytest.mark.parametrize("info", [
    {"container_id": "elsewhere", "state_dir": "/tmp/elsewhere", "runtime": "bubblewrap", "pid": 1},
    {"container_id": "sandbox-kernel-x-1", "state_dir": "/etc/sandbox-kernel-x-1", "runtime": "bubblewrap",
     "pid": 1},
])
def test_adopt_refuses_a_sandbox_it_cannot_own_and_closes_the_fds(info):
    """What a pool hands over is checked before anything is adopted; the fds never leak."""
    from sandbox_kernel.policy import Policy

    backend = LocalBackend(Policy(), "adopt-test", runtime="bubblewrap")
    pipes = [os.pipe() for _ in range(3)]
    fds = {"stdin": pipes[0][1], "stdout": pipes[1][0], "stderr": pipes[2][0],
           "watchdog": pipes[0][0], "pidfd": pipes[1][1]}
    with pytest.raises(ValueError, match="unexpected sandbox location"):
        asyncio.run(backend.adopt(info, fds))
    for fd in fds.values():
        with pytest.raises(OSError):
            os.fstat(fd)
    os.close(pipes[2][1])
    assert backend.describe().get("container_id") is None and backend.pooled is False


@pytest.fixture(scope="module", params=RUNTIMES)
def pool(request, tmp_path_factory, kernelspec_prefix):
    runtime = request.param
    sock = tmp_path_factory.mktemp(f"pool-{runtime}") / "pool.sock"
    d = Daemon(runtime, sock)
    from sandbox_kernel.kernelspec import install

    name = kernel_name_for(runtime, "pool")
    install(name, options={"runtime": runtime, "pool_socket": str(sock)}, prefix=kernelspec_prefix)
    mismatch = kernel_name_for(runtime, "pool-mismatch")
    install(mismatch, options={"runtime": runtime, "pool_socket": str(sock), "memory_mib": 2048},
            prefix=kernelspec_prefix)
    d.kernel_name, d.mismatch_name = name, mismatch
    yield d
    left = d.status()["container_ids"]
    d.stop()
    for cid in left:  # the daemon removes what it still holds
        assert _gone(cid), cid


@pytest.fixture
def kernels(start_kernel):
    """Kernels shut down at teardown (the shared ``start_kernel`` factory)."""
    return start_kernel


def test_socket_is_private(pool):
    st = os.stat(pool.socket)
    assert stat.S_ISSOCK(st.st_mode)
    assert stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == os.geteuid()


def test_kernel_gets_a_pooled_sandbox_and_state_works(pool, kernels):
    ready = set(pool.wait_ready(SIZE)["container_ids"])
    k = kernels(pool.kernel_name)
    info = k.sandbox_info()
    assert info["pooled"] is True
    assert info["container_id"] in ready
    assert info["runtime"] == pool.runtime
    first = k.execute("x = 7")
    assert first.status == "ok"
    # never ran code before: this is the interpreter's first cell
    assert first.reply["content"]["execution_count"] == 1
    assert k.execute("x + 1").result_text == "8"
    assert k.execute("import os; print(os.getuid(), os.getcwd())").stdout == "65534 /home/sandbox\n"
    assert info["container_id"] not in pool.status()["container_ids"]  # forgotten by the pool


def test_two_kernels_never_share_a_sandbox(pool, kernels):
    pool.wait_ready(SIZE)
    a, b = kernels(pool.kernel_name), kernels(pool.kernel_name)
    ia, ib = a.sandbox_info(), b.sandbox_info()
    assert ia["pooled"] and ib["pooled"]
    assert ia["container_id"] != ib["container_id"]
    assert a.execute("secret = 'only in a'").status == "ok"
    r = b.execute("secret")
    assert r.status == "error" and r.ename == "NameError"
    assert a.execute("secret").result_text == "'only in a'"


def test_pool_refills_with_new_sandboxes(pool, kernels):
    before = pool.wait_ready(SIZE)
    k = kernels(pool.kernel_name)
    taken = k.sandbox_info()["container_id"]
    after = pool.wait_ready(SIZE)
    assert after["handed"] == before["handed"] + 1
    assert taken not in after["container_ids"]
    assert len(set(after["container_ids"])) == SIZE


def test_shutdown_leaves_nothing_behind(pool):
    pool.wait_ready(1)
    k = Kernel(pool.kernel_name)
    cid = k.sandbox_info()["container_id"]
    assert k.sandbox_info()["pooled"]
    assert k.execute("open('/tmp/f', 'w').write('x')").status == "ok"
    tag = json.loads((state_base() / cid / "tag.json").read_text())
    assert tag["proxy_pid"] == k.km.provisioner.pid  # the proxy owns it now (gc, watchdog)
    k.shutdown()
    assert _gone(cid), f"{cid} left behind"


def test_policy_mismatch_starts_cold(pool, kernels):
    before = pool.wait_ready(SIZE)
    k = kernels(pool.mismatch_name)
    info = k.sandbox_info()
    assert info["pooled"] is False
    assert info["container_id"] not in before["container_ids"]
    assert k.execute("y = 1; y + 1").result_text == "2"
    after = pool.status()
    assert after["handed"] == before["handed"]


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_killing_the_daemon_keeps_running_kernels(runtime, tmp_path, kernelspec_prefix):
    from sandbox_kernel.kernelspec import install

    sock = tmp_path / "pool.sock"
    d = Daemon(runtime, sock, 2)
    name = kernel_name_for(runtime, "pool-kill")
    install(name, options={"runtime": runtime, "pool_socket": str(sock)}, prefix=kernelspec_prefix)
    k = None
    try:
        k = Kernel(name)
        info = k.sandbox_info()
        assert info["pooled"]
        assert k.execute("z = 41").status == "ok"
        unhanded = d.status()["container_ids"]
        d.proc.kill()  # SIGKILL: no cleanup in the daemon
        d.proc.wait(30)
        assert k.execute("z + 1", timeout=60).result_text == "42"
        # the daemon's own sandboxes are reaped by their watchdogs
        for cid in unhanded:
            assert _gone(cid, timeout=60), f"unhanded {cid} left behind"
        assert k.execute("z", timeout=60).result_text == "41"
        assert k.sandbox_info()["container_id"] == info["container_id"]
        k.shutdown()
        k = None
        assert _gone(info["container_id"]), f"{info['container_id']} left behind"
    finally:
        if k is not None:
            k.shutdown()
        d.stop()


def test_a_request_the_daemon_closed_on_unread_is_sent_again_and_then_named(tmp_path):
    """A daemon that closes a connection before the request's end came (it cannot have acted
    on it: a request is one line) is asked once more; a second such close is an error naming
    that, not a bare broken pipe.  A real unix socket served by a thread here."""
    import socket
    import threading

    path = tmp_path / "daemon.sock"
    big = {"op": "hello", "pad": "x" * (4 << 20)}  # larger than the socket's buffer: the send blocks

    def serve(answers: list[bool]) -> None:
        srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        srv.bind(str(path))
        srv.listen(4)
        for answer in answers:
            conn, _ = srv.accept()
            with conn:
                if answer:
                    with conn.makefile("rb") as f:
                        f.readline()
                    conn.sendall(b'{"ok": true}\n')
                else:
                    conn.recv(1)  # some of the request, then a close with the rest unread
        srv.close()

    t = threading.Thread(target=serve, args=([False, True],), daemon=True)
    t.start()
    while not path.exists():
        time.sleep(0.01)
    assert request(path, big, 10)[0] == {"ok": True}
    t.join(10)
    path.unlink()

    t = threading.Thread(target=serve, args=([False, False],), daemon=True)
    t.start()
    while not path.exists():
        time.sleep(0.01)
    with pytest.raises(ConnectionError, match="closed the connection before reading the request"):
        request(path, big, 10)
    t.join(10)
