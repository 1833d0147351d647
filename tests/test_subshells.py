"""Kernel subshells (JEP 91) through the proxy, on both local runtimes (issue 18 item 4).

The message sequences of ipykernel's own subshell tests: ids created, listed and
deleted on control; a subshell's cells run on their own thread inside the
sandbox, concurrently with the main shell (a barrier both must reach); an error
aborts the queue of its own subshell only; replies carry the frontend's
``subshell_id``.  And one of ours: a subshell id stays usable after the
interpreter ends between cells and the proxy restarts it.
"""

from __future__ import annotations

import pytest
from kernels import Kernel, Shells, kernel_name_for


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
    shells.run("import threading; gate = threading.Event()")
    # the failing cell waits for a gate that the subshell opens with a cell sent after the
    # queued one on the same shell socket: zmq keeps one socket's order, so the queued cell
    # is read (queued) before the error, every time, however loaded the machine
    ids = [shells.send("gate.wait(60); raise ValueError('x')", None),
           shells.send("print('queued behind the error')", None),
           shells.send("gate.set(); import time; time.sleep(1)", sid),
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
