"""The workspace on E2B and Modal (emulated): a copy in at start, and back for ``rw``.

The real SDKs against the emulated services on 127.0.0.1 (sandboxes are
bubblewrap as uid 65534).  The folder is copied in before the first cell
(links are not: they read as missing); with ``rw`` the sandbox's changes come
back on ``sync`` and at shutdown; a host file changed meanwhile is kept and the
sandbox's version written beside it; links the sandbox made are never followed.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from kernels import Kernel
from sandbox_kernel import files_client
from sandbox_kernel.kernelspec import install


def project(tmp_path: Path) -> Path:
    d = tmp_path / "project"
    (d / "data").mkdir(parents=True)
    (d / "sales.csv").write_text("a,b\n1,2\n")
    (d / "notes.txt").write_text("host v1\n")
    (d / "data" / "x.txt").write_text("nested\n")
    (d / ".git").mkdir()
    (d / ".git" / "config").write_text("[core]\n")
    outside = tmp_path / "outside.txt"
    outside.write_text("host secret")
    (d / "link.txt").symlink_to(outside)
    return d


def start(backend: str, mode: str, d: Path, request, prefix: str) -> Kernel:
    request.getfixturevalue(f"{backend}_emulator")
    name = f"sandbox-test-{backend}-ws-{mode}"
    install(name, backend=backend, options={"workspace": mode, "workspace_path": str(d)}, prefix=prefix)
    return Kernel(name)


@pytest.mark.parametrize("backend", ["e2b", "modal"])
def test_rw_copies_in_and_back_without_overwriting_or_following(backend, request, kernelspec_prefix,
                                                                tmp_path):
    d = project(tmp_path)
    k = start(backend, "rw", d, request, kernelspec_prefix)
    try:
        r = k.execute("import os\nprint(os.getcwd())\nprint(open('sales.csv').read().split()[1], "
                      "open('data/x.txt').read().strip(), os.path.lexists('link.txt'))\n"
                      "open('out.txt', 'w').write('from the sandbox')\n"
                      "open('notes.txt', 'w').write('sandbox v2')\n"
                      "os.symlink('/etc/passwd', 'evil')\n"
                      "os.makedirs('.git/hooks'); open('.git/hooks/pre-commit', 'w').write('evil')")
        assert r.status == "ok", r.reply
        assert r.stdout.split() == ["/home/sandbox/work", "1,2", "nested", "False"]
        (d / "notes.txt").write_text("host v2, edited meanwhile\n")
        time.sleep(0.01)
        kc = files_client.own_client(k.km)
        try:
            with files_client.FilesClient(kc, timeout=120) as fc:
                report = {f["path"]: f for f in fc.sync()["files"]}
        finally:
            kc.stop_channels()
        assert report["out.txt"]["action"] == "created"
        assert report["notes.txt"]["action"] == "kept-both"
        assert report["evil"]["action"] == "skipped"
        assert report[".git/hooks/pre-commit"]["action"] == "skipped"
        assert not (d / ".git" / "hooks").exists()
        assert (d / "out.txt").read_text() == "from the sandbox"
        assert (d / "notes.txt").read_text() == "host v2, edited meanwhile\n"
        assert (d / report["notes.txt"]["detail"]).read_text() == "sandbox v2"
        assert not (d / "evil").exists() and not (d / "evil").is_symlink()
        assert k.execute("open('data/y.txt', 'w').write('at shutdown')").status == "ok"
    finally:
        k.shutdown()
    assert (d / "data" / "y.txt").read_text() == "at shutdown"  # copied back at shutdown
    assert (tmp_path / "outside.txt").read_text() == "host secret"


def test_ro_copies_in_and_never_back(request, kernelspec_prefix, tmp_path):
    d = project(tmp_path)
    before = {p: p.read_bytes() for p in d.rglob("*") if p.is_file() and not p.is_symlink()}
    k = start("e2b", "ro", d, request, kernelspec_prefix)
    try:
        r = k.execute("import os\nprint(open('sales.csv').read().split()[0], oct(os.stat('sales.csv').st_mode & 0o777))\n"
                      "open('new.txt', 'w').write('x')")
        assert r.stdout.split()[:2] == ["a,b", "0o444"], r.stdout
    finally:
        k.shutdown()
    after = {p: p.read_bytes() for p in d.rglob("*") if p.is_file() and not p.is_symlink()}
    assert after == before and not (d / "new.txt").exists()


def test_a_workspace_over_the_cap_is_a_clear_error(request, kernelspec_prefix, tmp_path):
    d = project(tmp_path)
    (d / "big.bin").write_bytes(os.urandom(2 << 20))
    request.getfixturevalue("e2b_emulator")
    install("sandbox-test-e2b-ws-cap", backend="e2b", prefix=kernelspec_prefix,
            options={"workspace": "ro", "workspace_path": str(d), "max_file_transfer_bytes": 1 << 20})
    k = Kernel("sandbox-test-e2b-ws-cap")
    try:
        r = k.execute("print('never')")
        assert r.status == "error" and "over what is copied" in r.reply["content"]["evalue"]
        assert "max_file_transfer_bytes" in r.reply["content"]["evalue"] and not r.stdout
    finally:
        k.shutdown()
