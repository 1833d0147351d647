"""Issue 16: several kernels on one machine, on both local runtimes.

A shutdown or restart with cells queued leaves nothing behind; admission control
refuses the kernel the machine cannot hold (with the resource and the numbers)
while the admitted ones keep working; a memory bomb ends only its own kernel.
Every cell runs inside a sandbox.
"""

from __future__ import annotations

import os
import queue
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from kernels import Kernel, kernel_name_for
from sandbox_kernel.backends.local.admission import host_memory_mib
from sandbox_kernel.backends.local.cgroups import SandboxCgroup
from sandbox_kernel.backends.local.layout import state_base
from sandbox_kernel.backends.local.pool import spares


def _prefix(k: Kernel) -> str:
    """``sandbox-kernel-<kernel id>-``: every state directory this proxy makes."""
    return k.sandbox_info()["container_id"].rsplit("-", 1)[0] + "-"


def _wait_output(k: Kernel, msg_id: str, timeout: float = 60) -> None:
    """Until the cell ``msg_id`` has printed (it runs, past the line before its print)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            m = k.kc.get_iopub_msg(timeout=0.5)
        except queue.Empty:
            continue
        if m["parent_header"].get("msg_id") == msg_id and m["msg_type"] == "stream":
            return
    raise AssertionError("the first cell never started")


@pytest.mark.parametrize("how", ["shutdown", "restart"])
def test_shutdown_or_restart_with_cells_queued_leaves_nothing(kernelspec_prefix, runtime, how):
    """One cell runs, three are queued with ``stop_on_error=False``, the kernel is shut
    down or restarted: no state directory of that proxy is left (before: the queued
    cell started a fresh sandbox while the proxy exited, and ``gc --dry-run`` found it)."""
    kernel = Kernel(kernel_name_for(runtime))
    try:
        _queue_then(kernel, how)
    finally:
        if kernel.km.has_kernel:
            kernel.shutdown()


def _queue_then(kernel: Kernel, how: str) -> None:
    prefix = _prefix(kernel)
    # jupyter_client interrupts a kernel before it asks it to shut down (or restart): the
    # running cell ignores SIGINT (as one stuck in C code would), so the interrupt cannot
    # end it and let a queued cell start before the shutdown request is read; the
    # shutdown ends it, every time
    first = kernel.kc.execute("import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
                              "print('SIGINT ignored', flush=True); time.sleep(60)", stop_on_error=False)
    sent = [first] + [kernel.kc.execute(code, stop_on_error=False)
                      for code in ("x = 1", "print(2)", "time.sleep(5)")]
    _wait_output(kernel, first)
    if how == "restart":
        kernel.km.restart_kernel(now=False)
    else:
        kernel.km.shutdown_kernel(now=False)
    # every cell got its reply from the old process (none is left showing [*]): the
    # running one stopped, the queued ones refused or aborted, none ran
    replies = {}
    while len(replies) < len(sent):
        m = kernel.kc.get_shell_msg(timeout=10)
        if m["parent_header"].get("msg_id") in sent:
            replies[m["parent_header"]["msg_id"]] = m["content"]
    assert replies[first]["ename"] == "KernelShuttingDown", replies[first]
    for msg_id in sent[1:]:
        assert replies[msg_id]["status"] in ("error", "aborted"), replies[msg_id]
    if how == "restart":
        kernel.kc.wait_for_ready(timeout=180)
        assert _prefix(kernel) != prefix  # a new proxy, a new sandbox
    else:
        kernel.kc.stop_channels()
    left = [d.name for d in state_base().glob(prefix + "*")]
    assert left == [], f"state directories left by the {how}: {left}"
    if how == "restart":
        assert kernel.execute("1 + 1").result_text == "2"


def test_a_shutdown_goes_idle_as_stock_does_and_logs_no_traceback(kernelspec_prefix, runtime, tmp_path):
    """After ``shutdown_reply`` the kernel publishes the shutdown's own ``idle`` on IOPub, as
    stock ipykernel does, and its log holds no traceback (before: the control thread, still
    publishing that ``idle`` when the process exited, found IOPub's pipes closed: no
    ``idle``, and on a loaded machine "Socket operation on non-socket" in JupyterLab's log,
    seen once in a restart)."""
    log = tmp_path / "proxy.log"
    with open(log, "wb") as f:
        kernel = Kernel(kernel_name_for(runtime), stderr=f)
    try:
        assert kernel.execute("x = 1").status == "ok"
        msg = kernel.kc.session.msg("shutdown_request", {"restart": False})
        kernel.kc.control_channel.send(msg)
        assert kernel.kc.get_control_msg(timeout=60)["content"]["status"] == "ok"
        kernel.km.provisioner.process.wait(30)  # the proxy exited: what it published has come
        states = []
        while True:
            try:
                m = kernel.kc.get_iopub_msg(timeout=2)
            except queue.Empty:
                break
            if m["parent_header"].get("msg_id") == msg["header"]["msg_id"] and m["msg_type"] == "status":
                states.append(m["content"]["execution_state"])
        assert states == ["busy", "idle"]
    finally:
        kernel.shutdown()
    assert "Traceback" not in log.read_text(errors="replace"), log.read_text(errors="replace")[-3000:]


@pytest.fixture
def own_state_base(monkeypatch):
    """A state base of its own: admission counts only this test's sandboxes."""
    base = Path(f"/run/sandbox-kernel-test-{uuid.uuid4().hex[:8]}")
    monkeypatch.setenv("SANDBOX_KERNEL_STATE_DIR", str(base))
    yield base
    spares.stop_all()  # what `sandbox-kernel gc` does: the policies' spare pools end, their sandboxes too
    leftovers = [d.name for d in base.glob("sandbox-kernel-*")] if base.exists() else []
    shutil.rmtree(base, ignore_errors=True)
    assert leftovers == [], f"sandboxes left behind: {leftovers}"


def test_more_kernels_than_the_machine_admits(runtime, install_kernelspec, own_state_base):
    """Room for two sandboxes of 512 MiB: the third kernel's first cell gets the
    refusal naming memory and the numbers, the two admitted keep working, and once one
    is shut down the third is admitted on its next cell."""
    room_mib = 1100
    name = install_kernelspec(runtime, "admit2", memory_mib=512, checkpoint_after_s=0,
                              memory_headroom_mib=host_memory_mib() - room_mib)
    kernels = []
    try:
        for _ in range(3):
            kernels.append(Kernel(name))
        ok = [k for k in kernels if k.execute("a = 7").status == "ok"]
        refused = [k for k in kernels if k not in ok]
        assert len(ok) == 2 and len(refused) == 1
        r = refused[0].execute("a = 7")
        content = r.reply["content"]
        assert r.ename == "AdmissionRefused", content
        assert "not enough memory on this machine for a sandbox of 512 MiB" in content["evalue"]
        assert f"1024 MiB are committed to 2 running or frozen sandboxes, of {room_mib} MiB" in content["evalue"]
        assert content["admission"]["resource"] == "memory" and content["admission"]["need"] == 512
        assert content["admission"]["available"] == room_mib - 1024
        assert "AdmissionRefused" in r.of_type("error")[0]["content"]["ename"]  # shown in the cell
        for k in ok:  # the admitted ones are unaffected
            assert k.execute("a * 6").result_text == "42"
        ok[0].shutdown()
        kernels.remove(ok[0])
        assert refused[0].execute("a = 7; a * 6").result_text == "42"
    finally:
        for k in kernels:
            k.shutdown()


def test_a_spare_sandbox_makes_room_for_a_kernel_admission_would_refuse(runtime, install_kernelspec,
                                                                        own_state_base):
    """Room for two sandboxes of 512 MiB, one kernel and its policy's spare: a kernel of
    another policy is admitted (the spare ends to make room), and the first kernel runs on."""
    room_mib = 1100
    common = {"memory_mib": 512, "checkpoint_after_s": 0, "memory_headroom_mib": host_memory_mib() - room_mib}
    first = Kernel(install_kernelspec(runtime, "spare-room-a", spare_after_s=0, **common))
    other = None
    try:
        assert first.execute("a = 7").status == "ok"
        deadline = time.monotonic() + 120
        while not any(p["ready"] for p in spares.report()):  # the spare holds the second slot
            assert time.monotonic() < deadline, spares.report()
            time.sleep(0.2)
        (spare_cid,) = spares.report()[0]["container_ids"]
        other = Kernel(install_kernelspec(runtime, "spare-room-b", pids_max=300, **common))  # another policy
        r = other.execute("6 * 7")
        assert r.result_text == "42", r.reply["content"]
        assert not (own_state_base / spare_cid).exists()  # the spare was removed to make room
        assert first.execute("a * 6").result_text == "42"
    finally:
        for k in (first, other):
            if k is not None:
                k.shutdown()


LEAK = "l = []\nwhile True: l.append(bytearray(16 * 1024**2))"


def test_a_memory_bomb_ends_only_its_kernel(runtime, install_kernelspec, start_kernel):
    name = install_kernelspec(runtime, "bombs", memory_mib=512, checkpoint_after_s=0)
    ks = [start_kernel(name) for _ in range(3)]
    for i, k in enumerate(ks):
        assert k.execute(f"a = {i}").status == "ok"
    bomb, others = ks[1], (ks[0], ks[2])
    r = bomb.execute(LEAK, timeout=180)
    assert r.ename == "SandboxRestarted"
    assert "memory limit 512 MiB exceeded" in r.reply["content"]["evalue"]
    assert bomb.execute("a").ename == "NameError"  # its own state is gone, it works again
    assert bomb.execute("1 + 1").result_text == "2"
    for i, k in zip((0, 2), others):
        assert k.execute("a").result_text == str(i)
        assert k.sandbox_info()["state"] == "running"


def test_a_restore_when_memory_is_short_waits_then_refuses_and_keeps_the_state(install_kernelspec,
                                                                                own_state_base):
    """gVisor: a checkpointed kernel holds no memory, so two others take the room; its
    next cell waits ``restore_wait_s``, then is refused with the numbers and its state
    stays on disk; once one of the others is shut down, the next cell restores it."""
    room_mib = 1100
    common = {"memory_mib": 512, "memory_headroom_mib": host_memory_mib() - room_mib, "pause_after_s": 0}
    sleeper = Kernel(install_kernelspec("gvisor", "restore-wait", checkpoint_after_s=2, restore_wait_s=2,
                                        **common))
    kernels = [sleeper]
    try:
        assert sleeper.execute("x = 41").status == "ok"
        sleeper.wait_state("checkpointed", timeout=120)
        other = install_kernelspec("gvisor", "restore-others", checkpoint_after_s=0, **common)
        for _ in range(2):
            kernels.append(Kernel(other))
            assert kernels[-1].execute("1").status == "ok"
        r = sleeper.execute("x + 1")
        evalue = r.reply["content"].get("evalue", "")
        assert r.ename == "AdmissionRefused", r.reply["content"]
        assert "not enough memory on this machine for a sandbox of 512 MiB" in evalue
        assert "for memory to restore this kernel's checkpoint" in evalue and "kept on disk" in evalue
        # while it waited, the cell said so (then cleared it: the error stays alone)
        assert any("waiting for memory to restore this kernel" in line for line in r.progress()), r.outputs
        assert not any(o["msg_type"] == "display_data" for o in r.shown)
        assert sleeper.sandbox_info()["state"] == "checkpointed"
        kernels.pop().shutdown()
        r = sleeper.execute("x + 1")
        assert r.result_text == "42" and "restored from a checkpoint" in r.stderr
    finally:
        for k in kernels:
            k.shutdown()


@pytest.fixture
def small_state_disk(monkeypatch):
    """A 300 MiB tmpfs as the state base: a checkpoint disk the test can fill."""
    base = Path(f"/run/sandbox-kernel-test-{uuid.uuid4().hex[:8]}")
    base.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=300M,mode=0711", "tmpfs", str(base)], check=True)
    monkeypatch.setenv("SANDBOX_KERNEL_STATE_DIR", str(base))
    yield base
    spares.stop_all()
    leftovers = [d.name for d in base.glob("sandbox-kernel-*")]
    subprocess.run(["umount", str(base)], check=True)
    base.rmdir()
    assert leftovers == [], f"sandboxes left behind: {leftovers}"


def test_a_full_checkpoint_disk_loses_nothing_unsaid(install_kernelspec, small_state_disk):
    """gVisor, the checkpoint disk filled after the kernel was admitted (as another
    tenant's files would): the idle checkpoint is not attempted (no half-written image
    taking the last bytes), the level falls to a stop, and the next cell is told both
    that state was lost and why no fresh sandbox starts (the disk, with numbers); once
    the disk is freed, the next cell runs in a fresh interpreter and says so."""
    # one kernel's sandbox on this disk, none beside it: no spare sandbox
    name = install_kernelspec("gvisor", "full-disk", memory_mib=256, pause_after_s=1, checkpoint_after_s=3,
                              disk_headroom_mib=0, spare_sandbox=False)
    k = Kernel(name)
    filler = small_state_disk / "filler"
    try:
        assert k.execute("x = 41").status == "ok"
        free = os.statvfs(small_state_disk)
        with open(filler, "wb") as f:
            os.posix_fallocate(f.fileno(), 0, free.f_bavail * free.f_frsize - (16 << 20))
        info = k.wait_state("stopped", timeout=60)
        assert [a for a, _ in info["idle"]["plan"]] == ["pause", "stop"], info["idle"]
        assert not list(small_state_disk.glob("sandbox-kernel-*/checkpoint/*"))  # nothing half-written
        r = k.execute("x + 1")
        evalue = r.reply["content"].get("evalue", "")
        assert r.ename == "AdmissionRefused" and "not enough disk for this sandbox's checkpoints" in evalue, evalue
        assert "sandbox stopped after 3 s idle; state was lost" in r.stderr, r.stderr
        filler.unlink()
        r = k.execute("'x' in dir()")
        assert r.result_text == "False" and "state was lost; this is a fresh interpreter" in r.stderr
    finally:
        k.shutdown()
        filler.unlink(missing_ok=True)


def _image_mib(base: Path) -> float:
    return sum(f.stat().st_size for f in base.glob("sandbox-kernel-*/checkpoint/**/*") if f.is_file()) / 2**20


def _checkpoint_and_restore(name: str, base: Path, *, in_memory: bool) -> float:
    """Fill the interpreter, let it be checkpointed, weigh the image, wake it; MiB."""
    k = Kernel(name)
    try:
        assert k.execute("x = [str(i) * 3 for i in range(600_000)]").status == "ok"
        k.wait_state("checkpointed", timeout=120)
        mib = _image_mib(base)
        if in_memory:  # a tmpfs image is not charged to the sandbox's cgroup: it would count
            # against the restored interpreter's own memory limit (an OOM on restore, seen);
            # on a disk it is page cache, reclaimed under pressure
            [sandbox] = base.glob("sandbox-kernel-*")
            cgroup = SandboxCgroup.existing(sandbox.name)
            assert cgroup is not None and cgroup.memory_used_mib() < 4, (cgroup and cgroup.memory_used_mib(), mib)
        r = k.execute("len(x), x[-1][:6]")
        assert r.result_text == "(600000, '599999')" and "restored from a checkpoint" in r.stderr, r.stderr
        return mib
    finally:
        k.shutdown()


def test_checkpoint_images_are_compressed_where_they_are_held_in_memory(install_kernelspec, small_state_disk,
                                                                        monkeypatch):
    """``checkpoint_compression=auto``: on a disk the image is written uncompressed (a
    restore need not inflate it: about 0.3 s to the first reply instead of 0.55 s); on a
    tmpfs, memory, compressed (what a checkpoint frees stays freed).  Both restore the
    interpreter's state."""
    name = install_kernelspec("gvisor", "image", memory_mib=256, pause_after_s=0, checkpoint_after_s=2,
                              disk_headroom_mib=0, spare_sandbox=False)  # the one image weighed: no spare beside
    in_memory = _checkpoint_and_restore(name, small_state_disk, in_memory=True)
    on_disk_base = Path(f"/var/tmp/sandbox-kernel-test-{uuid.uuid4().hex[:8]}")
    on_disk_base.mkdir(mode=0o711)
    monkeypatch.setenv("SANDBOX_KERNEL_STATE_DIR", str(on_disk_base))
    try:
        on_disk = _checkpoint_and_restore(name, on_disk_base, in_memory=False)
        spares.stop_all()
        assert not list(on_disk_base.glob("sandbox-kernel-*")), "sandbox left behind"
    finally:
        shutil.rmtree(on_disk_base, ignore_errors=True)
    print(f"\ncheckpoint image: {on_disk:.0f} MiB on disk (none), {in_memory:.0f} MiB on tmpfs (flate-best-speed)")
    assert on_disk > 2 * in_memory, (on_disk, in_memory)


def test_an_image_the_tmpfs_cannot_copy_is_left_whole():
    """``recharge_image`` on a tmpfs: a file it can copy is rewritten (a new inode, the
    same bytes); one the tmpfs has no room to copy is left as it was, nothing half-made."""
    from sandbox_kernel.backends.local.gvisor import recharge_image

    base = Path(f"/run/sandbox-kernel-test-{uuid.uuid4().hex[:8]}")
    base.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1M,mode=0700", "tmpfs", str(base)], check=True)
    try:
        image = base / "checkpoint"
        image.mkdir()
        small, big = image / "small.img", image / "big.img"
        small.write_bytes(os.urandom(100 << 10))
        before = small.stat().st_ino, small.read_bytes()
        recharge_image(image)
        assert small.stat().st_ino != before[0] and small.read_bytes() == before[1]
        big.write_bytes(os.urandom(600 << 10))  # a second copy of it cannot fit in 1 MiB
        data, ino = big.read_bytes(), big.stat().st_ino
        recharge_image(image)
        assert big.read_bytes() == data and big.stat().st_ino == ino
        assert sorted(p.name for p in image.iterdir()) == ["big.img", "small.img"]
    finally:
        subprocess.run(["umount", str(base)], check=True)
        base.rmdir()
