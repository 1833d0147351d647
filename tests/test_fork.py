"""Fork of a live kernel (issue 30): real gVisor kernels through the agent client and
``jupyter_client``'s control channel.

What a user checks: each fork is a kernel of its own (its own proxy, connection file and
key, and sandbox) that starts with its source's namespace, modules and files; forks are
independent of each other and of their source; values drawn from entropy differ across
them (``random``, ``uuid4``, ``secrets``) while a generator the user seeded continues
identically in each; the source goes on; the images handed over are gone once the forks
took them; the refusals (bubblewrap, a bad ``n``, admission) say why and leave the kernel
answering.  Every cell runs inside a sandbox.
"""

from __future__ import annotations

import asyncio
import json
import queue
import time

import pytest
from copy_cells import ALL_ANSWERED, ASK_UNDER_LOAD, LISTENER
from kernels import Kernel, control, kernel_name_for
from sandbox_kernel import AsyncSandbox, Sandbox
from sandbox_kernel.backends.local import snapshots as store
from sandbox_kernel.client import SnapshotError

SETUP = ("import json, os, random, secrets, uuid\nimport numpy as np; np.random.random()\n"
         "x = {'a': 1}\n"
         "open('f.txt', 'w').write('source')\n"
         "rng = random.Random(42); rng.random()\n"
         "random.random()")
#: What each copy draws: its namespace, file, the user's generator, and entropy.
PROBE = ("print(json.dumps([x, open('f.txt').read(), rng.random(), random.random(), str(uuid.uuid4()), "
         "secrets.token_hex(8), np.random.random(), np.random.default_rng().random()]))")


def _values(sbx: Sandbox, code: str) -> list:
    ex = sbx.run(code)
    assert ex.error is None, ex.error
    return json.loads(ex.stdout)


def _handoffs(source_kernel: str) -> list[str]:
    d = store.kernel_dir(source_kernel)
    return sorted(p.name for p in d.glob("fork-*")) if d.is_dir() else []


def test_forks_keep_the_state_are_independent_and_draw_their_own_entropy(install_kernelspec):
    name = install_kernelspec("gvisor", "snapshots", spare_sandbox=False, start_template=False,
                              checkpoint_after_s=0, memory_mib=512)
    with Sandbox(name) as source:
        assert source.info().raw["snapshots"]["fork"] is True
        source.run(SETUP)
        forks = source.fork(2)
        try:
            assert len(forks) == 2
            infos = [f.info().raw for f in forks]
            assert len({i["container_id"] for i in infos} | {source.info().raw["container_id"]}) == 3
            fork_of = infos[0]["fork_of"]
            assert fork_of["fork_id"] == infos[1]["fork_of"]["fork_id"] and fork_of["source_kernel"]
            assert _handoffs(fork_of["source_kernel"]) == []  # every hand-off taken and removed

            runs = [s.run(PROBE) for s in (source, *forks)]
            assert all(r.error is None for r in runs), [r.error for r in runs]
            seen = [json.loads(r.stdout) for r in runs]
            for r in runs[1:]:  # each fork's first cell is told where it came from, once
                assert r.stderr.count(f"this kernel is fork {fork_of['fork_id']}") == 1, r.stderr
            assert "fork" not in runs[0].stderr + forks[0].run("1").stderr
            for v in seen:  # the namespace and the files of the source, in each copy
                assert v[:2] == [{"a": 1}, "source"], v
            assert seen[0][2] == seen[1][2] == seen[2][2]  # the user's Random(42) continues identically
            for col in (3, 4, 5, 6, 7):  # random, uuid4, secrets, numpy's generators: each copy its own
                assert len({v[col] for v in seen}) == 3, [v[col] for v in seen]

            # a thread the source started runs on in each copy (its state moves there too), and
            # what it prints reaches each kernel's frontend: under the cell running meanwhile
            source.run("import threading, time\nticks = [0]\n_stop = threading.Event()\ndef tick():\n"
                       "    while not _stop.is_set():\n"
                       "        ticks[0] += 1; time.sleep(0.02)\n        if ticks[0] % 10 == 0: print('tick', flush=True)\n"
                       "_ticker = threading.Thread(target=tick, daemon=True)\n_ticker.start()")
            [threaded] = source.fork()
            try:
                for s in (source, threaded):
                    ex = s.run("a = ticks[0]; time.sleep(0.6); print(json.dumps(ticks[0] > a))")
                    assert ex.error is None and "true\n" in ex.stdout and "tick\n" in ex.stdout, ex.stdout
            finally:
                threaded.close()
            # stopped before the cells below read their stdout: ipykernel parents a thread's
            # output to the cell running, so a tick would land in it
            assert source.run("_stop.set(); _ticker.join()").error is None

            # independent: a write in one fork is seen in no other copy
            forks[0].run("x['a'] = 100; open('f.txt', 'w').write('fork 0')")
            assert _values(forks[0], "print(json.dumps([x['a'], open('f.txt').read()]))") == [100, "fork 0"]
            for s in (source, forks[1]):
                assert _values(s, "print(json.dumps([x['a'], open('f.txt').read()]))") == [1, "source"]
        finally:
            for f in forks:
                f.close()

        # random.seed(42) / np.random.seed(42) then draws: the generators the user seeded continue
        source.run("random.seed(42); random.random(); np.random.seed(42); np.random.random()")
        [fork] = source.fork()
        try:
            probe = "print(json.dumps([random.random(), random.random(), np.random.random()]))"
            assert _values(fork, probe) == _values(source, probe)
        finally:
            fork.close()


def test_a_listener_a_cell_opened_answers_in_the_source_and_every_fork_under_load(install_kernelspec):
    """A TCP listener a cell opened on the sandbox's loopback (served by a thread) is restored
    with each fork (gVisor's restore keeps listening sockets): 32 connections at once from 8
    threads, in the source and in each of two forks, all answered by that copy's interpreter."""
    name = install_kernelspec("gvisor", "snapshots", spare_sandbox=False, start_template=False,
                              checkpoint_after_s=0, memory_mib=512)
    with Sandbox(name) as source:
        assert source.run(LISTENER).error is None
        forks = source.fork(2)
        try:
            for sbx in (source, *forks):
                ex = sbx.run(ASK_UNDER_LOAD)
                assert ex.error is None and ex.stdout == ALL_ANSWERED, (ex.error, ex.stdout)
        finally:
            for f in forks:
                f.close()


def test_a_fork_of_a_kernel_running_a_cell_answers_its_first_cell_at_once(install_kernelspec):
    """The source's running cell is interrupted in the copy and its end awaited before the
    fork's first request: a cell sent the moment the fork is up runs (never aborted behind
    the interrupted one), and the source's cell runs on in the source."""
    name = install_kernelspec("gvisor", "snapshots", spare_sandbox=False, start_template=False,
                              checkpoint_after_s=0, memory_mib=512)

    async def scenario() -> None:
        async with AsyncSandbox(name) as source:
            await source.run("import time\nn = 0")
            job = await source.submit("print('started', flush=True)\nwhile True:\n    n += 1; time.sleep(0.05)")
            while "started" not in job.execution.stdout:  # the cell runs in the source
                assert not await job.wait(0.05), job.execution.error
            [fork] = await source.fork()
            try:
                ex = await fork.run("print(n > 0)")  # the first cell, at once
                assert ex.error is None and ex.stdout == "True\n", (ex.error, ex.stdout)
                assert (await fork.run("m = n; time.sleep(0.3); print(n == m)")).stdout == "True\n"  # ended there
                assert not job.done()  # the source's cell runs on
            finally:
                await fork.close()
            await source.interrupt()
            assert await job.wait(60) and job.execution.error.ename == "KeyboardInterrupt"

    asyncio.run(scenario())


#: A cell that runs on through the first two interrupts it hears (``heard``), and ends at the third.
SWALLOWS_TWO = ("import signal, time\nheard = []\n"
                "def swallow(signum, frame):\n    heard.append(signum)\n"
                "    if len(heard) > 2:\n        raise KeyboardInterrupt\n"
                "signal.signal(signal.SIGINT, swallow)\nprint('started', flush=True)\n"
                "while True:\n    n += 1; time.sleep(0.05)")


def test_a_fork_of_a_cell_that_outlives_the_first_interrupt_ends_that_cell_there_too(install_kernelspec):
    """The copy's one interrupt can be lost: the image may be taken after a cell was sent and
    before it began (ipykernel ignores SIGINT between requests), or while the cell ignores
    or swallows SIGINT, as here.  The sandbox's agent interrupts the cell of before again until it
    ends, so the fork's first cell runs (not behind a cell nobody sees) and the cell runs on
    in the source only."""
    name = install_kernelspec("gvisor", "snapshots", spare_sandbox=False, start_template=False,
                              checkpoint_after_s=0, memory_mib=512)

    async def scenario() -> None:
        async with AsyncSandbox(name) as source:
            await source.run("import signal, time\nn = 0")
            job = await source.submit(SWALLOWS_TWO)
            while "started" not in job.execution.stdout:
                assert not await job.wait(0.05), job.execution.error
            [fork] = await source.fork()
            try:
                ex = await asyncio.wait_for(fork.run("m = n; time.sleep(0.3); print(n == m, len(heard))"), 120)
                # ended there, by the third interrupt: the fork's own, then the agent's two more
                assert ex.error is None and ex.stdout == "True 3\n", (ex.error, ex.stdout)
                assert not job.done()  # the source's cell runs on, no interrupt heard
            finally:
                await fork.close()
            for _ in range(3):  # the source's own cell swallows two as well
                await source.interrupt()
                if await job.wait(2):
                    break
            assert job.done() and job.execution.error.ename == "KeyboardInterrupt", job.execution.error

    asyncio.run(scenario())


#: A thread printing its copy's label (set by each copy's cells) every 0.3 s (more often,
#: jupyter_client's ``wait_for_ready``, which reads IOPub until 0.2 s pass without a message,
#: would wait as long as it prints).
TICKER = ("import sys, threading, time\nlabel = ['source']\ndef tick():\n    while True:\n"
          "        sys.stdout.write(f'tick {label[0]}\\n'); sys.stdout.flush(); time.sleep(0.3)\n"
          "threading.Thread(target=tick, daemon=True).start()\ntime.sleep(0.3)")


def _ticks(k: Kernel, seconds: float) -> list[tuple[str, str | None]]:
    """The lines ``k``'s frontend gets on IOPub in ``stream`` messages for ``seconds``:
    (text, parent msg_id or None)."""
    got: list[tuple[str, str | None]] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            m = k.kc.get_iopub_msg(timeout=0.1)
        except queue.Empty:
            continue
        if m["msg_type"] == "stream":
            got += [(line, m["parent_header"].get("msg_id")) for line in m["content"]["text"].splitlines()]
    return got


def test_a_thread_printing_when_forked_prints_in_the_source_and_in_each_fork(install_kernelspec):
    """Through ``jupyter_client``: a thread a cell started before the fork prints on in the
    source (under its last cell, as ipykernel parents a thread's output) and in the fork, where
    no cell of its frontend ran yet: with no parent (as ipykernel before any request), then
    under the fork's own cell.  Also when the source was running a cell at the fork (that
    cell's end in the copy is awaited, its output dropped; the thread's goes on)."""
    name = install_kernelspec("gvisor", "snapshots", spare_sandbox=False, start_template=False,
                              checkpoint_after_s=0, memory_mib=512)
    source = Kernel(name)
    try:
        last = source.execute(TICKER).reply["parent_header"]["msg_id"]
        for busy in (False, True):
            running = None
            if busy:  # a cell runs in the source at the fork; the thread prints beside it
                running = source.kc.execute("sys.stdout.write('busy\\n')\nwhile True: time.sleep(0.05)")
                deadline = time.monotonic() + 60
                while not any(t == "busy" for t, _ in _ticks(source, 0.2)):
                    assert time.monotonic() < deadline, "the source's cell did not start"
            r = control(source, "fork_request", {"n": 1})
            assert r.get("status") != "error", r
            fork = Kernel(name, extra_arguments=r["forks"][0]["extra_arguments"])
            try:
                assert fork.sandbox_info()["fork_of"]
                before = _ticks(fork, 1.5)  # no cell of the fork's yet: with no parent, never dropped
                assert before and set(before) == {("tick source", None)}, (busy, before)
                cell = fork.execute("label[0] = 'fork'; time.sleep(1)")
                assert cell.status == "ok" and "tick fork" in cell.stdout, cell.stdout
                after = _ticks(fork, 1)  # the fork's cell ended: under it, as in a stock ipykernel
                assert after and all(p == cell.reply["parent_header"]["msg_id"] for _, p in after), after
                assert "busy" not in cell.stdout and not any(t == "busy" for t, _ in before + after)
            finally:
                fork.shutdown()
            if running is not None:  # the source's cell ran on, the thread beside it, under it
                assert {p for t, p in _ticks(source, 1) if t == "tick source"} == {running}
                source.km.interrupt_kernel()
            else:  # the source's thread prints on under its last cell
                seen = _ticks(source, 1)
                assert seen and set(seen) == {("tick source", last)}, (last, seen)
    finally:
        source.shutdown()


def test_refusals_name_their_cause_and_leave_the_kernel_untouched(install_kernelspec):
    # memory_mib=4096: 8 forks (the bound) ask 32 GiB, more than admission can give here
    name = install_kernelspec("gvisor", "forks-big", spare_sandbox=False, start_template=False,
                              checkpoint_after_s=0, memory_mib=4096)
    k = Kernel(name)
    try:
        assert k.execute("z = 7").status == "ok"
        for n, words in ((0, "1 to 8"), (9, "forks_max"), ("2", "1 to 8"), (8, "admission")):
            r = control(k, "fork_request", {"n": n})
            assert r["status"] == "error" and r["ename"] == "ForkRefused" and words in r["evalue"], r
        assert "memory" in control(k, "fork_request", {"n": 8})["evalue"]
        assert k.execute("z").result_text == "7"
        source = k.sandbox_info()["container_id"].split("-")[1]
        assert not any(p.name.startswith(source) and _handoffs(p.name) for p in store.base_dir().glob("*"))
    finally:
        k.shutdown()

    with Sandbox(kernel_name_for("bubblewrap")) as sbx:
        sbx.run("z = 7")
        snaps = sbx.info().raw["snapshots"]
        assert snaps["fork"] is False and "bubblewrap" in snaps["fork_why_not"]
        with pytest.raises(SnapshotError) as err:
            sbx.fork(2)
        assert err.value.ename == "SnapshotUnsupported" and "bubblewrap" in err.value.evalue
        assert "cannot fork" in err.value.evalue
        assert sbx.run("z").text == "7"  # untouched
