"""Issue 33 through the sandbox service: an ordinary user's own folder on gVisor, mapped by root.

Root runs ``sandbox-kernel service`` (as in ``test_service.py``); a created user runs a
kernel through it from a 0755 folder of theirs (the kernel's working directory) holding
a 0600 file of theirs, a 0600 file of the other created user's and one of ``nobody``'s.
The user's proxy opens the folder and passes the fd; the service maps its owner onto the
sandbox user through an id-mapped clone made from that fd.  With ``rw`` the cell reads
the 0600 file, what it writes is the user's on the host, the other owners' files are
read neither by the cell nor through the files comm (the agent, the sandbox's root,
reads them), no set-id mode is made, ``.git`` stays read-only, and after the idle
checkpoint the restored sandbox maps the same folder again.  With ``ro`` nothing is
written.  A folder of another user's is refused by the service, naming its owner.
A service started again maps the folder the restore passes again, if it is the same
folder; another one at its path is refused (the kernel then starts afresh and tells
the cell).
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from nonroot_env import (
    USERS,
    as_user,
    held,
    make_env,
    restart_service,
    running_service,
    service_log,
    service_socket,
)

SECRET = "the user's own\n"
KERNELS = {
    f"sk-svc-ws-{mode}": ["--prestart", "0", "--pool-socket", "", "--service-socket", str(service_socket()),
                          "--workspace", mode, "--pause-after-s", "2", "--checkpoint-after-s", "5"]
    for mode in ("ro", "rw")
}


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """See :func:`nonroot_env.make_env`."""
    yield from make_env(tmp_path_factory, kernelspecs=KERNELS)


@pytest.fixture(scope="module")
def service(env):
    yield from running_service(env)


def _folder(env, name: str, owner: str = USERS[0]) -> Path:
    """A 0755 folder of ``owner``'s with their 0600 ``secret.txt``, a 0600 file of the other
    user's and one of ``nobody``'s, and a ``.git`` of theirs."""
    u, home = env["users"][owner]
    other = env["users"][USERS[1] if owner == USERS[0] else USERS[0]][0]
    d = home / name
    d.mkdir()
    (d / ".git").mkdir()
    (d / ".git" / "config").write_text("[core]\n")
    (d / "secret.txt").write_text(SECRET)
    for p in (d, d / ".git", d / ".git" / "config", d / "secret.txt"):
        os.chown(p, u.pw_uid, u.pw_gid)
    for name_, uid in (("others.txt", other.pw_uid), ("nobodys.txt", 65534)):
        (d / name_).write_text("not yours\n")
        os.chown(d / name_, uid, uid)
        os.chmod(d / name_, 0o600)
    os.chmod(d / "secret.txt", 0o600)
    os.chmod(d, 0o755)
    return d


def _run(env, kernel: str, cwd: Path, plan: list[dict], user: str = USERS[0]) -> list[dict]:
    p = as_user(env, user, [env["python"], str(env["base"] / "driver.py"), kernel, json.dumps(plan)], cwd=str(cwd))
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


CELL_RW = r"""
import os, errno
print(os.getuid(), open("secret.txt").read().strip())
open("made.txt", "w").write("from the sandbox")
os.mkdir("made_dir"); open("made_dir/inner.txt", "w").write("x")
for name in ("others.txt", "nobodys.txt"):
    for how in ("r", "a"):
        try:
            open(name, how).close()
            print(name, how, "opened")
        except OSError as e:
            print(name, how, errno.errorcode[e.errno])
for mode in (0o4755, 0o2755):
    try:
        os.chmod("made.txt", mode)
        print(oct(mode), "set")
    except OSError as e:
        print(oct(mode), errno.errorcode[e.errno])
for path in ("/etc/ssl/private", ".git/post-commit"):
    try:
        open(path, "w").close() if path.startswith(".git") else os.listdir(path)
        print(path, "reached")
    except OSError as e:
        print(path, errno.errorcode[e.errno])
""".strip()


def test_rw_through_the_service_is_the_users_own_folder_and_survives_a_checkpoint(env, service):
    u, _ = env["users"][USERS[0]]
    d = _folder(env, "svc-rw")
    seen = _run(env, "sk-svc-ws-rw", d, [
        {"run": CELL_RW},
        {"download": "secret.txt"}, {"download": "others.txt"}, {"download": "nobodys.txt"},
        {"info": True},
        {"wait_state": "checkpointed", "timeout": 120},
        {"run": "open('after.txt', 'w').write(open('secret.txt').read())\nprint(open('made.txt').read())"},
    ])
    cell, mine, others, nobodys, info, ckpt, restored = seen
    assert cell["status"] == "ok", (cell, service_log(service))
    assert cell["stdout"].splitlines() == [
        "65534 " + SECRET.strip(),
        "others.txt r EACCES", "others.txt a EACCES", "nobodys.txt r EACCES", "nobodys.txt a EACCES",
        "0o4755 EPERM", "0o2755 EPERM", "/etc/ssl/private EACCES", ".git/post-commit EROFS"], cell
    assert mine == {"downloaded": SECRET}, mine
    for got in (others, nobodys):  # the agent (the sandbox's root) reads them no further than their modes
        assert "downloaded" not in got and got["error"].startswith("PermissionError"), got
    assert "via the sandbox service" in info["info"]["boundary"], info
    assert ckpt["state"] == "checkpointed", (ckpt, service_log(service))
    assert restored["stdout"] == "from the sandbox\n" and "restored from a checkpoint" in restored["stderr"], \
        (restored, service_log(service))
    for rel in ("made.txt", "made_dir", "made_dir/inner.txt", "after.txt"):
        st = os.lstat(d / rel)
        assert (st.st_uid, st.st_gid) == (u.pw_uid, u.pw_gid), (rel, st.st_uid, st.st_gid)
    assert (d / "after.txt").read_text() == SECRET
    assert not any(p.lstat().st_mode & (stat.S_ISUID | stat.S_ISGID) for p in d.rglob("*"))
    for name in ("others.txt", "nobodys.txt"):
        assert (d / name).read_text() == "not yours\n" and os.stat(d / name).st_mode & 0o7777 == 0o600
    assert sorted(p.name for p in (d / ".git").iterdir()) == ["config"]
    assert str(d) not in Path("/proc/self/mountinfo").read_text()
    assert f"made for uid {u.pw_uid}" in service_log(service)


def test_ro_through_the_service_reads_a_0600_file_and_writes_nothing(env, service):
    d = _folder(env, "svc-ro")
    seen = _run(env, "sk-svc-ws-ro", d, [{"run": "import errno, os\nprint(open('secret.txt').read().strip())\n"
                                                 "try:\n    open('made.txt', 'w')\n"
                                                 "except OSError as e:\n    print(errno.errorcode[e.errno])"}])
    assert seen[0]["stdout"].splitlines() == [SECRET.strip(), "EROFS"], (seen, service_log(service))
    assert sorted(p.name for p in d.iterdir()) == [".git", "nobodys.txt", "others.txt", "secret.txt"]


def test_a_folder_of_another_user_is_refused_by_the_service(env, service):
    """User a runs the kernel in user b's 0755 folder (a may read it): the service refuses
    the fd, naming the owner and the rule; nothing is made, the folder is unchanged."""
    ub, _ = env["users"][USERS[1]]
    d = _folder(env, "svc-not-a", owner=USERS[1])
    before = sorted(p.name for p in d.iterdir())
    seen = _run(env, "sk-svc-ws-rw", d, [{"info": True}, {"run": "print('ran')"}])
    said = json.dumps(seen)
    assert f"the workspace folder is owned by uid {ub.pw_uid} ({USERS[1]})" in said, said
    assert "maps only a folder its user owns" in said, said
    assert "ran" not in seen[1].get("stdout", ""), seen
    assert sorted(p.name for p in d.iterdir()) == before
    left = [p.name for p in service["state"].iterdir() if p.name.startswith("sandbox-kernel-")]
    assert left == [], left


def _across_a_restart(env, service, name: str, plan: list[dict], state: str, meanwhile=None) -> tuple[Path, list]:
    """Run ``plan`` (with a ``hold_until`` step) as user a in a new folder ``name``; at the
    hold, kill the service and start it again (it takes the sandbox back in ``state``),
    call ``meanwhile(folder)``, go on; return the folder and what the driver saw."""
    ua, ha = env["users"][USERS[0]]
    d = _folder(env, name)
    hold = ha / f"hold-{name}"
    plan = [step if "hold_until" not in step else {"hold_until": str(hold)} for step in plan]
    runner, info = held(env, service, "sk-svc-ws-rw", plan, hold, cwd=d)
    try:
        assert info["state"] == state, info
        restart_service(env, service)
        assert f"took back sandbox {info['container_id']} of uid {ua.pw_uid} ({state})" in service_log(service)
        if meanwhile is not None:
            meanwhile(d)
        hold.touch()
        out, err = runner.communicate(timeout=180)
        assert runner.returncode == 0, err[-2000:]
        return d, json.loads(out.strip().splitlines()[-1])
    finally:
        hold.touch()
        if runner.poll() is None:
            runner.kill()


def test_a_service_started_again_maps_the_folder_its_restore_passes_again(env, service):
    """Killed and started again, the service no longer holds the folder's fd of the
    ``create``; it takes the sandbox back running, checkpoints it when idle, and restores
    it with the fd the proxy passes with the restore (the same folder: its device and
    inode recorded): state kept, the folder still the user's."""
    ua, _ = env["users"][USERS[0]]
    d, seen = _across_a_restart(env, service, "svc-restart", [
        {"run": "x = 1"}, {"hold_until": ""}, {"wait_state": "checkpointed", "timeout": 120},
        {"run": "open('later.txt', 'w').write(open('secret.txt').read())\nprint(x)"}], "running")
    assert seen[2]["state"] == "checkpointed", (seen, service_log(service))
    assert seen[3]["stdout"] == "1\n" and "restored from a checkpoint" in seen[3]["stderr"], \
        (seen, service_log(service))
    st = os.stat(d / "later.txt")
    assert (st.st_uid, st.st_gid) == (ua.pw_uid, ua.pw_gid) and (d / "later.txt").read_text() == SECRET


def test_a_folder_replaced_since_the_create_is_not_mapped_at_restore(env, service):
    """The same, but while the sandbox is checkpointed the user's folder is moved away and
    another made at its path: the service refuses the restore (not the sandbox's folder),
    saying so; the kernel starts afresh in the new folder and tells the cell its state
    was lost."""
    ua, ha = env["users"][USERS[0]]

    def replace(d: Path) -> None:
        d.rename(ha / "svc-replaced-old")
        _folder(env, "svc-replaced")

    d, seen = _across_a_restart(env, service, "svc-replaced", [
        {"run": "x = 1"}, {"wait_state": "checkpointed", "timeout": 120}, {"hold_until": ""},
        {"run": "open('fresh.txt', 'w').write('y')\nprint(globals().get('x'))"}], "checkpointed", replace)
    cell = seen[-1]
    assert cell["stdout"] == "None\n", (cell, service_log(service))
    assert "could not be brought back" in cell["stderr"], cell
    assert "is not the one the sandbox was made with" in cell["stderr"], cell
    assert os.stat(d / "fresh.txt").st_uid == ua.pw_uid  # the fresh sandbox maps the new folder
    assert not (ha / "svc-replaced-old" / "fresh.txt").exists()


def test_a_restore_maps_the_folder_of_the_create_even_moved(env, service):
    """The service maps the folder it was given, never a path: the user's folder moved
    while the sandbox is checkpointed (its path now names nothing), the restore maps the
    same folder again from the kept fd, with the state; what the cell writes lands in it."""
    ua, ha = env["users"][USERS[0]]
    d = _folder(env, "svc-moved")
    hold = ha / "hold-svc-moved"
    plan = [{"run": "x = 1"}, {"wait_state": "checkpointed", "timeout": 120}, {"hold_until": str(hold)},
            {"run": "open('after-move.txt', 'w').write('y')\nprint(x)"}]
    runner, info = held(env, service, "sk-svc-ws-rw", plan, hold, cwd=d)
    try:
        assert info["state"] == "checkpointed", info
        d.rename(ha / "svc-moved-away")
        hold.touch()
        out, err = runner.communicate(timeout=180)
        assert runner.returncode == 0, err[-2000:]
        cell = json.loads(out.strip().splitlines()[-1])[-1]
        assert cell["stdout"] == "1\n" and "restored from a checkpoint" in cell["stderr"], (cell, service_log(service))
        assert os.stat(ha / "svc-moved-away" / "after-move.txt").st_uid == ua.pw_uid
        assert not d.exists()
    finally:
        hold.touch()
        if runner.poll() is None:
            runner.kill()


def test_a_folder_the_host_cannot_id_map_is_refused_not_bound(env, service):
    """A folder of the user's on a filesystem without id-mapped mounts (ramfs here, NFS
    elsewhere): where root's own kernels bind it as it is, the service refuses it, saying
    why; nothing is made and the folder is unchanged."""
    import subprocess

    u, home = env["users"][USERS[0]]
    d = home / "svc-ramfs"
    d.mkdir()
    subprocess.run(["mount", "-t", "ramfs", "-o", "mode=0755", "sk-test-svc-ramfs", str(d)], check=True)
    try:
        os.chown(d, u.pw_uid, u.pw_gid)
        seen = _run(env, "sk-svc-ws-rw", d, [{"info": True}, {"run": "open('made.txt', 'w').write('x')"}])
        said = json.dumps(seen)
        assert "the workspace folder cannot be id-mapped here" in said, said
        assert "binds a user's folder only through an id-mapped mount" in said, said
        assert list(d.iterdir()) == []
    finally:
        subprocess.run(["umount", "-l", str(d)], check=False)
    left = [p.name for p in service["state"].iterdir() if p.name.startswith("sandbox-kernel-")]
    assert left == [], left
