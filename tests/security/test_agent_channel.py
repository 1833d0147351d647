"""A cell cannot reach the agent's channel to the host (real sandboxes, both runtimes).

The agent relays between the host's framed stream and the interpreter; if a
cell could write to that stream it could forge frames and wedge the kernel
(one line did, before). Each probe below is what a hostile cell would try;
each must be refused, and the kernel must go on with its state intact. How the
channel is guarded differs by runtime (``docs/security.md``, "The agent's
channel"): under gVisor the agent is another uid than the interpreter; under
bubblewrap (one uid only) it is PID 1 of the sandbox and non-dumpable.
"""

import pytest

AGENT = "os.getppid()"

#: Probes run from a cell; each prints one word per attempt: "refused" or what happened.
PROBES = {
    "write the frame stream (the issue's line)": f"""
import os
try:
    fd = os.open(f'/proc/{{{AGENT}}}/fd/1', os.O_WRONLY)
    os.write(fd, b'{{"seq":999999,"op":"log","text":"x"}}\\n')
    print("wrote")
except PermissionError:
    print("refused")
""",
    "read the agent's stdin": f"""
import os
try:
    os.close(os.open(f'/proc/{{{AGENT}}}/fd/0', os.O_RDONLY | os.O_NONBLOCK))
    print("opened")
except PermissionError:
    print("refused")
""",
    "read the agent's memory": f"""
import os
try:
    open(f'/proc/{{{AGENT}}}/mem', 'rb').read(1)
    print("read")
except OSError:
    print("refused")
""",
    "ptrace attach": f"""
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
print("refused" if libc.ptrace(16, {AGENT}, 0, 0) != 0 else "attached")
""",
    "process_vm_readv": f"""
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
class iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
buf = ctypes.create_string_buffer(64)
local, remote = iovec(ctypes.cast(buf, ctypes.c_void_p), 64), iovec(0x400000, 64)
n = libc.process_vm_readv({AGENT}, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
print("refused" if n < 0 else "read")
""",
}


@pytest.mark.parametrize("probe", list(PROBES))
def test_the_cell_cannot_touch_the_agents_channel(shared_kernel, probe):
    shared_kernel.execute("state = 41")
    r = shared_kernel.execute(PROBES[probe], timeout=60)
    assert r.status == "ok", r.reply["content"]
    assert r.stdout.split() == ["refused"]
    after = shared_kernel.execute("state + 1", timeout=30)
    assert after.result_text == "42"


def test_signals_to_the_agent_change_nothing(shared_kernel):
    """SIGSTOP would wedge the kernel silently; SIGKILL/TERM/USR1 would end it."""
    shared_kernel.execute("state = 41")
    r = shared_kernel.execute(
        "import os, signal, time\n"
        "for s in (signal.SIGSTOP, signal.SIGUSR1, signal.SIGTERM, signal.SIGKILL):\n"
        "    try:\n"
        f"        os.kill({AGENT}, s)\n"
        "    except PermissionError:\n"
        "        pass\n"
        "time.sleep(0.5)\n"
        f"print(open(f'/proc/{{{AGENT}}}/status').read().split('State:')[1].split()[0])",
        timeout=60)
    assert r.status == "ok" and r.stdout.strip() == "S"  # sleeping, not stopped
    assert shared_kernel.execute("state + 1", timeout=30).result_text == "42"


def test_kernel_info_says_what_guards_the_channel(shared_kernel, runtime):
    guard = shared_kernel.sandbox_info()["channel_guard"]
    assert guard["non_dumpable"] is True
    if runtime == "gvisor":
        assert guard["uid_separated"] is True and guard["agent_uid"] == 0
    else:
        assert guard["pid1"] is True


POOL_CELL = """
import multiprocessing as mp, time
def slow(x):
    time.sleep(120)
    return x
with mp.Pool(4) as pool:
    pool.map(slow, range(4))
"""


def test_interrupt_ends_the_cells_children(shared_kernel):
    """SIGINT reaches the interpreter's whole process group, as with a stock kernel."""
    r = shared_kernel.execute(POOL_CELL, interrupt_after=4, timeout=60)
    assert r.ename == "KeyboardInterrupt"
    left = shared_kernel.execute(
        "import os, time\n"
        "def others():\n"
        "    me = os.getpid()\n"
        "    return [p for p in os.listdir('/proc') if p.isdigit() and int(p) not in (me, 1)\n"
        "            and os.getppid() != int(p) and open(f'/proc/{p}/cmdline').read()]\n"
        "for _ in range(50):\n"
        "    if not others():\n"
        "        break\n"
        "    time.sleep(0.1)\n"
        "print(len(others()))", timeout=60)
    assert left.stdout.strip() == "0"
    assert shared_kernel.execute("1 + 1").result_text == "2"
