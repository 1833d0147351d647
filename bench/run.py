"""Benchmarks: the numbers a user compares, side by side with stock ipykernel.

One command measures every figure for every target in one run::

    .venv/bin/python bench/run.py            # default, ~10 min on a 2-core machine
    .venv/bin/python bench/run.py --quick    # smaller sample counts, ~3 min
    .venv/bin/python bench/run.py --targets stock,bubblewrap --figures trivial_rtt

(or ``python -m bench.run`` from the repository root) and writes
``bench/results.json`` (machine-readable, with the machine described),
``docs/benchmarks.md`` (a table per figure, target checks) and
``docs/benchmarks.png`` (the plot embedded in the markdown).

This module is the run loop and the command line; the package docstring
(``bench/__init__.py``) maps the rest.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

if __name__ == "__main__" and not __package__:
    # `python bench/run.py`: import the `bench` package from the repository root, not
    # this folder's modules as top-level ones.
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

from bench import DOCS_MD, DOCS_PNG, RESULTS_JSON, RUN_LOG
from bench.checks import evaluate
from bench.figures import FIGURES, companions
from bench.harness import Bench, Context, say
from bench.machine import machine
from bench.report import plot, write_markdown
from bench.results import merge, relay_overhead
from bench.stats import summarize
from bench.targets import TARGETS


def run(quick: bool, targets: list[str], figures: list[str]) -> dict:
    """Measure ``figures`` on ``targets``; the results dict, checks included."""
    bench = Bench(quick, RUN_LOG)
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
            except Exception as err:
                for f in figures:
                    if applies(f, tname):
                        results["figures"][f]["results"][tname] = {"error": f"setup: {err}"}
                say(f"{tname}: setup failed: {err}")
        # fresh-kernel figures first, while no shared kernel is running beside them
        for fname in sorted(figures, key=lambda f: FIGURES[f].kind != "fresh"):
            if FIGURES[fname].fn is not None:
                _measure(fname, quick, contexts, results)
    finally:
        for tname, ctx in contexts.items():
            try:
                ctx.close()
            finally:
                teardown = TARGETS[tname].teardown
                if teardown:
                    teardown(bench)
        bench.close()
    results["duration_s"] = round(time.perf_counter() - t_all, 1)
    results["relay_overhead"] = relay_overhead(results)
    results["checks"] = evaluate(results)
    return results


def applies(fname: str, tname: str) -> bool:
    """Whether figure ``fname`` is measured on target ``tname``: the figure's own ``targets``
    if it names any, else the target's ``figures`` (None: every such figure)."""
    fig, only = FIGURES[fname], TARGETS[tname].figures
    if fig.targets is not None:
        return tname in fig.targets
    return only is None or fname in only


def _measure(fname: str, quick: bool, contexts: dict[str, Context], results: dict[str, Any]) -> None:
    """Take figure ``fname`` (and its companions) on every target it applies to, in
    rounds with the targets taking turns; store the summaries in ``results``."""
    fig = FIGURES[fname]
    assert fig.fn is not None
    n = fig.n_quick if quick else fig.n
    rounds = max(1, min(fig.rounds, n))
    sizes = [n // rounds + (1 if i < n % rounds else 0) for i in range(rounds)]
    names = [t for t in contexts if applies(fname, t)]
    if not names:  # no target of this run takes it (or the ones that do failed their setup)
        return
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
            except Exception as err:
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
            for name in companions(fname):
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
    for name in companions(fname):
        if name in results["figures"]:
            results["figures"][name]["loadavg_1min"] = [round(load0, 2),
                                                        round(os.getloadavg()[0], 2)]
            results["figures"][name]["seconds"] = round(time.perf_counter() - t0, 1)


def refresh(results: dict) -> dict:
    """``results`` with titles, notes and checks as the code says now (``--report-only``)."""
    for f, v in results["figures"].items():
        if f in FIGURES:
            fig = FIGURES[f]
            v.update(title=fig.title, unit=fig.unit, note=fig.note, plot=fig.plot)
    results["checks"] = evaluate(results)
    return results


def _write_report(results: dict, md: str, png: str) -> None:
    plot(results, Path(png))
    write_markdown(results, Path(md), os.path.relpath(Path(png), Path(md).parent))


def _parser() -> argparse.ArgumentParser:
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
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = _parser()
    a = ap.parse_args(argv)
    if a.report_only:
        results = refresh(json.loads(Path(a.out).read_text()))
        Path(a.out).write_text(json.dumps(results, indent=1) + "\n")
        _write_report(results, a.md, a.png)
        say(f"rewrote {a.md}, {a.png} from {a.out}")
        return 0
    targets = [t for t in a.targets.split(",") if t]
    figures = [f for f in a.figures.split(",") if f]
    for f in list(figures):  # a figure produced by another pulls that one in
        p = FIGURES[f].produced_by
        if p and p not in figures:
            figures.append(p)
    for f in list(figures):
        for g in companions(f)[1:]:
            if g not in figures:
                figures.append(g)
    bad = [t for t in targets if t not in TARGETS] + [f for f in figures if f not in FIGURES]
    if bad:
        ap.error(f"unknown: {', '.join(bad)}")
    figures = [f for f in FIGURES if f in figures]
    results = run(a.quick, targets, figures)
    if a.merge and Path(a.out).exists():
        results = merge(json.loads(Path(a.out).read_text()), results, list(FIGURES))
        results["checks"] = evaluate(results)
    Path(a.out).write_text(json.dumps(results, indent=1) + "\n")
    _write_report(results, a.md, a.png)
    say(f"wrote {a.out}, {a.md}, {a.png} in {results['duration_s']:.0f} s")
    for c in results["checks"]:
        say(f"check: {c['target']} [{c['subject']}]: {c['verdict']} {c['value']} {c['detail']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
