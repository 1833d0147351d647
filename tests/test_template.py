"""Start templates (``LocalBackend.start_template``, issue 15): a new gVisor kernel restored
from a checkpoint of a freshly started one.

What a user checks: the second kernel of a policy starts from the template (kernel_info
says so), holds nothing another kernel ran, draws its own random numbers, keeps its own
limits, and the templates are removed by ``sandbox-kernel gc --templates``.  Every cell
runs inside a gVisor sandbox.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sandbox_kernel.backends.local import template

LEAK = "l = []\nwhile True: l.append(bytearray(16 * 1024**2))"
#: Every entropy-drawn value a copy must not share (guest/agent/interpreter/clone.py ``after_clone``), and the clocks.
DRAW = ("import json, random, tempfile, secrets, uuid, time, multiprocessing, numpy\n"
        "print(json.dumps([time.time(), time.monotonic(), random.random(), tempfile.mktemp(),\n"
        "    float(numpy.random.random()), multiprocessing.current_process().authkey.hex(),\n"
        "    secrets.token_hex(8), str(uuid.uuid4())]))")


@pytest.fixture
def no_templates():
    """The suite's templates only (a cache: kernels make them again)."""
    template.remove_all()
    yield
    template.remove_all()


def test_a_kernel_starts_from_its_policys_start_template(install_kernelspec, start_kernel, no_templates):
    name = install_kernelspec("gvisor", "template", start_template=True, spare_sandbox=False,
                              memory_mib=448, checkpoint_after_s=0)
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
        assert r.status == "ok", r.stdout + r.stderr
        draw = json.loads(r.stdout)
        assert abs(draw[0] - time.time()) < 60  # the wall clock is the host's, not the template's
        later = json.loads(k.execute(DRAW).stdout)
        assert later[1] >= draw[1]  # monotonic never goes backwards in a restored kernel
        draws.append(draw)
    for i in range(2, len(draws[0])):  # random, tempfile, numpy legacy, authkey, secrets, uuid4
        assert draws[0][i] != draws[1][i], i
    assert second.execute("x = 1; x + 1").result_text == "2"
    assert third.execute("x").ename == "NameError"  # and their own state from then on

    r = second.execute(LEAK, timeout=180)  # the restored sandbox keeps its own memory limit
    assert r.ename == "SandboxRestarted" and "memory limit 448 MiB exceeded" in r.reply["content"]["evalue"]
    assert third.execute("1 + 1").result_text == "2"
    assert first.execute("secret").result_text == "'only in the first kernel'"
    # the replacement of second's sandbox starts in the background after its death: wait for
    # it (from the template, still there) before gc removes the template
    assert second.wait_state("running", timeout=120)["from_template"] is True

    out = subprocess.run([sys.executable, "-m", "sandbox_kernel", "gc", "--templates"], capture_output=True,
                         text=True, timeout=120)
    assert "removed 1 start template(s)" in out.stdout, out.stdout + out.stderr
    # what is left are the links of the two restored kernels, alive, until their teardown
    linked = template.base_dir() / template.LINKED
    assert [d.name for d in template.base_dir().iterdir()] == [template.LINKED]
    assert sorted(d.name for d in linked.iterdir()) == sorted(k.sandbox_info()["container_id"]
                                                             for k in (second, third))
    second.shutdown()
    third.shutdown()
    assert not any(linked.iterdir())


def test_a_template_on_another_file_system_restores_and_its_links_go_with_the_kernel(
        install_kernelspec, start_kernel, tmp_path, monkeypatch):
    """Start templates are on by default and kept apart from the state directory (on disk,
    while Debian's /run is a tmpfs): a restore links the image on the template's own file
    system.  Here a real tmpfs holds the templates and the state directory is on disk."""
    tmpl = tmp_path / "templates"
    tmpl.mkdir(mode=0o700)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1G,mode=0700", "tmpfs", str(tmpl)], check=True)
    try:
        monkeypatch.setenv("SANDBOX_KERNEL_TEMPLATE_DIR", str(tmpl))
        name = install_kernelspec("gvisor", "template-xdev", spare_sandbox=False)  # start_template: default
        first = start_kernel(name)
        assert first.execute("1 + 1").result_text == "2"
        assert template.report()["count"] == 1
        second = start_kernel(name)
        info = second.sandbox_info()
        assert info["from_template"] is True
        assert second.execute("import os; os.getpid() > 0").result_text == "True"
        assert [d.name for d in (tmpl / template.LINKED).iterdir()] == [info["container_id"]]
        second.shutdown()
        assert not any((tmpl / template.LINKED).iterdir())
        first.shutdown()
    finally:
        template.remove_all()
        subprocess.run(["umount", str(tmpl)], check=True)


def test_bubblewrap_ignores_start_template(install_kernelspec, start_kernel, no_templates):
    """No checkpoint on bubblewrap: the option changes nothing, every start is a cold one."""
    name = install_kernelspec("bubblewrap", "template", start_template=True)
    for _ in range(2):
        k = start_kernel(name)
        assert k.execute("1 + 1").result_text == "2"
        assert k.sandbox_info()["from_template"] is False
    assert template.report()["count"] == 0 and template.report()["in_use"] == 0


def test_templates_are_bounded_least_recently_used_first(install_kernelspec, start_kernel, no_templates):
    """``start_templates_max``: making one more template removes the least recently used;
    the kernels already running (restored or not) are not affected."""
    a = install_kernelspec("gvisor", "template-a", start_template=True, start_templates_max=1, checkpoint_after_s=0,
                           spare_sandbox=False)
    b = install_kernelspec("gvisor", "template-b", start_template=True, start_templates_max=1, checkpoint_after_s=0,
                           memory_mib=640)

    def kept() -> list[str]:
        return sorted(d.name for d in template.base_dir().iterdir() if not d.name.startswith("."))

    first_a = start_kernel(a)
    assert first_a.execute("x = 'a'").status == "ok"
    key_a = kept()
    second_a = start_kernel(a)
    assert second_a.sandbox_info()["from_template"] is True and len(key_a) == 1

    first_b = start_kernel(b)  # a second policy: its template replaces a's (max 1)
    assert first_b.execute("x = 'b'").status == "ok"
    assert len(kept()) == 1 and kept() != key_a
    third_a = start_kernel(a)
    assert third_a.sandbox_info()["from_template"] is False  # a's was removed: a cold start
    assert third_a.execute("1 + 1").result_text == "2"
    assert kept() == key_a  # and it made a's again, removing b's
    for k, x in ((first_a, "'a'"), (first_b, "'b'")):
        assert k.execute("x").result_text == x
    assert second_a.execute("y = 2; y * 21").result_text == "42"  # restored from a template since removed


def _fake_template(key: str, used_at: float) -> None:
    d = template.base_dir() / key
    d.mkdir(mode=0o700, parents=True)  # find() takes only this user's own 0700 directories
    (d / "image").mkdir()
    (d / "image" / "checkpoint.img").write_bytes(b"image of " + key.encode())
    (d / "ready.bin").write_bytes(b'{"op": "ready"}\n')
    os.utime(d / "ready.bin", (used_at, used_at))


def test_prune_keeps_the_most_recently_used_and_a_linked_image_outlives_its_template(tmp_path, monkeypatch):
    """The file level of the bound (no sandbox): ``touch`` marks a use, ``prune`` removes the
    least recently used, and the hard links a restore reads from survive the removal until
    the restored sandbox's teardown, or until its state directory is found gone."""
    monkeypatch.setenv("SANDBOX_KERNEL_STATE_DIR", str(tmp_path / "state"))
    now = time.time()
    for i, key in enumerate(["old", "mid", "new"]):
        _fake_template(key, now - 300 + 100 * i)
    template.touch("old")  # used just now: the most recent
    found = template.find("mid")
    assert found is not None
    owner = tmp_path / "state" / "sbk-restoring"
    owner.mkdir()
    linked = template.link_image(found, "sbk-restoring", owner)
    assert template.prune(2) == ["mid"]
    assert sorted(d.name for d in template.base_dir().iterdir()) == [template.LINKED, "new", "old"]
    assert (linked / "checkpoint.img").read_bytes() == b"image of mid"  # the restore still reads it
    assert template.find("mid") is None
    with pytest.raises(FileNotFoundError):  # removed before its links were made: a cold start
        template.link_image(found, "sbk-too-late", owner)
    assert [d.name for d in (template.base_dir() / template.LINKED).iterdir()] == ["sbk-restoring"]
    assert template.remove_all() == 2 and linked.is_dir()  # its sandbox lives: the links stay
    owner.rmdir()  # the sandbox's state is gone (its proxy died, or a reboot emptied /run)
    assert template.remove_all() == 0 and not any((template.base_dir() / template.LINKED).iterdir())


def test_templates_outlast_a_reboot_by_default(tmp_path, monkeypatch):
    """Where templates are kept: on disk unless a state directory (or a template directory)
    is chosen, so that the first kernel of a policy after a reboot restores one."""
    for var in ("SANDBOX_KERNEL_TEMPLATE_DIR", "SANDBOX_KERNEL_STATE_DIR", "XDG_CACHE_HOME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert template.base_dir() == template.ROOT_BASE == Path("/var/cache/sandbox-kernel/templates")
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert template.base_dir() == tmp_path / "home" / ".cache" / "sandbox-kernel" / "templates"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert template.base_dir() == tmp_path / "cache" / "sandbox-kernel" / "templates"
    monkeypatch.setenv("SANDBOX_KERNEL_TEMPLATE_DIR", str(tmp_path / "t"))
    assert template.base_dir() == tmp_path / "t"


def test_the_template_key_follows_the_shipped_archives_bytes(tmp_path, monkeypatch):
    """A template made with one agent archive is never resumed with another."""
    from sandbox_kernel import guest
    from sandbox_kernel.backends.local.layout import host_layout
    from sandbox_kernel.policy import Policy

    layout = host_layout(Policy(), sys.executable)
    keys = []
    for content in (b"archive one", b"archive two"):
        archive = tmp_path / f"{len(keys)}.pyz"
        archive.write_bytes(content)
        monkeypatch.setattr(guest, "agent_archive", lambda archive=archive: str(archive))
        template._agent_hash.cache_clear()
        keys.append(template.template_key("base", layout))
    template._agent_hash.cache_clear()
    assert keys[0] != keys[1]
