"""Isolation probes from inside a cell, on both local runtimes, plus lifecycle hygiene.

Everything a probe does runs inside the sandbox.  The host side only plants
secrets (a file under the host's ``/root``, a file in the checkout, a variable
in the proxy's environment), starts a TCP listener on its own 127.0.0.1, and
inspects its own process table, mount table and the state directory after
shutdown.  The frontend's signing key never enters a cell: the probe sends
back its findings and the host searches them, or compares hashes.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import socket
import sys
import tempfile
import time
from pathlib import Path

import pytest
from kernels import Kernel, kernel_name_for
from sandbox_kernel.backends.local.layout import state_base

CHECKOUT = Path(__file__).resolve().parents[2]
SECRET_ENV = "SANDBOX_TEST_SECRET"


@pytest.fixture(scope="module")
def planted():
    """Secrets on the host: env var in the proxy's environment, files in /root and the checkout."""
    token = "planted-" + secrets.token_hex(16)
    old = os.environ.get(SECRET_ENV)
    os.environ[SECRET_ENV] = token
    dirs = []
    files = []
    for parent in (Path("/root"), CHECKOUT):
        d = Path(tempfile.mkdtemp(prefix=".sandbox-isolation-", dir=parent))
        f = d / "secret.txt"
        f.write_text(token + "\n")
        dirs.append(d)
        files.append(str(f))
    yield {"token": token, "files": files}
    for d in dirs:
        shutil.rmtree(d, ignore_errors=True)
    if old is None:
        os.environ.pop(SECRET_ENV, None)
    else:
        os.environ[SECRET_ENV] = old


@pytest.fixture(scope="module", params=("gvisor", "bubblewrap"))
def sk(request, kernelspec_prefix, planted):
    """One sandboxed kernel per runtime, started after the secrets were planted."""
    k = Kernel(kernel_name_for(request.param))
    k.runtime = request.param
    yield k
    k.shutdown()


def probe(k: Kernel, code: str):
    """Run ``code`` (which must print one JSON line last) inside the sandbox; return it."""
    r = k.execute(code, timeout=120)
    assert r.status == "ok", (r.reply["content"], r.stderr)
    return json.loads(r.stdout.strip().splitlines()[-1])


def signing_key(k: Kernel) -> str:
    with open(k.km.connection_file) as f:
        return json.load(f)["key"]


def sandbox_info(k: Kernel) -> dict:
    return k.kc.kernel_info(reply=True, timeout=60)["content"]["sandbox"]


# ---------------------------------------------------------------------------
# Files
# ---------------------------------------------------------------------------


def test_host_root_and_homes_absent(sk, planted):
    pyenv_top = "/root/.pyenv" if sys.base_prefix.startswith("/root/.pyenv") else None
    out = probe(sk, f"""
import os, json
files = {planted['files']!r}
res = {{"root": sorted(os.listdir('/root')) if os.path.isdir('/root') else None,
       "home": sorted(os.listdir('/home')),
       "planted_exists": [os.path.exists(f) for f in files],
       "planted_dirs": [os.path.exists(os.path.dirname(f)) for f in files],
       "checkout": os.path.exists({str(CHECKOUT)!r}),
       "checkout_listing": sorted(os.listdir({str(CHECKOUT)!r})) if os.path.isdir({str(CHECKOUT)!r}) else None}}
print(json.dumps(res))
""")
    # /root holds only the read-only Python env (bound at its own path), if the env lives there.
    assert out["root"] in (None, [], [".pyenv"] if pyenv_top else [])
    assert out["home"] == ["sandbox"]
    assert out["planted_exists"] == [False, False]
    assert out["planted_dirs"] == [False, False]
    # The checkout's directory exists only as the parent of the venv mount point.
    assert out["checkout_listing"] in (None, [], [".venv"])


def test_planted_secret_not_readable_anywhere(sk, planted):
    token_hash = hashlib.sha256(planted["token"].encode()).hexdigest()
    out = probe(sk, f"""
import os, json, hashlib
n, want = {len(planted['token'])}, {token_hash!r}
found = []
import sys
skip = {sys.prefix, sys.base_prefix}  # the host's Python env, bound read-only: not where a plant goes
def scan(path):
    for root, dirs, files in os.walk(path):
        dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(root, d))
                   and os.path.join(root, d) not in skip]
        for f in files:
            p = os.path.join(root, f)
            try:
                data = open(p, 'rb').read(4 << 20)
            except OSError:
                continue
            i = data.find(b'planted-')
            while i >= 0:
                if hashlib.sha256(data[i:i + n]).hexdigest() == want:
                    found.append(p)
                    break
                i = data.find(b'planted-', i + 1)
for top in ('/root', '/home', '/tmp', '/etc', '/opt', '/run', '/var', '/mnt', '/srv', '/work'):
    if os.path.isdir(top):
        scan(top)
print(json.dumps(found))
""")
    # The probe's own source (IPython history, the cell file) holds only the hash.
    assert out == []


def test_etc_shadow_absent_or_unreadable(sk):
    out = probe(sk, """
import os, json
try:
    open('/etc/shadow').read(); r = 'readable'
except FileNotFoundError:
    r = 'absent'
except PermissionError:
    r = 'denied'
print(json.dumps([r, os.getuid(), sorted(os.listdir('/etc'))]))
""")
    assert out[0] in ("absent", "denied")
    assert out[1] != 0
    assert "shadow" not in out[2] and "ssh" not in out[2] and "gshadow" not in out[2]


def test_python_dirs_are_read_only(sk):
    out = probe(sk, """
import os, sys, json, site, sysconfig
dirs = {sys.prefix, sys.base_prefix, sysconfig.get_paths()['purelib'], '/usr', '/usr/lib',
        os.path.dirname(os.__file__), '/opt/sandbox-kernel', '/etc', '/'}
res = {}
for d in sorted(dirs):
    p = os.path.join(d, '.sandbox-write-probe')
    try:
        with open(p, 'w') as f:
            f.write('x')
        res[d] = 'written'
        os.unlink(p)
    except OSError as e:
        res[d] = type(e).__name__
try:
    import numpy
    numpy.__file__ and open(numpy.__file__, 'a').close()
    res['numpy/__init__.py'] = 'written'
except OSError as e:
    res['numpy/__init__.py'] = type(e).__name__
print(json.dumps(res))
""")
    assert out and all(v != "written" for v in out.values()), out


# ---------------------------------------------------------------------------
# Environment, processes, signing key
# ---------------------------------------------------------------------------


def test_planted_env_var_absent_inside(sk, planted):
    token = planted["token"]
    out = probe(sk, f"""
import os, json, glob
res = {{"environ": {SECRET_ENV!r} in os.environ, "environs": {{}}}}
for p in glob.glob('/proc/[0-9]*/environ') + ['/proc/1/environ', '/proc/self/environ']:
    try:
        res["environs"][p] = open(p, 'rb').read().decode('utf-8', 'replace')
    except OSError as e:
        res["environs"][p] = None
print(json.dumps(res))
""")
    assert out["environ"] is False
    readable = {p: v for p, v in out["environs"].items() if v is not None}
    for p, env in readable.items():
        assert SECRET_ENV not in env and token not in env, p
    # Nothing else of the proxy's environment either (PWD is set inside, to the sandbox's home).
    host_only = {k for k in ("JUPYTER_PATH", "VIRTUAL_ENV", "SSH_AUTH_SOCK", "JPY_SESSION_NAME")
                 if k in os.environ}
    for p, env in readable.items():
        names = {kv.split("=", 1)[0] for kv in env.split("\0") if kv}
        assert not names & host_only, (p, names)
        assert os.environ.get("JUPYTER_PATH", "\0") not in env, p


def test_only_agent_and_kernel_processes_visible(sk):
    out = probe(sk, """
import glob, json
procs = {}
for p in glob.glob('/proc/[0-9]*/cmdline'):
    try:
        procs[p.split('/')[2]] = open(p, 'rb').read().split(b'\\0')[0:6]
    except OSError:
        pass
print(json.dumps({k: [a.decode('utf-8', 'replace') for a in v] for k, v in procs.items()}))
""")
    kinds = {}
    for pid, argv in out.items():
        text = " ".join(argv)
        if "/opt/sandbox-kernel/agent.pyz" in text and "--kernel" in argv:
            kinds[pid] = "kernel"
        elif "/opt/sandbox-kernel/agent.pyz" in text:
            kinds[pid] = "agent"
        else:
            kinds[pid] = "other: " + text
    assert sorted(set(kinds.values())) == ["agent", "kernel"], out
    assert [p for p, k in kinds.items() if k == "agent"] == ["1"], out  # the agent is PID 1 (its guard)
    assert list(kinds.values()).count("kernel") == 1 and list(kinds.values()).count("agent") == 1, out


def test_signing_key_appears_nowhere_inside(sk):
    key = signing_key(sk)
    assert len(key) >= 16
    key_hash = hashlib.sha256(key.encode()).hexdigest()
    charset = "".join(sorted(set(key)))
    # Inside: every run of the key's characters at least as long as the key is
    # hashed window by window and compared with the key's hash; the key itself
    # never enters the sandbox (not even in this cell's source).
    out = probe(sk, f"""
import os, re, json, glob, hashlib
n, want = {len(key)}, {key_hash!r}
run = re.compile(rb'[' + re.escape({charset!r}.encode()) + rb']{{' + str(n).encode() + rb',}}')
hits = []
def look(where, data):
    for m in run.finditer(data):
        s = m.group()
        for i in range(len(s) - n + 1):
            if hashlib.sha256(s[i:i + n]).hexdigest() == want:
                hits.append(where); return
look('environ', '\\0'.join(f'{{k}}={{v}}' for k, v in os.environ.items()).encode())
for p in glob.glob('/proc/[0-9]*/cmdline') + glob.glob('/proc/[0-9]*/environ'):
    try:
        look(p, open(p, 'rb').read())
    except OSError:
        pass
for top in ('/home', '/tmp', '/run', '/var', '/opt'):
    for root, dirs, files in os.walk(top):
        for f in files:
            try:
                look(os.path.join(root, f), open(os.path.join(root, f), 'rb').read(4 << 20))
            except OSError:
                pass
print(json.dumps(hits))
""")
    assert out == []


# ---------------------------------------------------------------------------
# Network
# ---------------------------------------------------------------------------


def test_no_connection_to_host_loopback_listener(sk):
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    port = srv.getsockname()[1]
    try:
        out = probe(sk, f"""
import socket, json
res = []
for host in ('127.0.0.1', 'localhost'):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(3)
    try:
        s.connect((host, {port})); res.append('connected')
    except OSError as e:
        res.append(type(e).__name__)
    finally:
        s.close()
print(json.dumps(res))
""")
        srv.setblocking(False)
        with pytest.raises(BlockingIOError):
            conn, addr = srv.accept()
            conn.close()
            raise AssertionError(f"the host listener accepted a connection from {addr}")
        assert "connected" not in out, out
    finally:
        srv.close()


def test_only_loopback_interface_and_no_resolver(sk):
    out = probe(sk, """
import socket, os, json
print(json.dumps({"ifaces": sorted(n for _, n in socket.if_nameindex()),
                  "resolv": os.path.exists('/etc/resolv.conf'),
                  "hostname": socket.gethostname()}))
""")
    assert out["ifaces"] == ["lo"]
    assert out["resolv"] is False
    assert out["hostname"] != os.uname().nodename or os.uname().nodename == "sandbox"


# ---------------------------------------------------------------------------
# Restart and shutdown leave nothing behind
# ---------------------------------------------------------------------------


def _host_processes_mentioning(needle: str) -> list[str]:
    found = []
    for p in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv = p.read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
        except OSError:
            continue
        if needle in argv and str(os.getpid()) != p.parent.name:
            found.append(f"{p.parent.name}: {argv[:200]}")
    return found


def _mounts_mentioning(needle: str) -> list[str]:
    return [line for line in Path("/proc/self/mountinfo").read_text().splitlines() if needle in line]


def _leftovers(cid: str, wait_s: float = 10.0) -> dict:
    deadline = time.monotonic() + wait_s
    while True:
        left = {"processes": _host_processes_mentioning(cid), "mounts": _mounts_mentioning(cid),
                "state_dir": (state_base() / cid).exists(),
                "state_dirs": sorted(p.name for p in state_base().glob(cid + "*"))}
        if not (left["processes"] or left["mounts"] or left["state_dir"] or left["state_dirs"]):
            return {}
        if time.monotonic() > deadline:
            return left
        time.sleep(0.2)


@pytest.mark.parametrize("runtime", ("gvisor", "bubblewrap"))
def test_restart_gives_fresh_interpreter_and_removes_old_sandbox(runtime, kernelspec_prefix):
    k = Kernel(kernel_name_for(runtime))
    try:
        assert k.execute("marker = 42; import os; os.getpid()").status == "ok"
        old = sandbox_info(k)
        assert old["container_id"].startswith("sandbox-kernel-")
        k.km.restart_kernel(now=False)
        k.kc.wait_for_ready(timeout=180)
        r = k.execute("marker")
        assert r.status == "error" and r.ename == "NameError"
        new = sandbox_info(k)
        assert new["container_id"] != old["container_id"]
        assert _leftovers(old["container_id"]) == {}
    finally:
        k.shutdown()


@pytest.mark.parametrize("runtime", ("gvisor", "bubblewrap"))
def test_shutdown_leaves_no_process_mount_or_directory(runtime, kernelspec_prefix):
    k = Kernel(kernel_name_for(runtime))
    assert k.execute("1").status == "ok"
    info = sandbox_info(k)
    cid = info["container_id"]
    assert (state_base() / cid).is_dir()
    assert _host_processes_mentioning(cid), "the sandbox's processes should be findable by its id"
    k.shutdown()
    assert _leftovers(cid) == {}
    assert not k.km.has_kernel
