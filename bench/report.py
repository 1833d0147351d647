"""The report: the plot (``docs/benchmarks.png``) and the markdown (``docs/benchmarks.md``)."""

from __future__ import annotations

from pathlib import Path

from bench.prose import lines, section
from bench.soak_report import markdown as soak_markdown
from bench.why import explain


def fmt(x: float) -> str:
    """A number with 3 significant digits or so, for the tables and the bars."""
    if x >= 100:
        return f"{x:.0f}"
    if x >= 10:
        return f"{x:.1f}"
    return f"{x:.2f}"


def plot(results: dict, path: Path) -> None:
    """One bar chart per plotted figure (median, whiskers min..p90), all targets side by side."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figs = [f for f, v in results["figures"].items() if v.get("plot", True)
            and any("median" in r for r in v["results"].values())]
    tnames = list(results["targets"])
    colors = {"stock": "#777777", "bubblewrap": "#4c72b0", "gvisor": "#dd8452"}
    cols = 3
    rows = max(1, (len(figs) + cols - 1) // cols)  # a run of unplotted figures only: one empty row
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
            ax.annotate(fmt(m), (x - 0.4, m), ha="left", va="bottom", fontsize=8,
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


#: The machine's fields, in the order of the report's table.
MACHINE_KEYS = ("date", "cpu", "cores", "memory_gib", "kernel", "os", "runsc", "bwrap", "python",
                "ipykernel", "jupyter_client", "pyzmq", "sandbox_kernel", "git_commit", "git_dirty_kernel",
                "OPENBLAS_CORETYPE", "loadavg_at_start")


def write_markdown(results: dict, path: Path, png_name: str) -> None:
    """``docs/benchmarks.md`` from ``results``; ``png_name`` is the plot, relative to ``path``."""
    m = results["machine"]
    L = [*section("head", mode=results["mode"], duration_s=results.get("duration_s", 0)),
         "## Machine", "", "| | |", "| --- | --- |"]
    for k in MACHINE_KEYS:
        L.append(f"| {k} | {m.get(k, '') or '(unset)'} |")
    L += ["", "## Targets", "", "| target | what |", "| --- | --- |"]
    for d in results["targets"].values():
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
        L += ["", *lines("relay_overhead", differences=", ".join(
            f"{n} +{v['proxy_minus_stock_ms']:.2f} ms" for n, v in ro.items()))]
    L += ["", "## Figures", ""]
    for fname, f in results["figures"].items():
        L += [f"### {f['title']} ({f['unit']}{', higher is better' if f['higher_is_better'] else ''})",
              "", f"`{fname}`: {f['note']}"
              + (f" (Re-measured {f['remeasured']}"
                 + (f", runsc {f['remeasured_runsc']}" if f.get("remeasured_runsc") else "") + ".)"
                 if f.get("remeasured") else "")
              + (f" Load average (1 min) while measured: {f['loadavg_1min'][0]:.1f} → "
                 f"{f['loadavg_1min'][1]:.1f}." if "loadavg_1min" in f else ""), "",
              "| target | n | median | p90 | min | max |", "| --- | ---: | ---: | ---: | ---: | ---: |"]
        for t, d in results["targets"].items():
            r = f["results"].get(t)
            if r is None:
                continue
            if "error" in r:
                L.append(f"| {d['label']} | – | error: {r['error'][:120]} | | | |")
            else:
                L.append(f"| {d['label']} | {r['n']} | {fmt(r['median'])} | {fmt(r['p90'])} | "
                         f"{fmt(r['min'])} | {fmt(r['max'])} |")
        L.append("")
    L += soak_markdown()
    L += ["## Why", ""] + explain(results)
    L += section("method")
    path.write_text("\n".join(L))
