"""Issue 13: JupyterLab as an ordinary user, still on gVisor.

Two ordinary users are created; each runs kernels through ``jupyter_client`` in a
process of its own uid (``tests/nonroot/driver.py``), from a Python environment root
set up the way an operator would (a venv in a world-readable place, ``sandbox-kernel
install --sys-prefix`` by root).  The venv is this project's, hard-linked (its
interpreter lives where the test runs, maybe under root's 0700 home): the same files,
reachable by the users.  Their kernels run on rootless gVisor (``runsc --rootless
--ignore-cgroups``): state, interrupt, the memory and process limits, pause; one
user's sandboxes are out of the other's reach.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

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


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """A venv every user can read (``/usr/bin/python3`` + this project's packages,
    hard-linked), the kernelspec installed into it by root, two ordinary users."""
    if os.geteuid() != 0:
        pytest.fail("these tests create users: run the suite as root (CI does)")
    base = Path(f"/var/tmp/sandbox-kernel-nonroot-{os.getpid()}")
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
              "--checkpoint-after-s", "0", "--pool-socket", ""]
    subprocess.run([python, "-m", "sandbox_kernel", "install", "--sys-prefix", "--name", KERNEL, *common],
                   check=True, capture_output=True)
    subprocess.run([python, "-m", "sandbox_kernel", "install", "--prefix", str(base / "prefix"),
                    "--name", KERNEL + "-prefix", *common], check=True, capture_output=True)
    users = {}
    for name in USERS:
        home = base / f"home-{name}"
        home.mkdir()
        u = _user(name, home)
        os.chown(home, u.pw_uid, u.pw_gid)
        users[name] = (u, home)
    yield {"base": base, "python": python, "users": users}
    for u, _ in users.values():  # their sandboxes' state, then the tree
        shutil.rmtree(f"/tmp/sandbox-kernel-{u.pw_uid}", ignore_errors=True)
    shutil.rmtree(base, ignore_errors=True)


def _as(env, user: str, argv: list[str], timeout_s: float = 400, **kw) -> subprocess.CompletedProcess:
    u, home = env["users"][user]
    e = {"HOME": str(home), "PATH": "/usr/bin:/bin", "JUPYTER_PATH": str(env["base"] / "prefix/share/jupyter")}
    return subprocess.run(["setpriv", f"--reuid={u.pw_uid}", f"--regid={u.pw_gid}", "--clear-groups",
                           "env", "-i", *(f"{k}={v}" for k, v in e.items()), *argv],
                          capture_output=True, text=True, timeout=timeout_s, **kw)


def _drive(env, user: str, plan: list[dict], kernel: str = KERNEL) -> list[dict]:
    p = _as(env, user, [env["python"], str(env["base"] / "driver.py"), kernel, json.dumps(plan)])
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_a_kernelspec_root_installs_is_listed_for_an_ordinary_user(env):
    for spec in (env["base"] / "venv/share/jupyter/kernels" / KERNEL, env["base"] / "prefix/share/jupyter/kernels"
                 / (KERNEL + "-prefix")):
        assert spec.stat().st_mode & 0o777 == 0o755, spec
    p = _as(env, USERS[0], [env["python"], "-m", "jupyter_client.kernelspecapp", "list", "--json"])
    listed = json.loads(p.stdout)["kernelspecs"]
    assert KERNEL in listed and KERNEL + "-prefix" in listed, p.stdout + p.stderr
    assert listed[KERNEL]["spec"]["argv"][:3] == [env["python"], "-m", "sandbox_kernel"]


def test_an_ordinary_users_kernel_runs_on_rootless_gvisor_with_its_limits(env):
    """State, interrupt, the process limit, one allocation past the limit (MemoryError,
    the interpreter intact), the sandbox's total past it (ended, the limit named), pause."""
    fork_bomb = ("import os, time\nn = 0\ntry:\n    while True:\n        if os.fork() == 0:\n"
                 "            time.sleep(5); os._exit(0)\n        n += 1\nexcept OSError as e:\n"
                 "    print('forks refused after', n, type(e).__name__)\n"
                 "while True:  # reaped, or they hold the limit as zombies\n    try:\n        os.wait()\n"
                 "    except ChildProcessError:\n        break")
    many = ("import multiprocessing as mp, time\ndef hold(_):\n    b = bytearray(200 << 20); b[::4096] = b'x' * "
            "len(b[::4096]); time.sleep(30)\nps = [mp.Process(target=hold, args=(i,)) for i in range(11)]\n"
            "[p.start() for p in ps]\n[p.join() for p in ps]")
    home = str(env["users"][USERS[0]][1])  # the user's own folder: not in the sandbox either
    seen = _drive(env, USERS[0], [
        {"info": True},
        {"run": f"import os\nx = 41\nprint(os.getuid(), os.path.exists('/root'), os.path.exists({home!r}))"},
        {"run": "print(x + 1)"},
        {"run": "import time\ntime.sleep(60)", "interrupt_after": 3},
        {"run": "print('after interrupt', x)"},
        {"run": fork_bomb, "timeout": 120},
        {"run": "b = bytearray(4 << 30)"},
        {"run": "print('intact', x)"},
        {"wait_state": "paused", "timeout": 60},
        {"run": "print('woken', x)"},
        {"run": many, "timeout": 120},
        {"run": "print(globals().get('x'))"},
    ])
    info, first, second, interrupted, after, forks, big, intact, paused, woken, total, fresh = seen
    sandbox = info["info"]
    assert "gVisor" in sandbox["boundary"] and "rootless" in sandbox["boundary"], sandbox
    assert first["stdout"].split() == ["65534", "False", "False"]  # no host folder of root's or the user's
    assert second["stdout"] == "42\n"
    assert interrupted["error"].startswith("KeyboardInterrupt") and after["stdout"] == "after interrupt 41\n"
    assert "forks refused after" in forks["stdout"], forks
    assert big["error"].startswith("MemoryError"), big
    assert f"memory limit is {MEMORY_MIB} MiB" in big["stderr"]
    assert intact["stdout"] == "intact 41\n"
    assert paused["state"] == "paused" and woken["stdout"] == "woken 41\n"
    assert "resumed from pause" in woken["stderr"]
    assert f"memory limit {MEMORY_MIB} MiB exceeded" in total["error"], total
    assert fresh["stdout"] == "None\n" and "were lost" in fresh["stderr"]


def test_one_users_sandboxes_are_out_of_another_users_reach(env):
    """User a's kernel holds; user b cannot list a's state, drive a's runsc on it,
    signal a's sandbox, or reap it with ``gc``; a's kernel then still has its state."""
    a, b = USERS
    uid_a = env["users"][a][0].pw_uid
    hold = env["users"][a][1] / "hold"  # in a's home: a writes beside it
    runner = subprocess.Popen(
        ["setpriv", f"--reuid={uid_a}", f"--regid={env['users'][a][0].pw_gid}", "--clear-groups", "env", "-i",
         f"HOME={env['users'][a][1]}", "PATH=/usr/bin:/bin", env["python"], str(env["base"] / "driver.py"), KERNEL,
         json.dumps([{"run": "secret = 'only-a'"}, {"hold_until": str(hold)}, {"run": "print(secret)"}])],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        ready = Path(str(hold) + ".ready")
        deadline = time.monotonic() + 180
        while not ready.exists():
            assert runner.poll() is None and time.monotonic() < deadline, runner.stderr.read() if runner.stderr else ""
            time.sleep(0.3)
        state_a = Path(f"/tmp/sandbox-kernel-{uid_a}")
        assert state_a.stat().st_mode & 0o777 == 0o700
        (sandbox_dir,) = [d for d in state_a.iterdir() if d.name.startswith("sandbox-kernel-")]
        sentry = [int(p) for p in os.listdir("/proc") if p.isdigit() and _mentions(int(p), str(sandbox_dir))]
        assert sentry, "a's sandbox has no process"
        probe = ("import os, signal, sys, subprocess\n"
                 f"d = {str(state_a)!r}\n"
                 "try:\n    os.listdir(d); print('listed')\nexcept PermissionError: print('list refused')\n"
                 f"r = subprocess.run([{_runsc()!r}, '--root', {str(sandbox_dir / 'runsc')!r}, '--rootless', "
                 "'--ignore-cgroups', 'pause', 'x'], capture_output=True)\n"
                 "print('runsc refused' if r.returncode else 'runsc ran')\n"
                 f"for pid in {sentry!r}:\n"
                 "    try:\n        os.kill(pid, signal.SIGSTOP); print('signalled')\n"
                 "    except PermissionError: print('signal refused')\n")
        p = _as(env, b, [env["python"], "-c", probe])
        lines = p.stdout.split("\n")
        assert lines[0] == "list refused" and lines[1] == "runsc refused", p.stdout + p.stderr
        assert set(lines[2:-1]) == {"signal refused"}, p.stdout
        gc = _as(env, b, [env["python"], "-m", "sandbox_kernel", "gc"])
        assert gc.returncode == 0 and "reaped 0" in gc.stdout, gc.stdout + gc.stderr
        hold.touch()
        out, err = runner.communicate(timeout=120)
        assert runner.returncode == 0, err[-2000:]
        assert json.loads(out.strip().splitlines()[-1])[-1]["stdout"] == "only-a\n"
    finally:
        hold.touch()
        if runner.poll() is None:
            runner.kill()


def _mentions(pid: int, text: str) -> bool:
    try:
        return text in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return False


def _runsc() -> str:
    from sandbox_kernel.backends.local.runsc import find_runsc

    return find_runsc()


def test_doctor_as_an_ordinary_user_names_the_path_in_force_and_what_it_lacks(env):
    p = _as(env, USERS[0], [env["python"], "-m", "sandbox_kernel", "doctor", "--json"])
    report = json.loads(p.stdout)
    assert report["euid"] == env["users"][USERS[0]][0].pw_uid
    assert report["default_runtime"] == "gvisor"
    gvisor = next(r for r in report["runtimes"] if r["runtime"] == "gvisor")
    assert gvisor["ok"] and "rootless" in gvisor["boundary"], gvisor
    assert gvisor["idle_levels"]["checkpoint"] == "not possible: becomes a stop"
    priv = report["privilege"]
    assert priv["as"] == "user" and "cpu_cores is not enforced" in priv["lacks"]["gvisor"]
    assert "E2B and Modal need no root" in priv["clouds"]
