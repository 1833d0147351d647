"""The agent client through a real Jupyter Server (REST + WebSocket) the test starts on 127.0.0.1.

The server starts kernels of the test kernelspecs (``JUPYTER_PATH``), so the
cells run in bubblewrap; the client speaks only to the loopback server.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

pytest.importorskip("jupyter_server")

from client_flow import quickstart_flow, stop_process
from kernels import kernel_name_for
from sandbox_kernel import Sandbox


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, token: str) -> dict | list:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    req = urllib.request.Request(url, headers={"Authorization": f"token {token}"})
    with opener.open(req, timeout=10) as r:
        return json.loads(r.read())


@pytest.fixture(scope="module")
def jupyter_server(kernelspec_prefix, tmp_path_factory):
    """A Jupyter Server on 127.0.0.1 with a random token; stopped (with its kernels) at the end."""
    tmp = tmp_path_factory.mktemp("jupyter-server")
    token, port = os.urandom(24).hex(), _free_port()
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(tmp / "runtime"), "JUPYTER_CONFIG_DIR": str(tmp / "config"),
           "JUPYTER_DATA_DIR": str(tmp / "data")}
    proc = subprocess.Popen([sys.executable, "-m", "jupyter_server", "--ServerApp.ip=127.0.0.1",
                             f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
                             f"--IdentityProvider.token={token}", "--ServerApp.open_browser=False",
                             f"--ServerApp.root_dir={tmp}", "--ServerApp.terminals_enabled=False",
                             *(["--allow-root"] if os.geteuid() == 0 else [])],
                            env=env, stdout=subprocess.DEVNULL, stderr=(tmp / "server.log").open("w"))
    url = f"http://127.0.0.1:{port}/"
    deadline = time.monotonic() + 60
    while True:
        try:
            _get(url + "api/status", token)
            break
        except (urllib.error.URLError, ConnectionError):
            assert proc.poll() is None and time.monotonic() < deadline, (tmp / "server.log").read_text()[-2000:]
            time.sleep(0.3)
    try:
        yield url, token
    finally:
        stop_process(proc)


def test_quickstart_flow_through_jupyter_server(jupyter_server):
    url, token = jupyter_server
    with Sandbox(kernel_name_for("bubblewrap"), url=url, token=token) as sbx:
        kernel_id = sbx.aio.transport.kernel_id
        assert [k["id"] for k in _get(url + "api/kernels", token)] == [kernel_id]
        info = sbx.info()
        assert info.backend == "local" and info.raw["runtime"] == "bubblewrap", info
        quickstart_flow(sbx)
        assert sbx.run("print(input('q? '))", on_input=lambda p, pw: "over ws").stdout == "over ws\n"
        with pytest.raises(NotImplementedError, match=r"binary message buffers.*kernelspec or a connection file"):
            sbx.list_files(".")
        for _ in range(3):
            # a cell sent the moment restart() returns: its output and its idle arrive
            # (IOPub's subscription reconnects on its own; restart() waits for it)
            sbx.restart()
            ex = sbx.run("print('fresh'); x")
            assert (ex.stdout, ex.error.ename) == ("fresh\n", "NameError"), ex
    # the client started that kernel, so close() deleted it
    assert _get(url + "api/kernels", token) == []


def test_a_wrong_token_is_a_clear_error(jupyter_server):
    url, _ = jupyter_server
    with pytest.raises(ConnectionError, match=r"HTTP (403|401) \(wrong token\?\)"):
        Sandbox(kernel_name_for("bubblewrap"), url=url, token="not-the-token").start()


def test_attach_to_a_running_kernel_by_id(jupyter_server):
    url, token = jupyter_server
    with Sandbox(kernel_name_for("bubblewrap"), url=url, token=token) as owner:
        owner.run("shared = 'yes'")
        with Sandbox(url=url, token=token, kernel_id=owner.aio.transport.kernel_id) as guest:
            assert guest.run("shared").text == "'yes'"
        assert owner.run("shared").text == "'yes'"  # the guest's close() only disconnected


def _children_waiting_or_handed(server_pid: int) -> set[int]:
    """The server's child processes started as spare proxies (their command line keeps the
    ``{connection_file}`` placeholder after the hand-over)."""
    pids = set()
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            stat = open(f"/proc/{d}/stat").read().rsplit(")", 1)[1].split()
            cmd = open(f"/proc/{d}/cmdline", "rb").read().split(b"\0")
        except OSError:
            continue
        if int(stat[1]) == server_pid and stat[0] != "Z" and b"{connection_file}" in cmd:
            pids.add(int(d))
    return pids


def test_jupyter_server_starts_kernels_on_prestarted_proxies(jupyter_server, kernelspec_prefix):
    """What JupyterLab does (a kernel per notebook, a restart) through a real Jupyter Server,
    with a kernelspec as ``sandbox-kernel install`` writes it by default (``--prestart 1``):
    the server's second start is handed to the spare its first one started."""
    from sandbox_kernel import cli

    url, token = jupyter_server
    name = "sandbox-test-server-prestart"
    assert cli.main(["install", "--prefix", kernelspec_prefix, "--name", name, "--runtime", "bubblewrap"]) == 0
    port = url.rsplit(":", 1)[1].strip("/")
    lines = subprocess.run(["ps", "-ww", "-eo", "pid,args"], capture_output=True, text=True).stdout.splitlines()
    server_pid = next(int(line.split()[0]) for line in lines
                      if "jupyter_server" in line and f"--ServerApp.port={port}" in line)
    with Sandbox(name, url=url, token=token) as first:
        assert first.run("print(1)").stdout == "1\n"
        deadline = time.monotonic() + 60
        while not (spares := _children_waiting_or_handed(server_pid)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert len(spares) == 1, "the first start left one spare proxy in the server"
        with Sandbox(name, url=url, token=token) as second:
            assert second.run("x = 2\nprint(x)").stdout == "2\n"
            now = _children_waiting_or_handed(server_pid)
            assert spares < now and len(now) == 2, "the spare became the kernel, a new spare waits"
        assert first.run("print(3)").stdout == "3\n"
