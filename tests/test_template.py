"""Start templates (``LocalBackend.start_template``, issue 15): a new gVisor kernel restored
from a checkpoint of a freshly started one.

What a user checks: the second kernel of a policy starts from the template (kernel_info
says so), holds nothing another kernel ran, draws its own random numbers, keeps its own
limits, and the templates are removed by ``sandbox-kernel gc --templates``.  Every cell
runs inside a gVisor sandbox.
"""

from __future__ import annotations

import stat
import subprocess
import sys

import pytest
from sandbox_kernel.backends.local import template

LEAK = "l = []\nwhile True: l.append(bytearray(16 * 1024**2))"
DRAW = "import random, tempfile; print(random.random(), tempfile.mktemp())"


@pytest.fixture
def no_templates():
    """The suite's templates only (a cache: kernels make them again)."""
    template.remove_all()
    yield
    template.remove_all()


def test_a_kernel_starts_from_its_policys_start_template(install_kernelspec, start_kernel, no_templates):
    name = install_kernelspec("gvisor", "template", start_template=True, memory_mib=448, checkpoint_after_s=0)
    first = start_kernel(name)
    assert first.execute("secret = 'only in the first kernel'").status == "ok"
    assert first.sandbox_info()["from_template"] is False
    made = [d for d in template.base_dir().iterdir() if not d.name.startswith(".")]
    assert len(made) == 1 and (made[0] / "image").is_dir() and (made[0] / "ready.bin").is_file()
    assert stat.S_IMODE(template.base_dir().stat().st_mode) == 0o700

    second, third = start_kernel(name), start_kernel(name)
    draws = []
    for k in (second, third):
        info = k.sandbox_info()
        assert info["from_template"] is True and info["container_id"] != first.sandbox_info()["container_id"]
        assert k.execute("secret").ename == "NameError"  # the template holds nothing a user ran
        r = k.execute(DRAW)
        assert r.status == "ok"
        draws.append(r.stdout.split())
    assert draws[0][0] != draws[1][0] and draws[0][1] != draws[1][1]  # reseeded: their own numbers and names
    assert second.execute("x = 1; x + 1").result_text == "2"
    assert third.execute("x").ename == "NameError"  # and their own state from then on

    r = second.execute(LEAK, timeout=180)  # the restored sandbox keeps its own memory limit
    assert r.ename == "SandboxRestarted" and "memory limit 448 MiB exceeded" in r.reply["content"]["evalue"]
    assert third.execute("1 + 1").result_text == "2"
    assert first.execute("secret").result_text == "'only in the first kernel'"

    out = subprocess.run([sys.executable, "-m", "sandbox_kernel", "gc", "--templates"], capture_output=True,
                         text=True, timeout=120)
    assert "removed 1 start template(s)" in out.stdout, out.stdout + out.stderr
    assert not any(template.base_dir().iterdir())


def test_bubblewrap_ignores_start_template(install_kernelspec, start_kernel, no_templates):
    """No checkpoint on bubblewrap: the option changes nothing, every start is a cold one."""
    name = install_kernelspec("bubblewrap", "template", start_template=True)
    for _ in range(2):
        k = start_kernel(name)
        assert k.execute("1 + 1").result_text == "2"
        assert k.sandbox_info()["from_template"] is False
    assert not template.base_dir().exists() or not any(template.base_dir().iterdir())
