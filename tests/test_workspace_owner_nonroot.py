"""Issue 33 as an ordinary user: a cell reads and writes the user's own folder as they do.

A created user (``nonroot_env``) runs a kernel through ``jupyter_client`` from a 0755
folder of theirs holding a 0600 file (the kernel's working directory, as Jupyter Server
sets it to the notebook's folder), on bubblewrap, whose user namespace maps the sandbox
user onto the user who runs it.  With ``rw`` the cell reads the 0600 file and what it
writes belongs to that user on the host; with ``ro`` it reads and writes nothing.  Rootless
gVisor cannot map it so (``docs/decisions.md``): there the cell's ``PermissionError`` is
followed by one line saying what to choose instead.
"""

from __future__ import annotations

import json
import os

import pytest
from nonroot_env import USERS, as_user, make_env

SECRET = "the user's own\n"
KERNELS = {
    f"sk-owner-{runtime}-{mode}": ["--runtime", runtime, "--workspace", mode, "--prestart", "0", "--pool-socket", "",
                                   "--service-socket", "", "--checkpoint-after-s", "0"]
    for runtime in ("bubblewrap", "gvisor") for mode in ("ro", "rw")
}


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """See :func:`nonroot_env.make_env`."""
    yield from make_env(tmp_path_factory, kernelspecs=KERNELS)


def _folder(env, name: str):
    u, home = env["users"][USERS[0]]
    d = home / name
    d.mkdir()
    (d / "secret.txt").write_text(SECRET)
    os.chmod(d / "secret.txt", 0o600)
    for p in (d, d / "secret.txt"):
        os.chown(p, u.pw_uid, u.pw_gid)
    os.chmod(d, 0o755)
    return u, d


def _run(env, kernel: str, cwd, code: str) -> dict:
    p = as_user(env, USERS[0], [env["python"], str(env["base"] / "driver.py"), kernel, json.dumps([{"run": code}])],
                cwd=str(cwd))
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])[0]


CELL = ("import os, errno\nprint(os.getuid(), open('secret.txt').read().strip())\n"
        "try:\n    open('made.txt', 'w').write('x'); os.mkdir('made_dir'); print('written')\n"
        "except OSError as e:\n    print(errno.errorcode[e.errno])")


def test_bubblewrap_rw_as_the_user(env):
    u, d = _folder(env, "bw-rw")
    seen = _run(env, "sk-owner-bubblewrap-rw", d, CELL)
    assert seen["stdout"].splitlines() == ["65534 " + SECRET.strip(), "written"], seen
    for rel in ("made.txt", "made_dir"):
        st = os.lstat(d / rel)
        assert (st.st_uid, st.st_gid) == (u.pw_uid, u.pw_gid), rel
    assert os.stat(d).st_mode & 0o777 == 0o755


def test_bubblewrap_ro_reads_as_the_user_and_writes_nothing(env):
    _, d = _folder(env, "bw-ro")
    seen = _run(env, "sk-owner-bubblewrap-ro", d, CELL)
    assert seen["stdout"].splitlines() == ["65534 " + SECRET.strip(), "EROFS"], seen
    assert sorted(p.name for p in d.iterdir()) == ["secret.txt"]


@pytest.mark.parametrize("mode", ["rw", "ro"])
def test_rootless_gvisor_says_what_to_do_instead(env, mode):
    """Rootless runsc shows the user's files as uid 0's inside and cannot be id-mapped
    (docs/decisions.md): the cell's PermissionError is kept and one line says why and
    what to choose instead; the host folder is unchanged."""
    _, d = _folder(env, f"gv-{mode}")
    seen = _run(env, f"sk-owner-gvisor-{mode}", d, "open('secret.txt').read()")
    assert seen["error"] == "PermissionError: [Errno 13] Permission denied: 'secret.txt'", seen
    assert seen["stderr"].count("\n") == 1 and "rootless gVisor shows your files" in seen["stderr"], seen
    assert "--LocalBackend.runtime=bubblewrap" in seen["stderr"]
    assert sorted(p.name for p in d.iterdir()) == ["secret.txt"]
