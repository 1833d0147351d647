"""The installed kernelspec as other users see it (issue 13: kernelspecs other users can see)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from sandbox_kernel.kernelspec import install

NOBODY = 65534

LIST_SPECS = ("import json; from jupyter_client.kernelspec import KernelSpecManager; "
              "print(json.dumps(KernelSpecManager().find_kernel_specs()))")


@pytest.fixture
def shared_prefix():
    """A prefix under a world-readable directory, as ``--sys-prefix`` of a shared venv is."""
    d = Path(tempfile.mkdtemp(prefix="sandbox-kernelspec-"))
    d.chmod(0o755)
    yield d
    subprocess.run(["rm", "-rf", str(d)], check=True)


def test_a_kernelspec_root_installs_under_a_strict_umask_is_listed_for_an_ordinary_user(shared_prefix):
    old = os.umask(0o077)
    try:
        where = Path(install("sandbox-visible", options={"runtime": "bubblewrap"}, prefix=str(shared_prefix)))
    finally:
        os.umask(old)
    assert where.stat().st_mode & 0o777 == 0o755
    assert {p.name: p.stat().st_mode & 0o777 for p in where.iterdir()}["kernel.json"] == 0o644
    # The parents jupyter_client creates under the prefix are the installer's business; open them
    # the way a shared venv's share/jupyter is, so only our own modes are under test.
    for parent in (shared_prefix / "share", shared_prefix / "share" / "jupyter", where.parent):
        parent.chmod(0o755)
    env = {"PATH": "/usr/bin:/bin", "JUPYTER_PATH": str(shared_prefix / "share" / "jupyter"),
           "HOME": "/nonexistent", "JUPYTER_PLATFORM_DIRS": "1"}
    out = subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
                          sys.executable, "-c", LIST_SPECS],
                         env=env, capture_output=True, text=True, timeout=60, check=True)
    specs = json.loads(out.stdout)
    assert specs.get("sandbox-visible") == str(where), (specs, out.stderr)
    spec = json.loads((where / "kernel.json").read_text())
    assert spec["display_name"].startswith("Python 3 (sandbox")


def test_the_kernelspec_has_its_own_logo(shared_prefix):
    """The Launcher shows the kernelspec's logo: ours, not the stock kernel's."""
    from importlib import resources

    where = Path(install("sandbox-logo", options={"runtime": "bubblewrap"}, prefix=str(shared_prefix)))
    assert {"logo-32x32.png", "logo-64x64.png", "logo-svg.svg"} <= {p.name for p in where.iterdir()}
    stock = resources.files("ipykernel").joinpath("resources")
    for name in ("logo-32x32.png", "logo-64x64.png"):
        ours = (where / name).read_bytes()
        assert ours.startswith(b"\x89PNG") and ours != stock.joinpath(name).read_bytes()


def test_jupyterlab_is_told_the_kernel_can_debug(shared_prefix):
    """JupyterLab 4 greys out its debugger unless the kernelspec's metadata says ``debugger``."""
    where = Path(install("sandbox-debug", options={"runtime": "bubblewrap"}, prefix=str(shared_prefix)))
    assert json.loads((where / "kernel.json").read_text())["metadata"]["debugger"] is True


def test_install_without_a_location_writes_where_this_jupyter_looks_first(monkeypatch):
    """A kernelspec installed in a venv without --user/--sys-prefix/--prefix goes into the
    venv (a system-wide one would be shadowed by setup.sh's sandbox-local there)."""
    from sandbox_kernel import cli

    monkeypatch.setattr(sys, "base_prefix", "/usr")
    monkeypatch.setattr(sys, "prefix", "/work/project/.venv")
    assert cli.install_location(False, False, None) == (False, True)
    monkeypatch.setattr(sys, "prefix", "/usr")
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert cli.install_location(False, False, None) == (True, False)
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert cli.install_location(False, False, None) == (False, False)
    assert cli.install_location(True, False, None) == (True, False)
    assert cli.install_location(False, False, "/opt/x") == (False, False)
