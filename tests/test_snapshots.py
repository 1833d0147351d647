"""Snapshot and rewind of a live kernel (issue 30, first slice): real gVisor kernels through
``jupyter_client``'s control channel and the agent client.

What a user checks: a rewind brings back the namespace and the files as they were at the
snapshot (after a destructive cell too, and twice to the same snapshot), draws its own
random numbers unless the user seeded ``random``, has the host's wall clock, ends a cell
that ran when the snapshot was taken without showing its output under another cell, and
the refusals (bubblewrap, an unknown id) say why and leave the kernel answering.  Every
cell runs inside a sandbox.
"""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import time

import pytest
from copy_cells import ALL_ANSWERED, ASK_UNDER_LOAD, LISTENER, snapshot_then_rewind_while_printing
from kernels import Kernel, control, kernel_name_for
from sandbox_kernel import Sandbox
from sandbox_kernel.backends.local import snapshots as store
from sandbox_kernel.client import SnapshotError

NOTICE = "rewound to snapshot"


def value(k: Kernel, code: str):
    r = k.execute(code)
    assert r.status == "ok", (r.stdout, r.stderr, r.reply["content"])
    return json.loads(r.stdout)


@pytest.fixture
def gvisor(install_kernelspec, start_kernel) -> Kernel:
    name = install_kernelspec("gvisor", "snapshots", spare_sandbox=False, start_template=False,
                              checkpoint_after_s=0, memory_mib=512)
    return start_kernel(name)


def test_rewind_keeps_the_namespace_and_files_and_redraws_entropy(gvisor):
    k = gvisor
    assert k.execute("x = 1; y = [1, 2]; import random, time, json, os\n"
                     "open('kept.txt', 'w').write('at the snapshot')").status == "ok"
    snap = control(k, "snapshot_request")
    assert snap["status"] == "ok", snap
    s = snap["snapshot"]
    assert set(s) == {"id", "created", "size_mib"} and s["size_mib"] > 0 and "T" in s["created"]
    assert k.execute("x").result_text == "1"  # the kernel went on

    # a destructive cell, then the rewind
    assert k.execute("x = 2; del y; os.remove('kept.txt')").status == "ok"
    assert control(k, "restore_request", {"snapshot_id": s["id"]}) == {"status": "ok", "snapshot": s}
    r = k.execute("print(json.dumps([x, y, open('kept.txt').read()]))")
    assert r.status == "ok", r.reply["content"]
    assert json.loads(r.stdout) == [1, [1, 2], "at the snapshot"]
    assert r.stderr.count(NOTICE) == 1, r.stderr  # told once, on the next cell
    assert NOTICE not in k.execute("x").stderr

    # twice to the same snapshot: the same state, its own random numbers each time
    draws = []
    for _ in range(2):
        assert k.execute("x = 3").status == "ok"
        assert control(k, "restore_request", {"snapshot_id": s["id"]})["status"] == "ok"
        draws.append(value(k, "print(json.dumps([x, random.random()]))"))
    assert draws[0][0] == draws[1][0] == 1
    assert draws[0][1] != draws[1][1]

    # a generator the user seeded continues identically in every rewound copy
    assert k.execute("random.seed(42)").status == "ok"
    seeded = control(k, "snapshot_request")["snapshot"]
    seen = [value(k, "print(json.dumps(random.random()))")]  # what the kernel itself draws next
    for _ in range(2):
        assert control(k, "restore_request", {"snapshot_id": seeded["id"]})["status"] == "ok"
        seen.append(value(k, "print(json.dumps(random.random()))"))
    assert seen[0] == seen[1] == seen[2]

    # the wall clock is the host's after restoring a snapshot taken seconds earlier
    time.sleep(3)
    assert control(k, "restore_request", {"snapshot_id": s["id"]})["status"] == "ok"
    assert abs(value(k, "print(json.dumps(time.time()))") - time.time()) < 1.0

    listed = control(k, "snapshots_request")
    assert listed["status"] == "ok" and [x["id"] for x in listed["snapshots"]] == [s["id"], seeded["id"]]

    # an unknown id: refused with its cause, the kernel untouched
    bad = control(k, "restore_request", {"snapshot_id": "nope"})
    assert bad["status"] == "error" and bad["ename"] == "UnknownSnapshot" and "nope" in bad["evalue"], bad
    assert k.execute("x").result_text == "1"

    [kernel_dir] = [d for d in store.base_dir().iterdir() if (d / s["id"] / "image").is_dir()]
    k.shutdown()
    assert not kernel_dir.exists()  # removed with the kernel


def test_a_listener_answers_after_a_rewind_under_load(gvisor):
    """A TCP listener a cell opened on the sandbox's loopback answers 32 connections at once
    after a rewind to a snapshot taken while it listened (gVisor restores listening sockets)."""
    k = gvisor
    assert k.execute(LISTENER).status == "ok"
    snap = control(k, "snapshot_request")["snapshot"]
    assert k.execute("srv.close()").status == "ok"  # the destructive cell: the listener gone
    assert control(k, "restore_request", {"snapshot_id": snap["id"]})["status"] == "ok"
    r = k.execute(ASK_UNDER_LOAD, timeout=60)
    assert r.status == "ok" and r.stdout == ALL_ANSWERED, (r.stdout, r.stderr)


def test_a_snapshot_taken_while_a_cell_runs(gvisor):
    k = gvisor
    reply = snapshot_then_rewind_while_printing(k, control)
    assert reply["content"]["status"] == "error" and reply["content"]["ename"] == "KernelRewound"

    # the cell of the snapshot was interrupted in the copy: the kernel is idle, and its
    # output (parented to a request no longer tracked) is shown under no other cell
    r = k.execute("print(n > 0)", timeout=60)
    assert r.status == "ok" and r.stdout == "True\n", r.outputs
    assert "tick" not in r.stdout + r.stderr and r.stderr.count(NOTICE) == 1
    time.sleep(1)
    r = k.execute("m = n; import time; time.sleep(0.5); print(n == m)")
    assert r.stdout == "True\n" and "tick" not in r.stderr  # nothing runs on in the background
    while True:  # and no stray output of the old cell reached the frontend meanwhile
        try:
            m = k.kc.get_iopub_msg(timeout=0.2)
        except queue.Empty:
            break
        assert "tick" not in json.dumps(m["content"]), m


def test_a_notebook_snapshots_and_rewinds_with_the_proxys_magics(gvisor, install_kernelspec, start_kernel):
    """``%snapshot``, ``%snapshots``, ``%rewind <id>``: what a JupyterLab user types; answered
    by the proxy (the interpreter never sees them), refusals as the cell's error."""
    k = gvisor
    assert k.execute("df = list(range(5))").status == "ok"
    r = k.execute("%snapshot")
    assert r.status == "ok", r.reply["content"]
    sid = r.stdout.split()[1]
    assert f"%rewind {sid}" in r.stdout and [m["content"]["code"] for m in r.of_type("execute_input")] == ["%snapshot"]
    assert k.execute("df.clear(); print(len(df))").stdout == "0\n"  # the cell that overwrote df
    assert k.execute("%snapshots").stdout.startswith(sid)
    r = k.execute(f"  %rewind {sid}\n")
    assert r.status == "ok" and f"rewound to snapshot {sid}" in r.stdout, r.reply["content"]
    r = k.execute("print(df)")
    assert r.stdout == "[0, 1, 2, 3, 4]\n" and "rewound" not in r.stderr, r.stderr  # said once, by %rewind
    for cell, ename in (("%rewind nope", "UnknownSnapshot"), ("%rewind", "UsageError")):
        r = k.execute(cell)
        assert r.status == "error" and r.ename == ename, r.reply["content"]
        assert [m["content"]["ename"] for m in r.of_type("error")] == [ename]
    # a magic inside a larger cell is the interpreter's own (IPython: no such magic)
    r = k.execute("%snapshot\nx = 1")
    assert r.status == "error" and r.ename == "UsageError" and "snapshot" in r.reply["content"]["evalue"]
    # bubblewrap cannot: the cell's error names the runtime, the kernel answers on
    bw = start_kernel(install_kernelspec("bubblewrap", "snapshot-magic", spare_sandbox=False))
    assert bw.execute("z = 7").status == "ok"
    r = bw.execute("%snapshot")
    assert r.status == "error" and r.ename == "SnapshotUnsupported" and "bubblewrap" in r.reply["content"]["evalue"]
    assert bw.execute("print(z)").stdout == "7\n"


def test_the_client_snapshots_and_restores_and_refusals_say_why(install_kernelspec, kernelspec_prefix):
    name = install_kernelspec("gvisor", "snapshots", spare_sandbox=False, start_template=False,
                              checkpoint_after_s=0, memory_mib=512)
    with Sandbox(name) as sbx:
        sbx.run("df = list(range(5))")
        snap = sbx.snapshot()
        assert snap.id and snap.size_mib > 0
        sbx.run("df.clear()")  # the cell that overwrote df
        assert sbx.restore(snap) == snap
        assert sbx.run("len(df)").text == "5"
        assert [s.id for s in sbx.snapshots()] == [snap.id]
        with pytest.raises(SnapshotError) as err:
            sbx.restore("no-such-snapshot")
        assert err.value.ename == "UnknownSnapshot"
        assert sbx.run("len(df)").text == "5"

    with Sandbox(kernel_name_for("bubblewrap")) as sbx:
        sbx.run("z = 7")
        with pytest.raises(SnapshotError) as err:
            sbx.snapshot()
        assert err.value.ename == "SnapshotUnsupported" and "bubblewrap" in err.value.evalue
        assert "checkpoint" in err.value.evalue
        with pytest.raises(SnapshotError) as err:
            sbx.restore("anything")
        assert err.value.ename == "SnapshotUnsupported" and "bubblewrap" in err.value.evalue
        assert sbx.run("z").text == "7"  # untouched


@pytest.mark.sandbox  # gc reaps and ends spare pools: beside the sandboxes, not in the fast tier
def test_gc_removes_the_snapshots_of_ended_kernels():
    d = store.kernel_dir("gc-test-kernel")
    (d / "abc" / "image").mkdir(parents=True)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True).stdout.strip()
    (d / "owner").write_text(json.dumps({"proxy_pid": int(dead)}))
    out = subprocess.run([sys.executable, "-m", "sandbox_kernel", "gc"], capture_output=True, text=True,
                         timeout=120)
    assert "removed the snapshots of" in out.stdout, out.stdout + out.stderr
    assert not d.exists()


def test_a_snapshot_or_fork_the_disk_cannot_hold_is_refused_naming_the_disk(install_kernelspec):
    """Before any image is written: the disk the snapshots live on, less
    ``LocalBackend.disk_headroom_mib``, must hold the sandbox's memory in use.  An operator's
    headroom past the disk's size makes every image too big: the snapshot and the fork are
    refused with the figures, nothing is kept, and the kernel goes on as it was."""
    name = install_kernelspec("gvisor", "snapshots-disk", spare_sandbox=False, start_template=False,
                              checkpoint_after_s=0, memory_mib=512, disk_headroom_mib=1 << 40)
    with Sandbox(name) as sbx:
        sbx.run("z = 7")
        for verb, ename in ((sbx.snapshot, "SnapshotRefused"), (sbx.fork, "ForkRefused")):
            with pytest.raises(SnapshotError) as err:
                verb()
            assert err.value.ename == ename, err.value
            assert "not enough disk for the snapshot's image" in err.value.evalue, err.value.evalue
            assert "MiB free under" in err.value.evalue and "LocalBackend.disk_headroom_mib" in err.value.evalue
        assert sbx.snapshots() == []
        assert sbx.run("z").text == "7"
