"""Admission control's arithmetic (fast tier): what counts, what is refused, and the
message.  No sandbox is started: state directories are made by hand."""

from __future__ import annotations

import json
import os
import subprocess
import threading
from pathlib import Path

import pytest
from sandbox_kernel.backends.local import admission as adm
from sandbox_kernel.backends.local.admission import CHECKPOINTED_MARK, Admission, present
from sandbox_kernel.errors import AdmissionRefused


def sandbox(base: Path, name: str, memory_mib: int | None, *, checkpointed: bool = False) -> None:
    d = base / f"sandbox-kernel-{name}"
    d.mkdir()
    tag = {"kernel_id": name, "proxy_pid": 1}
    if memory_mib is not None:
        tag["memory_mib"] = memory_mib
    (d / "tag.json").write_text(json.dumps(tag))
    if checkpointed:
        (d / CHECKPOINTED_MARK).touch()


def host(mib: int):
    return lambda: mib


def test_running_and_frozen_count_their_limit_checkpointed_none_unknown_the_default(tmp_path):
    sandbox(tmp_path, "a", 512)
    sandbox(tmp_path, "b", 1024, checkpointed=True)
    sandbox(tmp_path, "c", None)  # made by an older version: counted at the policy default
    (tmp_path / "jedi-cache").mkdir()  # not a sandbox
    held = {h.name: h.holds_mib for h in present(tmp_path)}
    assert held == {"sandbox-kernel-a": 512, "sandbox-kernel-b": 0, "sandbox-kernel-c": adm.UNKNOWN_MEMORY_MIB}


def test_memory_refusal_names_the_resource_and_the_numbers(tmp_path):
    sandbox(tmp_path, "a", 512)
    sandbox(tmp_path, "b", 512)
    a = Admission(memory_headroom_mib=1000, memory_overcommit=1.0)
    a.check(tmp_path, 76, host_mib=host(2100))  # 1024 + 76 = 1100: fits exactly
    with pytest.raises(AdmissionRefused) as ei:
        a.check(tmp_path, 512, host_mib=host(2100))
    msg = str(ei.value)
    assert "not enough memory on this machine for a sandbox of 512 MiB" in msg
    assert "1024 MiB are committed to 2 running or frozen sandboxes, of 1100 MiB" in msg
    assert "host 2100 MiB - 1000 MiB headroom, x1 overcommit" in msg
    assert "LocalBackend.memory_headroom_mib" in msg
    assert ei.value.details == {"resource": "memory", "need": 512, "available": 76, "unit": "MiB",
                                "committed_mib": 1024, "sandboxes": 2, "host_mib": 2100,
                                "headroom_mib": 1000, "overcommit": 1.0}
    assert ei.value.ename == "AdmissionRefused"


def test_overcommit_scales_the_room_and_zero_turns_the_memory_check_off(tmp_path):
    sandbox(tmp_path, "a", 4096)
    Admission(memory_headroom_mib=0, memory_overcommit=2.0).check(tmp_path, 4096, host_mib=host(4096))
    Admission(memory_headroom_mib=0, memory_overcommit=0).check(tmp_path, 10**6, host_mib=host(1))
    with pytest.raises(AdmissionRefused):
        Admission(memory_headroom_mib=0, memory_overcommit=1.0).check(tmp_path, 1, host_mib=host(4096))


def test_pids_and_disk_refusals(tmp_path):
    with pytest.raises(AdmissionRefused, match=r"not enough process ids .* \(LocalBackend.pids_headroom\)") as ei:
        Admission(pids_headroom=10**9).check(tmp_path, 128, host_mib=host(10**6))
    assert ei.value.details["resource"] == "pids"
    Admission(disk_headroom_mib=10**9).check(tmp_path, 128, host_mib=host(10**6))  # never checkpointed
    with pytest.raises(AdmissionRefused, match=r"not enough disk for this sandbox's checkpoints") as ei:
        Admission(disk_headroom_mib=10**9).check(tmp_path, 128, checkpoint_mib=128, host_mib=host(10**6))
    assert ei.value.details["resource"] == "disk"


def test_reserve_makes_the_commitment_under_the_lock_so_two_cannot_take_the_last_room(tmp_path):
    """Two reservations race for room for one: exactly one gets it (the second sees the
    first's state directory, made under the lock)."""
    a = Admission(memory_headroom_mib=0)
    results: list[str] = []
    barrier = threading.Barrier(2)

    def take(name: str) -> None:
        barrier.wait()
        try:
            a.reserve(tmp_path, 600, lambda: sandbox(tmp_path, name, 600), host_mib=host(1000))
            results.append("ok")
        except AdmissionRefused:
            results.append("refused")

    threads = [threading.Thread(target=take, args=(n,)) for n in ("x", "y")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == ["ok", "refused"]
    assert len(present(tmp_path)) == 1


def test_a_refused_reservation_makes_nothing(tmp_path):
    made = []
    with pytest.raises(AdmissionRefused):
        Admission(memory_headroom_mib=0).reserve(tmp_path, 2000, lambda: made.append(1), host_mib=host(1000))
    assert made == []


def test_host_memory_is_memtotal_or_the_own_cgroup_limit():
    total = adm._meminfo_kib("MemTotal") // 1024
    assert 0 < adm.host_memory_mib() <= total
    assert adm._meminfo_kib("MemTotal", "MemTotal:  2048 kB\nMemFree: 1 kB\n") == 2048


def test_on_a_tmpfs_checkpoint_images_and_start_templates_count_as_memory(tmp_path, monkeypatch):
    """Debian mounts /run, the root state directory, as a tmpfs: files there are memory.
    A real tmpfs: a checkpointed sandbox's 20 MiB image, a 30 MiB template and a kernel's
    10 MiB snapshot beside it are counted, the template once although a restored sandbox
    holds a link to its image."""
    base = tmp_path / "run"
    base.mkdir()
    monkeypatch.setenv("SANDBOX_KERNEL_TEMPLATE_DIR", str(base / "templates"))
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=200M,mode=0700", "tmpfs", str(base)], check=True)
    try:
        sandbox(base, "a", 512)
        sandbox(base, "b", 1024, checkpointed=True)
        (base / "sandbox-kernel-b" / "checkpoint").mkdir()
        (base / "sandbox-kernel-b" / "checkpoint" / "checkpoint.img").write_bytes(os.urandom(20 << 20))
        (base / "templates" / "k" / "image").mkdir(parents=True)
        (base / "templates" / "k" / "image" / "checkpoint.img").write_bytes(os.urandom(30 << 20))
        (base / "templates" / ".linked" / "sandbox-kernel-c" / "image").mkdir(parents=True)
        os.link(base / "templates" / "k" / "image" / "checkpoint.img",
                base / "templates" / ".linked" / "sandbox-kernel-c" / "image" / "checkpoint.img")
        (base / "snapshots" / "kernel-x" / "snap" / "image").mkdir(parents=True)  # a kernel's snapshot
        (base / "snapshots" / "kernel-x" / "snap" / "image" / "pages.img").write_bytes(os.urandom(10 << 20))
        assert adm.in_memory_fs(base) and not adm.in_memory_fs(tmp_path)
        assert {h.name: h.holds_mib for h in present(base, in_memory=True)} == {
            "sandbox-kernel-a": 512, "sandbox-kernel-b": 20}
        a = Admission(memory_headroom_mib=0)
        a.check(base, 1000 - 512 - 60, host_mib=host(1000))  # fits exactly
        with pytest.raises(AdmissionRefused) as ei:
            a.check(base, 1000 - 512 - 60 + 1, host_mib=host(1000))
        assert ("572 MiB are committed to 1 running or frozen sandboxes (60 MiB of them checkpoint images "
                f"and start templates on a tmpfs: 20 MiB in {base}, 30 MiB in {base / 'templates'}, "
                "10 MiB of snapshots and fork hand-offs beside them)") in str(ei.value)
        assert ei.value.details["files_mib"] == 60
    finally:
        subprocess.run(["umount", str(base)], check=True)
