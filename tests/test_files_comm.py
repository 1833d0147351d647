"""The ``sandbox_kernel.files`` comm on real sandboxes, through installed kernelspecs.

20 MiB of random bytes go up and come back with the same SHA-256 on gVisor,
bubblewrap, and the E2B and Modal emulations; a transfer does not wait for a
running cell; a frozen and a checkpointed sandbox are woken for it; paths that
leave the sandbox's writable areas are refused.  Bytes move through the agent:
the cell's namespace never sees them (checked: no variable appears).
"""

from __future__ import annotations

import hashlib
import os
import queue

import pytest
from kernels import Kernel, kernel_name_for
from sandbox_kernel import files_client

MIB = 1 << 20


def files_of(k: Kernel) -> tuple[files_client.FilesClient, object]:
    """A file comm on a kernel client of its own (the test's client keeps its IOPub)."""
    kc = files_client.own_client(k.km)
    return files_client.FilesClient(kc, timeout=180), kc


def round_trip(k: Kernel, size: int = 20 * MIB) -> None:
    data = os.urandom(size)
    fc, kc = files_of(k)
    try:
        up = fc.upload("random.bin", data)
        assert up["size"] == size and up["sha256"] == hashlib.sha256(data).hexdigest()
        back = fc.download("random.bin")
        assert hashlib.sha256(back).hexdigest() == up["sha256"]
        assert fc.stat("random.bin")["size"] == size
        r = k.execute("import hashlib\nprint(hashlib.sha256(open('random.bin', 'rb').read()).hexdigest())\n"
                      "print(sorted(n for n in dir() if not n.startswith('_')))")
        assert r.stdout.splitlines()[0] == up["sha256"]
        assert "data" not in r.stdout and "random" not in r.stdout.splitlines()[1]
        assert fc.remove("random.bin")["removed"] == "file"
        with pytest.raises(FileNotFoundError):
            fc.stat("random.bin")
    finally:
        fc.close()
        kc.stop_channels()


def test_20_mib_up_and_down_on_local_runtimes(kernel):
    round_trip(kernel)


def test_a_transfer_does_not_wait_for_a_running_cell(start_kernel, kernelspec_prefix):
    k = start_kernel(kernel_name_for("bubblewrap"))
    msg_id = k.kc.execute("import time\ntime.sleep(30)\nprint('slept')")
    while True:  # the cell is running
        m = k.kc.get_iopub_msg(timeout=30)
        if m["parent_header"].get("msg_id") == msg_id and m["msg_type"] == "execute_input":
            break
    fc, kc = files_of(k)
    try:
        data = os.urandom(4 * MIB)
        fc.upload("during.bin", data)
        assert fc.download("during.bin") == data
        assert "during.bin" in {e["name"] for e in fc.list_files(".")["entries"]}
    finally:
        fc.close()
        kc.stop_channels()
    while True:  # done while the cell still sleeps: its reply has not come
        try:
            r = k.kc.get_shell_msg(timeout=0.01)
        except queue.Empty:
            break
        assert r["parent_header"].get("msg_id") != msg_id, "the transfer waited for the cell"
    k.km.interrupt_kernel()


@pytest.mark.parametrize("runtime,level", [("bubblewrap", "paused"), ("gvisor", "paused"),
                                           ("gvisor", "checkpointed")])
def test_a_frozen_or_checkpointed_sandbox_is_woken(runtime, level, start_kernel, install_kernelspec):
    opts = {"pause_after_s": 1.0} if level == "paused" else {"pause_after_s": 1.0, "checkpoint_after_s": 2.0}
    k = start_kernel(install_kernelspec(runtime, f"files-{level}", **opts))
    assert k.execute("x = 41").status == "ok"
    k.wait_state(level, timeout=90)
    fc, kc = files_of(k)
    try:
        data = os.urandom(MIB)
        fc.upload("woken.bin", data)
        assert fc.download("woken.bin") == data
    finally:
        fc.close()
        kc.stop_channels()
    r = k.execute("print(x + 1, len(open('woken.bin', 'rb').read()))")
    assert r.stdout.split() == ["42", str(MIB)]  # state kept: woken, not replaced


def test_escapes_are_refused(start_kernel, kernelspec_prefix):
    k = start_kernel(kernel_name_for("bubblewrap"))
    r = k.execute("import os\nos.symlink('/etc/passwd', 'link')\nos.mkfifo('fifo')\nos.mkdir('d')")
    assert r.status == "ok"
    fc, kc = files_of(k)
    try:
        for path, why in [("../etc/passwd", "'..' is not allowed"), ("/etc/passwd", "outside"),
                          ("/proc/self/environ", "outside"), ("/opt/sandbox-kernel/agent.pyz", "outside"),
                          ("link", "symlink"), ("fifo", "not a regular file"), ("link/x", "symlink")]:
            with pytest.raises(PermissionError, match=why):
                fc.download(path)
        for path in ("/usr/x", "../x", "link", "d/../../x"):
            with pytest.raises(PermissionError):
                fc.upload(path, b"x")
        with pytest.raises(PermissionError):
            fc.remove("fifo")
        with pytest.raises(PermissionError, match="outside"):
            fc.list_files("/")
        with pytest.raises(FileExistsError):
            fc.upload("d/a", b"1")
            fc.upload("d/a", b"2", overwrite=False)
        big = files_client.FilesClient(kc, timeout=60)
        with pytest.raises(files_client.FileTransferError, match="transfer limit"):
            big.upload("huge.bin", b"x" * (big.max_bytes + 1))
        big.close()
    finally:
        fc.close()
        kc.stop_channels()
    assert os.path.exists("/etc/passwd")  # nothing on the host was touched
