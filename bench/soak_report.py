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


#: The leftovers' kinds in words (the emulators' are "e2b sandboxes", "modal state dirs"...).
_LEFT = {"state_dirs": "state directories", "gc_dry_run": "`gc --dry-run`"}


def _rt(name: str, emulated: list[str]) -> str:
    """A runtime's name for the tables: the cloud emulations marked **emulated**."""
    return f"{name} **emulated**" if name in emulated else name


def markdown(path: Path = SOAK_JSON) -> list[str]:
    """The section's lines, or none when ``path`` does not exist."""
    if not path.exists():
        return []
    r: dict[str, Any] = json.loads(path.read_text())
    emulated: list[str] = r.get("emulated", [])
    L = ["## Under load and faults (issue 16)", "",
         f"From one run of `python -m bench.soak` ({r['date']}, {r['duration_s']:.0f} s, "
         f"{r['kernels']} live kernels over {', '.join(r['runtimes'])}, memory_mib={r['memory_mib']}; "
         f"1-min load average {r.get('loadavg_end', 0):.1f} at the end; the machine is shared). "
         "Per runtime, some kernels stay quiet (`x += 1` timed, checksummed prints) while the others "
         "print, plot, read `input()`, show an ipywidgets slider and move it (its `comm_open` and "
         "`comm_msg` checked) and take one fault after another; the quiet kernels first run "
         f"{r['quiet_s']:.0f} s alone. A state directory of its own: admission counts only this run's "
         "sandboxes, and the leftovers are this run's.", ""]
    if emulated:
        L += [f"Rows marked **emulated** ({', '.join(emulated)}) are the E2B and Modal backends through "
              "their real SDKs against the test suite's emulators on loopback (`tests/emulators/`, the "
              "sandboxes bubblewrap on this machine, one emulator instance for the quiet kernel and one "
              "for the misbehaving one): they show how the proxy and the backend take a cloud's faults, "
              "not the cloud's latency or its own failures. Their faults are a cloud's: the agent's "
              "process killed inside the sandbox (`agent-killed`), every process of the sandbox "
              "stopped (`sandbox-hung`), the sandbox ended by the service as on its timeout "
              "(`sandbox-terminated`), the service unreachable for 4 s, streams cut and requests "
              "refused (`service-outage`); the local helpers' deaths and the fork bomb do not apply "
              "(an emulated sandbox has no pids limit of its own).", ""]
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
        L.append(f"| {_rt(rt, emulated)} | {a['n']} | {_ms(a['p50'])} | {_ms(a['p99'])} | {c['n']} | {_ms(c['p50'])} | "
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
          f"* **Leftovers after shutdown: {r['leftover_count']}** ("
          + ", ".join(f"{_LEFT.get(k, k.replace('_', ' '))} {len(v)}" for k, v in lo.items()) + ").",
          f"* Workload cells that failed: {len(r['failed'])}"
          + (": " + "; ".join(x[:160] for x in r["failed"][:5]) if r["failed"] else "")
          + f" (of which {r.get('widget_cells', 0)} widget cells).", *_cloud_lines(r), "",
          "Seconds to the error: from the fault (or, for a bomb, from the cell's start) to the "
          "affected cell's error reply. `sigstop-agent` is the liveness watch (this run: "
          "`ping_after_s=2`, `pong_timeout_s=4`; defaults 10 and 20); `client-gone` is the time to "
          "the reply of the next cell a new client sent (queued behind the abandoned one); "
          "`proxy-killed` is how long the frontend (jupyter_client polling the process, under "
          "this load) took to see the kernel die, then it restarted it; the old sandbox's watchdog "
          "removed it (the leftovers above); `frontend-restart` (Jupyter's restart button while a "
          "cell runs and another waits) is the time until the new kernel answered, both old cells "
          "having got a reply naming the shutdown; `service-outage` may end `ok` (Modal's client "
          "retries by offset and the cell goes on: then the time is the whole cell's).", "",
          "| fault | runtime | survived | s to the error | what the cell said |",
          "| --- | --- | --- | ---: | --- |"]
    for f in r["faults"]:
        msg = (f["message"] or f["why"]).replace("|", "/").replace("\n", " ")[:200]
        survived = "yes" if f["survived"] else "NO: " + f["why"][:80]
        L.append(f"| {f['fault']} | {_rt(f['runtime'], emulated)} | {survived} | "
                 f"{f['seconds_to_error'] if f['seconds_to_error'] is not None else '-'} | {msg} |")
    return [*L, ""]


def _cloud_lines(r: dict[str, Any]) -> list[str]:
    """The emulations' own lines: sandboxes created, and how a killed proxy's sandbox ended."""
    if not r.get("emulated"):
        return []
    made = ", ".join(f"{rt} {n}" for rt, n in r.get("sandboxes_created", {}).items())
    lines = [f"* Emulated sandboxes created: {made}; still running or holding a directory after shutdown: "
             "the emulators' counts in the leftovers above. The sandbox of a SIGKILLed proxy "
             "(`proxy-killed`) is waited for: it ends at the cloud's dead-man's switch, `deadman_s=20` "
             "in this run (E2B: the sandbox timeout the proxy stops refreshing; Modal: the agent ends "
             "without the proxy's keepalive, then `idle_timeout_s=2` ends the sandbox)."]
    left = r.get("left_to_service_timeout", {})  # runs from before Modal had its switch
    if left:
        lines.append("* **Left to the service's own timeout**: "
                     + "; ".join(f"{rt}: {len(ids)} sandbox(es) ({', '.join(ids)})" for rt, ids in left.items()))
    return lines
