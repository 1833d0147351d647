"""Kernel subshells (JEP 91) through the proxy, on both local runtimes (issue 18 item 4).

The message sequences of ipykernel's own subshell tests: ids created, listed and
deleted on control; a subshell's cells run on their own thread inside the
sandbox, concurrently with the main shell (a barrier both must reach); an error
aborts the queue of its own subshell only; replies carry the frontend's
``subshell_id``.  And one of ours: a subshell id stays usable after the
interpreter ends between cells and the proxy restarts it.
"""

from __future__ import annotations

import time

import pytest
from kernels import Kernel, kernel_name_for


class Shells:
    """A frontend using subshells over a kernel's channels."""

    def __init__(self, kernel: Kernel):
        self.k = kernel
        self.kc = kernel.kc

    def control(self, msg_type: str, content: dict | None = None, timeout: float = 60) -> dict:
        msg = self.kc.session.msg(msg_type, content or {})
        self.kc.control_channel.send(msg)
        deadline = time.monotonic() + timeout
        while True:
            r = self.kc.control_channel.get_msg(timeout=max(0.1, deadline - time.monotonic()))
            if r["parent_header"].get("msg_id") == msg["header"]["msg_id"]:
                return r["content"]

    def send(self, code: str, subshell_id: str | None, stop_on_error: bool = True) -> str:
        msg = self.kc.session.msg("execute_request", {"code": code, "silent": False, "store_history": True,
                                                      "user_expressions": {}, "allow_stdin": False,
                                                      "stop_on_error": stop_on_error})
        msg["header"]["subshell_id"] = subshell_id
        self.kc.shell_channel.send(msg)
        return msg["header"]["msg_id"]

    def replies(self, msg_ids: list[str], timeout: float = 120) -> list[dict]:
        got: dict[str, dict] = {}
        deadline = time.monotonic() + timeout
        while len(got) < len(msg_ids):
            r = self.kc.get_shell_msg(timeout=max(0.1, deadline - time.monotonic()))
            if r["parent_header"].get("msg_id") in msg_ids:
                got[r["parent_header"]["msg_id"]] = r
        return [got[m] for m in msg_ids]

    def stdout(self, msg_id: str, timeout: float = 120) -> str:
        out, deadline = [], time.monotonic() + timeout
        while True:
            m = self.kc.get_iopub_msg(timeout=max(0.1, deadline - time.monotonic()))
            if m["parent_header"].get("msg_id") != msg_id:
                continue
            if m["msg_type"] == "stream" and m["content"]["name"] == "stdout":
                out.append(m["content"]["text"])
            if m["msg_type"] == "status" and m["content"]["execution_state"] == "idle":
                return "".join(out).strip()

    def run(self, code: str, subshell_id: str | None = None) -> str:
        return self.stdout(self.send(code, subshell_id))


@pytest.fixture
def shells(runtime, kernelspec_prefix):
    k = Kernel(kernel_name_for(runtime))
    try:
        yield Shells(k)
    finally:
        k.shutdown()


def test_subshells_are_advertised_created_listed_and_deleted(shells):
    info = shells.kc.kernel_info(reply=True, timeout=60)["content"]
    assert "kernel subshells" in info["supported_features"]
    assert shells.control("list_subshell_request")["subshell_id"] == []
    sid = shells.control("create_subshell_request")["subshell_id"]
    assert shells.control("list_subshell_request")["subshell_id"] == [sid]
    assert shells.control("delete_subshell_request", {"subshell_id": sid})["status"] == "ok"
    assert shells.control("list_subshell_request")["subshell_id"] == []


def test_a_subshell_runs_on_its_own_thread_concurrently_with_the_main_shell(shells):
    shells.run("import threading, time; barrier = threading.Barrier(2, timeout=30)")
    sid = shells.control("create_subshell_request")["subshell_id"]
    main_thread, main_ident = shells.run("print(threading.get_ident(), threading.main_thread().ident)").split()
    sub_thread, sub_main = shells.run("print(threading.get_ident(), threading.main_thread().ident)", sid).split()
    assert main_thread == main_ident and sub_thread != sub_main
    # both cells must be at the barrier at once: only concurrent execution gets either past it
    first = shells.send("barrier.wait(); a_done = True", None)
    second = shells.send("barrier.wait(); b_done = True", sid)
    assert [r["content"]["status"] for r in shells.replies([first, second])] == ["ok", "ok"]
    assert shells.run("print(a_done and b_done)") == "True"


def test_an_error_aborts_only_its_own_subshells_queue(shells):
    sid = shells.control("create_subshell_request")["subshell_id"]
    ids = [shells.send("import time; time.sleep(1); raise ValueError('x')", None),
           shells.send("print('queued behind the error')", None),
           shells.send("import time; time.sleep(1.5)", sid),
           shells.send("print('other')", sid)]
    replies = shells.replies(ids)
    assert [r["content"]["status"] for r in replies] == ["error", "aborted", "ok", "ok"]
    assert [r["parent_header"].get("subshell_id") for r in replies] == [None, None, sid, sid]
    assert shells.run("print('after')") == "after"  # the abort is cleared


def test_a_subshell_id_survives_the_interpreter_ending_between_cells(shells):
    """The proxy restarts an interpreter that ended (C14) by itself: the frontend's subshell
    id must stay usable, as the kernel it talks to did not restart.  (A restart the frontend
    asks for is a new kernel process, whose subshells are new, as with a stock kernel.)"""
    from test_cases import _wait_iopub_status

    sid = shells.control("create_subshell_request")["subshell_id"]
    shells.run("import os, threading; threading.Timer(0.5, os._exit, (1,)).start()")
    _wait_iopub_status(shells.k, "starting", timeout=90)
    out = shells.run("import threading; print(threading.get_ident() != threading.main_thread().ident)", sid)
    assert out == "True"
    assert shells.control("list_subshell_request")["subshell_id"] == [sid]
