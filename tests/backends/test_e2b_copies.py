"""Snapshot, rewind and fork of a kernel on E2B (issue 30), through the real ``e2b`` SDK.

The E2B emulation here stands a gVisor sandbox for each microVM, with envd inside it
(:mod:`tests.emulators.e2b_gvisor_vm`), so E2B's ``fork(count)``, ``create_snapshot`` and a
sandbox created from a snapshot copy the running processes as E2B documents: the copy's
command streams are dropped (the kernel reattaches to its agent by pid) and the source is
briefly paused, its own streams dropped too (its relay reattaches and replays).  What a
user checks, through the agent client and ``jupyter_client``: the namespace and files kept,
copies independent, entropy redrawn while a user's seed continues, a rewind after a
destructive cell, E2B's snapshots deleted with the kernel and forks nobody started
killed, and on the bubblewrap emulation (which cannot copy a process) a refusal that
leaves the kernel untouched.  Every cell runs inside a sandbox.
"""

from __future__ import annotations

import json

import pytest
from copy_cells import ALL_ANSWERED, ASK_UNDER_LOAD, LISTENER, snapshot_then_rewind_while_printing
from kernels import Kernel, control
from sandbox_kernel import Sandbox

pytest.importorskip("e2b_code_interpreter")

SETUP = ("import json, os, random, secrets, uuid\n"
         "x = {'a': 1}\n"
         "open('f.txt', 'w').write('source')\n"
         "rng = random.Random(42); rng.random()\n"
         "random.random()")
PROBE = ("print(json.dumps([x, open('f.txt').read(), rng.random(), random.random(), str(uuid.uuid4()), "
         "secrets.token_hex(8)]))")


@pytest.fixture
def e2b_spec(kernelspec_prefix):
    from sandbox_kernel.kernelspec import install

    def _install(variant: str, **options) -> str:
        name = f"sandbox-test-e2b-{variant}"
        install(name, backend="e2b", options=options, prefix=kernelspec_prefix)
        return name

    return _install


def _values(sbx: Sandbox, code: str) -> list:
    ex = sbx.run(code)
    assert ex.error is None, ex.error
    return json.loads(ex.stdout)


def test_e2b_forks_keep_the_state_are_independent_and_draw_their_own_entropy(e2b_gvisor_emulator, e2b_spec):
    emu = e2b_gvisor_emulator.emu
    with Sandbox(e2b_spec("fork")) as source:
        assert source.info().raw["snapshots"]["fork"] is True
        source.run(SETUP)
        assert source.run(LISTENER).error is None
        forks = source.fork(2)
        try:
            assert emu.copies["fork"] == 1 and len(forks) == 2
            infos = [f.info().raw for f in forks]
            ids = {i["sandbox_id"] for i in infos} | {source.info().raw["sandbox_id"]}
            assert len(ids) == 3 and infos[0]["fork_of"]["source_kernel"]
            runs = [s.run(PROBE) for s in (source, *forks)]
            assert all(r.error is None for r in runs), [r.error for r in runs]
            seen = [json.loads(r.stdout) for r in runs]
            for r in runs[1:]:
                assert r.stderr.count("this kernel is fork") == 1, r.stderr
            for v in seen:
                assert v[:2] == [{"a": 1}, "source"], v
            assert seen[0][2] == seen[1][2] == seen[2][2]  # the user's Random(42) continues identically
            for col in (3, 4, 5):  # random, uuid4, secrets: each copy its own
                assert len({v[col] for v in seen}) == 3, [v[col] for v in seen]
            for sbx in (source, *forks):  # the listener, restored with each copy, answers under load
                ex = sbx.run(ASK_UNDER_LOAD)
                assert ex.error is None and ex.stdout == ALL_ANSWERED, (ex.error, ex.stdout)
            # a thread started before a fork prints on in that fork, under the cell running there
            source.run("import sys, threading, time\n_stop = threading.Event()\ndef _tick():\n"
                       "    while not _stop.is_set():\n"
                       "        sys.stdout.write('tick\\n'); sys.stdout.flush(); time.sleep(0.2)\n"
                       "_ticker = threading.Thread(target=_tick, daemon=True)\n_ticker.start()")
            [ticking] = source.fork()
            try:
                for sbx in (source, ticking):
                    assert sbx.run("time.sleep(1.5)").stdout.count("tick") >= 3
            finally:
                ticking.close()
            # stopped before the cells below read their stdout: ipykernel parents a thread's
            # output to the cell running, so a tick would land in it
            assert source.run("_stop.set(); _ticker.join()").error is None
            forks[0].run("x['a'] = 'fork0'")
            assert _values(source, "print(json.dumps(x))") == {"a": 1}
            assert _values(forks[1], "print(json.dumps(x))") == {"a": 1}
            # the source's stream, dropped by the fork, was reattached: output flows as before
            assert source.run("for i in range(2000): print(i)").stdout == "".join(f"{i}\n" for i in range(2000))
        finally:
            for f in forks:
                f.close()
    assert not emu.vms  # the source and both forks ended with their kernels


def test_e2b_rewind_after_a_destructive_cell_and_snapshots_deleted_with_the_kernel(e2b_gvisor_emulator, e2b_spec):
    emu = e2b_gvisor_emulator.emu
    with Sandbox(e2b_spec("rewind")) as sbx:
        sbx.run("import random\ndf = list(range(5)); token = random.random()")
        snap = sbx.snapshot()
        assert emu.copies["snapshot"] == 1 and len(emu.snapshots) == 1
        sbx.run("df.clear(); open('/home/user/later.txt', 'w').write('x')")
        assert _values(sbx, "import json; print(json.dumps(df))") == []
        sbx.restore(snap)
        assert emu.copies["restore"] == 1
        r = sbx.run("import os, json; print(json.dumps([df, os.path.exists('/home/user/later.txt'), token]))")
        assert r.error is None and "rewound" in r.stderr.lower(), (r.error, r.stderr)
        df, later, token = json.loads(r.stdout)
        assert df == [0, 1, 2, 3, 4] and later is False
        assert sbx.run("1 + 1").text == "2"
    assert not emu.snapshots and not emu.vms  # E2B's snapshot deleted with the kernel


def test_e2b_copies_refused_by_the_bubblewrap_emulation_leave_the_kernel_untouched(e2b_emulator, e2b_spec):
    """The bubblewrap emulation cannot copy a process and says so (as an E2B error would):
    the kernel names E2B's answer and goes on, same interpreter, same variables."""
    k = Kernel(e2b_spec("refused"))
    try:
        assert k.execute("import os\nz, pid = 7, os.getpid()").status == "ok"
        snaps = k.sandbox_info()["snapshots"]
        assert snaps["snapshot"] and snaps["restore"] and snaps["fork"], snaps
        for msg_type, content in (("snapshot_request", {}), ("fork_request", {"n": 1})):
            r = control(k, msg_type, content)
            assert r["status"] == "error" and r["ename"] == "SnapshotFailed", r
            assert "E2B failed to" in r["evalue"] and "cannot copy a process" in r["evalue"], r
        r = control(k, "restore_request", {"snapshot_id": "s1"})
        assert r["ename"] == "UnknownSnapshot", r
        assert k.execute("print(z, os.getpid() == pid)").stdout == "7 True\n"  # untouched
    finally:
        k.shutdown()


def test_a_copys_stream_is_read_from_its_first_whole_frame():
    """A copy's stream attached mid-line (the cell of then still printing) starts at its first
    whole frame: the line cut in two is dropped, a frame still arriving at the end is kept."""
    from sandbox_kernel.backends.e2b_copies import from_first_frame
    from sandbox_kernel.protocol import encode_frame

    one, two = encode_frame({"op": "stream", "seq": 7}), encode_frame({"op": "pong", "seq": 8})
    assert from_first_frame(one[5:] + two) == two
    assert from_first_frame(b'{"op":"str' + b"\n" + two + one[:9]) == two + one[:9]
    assert from_first_frame(one + two) == one + two
    assert from_first_frame(b'","seq":3}\n' + one[:4]) == one[:4]
    assert from_first_frame(b"") == b""


def test_e2b_a_snapshot_taken_while_a_cell_prints_rewinds_to_an_idle_kernel(e2b_gvisor_emulator, e2b_spec):
    """Through ``jupyter_client``: a snapshot of a kernel whose cell prints five times a second
    (the copy's agent writes while the rewound kernel attaches to it), then a rewind: the cell
    is ended with ``KernelRewound``, the copy's cell of then interrupted, its output shown under
    no later cell, and the next cell runs at once with the state of the snapshot."""
    k = Kernel(e2b_spec("busy"))
    try:
        reply = snapshot_then_rewind_while_printing(k, control)
        assert reply["content"]["status"] == "error" and reply["content"]["ename"] == "KernelRewound"
        r = k.execute("print(n > 0)", timeout=60)
        assert r.status == "ok" and r.stdout == "True\n" and "tick" not in r.stdout, (r.stdout, r.stderr)
        assert "rewound" in r.stderr.lower(), r.stderr
        assert k.execute("m = n; time.sleep(0.5); print(n == m)").stdout == "True\n"  # interrupted in the copy
    finally:
        k.shutdown()
