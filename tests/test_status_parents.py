"""Every IOPub ``status`` under its own request's parent, on both local runtimes (issue 33).

A frontend tells which request a ``busy``/``idle`` belongs to by its parent header
(messaging spec, "Kernel status"): nbclient waits for the idle parented to the
cell it ran, and for a message with no reply (a comm message) that idle is the
only sign it was handled.  Widget managers (nbclient's Output widget,
JupyterLab's) send ``comm_msg`` on shell while a cell runs; the proxy relays
it beside the cell, and the next cell's idle used to go out under the previous
cell's parent (12 of 20 cells on bubblewrap, 15 of 20 on gVisor, none on a
stock ipykernel) while the comm message got no status at all.

Here, as from a stock ipykernel: each cell one ``busy`` and one ``idle`` of its
own, each comm message the same, on the main shell, on a subshell (where
widget managers put their comms) and on control; no status of one request
under another's parent.  The comm messages go to a comm id the kernel does not
know, as nbclient's may: the relay does not look, and nothing changes inside.
"""

from __future__ import annotations

import queue
import time
import uuid
from collections import defaultdict

from kernels import Kernel

#: Each cell sleeps this long, so the comm message comes while it runs.
CELL = "import time; time.sleep(0.3); print({i})"
#: Seconds a frontend waits for a cell's idle before calling it lost (nbclient's own
#: wait is shorter; the test only needs a hang to become a failure).
IDLE_WAIT_S = 10.0


class Frontend:
    """A frontend's view of the kernel: what it sends, and every IOPub message it reads,
    by the msg_id of its parent (status messages by their ``execution_state``)."""

    def __init__(self, kernel: Kernel):
        self.kc = kernel.kc
        #: parent msg_id -> what came for it, in order (``busy``, ``execute_input``, ``idle``...)
        self.seen: dict[str, list[str]] = defaultdict(list)

    def send(self, channel: str, msg_type: str, content: dict, subshell_id: str | None = None) -> str:
        msg = self.kc.session.msg(msg_type, content)
        if subshell_id is not None:
            msg["header"]["subshell_id"] = subshell_id
        getattr(self.kc, f"{channel}_channel").send(msg)
        return msg["header"]["msg_id"]

    def execute(self, code: str, subshell_id: str | None = None) -> str:
        return self.send("shell", "execute_request", {"code": code, "silent": False, "store_history": True,
                                                      "user_expressions": {}, "allow_stdin": False,
                                                      "stop_on_error": True}, subshell_id)

    def comm_msg(self, channel: str = "shell", subshell_id: str | None = None) -> str:
        """An Output widget's update, as nbclient sends one (``output_widget.py``)."""
        return self.send(channel, "comm_msg", {"comm_id": uuid.uuid4().hex,
                                               "data": {"method": "update", "state": {"outputs": []}}},
                         subshell_id)

    def statuses(self, msg_id: str) -> list[str]:
        return [s for s in self.seen.get(msg_id, ()) if s in ("starting", "busy", "idle")]

    def read_until(self, msg_id: str, what: str, timeout: float = IDLE_WAIT_S) -> bool:
        """Read IOPub until ``what`` (a status or a msg_type) came for ``msg_id``; False if
        it did not within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while what not in self.seen.get(msg_id, ()):
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            try:
                m = self.kc.get_iopub_msg(timeout=min(left, 0.5))
            except queue.Empty:
                continue
            kind = m["content"]["execution_state"] if m["msg_type"] == "status" else m["msg_type"]
            self.seen[m["parent_header"].get("msg_id", "")].append(kind)
        return True

    def control(self, msg_type: str, content: dict | None = None, timeout: float = 60) -> dict:
        msg_id = self.send("control", msg_type, content or {})
        deadline = time.monotonic() + timeout
        while True:
            r = self.kc.control_channel.get_msg(timeout=max(0.1, deadline - time.monotonic()))
            if r["parent_header"].get("msg_id") == msg_id:
                return r["content"]


def _cells_with_comms(fe: Frontend, rounds: int, comm_channel: str = "shell", subshell_id: str | None = None,
                      code: str = CELL) -> tuple[list[str], list[str], list[int]]:
    """``rounds`` cells, each with a comm message sent while it runs; returns the cells'
    and comm messages' ids and the rounds whose cell got no idle of its own in time."""
    cells, comms, lost = [], [], []
    for i in range(rounds):
        cell = fe.execute(code.format(i=i), subshell_id)
        assert fe.read_until(cell, "execute_input", timeout=60), f"cell {i} did not start"
        comms.append(fe.comm_msg(comm_channel, subshell_id if comm_channel == "shell" else None))
        cells.append(cell)
        if not fe.read_until(cell, "idle"):
            lost.append(i)
    for comm in comms:  # the sandbox handles each after its cell
        fe.read_until(comm, "idle")
    return cells, comms, lost


def _assert_own_statuses(fe: Frontend, cells: list[str], comms: list[str], lost: list[int]) -> None:
    assert not lost, f"{len(lost)} of {len(cells)} cells got no idle of their own within {IDLE_WAIT_S:g} s"
    wrong = {f"cell {i}": fe.statuses(c) for i, c in enumerate(cells) if fe.statuses(c) != ["busy", "idle"]}
    wrong |= {f"comm {i}": fe.statuses(c) for i, c in enumerate(comms) if fe.statuses(c) != ["busy", "idle"]}
    assert not wrong, f"statuses not one busy and one idle of the request's own: {wrong}"


def test_a_comm_msg_beside_each_cell_leaves_every_status_with_its_own_request(kernel):
    fe = Frontend(kernel)
    cells, comms, lost = _cells_with_comms(fe, 20)
    _assert_own_statuses(fe, cells, comms, lost)


def test_beside_an_awaiting_cell_too(kernel):
    """A cell that awaits lets ipykernel (7.4) handle a comm message at once, beside it,
    with no status of its own there: the proxy still shows one busy and one idle for it,
    the idle once the sandbox handled it."""
    fe = Frontend(kernel)
    cells, comms, lost = _cells_with_comms(fe, 5, code="import asyncio; await asyncio.sleep(0.3); print({i})")
    _assert_own_statuses(fe, cells, comms, lost)


def test_on_a_subshell_too(kernel):
    """Widget managers send their comm messages on a subshell (JEP 91); the proxy's
    subshell dispatches them beside that subshell's running cell."""
    fe = Frontend(kernel)
    sid = fe.control("create_subshell_request")["subshell_id"]
    cells, comms, lost = _cells_with_comms(fe, 10, subshell_id=sid)
    _assert_own_statuses(fe, cells, comms, lost)
    assert fe.control("delete_subshell_request", {"subshell_id": sid})["status"] == "ok"


def test_on_control_too(kernel):
    """The proxy takes comm messages on control as well (spec 5.x: control accepts every
    shell request type); a ``kernel_info_request`` there, as Jupyter Server sends, too."""
    fe = Frontend(kernel)
    cells, comms, lost = _cells_with_comms(fe, 10, comm_channel="control")
    _assert_own_statuses(fe, cells, comms, lost)
    cell = fe.execute(CELL.format(i="'info'"))
    assert fe.read_until(cell, "execute_input", timeout=60)
    info = fe.send("control", "kernel_info_request", {})
    assert fe.read_until(cell, "idle") and fe.read_until(info, "idle")
    assert fe.statuses(cell) == fe.statuses(info) == ["busy", "idle"], dict(fe.seen)
