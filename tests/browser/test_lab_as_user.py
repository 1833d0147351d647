"""Issue 13: the README's JupyterLab, started by an ordinary user, runs its kernels on gVisor.

An operator's setup, as the README gives it: a venv every user can read, the
kernelspecs installed into it by root (``--sys-prefix``), and, for the full feature
set, root's sandbox service.  An ordinary user (created by the test) starts
``jupyter lab`` from that venv, without ``--allow-root``; Chromium opens a notebook on
each kernelspec and runs cells as a data scientist would: the rootless gVisor kernel
and the one made through the sandbox service each keep state across cells, show a
matplotlib figure, and say in ``kernel_info`` which boundary holds them.
Screenshots in ``out/browser/<kernel>/``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from nonroot_env import KERNEL, USERS, make_env, service_socket, start_service

from .conftest import start_lab, stop_lab
from .lab import LabNotebook, panel_js

#: The kernelspec whose sandboxes the sandbox service makes.
KERNEL_SERVICE = "sk-lab-service"
_SANDBOX = panel_js("return p.sessionContext.session.kernel.requestKernelInfo().then(r => r.content.sandbox);")


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """The users' venv (:func:`nonroot_env.make_env`) with JupyterLab's assets, and a
    kernelspec that goes through the service."""
    flags = ["--prestart", "0", "--memory-mib", "1024", "--pause-after-s", "0", "--checkpoint-after-s", "0",
             "--pool-socket", "", "--service-socket", str(service_socket())]
    for e in make_env(tmp_path_factory, {KERNEL_SERVICE: flags}):
        venv = e["base"] / "venv"
        for rel in ("share/jupyter/lab", "share/jupyter/labextensions", "etc/jupyter"):
            src, dst = Path(sys.prefix) / rel, venv / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            if subprocess.run(["cp", "-al", str(src), str(dst)], capture_output=True).returncode != 0:
                subprocess.run(["cp", "-a", str(src), str(dst)], check=True)  # another filesystem
        yield e


@pytest.fixture(scope="module")
def user_lab(env):
    """JupyterLab run by user a from the users' venv: (lab tuple, Popen, uid, gid)."""
    user, home = env["users"][USERS[0]]
    lab_home = home / "lab"
    lab_home.mkdir()
    proc, lab = start_lab(lab_home, python=env["python"], user=(user.pw_uid, user.pw_gid),
                          env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"})
    yield lab, proc, user.pw_uid, user.pw_gid
    stop_lab(proc)


def _uid_of(pid: int) -> int:
    line = next(x for x in Path(f"/proc/{pid}/status").read_text().splitlines() if x.startswith("Uid:"))
    return int(line.split()[1])


def test_jupyterlab_run_by_an_ordinary_user_runs_its_kernels_on_gvisor(env, user_lab, browser):
    lab, proc, uid, gid = user_lab
    base, token, root, log_path = lab
    assert _uid_of(proc.pid) == uid  # the user's server: no --allow-root, no root anywhere in it
    specs = json.loads(urllib.request.urlopen(f"{base}/api/kernelspecs?token={token}", timeout=10).read())
    assert {KERNEL, KERNEL_SERVICE} <= set(specs["kernelspecs"]), specs["kernelspecs"].keys()
    service = start_service(env)
    try:
        for name, boundary in ((KERNEL, "rootless"), (KERNEL_SERVICE, "via the sandbox service")):
            nb = LabNotebook(browser, lab, name)
            os.chown(root / nb.name, uid, gid)
            try:
                nb.open()
                assert nb.text(nb.run("import os\nx = os.getuid()\nx", "uid")) == "65534", nb.diagnosis()
                shown = nb.run("import matplotlib.pyplot as plt\nplt.plot([1, 4, 9])\nplt.show()", "plot")
                assert any("image/png" in o.get("data", {}) for o in shown), shown
                nb.page.wait_for_selector("[data-fidelity=plot] .jp-OutputArea-output img", timeout=30_000)
                assert nb.text(nb.run("x + 1", "state")) == "65535"
                nb.shot("ran-as-an-ordinary-user")
                sandbox = nb.page.evaluate(_SANDBOX)
                assert "gVisor" in sandbox["boundary"] and boundary in sandbox["boundary"], sandbox
                assert nb.outside == [], nb.outside
            finally:
                nb.close()
    finally:
        service.send_signal(signal.SIGTERM)
        service.wait(60)
    assert "Running as root" not in log_path.read_text(errors="replace")
