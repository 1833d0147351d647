"""The soak and chaos run, short (issue 16): two live kernels per local runtime and per
cloud emulation (E2B and Modal through their real SDKs against the emulators on
loopback), one quiet and one taking every fault of ``bench/chaos.py`` that applies in
turn (and going idle once: frozen on bubblewrap and E2B, checkpointed on gVisor, its
state kept; stopped on Modal, the loss told), with an ipywidgets slider in its workload.

For every fault the affected cell ends with an error naming the cause (never a hang:
``bench.chaos.FAULT_DEADLINE_S`` bounds it) and the kernel answers the next cell; the
quiet kernels lose no output byte and no cell; after shutdown no state directory,
cgroup or process is left, ``gc --dry-run`` finds nothing and no emulator still runs a
sandbox, but the one sandbox per killed Modal proxy that only Modal's own timeout ends
(docs/lifecycle.md, "No orphans").  No timing is asserted: the figures are
``python -m bench.soak``'s.
"""

from __future__ import annotations

from bench.soak import run


def _judge(r: dict) -> None:
    """What holds on every target: each fault told and survived, nothing lost or left."""
    not_survived = [f for f in r["faults"] if not f["survived"]]
    assert not_survived == [], not_survived
    assert r["failed"] == []
    assert r["widget_cells"] > 0
    assert r["outputs"]["bytes_lost"] == 0 and r["outputs"]["cells_out_of_order"] == 0
    assert r["outputs"]["cells_checked"] > 0
    assert r["leftover_count"] == 0, r["leftovers"]


def test_every_fault_is_told_and_survived_and_nothing_is_lost_or_left():
    r = run(kernels=4, runtimes=("gvisor", "bubblewrap"), quiet_s=3, memory_mib=512, admit_memory_mib=0)
    _judge(r)
    names = {(f["fault"], f["runtime"]) for f in r["faults"]}
    assert ("sigkill-gofer", "gvisor") in names and ("sigkill-bwrap", "bubblewrap") in names
    assert ("frontend-restart", "gvisor") in names and ("frontend-restart", "bubblewrap") in names
    assert ("fork-bomb", "gvisor") in names
    assert len(r["faults"]) == 21  # 11 on gVisor, 10 on bubblewrap


def test_the_cloud_emulations_take_a_clouds_faults_the_same_way():
    """E2B and Modal, each through its real SDK and emulator (a second instance for the
    quiet kernel, so the service outage reaches the misbehaving one only): run apart
    from the local runtimes, so two cores carry four kernels at a time, not eight."""
    r = run(kernels=4, runtimes=("e2b-emulated", "modal-emulated"), quiet_s=3, memory_mib=512,
            admit_memory_mib=0)
    _judge(r)
    names = {(f["fault"], f["runtime"]) for f in r["faults"]}
    for emulated in ("e2b-emulated", "modal-emulated"):
        for fault in ("agent-killed", "sandbox-hung", "sandbox-terminated", "service-outage", "client-gone",
                      "proxy-killed", "frontend-restart", "idle-then-wake", "memory-bomb", "interrupt"):
            assert (fault, emulated) in names
    assert len(r["faults"]) == 20  # 10 on each
    # each killed proxy left its sandbox behind, and each cloud's dead-man's switch ended it
    # (E2B: the timeout no longer refreshed; Modal: the agent without keepalives, then
    # idle_timeout): _judge found no sandbox or directory left in either emulator
    orphans = {f["runtime"] for f in r["faults"] if f["orphan"]}
    assert orphans == {"e2b-emulated", "modal-emulated"}, r["faults"]
