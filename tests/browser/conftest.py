"""JupyterLab on loopback and headless Chromium driven by Playwright, for the browser tests.

Debian's chromium is the browser (Playwright cannot download one here); JupyterLab
runs with a token, its own settings and runtime directories, no news and no
update checks, so it reaches nothing but loopback.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_lab(home: Path, *, python: str = sys.executable, user: tuple[int, int] | None = None,
              env: dict[str, str] | None = None, terminals: bool = False
              ) -> tuple[subprocess.Popen, tuple[str, str, Path, Path]]:
    """JupyterLab on loopback with a token, as a user starts it (no ``--allow-root``
    unless it runs as root), its settings and runtime under ``home``.

    Parameters
    ----------
    python : str
        The interpreter whose environment has JupyterLab and the kernelspecs.
    user : (uid, gid), optional
        Run it as this user (``setpriv``, no supplementary groups; ``home`` must be theirs).
    env : dict, optional
        The whole environment (default this process's); ``HOME`` and the Jupyter
        directories are set here.
    terminals : bool
        Enable the server's terminals (off by default; the firewall's browser test
        turns them on to see whether a payload could create one).

    Returns
    -------
    (Popen, (base_url, token, root_dir, log_path))
        Once it answers ``/api/status``.

    Raises
    ------
    RuntimeError
        It did not answer in 120 s (the end of its log attached).
    """
    root, settings = home / "root", home / "settings"
    root.mkdir()
    for plugin, values in {"@jupyter-widgets/jupyterlab-manager/plugin": {"saveState": True},
                           "@jupyterlab/apputils-extension/notification": {"fetchNews": "false",
                                                                           "checkForUpdates": False}}.items():
        f = settings / f"{plugin}.jupyterlab-settings"
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(json.dumps(values))
    port, token = _free_port(), secrets.token_hex(16)
    env = {**(os.environ if env is None else env), "JUPYTER_CONFIG_DIR": str(home / "config"),
           "JUPYTER_RUNTIME_DIR": str(home / "runtime"), "HOME": str(home)}
    argv = [python, "-m", "jupyterlab", "--no-browser", "--ServerApp.ip=127.0.0.1",
            f"--ServerApp.port={port}", "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}",
            f"--ServerApp.root_dir={root}", f"--LabApp.user_settings_dir={settings}",
            f"--LabApp.workspaces_dir={home / 'workspaces'}", "--LabApp.expose_app_in_browser=True",
            "--LabApp.news_url=", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
            f"--ServerApp.terminals_enabled={terminals}"]
    if user is not None:
        for path in (home, *home.rglob("*")):
            os.chown(path, *user)
        argv = ["setpriv", f"--reuid={user[0]}", f"--regid={user[1]}", "--clear-groups", *argv]
    elif os.geteuid() == 0:
        argv.append("--allow-root")
    with open(home / "lab.log", "wb") as log:
        proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        try:
            urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2).read()
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                stop_lab(proc)
                raise RuntimeError(f"JupyterLab did not start: {(home / 'lab.log').read_text()[-2000:]}") from None
            time.sleep(0.3)
    return proc, (base, token, root, home / "lab.log")


def stop_lab(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def lab(request, tmp_path_factory, kernelspec_prefix):
    """JupyterLab on loopback with a token, as a user starts it; yields (base_url, token,
    root_dir, log_path).  Kernelspecs installed later (``install_kernelspec``) are listed.
    Terminals are enabled only for a module that sets ``LAB_TERMINALS = True``."""
    proc, lab = start_lab(tmp_path_factory.mktemp("lab"), terminals=getattr(request.module, "LAB_TERMINALS", False))
    yield lab
    stop_lab(proc)


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    if not Path(CHROMIUM).exists():
        raise RuntimeError(f"{CHROMIUM} is missing: scripts/setup.sh installs Debian's chromium")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium-profile")), executable_path=CHROMIUM, args=CHROMIUM_ARGS,
            headless=True, viewport={"width": 1400, "height": 1000})
        yield context
        context.close()


