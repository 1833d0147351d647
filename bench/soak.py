"""The soak and chaos run (issue 16): many live kernels, faults injected, nothing lost or left.

::

    .venv/bin/python -m bench.soak                        # 8 kernels: both local runtimes, both emulations
    .venv/bin/python -m bench.soak --kernels 4 --quiet-s 20 --admit-memory-mib 0
    .venv/bin/python -m bench.soak --runtimes e2b-emulated,modal-emulated

Per runtime, some kernels stay **quiet** (``x += 1`` timed, and checksummed prints)
while the others **misbehave**: checksummed prints, plots, ``input()``, an ipywidgets
slider (its ``comm_open`` and ``comm_msg`` checked), and one fault after another from
:data:`bench.chaos.FAULTS` (helpers SIGKILLed, the agent SIGSTOPped, the cgroup
removed, the client gone mid-cell, memory and fork bombs, interrupts).  First the quiet
kernels run alone, then beside the misbehaving ones: their latency in both phases is
the comparison.  Before that, **admission**: kernels of ``--admit-memory-mib`` are
started until the machine refuses one.

The "runtimes" ``e2b-emulated`` and ``modal-emulated`` are the E2B and Modal backends
through the real SDKs against the test suite's emulators on loopback
(:mod:`bench.emulation`; their sandboxes are bubblewrap): the same workload, with a
cloud's faults instead of the local helpers' (the agent's process killed, the sandbox
hung, ended by the service, the service unreachable for a few seconds).

The run uses a state directory of its own (``SANDBOX_KERNEL_STATE_DIR``), so
admission counts only its sandboxes and the leftovers check sees only its own:
after every kernel is shut down, no state directory, cgroup or process of its
sandboxes may be left, ``sandbox-kernel gc --dry-run`` must find nothing, and no
emulator may still run a sandbox or hold its directory.

Writes ``bench/soak.json``; ``bench/run.py --report-only`` puts its figures into
``docs/benchmarks.md`` (section "Under load and faults").
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

if __name__ == "__main__" and not __package__:
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

from bench import ROOT
from bench.chaos import FAULTS, FaultResult, Live, count_output, inject, print_cell
from bench.emulation import EMULATED, Emulation
from bench.harness import say
from bench.soak_report import SOAK_JSON
from bench.stats import percentile

RUNTIMES = ("gvisor", "bubblewrap", *EMULATED)
#: E2B's dead-man's switch in the run, s: a sandbox whose proxy was SIGKILLed ends this
#: long after (``proxy-killed``); the leftovers check waits for it.
#: The clouds' dead-man's switch in this run (E2B's sandbox timeout, Modal's agent
#: host-silence; defaults 60 s): a SIGKILLed proxy's sandbox ends this long after.
DEADMAN_S = 20
#: Lines and width of the checksummed print cells.
PRINT_LINES, PRINT_WIDTH = 300, 100
PLOT_CELL = ("import matplotlib.pyplot as plt\nfig, ax = plt.subplots(figsize=(2, 2))\n"
             "ax.plot([1, 3, 2])\nplt.show()\n")
INPUT_CELL = "v = input('name? ')\nprint('got', v)\n"
WIDGET_CELL = ("import ipywidgets as widgets\n"
               "soak_slider = widgets.IntSlider(value=3, min=0, max=10, description='soak')\n"
               "soak_slider\n")
WIDGET_CHANGE = "soak_slider.value = 7\n"


def widget_problem(shown: Any, changed: Any) -> str:
    """What is wrong with the widget cells' messages, or "" when the slider arrived:
    a ``comm_open`` of an ``IntSliderModel`` with value 3, displayed (its model id in a
    widget-view bundle), then a ``comm_msg`` updating that comm's value to 7."""
    if shown.status != "ok" or changed.status != "ok":
        return f"cell failed: {shown.ename or changed.ename}: {(shown.evalue or changed.evalue)[:160]}"
    opens = {m["content"]["comm_id"]: m["content"]["data"].get("state", {})
             for m in shown.outputs if m["msg_type"] == "comm_open"}
    slider = [cid for cid, st in opens.items() if st.get("_model_name") == "IntSliderModel"]
    if len(slider) != 1 or opens[slider[0]].get("value") != 3:
        return f"no comm_open of an IntSliderModel with value 3 (comm_open states: {list(opens.values())[:3]})"
    views = [m["content"]["data"].get("application/vnd.jupyter.widget-view+json", {}).get("model_id")
             for m in shown.outputs if m["msg_type"] in ("display_data", "execute_result")]
    if slider[0] not in views:
        return "the slider was not displayed (no widget-view bundle naming its model)"
    updates = [m["content"]["data"] for m in changed.outputs
               if m["msg_type"] == "comm_msg" and m["content"]["comm_id"] == slider[0]]
    if not any(u.get("method") == "update" and u.get("state", {}).get("value") == 7 for u in updates):
        return f"no comm_msg updating the slider's value to 7 (got {updates[:2]})"
    return ""


@dataclass
class Tally:
    """What the workloads of one run produced (shared by the kernels' threads)."""

    rtt: dict[str, dict[str, list[float]]] = field(default_factory=dict)  # runtime -> phase -> s
    cells: int = 0
    widget_cells: int = 0
    failed: list[str] = field(default_factory=list)  # workload cells that failed, why
    expected_bytes: int = 0
    lost_bytes: int = 0
    out_of_order: int = 0
    cut_notices: list[str] = field(default_factory=list)
    faults: list[FaultResult] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def printed(self, who: str, r: Any, tag: str) -> None:
        c = count_output(r.stdout, r.stderr, PRINT_LINES, PRINT_WIDTH, tag)
        with self.lock:
            self.cells += 1
            self.expected_bytes += c.expected_bytes
            self.lost_bytes += c.lost_bytes
            self.out_of_order += 0 if c.in_order else 1
            if c.cut_notice:
                self.cut_notices.append(c.cut_notice)
            if r.status != "ok":
                self.failed.append(f"{who}: print cell: {r.ename}: {r.evalue[:200]}")


def _install(prefix: str, runtime: str, name: str, **options: Any) -> str:
    from sandbox_kernel.kernelspec import install
    kname = f"soak-{name}-{runtime}"
    if runtime in EMULATED:
        backend = EMULATED[runtime]
        cloud = ({"deadman_s": DEADMAN_S, "request_timeout_s": 10.0} if backend == "e2b"
                 else {"memory_snapshots": False, "deadman_s": DEADMAN_S, "idle_timeout_s": 2})
        local_only = ("pids_max", "checkpoint_after_s")
        install(kname, backend=backend, prefix=prefix,
                options={**{k: v for k, v in options.items() if k not in local_only}, **cloud})
    else:  # the default kernelspec's spare sandboxes, lingering 3 s (not 60) after the policy's last kernel
        install(kname, options={"runtime": runtime, "spare_linger_s": 3, **options}, prefix=prefix)
    return kname


def _idle_options(runtime: str, opts: dict[str, Any]) -> dict[str, Any]:
    """The misbehaving kernels' options: they also go idle once (frozen on bubblewrap and
    E2B, checkpointed on gVisor, stopped on Modal, which keeps no memory without snapshots)."""
    if runtime == "modal-emulated":
        return {**opts, "pause_after_s": 0, "stop_after_s": 5}
    return {**opts, "pause_after_s": 2, "checkpoint_after_s": 4 if runtime == "gvisor" else 0}


def admitted(kernel_name: str, runtime: str, most: int, log) -> dict[str, Any]:
    """Start kernels of ``kernel_name`` one by one until a first cell is refused by
    admission (or ``most`` run); shut them all down.  What was admitted and the refusal."""
    live: list[Live] = []
    refusal = ""
    try:
        while len(live) < most:
            k = Live(kernel_name, runtime, log)
            live.append(k)
            r = k.run("1 + 1", timeout=180)
            if r.status != "ok":
                refusal = f"{r.ename}: {r.evalue}"
                live.pop().stop()
                break
    finally:
        for k in live:
            k.stop()
    return {"admitted": len(live), "refused": refusal, "limit_reached": bool(refusal)}


def quiet_loop(k: Live, who: str, tally: Tally, phase: list[str], stop: threading.Event) -> None:
    """A quiet kernel: ``x += 1`` timed, every third round a checksummed print."""
    k.run("x = 0")
    n = 0
    while not stop.is_set():
        try:
            dt = k.rtt()
            with tally.lock:
                tally.rtt.setdefault(k.runtime, {}).setdefault(phase[0], []).append(dt)
            n += 1
            if n % 3 == 0:
                tally.printed(who, k.run(print_cell(PRINT_LINES, PRINT_WIDTH, "q")), "q")
        except Exception as err:
            with tally.lock:
                tally.failed.append(f"{who} (quiet): {type(err).__name__}: {err}")
            time.sleep(1)


def chaos_loop(k: Live, who: str, faults: list[str], base: Path | Emulation, tally: Tally) -> None:
    """A misbehaving kernel: a workload round (print, plot, input, a widget) before each fault."""
    for name in faults:
        try:
            tally.printed(who, k.run(print_cell(PRINT_LINES, PRINT_WIDTH, "c")), "c")
            plot = k.run(PLOT_CELL)
            if plot.status != "ok" or not any("image/png" in o["content"].get("data", {}) for o in plot.outputs):
                with tally.lock:
                    tally.failed.append(f"{who}: plot: {plot.status} {plot.ename} {plot.evalue[:200]}")
            got = k.run(INPUT_CELL, stdin=lambda prompt: "soak")
            if "got soak" not in got.stdout:
                with tally.lock:
                    tally.failed.append(f"{who}: input(): {got.status} {got.ename} {got.stdout[:100]!r}")
            shown = k.run(WIDGET_CELL)
            problem = widget_problem(shown, k.run(WIDGET_CHANGE))
            with tally.lock:
                tally.widget_cells += 2
                if problem:
                    tally.failed.append(f"{who}: widget: {problem}")
        except Exception as err:
            with tally.lock:
                tally.failed.append(f"{who}: workload: {type(err).__name__}: {err}")
        say(f"{who}: {name}")
        res = inject(k, FAULTS[name], base)
        say(f"{who}: {name}: {'survived' if res.survived else 'NOT survived: ' + res.why} "
            f"({res.seconds_to_error} s) {res.message[:120]}")
        with tally.lock:
            tally.faults.append(res)


def leftovers(base: Path, prefixes: list[str]) -> dict[str, list[str]]:
    """What is left of the run's sandboxes: state directories, cgroups, processes, and
    what ``sandbox-kernel gc --dry-run`` reports (all for ``base`` only)."""
    from sandbox_kernel.backends.local.cgroups import detect_layout
    from sandbox_kernel.backends.local.procs import processes_mentioning
    dirs = sorted(d.name for d in base.glob("sandbox-kernel-*"))
    layout = detect_layout()
    cgroups = sorted({p.name for b in (layout.bases.values() if layout else ())
                      for p in Path(b).glob("sandbox-kernel-*") if any(p.name.startswith(x) for x in prefixes)})
    procs = [str(p) for p in processes_mentioning(str(base) + "/")]
    gc = subprocess.run([sys.executable, "-m", "sandbox_kernel.cli", "gc", "--dry-run"], capture_output=True,
                        text=True, env=os.environ.copy(), timeout=120)
    found = [ln for ln in gc.stdout.splitlines() if ln.startswith("orphan")]
    return {"state_dirs": dirs, "cgroups": cgroups, "processes": procs, "gc_dry_run": found}


def _spare_pools_ended(timeout_s: float) -> bool | list:
    """Wait for the run's spare pools to end on their own (``spare_linger_s`` after their
    policy's last kernel): True, or those still running."""
    from sandbox_kernel.backends.local.pool import spares
    deadline = time.monotonic() + timeout_s
    while (running := spares.report()) and time.monotonic() < deadline:
        time.sleep(0.5)
    return running or True


def plan_faults(runtime: str, n_chaos: int, only: list[str] | None,
                skip: frozenset[tuple[str, str]] = frozenset()) -> list[list[str]]:
    """The faults for a runtime's misbehaving kernels: each applicable fault once (but the
    ``(fault, runtime)`` pairs of ``skip``), dealt round-robin."""
    names = [f for f, v in FAULTS.items()
             if runtime in v.runtimes and (only is None or f in only) and (f, runtime) not in skip]
    return [names[i::n_chaos] for i in range(n_chaos)]


def run(kernels: int = 8, runtimes: tuple[str, ...] = RUNTIMES, quiet_s: float = 30.0,
        memory_mib: int = 512, admit_memory_mib: int = 2048, admit_most: int = 24,
        faults: list[str] | None = None, skip: frozenset[tuple[str, str]] = frozenset()) -> dict[str, Any]:
    """One soak run; its results (see the module docstring).

    Parameters
    ----------
    kernels : int
        Live kernels in all, split evenly across ``runtimes``; on each, half (rounded
        up) are quiet and the rest misbehave (at least one of each).
    quiet_s : float
        Seconds the quiet kernels run alone before the misbehaving ones start, s.
    memory_mib : int
        The kernels' memory limit (the memory bombs meet it), MiB.
    admit_memory_mib : int
        Memory limit of the kernels started until admission refuses one, MiB; 0 skips it.
    faults : list of str, optional
        Only these faults (names in :data:`bench.chaos.FAULTS`); default all.
    skip : frozenset of (str, str)
        ``(fault, runtime)`` pairs left out.

    Returns
    -------
    dict
        ``admission``, ``latency_s``, ``outputs``, ``faults``, ``leftovers``, ``failed``.
    """
    t_all = time.perf_counter()
    base = Path(f"/run/sandbox-kernel-soak-{uuid.uuid4().hex[:8]}")
    old_env = {k: os.environ.get(k) for k in ("SANDBOX_KERNEL_STATE_DIR", "JUPYTER_PATH")}
    prefix = tempfile.mkdtemp(prefix="sandbox-soak-")
    os.environ["SANDBOX_KERNEL_STATE_DIR"] = str(base)
    os.environ["JUPYTER_PATH"] = os.pathsep.join([str(Path(prefix) / "share" / "jupyter"),
                                                  *filter(None, [old_env["JUPYTER_PATH"]])])
    log = open(ROOT / "bench" / "soak.log", "ab")
    results: dict[str, Any] = {"kernels": kernels, "runtimes": list(runtimes), "memory_mib": memory_mib,
                               "quiet_s": quiet_s, "admission": {},
                               "emulated": [rt for rt in runtimes if rt in EMULATED]}
    tally = Tally()
    live: list[Live] = []
    #: per emulated runtime: the instance of the quiet kernels, that of the misbehaving ones
    emus: dict[str, tuple[Emulation, Emulation]] = {}
    try:
        opts = {"memory_mib": memory_mib, "pids_max": 256, "pause_after_s": 0, "checkpoint_after_s": 0,
                "ping_after_s": 2, "pong_timeout_s": 4}
        if admit_memory_mib:
            from sandbox_kernel.backends.local.admission import Admission, host_memory_mib
            a = Admission()
            room = int((host_memory_mib() - a.memory_headroom_mib) * a.memory_overcommit)
            for rt in (r for r in runtimes if r not in EMULATED):  # the machine's admission: local only
                name = _install(prefix, rt, "admit", **{**opts, "memory_mib": admit_memory_mib})
                say(f"admission on {rt}: kernels of {admit_memory_mib} MiB until refused")
                got = admitted(name, rt, admit_most, log)
                got.update(memory_mib=admit_memory_mib, expected=room // admit_memory_mib,
                           expected_at_512_mib=room // 512, room_mib=room)
                results["admission"][rt] = got
                say(f"  {rt}: {got['admitted']} admitted; refused: {got['refused'][:160]}")
        per = max(2, kernels // len(runtimes))
        plan: dict[str, tuple[list[Live], list[Live]]] = {}
        for rt in runtimes:
            if rt in EMULATED:  # two instances: a service outage must not reach the quiet kernels
                emus[rt] = (Emulation(EMULATED[rt], memory_mib), Emulation(EMULATED[rt], memory_mib))
            name = _install(prefix, rt, "live", **opts)
            idle = _install(prefix, rt, "idle", **_idle_options(rt, opts))
            n_quiet = (per + 1) // 2
            ks = []
            for i in range(per):
                env = emus[rt][i >= n_quiet].env if rt in emus else None
                ks.append(Live(name if i < n_quiet else idle, rt, log, env=env))
                live.append(ks[-1])
            plan[rt] = (ks[:n_quiet], ks[n_quiet:])
        say(f"{len(live)} kernels up: " + ", ".join(f"{rt} {len(q)} quiet + {len(c)} misbehaving"
                                                    for rt, (q, c) in plan.items()))
        phase, stop = ["alone"], threading.Event()
        threads = [threading.Thread(target=quiet_loop, args=(k, f"{rt}-q{i}", tally, phase, stop), daemon=True)
                   for rt, (qs, _) in plan.items() for i, k in enumerate(qs)]
        for t in threads:
            t.start()
        time.sleep(quiet_s)  # the "alone" phase: a duration to measure over, not a wait for an event
        phase[0] = "chaos"
        say("misbehaving kernels start")
        chaos = [threading.Thread(target=chaos_loop, daemon=True,
                                  args=(k, f"{rt}-c{i}", fl, emus[rt][1] if rt in emus else base, tally))
                 for rt, (_, cs) in plan.items()
                 for i, (k, fl) in enumerate(zip(cs, plan_faults(rt, len(cs), faults, skip)))]
        for t in chaos:
            t.start()
        for t in chaos:
            t.join()
        stop.set()
        for t in threads:
            t.join(timeout=120)
    finally:
        for k in live:
            try:
                k.stop()
            except Exception as err:
                tally.failed.append(f"shutdown: {err}")
        prefixes = sorted({p for k in live for p in k.prefixes})
        pools_ended = _spare_pools_ended(60.0)
        if pools_ended is not True:
            tally.failed.append(f"spare pools still running 60 s after their kernels: {pools_ended}")
        results["leftovers"] = leftovers(base, prefixes) if base.exists() else {}
        results["sandboxes_created"] = {}
        for rt, pair in emus.items():
            try:  # a sandbox orphaned by proxy-killed ends at its dead-man's switch: waited for
                for emu in pair:
                    left = emu.leftovers(wait_s=DEADMAN_S + 10)
                    for k, v in left.items():
                        results["leftovers"].setdefault(k, []).extend(v)
                results["sandboxes_created"][rt] = sum(emu.created() for emu in pair)
            finally:
                for emu in pair:
                    emu.close()
        log.close()
        for k, v in old_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        import shutil
        shutil.rmtree(prefix, ignore_errors=True)
        if base.exists() and not any(d for pat in ("sandbox-kernel-*", "e2b-emu-*") for d in base.glob(pat)):
            shutil.rmtree(base, ignore_errors=True)
    results["latency_s"] = {rt: {ph: {"n": len(xs), "p50": round(percentile(xs, 50), 4),
                                      "p99": round(percentile(xs, 99), 4)}
                                 for ph, xs in phases.items() if xs}
                            for rt, phases in tally.rtt.items()}
    results["widget_cells"] = tally.widget_cells
    results["outputs"] = {"cells_checked": tally.cells, "bytes_expected": tally.expected_bytes,
                          "bytes_lost": tally.lost_bytes, "cells_out_of_order": tally.out_of_order,
                          "cut_with_notice": tally.cut_notices}
    results["faults"] = [asdict(f) for f in tally.faults]
    results["faults_survived"] = sum(f.survived for f in tally.faults)
    results["faults_injected"] = len(tally.faults)
    results["failed"] = tally.failed
    results["leftover_count"] = sum(len(v) for v in results["leftovers"].values())
    results["duration_s"] = round(time.perf_counter() - t_all, 1)
    results["date"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    results["loadavg_end"] = round(os.getloadavg()[0], 2)
    return results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kernels", type=int, default=8, help="live kernels in all (split across runtimes)")
    ap.add_argument("--runtimes", default=",".join(RUNTIMES))
    ap.add_argument("--quiet-s", type=float, default=30.0, help="seconds the quiet kernels run alone")
    ap.add_argument("--memory-mib", type=int, default=512)
    ap.add_argument("--admit-memory-mib", type=int, default=2048, help="0 = no admission phase")
    ap.add_argument("--faults", default="", help="comma-separated subset of " + ", ".join(FAULTS))
    ap.add_argument("--out", default=str(SOAK_JSON))
    a = ap.parse_args(argv)
    res = run(a.kernels, tuple(a.runtimes.split(",")), a.quiet_s, a.memory_mib, a.admit_memory_mib,
              faults=[f for f in a.faults.split(",") if f] or None)
    Path(a.out).write_text(json.dumps(res, indent=1) + "\n")
    say(f"wrote {a.out}: faults {res['faults_survived']}/{res['faults_injected']} survived, "
        f"{res['outputs']['bytes_lost']} bytes lost, {res['leftover_count']} leftovers, "
        f"{len(res['failed'])} failed workload cells, {res['duration_s']:.0f} s")
    return 0 if (res["faults_survived"] == res["faults_injected"] and not res["outputs"]["bytes_lost"]
                 and not res["leftover_count"] and not res["failed"]) else 1


if __name__ == "__main__":
    sys.exit(main())
