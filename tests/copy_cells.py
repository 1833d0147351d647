"""Cells shared by the tests of copies of a kernel (fork, rewind; local, service, E2B).

:data:`LISTENER` opens a TCP listener on the sandbox's own loopback, served by a thread;
:data:`ASK_UNDER_LOAD` then connects to it 32 times at once from 8 threads, in the same
kernel or in a copy of it, and prints how many answers came back and whose pid they name
(a copy keeps the interpreter's pid: the same process, restored).  Loopback inside the
sandbox only: nothing leaves it.
"""

import time

LISTENER = ("import os, socket, threading\n"
            "srv = socket.socket(); srv.bind(('127.0.0.1', 0)); srv.listen(64)\n"
            "port = srv.getsockname()[1]\n"
            "def _serve():\n"
            "    while True:\n"
            "        c, _ = srv.accept()\n"
            "        with c:\n"
            "            c.sendall(b'pong %d' % os.getpid())\n"
            "threading.Thread(target=_serve, daemon=True).start()")

ASK_UNDER_LOAD = ("from concurrent.futures import ThreadPoolExecutor\n"
                  "def _ask(_):\n"
                  "    with socket.create_connection(('127.0.0.1', port), timeout=10) as s:\n"
                  "        return s.recv(64).decode()\n"
                  "with ThreadPoolExecutor(8) as ex:\n"
                  "    answers = list(ex.map(_ask, range(32)))\n"
                  "print(len(answers), set(answers) == {f'pong {os.getpid()}'})")

#: What :data:`ASK_UNDER_LOAD` prints when every connection was answered.
ALL_ANSWERED = "32 True\n"


#: A cell printing five times a second, forever (``n`` its count).
PRINTING = ("import time\nn = 0\nprint('started', flush=True)\n"
            "while True:\n    n += 1; print('tick', n, flush=True); time.sleep(0.2)")


def snapshot_then_rewind_while_printing(k, control) -> dict:
    """Through ``jupyter_client`` (``k``, a tests ``Kernel``; ``control``, the tests' helper):
    start :data:`PRINTING`, take a snapshot once it prints, rewind to it 0.5 s later, and
    return the running cell's ``execute_reply`` (which the rewind ended)."""
    msg_id = k.kc.execute(PRINTING)
    while True:  # the cell prints: it runs
        m = k.kc.get_iopub_msg(timeout=60)
        if m["parent_header"].get("msg_id") == msg_id and m["msg_type"] == "stream":
            break
    snap = control(k, "snapshot_request")
    assert snap["status"] == "ok", snap
    time.sleep(0.5)
    assert control(k, "restore_request", {"snapshot_id": snap["snapshot"]["id"]})["status"] == "ok"
    while True:
        reply = k.kc.get_shell_msg(timeout=60)
        if reply["parent_header"].get("msg_id") == msg_id:
            return reply
