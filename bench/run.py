"""Benchmarks: the numbers a user compares, side by side with stock ipykernel.

One command measures every figure for every target in one run::

    .venv/bin/python bench/run.py            # default, ~10 min on a 2-core machine
    .venv/bin/python bench/run.py --quick    # smaller sample counts, ~3 min
    .venv/bin/python bench/run.py --targets stock,bubblewrap --figures trivial_rtt

and writes ``bench/results.json`` (machine-readable, with the machine
described), ``docs/benchmarks.md`` (a table per figure, target checks) and
``docs/benchmarks.png`` (the plot embedded in the markdown).

Layout, for whoever adds figures or targets:

* ``TARGETS``  -- what is measured: stock ipykernel (the limit), the proxy on
  each local runtime.  **Extension point**: emulated cloud backends (E2B,
  Modal) and the warm pool add a ``Target`` here, with ``setup``/``teardown``
  to start an emulator and install its kernelspec; mark them ``emulated=True``.
* ``FIGURES``  -- what is measured on each target: a function registered under
  a name.  ``kind="fresh"`` functions launch their own kernels (cold start,
  memory); ``kind="session"`` functions share one running kernel per target.
  **Extension point**: pause/resume latency per level, warm-pool start,
  checkpoint restore, kernels-per-machine register here.
* ``CHECKS``   -- the targets of issue 7, each a function from the results to a
  verdict (met / missed by how much / not measured) and the reason.
  **Extension point** for the warm-pool, freeze-resume and restore targets.

Every cell sent by this script is a trivial benchmark cell; on the proxy
targets it runs inside the sandbox, on ``stock`` it runs in the stock kernel,
which is the comparison limit.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

if __name__ == "__main__" and not __package__:
    # `python bench/run.py`: import the `bench` package from the repository root, not
    # this folder's modules as top-level ones.
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

from bench import DOCS_MD, DOCS_PNG, RESULTS_JSON, ROOT  # noqa: E402
from bench.cells import NESTED_CELL, TIMER_SRC, Timer  # noqa: E402
from bench.checks import CHECKS, Check  # noqa: E402
from bench.figures import FIGURES, Figure  # noqa: E402
from bench.figures.latency import stdout_mb as _stdout_mb  # noqa: E402
from bench.harness import Bench, Context, Running, sandbox_info, say, timed_cell, wait_state  # noqa: E402
from bench.machine import machine  # noqa: E402
from bench.procmem import du_mib as _du_mib  # noqa: E402
from bench.procmem import kib as _kib  # noqa: E402
from bench.procmem import meminfo_mib as _meminfo_mib  # noqa: E402
from bench.procmem import process_tree, tree_memory_mib, tree_memory_parts  # noqa: E402
from bench.results import med as _med  # noqa: E402
from bench.results import res as _res  # noqa: E402
from bench.stats import percentile, summarize  # noqa: E402
from bench.targets import TARGETS, Target  # noqa: E402


# ---------------------------------------------------------------------------------------
# run
# ---------------------------------------------------------------------------------------

def run(quick: bool, targets: list[str], figures: list[str]) -> dict:
    bench = Bench(quick, ROOT / "bench" / "run.log")
    results: dict[str, Any] = {
        "mode": "quick" if quick else "default",
        "machine": machine(),
        "targets": {n: {"label": TARGETS[n].label, "description": TARGETS[n].description,
                        "kernel_name": TARGETS[n].kernel_name, "emulated": TARGETS[n].emulated}
                    for n in targets},
        "figures": {f: {"title": FIGURES[f].title, "unit": FIGURES[f].unit, "note": FIGURES[f].note,
                         "higher_is_better": FIGURES[f].higher_is_better, "plot": FIGURES[f].plot,
                         "results": {}}
                    for f in figures},
    }
    t_all = time.perf_counter()
    contexts: dict[str, Context] = {}
    try:
        for tname in targets:
            target = TARGETS[tname]
            try:
                if target.setup:
                    target.setup(bench)
                contexts[tname] = Context(bench, target)
            except Exception as err:  # noqa: BLE001
                for f in figures:
                    results["figures"][f]["results"][tname] = {"error": f"setup: {err}"}
                say(f"{tname}: setup failed: {err}")
        # fresh-kernel figures first, while no shared kernel is running beside them
        for fname in sorted(figures, key=lambda f: FIGURES[f].kind != "fresh"):
            fig = FIGURES[fname]
            if fig.fn is None:
                continue
            n = fig.n_quick if quick else fig.n
            rounds = max(1, min(fig.rounds, n))
            sizes = [n // rounds + (1 if i < n % rounds else 0) for i in range(rounds)]
            names = [t for t in contexts if fig.targets is None or t in fig.targets]
            got: dict[str, dict[str, list[float]]] = {t: {} for t in names}
            failed: dict[str, str] = {}
            extras: dict[str, dict[str, dict]] = {}
            load0 = os.getloadavg()[0]
            t0 = time.perf_counter()
            say(f"{fname}: {n} samples x {len(names)} targets in {rounds} round(s)")
            for r, size in enumerate(sizes):
                for tname in names[r % len(names):] + names[:r % len(names)]:
                    if tname in failed:
                        continue
                    try:
                        out = fig.fn(contexts[tname], size)
                    except Exception as err:  # noqa: BLE001
                        traceback.print_exc()
                        failed[tname] = repr(err)
                        contexts[tname].close()  # the shared kernel may be in a bad state
                        continue
                    out = dict(out) if isinstance(out, dict) else {fname: out}
                    for name, ex in out.pop("_extra", {}).items():
                        extras.setdefault(tname, {}).setdefault(name, {}).update(ex)
                    for name, samples in out.items():
                        got[tname].setdefault(name, []).extend(samples)
            for tname in names:
                if tname in failed:
                    for name in [fname] + [g for g, v in FIGURES.items() if v.produced_by == fname]:
                        if name in results["figures"]:
                            results["figures"][name]["results"][tname] = {"error": failed[tname]}
                    continue
                for name, samples in got[tname].items():
                    if name not in results["figures"]:
                        continue
                    res = {**summarize(samples), "samples": [round(x, 4) for x in samples],
                           **extras.get(tname, {}).get(name, {})}
                    results["figures"][name]["results"][tname] = res
                    say(f"  {tname}: {name}: median {res['median']:.3g} p90 {res['p90']:.3g} "
                        f"{FIGURES[name].unit}")
            for name in [fname] + [g for g, v in FIGURES.items() if v.produced_by == fname]:
                if name in results["figures"]:
                    results["figures"][name]["loadavg_1min"] = [round(load0, 2),
                                                                round(os.getloadavg()[0], 2)]
                    results["figures"][name]["seconds"] = round(time.perf_counter() - t0, 1)
    finally:
        for tname, ctx in contexts.items():
            try:
                ctx.close()
            finally:
                if TARGETS[tname].teardown:
                    TARGETS[tname].teardown(bench)
        bench.close()
    results["duration_s"] = round(time.perf_counter() - t_all, 1)
    derived = {}
    stock = _med(results, "trivial_rtt", "stock")
    for n in targets:
        v = _med(results, "trivial_rtt", n)
        if n != "stock" and v is not None and stock is not None:
            derived[n] = {"proxy_minus_stock_ms": round(v - stock, 3)}
    results["relay_overhead"] = derived
    results["checks"] = [c.__dict__ for fn in CHECKS for c in fn(results)]
    return results


# ---------------------------------------------------------------------------------------
# report
# ---------------------------------------------------------------------------------------

def _fmt(x: float) -> str:
    if x >= 100:
        return f"{x:.0f}"
    if x >= 10:
        return f"{x:.1f}"
    return f"{x:.2f}"


def plot(results: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figs = [f for f, v in results["figures"].items() if v.get("plot", True)
            and any("median" in r for r in v["results"].values())]
    tnames = list(results["targets"])
    colors = {"stock": "#777777", "bubblewrap": "#4c72b0", "gvisor": "#dd8452"}
    cols = 3
    rows = (len(figs) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.2 * rows), squeeze=False)
    for ax, fname in zip(axes.flat, figs):
        f = results["figures"][fname]
        xs, meds, los, his, p90s, labels, cs = [], [], [], [], [], [], []
        for i, t in enumerate(tnames):
            r = f["results"].get(t, {})
            if "median" not in r:
                continue
            xs.append(i)
            meds.append(r["median"])
            los.append(r["median"] - r["min"])
            his.append(r["p90"] - r["median"])
            p90s.append(r["p90"])
            labels.append(results["targets"][t]["label"].replace("proxy + ", "proxy\n"))
            cs.append(colors.get(t, "#55a868"))
        ax.bar(xs, meds, color=cs, yerr=[los, his], capsize=4, ecolor="#333333")
        for x, m in zip(xs, meds):
            ax.annotate(_fmt(m), (x - 0.4, m), ha="left", va="bottom", fontsize=8,
                        xytext=(0, 2), textcoords="offset points")
        ax.set_xticks(xs, labels, fontsize=8)
        ax.set_title(f"{f['title']}\n({f['unit']}, {'higher' if f['higher_is_better'] else 'lower'} "
                     "is better)", fontsize=9)
        ax.tick_params(axis="y", labelsize=8)
        if meds and max(p90s) / max(min(meds), 1e-9) > 30:
            ax.set_yscale("log")
    for ax in list(axes.flat)[len(figs):]:
        ax.axis("off")
    m = results["machine"]
    fig.suptitle(f"sandbox-kernel benchmarks ({results['mode']} run, {m['date'][:10]}, "
                 f"{m['cores']} cores): bar = median, whiskers = min..p90 (max in the tables)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _explain(results: dict) -> list[str]:
    """The 'why' paragraphs, with this run's numbers in them."""
    med = lambda f, t: _med(results, f, t)  # noqa: E731
    lines = []
    s, b, g = med("trivial_rtt", "stock"), med("trivial_rtt", "bubblewrap"), med("trivial_rtt", "gvisor")
    ns, nb, ng = med("runtime_rtt", "stock"), med("runtime_rtt", "bubblewrap"), med("runtime_rtt", "gvisor")
    if None not in (s, b, g):
        lines += [
            "### Where a trivial cell's time goes: runtime vs relay",
            "",
            f"A `pass` cell costs {s:.2f} ms on stock ipykernel, {b:.2f} ms through the proxy on "
            f"bubblewrap and {g:.2f} ms through the proxy on gVisor (medians). The difference to "
            f"stock (+{b - s:.2f} ms and +{g - s:.2f} ms) has two parts:",
            "",
            "* **the relay**: two extra hops. The frontend's request reaches the proxy (an ipykernel "
            "subclass) over ZMQ, is framed as a JSON line and written to the sandbox's stdin; the "
            "agent inside decodes it and sends it over ZMQ to the inner stock ipykernel; every "
            "reply and IOPub message (busy, execute_input, idle, the reply) travels back the same "
            "way: the agent checks its signature and splices its JSON into a frame without "
            "decoding it, the proxy parses, validates, filters and re-signs it. Profiled per `pass` "
            "cell on bubblewrap, the agent spends about 0.65 ms of CPU and the proxy about 1.9 ms, "
            "most of it ipykernel's own request handling (its shell-channel thread, status "
            "messages, signing); what the relay adds is mostly wake-ups: a cell crosses about ten "
            "more thread and process hand-offs than on a stock kernel (the proxy's ZMQ I/O, "
            "shell-channel and main threads, the agent and its ZMQ I/O thread, both ways), each "
            "50-300 µs on this machine. On a 2-core machine the five busy processes (client, "
            "proxy, agent, inner kernel, and on gVisor the Sentry) also compete for the cores.",
            "* **the runtime**: bubblewrap adds next to nothing to a running process (namespaces "
            "and a seccomp filter; syscalls go straight to the host kernel). gVisor on the "
            "ptrace platform intercepts every syscall of the agent and the inner kernel: each "
            "one is a ptrace stop, a switch to the Sentry and back, several microseconds instead "
            "of ~0.1 µs, and ZMQ's poll/send/recv/eventfd traffic on both sides of the agent is "
            "syscall-heavy. The agent and the inner kernel talk over ZMQ on Unix sockets, which "
            "under gVisor are implemented by the Sentry, and the frames cross to the host "
            "through the sandbox's stdio pipes, also through the Sentry.",
            "",
        ]
        if None not in (ns, nb, ng):
            lines += [
                f"The `runtime_rtt` figure separates them cheaply: a stock ipykernel started next to "
                f"the kernel and timed from a client in the same place answers in {ns:.2f} ms on "
                f"the host, {nb:.2f} ms inside bubblewrap and {ng:.2f} ms inside gVisor. That is "
                f"the runtime's cost with no relay at all (the nested client uses jupyter_client's default "
                f"loopback TCP, the agent uses Unix sockets; inside gVisor it also charges the client's "
                f"syscalls to the runtime, so it over-states the runtime's part for a host client "
                f"and makes the relay's part look smaller). The relay-overhead check below "
                f"therefore uses stock RTT + (nested − nested-on-host) as the runtime's cost.",
                "",
            ]
    so = [med("stdout_throughput", t) for t in ("stock", "bubblewrap", "gvisor")]
    if None not in so:
        lines += [
            "### stdout throughput",
            "",
            f"Stock ipykernel delivers {so[0]:.1f} MB/s, the proxy {so[1]:.1f} MB/s on bubblewrap "
            f"and {so[2]:.1f} MB/s on gVisor. ipykernel batches `print` output into one stream "
            "message per flush interval, so throughput is bound by the printing loop in the inner "
            "kernel (the same in all three) plus, for the proxy, moving each batch through the "
            "agent (spliced into a frame, not decoded), one more copy through the pipe, the "
            "proxy's parse, schema checks and re-signing. Under gVisor the print loop itself is slower "
            "too: every flush wakes the IOPub thread, the agent and the pipe to the host through "
            "ptrace-intercepted syscalls.",
            "",
        ]
        sc = [med("syscall_us", t) for t in ("stock", "bubblewrap", "gvisor")]
        mb = _stdout_mb(results["mode"] == "quick")
        if None not in sc:
            calls = 2 * mb * 1_000_000 // 100
            lines += [
                f"The gVisor figure is the runtime, not the relay: ipykernel's `OutStream.write` "
                f"calls `os.getpid()` on every write (to tell forked children from the kernel), "
                f"and `print` writes twice a line, so {mb} MB of 100-byte lines is {calls:,} "
                f"syscalls in the printing loop alone. One syscall costs {sc[0]:.2f} µs on the "
                f"host, {sc[1]:.2f} µs in bubblewrap and {sc[2]:.1f} µs under gVisor's ptrace "
                f"platform (`syscall_us`): {calls * sc[2] / 1e6:.1f} s of the "
                f"{mb / so[2]:.1f} s the gVisor cell took, against {calls * sc[0] / 1e6:.2f} s on "
                f"the host. The remedy is on the runtime side (a gVisor platform that does not stop "
                f"on every syscall: KVM where /dev/kvm exists, or systrap in newer runsc releases "
                f"than the one here) or in the inner "
                f"kernel (a stdout that skips the per-write getpid check), not in the relay; the "
                f"bubblewrap figure is the relay's own cost.",
                "",
            ]
    im = [med("image_rtt", t) for t in ("stock", "bubblewrap", "gvisor")]
    if None not in im:
        lines += [
            "### 1 MB image",
            "",
            f"Displaying the 1 MB PNG takes {im[0]:.0f} ms on stock, {im[1]:.0f} ms through the "
            f"proxy on bubblewrap and {im[2]:.0f} ms on gVisor. The PNG travels base64-encoded "
            "(1.4 MB) inside a JSON message; the proxy path adds one more JSON line through the "
            "pipe (the agent splices the message into it without decoding it), a decode, the "
            "output firewall's checks on the payload and a re-serialization and re-signing in the "
            "proxy, so about two more passes over 1.4 MB in Python and one more process "
            "hand-off; under gVisor the pipe writes and the memory they touch also go through "
            "the Sentry.",
            "",
        ]
    cs = [med("cold_start", t) for t in ("stock", "bubblewrap", "gvisor")]
    if None not in cs:
        lines += [
            "### Cold start",
            "",
            f"A new stock kernel answers its first cell after {cs[0]:.2f} s; the proxy needs "
            f"{cs[1]:.2f} s on bubblewrap and {cs[2]:.2f} s on gVisor: the proxy's own ipykernel "
            "start, then the sandbox (bwrap namespaces, or runsc creating the gofer, the Sentry "
            "and the OCI bundle), then the agent and the inner ipykernel importing Python modules "
            "inside the sandbox, which under gVisor's ptrace platform is the dominant cost "
            "(thousands of stat/open/mmap syscalls).",
            "",
        ]
        ws = [med("warm_start", t) for t in ("bubblewrap", "gvisor")]
        wsb = [med("warm_start_sandbox", t) for t in ("bubblewrap", "gvisor")]
        if None not in ws and None not in wsb:
            lines += [
                f"With a warm pool (`sandbox-kernel pool`) the first reply comes after {ws[0]:.2f} s "
                f"on bubblewrap and {ws[1]:.2f} s on gVisor: the sandbox's part falls to "
                f"{wsb[0]:.0f} ms and {wsb[1]:.0f} ms (a unix-socket request, the pipes passed with "
                "SCM_RIGHTS, the buffered ready frame replayed), so what remains is the proxy "
                f"process itself, close to a stock kernel's {cs[0]:.2f} s: Python and ipykernel "
                "imports, ZMQ sockets, the client's connection. The 150 ms target would need the "
                "proxy process to be pre-started too (a kernel provisioner handing out ready "
                "proxies), which is outside the kernelspec model.",
                "",
            ]
    ce, cm = med("trivial_rtt", "e2b-emulated"), med("trivial_rtt", "modal-emulated")
    echo, run_true = med("e2b_sdk_echo_rtt", "e2b-emulated"), med("e2b_sdk_run_rtt", "e2b-emulated")
    if None not in (ce, cm, echo, run_true):
        lines += [
            "### Cloud backends through their emulations",
            "",
            f"Through the local emulations (loopback, sandboxes in bubblewrap), a `pass` cell "
            f"takes {ce:.2f} ms on the E2B backend and {cm:.2f} ms on the Modal backend. The E2B "
            f"SDK on its own moves one line to a running command and back (`send_stdin`, then "
            f"the stdout stream) in {echo:.2f} ms, and runs `commands.run(\"true\")` in "
            f"{run_true:.1f} ms (a whole process start; the proxy pays that once, at launch). So "
            f"the proxy and agent add about {ce - echo:.1f} ms per cell over the SDK's transport "
            f"round trip: the same two extra hops as on the local backend"
            + (f" ({b:.2f} ms in all there)" if b is not None else "")
            + ", plus an HTTP request per frame sent (`send_stdin`) and one stream chunk per frame "
            "received. These are not cloud figures: the emulators add no network latency; see "
            "docs/backends.md for the live run.",
            "",
        ]
    rs = [med("memory_idle_rss", t) for t in ("stock", "bubblewrap", "gvisor")]
    ps = [med("memory_idle_pss", t) for t in ("stock", "bubblewrap", "gvisor")]
    if None not in rs and None not in ps:
        lines += [
            "### Memory",
            "",
            f"An idle stock kernel holds {rs[0]:.0f} MiB RSS. The proxy adds a second Python "
            f"process on the host (the proxy itself, an ipykernel) and, inside, the agent: "
            f"{rs[1]:.0f} MiB RSS in all on bubblewrap ({ps[1]:.0f} MiB PSS). On gVisor the tree "
            f"holds {rs[2]:.0f} MiB RSS ({ps[2]:.0f} MiB PSS): the Sentry, the gofer and the "
            "`runsc run` parent are Go processes, and the sandboxed processes' memory lives in "
            "the Sentry's memory file, mapped both by the Sentry and by the ptrace stubs, so "
            "summing RSS counts it twice; PSS counts it once.",
            "",
        ]
    lines += _explain_lifecycle(results)
    return lines


def kernels_per_machine(results: dict) -> dict[str, Any]:
    """Computed, not measured: MemAvailable (at the fleet's start) / per-kernel PSS medians."""
    fleet = _res(results, "fleet_checkpointed_pss", "gvisor")
    avail = fleet.get("mem_available_before_mib")
    if avail is None:
        return {}
    out: dict[str, Any] = {"mem_available_mib": avail, "rows": []}
    for t in ("bubblewrap", "gvisor"):
        for st in ("running", "frozen", "restored", "checkpointed"):
            r = _res(results, f"mem_{st}_pss", t)
            if r:
                out["rows"].append((t, "running after a restore" if st == "restored" else st,
                                    r["median"], int(avail // r["median"])))
    if fleet:
        out["rows"].append(("gvisor", f"checkpointed, in the {fleet['kernels']}-kernel fleet",
                            fleet["median"], int(avail // fleet["median"])))
    return out


def _explain_lifecycle(results: dict) -> list[str]:
    lines: list[str] = []
    rb, rg = _res(results, "resume_freeze", "bubblewrap"), _res(results, "resume_freeze", "gvisor")
    rr = _res(results, "restore_checkpoint", "gvisor")
    if rb and rg and rr:
        be = lambda f, t: _res(results, f, t).get("median", float("nan"))  # noqa: E731
        lines += [
            "### Idle lifecycle: freeze, checkpoint, wake",
            "",
            f"A cell sent to a frozen kernel gets its execute_reply after {rb['median']:.0f} ms on "
            f"bubblewrap and {rg['median']:.0f} ms on gVisor (medians; the thaw itself is "
            f"{be('resume_freeze_backend', 'bubblewrap'):.1f} ms on bubblewrap (cgroup thaw or SIGCONT) and "
            f"{be('resume_freeze_backend', 'gvisor'):.0f} ms of `runsc resume`, the rest is the "
            "relay's replay request and the cell itself). A checkpointed gVisor kernel answers "
            f"after {rr['median']:.0f} ms (p90 {rr['p90']:.0f} ms): launching `runsc restore` takes "
            f"{be('restore_checkpoint_backend', 'gvisor'):.0f} ms, then the restore (a new gofer and "
            f"Sentry loading the {be('checkpoint_image_mib', 'gvisor'):.1f} MiB image) runs while the "
            "first request waits in the sandbox's stdin pipe. Freezing took "
            f"{be('freeze_pause_backend', 'gvisor'):.0f} ms and checkpointing "
            f"{be('checkpoint_backend', 'gvisor'):.0f} ms on gVisor, both while idle, unseen.",
            "",
        ]
    mg = [_res(results, f"mem_{st}_pss", "gvisor") for st in ("running", "frozen", "checkpointed")]
    sg = [_res(results, f"mem_{st}_sandbox_pss", "gvisor") for st in ("running", "frozen", "checkpointed")]
    mb = [_res(results, f"mem_{st}_pss", "bubblewrap") for st in ("running", "frozen")]
    if all(mg) and all(sg) and all(mb):
        lines += [
            "Memory (PSS of the whole tree, medians): on gVisor "
            f"{mg[0]['median']:.0f} MiB running, {mg[1]['median']:.0f} MiB frozen, "
            f"{mg[2]['median']:.0f} MiB checkpointed; on bubblewrap {mb[0]['median']:.0f} MiB running, "
            f"{mb[1]['median']:.0f} MiB frozen."
            + (f" A gVisor sandbox that was restored from a checkpoint holds more once running "
               f"again: {_res(results, 'mem_restored_pss', 'gvisor')['median']:.0f} MiB "
               f"({_res(results, 'mem_restored_sandbox_pss', 'gvisor')['median']:.0f} MiB for the sandbox "
               f"alone, against {sg[0]['median']:.0f} MiB fresh): the restore brings back the whole "
               "image, pages a fresh interpreter had not touched (or had released) included."
               if _res(results, "mem_restored_pss", "gvisor") and
               _res(results, "mem_restored_sandbox_pss", "gvisor") else "")
            + " A freeze frees CPU, not memory (it is meant to keep "
            "it: the wake is then tens of milliseconds). A checkpoint ends every runtime process: "
            f"the sandbox's own share goes from {sg[0]['median']:.0f} MiB to "
            f"{sg[2]['median']:.1f} MiB; what remains is the proxy kernel (an ipykernel process on "
            "the host, which must stay to keep the kernel's ZMQ ports and answer heartbeats and "
            "kernel_info) and its watchdog.",
            "",
        ]
    fleet = _res(results, "fleet_checkpointed_pss", "gvisor")
    kpm = kernels_per_machine(results)
    if fleet and kpm:
        fs, fr = _res(results, "fleet_start", "gvisor"), _res(results, "fleet_restore", "gvisor")
        lines += [
            "### Kernels per machine",
            "",
            f"**Measured**: {fleet['kernels']} idle gVisor kernels were started {fleet['batch']} at a "
            f"time (all up after {fleet['start_all_s']:.0f} s; median launch to first reply "
            f"{fs.get('median', float('nan')):.1f} s with the others starting beside it), each set `x`, "
            f"and all were checkpointed {fleet['all_checkpointed_after_s']:.0f} s after the first "
            f"launch. Checkpointed, their process trees held {fleet['total_pss']:.0f} MiB PSS in all "
            f"({fleet['total_rss']:.0f} MiB RSS; {fleet['median']:.1f} MiB per kernel, "
            f"{fleet['total_procs']} processes: one proxy and one watchdog each), the sandboxes "
            f"{fleet['total_sandbox_pss']:.1f} MiB ({fleet['total_sandbox_procs']} runtime processes "
            f"left); the images took {fleet['checkpoint_images_mib']:.0f} MiB of disk. MemAvailable "
            f"went from {fleet['mem_available_before_mib']} MiB before the first launch to "
            f"{fleet['mem_available_checkpointed_mib']} MiB with all of them checkpointed (the machine "
            "is shared, so this difference is indicative). Each was then woken in turn: "
            f"{fleet['state_kept']} of {fleet['kernels']} had kept `x`, the first reply came after "
            f"{fr.get('median', float('nan')):.0f} ms (median, p90 {fr.get('p90', float('nan')):.0f} ms); "
            f"waking, checking and shutting down all took {fleet.get('wake_and_shutdown_all_s', 0):.0f} s, "
            f"the whole run {fleet['total_s']:.0f} s, and left {fleet['leaked_state_dirs']} state "
            f"directories and {fleet['leaked_processes']} processes behind.",
            "",
            f"**Computed** (not measured: MemAvailable {kpm['mem_available_mib']} MiB at the fleet's "
            "start divided by the median PSS of one kernel in that state; CPU, disk and the "
            "per-kernel start time are not counted):",
            "",
            "| runtime | state | PSS per kernel (MiB) | kernels that fit |",
            "| --- | --- | ---: | ---: |",
        ] + [f"| {t} | {st} | {m:.1f} | {fit:,} |" for t, st, m, fit in kpm["rows"]] + [
            "",
            "Frozen kernels fit no better than running ones (a freeze keeps memory by design). "
            "Checkpointed ones are bound by the proxy process each keeps on the host, not by the "
            "sandbox.",
            "",
        ]
    return lines


def write_markdown(results: dict, path: Path, png_name: str) -> None:
    m = results["machine"]
    L = [
        "# Benchmarks",
        "",
        "<!-- generated by bench/run.py; do not edit by hand -->",
        "",
        "Stock ipykernel (the limit) and the sandbox-kernel proxy on each local runtime, "
        "measured the same way in one run. Regenerate with:",
        "",
        "```bash",
        ".venv/bin/python bench/run.py            # default (~10 min on 2 cores)",
        ".venv/bin/python bench/run.py --quick    # ~3 min",
        "```",
        "",
        f"This is a **{results['mode']}** run, {results.get('duration_s', 0):.0f} s in all; raw "
        "samples are in [`bench/results.json`](../bench/results.json).",
        "",
        "## Machine",
        "",
        "| | |",
        "| --- | --- |",
    ]
    for k in ("date", "cpu", "cores", "memory_gib", "kernel", "os", "runsc", "bwrap", "python",
              "ipykernel", "jupyter_client", "pyzmq", "sandbox_kernel", "git_commit", "git_dirty_kernel", "OPENBLAS_CORETYPE",
              "loadavg_at_start"):
        L.append(f"| {k} | {m.get(k, '') or '(unset)'} |")
    L += ["", "## Targets", "", "| target | what |", "| --- | --- |"]
    for t, d in results["targets"].items():
        L.append(f"| {d['label']} | {d['description']}{' (**emulated**)' if d['emulated'] else ''} |")
    L += ["", f"![benchmarks]({png_name})", "", "## Target checks (issues 4 and 7)", "",
          "| goal | kernel | verdict | value | detail |", "| --- | --- | --- | --- | --- |"]
    for c in results["checks"]:
        v = {"met": "✅ met", "missed": "❌ missed"}.get(c["verdict"], c["verdict"])
        if c["verdict"].startswith("met for"):
            v = "✅ " + c["verdict"]
        L.append(f"| {c['target']} | {c['subject']} | {v} | {c['value']} | {c['detail']} |")
    ro = results.get("relay_overhead", {})
    if ro:
        L += ["", "Relay overhead as the plain difference to stock (the brief's definition: "
              "proxy trivial RTT − stock trivial RTT): "
              + ", ".join(f"{n} +{v['proxy_minus_stock_ms']:.2f} ms" for n, v in ro.items()) + "."]
    L += ["", "## Figures", ""]
    for fname, f in results["figures"].items():
        L += [f"### {f['title']} ({f['unit']}{', higher is better' if f['higher_is_better'] else ''})",
              "", f"`{fname}`: {f['note']}"
              + (f" (Re-measured {f['remeasured']}.)" if f.get("remeasured") else "")
              + (f" Load average (1 min) while measured: {f['loadavg_1min'][0]:.1f} → "
                 f"{f['loadavg_1min'][1]:.1f}." if "loadavg_1min" in f else ""), "",
              f"| target | n | median | p90 | min | max |", "| --- | ---: | ---: | ---: | ---: | ---: |"]
        for t, d in results["targets"].items():
            r = f["results"].get(t)
            if r is None:
                continue
            if "error" in r:
                L.append(f"| {d['label']} | – | error: {r['error'][:120]} | | | |")
            else:
                L.append(f"| {d['label']} | {r['n']} | {_fmt(r['median'])} | {_fmt(r['p90'])} | "
                         f"{_fmt(r['min'])} | {_fmt(r['max'])} |")
        L.append("")
    L += ["## Why", ""] + _explain(results)
    L += [
        "## Method",
        "",
        "* Every kernel is started through `jupyter_client.KernelManager` on its kernelspec, as a "
        "frontend does (proxy kernelspecs are installed into a temporary prefix on `JUPYTER_PATH`).",
        "* Requests are timed by one loop (`TIMER_SRC` in `bench/run.py`) that waits on the shell "
        "and IOPub sockets with a single `zmq.Poller`, so no polling interval is added; a cell is "
        "done when both its execute_reply and its `idle` status have arrived. The lifecycle "
        "figures (a cell on a frozen or checkpointed kernel, the fleet's wakes) stop at the "
        "execute_reply, the moment the user's cell is answered, and check the kernel's state "
        "through the reply's `user_expressions`; the sandbox's state is polled with kernel_info, "
        "which the proxy answers without waking it.",
        "* Figures that need a new kernel each time (cold start, memory) launch their own; the "
        "others share one kernel per target (the three idle side by side), after warm-up cells. "
        "Each figure's samples are taken in rounds in which the targets take turns (order "
        "rotated each round), so a change in machine load is spread over all of them; requests "
        "are never concurrent.",
        "* The machine is shared: the 1-minute load average is recorded per figure. Other "
        "sessions' test suites were running during this run, which widens p90 and max and "
        "inflates every figure somewhat; medians of the same run are still comparable.",
        "* A figure marked *re-measured* was taken again, or added later, with `--merge` (same "
        "machine, later the same day: after it failed in the main run, or when it was "
        "registered, e.g. the warm-pool start); the others are from the main run.",
        "* p90 is the linear-interpolation percentile (numpy's default). Absolute numbers depend "
        "on the machine and its load; the comparison within one run is what counts.",
        "",
        "## Adding figures and targets",
        "",
        "`FIGURES`, `TARGETS` and `CHECKS` in `bench/run.py` are tables: register a function "
        "(as the lifecycle figures and the fleet are) or a "
        "target (an emulated E2B or Modal backend, marked `emulated=True`) and it appears in the "
        "JSON, the tables and the plot.",
        "",
    ]
    path.write_text("\n".join(L))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sample counts (~3 min)")
    ap.add_argument("--targets", default=",".join(TARGETS), help="comma-separated subset of "
                    + ", ".join(TARGETS))
    ap.add_argument("--figures", default=",".join(f for f, v in FIGURES.items()),
                    help="comma-separated subset of " + ", ".join(FIGURES))
    ap.add_argument("--out", default=str(RESULTS_JSON), help="results JSON path")
    ap.add_argument("--md", default=str(DOCS_MD), help="markdown report path")
    ap.add_argument("--png", default=str(DOCS_PNG), help="plot path")
    ap.add_argument("--merge", action="store_true",
                    help="keep the other figures of the existing results JSON; replace only the "
                         "figures measured now (e.g. to re-measure one that failed)")
    ap.add_argument("--report-only", action="store_true",
                    help="no measurements: rewrite the markdown and plot from the results JSON")
    a = ap.parse_args(argv)
    png = Path(a.png)
    if a.report_only:
        results = json.loads(Path(a.out).read_text())
        for f, v in results["figures"].items():  # titles and notes as the tables say now
            if f in FIGURES:
                fig = FIGURES[f]
                v.update(title=fig.title, unit=fig.unit, note=fig.note, plot=fig.plot)
        results["checks"] = [c.__dict__ for fn in CHECKS for c in fn(results)]
        Path(a.out).write_text(json.dumps(results, indent=1) + "\n")
        plot(results, png)
        write_markdown(results, Path(a.md), os.path.relpath(png, Path(a.md).parent))
        say(f"rewrote {a.md}, {a.png} from {a.out}")
        return 0
    targets = [t for t in a.targets.split(",") if t]
    figures = [f for f in a.figures.split(",") if f]
    for f in list(figures):  # a figure produced by another pulls that one in
        p = FIGURES[f].produced_by
        if p and p not in figures:
            figures.append(p)
    for f in list(figures):
        for g, v in FIGURES.items():
            if v.produced_by == f and g not in figures:
                figures.append(g)
    bad = [t for t in targets if t not in TARGETS] + [f for f in figures if f not in FIGURES]
    if bad:
        ap.error(f"unknown: {', '.join(bad)}")
    figures = [f for f in FIGURES if f in figures]
    results = run(a.quick, targets, figures)
    if a.merge and Path(a.out).exists():
        old = json.loads(Path(a.out).read_text())
        for f, v in results["figures"].items():
            if not v["results"]:
                continue  # not measured now (no target of this run applies)
            old["figures"].setdefault(f, {**{k: x for k, x in v.items() if k != "results"},
                                          "results": {}})
            for t, r in v["results"].items():
                old["figures"][f]["results"][t] = r
            old["figures"][f].update({k: x for k, x in v.items() if k in ("title", "unit", "note", "plot")})
            for k in ("loadavg_1min", "seconds"):
                if k in v:
                    old["figures"][f][k] = v[k]
                    old["figures"][f]["remeasured"] = results["machine"]["date"]
        old["figures"] = {f: old["figures"][f] for f in FIGURES if f in old["figures"]}
        old["targets"].update({n: d for n, d in results["targets"].items() if n not in old["targets"]})
        old["duration_s"] = round(old.get("duration_s", 0) + results["duration_s"], 1)
        old["relay_overhead"] = {}
        stock = _med(old, "trivial_rtt", "stock")
        for n in old["targets"]:
            v = _med(old, "trivial_rtt", n)
            if n != "stock" and v is not None and stock is not None:
                old["relay_overhead"][n] = {"proxy_minus_stock_ms": round(v - stock, 3)}
        old["checks"] = [c.__dict__ for fn in CHECKS for c in fn(old)]
        results = old
    Path(a.out).write_text(json.dumps(results, indent=1) + "\n")
    plot(results, png)
    write_markdown(results, Path(a.md), os.path.relpath(png, Path(a.md).parent))
    say(f"wrote {a.out}, {a.md}, {a.png} in {results['duration_s']:.0f} s")
    for c in results["checks"]:
        say(f"check: {c['target']} [{c['subject']}]: {c['verdict']} {c['value']} {c['detail']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
