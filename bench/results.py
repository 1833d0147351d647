"""Reading summaries back from a results dict, and merging a run into an earlier one."""

from __future__ import annotations

from typing import Any


def med(results: dict, fig: str, tgt: str) -> float | None:
    """The median of figure ``fig`` on target ``tgt``, or None if it was not measured."""
    r = results["figures"].get(fig, {}).get("results", {}).get(tgt, {})
    return r.get("median") if "median" in r else None


def res(results: dict, fig: str, tgt: str) -> dict:
    """The summary of figure ``fig`` on target ``tgt`` ({} if it was not measured)."""
    r = results["figures"].get(fig, {}).get("results", {}).get(tgt, {})
    return r if "median" in r else {}


def relay_overhead(results: dict) -> dict[str, dict[str, float]]:
    """Proxy trivial RTT minus stock trivial RTT, per target measured beside stock."""
    derived = {}
    stock = med(results, "trivial_rtt", "stock")
    for n in results["targets"]:
        v = med(results, "trivial_rtt", n)
        if n != "stock" and v is not None and stock is not None:
            derived[n] = {"proxy_minus_stock_ms": round(v - stock, 3)}
    return derived


def merge(old: dict[str, Any], new: dict[str, Any], order: list[str]) -> dict[str, Any]:
    """``old`` (updated in place) with the figures measured in ``new`` replacing its own,
    figures kept in ``order`` (``--merge``); the caller recomputes the checks."""
    for f, v in new["figures"].items():
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
                old["figures"][f]["remeasured"] = new["machine"]["date"]
                if new["machine"].get("runsc") != old["machine"].get("runsc"):
                    old["figures"][f]["remeasured_runsc"] = new["machine"].get("runsc")
    old["figures"] = {f: old["figures"][f] for f in order if f in old["figures"]}
    # targets measured now are described as they are now (a target's meaning may have changed)
    measured = {t for v in new["figures"].values() for t in v["results"]}
    old["targets"].update({n: d for n, d in new["targets"].items() if n not in old["targets"] or n in measured})
    old["duration_s"] = round(old.get("duration_s", 0) + new["duration_s"], 1)
    old["relay_overhead"] = relay_overhead(old)
    return old
