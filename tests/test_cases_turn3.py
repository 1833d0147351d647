"""The third set of cases (``../shared/cases/kernel-behaviour-turn3.md``): C18-C21,
C23-C25 and C27, through the installed kernelspec with ``jupyter_client`` (C25 through
the agent client's file comm), on both local runtimes.  What each asserts is what the
case calls right (stock ipykernel's behaviour).
"""

from __future__ import annotations

import hashlib
import json
import os
import queue
import time

import pytest
from kernels import Kernel, Shells, kernel_name_for
from sandbox_kernel import Sandbox
from test_cases import INTERRUPT_BOUND_S, Cells, error_text


def _replies(k: Kernel, ids: list[str], timeout: float = 120) -> dict[str, dict]:
    """The shell replies to ``ids`` (keyed by request msg_id)."""
    got: dict[str, dict] = {}
    deadline = time.monotonic() + timeout
    while len(got) < len(ids):
        r = k.kc.get_shell_msg(timeout=max(0.1, deadline - time.monotonic()))
        pid = r["parent_header"].get("msg_id")
        if pid in ids:
            got[pid] = r
    return got


def _iopub_until_idle(k: Kernel, last: str, timeout: float = 120) -> list[dict]:
    """IOPub messages until ``last``'s idle status (every parent's)."""
    out = []
    deadline = time.monotonic() + timeout
    while True:
        m = k.kc.get_iopub_msg(timeout=max(0.1, deadline - time.monotonic()))
        out.append(m)
        if (m["parent_header"].get("msg_id") == last and m["msg_type"] == "status"
                and m["content"]["execution_state"] == "idle"):
            return out


def _streams(msgs: list[dict], parent: str) -> str:
    return "".join(m["content"]["text"] for m in msgs
                   if m["msg_type"] == "stream" and m["parent_header"].get("msg_id") == parent)


# ---- C18 ---------------------------------------------------------------------------


def test_c18_run_all_after_an_error_aborts_the_queued_cells_only(shared_kernel):
    k, kc = shared_kernel, shared_kernel.kc
    shells = Shells(k)
    # "Run all" queues every cell while the first runs.  Which cells count as queued is
    # the order the kernel read them in, so the failing cell waits for a gate that a
    # subshell cell sent after the others on the same shell socket opens: zmq keeps one
    # socket's order, so E2 and E3 are read (queued) before the gate opens, every time.
    k.execute("import threading; c18_gate = threading.Event()")
    sid = shells.control("create_subshell_request")["subshell_id"]
    e1 = kc.execute("c18_gate.wait(60); raise ValueError('boom')")
    info = kc.kernel_info()
    comp = kc.complete("impo", 4)
    e2 = kc.execute("marker = 1; print('E2 ran')")
    e3 = kc.execute("print('E3 ran')")
    gate = shells.send("c18_gate.set()", sid)
    replies = _replies(k, [e1, info, comp, e2, e3, gate])
    seen = _iopub_until_idle(k, e3)
    shells.control("delete_subshell_request", {"subshell_id": sid})
    assert replies[gate]["content"]["status"] == "ok"
    assert replies[e1]["content"]["status"] == "error" and replies[e1]["content"]["ename"] == "ValueError"
    assert [replies[m]["content"]["status"] for m in (e2, e3)] == ["aborted", "aborted"]
    assert replies[info]["content"]["status"] == "ok" and replies[info]["content"]["language_info"]["name"] == "python"
    assert replies[comp]["content"]["status"] == "ok" and "import" in replies[comp]["content"]["matches"]
    assert _streams(seen, e2) == _streams(seen, e3) == ""
    assert k.execute("print(globals().get('marker'))").stdout == "None\n"
    # with stop_on_error=False on the failing cell, the cells after it run
    e1 = kc.execute("raise ValueError('boom')", stop_on_error=False)
    e2 = kc.execute("print('E2 ran')")
    e3 = kc.execute("print('E3 ran')")
    replies = _replies(k, [e1, e2, e3])
    seen = _iopub_until_idle(k, e3)
    assert [replies[m]["content"]["status"] for m in (e1, e2, e3)] == ["error", "ok", "ok"]
    assert (_streams(seen, e2), _streams(seen, e3)) == ("E2 ran\n", "E3 ran\n")


# ---- C19 ---------------------------------------------------------------------------


def _run(k: Kernel, code: str, **options) -> tuple[dict, list[dict]]:
    msg_id = k.kc.execute(code, **options)
    reply = _replies(k, [msg_id])[msg_id]
    return reply["content"], [m for m in _iopub_until_idle(k, msg_id) if m["parent_header"].get("msg_id") == msg_id]


def test_c19_execute_requests_own_options(kernel):
    a, _ = _run(kernel, "a = 1")
    count = a["execution_count"]
    content, msgs = _run(kernel, "print('side'); a + 1", silent=True,
                         user_expressions={"ue": "a * 10", "bad": "1/0"})
    types = [m["msg_type"] for m in msgs]
    assert "execute_input" not in types and "execute_result" not in types, types
    assert content["execution_count"] == count  # the counter did not move
    ue = content["user_expressions"]
    assert ue["ue"]["status"] == "ok" and ue["ue"]["data"]["text/plain"] == "10", ue
    assert ue["bad"]["status"] == "error" and ue["bad"]["ename"] == "ZeroDivisionError", ue
    content, msgs = _run(kernel, "a + 2", store_history=False)
    assert content["execution_count"] == count
    assert [m["content"]["data"]["text/plain"] for m in msgs if m["msg_type"] == "execute_result"] == ["3"]
    content, msgs = _run(kernel, "", silent=True)
    assert content["status"] == "ok" and content["execution_count"] == count
    assert [m["msg_type"] for m in msgs if m["msg_type"] != "status"] == []
    b, _ = _run(kernel, "b = 3")
    assert b["execution_count"] == count + 1
    _, msgs = _run(kernel, "%history -n")
    history = _streams(msgs, msgs[0]["parent_header"]["msg_id"])
    assert f"{count}: a = 1" in history and f"{count + 1}: b = 3" in history, history
    assert "side" not in history and "a + 2" not in history, history


# ---- C20 ---------------------------------------------------------------------------


def test_c20_input_after_an_interrupted_input(kernel):
    r = kernel.execute("name = input('name?')", allow_stdin=True, interrupt_after=1, timeout=60)
    assert r.ename == "KeyboardInterrupt", error_text(r)
    while True:  # the abandoned prompt, still in the client's queue
        try:
            kernel.kc.get_stdin_msg(timeout=0.5)
        except queue.Empty:
            break
    kernel.kc.input("a reply to the abandoned prompt")  # discarded: no prompt waits for it
    prompts = []

    def answer(req: dict) -> str:
        prompts.append(req["content"]["prompt"])
        return "Ada"
    r = kernel.execute("name = input('again?')\nname", allow_stdin=True, stdin=answer, timeout=60)
    assert r.result_text == "'Ada'", error_text(r)
    assert prompts == ["again?"]


# ---- C21 ---------------------------------------------------------------------------


_LEFT = ("import os\nleft = []\nfor p in os.listdir('/proc'):\n    try:\n"
         "        c = open(f'/proc/{p}/cmdline', 'rb').read()\n    except OSError:\n        continue\n"
         "    if c.startswith(b'sleep'):\n        left.append(p)\nleft")


def test_c21_an_interrupt_reaches_the_cells_child_processes(shared_kernel):
    c = Cells(shared_kernel)
    variants = {
        "os.system": "import os, time; t = time.time(); rc = os.system('sleep 30'); print(rc, round(time.time() - t, 1))",
        "subprocess": "import subprocess; subprocess.run(['sh', '-c', 'sleep 30; echo done'])",
        "!cmd": "!sleep 30",
    }
    for name, code in variants.items():
        r = c.run(code, interrupt_after=1, timeout=60)
        assert r.after_interrupt_s < INTERRUPT_BOUND_S, (name, r.after_interrupt_s, error_text(r))
        assert "done" not in r.stdout, (name, r.stdout)
        if name == "subprocess":
            assert r.ename == "KeyboardInterrupt", (name, error_text(r))
        if name == "!cmd":  # as IPython's own: the command ends, the cell replies ok (Run All goes on)
            assert r.status == "ok", (name, error_text(r))
        deadline = time.monotonic() + 10
        while (left := c.run(_LEFT).result_text) != "[]":
            assert time.monotonic() < deadline, (name, left)
            time.sleep(0.2)
        t0 = time.monotonic()
        assert c.run("1 + 1").result_text == "2"
        assert time.monotonic() - t0 < INTERRUPT_BOUND_S, name
    c.check()


def test_shell_command_output_is_merged_as_a_terminal_merges_it(shared_kernel):
    r = shared_kernel.execute("!echo out; echo err >&2; echo out2")
    assert (r.stdout, r.stderr) == ("out\nerr\nout2\n", ""), (r.stdout, r.stderr)


# ---- C23 ---------------------------------------------------------------------------


def test_c23_display_id_updates_across_cells_and_a_pause(runtime, install_kernelspec, start_kernel):
    k = start_kernel(install_kernelspec(runtime, "c23", pause_after_s=2, checkpoint_after_s=0, stop_after_s=0))
    cells = ["from IPython.display import display, update_display\nh = display('v0', display_id='d1')",
             "h.update('v1')", "update_display('v2', display_id='d1')"]
    for i, code in enumerate(cells):
        r = k.execute(code)
        assert r.status == "ok", error_text(r)
        kind = "display_data" if i == 0 else "update_display_data"
        shown = r.of_type(kind)
        assert [m["content"]["transient"]["display_id"] for m in shown] == ["d1"], (code, r.outputs)
        assert shown[0]["content"]["data"]["text/plain"] == f"'v{i}'"
        assert shown[0]["parent_header"]["msg_id"] == r.reply["parent_header"]["msg_id"]
    k.wait_state("paused", timeout=60)
    r = k.execute("h.update('v3')")
    shown = r.of_type("update_display_data")
    assert [(m["content"]["transient"]["display_id"], m["content"]["data"]["text/plain"]) for m in shown] == \
        [("d1", "'v3'")], r.outputs
    assert shown[0]["parent_header"]["msg_id"] == r.reply["parent_header"]["msg_id"]


# ---- C24 ---------------------------------------------------------------------------


def test_c24_output_written_straight_to_the_file_descriptors(shared_kernel):
    c = Cells(shared_kernel)
    r = c.run("import os, ctypes, subprocess\n"
              "os.system('echo from-os-system'); libc = ctypes.CDLL(None); libc.printf(b'from-c\\n'); "
              "libc.fflush(None)\n"
              "subprocess.run(['sh', '-c', 'echo out; echo err >&2'])\n"
              "os.system(\"printf 'caf\\\\303\\\\251\\\\n'\")\nNone")
    assert r.status == "ok", error_text(r)
    lines = r.stdout.splitlines()
    assert sorted(lines) == sorted(["from-os-system", "from-c", "out", "café"]), r.stdout
    assert r.stderr == "err\n", r.stderr
    c.check()


# ---- C27 ---------------------------------------------------------------------------


def test_c27_interrupt_during_an_output_flood(shared_kernel):
    c = Cells(shared_kernel)
    r = c.run("for i in range(10**8): print(i)", interrupt_after=1, timeout=120)
    assert r.ename == "KeyboardInterrupt", error_text(r)
    assert r.after_interrupt_s < INTERRUPT_BOUND_S, r.after_interrupt_s
    # every stream of the flood was sent before its reply and idle (Cells.run), none after (Cells.check)
    r = c.run("print('next')")
    assert r.stdout == "next\n", r.stdout[:300]
    c.check()


# ---- C26 ---------------------------------------------------------------------------

C26_CELLS = [
    "import pandas as pd\nfrom IPython.display import HTML\n"
    "table = pd.DataFrame({'a': range(100_000)}).to_html()\nHTML(table)",
    "HTML('<div title=\"' + 'a' * 2_000_000 + '\">x</div>')",
    "HTML('<div>' * 10_000 + 'x' + '</div>' * 10_000)",
    "HTML('<div>' * 100_000 + 'x' + '</div>' * 100_000)",
    "print('after')",
]


def test_c26_pathological_html_then_the_queue(shared_kernel):
    """Sent as Run All: a 100,000-row table, a 2 MB attribute value, 10,000 nested
    ``<div>`` (each sanitised and shown), 100,000 nested (too deep for the HTML parser:
    removed with its depth named, its text form kept), then ``print('after')``: every
    cell ends ok and nothing queued is failed by the firewall's work."""
    from sandbox_kernel.outputs.html import HTML_MAX_CHARS

    k, kc = shared_kernel, shared_kernel.kc
    ids = [kc.execute(code) for code in C26_CELLS]
    replies = _replies(k, ids, timeout=300)
    seen = _iopub_until_idle(k, ids[-1], timeout=300)
    assert [replies[i]["content"]["status"] for i in ids] == ["ok"] * len(ids)

    def shown(i: str) -> dict:
        results = [m["content"]["data"] for m in seen
                   if m["parent_header"].get("msg_id") == i and m["msg_type"] == "execute_result"]
        assert len(results) == 1, results
        return results[0]

    def notices(i: str) -> list[str]:
        return [m["content"]["text"] for m in seen if m["parent_header"].get("msg_id") == i
                and m["msg_type"] == "stream" and "sandbox-kernel: removed" in m["content"]["text"]]

    table, long_title, nested, too_deep, after = ids
    size = int(k.execute("print(len(table))").stdout)
    if size <= HTML_MAX_CHARS:
        assert shown(table)["text/html"].count("<tr") == 100_001 and notices(table) == []
    else:
        assert "text/html" not in shown(table) and f"{size / 1e6:.1f} MB" in "".join(notices(table))
    assert 'title="' + "a" * 2_000_000 in shown(long_title)["text/html"] and notices(long_title) == []
    assert shown(nested)["text/html"].count("<div") == 10_000 and notices(nested) == []
    assert "text/html" not in shown(too_deep) and "text/plain" in shown(too_deep)
    assert "nested 100,000 deep" in "".join(notices(too_deep))
    assert _streams(seen, after) == "after\n"


def _rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


def test_the_proxy_gives_a_big_tables_memory_back(shared_kernel):
    """A 7 MB HTML table, sanitised and shown: the proxy's resident memory comes back to
    within what it keeps for reuse on purpose (16 MiB of freed heap, ``app.keep_freed_blocks``)
    of where it was; before, the HTML parser's freed tree stayed resident (+175 MiB)."""
    k = shared_kernel
    pid = k.km.provisioner.pid
    assert k.execute("import numpy as np, pandas as pd\nfrom IPython.display import HTML\n"
                     "HTML('<b>warm</b>')").status == "ok"
    time.sleep(1)
    base = _rss_mib(pid)
    r = k.execute("HTML(pd.DataFrame(np.random.default_rng(0).random((30_000, 8))).to_html())")
    assert r.status == "ok" and r.of_type("execute_result")[0]["content"]["data"]["text/html"].count("<tr") == 30_001
    deadline = time.monotonic() + 10  # the proxy gives it back once the sandbox is quiet (heap.py)
    while _rss_mib(pid) > base + 24 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _rss_mib(pid) <= base + 24, (base, _rss_mib(pid))


# ---- C25 ---------------------------------------------------------------------------


def test_c25_files_of_every_kind_through_the_file_comm(runtime, kernelspec_prefix, tmp_path):
    files = {
        "every-byte.bin": bytes(range(256)) * 4096,  # 1 MiB, every byte value
        "empty.txt": b"",
        "random.bin": os.urandom(20 * 2**20),
        "🤣.txt": "🤣\n".encode(),
        "naïve café.csv": b"a,b\n1,2\n",
        "new dir/sub/ü.bin": b"\x00\xffnested",  # its parents do not exist yet
        "-rf.txt": b"not an option",
    }
    with Sandbox(kernel_name_for(runtime)) as sbx:
        for name, data in files.items():
            src = tmp_path / hashlib.sha256(name.encode()).hexdigest()  # the host file's name is not under test
            src.write_bytes(data)
            done = sbx.upload(src, name)
            assert done["size"] == len(data) and done["sha256"] == hashlib.sha256(data).hexdigest(), (name, done)
        inside = sbx.run("import hashlib, json, os\n"
                         f"print(json.dumps({{n: hashlib.sha256(open(n, 'rb').read()).hexdigest() "
                         f"for n in {list(files)!r}}}))")
        assert inside.error is None, inside.error
        assert json.loads(inside.stdout) == {n: hashlib.sha256(d).hexdigest() for n, d in files.items()}
        for name, data in files.items():
            assert sbx.download(name) == data, name
        listed = {e["name"] for e in sbx.list_files(".")}
        assert {n for n in files if "/" not in n} | {"new dir"} <= listed, listed
        assert {e["name"] for e in sbx.list_files("new dir/sub")} == {"ü.bin"}
        with pytest.raises(FileNotFoundError):  # no success reported for a file that is not there
            sbx.download("not-there.bin")


# ---- C22 ---------------------------------------------------------------------------

_C22_OPEN = ("from comm import create_comm\ngot = []; blob = bytes(range(256)) * 4096\n"
             "c = create_comm(target_name='bufs', data={}, buffers=[blob, b''])\n"
             "c.on_msg(lambda m: got.append([bytes(b) for b in m['buffers']]))\nc.comm_id")


def _send_comm_msg(k: Kernel, comm_id: str, buffers: list[bytes]) -> None:
    kc = k.kc
    kc.session.send(kc.shell_channel.socket, "comm_msg", {"comm_id": comm_id, "data": {}}, buffers=buffers)


def _c22_frontend_message_reaches_the_cell(k: Kernel, comm_id: str) -> None:
    _send_comm_msg(k, comm_id, [b"\x00\xff" * 1000, bytes(300_000)])
    deadline = time.monotonic() + 30
    while (r := k.execute("[len(b) for b in got[0]] if got else None")).result_text == "None":
        assert time.monotonic() < deadline, "the frontend's comm_msg never reached the cell"
        time.sleep(0.2)
    assert r.result_text == "[2000, 300000]", error_text(r)


def test_c22_binary_comm_buffers_both_ways_on_a_trusted_target(runtime, install_kernelspec, start_kernel):
    k = start_kernel(install_kernelspec(runtime, "c22", trusted_comm_targets=["bufs"]))
    r = k.execute(_C22_OPEN)
    assert r.status == "ok", error_text(r)
    (opened,) = r.of_type("comm_open")
    assert opened["content"]["target_name"] == "bufs"
    blob = bytes(range(256)) * 4096
    assert [hashlib.sha256(bytes(b)).hexdigest() for b in opened["buffers"]] == \
        [hashlib.sha256(blob).hexdigest(), hashlib.sha256(b"").hexdigest()]  # byte-identical, none base64'd
    _c22_frontend_message_reaches_the_cell(k, opened["content"]["comm_id"])


def test_c22_untrusted_comm_buffers_are_removed_said_and_the_frontend_still_reaches_the_cell(shared_kernel):
    k = shared_kernel
    r = k.execute(_C22_OPEN)
    assert r.status == "ok" and r.of_type("comm_open") == [], r.outputs
    assert "comm target 'bufs'" in r.stderr, r.stderr  # the notice says what was removed
    _c22_frontend_message_reaches_the_cell(k, r.result_text.strip("'"))
    r = k.execute("import ipywidgets as w\nfrom IPython.display import display\n"
                  "img = w.Image(value=b'\\x89PNG\\r\\n\\x1a\\n' + bytes(64), format='png')\ndisplay(img)")
    assert r.status == "ok", error_text(r)
    opens = [m for m in r.of_type("comm_open") if m["content"]["data"]["state"].get("_model_name") == "ImageModel"]
    assert len(opens) == 1, r.outputs
    state = opens[0]["content"]["data"]
    assert ["value"] in state["buffer_paths"] and len(opens[0]["buffers"]) == len(state["buffer_paths"]), state
