"""The report's "Why" section: this run's numbers put into the prose of ``explain/*.md``.

Each paragraph appears only when the figures it quotes were measured.
"""

from __future__ import annotations

from typing import Any

from bench.figures.latency import stdout_mb
from bench.prose import fragment, lines, section
from bench.results import med, res

RUNTIMES = ("bubblewrap", "gvisor")
ALL = ("stock", *RUNTIMES)


def _meds(results: dict, fig: str, targets: tuple[str, ...] = ALL) -> dict[str, Any]:
    """``{target: median}`` of ``fig``, or {} unless every target was measured."""
    got = {t: med(results, fig, t) for t in targets}
    return got if None not in got.values() else {}


def explain(results: dict) -> list[str]:
    """The 'why' paragraphs, with this run's numbers in them."""
    out = _relay(results) + _stdout(results)
    im = _meds(results, "image_rtt")
    if im:
        out += section("image", **im)
    out += _start(results) + _cloud(results)
    rs, ps = _meds(results, "memory_idle_rss"), _meds(results, "memory_idle_pss")
    if rs and ps:
        out += section("memory", stock_rss=rs["stock"], bubblewrap_rss=rs["bubblewrap"],
                       bubblewrap_pss=ps["bubblewrap"], gvisor_rss=rs["gvisor"], gvisor_pss=ps["gvisor"])
    return out + explain_lifecycle(results) + _fork(results) + _ray(results)


def _fork(results: dict) -> list[str]:
    """Issue 30's figures: the pause, forks to first reply, memory, the image, the rewind."""
    from bench.checks import MITOS_FORK_MS
    from bench.figures.fork import STATE_MIB

    got = {f: res(results, f, "gvisor") for f in (
        "fork200_1_first_reply", "fork200_4_first_reply", "fork200_8_first_reply", "fork200_pause",
        "fork200_memory_mib", "fork200_source_memory_mib", "fork200_snapshot_mib", "fork200_rewind_first_reply")}
    if not all(got.values()):
        return []
    request = got["fork200_pause"].get("fork_request_ms") or [float("nan")]
    f1, f8 = got["fork200_1_first_reply"]["median"], got["fork200_8_first_reply"]["median"]
    return section("fork", state_mib=STATE_MIB, source_mib=got["fork200_source_memory_mib"]["median"],
                   pause=got["fork200_pause"], request_ms=request[len(request) // 2],
                   snapshot_mib=got["fork200_snapshot_mib"]["median"], fork1=f1,
                   fork4=got["fork200_4_first_reply"]["median"], fork8=f8, per_fork=(f8 - f1) / 7,
                   fork_mib=got["fork200_memory_mib"]["median"], rewind=got["fork200_rewind_first_reply"]["median"],
                   mitos_local=MITOS_FORK_MS["local"], mitos_hosted=MITOS_FORK_MS["hosted"])


def _ray(results: dict) -> list[str]:
    """Issue 31's figures: the Ray backend beside local gVisor and stock, and its fleet."""
    out: list[str] = []
    trio = ("stock", "gvisor", "ray")
    cs, rtt = _meds(results, "cold_start", trio), _meds(results, "trivial_rtt", trio)
    im = _meds(results, "image_rtt", trio)
    if cs and rtt and im:
        out += section("ray", ray_start=cs["ray"], gvisor_start=cs["gvisor"], stock_start=cs["stock"],
                       ray_rtt=rtt["ray"], gvisor_rtt=rtt["gvisor"], stock_rtt=rtt["stock"],
                       ray_image=im["ray"], gvisor_image=im["gvisor"])
    fleet, each = res(results, "ray_fleet_all_ready", "ray"), res(results, "ray_fleet_first_reply", "ray")
    if fleet and each and "nodes" in fleet:
        placed = ", ".join(f"{v} on node {k}" for k, v in sorted(fleet["nodes"].items()))
        out += section("ray_fleet", kernels=fleet["kernels"], all_ready=fleet["median"], placed=placed, each=each)
    moved = res(results, "ray_checkpoint_moved", "ray")
    if moved:
        images = moved.get("image_mib") or [float("nan")]
        out += section("ray_moved", moved=moved, image_mib=sorted(images)[len(images) // 2])
    return out


def _relay(results: dict) -> list[str]:
    rtt = _meds(results, "trivial_rtt")
    if not rtt:
        return []
    out = section("rtt", **rtt, bubblewrap_extra=rtt["bubblewrap"] - rtt["stock"],
                  gvisor_extra=rtt["gvisor"] - rtt["stock"])
    nested = _meds(results, "runtime_rtt")
    if nested:
        out += section("rtt_nested", **nested)
    return out


def _stdout(results: dict) -> list[str]:
    so = _meds(results, "stdout_throughput")
    if not so:
        return []
    out = section("stdout", **so)
    sc = _meds(results, "syscall_us")
    if sc:
        mb = stdout_mb(results["mode"] == "quick")
        calls = 2 * mb * 1_000_000 // 100
        old = med(results, "syscall_us", "gvisor-ptrace")
        ptrace = "" if old is None else f", {old:.1f} µs on the old runsc's ptrace platform (`gvisor-ptrace`)"
        out += section("stdout_syscalls", **sc, mb=mb, calls=calls, ptrace=ptrace,
                       gvisor_syscalls_s=calls * sc["gvisor"] / 1e6, gvisor_cell_s=mb / so["gvisor"],
                       stock_syscalls_s=calls * sc["stock"] / 1e6)
    return out


def _agent_archive() -> list[str]:
    """The A/B of ``bench/ab_start.py`` in ``bench/ab_agent_archive.json``, when both runtimes are there."""
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parent / "ab_agent_archive.json"
    try:
        ab = json.loads(path.read_text())
        fields = {"measured_at": ab["gvisor"]["measured_at"][:16].replace("T", " "),
                  "load": max(ab[r]["loadavg_1min_at_end"] for r in RUNTIMES),
                  "n": ab["gvisor"]["a"]["first_reply_s"]["n"], "cells": ab["gvisor"].get("cells", 20),
                  "a_commit": ab["gvisor"]["a"]["commit"], "b_commit": ab["gvisor"]["b"]["commit"]}
        for r in RUNTIMES:
            for side in ("a", "b"):
                fields[f"{r}_{side}"] = ab[r][side]["first_reply_s"]["median"]
                fields[f"{r}_s{side}"] = ab[r][side]["sandbox_s"]["median"]
                fields[f"{r}_c{side}"] = ab[r][side]["trivial_cell_ms"]["median"]
    except (OSError, ValueError, KeyError):
        return []
    return section("agent_archive", **fields)


def _early_start() -> list[str]:
    """The A/B of ``bench/ab_start.py`` in ``bench/ab_early.json`` (bubblewrap): the first
    sandbox started beside the proxy's imports."""
    import json
    from pathlib import Path

    try:
        ab = json.loads((Path(__file__).resolve().parent / "ab_early.json").read_text())["bubblewrap"]
        fields = {"measured_at": ab["measured_at"][:16].replace("T", " "), "load": ab["loadavg_1min_at_end"],
                  "n": ab["a"]["first_reply_s"]["n"], "a_commit": ab["a"]["commit"], "b_commit": ab["b"]["commit"]}
        for side in ("a", "b"):
            fields[side] = ab[side]["first_reply_s"]["median"]
            fields[f"{side}_min"] = ab[side]["first_reply_s"]["min"]
            fields[f"s{side}"] = ab[side]["sandbox_s"]["median"]
    except (OSError, ValueError, KeyError):
        return []
    return section("early_start", **fields)


def _start(results: dict) -> list[str]:
    cs = _meds(results, "cold_start")
    if not cs:
        return []
    out = section("cold_start", **cs) + _agent_archive() + _early_start()
    ws, wsb = _meds(results, "warm_start", RUNTIMES), _meds(results, "warm_start_sandbox", RUNTIMES)
    wsn = _meds(results, "warm_start_new_process", RUNTIMES)
    if ws and wsb and wsn:
        out += section("warm_start", **ws, bubblewrap_sandbox=wsb["bubblewrap"],
                       gvisor_sandbox=wsb["gvisor"], bubblewrap_new=wsn["bubblewrap"],
                       gvisor_new=wsn["gvisor"], stock_cold=cs["stock"])
    sp, spn, spf = (_meds(results, "template_start", RUNTIMES), _meds(results, "template_start_new_process", RUNTIMES),
                    _meds(results, "template_first_ever", RUNTIMES))
    boot = _meds(results, "template_first", RUNTIMES)
    rs, mem = _meds(results, "restart"), _meds(results, "mem_running_sandbox_pss", RUNTIMES)
    if sp and spn and spf and boot and rs and mem:
        out += section("spares", **sp, bubblewrap_new=spn["bubblewrap"], gvisor_new=spn["gvisor"],
                       stock=cs["stock"], bubblewrap_restart=rs["bubblewrap"], gvisor_restart=rs["gvisor"],
                       stock_restart=rs["stock"], bubblewrap_mib=mem["bubblewrap"], gvisor_mib=mem["gvisor"],
                       bubblewrap_first=spf["bubblewrap"], gvisor_first=spf["gvisor"],
                       bubblewrap_boot=boot["bubblewrap"], gvisor_boot=boot["gvisor"])
    return out


def _cloud(results: dict) -> list[str]:
    e2b, modal = med(results, "trivial_rtt", "e2b-emulated"), med(results, "trivial_rtt", "modal-emulated")
    echo, run_true = med(results, "e2b_sdk_echo_rtt", "e2b-emulated"), med(results, "e2b_sdk_run_rtt", "e2b-emulated")
    if None in (e2b, modal, echo, run_true):
        return []
    assert e2b is not None and echo is not None  # for the type checker
    b = med(results, "trivial_rtt", "bubblewrap")
    return section("cloud", e2b=e2b, modal=modal, echo=echo, run_true=run_true, relay_extra=e2b - echo,
                   local_total=" " + fragment("cloud_local_total", bubblewrap=b) if b is not None else "")


def kernels_per_machine(results: dict) -> dict[str, Any]:
    """Computed, not measured: MemAvailable (at the fleet's start) / per-kernel PSS medians."""
    fleet = res(results, "fleet_checkpointed_pss", "gvisor")
    avail = fleet.get("mem_available_before_mib")
    if avail is None:
        return {}
    out: dict[str, Any] = {"mem_available_mib": avail, "rows": []}
    for t in RUNTIMES:
        for st in ("running", "frozen", "restored", "checkpointed"):
            r = res(results, f"mem_{st}_pss", t)
            if r:
                out["rows"].append((t, "running after a restore" if st == "restored" else st,
                                    r["median"], int(avail // r["median"])))
    if fleet:
        out["rows"].append(("gvisor", f"checkpointed, in the {fleet['kernels']}-kernel fleet",
                            fleet["median"], int(avail // fleet["median"])))
    return out


def explain_lifecycle(results: dict) -> list[str]:
    """The lifecycle's part of the 'why': wake latencies, memory per state, kernels per machine."""
    out: list[str] = []
    rb, rg = res(results, "resume_freeze", "bubblewrap"), res(results, "resume_freeze", "gvisor")
    rr = res(results, "restore_checkpoint", "gvisor")
    if rb and rg and rr:
        be = lambda f, t: res(results, f, t).get("median", float("nan"))  # noqa: E731
        out += section("lifecycle", frozen_bubblewrap=rb, frozen_gvisor=rg, restore=rr,
                       thaw_bubblewrap=be("resume_freeze_backend", "bubblewrap"),
                       thaw_gvisor=be("resume_freeze_backend", "gvisor"),
                       restore_launch=be("restore_checkpoint_backend", "gvisor"),
                       image_mib=be("checkpoint_image_mib", "gvisor"),
                       freeze_gvisor=be("freeze_pause_backend", "gvisor"),
                       checkpoint_gvisor=be("checkpoint_backend", "gvisor"))
    out += _lifecycle_memory(results)
    fleet = res(results, "fleet_checkpointed_pss", "gvisor")
    kpm = kernels_per_machine(results)
    if fleet and kpm:
        fs, fr = res(results, "fleet_start", "gvisor"), res(results, "fleet_restore", "gvisor")
        out += lines("kernels_per_machine", fleet=fleet, kpm=kpm,
                     fleet_start=fs.get("median", float("nan")),
                     fleet_restore=fr.get("median", float("nan")),
                     fleet_restore_p90=fr.get("p90", float("nan")),
                     wake_all_s=fleet.get("wake_and_shutdown_all_s", 0))
        out += [f"| {t} | {st} | {m:.1f} | {fit:,} |" for t, st, m, fit in kpm["rows"]]
        out += ["", *section("kernels_per_machine_after")]
    return out


def _lifecycle_memory(results: dict) -> list[str]:
    g = {st: res(results, f"mem_{st}_pss", "gvisor") for st in ("running", "frozen", "checkpointed")}
    sg = {st: res(results, f"mem_{st}_sandbox_pss", "gvisor") for st in ("running", "frozen", "checkpointed")}
    b = {st: res(results, f"mem_{st}_pss", "bubblewrap") for st in ("running", "frozen")}
    if not (all(g.values()) and all(sg.values()) and all(b.values())):
        return []
    restored = res(results, "mem_restored_pss", "gvisor")
    restored_sb = res(results, "mem_restored_sandbox_pss", "gvisor")
    return section(
        "lifecycle_memory",
        gvisor_running=g["running"]["median"], gvisor_frozen=g["frozen"]["median"],
        gvisor_checkpointed=g["checkpointed"]["median"], bubblewrap_running=b["running"]["median"],
        bubblewrap_frozen=b["frozen"]["median"], sandbox_running=sg["running"]["median"],
        sandbox_checkpointed=sg["checkpointed"]["median"],
        restored=" " + fragment("lifecycle_memory_restored", restored=restored["median"],
                                restored_sandbox=restored_sb["median"],
                                sandbox_running=sg["running"]["median"])
        if restored and restored_sb else "")
