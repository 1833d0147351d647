"""The soak and chaos run, short (issue 16): two live kernels per local runtime, one quiet
and one taking every fault of ``bench/chaos.py`` in turn (and going idle once:
frozen on bubblewrap, checkpointed on gVisor, its state kept).

For every fault the affected cell ends with an error naming the cause (never a hang:
``bench.chaos.FAULT_DEADLINE_S`` bounds it) and the kernel answers the next cell; the
quiet kernels lose no output byte and no cell; after shutdown no state directory,
cgroup or process is left and ``gc --dry-run`` finds nothing.  No timing is asserted:
the figures are ``python -m bench.soak``'s.
"""

from __future__ import annotations

from bench.soak import run


def test_every_fault_is_told_and_survived_and_nothing_is_lost_or_left():
    r = run(kernels=4, quiet_s=3, memory_mib=512, admit_memory_mib=0)
    not_survived = [f for f in r["faults"] if not f["survived"]]
    assert not_survived == [], not_survived
    names = {(f["fault"], f["runtime"]) for f in r["faults"]}
    assert ("sigkill-gofer", "gvisor") in names and ("sigkill-bwrap", "bubblewrap") in names
    assert ("frontend-restart", "gvisor") in names and ("frontend-restart", "bubblewrap") in names
    assert ("fork-bomb", "gvisor") in names
    assert len(r["faults"]) == 21  # 11 on gVisor, 10 on bubblewrap
    assert r["failed"] == []
    assert r["outputs"]["bytes_lost"] == 0 and r["outputs"]["cells_out_of_order"] == 0
    assert r["outputs"]["cells_checked"] > 0
    assert r["leftover_count"] == 0, r["leftovers"]
