"""Fork and rewind of a live gVisor kernel holding 200 MiB of Python objects (issue 30).

One source kernel per sample set: ``fork(k)`` for k = 1, 4 and 8 (each fork's first
``execute_reply`` timed, its memory read, all closed between samples), then a
snapshot and a rewind to it.  How long the source is paused is measured from inside
it: a thread ticking every millisecond records the longest gap between two ticks while
the ``fork_request`` is answered (``runsc checkpoint --leave-running`` stops every task
of the sandbox while the image is written, so the gap is the pause as the kernel's own
code sees it; the proxy keeps no timing of it).

These replace the first slice's ``fork1_first_reply`` and ``fork4_first_reply`` (a source
of about 30 MiB): ``bench/results.json`` keeps those until the next ``--merge`` run, which
keeps only the figures registered.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from bench.figures._registry import Figure, register
from bench.figures.lifecycle import lifecycle_target
from bench.harness import Context

#: Fork counts measured (8 is ``SandboxKernel.forks_max``'s default).
FORK_COUNTS = (1, 4, 8)
#: What the source holds: 204,800 bytes objects of 1 KiB drawn by ``random.randbytes``
#: (incompressible, so the image's size is not flattered by the checkpoint's compression).
STATE_OBJECTS, OBJECT_BYTES = 200 * 1024, 1024
STATE_MIB = STATE_OBJECTS * OBJECT_BYTES // (1 << 20)
FORK_STATE = (f"import random\nxs = [random.randbytes({OBJECT_BYTES}) for _ in range({STATE_OBJECTS})]\n"
              "sum(map(len, xs)) >> 20")
#: The memory limit of the source and of each fork, MiB.  It must hold the source's ~300 MiB
#: (200 MiB of objects, the interpreter, gVisor's Sentry: see ``fork200_source_memory_mib``),
#: and admission must hold the source and 8 forks at once: ``(1 + 8) x memory_mib`` within
#: ``MemTotal - memory_headroom_mib`` (this machine: 24,152 - 1,024 = 23,128 MiB) beside the
#: other sandboxes present.  At 1024: 9,216 MiB, leaving 13,912 MiB (three sandboxes at the
#: default 4096) to whatever else runs; :func:`admit` checks it before the source starts.
FORK_MEMORY_MIB = 1024
#: The ticker run in the source around each fork: the longest gap between two 1 ms sleeps.
TICKER = """\
import threading as _th, time as _t
class _Ticker(_th.Thread):
    def __init__(self):
        super().__init__(daemon=True); self.stop, self.worst = False, 0.0
    def run(self):
        last = _t.monotonic()
        while not self.stop:
            _t.sleep(0.001)
            now = _t.monotonic(); self.worst = max(self.worst, now - last); last = now
_tk = _Ticker(); _tk.start()"""
#: Stops the ticker and says its longest gap, ms (in a fork, its first cell stops the copy's).
TICKER_STOP = "_tk.stop = True; _tk.join(); round(_tk.worst * 1000, 3)"
FIRST_CELL = "_tk.stop = True; len(xs)"


def admit(copies: int) -> dict[str, int]:
    """Refuse now, with the numbers, a run whose source and ``copies`` forks admission
    could not hold (as ``Admission.check`` counts: the memory limits of the sandboxes
    present); what it counted."""
    from sandbox_kernel.backends.local.admission import Admission, host_memory_mib, in_memory_fs, present
    from sandbox_kernel.backends.local.layout import state_base

    adm, base = Admission(), state_base()
    committed = sum(h.holds_mib for h in present(base, in_memory=in_memory_fs(base)) if not h.checkpointed)
    capacity = int((host_memory_mib() - adm.memory_headroom_mib) * adm.memory_overcommit)
    need = (1 + copies) * FORK_MEMORY_MIB
    if committed + need > capacity:
        raise RuntimeError(f"admission cannot hold the source and {copies} forks of {FORK_MEMORY_MIB} MiB "
                           f"({need} MiB) beside the {committed} MiB committed now, of {capacity} MiB")
    return {"admission_capacity_mib": capacity, "committed_before_mib": committed, "fork_need_mib": need}


async def _fork_once(source: Any, k: int, got: dict[str, list[float]]) -> None:
    """``fork(k)`` of ``source`` with its ticker running: the pause, the ``fork_request``'s
    round trip, each fork's first reply (the last one is the sample) and memory."""
    if not (await source.run(TICKER)).ok:
        raise RuntimeError("the ticker did not start in the source")
    await asyncio.sleep(0.2)
    t0 = time.perf_counter()
    args = await source.fork_arguments(k, 300.0)
    got["fork_request_ms"].append((time.perf_counter() - t0) * 1000)
    stop = await source.run(TICKER_STOP)
    if not stop.ok:
        raise RuntimeError(f"the source's ticker: {stop.error}")
    got["fork200_pause"].append(float(stop.text or "nan"))
    forks = [source.forked(a) for a in args]
    try:
        await asyncio.gather(*(f.start_as_fork() for f in forks))
        outs = await asyncio.gather(*(f.run(FIRST_CELL) for f in forks))
        got[f"fork200_{k}_first_reply"].append((time.perf_counter() - t0) * 1000)
        if any(not ex.ok or ex.text != str(STATE_OBJECTS) for ex in outs):
            raise RuntimeError(f"a fork lost its source's state: {[ex.error or ex.text for ex in outs]}")
        if k == max(FORK_COUNTS):
            got["fork200_memory_mib"] += [ex.usage["memory_bytes"] / (1 << 20) for ex in outs
                                       if "memory_bytes" in ex.usage]
    finally:
        await asyncio.gather(*(f.close() for f in forks), return_exceptions=True)


async def _rewind_once(source: Any, got: dict[str, list[float]]) -> None:
    """A snapshot, ``xs`` dropped, the rewind to the snapshot to its first reply (``xs`` back)."""
    snap = await source.snapshot(300.0)
    got["fork200_snapshot_mib"].append(snap.size_mib)
    if not (await source.run("del xs")).ok:
        raise RuntimeError("the destructive cell failed")
    t0 = time.perf_counter()
    await source.restore(snap, 300.0)
    ex = await source.run("len(xs)")
    got["fork200_rewind_first_reply"].append((time.perf_counter() - t0) * 1000)
    if not ex.ok or ex.text != str(STATE_OBJECTS):
        raise RuntimeError(f"the rewind lost the snapshot's state: {ex.error or ex.text}")


def fig_fork(ctx: Context, n: int) -> dict[str, Any]:
    """``n`` samples of each fork count and of a rewind, on one source kernel (see the module)."""
    from sandbox_kernel import AsyncSandbox

    extra = admit(max(FORK_COUNTS))
    target = lifecycle_target(ctx.bench, ctx.target, "fork", 600.0, 0, memory_mib=FORK_MEMORY_MIB,
                              start_template=False)
    names = [f"fork200_{k}_first_reply" for k in FORK_COUNTS] + [
        "fork200_pause", "fork_request_ms", "fork200_memory_mib", "fork200_source_memory_mib",
        "fork200_snapshot_mib", "fork200_rewind_first_reply"]
    got: dict[str, list[float]] = {name: [] for name in names}

    async def go() -> None:
        async with AsyncSandbox(target.kernel_name, start_timeout_s=300) as source:
            built = await source.run(FORK_STATE)
            if not built.ok or built.text != str(STATE_MIB):
                raise RuntimeError(f"the source's state did not build: {built.error or built.text}")
            for _ in range(n):
                for k in FORK_COUNTS:
                    await _fork_once(source, k, got)
                ex = await source.run("pass")
                if "memory_bytes" in ex.usage:
                    got["fork200_source_memory_mib"].append(ex.usage["memory_bytes"] / (1 << 20))
                await _rewind_once(source, got)

    asyncio.run(go())
    extra["memory_mib"] = FORK_MEMORY_MIB
    return {**{k: v for k, v in got.items() if v and k != "fork_request_ms"},
            "_extra": {"fork200_pause": {"fork_request_ms": sorted(round(x, 1) for x in got["fork_request_ms"])},
                       "fork200_1_first_reply": extra}}


_SOURCE = (f"A gVisor kernel (memory_mib={FORK_MEMORY_MIB}, no start template) holding {STATE_MIB} MiB of "
           f"Python objects ({STATE_OBJECTS:,} `random.randbytes({OBJECT_BYTES})`)")
_FIRST = (": from the call of `AsyncSandbox.fork({k})` (the source checkpointed with `runsc checkpoint "
          "--leave-running`, the image handed over, {k} proxies started by jupyter_client, each sandbox "
          "restored from the image and reseeded) to the last fork's first execute_reply (`len(xs)`, "
          "checked), {k} first cells sent side by side; the forks closed between samples.")


def _companion(name: str, title: str, unit: str, note: str) -> None:
    """Register a figure :func:`fig_fork` fills beside ``fork200_1_first_reply``."""
    register(name, Figure(title, unit, None, n=0, n_quick=0, kind="fresh", produced_by="fork200_1_first_reply",
                          targets=("gvisor",), plot=False, note=note))


register("fork200_1_first_reply", Figure(
    "Fork of a 200 MiB kernel: one fork to its first reply", "ms", fig_fork, n=3, n_quick=1, kind="fresh",
    targets=("gvisor",), rounds=1, plot=False, note=_SOURCE + _FIRST.format(k=1)))
for _k in FORK_COUNTS[1:]:
    _companion(f"fork200_{_k}_first_reply", f"Fork of a 200 MiB kernel: {_k} forks to their first replies", "ms",
               _SOURCE + _FIRST.format(k=_k))
_companion("fork200_pause", "Fork of a 200 MiB kernel: the source paused", "ms",
           "Measured inside the source: a thread sleeping 1 ms at a time records the longest gap between "
           "two of its wake-ups while the fork_request is answered (every fork, k = 1, 4, 8); `runsc "
           "checkpoint --leave-running` stops the sandbox's tasks while it writes the image. The "
           "fork_request's round trip (an upper bound: the proxy's checks, the hand-off links) is listed "
           "in the JSON as `fork_request_ms`.")
_companion("fork200_memory_mib", "Fork of a 200 MiB kernel: memory per fork", "MiB",
           "Each of the 8 forks' cgroup memory (`memory.current`: the Sentry, the restored interpreter, "
           "its page cache) after its first cell, from the execute_reply's `sandbox_usage.memory_bytes`.")
_companion("fork200_source_memory_mib", "Fork of a 200 MiB kernel: memory of the source", "MiB",
           "The same reading in the source after its forks, for comparison.")
_companion("fork200_snapshot_mib", "Snapshot of a 200 MiB kernel on disk", "MiB",
           "`Sandbox.snapshot().size_mib`: the image's allocated size on disk (uncompressed where the "
           "snapshots are on a disk, `checkpoint_compression=auto`; random bytes would not compress anyway).")
_companion("fork200_rewind_first_reply", "Rewind of a 200 MiB kernel to its first reply", "ms",
           "A snapshot, then `del xs`, then from the call of `Sandbox.restore(snapshot)` (the sandbox "
           "killed, a new one restored from the image, reseeded, the interpreter settled) to the "
           "execute_reply of `len(xs)` (checked: the objects back).")
