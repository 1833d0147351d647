"""The workspace: the notebook's folder inside the sandbox, and what may never be exposed.

Real sandboxes through installed kernelspecs (gVisor and bubblewrap).  A
notebook in a temporary folder with ``sales.csv`` beside it is run by
``sandbox-kernel run``: with ``--workspace ro`` pandas reads the CSV as the
host does and writing there fails read-only; with ``rw`` a saved PNG appears on
the host with the bytes the sandbox wrote; with ``none`` the
``FileNotFoundError`` is unchanged and followed by a one-line hint.  Folders
that hold keys, a home directory, ``/`` and ``/etc`` are refused at start;
symlinks reach nothing outside the folder.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from kernels import Kernel, kernel_name_for
from sandbox_kernel import files_client, workspace
from sandbox_kernel.policy import Policy

CSV = "region,units,price\nnorth,3,2.5\nsouth,5,1.25\neast,,4.0\n"


def folder(tmp_path: Path, mode: int = 0o755) -> Path:
    """A notebook folder the sandbox user (uid 65534) can reach: pytest's temporary
    directories are 0700 root, and a sandbox sees host permissions as they are."""
    d = tmp_path / "project"
    d.mkdir()
    (d / "sales.csv").write_text(CSV)
    os.chmod(d, mode)
    return d


def run_notebook(kernel: str, nb_dir: Path, cells: list[str], *extra: str) -> list[dict]:
    """``sandbox-kernel run`` on a notebook of ``cells`` in ``nb_dir``; the executed cells."""
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    path = nb_dir / "analysis.ipynb"
    nbformat.write(nb, path)
    out = nb_dir.parent / "out.ipynb"
    proc = subprocess.run([sys.executable, "-m", "sandbox_kernel.cli", "run", str(path), "--kernel", kernel,
                           "--allow-errors", "-o", str(out), *extra], capture_output=True, text=True,
                          timeout=300, env=os.environ)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return nbformat.read(out, as_version=4).cells


def probe(names: tuple[str, ...], action: str) -> str:
    """A cell doing ``action`` on each name ``n``, printing ``n``, the error's type and errno
    when it fails."""
    return (f"for n in {names!r}:\n    try:\n        {action}\n"
            "    except OSError as e:\n        print(n, type(e).__name__, e.errno)")


def text_of(cell) -> str:
    parts = []
    for o in cell.outputs:
        if o.output_type == "stream":
            parts.append(o.text)
        elif o.output_type == "error":
            parts.append(f"{o.ename}: {o.evalue}")
        elif "data" in o:
            parts.append(o.data.get("text/plain", ""))
    return "".join(parts)


@pytest.fixture
def plain(kernelspec_prefix, runtime) -> str:
    return kernel_name_for(runtime)


def test_ro_reads_as_the_host_does_and_refuses_writes(plain, tmp_path):
    import pandas as pd

    d = folder(tmp_path, 0o777)  # writable by anyone on the host: only the mount is read-only
    cells = run_notebook(plain, d, [
        "import os, pandas as pd\nprint(os.getcwd())\nprint(pd.read_csv('sales.csv').to_json())",
        "open('results.txt', 'w').write('x')",
    ], "--workspace", "ro")
    cwd, frame = text_of(cells[0]).splitlines()
    assert cwd == workspace.WORKSPACE_DIR
    assert json.loads(frame) == json.loads(pd.read_csv(d / "sales.csv").to_json())
    assert "OSError: [Errno 30] Read-only file system: 'results.txt'" in text_of(cells[1])
    assert not (d / "results.txt").exists()


def test_rw_savefig_appears_on_the_host_with_its_bytes(plain, tmp_path):
    d = folder(tmp_path, 0o777)
    cells = run_notebook(plain, d, [
        "import hashlib, matplotlib\nmatplotlib.use('Agg')\nimport matplotlib.pyplot as plt\n"
        "plt.plot([1, 2, 3]); plt.savefig('out.png')\n"
        "print(hashlib.sha256(open('out.png', 'rb').read()).hexdigest())",
    ], "--workspace", "rw")
    png = (d / "out.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert text_of(cells[0]).strip() == hashlib.sha256(png).hexdigest()


def test_none_keeps_the_error_and_adds_a_hint(plain, tmp_path):
    d = folder(tmp_path)
    cells = run_notebook(plain, d, ["import pandas as pd\npd.read_csv('sales.csv')",
                                    "open('nowhere.csv')"])
    err = next(o for o in cells[0].outputs if o.output_type == "error")
    assert (err.ename, err.evalue) == ("FileNotFoundError",
                                       "[Errno 2] No such file or directory: 'sales.csv'")
    hint = [o.text for o in cells[0].outputs if o.output_type == "stream" and o.name == "stderr"]
    assert len(hint) == 1 and hint[0].count("\n") == 1
    assert "'sales.csv' exists in the notebook's folder" in hint[0] and "--workspace ro" in hint[0]
    assert cells[0].outputs.index(err) < [o.get("text") for o in cells[0].outputs].index(hint[0])
    assert not [o for o in cells[1].outputs if o.output_type == "stream"]  # no such file on the host


def test_a_symlink_out_of_the_workspace_reads_as_missing(plain, tmp_path):
    d = folder(tmp_path)
    secret = tmp_path / "outside" / "secret.txt"
    secret.parent.mkdir()
    secret.write_text("host secret")
    os.chmod(secret.parent, 0o755)
    (d / "abs-link").symlink_to(secret)
    (d / "rel-link").symlink_to("../outside/secret.txt")
    cells = run_notebook(plain, d, [probe(("abs-link", "rel-link"), "print(n, open(n).read())")],
                         "--workspace", "ro")
    assert text_of(cells[0]).split() == ["abs-link", "FileNotFoundError", "2", "rel-link", "FileNotFoundError", "2"]


def test_links_the_sandbox_writes_are_never_followed(start_kernel, install_kernelspec, runtime, tmp_path):
    """In rw, a cell plants links to host files; the proxy's file comm refuses them, and
    nothing on the host side opens them (the host target is untouched)."""
    d = folder(tmp_path, 0o777)
    target = tmp_path / "host-only.txt"
    target.write_text("untouched")
    name = install_kernelspec(runtime, "ws-rw", workspace="rw", workspace_path=str(d))
    k = start_kernel(name)
    r = k.execute(f"import os\nos.symlink({str(target)!r}, 'evil')\nos.symlink('/etc/passwd', 'evil2')\n"
                  "os.mkfifo('pipe')")
    assert r.status == "ok", r.reply
    assert (d / "evil").is_symlink() and os.readlink(d / "evil") == str(target)
    kc = files_client.own_client(k.km)
    try:
        with files_client.FilesClient(kc, timeout=60) as fc:
            for bad in ("evil", "evil2", "pipe"):
                with pytest.raises(PermissionError, match=r"symlink|not a regular"):
                    fc.download(bad)
            with pytest.raises(PermissionError, match="symlink"):
                fc.upload("evil", b"overwrite through the link?")
            assert {e["name"]: e["type"] for e in fc.list_files(".")["entries"]}["evil"] == "symlink"
    finally:
        kc.stop_channels()
    assert target.read_text() == "untouched"


def test_rw_writes_are_bounded_by_the_quota(start_kernel, install_kernelspec, runtime, tmp_path):
    d = folder(tmp_path, 0o777)
    name = install_kernelspec(runtime, "ws-quota", workspace="rw", workspace_path=str(d), scratch_mib=32)
    k = start_kernel(name)
    r = k.execute("f = open('big.bin', 'wb')\ntry:\n    f.write(b'x' * (33 << 20)); f.flush()\n"
                  "except OSError as e:\n    print(type(e).__name__, e.errno)\nf.close()")
    assert r.status == "ok" and r.stdout.split() == ["OSError", "27"], r.stdout  # EFBIG
    assert (d / "big.bin").stat().st_size <= 32 << 20
    info = k.sandbox_info()
    assert info["workspace"] == {"mode": "rw", "host_path": str(d), "sandbox_path": workspace.WORKSPACE_DIR}


def test_rw_keeps_git_read_only(plain, tmp_path):
    """A cell may not plant a git hook the host would run at the next commit."""
    d = folder(tmp_path, 0o777)
    (d / ".git" / "hooks").mkdir(parents=True)
    os.chmod(d / ".git" / "hooks", 0o777)
    cells = run_notebook(plain, d, [probe((".git/hooks/pre-commit", "results.txt"),
                                          "open(n, 'w').write('x'); print(n, 'written')")], "--workspace", "rw")
    assert text_of(cells[0]).split() == [".git/hooks/pre-commit", "OSError", "30", "results.txt", "written"]
    assert not (d / ".git" / "hooks" / "pre-commit").exists() and (d / "results.txt").exists()


# ---- refusals (at kernel start, before any sandbox) -----------------------------------------


@pytest.mark.parametrize("where", ["home", "root", "etc", "ssh", "env"])
def test_refused_folders(where, tmp_path):
    path = {"home": os.path.expanduser("~"), "root": "/", "etc": "/etc"}.get(where)
    if path is None:
        path = str(folder(tmp_path))
        if where == "ssh":
            (Path(path) / "sub" / ".ssh").mkdir(parents=True)
        else:
            (Path(path) / ".env").write_text("TOKEN=1")
    with pytest.raises(workspace.WorkspaceRefused) as err:
        workspace.resolve(Policy(workspace="ro", workspace_path=path), "/nonexistent")
    reason = {"home": "home directory", "root": "system directory", "etc": "system directory",
              "ssh": "credentials (sub/.ssh)", "env": "credentials (.env)"}[where]
    assert reason in str(err.value) and os.path.realpath(path) in str(err.value)


def test_rw_is_refused_over_code_the_host_runs():
    venv_parent = os.path.dirname(os.path.realpath(sys.prefix))
    with pytest.raises(workspace.WorkspaceRefused, match="holds code the host runs"):
        workspace.resolve(Policy(workspace="rw", workspace_path=venv_parent), "/")


def test_rw_is_refused_over_the_ipython_dir_whose_config_the_proxy_runs(tmp_path, monkeypatch):
    """sandbox_kernel_config.py is Python the proxy runs on the host at each start: a cell
    must not be able to write it (IPYTHONDIR inside a project folder)."""
    project = folder(tmp_path)
    monkeypatch.setenv("IPYTHONDIR", str(project / ".ipython"))
    with pytest.raises(workspace.WorkspaceRefused, match="the IPython directory whose config files"):
        workspace.resolve(Policy(workspace="rw", workspace_path=str(project)), "/")
    assert workspace.resolve(Policy(workspace="ro", workspace_path=str(project)), "/").workspace == "ro"


def test_a_folder_without_secrets_is_accepted_and_none_exposes_nothing(tmp_path):
    d = folder(tmp_path)
    p = workspace.resolve(Policy(workspace="rw"), str(d))
    assert (p.workspace, p.workspace_path) == ("rw", str(d))
    assert workspace.resolve(Policy(), "/") == Policy()  # none: nothing checked, nothing exposed


def test_a_refused_workspace_is_a_clear_error_at_kernel_start(start_kernel, install_kernelspec, tmp_path):
    d = folder(tmp_path)
    (d / ".ssh").mkdir()
    k = start_kernel(install_kernelspec("bubblewrap", "ws-ssh", workspace="ro", workspace_path=str(d)))
    r = k.execute("print('never runs')")
    assert r.status == "error" and r.ename == "SandboxUnavailable"
    assert f"workspace_path='{d}'" in r.reply["content"]["evalue"]
    assert "holds credentials (.ssh)" in r.reply["content"]["evalue"]
    k2 = start_kernel(install_kernelspec("bubblewrap", "ws-etc", workspace="ro", workspace_path="/etc"))
    r = k2.execute("print('never runs')")
    assert "system directory" in r.reply["content"]["evalue"] and not r.stdout
    assert "error" in k2.sandbox_info()


def test_install_writes_the_workspace_into_the_kernelspec(tmp_path):
    from sandbox_kernel import cli

    assert cli.main(["install", "--prefix", str(tmp_path), "--name", "ws", "--workspace", "ro",
                     "--workspace-path", "/data/project"]) == 0
    spec = json.loads(next(tmp_path.rglob("ws/kernel.json")).read_text())
    argv = spec["argv"]
    assert spec["display_name"] == "Python 3 (sandbox: local, folder ro)"
    assert "--SandboxKernel.workspace=ro" in argv and "--SandboxKernel.workspace_path=/data/project" in argv
    assert cli.main(["install", "--prefix", str(tmp_path), "--name", "etc", "--workspace", "ro",
                     "--workspace-path", "/etc"]) == 2  # a folder that exists here is checked here
    assert cli.main(["pool", "--workspace", "rw", "--workspace-path", "/", "--status"]) == 2
    assert not list(tmp_path.rglob("etc/kernel.json"))


def test_kernel_info_says_what_is_exposed(tmp_path, kernelspec_prefix):
    d = folder(tmp_path)
    k = Kernel.__new__(Kernel)
    from jupyter_client.manager import KernelManager
    from sandbox_kernel.client.transport import local_manager

    k.km = local_manager(kernel_name_for("bubblewrap"), KernelManager)
    k.km.start_kernel(cwd=str(d), extra_arguments=["--SandboxKernel.workspace=ro"])
    k.kc = k.km.client()
    k.kc.start_channels()
    k.kc.wait_for_ready(timeout=180)
    k.other_replies = {}
    try:
        assert k.sandbox_info()["workspace"] == {"mode": "ro", "host_path": str(d),
                                                 "sandbox_path": workspace.WORKSPACE_DIR}
    finally:
        k.shutdown()
