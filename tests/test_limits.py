"""Per-sandbox cgroups and OCI limits, exercised on this machine's real cgroup fs.

Every process placed in a test cgroup runs inside bubblewrap or runsc; the
allocation and fork tests run their code only inside the sandbox.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from sandbox_kernel.backends.base import TAG
from sandbox_kernel.backends.local import bwrap, gvisor, layout, runsc
from sandbox_kernel.backends.local import cgroups as limits
from sandbox_kernel.backends.local.cgroups import CgroupError, SandboxCgroup
from sandbox_kernel.policy import Policy

USABLE, WHY = limits.cgroups_usable() if os.path.exists("/proc/self/cgroup") else (False, "no /proc")
pytestmark = pytest.mark.sandbox  # starts sandboxes through LocalSandbox, without a sandbox fixture
needs_cgroups = pytest.mark.skipif(not USABLE, reason=f"cgroups unusable: {WHY}")
needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None or os.geteuid() != 0,
                                 reason="bubblewrap as root needed")
needs_runsc = pytest.mark.skipif(not runsc.have_runsc() or os.geteuid() != 0,
                                 reason="runsc as root needed")

MOUNTINFO_V1 = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
37 31 0:34 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer
39 31 0:36 /ctr /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""
PROC_CGROUP_V1 = """\
8:pids:/ctr/job
6:freezer:/
4:memory:/process_api/abc
1:cpu,cpuacct:/
0::/
"""


def test_detect_layout_resolves_own_cgroup_per_controller():
    layout = limits.detect_layout(PROC_CGROUP_V1, MOUNTINFO_V1)
    assert layout is not None and layout.version == 1
    assert layout.bases == {
        "memory": "/sys/fs/cgroup/memory/process_api/abc",
        "pids": "/sys/fs/cgroup/pids/job",  # mount root /ctr is stripped
        "cpu": "/sys/fs/cgroup/cpu",
        "freezer": "/sys/fs/cgroup/freezer",
    }


def test_detect_layout_none_without_controllers():
    assert limits.detect_layout("0::/\n", "41 31 0:38 / /x rw - cgroup2 cgroup2 rw\n") is None


def test_oci_resources_and_rlimits_follow_policy():
    p = Policy(memory_mib=512, cpu_cores=1.5, pids_max=200)
    res = gvisor.oci_resources(p)
    assert res["memory"] == {"limit": 512 << 20, "swap": 512 << 20}
    assert res["cpu"] == {"quota": 150_000, "period": 100_000}
    assert res["pids"]["limit"] == limits.host_pids_max(p, "gvisor") > 200
    assert gvisor.oci_rlimits(p) == [{"type": "RLIMIT_NPROC", "hard": 200, "soft": 200}]
    assert "cgroupsPath" not in gvisor.oci_linux(p, None)
    assert limits.host_pids_max(p, "bubblewrap") == 200
    assert bwrap.address_space_limit_bytes(p) == (512 + bwrap.ADDRESS_SPACE_HEADROOM_MIB) << 20


# ---------------------------------------------------------------------------
# Real cgroups
# ---------------------------------------------------------------------------


@pytest.fixture
def tmp_path():
    """A state directory where bwrap (as uid 65534) can reach the generated /etc."""
    import tempfile
    d = Path(tempfile.mkdtemp(prefix=f"{TAG}-test-", dir=layout.state_base()))
    os.chmod(d, 0o711)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _read(cg: SandboxCgroup, controller: str, name: str) -> str:
    """One file of the cgroup, as the kernel accounts it."""
    return (cg.paths[controller] / name).read_text().strip()


def _pids_denied(cg: SandboxCgroup) -> int:
    """``fork``/``clone`` calls the pids limit refused (``pids.events``: ``max N``)."""
    return int(dict(line.split() for line in _read(cg, "pids", "pids.events").splitlines())["max"])


@pytest.fixture
def make_cgroup():
    """Create tagged cgroups; the finalizer removes them whatever happens."""
    made: list[SandboxCgroup] = []

    def make(policy: Policy, runtime: str = "bubblewrap") -> SandboxCgroup:
        cg = SandboxCgroup.create(f"{TAG}-test-{uuid.uuid4().hex[:8]}", policy, runtime=runtime)
        made.append(cg)
        return cg

    yield make
    for cg in made:
        cg.remove()
        assert not any(p.exists() for p in cg.paths.values())


@needs_cgroups
def test_create_writes_limits(make_cgroup):
    cg = make_cgroup(Policy(memory_mib=256, cpu_cores=0.5, pids_max=100))
    mem = cg.paths["memory"]
    assert (mem / "memory.limit_in_bytes").read_text().strip() == str(256 << 20)
    if (mem / "memory.memsw.limit_in_bytes").exists():
        assert (mem / "memory.memsw.limit_in_bytes").read_text().strip() == str(256 << 20)
    assert (cg.paths["pids"] / "pids.max").read_text().strip() == "100"
    assert (cg.paths["cpu"] / "cpu.cfs_quota_us").read_text().strip() == "50000"
    assert cg.freezer_state() == "THAWED"
    assert cg.oom_kills() == 0 and _read(cg, "pids", "pids.current") == "0"
    assert cg.relative_path == cg.name and not cg.oom_detected()


@needs_cgroups
def test_create_refuses_bad_or_taken_names(make_cgroup):
    with pytest.raises(CgroupError, match="bad cgroup name"):
        SandboxCgroup.create("../escape", Policy())
    cg = make_cgroup(Policy())
    with pytest.raises(CgroupError, match="cannot set up"):
        SandboxCgroup.create(cg.name, Policy())
    assert all(p.is_dir() for p in cg.paths.values())  # the failed create left ours alone


def test_create_without_cgroups_says_why():
    layout = limits.CgroupLayout(version=2, bases={"": "/nonexistent"})
    with pytest.raises(CgroupError, match="v2 is not supported"):
        SandboxCgroup.create("x", Policy(), layout)


# ---------------------------------------------------------------------------
# bubblewrap processes placed in the cgroup
# ---------------------------------------------------------------------------


def _bwrap(tmp_path: Path, policy: Policy, cg: SandboxCgroup, command: list[str], *,
           rlimit_as: int | None = None) -> subprocess.Popen:
    """Launch ``command`` in bubblewrap with the local backend's own launch
    (:func:`bwrap.prepare_launch`), joined to ``cg``."""
    state = tmp_path  # under layout.state_base(): reachable by uid 65534
    layout.write_etc(state / "etc")
    os.chmod(state / "etc", 0o755)
    launch = bwrap.prepare_launch(policy, layout.host_layout(policy, sys.executable), state, command=command,
                                  cgroup=cg, rlimit_as_bytes=rlimit_as)
    try:
        return subprocess.Popen(launch.argv, pass_fds=launch.pass_fds, preexec_fn=launch.preexec_fn,
                                env={}, cwd="/", stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    finally:
        launch.close()


@needs_cgroups
@needs_bwrap
def test_bwrap_process_joins_freezes_and_is_removed(make_cgroup, tmp_path):
    cg = make_cgroup(Policy())
    proc = _bwrap(tmp_path, Policy(), cg, ["/bin/sleep", "30"])
    try:
        with pytest.raises(subprocess.TimeoutExpired):  # running, not failed to start
            proc.wait(timeout=0.5)
        deadline = time.monotonic() + 5
        while len(cg.pids()) < 2 and time.monotonic() < deadline:  # bwrap + its child
            time.sleep(0.02)
        assert proc.pid in cg.pids() and len(cg.pids()) >= 2
        assert int(_read(cg, "pids", "pids.current")) >= 2
        cg.freeze()
        assert cg.freezer_state() == "FROZEN"
        cg.thaw()
        assert cg.freezer_state() == "THAWED"
    finally:
        cg.remove()  # kills what is inside, then deletes
    assert proc.wait(timeout=5) != 0
    assert not any(p.exists() for p in cg.paths.values())
    cg.remove()  # idempotent


ALLOC = ("b = []\n"
         "try:\n"
         "    for i in range(64): b.append(bytearray(16 << 20))\n"
         "except MemoryError: print('MemoryError at', len(b) * 16, flush=True)\n")


@needs_cgroups
@needs_bwrap
def test_bwrap_memory_breach_is_an_oom_kill(make_cgroup, tmp_path):
    policy = Policy(memory_mib=128)
    cg = make_cgroup(policy)
    proc = _bwrap(tmp_path, policy, cg, [sys.executable, "-c", ALLOC])
    proc.communicate(timeout=60)
    assert proc.returncode == 128 + 9  # bwrap reports its child's SIGKILL
    assert cg.oom_detected() and cg.oom_kills() == 1
    assert int(_read(cg, "memory", "memory.max_usage_in_bytes")) >= (128 << 20) - (1 << 20)
    assert cg.oom_cause() == "memory limit 128 MiB exceeded"


@needs_cgroups
@needs_bwrap
def test_bwrap_address_space_limit_gives_memoryerror(make_cgroup, tmp_path):
    policy = Policy(memory_mib=512)
    cg = make_cgroup(policy)
    proc = _bwrap(tmp_path, policy, cg, [sys.executable, "-c", ALLOC], rlimit_as=300 << 20)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0 and b"MemoryError at" in out
    assert not cg.oom_detected()


@needs_cgroups
@needs_bwrap
def test_bwrap_fork_bomb_hits_pids_limit(make_cgroup, tmp_path):
    policy = Policy(pids_max=64)
    cg = make_cgroup(policy)
    code = ("import os, time\nn = 0\n"
            "try:\n"
            "    for _ in range(500):\n"
            "        if os.fork() == 0:\n"
            "            time.sleep(30); os._exit(0)\n"
            "        n += 1\n"
            "except BlockingIOError: print('EAGAIN after', n, flush=True)\n"
            "os.killpg(0, 9)\n")
    proc = _bwrap(tmp_path, policy, cg, [sys.executable, "-c", code])
    out, _ = proc.communicate(timeout=60)
    assert b"EAGAIN after" in out
    assert _pids_denied(cg) >= 1 and _read(cg, "pids", "pids.peak") == "64"


# ---------------------------------------------------------------------------
# gVisor with a pre-created cgroup
# ---------------------------------------------------------------------------


@needs_cgroups
@needs_runsc
def test_gvisor_uses_precreated_cgroup_and_oom_is_readable(make_cgroup, tmp_path):
    policy = Policy(memory_mib=256)
    cg = make_cgroup(policy, runtime="gvisor")
    host = layout.host_layout(policy, sys.executable)
    layout.write_etc(tmp_path / "etc")
    os.chmod(tmp_path / "etc", 0o755)
    code = "print(open('/proc/meminfo').readline(), flush=True)\n" + ALLOC
    config = gvisor.oci_config(policy, host, etc_dir=str(tmp_path / "etc"), command=[sys.executable, "-c", code])
    config["linux"].update(gvisor.oci_linux(policy, cg))
    config["process"]["rlimits"] += gvisor.oci_rlimits(policy)
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    gvisor.prepare_rootfs(bundle / "rootfs", config, host)
    (bundle / "config.json").write_text(json.dumps(config))
    root = tmp_path / "runsc"
    root.mkdir(mode=0o700)
    cid = cg.name
    choice = runsc.choose()
    base = runsc.runsc_argv(str(root), runsc=choice.path, platform=choice.platform)
    try:
        proc = subprocess.run([*base, "run", "--bundle", str(bundle), cid], capture_output=True,
                              timeout=120, cwd=str(tmp_path), env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})
    finally:
        subprocess.run([*base, "delete", "--force", cid], capture_output=True, timeout=60)
    assert b"MemTotal:         262144 kB" in proc.stdout  # the sentry read our limit
    # ptrace: the host's OOM killer takes the sentry (137); systrap: the allocating process's stub,
    # and the sandbox's init (that process here) exits 1.  Never a MemoryError inside.
    assert proc.returncode == (1 if choice.platform == "systrap" else 137), proc.returncode
    assert b"MemoryError" not in proc.stdout
    assert cg.paths["memory"].is_dir()  # runsc did not delete a cgroup it did not create
    # what LocalBackend.exit_info reports for it
    assert cg.oom_detected() and cg.oom_cause() == "memory limit 256 MiB exceeded"
