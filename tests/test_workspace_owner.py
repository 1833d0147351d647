"""Issue 33: a cell reads and writes the workspace as the user who runs the kernel does.

The folder is an ordinary one (0755, the kernel's user's, with a 0600 file of theirs),
never world-writable.  As root (this module; the ordinary user's side is in
``test_workspace_owner_nonroot.py``), on gVisor and bubblewrap: with ``rw`` a cell
reads the 0600 file, writes files and folders that belong on the host to the kernel's
user, and stays the sandbox user (uid 65534) everywhere else; a file of another owner
keeps its "other" permissions (not written, not re-moded); no set-id bit can be made
(a root-owned set-user-id file in the folder would be root for any host user); with
``ro`` the 0600 file is read and nothing is written.  The id-mapped mount never
appears in the host's mount table.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

SECRET = "only the owner reads this\n"


def project(tmp_path: Path) -> Path:
    """A 0755 folder of the kernel's user (root here) below pytest's 0700 folder, as
    ``/root/project`` would be, with a 0600 file, a 0644 file of another user and a
    file of ``nobody``'s."""
    d = tmp_path / "project"
    d.mkdir()
    os.chmod(d, 0o755)
    (d / "secret.txt").write_text(SECRET)
    os.chmod(d / "secret.txt", 0o600)
    for name, uid in (("others.txt", 1234), ("nobodys.txt", 65534)):
        (d / name).write_text("not yours\n")
        os.chmod(d / name, 0o644)
        os.chown(d / name, uid, uid)
    return d


def _mounts() -> str:
    return Path("/proc/self/mountinfo").read_text()


CELL_RW = r"""
import os, errno
print("uid", os.getuid(), os.getgid())
print("read", open("secret.txt").read().strip())
open("made.txt", "w").write("from the sandbox")
os.mkdir("made_dir"); open("made_dir/inner.txt", "w").write("x")
for name in ("others.txt", "nobodys.txt"):
    try:
        open(name, "a").write("changed")
        print(name, "written")
    except OSError as e:
        print(name, errno.errorcode[e.errno])
    try:
        os.chmod(name, 0o666)
    except OSError:
        pass
for mode in (0o4755, 0o2755):
    try:
        os.chmod("made.txt", mode)
        print(oct(mode), "set")
    except OSError as e:
        print(oct(mode), errno.errorcode[e.errno])
try:
    os.close(os.open("setid.bin", os.O_CREAT | os.O_WRONLY, 0o4755))
    print("created", oct(os.stat("setid.bin").st_mode))
except OSError as e:
    print("create", errno.errorcode[e.errno])
try:  # root's 0710 folder of private keys, bound read-only with /etc/ssl: not the mount's
    print(os.stat("/etc/ssl/private").st_uid, os.listdir("/etc/ssl/private"))
except OSError as e:
    print("/etc/ssl/private", errno.errorcode[e.errno])
""".strip()


def test_rw_reads_and_writes_as_the_kernels_user(start_kernel, install_kernelspec, runtime, tmp_path):
    d = project(tmp_path)
    k = start_kernel(install_kernelspec(runtime, "ws-owner-rw", workspace="rw", workspace_path=str(d)))
    r = k.execute(CELL_RW)
    assert r.status == "ok", r.reply
    lines = r.stdout.splitlines()
    assert lines[:2] == ["uid 65534 65534", "read " + SECRET.strip()], r.stdout
    assert lines[2:6] == ["others.txt EACCES", "nobodys.txt EACCES", "0o4755 EPERM", "0o2755 EPERM"], r.stdout
    # gVisor drops a set-id bit given at creation; the host kernel would keep it: refused there
    assert lines[6] in ("created 0o100755", "create EPERM"), r.stdout
    assert lines[7] == "/etc/ssl/private EACCES", r.stdout  # the sandbox user stays itself elsewhere
    me = (os.geteuid(), os.getegid())
    for rel in ("made.txt", "made_dir", "made_dir/inner.txt"):
        st = os.lstat(d / rel)
        assert (st.st_uid, st.st_gid) == me, (rel, st.st_uid, st.st_gid)
        assert not st.st_mode & (stat.S_ISUID | stat.S_ISGID), rel
    assert (d / "made.txt").read_text() == "from the sandbox"
    assert not any(p.lstat().st_mode & (stat.S_ISUID | stat.S_ISGID) for p in d.rglob("*"))
    for name, uid in (("others.txt", 1234), ("nobodys.txt", 65534)):
        st = os.lstat(d / name)
        assert (d / name).read_text() == "not yours\n" and (st.st_uid, st.st_mode & 0o7777) == (uid, 0o644)
    assert os.stat(d).st_mode & 0o777 == 0o755 and os.stat(d / "secret.txt").st_mode & 0o777 == 0o600
    assert str(d) not in _mounts()  # the id-mapped clone lives in the sandbox's namespace only


def test_ro_reads_a_0600_file_and_writes_nothing(start_kernel, install_kernelspec, runtime, tmp_path):
    d = project(tmp_path)
    k = start_kernel(install_kernelspec(runtime, "ws-owner-ro", workspace="ro", workspace_path=str(d)))
    r = k.execute("import os\nprint(open('secret.txt').read().strip())\n"
                  "try:\n    open('made.txt', 'w')\nexcept OSError as e:\n    print(e.errno)")
    assert r.status == "ok" and r.stdout.splitlines() == [SECRET.strip(), "30"], r.reply  # EROFS
    assert sorted(p.name for p in d.iterdir()) == ["nobodys.txt", "others.txt", "secret.txt"]


def test_gvisor_restore_maps_the_folder_again(start_kernel, install_kernelspec, tmp_path):
    """After an idle checkpoint, ``runsc restore`` makes the id-mapped clone again (from the
    sandbox's record): the restored cell still reads the 0600 file and writes as the user."""
    d = project(tmp_path)
    k = start_kernel(install_kernelspec("gvisor", "ws-owner-idle", workspace="rw", workspace_path=str(d),
                                        pause_after_s=1.0, checkpoint_after_s=2.0))
    assert k.execute("x = 41").status == "ok"
    k.wait_state("checkpointed", timeout=120)
    r = k.execute("x += 1\nopen('after.txt', 'w').write(open('secret.txt').read())\nx")
    assert r.status == "ok" and r.result_text == "42", (r.reply["content"], r.stderr)
    assert "restored from a checkpoint" in r.stderr
    st = os.lstat(d / "after.txt")
    assert (st.st_uid, st.st_gid) == (os.geteuid(), os.getegid()) and (d / "after.txt").read_text() == SECRET
    assert str(d) not in _mounts()


def test_the_rootless_hint_is_for_the_workspace_on_rootless_gvisor_only():
    from sandbox_kernel import workspace

    rootless = "gVisor user-space kernel (runsc 0.0~20240729.0, systrap platform, rootless)"
    denied = "[Errno 13] Permission denied: '{}'"
    hint = workspace.error_hint
    assert hint("rw", "", rootless, "PermissionError", denied.format("made.txt")) == workspace.ROOTLESS_HINT
    assert hint("ro", "", rootless, "PermissionError", denied.format("/home/sandbox/work/a/b.csv"))
    assert hint("rw", "", rootless, "PermissionError", denied.format("/etc/ssl/private")) is None  # not the folder
    assert hint("none", "", rootless, "PermissionError", denied.format("made.txt")) is None
    assert hint("rw", "", rootless.replace(", rootless", ""), "PermissionError", denied.format("x")) is None
    assert hint("rw", "", "shared Linux kernel: namespaces + seccomp (bubblewrap)", "PermissionError",
                denied.format("x")) is None
    assert hint("rw", "", rootless, "OSError", "[Errno 30] Read-only file system: 'x'") is None


def test_a_folder_the_host_cannot_id_map_is_bound_as_it_was(start_kernel, install_kernelspec, runtime, tmp_path):
    """A filesystem without id-mapped mounts (ramfs here; NFS elsewhere) is bound as before
    issue 33 (its files keep their owner inside, so a world-writable folder is written as
    uid 65534), never refused and never half-mapped."""
    import subprocess

    d = tmp_path / "ramfs"
    d.mkdir()
    subprocess.run(["mount", "-t", "ramfs", "-o", "mode=0777", "sk-test-ramfs", str(d)], check=True)
    try:
        k = start_kernel(install_kernelspec(runtime, "ws-owner-ramfs", workspace="rw", workspace_path=str(d)))
        r = k.execute("open('made.txt', 'w').write('x')")
        assert r.status == "ok", r.reply
        assert os.stat(d / "made.txt").st_uid == 65534  # not mapped: the sandbox user's, as before
        k.shutdown()
    finally:
        subprocess.run(["umount", "-l", str(d)], check=False)
