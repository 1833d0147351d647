"""JupyterLab's debugger through the proxy (issue 18 item 3): the Debug Adapter Protocol
sequence a frontend sends (``debug_request`` on control, ``debug_event`` on IOPub;
messaging spec, "Debug request" and "Debug event"), the one ipykernel's own
debugger tests use, against the sandbox's ipykernel and debugpy on both local
runtimes.  The breakpoint is hit inside the sandbox; nothing runs on the host.
"""

from __future__ import annotations

import itertools
import time
from typing import Any

import pytest
from kernels import Kernel, kernel_name_for

INIT_ARGS = {"clientID": "test-client", "clientName": "testClient", "adapterID": "", "pathFormat": "path",
             "linesStartAt1": True, "columnsStartAt1": True, "supportsVariableType": True,
             "supportsVariablePaging": True, "supportsRunInTerminalRequest": True, "locale": "en"}

CELL = """def f(a, b):
    c = a + b
    return c

result = f(2, 3)"""


class Debugger:
    """A frontend's debugger panel speaking DAP over the kernel's control channel."""

    def __init__(self, kernel: Kernel):
        self.k = kernel
        self.seq = itertools.count(1)
        self.events: list[dict] = []

    def request(self, command: str, arguments: dict[str, Any] | None = None, timeout: float = 60) -> dict:
        kc = self.k.kc
        msg = kc.session.msg("debug_request", {"type": "request", "seq": next(self.seq), "command": command,
                                               "arguments": arguments or {}})
        kc.control_channel.send(msg)
        deadline = time.monotonic() + timeout
        while True:
            r = kc.control_channel.get_msg(timeout=max(0.1, deadline - time.monotonic()))
            if r["parent_header"].get("msg_id") == msg["header"]["msg_id"]:
                assert r["msg_type"] == "debug_reply", r
                return r["content"]

    def wait_event(self, event: str, timeout: float = 60) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            m = self.k.kc.get_iopub_msg(timeout=max(0.1, deadline - time.monotonic()))
            if m["msg_type"] == "debug_event":
                self.events.append(m["content"])
                if m["content"].get("event") == event:
                    return m["content"]


@pytest.fixture
def debugger(runtime, kernelspec_prefix):
    k = Kernel(kernel_name_for(runtime))
    d = Debugger(k)
    try:
        assert d.request("initialize", INIT_ARGS)["success"]
        assert d.request("attach")["success"]
        yield d
    finally:
        try:
            d.request("disconnect", {"restart": False, "terminateDebuggee": True}, timeout=20)
        finally:
            k.shutdown()


def test_kernel_info_advertises_the_debugger(runtime, kernelspec_prefix):
    """Frontends enable their debugger from ``supported_features``, as the stock kernel's say."""
    k = Kernel(kernel_name_for(runtime))
    try:
        k.kc.kernel_info()
        features = k.kc.get_shell_msg(timeout=60)["content"]["supported_features"]
        assert "debugger" in features
    finally:
        k.shutdown()


def test_breakpoint_stops_the_cell_and_shows_its_locals(debugger):
    """dumpCell, setBreakpoints, configurationDone, run the cell: it stops at line 2 with
    a=2, b=3 in Locals; continue lets it finish with the right result and state."""
    source = debugger.request("dumpCell", {"code": CELL})["body"]["sourcePath"]
    bp = debugger.request("setBreakpoints", {"breakpoints": [{"line": 2}], "source": {"path": source},
                                             "sourceModified": False})
    assert bp["success"] and bp["body"]["breakpoints"][0]["verified"]
    info = debugger.request("debugInfo")["body"]
    assert source in [b["source"] for b in info["breakpoints"]]
    assert debugger.request("configurationDone")["success"]

    msg_id = debugger.k.kc.execute(CELL)
    stopped = debugger.wait_event("stopped")
    assert stopped["body"]["reason"] == "breakpoint"
    frames = debugger.request("stackTrace", {"threadId": stopped["body"]["threadId"]})["body"]["stackFrames"]
    assert frames[0]["line"] == 2 and frames[0]["source"]["path"] == source
    scopes = debugger.request("scopes", {"frameId": frames[0]["id"]})["body"]["scopes"]
    ref = next(s["variablesReference"] for s in scopes if s["name"] == "Locals")
    local_vars = {v["name"]: v["value"] for v in debugger.request("variables", {"variablesReference": ref})
                  ["body"]["variables"]}
    assert local_vars.get("a") == "2" and local_vars.get("b") == "3"
    rich = debugger.request("richInspectVariables", {"variableName": "a", "frameId": frames[0]["id"]})
    assert rich["body"]["data"] == {"text/plain": "2"}

    assert debugger.request("continue", {"threadId": stopped["body"]["threadId"]})["success"]
    reply = None
    deadline = time.monotonic() + 60
    while reply is None:
        m = debugger.k.kc.get_shell_msg(timeout=max(0.1, deadline - time.monotonic()))
        if m["parent_header"].get("msg_id") == msg_id:
            reply = m
    assert reply["content"]["status"] == "ok"
    assert debugger.k.execute("result").result_text == "5"


def test_rich_variable_view_goes_through_the_output_firewall(debugger):
    """The debugger panel renders ``richInspectVariables`` as a mime bundle: a variable
    whose HTML carries script reaches the frontend without it."""
    r = debugger.k.execute("from IPython.display import HTML\n"
                           "page = HTML('<b>bold</b><script>window.pwned = 1</script>')")
    assert r.status == "ok"
    names = [v["name"] for v in debugger.request("inspectVariables")["body"]["variables"]]
    assert "page" in names
    data = debugger.request("richInspectVariables", {"variableName": "page"})["body"]["data"]
    html = data.get("text/html", "")
    assert "<b>bold</b>" in html and "<script" not in html and "pwned" not in html


def test_debugger_survives_a_checkpoint(install_kernelspec):
    """A gVisor sandbox checkpointed while the debugger is attached (debugpy's loopback
    connections inside): after the restore a breakpoint still stops the cell."""
    k = Kernel(install_kernelspec("gvisor", "debug-idle", pause_after_s=1.5, checkpoint_after_s=3))
    d = Debugger(k)
    try:
        assert d.request("initialize", INIT_ARGS)["success"] and d.request("attach")["success"]
        k.wait_state("checkpointed")
        source = d.request("dumpCell", {"code": CELL})["body"]["sourcePath"]
        assert d.request("setBreakpoints", {"breakpoints": [{"line": 2}], "source": {"path": source},
                                            "sourceModified": False})["success"]
        assert d.request("configurationDone")["success"]
        k.kc.execute(CELL)
        stopped = d.wait_event("stopped")
        assert stopped["body"]["reason"] == "breakpoint"
        assert d.request("continue", {"threadId": stopped["body"]["threadId"]})["success"]
        assert k.execute("result").result_text == "5"
    finally:
        k.shutdown()
