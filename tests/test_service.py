"""Issue 13, the sandbox service: ordinary users' kernels with the full feature set.

Root runs ``sandbox-kernel service`` (here a subprocess of the test, with its own
socket and state directory, which the kernelspec names with ``--service-socket``);
two ordinary users (``nonroot_env``) run kernels through it: cgroup limits, pause,
checkpoint and restore, each sandbox's owner uid recorded, and one user's requests
on another's sandbox refused by the peer's uid (``SO_PEERCRED``).  Real components
throughout: runsc as root, the users' processes as the users.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from nonroot_env import (
    SERVICE_ASK,
    USERS,
    as_user,
    drive,
    held,
    make_env,
    restart_service,
    running_service,
    service_log,
    service_socket,
    start_service,
)

KERNEL = "sk-service"
#: Another policy (its memory): never served from a pool made for KERNEL's.
KERNEL_OTHER = "sk-service-other"
MEMORY_MIB = 512
#: KERNEL's policy flags, which a warm pool for its kernels must be started with.
POLICY_FLAGS = ["--memory-mib", str(MEMORY_MIB), "--pids-max", "64", "--cpu-cores", "0.5", "--pause-after-s", "3",
                "--checkpoint-after-s", "8"]


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """The users' environment with a kernelspec that goes through this test's service."""
    flags = ["--prestart", "0", *POLICY_FLAGS, "--pool-socket", "", "--service-socket", str(service_socket())]
    other = [*flags, "--memory-mib", str(MEMORY_MIB - 128)]
    yield from make_env(tmp_path_factory, {KERNEL: flags, KERNEL_OTHER: other})


@pytest.fixture(scope="module")
def service(env):
    """The service, for every test of the module (a test may replace ``proc``)."""
    yield from running_service(env)


def _held(env, service, plan: list[dict], hold: Path) -> tuple[subprocess.Popen, dict]:
    return held(env, service, KERNEL, plan, hold)


def test_install_unit_writes_the_service_of_this_venv(tmp_path):
    from sandbox_kernel.backends.local.service.server import main

    unit = tmp_path / "sandbox-kernel.service"
    assert main(install_unit=str(unit)) == 0
    text = unit.read_text()
    assert f"ExecStart={Path(sys.executable).parent / 'sandbox-kernel'} service\n" in text
    assert "[Install]\nWantedBy=multi-user.target" in text
    repo_unit = Path(__file__).resolve().parents[1] / "systemd" / "sandbox-kernel.service"
    assert text.split("[Service]")[1] .replace(str(Path(sys.executable).parent), "/opt/sandbox-kernel/venv/bin") \
        == repo_unit.read_text().split("[Service]")[1]


def test_the_socket_is_open_to_every_user_and_the_state_is_roots(service):
    st = service_socket().stat()
    assert st.st_mode & 0o777 == 0o666 and st.st_uid == 0
    st = service["state"].stat()
    assert st.st_mode & 0o777 == 0o711 and st.st_uid == 0


def test_an_ordinary_users_kernel_through_the_service_has_limits_pause_and_checkpoint(env, service):
    """State across cells, interrupt, pause, checkpoint and restore with the state kept,
    then the sandbox's memory past its cgroup limit: ended, the limit named."""
    many = ("import multiprocessing as mp, time\ndef hold(_):\n    b = bytearray(200 << 20); b[::4096] = b'x' * "
            "len(b[::4096]); time.sleep(30)\nps = [mp.Process(target=hold, args=(i,)) for i in range(5)]\n"
            "[p.start() for p in ps]\n[p.join() for p in ps]")
    seen = drive(env, USERS[0], [
        {"info": True},
        {"run": "import os\nx = 41\nprint(os.getuid())"},
        {"run": "print(x + 1)"},
        {"run": "import time\ntime.sleep(60)", "interrupt_after": 3},
        {"run": "print('after interrupt', x)"},
        {"wait_state": "paused", "timeout": 60},
        {"run": "print('woken', x)"},
        {"wait_state": "checkpointed", "timeout": 120},
        {"run": "print('restored', x)"},
        {"run": "print('again', x + 1)"},
        {"run": many, "timeout": 120},
        {"run": "print(globals().get('x'))"},
    ], kernel=KERNEL)
    info, first, second, interrupted, after, paused, woken, ckpt, restored, again, total, fresh = seen
    sandbox = info["info"]
    assert "via the sandbox service" in sandbox["boundary"] and "rootless" not in sandbox["boundary"], sandbox
    assert first["stdout"] == "65534\n" and second["stdout"] == "42\n"
    assert interrupted["error"].startswith("KeyboardInterrupt") and after["stdout"] == "after interrupt 41\n"
    assert paused["state"] == "paused" and woken["stdout"] == "woken 41\n", (paused, woken, service_log(service))
    assert ckpt["state"] == "checkpointed", (ckpt, service_log(service))
    assert restored["stdout"] == "restored 41\n", (restored, service_log(service))
    assert again["stdout"] == "again 42\n"
    assert f"memory limit {MEMORY_MIB} MiB exceeded" in total["error"], (total, service_log(service))
    assert fresh["stdout"] == "None\n"
    uid_a = env["users"][USERS[0]][0].pw_uid
    assert f"made for uid {uid_a}" in service_log(service)


PROBE = """
import json, os, socket, sys
sock_path, cid, state_dir = sys.argv[1], sys.argv[2], sys.argv[3]
""" + SERVICE_ASK + """
out = {}
for op in ("pause", "resume", "checkpoint", "restore", "kill"):
    out[op] = ask({"op": op, "container_id": cid})
out["unknown"] = ask({"op": "kill", "container_id": "../../etc"})
ws = {"op": "create", "kernel_id": "b", "python": sys.executable, "policy": {"workspace": "rw"}}
out["workspace"] = ask({**ws, "policy": {"workspace": "rw", "workspace_path": "/tmp"}})  # a name, no fd
out["roots_folder"] = ask(ws, [os.open(sys.argv[6], os.O_RDONLY | os.O_DIRECTORY)])
out["o_path"] = ask(ws, [os.open(os.environ["HOME"], os.O_PATH | os.O_DIRECTORY)])
out["fd_no_workspace"] = ask({**ws, "policy": {}}, [os.open(os.environ["HOME"], os.O_RDONLY)])
out["private"] = ask({"op": "create", "kernel_id": "b", "python": sys.executable,
                      "policy": {"ro_paths": [sys.argv[4]]}})
out["own_venv"] = ask({"op": "create", "kernel_id": "b", "python": sys.argv[5], "policy": {}})
link = os.path.join(os.environ["HOME"], "python-link")  # b's own name for the shared interpreter
if not os.path.islink(link):
    os.symlink(sys.executable, link)
out["outside"] = ask({"op": "create", "kernel_id": "b", "python": link, "policy": {}})
out["steering"] = ask({"op": "create", "kernel_id": "b", "python": sys.executable,
                       "policy": {"env": [["LD_PRELOAD", "/tmp/x.so"], ["PYTHONPATH", "/tmp"]]}})
for name, path in (("state", state_dir), ("image", os.path.join(state_dir, "checkpoint")),
                   ("tag", os.path.join(state_dir, "tag.json"))):
    try:
        os.listdir(path) if name != "tag" else open(path).read()
        out[name] = "read"
    except OSError as e:
        out[name] = type(e).__name__
print(json.dumps(out))
"""


def test_another_user_cannot_drive_or_read_a_users_service_sandbox(env, service):
    """While a's kernel is checkpointed: b's pause, resume, checkpoint, restore and kill
    of a's container (whose cgroup holds the cpu and memory limits) are refused, as are
    a bad id, a workspace named without its fd or passed as root's folder or an ``O_PATH``
    fd, ``ro_paths``, an interpreter b can change or names from
    outside its environment, and ``env`` steering what the agent loads (the agent runs
    as the sandbox's root); b can read neither a's state directory nor its
    checkpoint image; ``gc`` as b leaves it alone; a's kernel then restores with its state."""
    a, b = USERS
    ua, ha = env["users"][a]
    private = ha / "private"
    private.mkdir(mode=0o700)
    os.chown(private, ua.pw_uid, ua.pw_gid)
    hold = ha / "hold"
    runner, info = _held(env, service, [{"run": "secret = 'only-a'"}, {"wait_state": "checkpointed", "timeout": 120},
                                        {"hold_until": str(hold)}, {"run": "print(secret)"}], hold)
    try:
        assert info["state"] == "checkpointed", info
        cid = info["container_id"]
        state_dir = service["state"] / cid
        tag = json.loads((state_dir / "tag.json").read_text())
        assert tag["owner_uid"] == ua.pw_uid and tag["service"], tag
        from sandbox_kernel.backends.local.cgroups import CFS_PERIOD_US, SandboxCgroup

        cgroup = SandboxCgroup.existing(cid)  # the limits root's kernels have
        assert cgroup is not None
        assert int((cgroup.paths["cpu"] / "cpu.cfs_quota_us").read_text()) == CFS_PERIOD_US // 2
        assert int((cgroup.paths["memory"] / "memory.limit_in_bytes").read_text()) == MEMORY_MIB << 20
        assert (state_dir / "checkpoint").stat().st_mode & 0o777 == 0o700
        (env["base"] / "probe.py").write_text(PROBE)
        own = env["users"][b][1] / "own-venv"
        made = as_user(env, b, ["/usr/bin/python3", "-m", "venv", "--without-pip", str(own)])
        assert made.returncode == 0, made.stderr
        roots = env["base"] / "roots-folder"  # root's 0755 folder, which b may read
        roots.mkdir(mode=0o755, exist_ok=True)
        p = as_user(env, b, [env["python"], str(env["base"] / "probe.py"), str(service_socket()), cid, str(state_dir),
                             str(private), str(own / "bin" / "python"), str(roots)])
        assert p.returncode == 0 and "GOT FDS" not in p.stdout, p.stdout + p.stderr
        out = json.loads(p.stdout.strip().splitlines()[-1])
        for op in ("pause", "resume", "checkpoint", "restore", "kill"):
            assert out[op] == {"ok": False, "reason": f"sandbox {cid} belongs to another user",
                               "refused": True}, (op, out[op])
        assert not out["unknown"]["ok"] and "no sandbox" in out["unknown"]["reason"]
        assert not out["workspace"]["ok"] and "takes the folder as one fd" in out["workspace"]["reason"], out
        assert out["roots_folder"] == {"ok": False, "reason": f"the workspace folder is owned by uid 0 (root), not by "
                                       f"you (uid {env['users'][b][0].pw_uid} ({b})): the sandbox service maps only "
                                       "a folder its user owns onto the sandbox user; choose a folder of your own, "
                                       "or run this kernel without the service (--LocalBackend.service_socket='')",
                                       "refused": True}
        assert not out["o_path"]["ok"] and "not O_PATH" in out["o_path"]["reason"], out
        assert not out["fd_no_workspace"]["ok"] and "only for a workspace folder" in out["fd_no_workspace"]["reason"]
        assert not out["private"]["ok"] and "ro_paths is not served" in out["private"]["reason"], out["private"]
        assert not out["outside"]["ok"] and "is not inside its environment" in out["outside"]["reason"], out
        assert not out["steering"]["ok"] and "LD_PRELOAD, PYTHONPATH" in out["steering"]["reason"], out
        assert not out["own_venv"]["ok"] and "environment is writable by uid" in out["own_venv"]["reason"], out
        assert out["state"] == out["image"] == out["tag"] == "PermissionError", out
        gc = as_user(env, b, [env["python"], "-m", "sandbox_kernel", "gc"])
        assert gc.returncode == 0 and "reaped 0" in gc.stdout, gc.stdout + gc.stderr
        assert state_dir.is_dir()
        hold.touch()
        stdout, err = runner.communicate(timeout=180)
        assert runner.returncode == 0, err[-2000:]
        assert json.loads(stdout.strip().splitlines()[-1])[-1]["stdout"] == "only-a\n", stdout + service_log(service)
    finally:
        hold.touch()
        if runner.poll() is None:
            runner.kill()


def test_a_proxy_that_dies_has_its_service_sandbox_reaped(env, service):
    """The proxy holds the only write end of the (root) watchdog's pipe: SIGKILL it and
    the watchdog removes the sandbox; the service forgets it."""
    ua, ha = env["users"][USERS[0]]
    hold = ha / "hold-dies"
    runner, info = _held(env, service, [{"run": "x = 1"}, {"hold_until": str(hold)}], hold)
    try:
        state_dir = service["state"] / info["container_id"]
        proxy = json.loads((state_dir / "tag.json").read_text())["proxy_pid"]
        assert Path(f"/proc/{proxy}/status").read_text().count(f"\t{ua.pw_uid}\t") >= 1  # a's process
        os.kill(proxy, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while state_dir.exists():
            assert time.monotonic() < deadline, f"{state_dir} is still there"
            time.sleep(0.5)
        deadline = time.monotonic() + 30
        while f"{state_dir.name} of uid {ua.pw_uid} was reaped" not in service_log(service):
            assert time.monotonic() < deadline, service_log(service)
            time.sleep(0.5)
    finally:
        hold.touch()
        runner.kill()
        runner.communicate()


def test_a_killed_service_takes_its_sandboxes_back_when_it_starts_again(env, service):
    """SIGKILL of the service (a crash, not a stop): the user's kernel keeps running;
    the service started again takes the sandbox back from its tag.json, and pause,
    checkpoint and restore go on through it."""
    ua, ha = env["users"][USERS[0]]
    hold = ha / "hold-crash"
    runner, info = _held(env, service, [{"run": "x = 5"}, {"hold_until": str(hold)}, {"run": "print('still', x)"},
                                        {"wait_state": "checkpointed", "timeout": 120},
                                        {"run": "print('back', x)"}], hold)
    try:
        cid = info["container_id"]
        restart_service(env, service)
        assert f"took back sandbox {cid} of uid {ua.pw_uid} (running)" in service_log(service)
        hold.touch()
        out, err = runner.communicate(timeout=240)
        assert runner.returncode == 0, err[-2000:] + service_log(service)
        seen = json.loads(out.strip().splitlines()[-1])
        assert seen[2]["stdout"] == "still 5\n" and seen[3]["state"] == "checkpointed", seen
        assert seen[4]["stdout"] == "back 5\n", (seen, service_log(service))
    finally:
        hold.touch()
        if runner.poll() is None:
            runner.kill()


def test_doctor_as_an_ordinary_user_names_the_service_and_a_user_cannot_run_one(env, service):
    p = as_user(env, USERS[0], [env["python"], "-m", "sandbox_kernel", "doctor", "--json",
                                "--service-socket", str(service_socket())])
    priv = json.loads(p.stdout)["privilege"]
    assert priv["in_force"] == "service" and priv["service"]["answers"], priv
    assert "gVisor" in priv["service"]["boundary"] and "rootless" not in priv["service"]["boundary"]
    gvisor = next(r for r in json.loads(p.stdout)["runtimes"] if r["runtime"] == "gvisor")
    # its probe started through the service: what a kernel of this user can copy there
    assert gvisor["ok"] and gvisor["copies"] == {"snapshot": "yes", "restore": "yes", "fork": "yes"}, gvisor
    p = as_user(env, USERS[1], [env["python"], "-m", "sandbox_kernel", "service", "--socket",
                                str(env["users"][USERS[1]][1] / "s.sock")])
    assert p.returncode == 1 and "run it as root" in p.stderr, p.stderr


def test_the_service_stops_and_leaves_nothing(service):
    proc = service["proc"]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 0, service_log(service)
    assert not service_socket().exists()
    left = [d.name for d in service["state"].iterdir() if d.name.startswith("sandbox-kernel-")]
    assert left == [], left


def _pool_ready(want: int, service, timeout_s: float = 120) -> dict:
    """Wait until the service's warm pool holds ``want`` ready sandboxes (its ``hello``)."""
    from sandbox_kernel.backends.local.service.client import hello

    deadline = time.monotonic() + timeout_s
    while True:
        pool = (hello(str(service_socket())) or {}).get("pool", {})
        if pool.get("ready") == want:
            return pool
        assert time.monotonic() < deadline, (pool, service_log(service))
        time.sleep(0.5)


TRY_KILL = """
import json, socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(sys.argv[1])
s.sendall(json.dumps({"protocol": 1, "op": "kill", "container_id": sys.argv[2]}).encode() + b"\\n")
print(s.makefile().readline().strip())
"""


def test_the_services_warm_pool_serves_several_users_each_their_own(env, service):
    """``service --pool-size 2`` with the kernels' policy: user a's and user b's kernels
    each take a pre-started sandbox (kernel_info says ``pooled``), owned by each alone
    (b's kill of a's is refused), with limits and state as a cold one's; a kernel of
    another policy starts cold; the pool fills again; stopping the service removes the
    pooled sandboxes nobody took."""
    assert service["proc"].poll() is not None  # the module's service was stopped by the test before
    service["proc"] = start_service(env, "--pool-size", "2", "--python", env["python"], *POLICY_FLAGS)
    try:
        assert _pool_ready(2, service)["size"] == 2
        a, b = USERS
        ua, ub = env["users"][a][0], env["users"][b][0]
        hold = env["users"][a][1] / "hold-pool"
        runner, info_a = _held(env, service, [{"run": "import os\nx = 'a'"}, {"hold_until": str(hold)},
                                              {"run": "print(os.getuid(), x)"}], hold)
        try:
            seen_b = drive(env, b, [{"run": "import os\nprint(os.getuid(), 'b')"}, {"info": True}], kernel=KERNEL)
            seen_other = drive(env, b, [{"run": "print('cold')"}, {"info": True}], kernel=KERNEL_OTHER)
            (env["base"] / "try_kill.py").write_text(TRY_KILL)
            p = as_user(env, b, [env["python"], str(env["base"] / "try_kill.py"), str(service_socket()),
                                 info_a["container_id"]])
            assert json.loads(p.stdout) == {"ok": False, "reason": f"sandbox {info_a['container_id']} belongs to "
                                            "another user", "refused": True}, p.stdout + p.stderr
            hold.touch()
            out, err = runner.communicate(timeout=180)
            assert runner.returncode == 0, err[-2000:]
            assert json.loads(out.strip().splitlines()[-1])[-1]["stdout"] == "65534 a\n"
        finally:
            hold.touch()
            if runner.poll() is None:
                runner.kill()
        info_b = seen_b[1]["info"]
        assert info_a["pooled"] and info_b["pooled"], (info_a, info_b, service_log(service))
        assert info_a["container_id"] != info_b["container_id"]
        assert seen_b[0]["stdout"] == "65534 b\n"
        assert not seen_other[1]["info"]["pooled"] and seen_other[0]["stdout"] == "cold\n"
        log = service_log(service)
        assert f"{info_a['container_id']} from the warm pool for uid {ua.pw_uid}" in log, log
        assert f"{info_b['container_id']} from the warm pool for uid {ub.pw_uid}" in log, log
        assert f"made for uid {ub.pw_uid}" in log  # the other policy's kernel
        _pool_ready(2, service)
    finally:
        service["proc"].send_signal(signal.SIGTERM)
        assert service["proc"].wait(60) == 0, service_log(service)
    left = [d.name for d in service["state"].iterdir() if d.name.startswith("sandbox-kernel-")]
    assert left == [], left


def test_the_service_reads_a_policy_as_a_client_sends_it():
    """Through JSON and back (pairs of ``env`` included), and what it refuses named."""
    from sandbox_kernel.backends.local.service.peers import Refused, policy_from_fields
    from sandbox_kernel.policy import Policy

    sent = Policy(env=(("MPLBACKEND", "Agg"),), memory_mib=1024)
    got = policy_from_fields(json.loads(json.dumps(sent.sandbox_fields())))
    assert got.env == (("MPLBACKEND", "Agg"),) and got.memory_mib == 1024
    for fields, says in (({"env": [["LD_PRELOAD", "/x.so"]]}, "LD_PRELOAD"),
                         ({"ro_paths": ["/etc"]}, "ro_paths is not served"),
                         ({"network": "allowlist", "allow_domains": ["pypi.org"]}, "network=allowlist"),
                         ({"nonsense": 1}, "unknown policy field")):
        with pytest.raises(Refused, match=says):
            policy_from_fields(fields)
