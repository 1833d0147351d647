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
import subprocess
import time
from pathlib import Path

import pytest
from nonroot_env import KERNEL, MEMORY_MIB, USERS, make_env
from nonroot_env import as_user as _as
from nonroot_env import drive as _drive


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """See :func:`nonroot_env.make_env`."""
    yield from make_env(tmp_path_factory)


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
                 "            os.execv('/bin/sleep', ['sleep', '5'])  # holds a pid, not a copy of the heap\n"
                 "        n += 1\nexcept OSError as e:\n"
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
    # the loss is told once: in the breaching cell when the sandbox ended while it ran
    # (SandboxRestarted), else in the next cell, as the watch of the memory file decides
    told_in_cell, told_next = "variables and imports are gone" in total["error"], "were lost" in fresh["stderr"]
    assert fresh["stdout"] == "None\n" and told_in_cell != told_next, (total, fresh)


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
        # the kernel's sandbox, and any spare sandbox a's spare pools keep (as much a's)
        sandbox_dirs = [d for d in state_a.iterdir() if d.name.startswith("sandbox-kernel-")]
        assert sandbox_dirs, "a's kernel has no sandbox"
        sentry = [int(p) for p in os.listdir("/proc")
                  if p.isdigit() and any(_mentions(int(p), str(d)) for d in sandbox_dirs)]
        assert sentry, "a's sandboxes have no process"
        probe = ("import os, signal, sys, subprocess\n"
                 f"d = {str(state_a)!r}\n"
                 "try:\n    os.listdir(d); print('listed')\nexcept PermissionError: print('list refused')\n"
                 f"for root in {[str(d / 'runsc') for d in sandbox_dirs]!r}:\n"
                 f"    r = subprocess.run([{_runsc()!r}, '--root', root, '--rootless', "
                 "'--ignore-cgroups', 'pause', 'x'], capture_output=True)\n"
                 "    print('runsc refused' if r.returncode else 'runsc ran')\n"
                 f"for pid in {sentry!r}:\n"
                 "    try:\n        os.kill(pid, signal.SIGSTOP); print('signalled')\n"
                 "    except PermissionError: print('signal refused')\n"
                 "    except ProcessLookupError: print('gone')\n")  # a spare's process, ended meanwhile
        p = _as(env, b, [env["python"], "-c", probe])
        lines = p.stdout.split("\n")[:-1]
        n = len(sandbox_dirs)
        assert lines[0] == "list refused" and lines[1:1 + n] == ["runsc refused"] * n, p.stdout + p.stderr
        assert "signal refused" in lines[1 + n:] and set(lines[1 + n:]) <= {"signal refused", "gone"}, p.stdout
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


def test_the_same_kernelspec_serves_root_and_an_ordinary_user(env):
    """The kernelspec root installed with --sys-prefix: an ordinary user's kernel runs
    rootless (above); root's, from the same kernelspec, has the full boundary."""
    plan = json.dumps([{"info": True}, {"run": "x = 41"}, {"run": "print(x + 1)"}])
    root = subprocess.run([env["python"], str(env["base"] / "driver.py"), KERNEL, plan], capture_output=True,
                          text=True, timeout=400, env={"PATH": "/usr/bin:/bin", "HOME": str(env["base"])})
    assert root.returncode == 0, root.stderr[-3000:]
    info, _, printed = json.loads(root.stdout.strip().splitlines()[-1])
    assert "gVisor" in info["info"]["boundary"] and "rootless" not in info["info"]["boundary"], info
    assert printed["stdout"] == "42\n"
    user = _drive(env, USERS[1], [{"info": True}, {"run": "x = 41"}, {"run": "print(x + 1)"}])
    assert "rootless" in user[0]["info"]["boundary"] and user[2]["stdout"] == "42\n"


def test_doctor_as_an_ordinary_user_names_the_path_in_force_and_what_it_lacks(env):
    nothing = str(env["base"] / "no-service.sock")  # as on a host without the service
    p = _as(env, USERS[0], [env["python"], "-m", "sandbox_kernel", "doctor", "--json", "--service-socket", nothing])
    report = json.loads(p.stdout)
    assert report["euid"] == env["users"][USERS[0]][0].pw_uid
    assert report["default_runtime"] == "gvisor"
    gvisor = next(r for r in report["runtimes"] if r["runtime"] == "gvisor")
    assert gvisor["ok"] and "rootless" in gvisor["boundary"], gvisor
    assert gvisor["idle_levels"]["checkpoint"] == "not possible: becomes a stop"
    priv = report["privilege"]
    assert priv["as"] == "user" and "cpu_cores is not enforced" in priv["lacks"]["gvisor"]
    assert priv["in_force"] == "rootless gVisor" and not priv["service"]["answers"], priv
    assert "E2B and Modal need no root" in priv["clouds"]
