"""``CHECKS``: the performance goals, each a function from the results to verdicts.

The goals: the relay adds at most 10 % to the runtime's own trivial-cell time; stdout
within 20 % of stock; first reply within 150 ms with a warm pool; a frozen kernel
answers within 100 ms and a checkpointed one within 1 s; a checkpointed kernel holds no
resident sandbox memory; 50 checkpointed kernels keep their state; 1, 4 and 8 forks of a
200 MiB kernel each keep its state (issue 30); 20 kernels started at once on a two-node
Ray cluster all answer, on both nodes, and leave no actor (issue 31).  A verdict is met,
missed (by how much, and why) or not measured.

**Extension point**: a new goal is a function appended to ``CHECKS``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from bench.results import med, res
from bench.targets import TARGETS


@dataclass
class Check:
    target: str        # the goal, in words
    figure: str
    subject: str       # the target (kernel) it is about
    verdict: str       # "met", "missed", "not measured"
    value: str
    detail: str


#: Reference costs of the runtimes for a trivial cell, given in the project's first brief
#: (the sandboxed-kernel core, measured on this machine before the relay existed): stock
#: 2 ms, the same stock kernel behind bubblewrap 2.2 ms and behind gVisor's ptrace
#: platform ~13 ms (runsc 20221219).  Used only when the nested ``runtime_rtt`` figure was not measured.
RUNTIME_REFERENCE_MS = {"bubblewrap": 2.2, "gvisor": 13.0}


def load(results: dict, fig: str) -> str:
    """The note "; load average a → b" (1 min, while ``fig`` was measured), or an empty string."""
    la = results["figures"].get(fig, {}).get("loadavg_1min")
    return f"; load average {la[0]:.1f} → {la[1]:.1f}" if la else ""


def check_relay_overhead(results: dict) -> list[Check]:
    out = []
    stock = med(results, "trivial_rtt", "stock")
    stock_nested = med(results, "runtime_rtt", "stock")
    for name, t in TARGETS.items():
        if not t.runtime:
            continue
        proxy = med(results, "trivial_rtt", name)
        nested = med(results, "runtime_rtt", name)
        if proxy is None or stock is None:
            out.append(Check("relay ≤ 10 % over the runtime", "trivial_rtt", name, "not measured", "-", ""))
            continue
        # the runtime's own cost for a host client: stock RTT + what the runtime adds to a
        # nested stock kernel (nested - nested on the host); bounded above by nested itself.
        if nested is not None and stock_nested is not None:
            runtime_est = stock + max(0.0, nested - stock_nested)
            basis = (f"runtime estimate {runtime_est:.2f} ms = stock {stock:.2f} ms + "
                     f"(nested {nested:.2f} − nested-on-host {stock_nested:.2f}) ms")
        else:
            runtime_est = RUNTIME_REFERENCE_MS[t.runtime]
            basis = f"runtime reference {runtime_est:.1f} ms from issue 2"
        over = proxy / runtime_est - 1
        verdict = "met" if over <= 0.10 else "missed"
        relay_ms = proxy - runtime_est
        out.append(Check(
            "relay ≤ 10 % over the runtime", "trivial_rtt", name, verdict,
            f"{proxy:.2f} ms vs {runtime_est:.2f} ms: {over * 100:+.0f} %",
            f"{basis}; relay ≈ {relay_ms:.2f} ms"
            + ("" if verdict == "met" else ": two extra hops (proxy ⇄ agent ⇄ inner kernel) for each "
               "of the ~4 messages of a cell, each parsed, checked and re-signed"
               + (", with the agent's syscalls intercepted by gVisor" if t.runtime == "gvisor" else ""))
            + ("" if verdict == "met" else f"; missed by {(over - 0.10) * 100:.0f} points "
               f"({proxy - 1.10 * runtime_est:.2f} ms over the 10 % budget)")))
    return out


def check_stdout(results: dict) -> list[Check]:
    out = []
    stock = med(results, "stdout_throughput", "stock")
    for name, t in TARGETS.items():
        if not t.runtime:  # stock itself, the emulated clouds, Ray (not asked for)
            continue
        v = med(results, "stdout_throughput", name)
        if v is None or stock is None:
            out.append(Check("stdout within 20 % of stock", "stdout_throughput", name,
                             "not measured", "-", ""))
            continue
        ratio = v / stock
        verdict = "met" if ratio >= 0.80 else "missed"
        out.append(Check("stdout within 20 % of stock", "stdout_throughput", name, verdict,
                         f"{v:.1f} vs {stock:.1f} MB/s: {ratio * 100:.0f} % of stock",
                         "" if verdict == "met" else
                         f"missed by {(0.80 - ratio) * 100:.0f} points "
                         f"(needs ≥ {0.8 * stock:.1f} MB/s)"
                         + ("; each flush wakes the IOPub thread, libzmq, the agent and the pipe "
                            "to the host through gVisor's Sentry" if t.runtime == "gvisor" else
                            "; each batch is framed, checked and re-signed once more")))
    return out


#: Issue 15: a warm-pool start to the first reply within 250 ms on both runtimes; 150 ms the goal.
WARM_START_LIMIT_S, WARM_START_GOAL_S = 0.250, 0.150


def check_warm_start(results: dict) -> list[Check]:
    out = []
    what = "first reply ≤ 250 ms with the warm pool (goal 150 ms)"
    for name, t in TARGETS.items():
        if not t.runtime:
            continue
        v, sb = med(results, "warm_start", name), med(results, "warm_start_sandbox", name)
        cold, fresh = med(results, "cold_start", name), med(results, "warm_start_new_process", name)
        if v is None:
            out.append(Check(what, "warm_start", name, "not measured", "-",
                             f"cold start: {cold:.2f} s" if cold else ""))
            continue
        verdict = "met" if v <= WARM_START_LIMIT_S else "missed"
        detail = "pre-started proxy and pooled sandbox"
        if sb is not None:
            detail += f"; sandbox part {sb:.0f} ms (pool hand-off to agent ready)"
        if fresh is not None:
            detail += f"; with a new proxy process instead: {fresh * 1000:.0f} ms"
        if cold is not None:
            detail += f"; cold start {cold:.2f} s"
        if v > WARM_START_GOAL_S:
            detail += (f"; {(v - WARM_START_GOAL_S) * 1000:.0f} ms over the 150 ms goal: the hand-over, "
                       "ipykernel's app initialising (sockets, threads) and the relay's first hops, "
                       "on 2 cores shared with the replacement spare and sandbox starting meanwhile")
        out.append(Check(what, "warm_start", name, verdict, f"{v * 1000:.0f} ms", detail))
    return out


def check_freeze_resume(results: dict) -> list[Check]:
    out = []
    for name in ("bubblewrap", "gvisor"):
        r, be = res(results, "resume_freeze", name), res(results, "resume_freeze_backend", name)
        if not r:
            out.append(Check("freeze resume ≤ 100 ms", "resume_freeze", name, "not measured", "-", ""))
            continue
        v = r["median"]
        verdict = "met" if v <= 100 else "missed"
        detail = (f"send → execute_reply of `x += 1` on a frozen kernel, median of {r['n']} "
                  f"(p90 {r['p90']:.0f} ms, max {r['max']:.0f} ms)"
                  + (f"; thaw alone {be['median']:.1f} ms" if be else "") + load(results, "resume_freeze"))
        if verdict == "missed":
            detail += (f"; missed by {v - 100:.0f} ms: "
                       + ("`runsc resume` is a new runsc process (Go start, reading the container "
                          "state, signalling the sandbox) before the cell is relayed"
                          if name == "gvisor" else "the thaw and the relay compete for 2 busy cores"))
        out.append(Check("freeze resume ≤ 100 ms", "resume_freeze", name, verdict, f"{v:.0f} ms", detail))
    return out


def check_restore(results: dict) -> list[Check]:
    r, be = res(results, "restore_checkpoint", "gvisor"), res(results, "restore_checkpoint_backend", "gvisor")
    out = [Check("checkpoint restore ≤ 1 s", "restore_checkpoint", "bubblewrap", "not possible", "-",
                 "no checkpoint on bubblewrap (Debian's CRIU 3.17 fails on this kernel): its second "
                 "level is a stop, state lost, with a notice")]
    if not r:
        out.append(Check("checkpoint restore ≤ 1 s", "restore_checkpoint", "gvisor", "not measured", "-", ""))
        return out
    v = r["median"]
    verdict = "met" if v <= 1000 else "missed"
    detail = (f"send → execute_reply of `x += 1` on a checkpointed kernel, median of {r['n']} "
              f"(p90 {r['p90']:.0f} ms, max {r['max']:.0f} ms)"
              + (f"; launching `runsc restore` {be['median']:.0f} ms of it" if be else "")
              + load(results, "resume_freeze"))
    fr = res(results, "fleet_restore", "gvisor")
    if fr:
        detail += f"; in the {fr['n']}-kernel fleet: median {fr['median']:.0f} ms, p90 {fr['p90']:.0f} ms"
    if verdict == "missed":
        detail += (f"; missed by {v - 1000:.0f} ms: `runsc restore` starts a new sandbox (gofer, "
                   "Sentry) and loads the image before the agent can answer, all CPU-bound on 2 cores")
    out.append(Check("checkpoint restore ≤ 1 s", "restore_checkpoint", "gvisor", verdict, f"{v:.0f} ms", detail))
    out.append(Check("checkpoint restore ≤ 400 ms median (issue 15)", "restore_checkpoint", "gvisor",
                     "met" if v <= 400 else "missed", f"{v:.0f} ms",
                     "same samples" + ("" if v <= 400 else
                                       f"; missed by {v - 400:.0f} ms: `runsc restore` loads the image "
                                       "and starts a Sentry and gofer before the agent answers")))
    return out


def check_checkpoint_memory(results: dict) -> list[Check]:
    sb, whole = res(results, "mem_checkpointed_sandbox_pss", "gvisor"), res(results, "mem_checkpointed_pss", "gvisor")
    run = res(results, "mem_running_pss", "gvisor")
    if not sb:
        return [Check("a checkpointed kernel holds no resident memory", "mem_checkpointed_sandbox_pss",
                      "gvisor", "not measured", "-", "")]
    verdict = "met" if sb["max"] < 1.0 else "missed"
    detail = (f"the sandbox (runsc, gofer, Sentry) holds {sb['max']:.1f} MiB PSS at most: no runtime process "
              f"is left; the proxy kernel and its watchdog stay, {whole['median']:.0f} MiB PSS"
              + (f" (running: {run['median']:.0f} MiB)" if run else ""))
    return [Check("a checkpointed kernel holds no resident memory", "mem_checkpointed_sandbox_pss", "gvisor",
                  verdict, f"{sb['median']:.1f} MiB", detail)]


def check_fleet(results: dict) -> list[Check]:
    r = res(results, "fleet_checkpointed_pss", "gvisor")
    if not r or "state_kept" not in r:
        return [Check("50 checkpointed kernels keep their state", "fleet_checkpointed_pss", "gvisor",
                      "not measured", "-", "")]
    n, kept = r["kernels"], r["state_kept"]
    verdict = "met" if kept == n and n >= 50 else ("missed" if kept < n else f"met for {n} (quick run)")
    leaks = r.get("leaked_state_dirs", 0) + r.get("leaked_processes", 0)
    return [Check("50 checkpointed kernels keep their state", "fleet_checkpointed_pss", "gvisor", verdict,
                  f"{kept}/{n} kept",
                  f"all checkpointed: {r['total_pss']:.0f} MiB PSS in all ({r['median']:.0f} MiB per kernel, the "
                  f"proxies and watchdogs), sandboxes {r['total_sandbox_pss']:.1f} MiB in "
                  f"{r['total_sandbox_procs']} processes; "
                  + ("nothing leaked after shutdown" if not leaks else f"{leaks} leftovers after shutdown"))]


#: Issue 15's goals for gVisor against stock: (figure, goal, bound, higher is better).
GVISOR_GOALS = (
    ("trivial_rtt", "gVisor trivial cell ≤ 2x stock", 2.0, False),
    ("stdout_throughput", "gVisor stdout ≥ 75 % of stock", 0.75, True),
    ("image_rtt", "gVisor 1 MB image ≤ 2x stock", 2.0, False),
    ("cold_start", "gVisor cold start ≤ 2x stock", 2.0, False),
)


def check_gvisor_speed(results: dict) -> list[Check]:
    """Issue 15: the default gVisor (a current runsc, platform ``auto``) against stock, and
    what the old runsc on ptrace (``gvisor-ptrace``) gave in the same run."""
    out = []
    for fig, goal, bound, higher in GVISOR_GOALS:
        stock, g = med(results, fig, "stock"), med(results, fig, "gvisor")
        if stock is None or g is None:
            out.append(Check(goal, fig, "gvisor", "not measured", "-", ""))
            continue
        ratio = g / stock
        met = ratio >= bound if higher else ratio <= bound
        old = med(results, fig, "gvisor-ptrace")
        detail = "" if old is None else f"old runsc on ptrace: {old / stock:.2f}x stock"
        out.append(Check(goal, fig, "gvisor", "met" if met else "missed",
                         f"{g:.2f} vs {stock:.2f}: {ratio:.2f}x stock", detail))
    stock, t, fresh = (med(results, "cold_start", "stock"), med(results, "template_start", "gvisor"),
                       med(results, "template_start_new_process", "gvisor"))
    if stock is not None and t is not None:
        extra = f"; with a new proxy process {fresh:.2f} s ({fresh / stock:.2f}x)" if fresh is not None else ""
        out.append(Check("gVisor start ≤ 2x stock, a later kernel of its policy", "template_start", "gvisor",
                         "met" if t / stock <= 2.0 else "missed", f"{t:.2f} vs {stock:.2f}: {t / stock:.2f}x stock",
                         f"default kernelspec: the policy's spare sandbox, pre-started proxy{extra}"))
    return out


def check_fast_by_default(results: dict) -> list[Check]:
    """Issue 28: with the default kernelspec (spare sandboxes), a new kernel (not the first
    of its policy) and a restart answer within 1.5x stock's start, the first kernel of a
    policy within 3x."""
    stock = med(results, "cold_start", "stock")
    rows = [("a new kernel ≤ 1.5x stock (default kernelspec)", "template_start", "gvisor", 1.5,
             "the policy's spare sandbox, pre-started proxy"),
            ("a new kernel ≤ 1.5x stock (default kernelspec)", "template_start", "bubblewrap", 1.5,
             "the policy's spare sandbox, pre-started proxy"),
            ("the first kernel of a policy ≤ 3x stock", "template_first", "gvisor", 3.0,
             "after a reboot: no spare pool, a new proxy process, the policy's start template restored"),
            ("the first kernel of a policy ≤ 3x stock", "template_first", "bubblewrap", 3.0,
             "after a reboot: no spare pool, a new proxy process, no checkpoint on bubblewrap: its sandbox "
             "started beside the proxy's imports")]
    out = []
    for goal, fig, target, bound, how in rows:
        v = med(results, fig, target)
        if stock is None or v is None:
            out.append(Check(goal, fig, target, "not measured", "-", how))
            continue
        out.append(Check(goal, fig, target, "met" if v / stock <= bound else "missed",
                         f"{v:.2f} vs {stock:.2f}: {v / stock:.2f}x stock", how))
    stock_restart = med(results, "restart", "stock")
    for target in ("bubblewrap", "gvisor"):
        v = med(results, "restart", target)
        if stock_restart is None or v is None:
            out.append(Check("restart ≤ 1.5x stock", "restart", target, "not measured", "-", ""))
            continue
        out.append(Check("restart ≤ 1.5x stock", "restart", target,
                         "met" if v / stock_restart <= 1.5 else "missed",
                         f"{v:.2f} vs {stock_restart:.2f}: {v / stock_restart:.2f}x stock",
                         "KernelManager.restart_kernel, default kernelspec (the policy's spare sandbox)"))
    return out


def _error(results: dict, fig: str, tgt: str) -> str:
    """The error a figure's run on ``tgt`` ended with ("" if none)."""
    return str(results["figures"].get(fig, {}).get("results", {}).get(tgt, {}).get("error", ""))[:300]


#: Issue 30 quotes mitos' fork to first execute_reply, p50: 104 ms local, 728 ms hosted (ms).
MITOS_FORK_MS = {"local": 104, "hosted": 728}


def check_fork(results: dict) -> list[Check]:
    """Issue 30: 1, 4 and 8 forks of a kernel holding 200 MiB, every fork with its source's
    state (the figure checks each fork's first cell), all 8 admitted at once."""
    goal = "fork of a 200 MiB kernel: 1, 4 and 8 forks, each with its source's state"
    got = {k: res(results, f"fork200_{k}_first_reply", "gvisor") for k in (1, 4, 8)}
    if not all(got.values()):
        err = _error(results, "fork200_1_first_reply", "gvisor")
        return [Check(goal, "fork200_8_first_reply", "gvisor", "missed" if err else "not measured", "-", err)]
    pause, mem = res(results, "fork200_pause", "gvisor"), res(results, "fork200_memory_mib", "gvisor")
    rew, snap = res(results, "fork200_rewind_first_reply", "gvisor"), res(results, "fork200_snapshot_mib", "gvisor")
    detail = (f"the forks' first cells checked (`len(xs)`); source paused {pause.get('median', float('nan')):.0f} ms "
              f"(median), {mem.get('median', float('nan')):.0f} MiB per fork, snapshot "
              f"{snap.get('median', float('nan')):.0f} MiB on disk, rewind to first reply "
              f"{rew.get('median', float('nan')):.0f} ms; mitos reports {MITOS_FORK_MS['local']} ms p50 local, "
              f"{MITOS_FORK_MS['hosted']} ms hosted, for its fork to first execute_reply (here each fork is a "
              "new kernel: its own proxy process started, its sandbox restored from the image)")
    value = ", ".join(f"{k}: {got[k]['median']:.0f} ms" for k in (1, 4, 8))
    return [Check(goal, "fork200_8_first_reply", "gvisor", "met", value, detail)]


def check_ray_fleet(results: dict) -> list[Check]:
    """Issue 31: 20 kernels started at once on the two-node local cluster: all answered,
    placed on both nodes, and no sandbox actor left once they were shut down."""
    goal = "20 kernels at once on a 2-node Ray cluster: all answer, both nodes used, nothing left"
    r = res(results, "ray_fleet_all_ready", "ray")
    if not r or "nodes" not in r:
        err = _error(results, "ray_fleet_all_ready", "ray")
        return [Check(goal, "ray_fleet_all_ready", "ray", "missed" if err else "not measured", "-", err)]
    nodes, left = r["nodes"], r.get("actors_left", [])
    each = res(results, "ray_fleet_first_reply", "ray")
    ok = len(nodes) >= 2 and not left
    detail = (f"placed {', '.join(f'{v} on {k}' for k, v in sorted(nodes.items()))}"
              + (f"; each launch to first reply: median {each['median']:.1f} s, max {each['max']:.1f} s"
                 if each else "")
              + (f"; sandbox actors left: {', '.join(left)}" if left else "; no sandbox actor left")
              + ("" if len(nodes) >= 2 else "; Ray placed them all on one node"))
    return [Check(goal, "ray_fleet_all_ready", "ray", "met" if ok else "missed",
                  f"{r['kernels']} in {r['median']:.1f} s", detail)]


CHECKS: list[Callable[[dict], list[Check]]] = [
    check_relay_overhead,
    check_stdout,
    check_warm_start,
    check_freeze_resume,
    check_restore,
    check_checkpoint_memory,
    check_fleet,
    check_gvisor_speed,
    check_fast_by_default,
    check_fork,
    check_ray_fleet,
    # ---- EXTENSION POINT: more checks
]


def evaluate(results: dict) -> list[dict]:
    """Every check's verdicts on ``results``, as the dicts stored in the JSON."""
    return [c.__dict__ for fn in CHECKS for c in fn(results)]
