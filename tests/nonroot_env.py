"""The environment of the tests run as ordinary users (issue 13): a venv every user can
read, a kernelspec root installs into it, two created users, and running as them.

Shared by ``test_nonroot.py`` (rootless gVisor), ``test_service.py`` and
``test_service_workspace.py`` (the sandbox service, its ``service`` fixture:
:func:`running_service`), ``test_workspace_owner_nonroot.py`` and
``browser/test_lab_as_user.py``; import the ``env`` fixture from here.  All are the
``nonroot`` tier (``conftest.py``): they share the created users, so one worker runs them.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sandbox_kernel.backends.local.service.client import hello

REPO = Path(__file__).resolve().parents[1]
USERS = ("sk-test-a", "sk-test-b")
KERNEL = "sk-nonroot"
MEMORY_MIB = 2048


def _user(name: str, home: Path) -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(name)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "--home-dir", str(home),
                        "--shell", "/usr/sbin/nologin", name], check=True)
        return pwd.getpwnam(name)


def base_dir() -> Path:
    """Where :func:`make_env` builds (per test process)."""
    return Path(f"/var/tmp/sandbox-kernel-nonroot-{os.getpid()}")


def make_env(tmp_path_factory, kernelspecs: dict[str, list[str]] | None = None):
    """The body of each module's ``env`` fixture (a generator: set up, yield, remove).
    ``kernelspecs``: more kernelspecs to install into the venv, name -> install flags."""
    """A venv every user can read (``/usr/bin/python3`` + this project's packages,
    hard-linked), the kernelspec installed into it by root, two ordinary users."""
    if os.geteuid() != 0:
        pytest.fail("these tests create users: run the suite as root (CI does)")
    base = base_dir()
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir(mode=0o755)
    os.chmod(base, 0o755)
    venv = base / "venv"
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--without-pip",
                    str(venv)], check=True)
    site = venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    shutil.rmtree(site)
    ours = Path(next(p for p in sys.path if p.endswith("site-packages") and Path(p).is_dir()))
    for src, dst in ((ours, site), (REPO / "kernel", base / "kernel")):
        if subprocess.run(["cp", "-al", str(src), str(dst)], capture_output=True).returncode != 0:
            shutil.rmtree(dst, ignore_errors=True)  # another filesystem: copied instead
            subprocess.run(["cp", "-a", str(src), str(dst)], check=True)
    for pth in site.glob("__editable__*sandbox_kernel*.pth"):  # a new file: the link is the original's
        pth.unlink()
        pth.write_text(f"{base / 'kernel'}\n")
    shutil.copy(REPO / "tests" / "nonroot" / "driver.py", base / "driver.py")
    python = str(venv / "bin" / "python")
    common = ["--prestart", "0", "--memory-mib", str(MEMORY_MIB), "--pids-max", "64", "--pause-after-s", "3",
              "--checkpoint-after-s", "0", "--pool-socket", "",
              "--service-socket", ""]  # rootless, even where a sandbox service runs on this host
    subprocess.run([python, "-m", "sandbox_kernel", "install", "--sys-prefix", "--name", KERNEL, *common],
                   check=True, capture_output=True)
    subprocess.run([python, "-m", "sandbox_kernel", "install", "--prefix", str(base / "prefix"),
                    "--name", KERNEL + "-prefix", *common], check=True, capture_output=True)
    for name, flags in (kernelspecs or {}).items():
        subprocess.run([python, "-m", "sandbox_kernel", "install", "--sys-prefix", "--name", name, *flags],
                       check=True, capture_output=True)
    users = {}
    for name in USERS:
        home = base / f"home-{name}"
        home.mkdir()
        u = _user(name, home)
        os.chown(home, u.pw_uid, u.pw_gid)
        users[name] = (u, home)
    env = {"base": base, "python": python, "users": users}
    yield env
    for name in USERS:  # as each user would: end the spare pools their kernels started
        as_user(env, name, [python, "-m", "sandbox_kernel", "gc"], timeout_s=120)
    for u, _ in users.values():  # their sandboxes' state, then the tree
        shutil.rmtree(f"/tmp/sandbox-kernel-{u.pw_uid}", ignore_errors=True)
    shutil.rmtree(base, ignore_errors=True)


def as_user(env, user: str, argv: list[str], timeout_s: float = 400, **kw) -> subprocess.CompletedProcess:
    u, home = env["users"][user]
    e = {"HOME": str(home), "PATH": "/usr/bin:/bin", "JUPYTER_PATH": str(env["base"] / "prefix/share/jupyter")}
    return subprocess.run(["setpriv", f"--reuid={u.pw_uid}", f"--regid={u.pw_gid}", "--clear-groups",
                           "env", "-i", *(f"{k}={v}" for k, v in e.items()), *argv],
                          capture_output=True, text=True, timeout=timeout_s, **kw)


def drive(env, user: str, plan: list[dict], kernel: str = KERNEL) -> list[dict]:
    p = as_user(env, user, [env["python"], str(env["base"] / "driver.py"), kernel, json.dumps(plan)])
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def service_socket() -> Path:
    """Where :func:`start_service` listens (per test process)."""
    return base_dir() / "svc-state" / "service.sock"


def start_service(env, *flags: str) -> subprocess.Popen:
    """``sandbox-kernel service [flags]`` as root, its state under the test's directory;
    its log appended to ``service.log``.  Returns once it answers a ``hello``: it binds
    its socket before it takes back an earlier run's sandboxes and serves only after,
    so a socket that accepts a connection is not yet a service that is ready."""
    with open(env["base"] / "service.log", "a") as log:
        proc = subprocess.Popen([env["python"], "-m", "sandbox_kernel", "service", "--socket", str(service_socket()),
                                 *flags],
                                env={**os.environ, "SANDBOX_KERNEL_STATE_DIR": str(env["base"] / "svc-state")},
                                stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    while hello(str(service_socket())) is None:
        assert proc.poll() is None and time.monotonic() < deadline, (env["base"] / "service.log").read_text()
        time.sleep(0.2)
    return proc


def running_service(env):
    """The body of a module's ``service`` fixture (a generator): the service of
    :func:`start_service`, as ``proc`` (a test may replace it), its ``state`` base and
    ``log``; stopped at the end if still running."""
    svc = {"proc": start_service(env), "state": env["base"] / "svc-state", "log": env["base"] / "service.log"}
    yield svc
    if svc["proc"].poll() is None:
        svc["proc"].send_signal(signal.SIGTERM)
        svc["proc"].wait(60)


#: Source of ``ask(req)`` for a script run as a user: one request to the service at ``sock_path``
#: (a global of the script), with ``fds`` passed (``SCM_RIGHTS``); fds passed back are closed, and ``GOT FDS`` printed.
SERVICE_ASK = """
def ask(req, fds=()):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(sock_path)
    line = json.dumps({"protocol": 1, **req}).encode() + b"\\n"
    socket.send_fds(s, [line], list(fds)) if fds else s.sendall(line)
    data = b""
    while not data.endswith(b"\\n"):
        chunk, fds, _, _ = socket.recv_fds(s, 1 << 16, 8)
        for fd in fds:
            os.close(fd)
        if fds:
            print("GOT FDS")
        if not chunk:
            break
        data += chunk
    return json.loads(data)
"""


def restart_service(env, service) -> None:
    """SIGKILL the service (a crash, not a stop) and start it again (``proc`` replaced)."""
    service["proc"].kill()
    service["proc"].wait(30)
    service["proc"] = start_service(env)


def service_log(service) -> str:
    """The end of the service's log (for assertion messages)."""
    return service["log"].read_text()[-4000:]


def held(env, service, kernel: str, plan: list[dict], hold: Path,
         cwd: Path | None = None) -> tuple[subprocess.Popen, dict]:
    """Run ``plan`` as user a (``driver.py``, in ``cwd``) in the background until its
    ``hold_until`` step (at ``hold``); return the driver and the kernel's
    ``kernel_info["sandbox"]`` then."""
    runner, text = until_ready_as_a(env, service, [str(env["base"] / "driver.py"), kernel, json.dumps(plan)],
                                    hold, cwd)
    return runner, json.loads(text)


def until_ready_as_a(env, service, argv: list[str], hold: Path, cwd: Path | None = None,
                     wait_s: float = 240) -> tuple[subprocess.Popen, str]:
    """Run ``python argv`` as user a in the background until it writes ``hold + ".ready"``;
    the process and what it wrote (the test fails with its stderr and the service's log if
    it ends first or takes over ``wait_s`` seconds)."""
    ua, ha = env["users"][USERS[0]]
    runner = subprocess.Popen(
        ["setpriv", f"--reuid={ua.pw_uid}", f"--regid={ua.pw_gid}", "--clear-groups", "env", "-i", f"HOME={ha}",
         "PATH=/usr/bin:/bin", env["python"], *argv],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=None if cwd is None else str(cwd))
    ready = Path(str(hold) + ".ready")
    deadline = time.monotonic() + wait_s
    while not ready.exists():
        if runner.poll() is not None or time.monotonic() > deadline:
            runner.kill()
            pytest.fail(runner.communicate()[1][-3000:] + service_log(service))
        time.sleep(0.3)
    return runner, ready.read_text()
