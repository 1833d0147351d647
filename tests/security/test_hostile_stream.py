"""A cell can impersonate or kill the agent; the proxy must stay correct.

Each test writes to the agent's own stdout (the framed stream to the host)
from inside a cell, or kills the agent, and then checks that the proxy kept
its heartbeat and control channel, dropped what was malformed, and serves the
next cell.
"""

import time

AGENT_STDOUT = "f'/proc/{os.getppid()}/fd/1'"


def test_garbage_on_the_frame_stream_is_dropped(kernel):
    kernel.execute("x = 5")
    probe = kernel.execute(f"import os\nfd = os.open({AGENT_STDOUT}, os.O_WRONLY)\nos.close(fd)")
    if probe.status == "error":
        # bubblewrap: the agent is not ptrace-accessible to the cell, so its fds are out of reach
        assert probe.ename == "PermissionError"
        assert kernel.execute("x * 2").result_text == "10"
        return
    r = kernel.execute(
        "import os, json\n"
        f"fd = os.open({AGENT_STDOUT}, os.O_WRONLY)\n"
        "os.write(fd, b'not json at all\\n' + bytes(range(256)) + b'\\n[1,2,3]\\n')\n"
        "os.write(fd, json.dumps({'seq': 10**6, 'op': 'exec', 'code': 'boom'}).encode() + b'\\n')\n"
        "os.write(fd, b'{\"seq\": \"x\", \"op\": []}\\n')\n"
        "os.write(fd, b'{\"unterminated\": ' + b'9' * 100000)\n"
        "os.write(fd, b'\\n')\n"
        "os.close(fd)\n"
        "print('wrote')"
    )
    assert r.status == "ok" and "wrote" in r.stdout
    assert kernel.km.is_alive()
    assert kernel.execute("x * 2").result_text == "10"


def test_flood_of_frames_keeps_control_channel_answering(kernel):
    """While the sandbox floods the stream, an interrupt is still answered."""
    probe = kernel.execute(f"import os\nos.close(os.open({AGENT_STDOUT}, os.O_WRONLY))")
    if probe.status == "error":
        assert probe.ename == "PermissionError"  # bubblewrap: the stream is out of reach (see above)
        return
    msg_id = kernel.kc.execute(
        "import os\n"
        f"fd = os.open({AGENT_STDOUT}, os.O_WRONLY)\n"
        "line = b'{\"junk\": \"' + b'a' * 60000 + b'\"}\\n'\n"
        "import time\n"
        "t = time.time()\n"
        "while time.time() - t < 20:\n"
        "    os.write(fd, line)\n"
    )
    time.sleep(2)
    t0 = time.monotonic()
    kernel.km.interrupt_kernel()
    # the interrupt ends the flood: the cell finishes with KeyboardInterrupt
    while True:
        r = kernel.kc.get_shell_msg(timeout=30)
        if r["parent_header"].get("msg_id") == msg_id:
            break
    assert r["content"]["status"] == "error" and r["content"]["ename"] == "KeyboardInterrupt"
    assert time.monotonic() - t0 < 10
    assert kernel.execute("1 + 1").result_text == "2"


def test_killing_the_agent_gives_a_clear_error_and_a_fresh_interpreter(kernel):
    kernel.execute("y = 1")
    r = kernel.execute("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nimport time; time.sleep(5)")
    nxt = kernel.execute("y")
    if r.status == "ok":
        # gVisor: the agent is PID 1 of the sandbox and init ignores SIGKILL from inside
        assert nxt.result_text == "1"
    else:
        assert r.ename == "SandboxRestarted"
        assert "restarted" in r.reply["content"]["evalue"]
        assert nxt.ename == "NameError"
    assert kernel.execute("2 + 2").result_text == "4"
