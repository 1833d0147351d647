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
from bench.report import plot, write_markdown  # noqa: E402
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
