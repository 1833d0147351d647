"""Spare sandboxes on demand (``LocalBackend.spare_sandbox``, on by default, issue 28):
a kernel of a policy in use starts a spare pool for it, the next kernel takes its started
sandbox (bubblewrap here; gVisor as root and rootless in test_nonroot.py and the suite at
large, whose kernels take spares wherever a policy is used twice).

What a user (or an operator) checks: the second kernel says ``pooled`` and holds nothing
of the first; a kernel of another policy never gets that spare; ``doctor`` lists the pool;
a spare killed is replaced and leaves nothing; a pool killed leaves no sandbox (its
watchdog reaps it) and the next kernel starts a new one; ``gc`` ends them all.  Every
cell runs inside a bubblewrap sandbox; each test's policy is its own (a ``memory_mib``
no other test uses), so the worker's other pools never serve it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from kernels import Kernel
from sandbox_kernel.backends.local.pool import spares
from sandbox_kernel.backends.local.reaper import orphans
from test_pool import _gone


def _pool(key: str | None = None, timeout: float = 120, ready: int = 1) -> dict:
    """The live spare pool (of ``key``, else the only one started since the test began)
    once it holds ``ready`` started sandboxes."""
    deadline = time.monotonic() + timeout
    while True:
        found = [p for p in spares.report() if key is None or p["key"] == key]
        if found and found[-1]["ready"] >= ready:
            return found[-1]
        assert time.monotonic() < deadline, f"no spare ready: {spares.report()}"
        time.sleep(0.2)


def _nice(container_id: str) -> set[int]:
    """The nice values of the threads in a sandbox's cgroup."""
    from sandbox_kernel.backends.local.cgroups import SandboxCgroup
    cgroup = SandboxCgroup.existing(container_id)
    assert cgroup is not None, container_id
    values = set()
    for tid in (cgroup.paths["pids"] / "tasks").read_text().split():
        try:
            stat = Path(f"/proc/{tid}/stat").read_text()
        except OSError:
            continue
        values.add(int(stat.rsplit(")", 1)[1].split()[16]))  # field 19: nice
    return values


def test_the_next_kernel_of_a_policy_takes_the_spare_and_nothing_of_the_first(install_kernelspec, start_kernel):
    spares.stop_all()
    name = install_kernelspec("bubblewrap", "spare-a", memory_mib=1100, spare_after_s=0)
    first = start_kernel(name)
    assert first.sandbox_info()["pooled"] is False  # the first of its policy: cold
    assert first.execute("secret = 'of the first kernel'").status == "ok"
    pool = _pool()
    assert pool["runtime"] == "bubblewrap" and pool["handed"] == 0
    assert min(_nice(pool["container_ids"][0])) >= 10  # a spare starts below the kernels (as root)
    second = start_kernel(name)
    info = second.sandbox_info()
    assert info["pooled"] is True and info["container_id"] in pool["container_ids"]
    assert _nice(info["container_id"]) == {0}  # taken: the kernel's own priority
    r = second.execute("import os\nprint(globals().get('secret'), os.getuid())")
    assert r.stdout == "None 65534\n", r
    assert _pool(pool["key"])["handed"] == 1  # and the pool started the next spare
    doctor = subprocess.run([sys.executable, "-m", "sandbox_kernel", "doctor", "--json"], capture_output=True,
                            text=True, timeout=300)
    listed = json.loads(doctor.stdout)["spare_pools"]
    assert [p["key"] for p in listed] == [pool["key"]], listed
    other = start_kernel(install_kernelspec("bubblewrap", "spare-b", memory_mib=1200, spare_after_s=0))
    assert other.sandbox_info()["pooled"] is False  # another policy: never that spare
    deadline = time.monotonic() + 120
    while sum(p["ready"] for p in spares.report()) < 2:  # spare-b's pool has its spare too
        assert time.monotonic() < deadline, spares.report()
        time.sleep(0.2)
    held = [cid for p in spares.report() for cid in p["container_ids"]]
    gc = subprocess.run([sys.executable, "-m", "sandbox_kernel", "gc"], capture_output=True, text=True, timeout=120)
    assert "ended 2 spare pool(s)" in gc.stdout, gc.stdout
    assert spares.report() == []
    for cid in held:  # the spares are removed with their pools
        assert _gone(cid), cid


def test_a_killed_spare_is_replaced_and_a_killed_pool_leaves_no_sandbox(install_kernelspec, start_kernel):
    spares.stop_all()
    name = install_kernelspec("bubblewrap", "spare-c", memory_mib=1300, spare_after_s=0)
    start_kernel(name)
    pool = _pool()
    (cid,) = pool["container_ids"]
    os.kill(pool["pids"][0], signal.SIGKILL)  # the spare sandbox's runtime process
    assert _gone(cid), cid
    replaced = _pool(pool["key"])
    assert replaced["container_ids"] != [cid] and replaced["pid"] == pool["pid"]
    os.kill(replaced["pid"], signal.SIGKILL)  # the pool itself: its sandbox's watchdog reaps it
    assert _gone(replaced["container_ids"][0]), replaced
    assert not [d for d, _ in orphans() if d.name == replaced["container_ids"][0]]
    k = start_kernel(name)  # the next kernel starts cold, and a new pool for its policy
    assert k.sandbox_info()["pooled"] is False
    again = _pool(pool["key"])
    assert again["pid"] != pool["pid"]
    spares.stop_all()
    assert spares.report() == []


def test_a_one_off_kernel_costs_no_spare_and_a_pool_ends_with_its_policys_last_kernel(install_kernelspec):
    spares.stop_all()
    name = install_kernelspec("bubblewrap", "spare-d", memory_mib=1400, spare_after_s=3600, spare_linger_s=2)
    kernels = [Kernel(name)]
    try:
        assert kernels[0].execute("1").status == "ok"
        assert spares.report() == []  # the first kernel of a policy not seen before: no spare yet
        kernels.append(Kernel(name))  # a second kernel of the policy while the first runs: the pool starts
        assert kernels[1].sandbox_info()["pooled"] is False
        pool = _pool()
        kernels.append(Kernel(name))
        assert kernels[2].sandbox_info()["pooled"] is True
        held = pool["container_ids"] + _pool(pool["key"])["container_ids"]  # the spare taken, its replacement
    finally:
        for k in kernels:
            k.shutdown()
    deadline = time.monotonic() + 60  # spare_linger_s (2 s) after the last one, plus the pool's 1 s tick
    while spares.report():
        assert time.monotonic() < deadline, spares.report()
        time.sleep(0.2)
    assert _gone(held[-1]), held  # the pool's spare went with it


def test_a_pool_counts_the_kernels_of_its_policy_by_their_lock(tmp_path, monkeypatch):
    """The hold each kernel takes: seen by the pool while held, by nobody once released
    (or its process gone), and a later kernel within the linger is told one was seen."""
    from sandbox_kernel.backends.local.pool.daemon import kernels_alive
    monkeypatch.setenv("SANDBOX_KERNEL_STATE_DIR", str(tmp_path))
    path = spares.kernels_path("k")
    fd, seen = spares.hold("k", 60.0)
    assert not seen and kernels_alive(path)
    fd2, seen2 = spares.hold("k", 60.0)  # a second kernel of the policy, while the first runs
    assert seen2
    spares.release(fd)
    assert kernels_alive(path)
    spares.release(fd2)
    assert not kernels_alive(path)
    fd3, seen3 = spares.hold("k", 60.0)  # within the linger of the last one's end
    assert seen3
    spares.release(fd3)
    os.utime(path, (time.time() - 120, time.time() - 120))
    fd4, seen4 = spares.hold("k", 60.0)  # long after: a policy not seen lately
    assert not seen4
    child = subprocess.Popen([sys.executable, "-c", "import sys, time; sys.stdin.read()"], stdin=subprocess.PIPE,
                             pass_fds=(fd4,))
    spares.release(fd4)
    assert kernels_alive(path)  # the child's copy of the descriptor holds the lock...
    child.communicate(b"")
    assert not kernels_alive(path)  # ...until its process ends, however it ends
