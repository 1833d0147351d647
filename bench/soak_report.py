"""The "Under load and faults" section of ``docs/benchmarks.md``, from ``bench/soak.json``
(written by ``python -m bench.soak``); standard library only."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench import ROOT

SOAK_JSON = ROOT / "bench" / "soak.json"


def _ms(x: float) -> str:
    return f"{x * 1000:.1f}"


def markdown(path: Path = SOAK_JSON) -> list[str]:
    """The section's lines, or none when ``path`` does not exist."""
    if not path.exists():
        return []
    r: dict[str, Any] = json.loads(path.read_text())
    L = ["## Under load and faults (issue 16)", "",
         f"From one run of `python -m bench.soak` ({r['date']}, {r['duration_s']:.0f} s, "
         f"{r['kernels']} live kernels over {', '.join(r['runtimes'])}, memory_mib={r['memory_mib']}; "
         f"1-min load average {r.get('loadavg_end', 0):.1f} at the end; the machine is shared). "
         "Per runtime, some kernels stay quiet (`x += 1` timed, checksummed prints) while the others "
         "print, plot, read `input()` and take one fault after another; the quiet kernels first run "
         f"{r['quiet_s']:.0f} s alone. A state directory of its own: admission counts only this run's "
         "sandboxes, and the leftovers are this run's.", ""]
    if r.get("admission"):
        L += ["### Kernels admitted", "",
              "Kernels started one by one until a first cell was refused (`AdmissionRefused`), with the "
              "default headroom (1024 MiB) and overcommit (1.0).", "",
              "| runtime | memory_mib | admitted | by the arithmetic | the same at 512 MiB | refused with |",
              "| --- | ---: | ---: | ---: | ---: | --- |"]
        for rt, a in r["admission"].items():
            L.append(f"| {rt} | {a['memory_mib']} | {a['admitted']} | {a['expected']} | "
                     f"{a['expected_at_512_mib']} | {a['refused'][:220] or '(none: limit of the run reached)'} |")
        L.append("")
    L += ["### Latency of the quiet kernels", "",
          "`x += 1` to its reply and idle, ms: alone, then while the other kernels misbehave.", "",
          "| runtime | alone n | alone p50 | alone p99 | with chaos n | with chaos p50 | with chaos p99 | p50 ratio "
          "| p99 ratio |",
          "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for rt, ph in r["latency_s"].items():
        a, c = ph.get("alone"), ph.get("chaos")
        if not a or not c:
            continue
        L.append(f"| {rt} | {a['n']} | {_ms(a['p50'])} | {_ms(a['p99'])} | {c['n']} | {_ms(c['p50'])} | "
                 f"{_ms(c['p99'])} | {c['p50'] / a['p50']:.2f} | {c['p99'] / a['p99']:.2f} |")
    L += ["", "Two cores, shared with the misbehaving kernels (a fork bomb, a memory bomb, restarts of "
          "sandboxes) and with other work on the machine: the issue's goal is within 2x of the quiet "
          "figure; the ratios above are the measurement."]
    o = r["outputs"]
    lo = r["leftovers"]
    L += ["", "### Outputs, faults, leftovers", "",
          f"* **Outputs lost: {o['bytes_lost']} bytes** of {o['bytes_expected']} in {o['cells_checked']} "
          f"checksummed cells (every line carries its index and CRC-32), {o['cells_out_of_order']} out of "
          f"order, {len(o['cut_with_notice'])} cut with a visible notice.",
          f"* **Faults survived: {r['faults_survived']} of {r['faults_injected']}** (the affected cell "
          "ended with an error naming the cause, and the kernel answered the next cell).",
          f"* **Leftovers after shutdown: {r['leftover_count']}** (state directories {len(lo.get('state_dirs', []))}, "
          f"cgroups {len(lo.get('cgroups', []))}, processes {len(lo.get('processes', []))}, "
          f"`gc --dry-run` {len(lo.get('gc_dry_run', []))}).",
          f"* Workload cells that failed: {len(r['failed'])}"
          + (": " + "; ".join(x[:160] for x in r["failed"][:5]) if r["failed"] else "") + ".", "",
          "Seconds to the error: from the fault (or, for a bomb, from the cell's start) to the "
          "affected cell's error reply. `sigstop-agent` is the liveness watch (this run: "
          "`ping_after_s=2`, `pong_timeout_s=4`; defaults 10 and 20); `client-gone` is the time to "
          "the reply of the next cell a new client sent (queued behind the abandoned one); "
          "`proxy-killed` is how long the frontend (jupyter_client polling the process, under "
          "this load) took to see the kernel die, then it restarted it; the old sandbox's watchdog "
          "removed it (the leftovers above); `frontend-restart` (Jupyter's restart button while a "
          "cell runs and another waits) is the time until the new kernel answered, both old cells "
          "having got a reply naming the shutdown.", "",
          "| fault | runtime | survived | s to the error | what the cell said |",
          "| --- | --- | --- | ---: | --- |"]
    for f in r["faults"]:
        msg = (f["message"] or f["why"]).replace("|", "/").replace("\n", " ")[:200]
        L.append(f"| {f['fault']} | {f['runtime']} | {'yes' if f['survived'] else 'NO: ' + f['why'][:80]} | "
                 f"{f['seconds_to_error'] if f['seconds_to_error'] is not None else '-'} | {msg} |")
    return [*L, ""]
