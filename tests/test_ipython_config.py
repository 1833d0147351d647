"""IPython configuration meant for the interpreter reaches it in the sandbox (issue 18 item 9).

nbclient, papermill and users pass interpreter options on the kernel's command
line (``--InlineBackend.*``, ``--HistoryManager.*``, ``--IPKernelApp.exec_lines``)
and keep a profile (``ipython_kernel_config.py``, ``startup/*.py``): the
sandbox's interpreter must behave as a stock kernel given the same, after a
restart too.  Startup files run inside the sandbox like any cell.
"""

from __future__ import annotations

import json
import os

import pytest
from jupyter_client.manager import KernelManager
from kernels import kernel_name_for
from sandbox_kernel.client.transport import local_manager


def _cell(kc, code: str) -> tuple[dict, str, list[dict]]:
    outputs: list[dict] = []
    reply = kc.execute_interactive(code, timeout=120, output_hook=outputs.append)
    text = "".join(o["content"].get("text", "") for o in outputs if o["msg_type"] == "stream")
    return reply["content"], text, outputs


@pytest.fixture
def profile(tmp_path):
    ipdir = tmp_path / "ipython"
    startup = ipdir / "profile_default" / "startup"
    startup.mkdir(parents=True)
    (startup / "00-first.py").write_text("import math as m\nSTARTUP_ORDER = ['00']\n")
    (startup / "10-second.py").write_text("STARTUP_ORDER.append('10')\n")
    (ipdir / "profile_default" / "ipython_kernel_config.py").write_text(
        "c = get_config()\nc.InteractiveShell.xmode = 'Minimal'\n")
    return ipdir


def test_command_line_and_profile_configuration_reach_the_interpreter(runtime, kernelspec_prefix, profile):
    km = local_manager(kernel_name_for(runtime), KernelManager)
    km.start_kernel(env={**os.environ, "IPYTHONDIR": str(profile)}, extra_arguments=[
        "--InlineBackend.figure_formats=svg", "--HistoryManager.enabled=False",
        "--IPKernelApp.exec_lines=EXEC_LINE = 42"])
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=180)
        check = ("ip = get_ipython()\nimport json\n"
                 "print(json.dumps({'formats': sorted(ip.kernel.shell.display_formatter.active_types if False "
                 "else __import__('matplotlib_inline.config', fromlist=['x']).InlineBackend.instance()"
                 ".figure_formats), 'history': ip.history_manager.enabled, 'xmode': ip.InteractiveTB.mode, "
                 "'startup': STARTUP_ORDER, 'pi': round(m.pi, 2), 'line': EXEC_LINE}))")
        for attempt in ("first start", "after a restart"):
            content, out, _ = _cell(kc, check)
            assert content["status"] == "ok", (attempt, content)
            seen = json.loads(out.strip().splitlines()[-1])
            assert seen == {"formats": ["svg"], "history": False, "xmode": "Minimal",
                            "startup": ["00", "10"], "pi": 3.14, "line": 42}, (attempt, seen)
            # the names the setup made are hidden from %who, as a stock kernel hides them
            content, out, _ = _cell(kc, "x_user = 1\n%who")
            assert "x_user" in out and "STARTUP_ORDER" not in out and "__sk" not in out, out
            km.restart_kernel(now=False)
            kc.wait_for_ready(timeout=180)
        info = kc.kernel_info(reply=True, timeout=60)["content"]["sandbox"]["ipython_config"]
        assert info["startup_files"] == ["00-first.py", "10-second.py"] and "InlineBackend" in info["sections"]
        assert info["config_files"] == ["ipython_kernel_config.py"]
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=False)


def test_a_failing_startup_file_is_logged_and_the_kernel_works(runtime, kernelspec_prefix, tmp_path):
    """As with a stock kernel: the traceback goes to the kernel's log, the later startup
    files still run, and no cell shows it."""
    startup = tmp_path / "ipython" / "profile_default" / "startup"
    startup.mkdir(parents=True)
    (startup / "00-broken.py").write_text("raise RuntimeError('broken startup')\n")
    (startup / "01-fine.py").write_text("AFTER_BROKEN = True\n")
    km = local_manager(kernel_name_for(runtime), KernelManager)
    log_path = tmp_path / "kernel.log"
    with open(log_path, "w") as log:
        km.start_kernel(env={**os.environ, "IPYTHONDIR": str(tmp_path / "ipython")}, stderr=log)
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=180)
        content, out, outputs = _cell(kc, "AFTER_BROKEN")
        assert content["status"] == "ok" and "broken startup" not in out
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=False)
    logged = log_path.read_text()
    assert "00-broken.py" in logged and "RuntimeError: broken startup" in logged, logged[-2000:]
