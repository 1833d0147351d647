"""The kernel's first sandbox started beside the proxy's imports (issue 28: the first kernel
of a bubblewrap policy after a boot), ``backends/local/early.py``.

Real kernels through ``jupyter_client``, real bubblewrap sandboxes: the sandbox started
early is the kernel's, with the kernel's limits and nothing of the proxy's environment;
it is not started when turned off or when a configuration file could give the kernel
other options than its command line, and the kernel's own options then rule; one
started for other options is removed, never adopted.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest
from kernels import Kernel
from sandbox_kernel.backends.local import early
from sandbox_kernel.backends.local.layout import state_base
from sandbox_kernel.prestart import HANDOVER_FD_ENV

pytestmark = pytest.mark.sandbox  # the in-process test starts a sandbox without a kernel fixture

MEMINFO = "print([l.split()[1] for l in open('/proc/meminfo') if l.startswith('MemTotal')][0])"


@pytest.fixture
def early_kernelspec(install_kernelspec) -> str:
    """A bubblewrap kernelspec of its own (no spare pool): each kernel a new proxy process."""
    return install_kernelspec("bubblewrap", "early", memory_mib=600, spare_sandbox=False)


def _start(name: str, **env: str) -> Kernel:
    return Kernel(name, env={**os.environ, "SANDBOX_EARLY_CANARY": "host-secret", **env})


def test_the_first_sandbox_starts_beside_the_proxys_imports_with_the_kernels_limits(early_kernelspec):
    k = _start(early_kernelspec)
    try:
        info = k.sandbox_info()
        assert info["started_early"] is True and info["pooled"] is False, info
        r = k.execute("import os; x = 41; print(os.getuid(), os.environ.get('SANDBOX_EARLY_CANARY'))")
        assert r.status == "ok" and r.stdout == "65534 None\n", r.stdout  # in the sandbox, no host env
        assert k.execute("print(x + 1)").stdout == "42\n"  # state kept: one interpreter
        assert int(k.execute(MEMINFO).stdout) <= 600 * 1024  # the kernel's memory limit, KiB
    finally:
        k.shutdown()


def test_turned_off_the_kernel_starts_its_sandbox_itself(early_kernelspec):
    k = _start(early_kernelspec, **{early.DISABLE_ENV: "0"})
    try:
        assert k.sandbox_info()["started_early"] is False
        assert k.execute("print(6 * 7)").stdout == "42\n"
    finally:
        k.shutdown()


def test_with_a_configuration_file_the_kernels_own_options_rule(install_kernelspec, tmp_path):
    """The proxy's configuration file, which the early start does not read: nothing is
    started early, and the file's memory limit is the one in force."""
    profile = tmp_path / "ipython" / "profile_default"
    profile.mkdir(parents=True)
    (profile / "sandbox_kernel_config.py").write_text("c.SandboxKernel.memory_mib = 400\n")
    # a kernelspec that leaves memory_mib to the configuration (the command line would win)
    k = _start(install_kernelspec("bubblewrap", "early-configured", spare_sandbox=False),
               IPYTHONDIR=str(tmp_path / "ipython"))
    try:
        assert k.sandbox_info()["started_early"] is False
        assert int(k.execute(MEMINFO).stdout) <= 400 * 1024
    finally:
        k.shutdown()


def test_a_sandbox_started_for_other_options_is_removed_not_adopted(monkeypatch, tmp_path):
    """In this process, as the proxy would: a launch for one policy, a claim with another
    key gets nothing and the sandbox (its state directory) is gone."""
    monkeypatch.chdir(tmp_path)  # no configuration file in the working folder
    monkeypatch.setattr(early, "_current", None)
    started = early.begin(["-f", str(tmp_path / "kernel.json"), "--SandboxKernel.backend=local",
                           "--LocalBackend.runtime=bubblewrap", "--LocalBackend.spare_sandbox=False",
                           "--SandboxKernel.memory_mib=300"])
    assert started is not None
    assert started.done.wait(60) and started.key is not None, started.reason
    state_dir = Path(started.info["state_dir"])
    assert state_dir.parent == state_base() and state_dir.is_dir()
    assert asyncio.run(early.claim("another-policy-key")) is None
    assert "other options" in early.last_reason()
    deadline = time.monotonic() + 60
    while state_dir.exists():  # removed by the launch's thread
        assert time.monotonic() < deadline, f"{state_dir} still there"
        time.sleep(0.05)


@pytest.mark.parametrize("argv, options", [
    (["-f", "/r/k.json", "--SandboxKernel.backend=local"], ["--SandboxKernel.backend=local"]),
    (["--f=/r/k.json", "--LocalBackend.runtime=bubblewrap"], ["--LocalBackend.runtime=bubblewrap"]),
    (["-f", "/r/k.json", "--debug"], None),  # anything else: not started early
    (["install", "--user"], None),
    (["-f"], None),
])
def test_only_a_kernels_own_command_line_is_read(argv, options):
    assert early.command_line_options(argv) == options


def test_a_spare_proxy_starts_no_sandbox_before_its_hand_over():
    """``__main__`` names the pre-started proxy's variable without importing it (the import
    is what the early start runs beside)."""
    main = (Path(early.__file__).parents[2] / "__main__.py").read_text()
    assert f'"{HANDOVER_FD_ENV}" not in os.environ' in main


def test_configuration_files_are_found_where_the_proxys_application_reads_them(monkeypatch, tmp_path):
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ip"))
    assert not [f for f in early.config_files(str(tmp_path)) if tmp_path in f.parents]
    kernel_only = tmp_path / "ip" / "profile_default" / "ipython_kernel_config.py"  # the inner kernel's
    kernel_only.parent.mkdir(parents=True)
    kernel_only.write_text("")
    assert kernel_only not in early.config_files(str(tmp_path))
    for folder, name in ((tmp_path / "profile_default", "ipython_config.json"),
                         (tmp_path / "ip" / "profile_default", "sandbox_kernel_config.py")):
        folder.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text("")
        assert folder / name in early.config_files(str(tmp_path))
