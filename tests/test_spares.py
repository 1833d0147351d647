"""Spare sandboxes on demand (``LocalBackend.spare_sandbox``, issue 28): where no start
template serves (bubblewrap here; rootless gVisor in test_nonroot.py), the first kernel of
a policy starts a spare pool for it, the next kernel takes its started sandbox.

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


def test_the_next_kernel_of_a_policy_takes_the_spare_and_nothing_of_the_first(install_kernelspec, start_kernel):
    spares.stop_all()
    name = install_kernelspec("bubblewrap", "spare-a", memory_mib=1100, spare_sandbox=True)
    first = start_kernel(name)
    assert first.sandbox_info()["pooled"] is False  # the first of its policy: cold
    assert first.execute("secret = 'of the first kernel'").status == "ok"
    pool = _pool()
    assert pool["runtime"] == "bubblewrap" and pool["handed"] == 0
    second = start_kernel(name)
    info = second.sandbox_info()
    assert info["pooled"] is True and info["container_id"] in pool["container_ids"]
    r = second.execute("import os\nprint(globals().get('secret'), os.getuid())")
    assert r.stdout == "None 65534\n", r
    assert _pool(pool["key"])["handed"] == 1  # and the pool started the next spare
    doctor = subprocess.run([sys.executable, "-m", "sandbox_kernel", "doctor", "--json"], capture_output=True,
                            text=True, timeout=300)
    listed = json.loads(doctor.stdout)["spare_pools"]
    assert [p["key"] for p in listed] == [pool["key"]], listed
    other = start_kernel(install_kernelspec("bubblewrap", "spare-b", memory_mib=1200, spare_sandbox=True))
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
    name = install_kernelspec("bubblewrap", "spare-c", memory_mib=1300, spare_sandbox=True)
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
