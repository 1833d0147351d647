"""Fork of a live gVisor kernel (issue 30): ``Sandbox.fork(n)`` to the forks' first replies."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from bench.figures._registry import Figure, register
from bench.figures.lifecycle import lifecycle_target
from bench.harness import Context

#: The forks' memory limit, MiB: the source and 4 forks fit admission beside other kernels.
FORK_MEMORY_MIB = 1024
#: What the source holds when forked (a few MiB of Python objects and numpy imported).
FORK_STATE = "import numpy as np\nxs = [str(i) * 8 for i in range(200_000)]\na = np.arange(1_000_000)"


def fig_fork(ctx: Context, n: int) -> dict[str, Any]:
    """``n`` samples each of a fork of one kernel and of four: from the call of
    ``Sandbox.fork(k)`` to the first ``execute_reply`` of each fork (``len(xs)``, checked),
    the four first cells sent side by side; the forks closed between samples."""
    from sandbox_kernel import Sandbox

    target = lifecycle_target(ctx.bench, ctx.target, "fork", 600.0, 0, memory_mib=FORK_MEMORY_MIB,
                              start_template=False)
    got: dict[str, list[float]] = {"fork1_first_reply": [], "fork4_first_reply": []}
    with Sandbox(target.kernel_name) as source:
        if not source.run(FORK_STATE).ok:
            raise RuntimeError("the source's state did not build")
        for _ in range(n):
            for k, name in ((1, "fork1_first_reply"), (4, "fork4_first_reply")):
                t0 = time.perf_counter()
                forks = source.fork(k)
                try:
                    with ThreadPoolExecutor(k) as pool:
                        outs = list(pool.map(lambda f: f.run("len(xs)"), forks))
                    got[name].append((time.perf_counter() - t0) * 1000)
                    if any(not ex.ok or ex.text != "200000" for ex in outs):
                        raise RuntimeError(f"a fork lost its source's state: {[ex.error for ex in outs]}")
                finally:
                    for f in forks:
                        f.close()
        image_mib = source.snapshot().size_mib  # what one fork's image takes on disk
    return {**got, "_extra": {"fork1_first_reply": {"image_mib": image_mib, "memory_mib": FORK_MEMORY_MIB}}}


_NOTE = (f"A gVisor kernel (memory_mib={FORK_MEMORY_MIB}, no start template) holding about 30 MiB "
         "of Python objects and numpy: from the call of `Sandbox.fork(k)` (the source checkpointed, "
         "the image handed over, k proxies started by jupyter_client, each sandbox restored and "
         "reseeded) to the last fork's first execute_reply (`len(xs)`, checked); the forks closed "
         "between samples.")
register("fork1_first_reply", Figure(
    "Fork: one fork to its first reply", "ms", fig_fork, n=10, n_quick=3, kind="fresh",
    targets=("gvisor",), rounds=1, plot=False, note=_NOTE))
register("fork4_first_reply", Figure(
    "Fork: four forks to their first replies", "ms", None, n=0, n_quick=0, kind="fresh",
    produced_by="fork1_first_reply", targets=("gvisor",), plot=False, note=_NOTE))
