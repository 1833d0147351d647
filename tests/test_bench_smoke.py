"""The bench package without kernels: statistics on fixed lists, its tables, its report."""

import json
from pathlib import Path

import pytest

from bench import DOCS_MD, RESULTS_JSON, prose
from bench.figures import FIGURES
from bench.report import write_markdown
from bench.run import refresh
from bench.stats import percentile, summarize
from bench.targets import TARGETS


def test_summarize_fixed_list():
    s = summarize([5.0, 1.0, 4.0, 2.0, 3.0, 10.0, 6.0, 7.0, 8.0, 9.0])
    assert s == {"n": 10, "median": 5.5, "p90": pytest.approx(9.1), "min": 1.0, "max": 10.0}


def test_percentile_matches_numpy_linear():
    xs = [3.0, 1.0, 2.0]
    assert percentile(xs, 0) == 1.0
    assert percentile(xs, 50) == 2.0
    assert percentile(xs, 90) == pytest.approx(2.8)
    assert percentile([7.0], 90) == 7.0
    with pytest.raises(ValueError):
        summarize([])


def test_tables_are_consistent():
    for name, fig in FIGURES.items():
        assert fig.fn is not None or fig.produced_by in FIGURES, name
    assert {"stock", "bubblewrap", "gvisor"} <= set(TARGETS)


def test_the_ray_target_takes_its_figures_only():
    from bench.run import applies

    assert [f for f in FIGURES if applies(f, "ray")] == [
        "cold_start", "trivial_rtt", "image_rtt", *[f for f in FIGURES if f.startswith("ray_")]]
    assert applies("memory_idle_rss", "gvisor") and applies("fork200_1_first_reply", "gvisor")
    assert not applies("fork200_1_first_reply", "stock") and not applies("memory_idle_rss", "ray")


def test_report_matches_the_committed_one(tmp_path):
    """docs/benchmarks.md is what the code and templates make of bench/results.json
    (as ``bench/run.py --report-only`` rewrites it): regenerate it after changing either."""
    results = refresh(json.loads(RESULTS_JSON.read_text()))
    out = tmp_path / "benchmarks.md"
    write_markdown(results, out, "benchmarks.png")
    assert out.read_text() == DOCS_MD.read_text()


def test_every_template_is_used():
    code = "".join(p.read_text() for p in Path(prose.__file__).parent.glob("*.py"))
    for template in prose.EXPLAIN.glob("*.md"):
        assert f'"{template.stem}"' in code, f"{template.name} is not used"


def _summary(median: float, **extra: object) -> dict:
    return {"n": 3, "median": median, "p90": median, "min": median, "max": median, **extra}


def test_fork_and_ray_prose_and_checks_from_fixed_numbers():
    """Issues 30 and 31: the report's paragraphs and checks from figures measured beside
    stock (no kernel started): each says what it was given, and neither appears unmeasured."""
    from bench.checks import evaluate
    from bench.why import explain

    figs: dict[str, dict] = {
        "fork200_1_first_reply": {"gvisor": _summary(1500.0)}, "fork200_4_first_reply": {"gvisor": _summary(3100.0)},
        "fork200_8_first_reply": {"gvisor": _summary(5800.0)},
        "fork200_pause": {"gvisor": _summary(205.0, fork_request_ms=[200.0, 240.0, 310.0])},
        "fork200_memory_mib": {"gvisor": _summary(320.0)}, "fork200_source_memory_mib": {"gvisor": _summary(327.0)},
        "fork200_snapshot_mib": {"gvisor": _summary(299.2)}, "fork200_rewind_first_reply": {"gvisor": _summary(809.0)},
        "cold_start": {"stock": _summary(0.9), "gvisor": _summary(1.6), "ray": _summary(6.2)},
        "trivial_rtt": {"stock": _summary(1.1), "gvisor": _summary(3.9), "ray": _summary(15.7)},
        "image_rtt": {"stock": _summary(12.0), "gvisor": _summary(20.0), "ray": _summary(33.8)},
        "ray_fleet_all_ready": {"ray": _summary(130.2, kernels=20, nodes={"029d8fc588ec": 10, "570914cfb496": 10},
                                                actors_left=[])},
        "ray_fleet_first_reply": {"ray": _summary(86.0)},
        "ray_checkpoint_moved": {"ray": _summary(3.85, image_mib=[88.6])},
    }
    results = {"mode": "quick", "figures": {f: {"results": r} for f, r in figs.items()}}
    text = "\n".join(explain(results))
    assert "### Fork and rewind of a kernel holding 200 MiB" in text and "paused for 205 ms" in text
    assert "eight 5800 ms" in text and "about 614 ms a fork" in text and "answers in 809 ms" in text
    assert "### The Ray backend on a local two-node cluster" in text and "6.2 s after launch" in text
    assert "20 kernels launched at once" in text and "10 on node 029d8fc588ec" in text
    assert "after 3.9 s" in text and "its 89 MiB image" in text
    got = {c["figure"]: c for c in evaluate(results)}
    assert got["fork200_8_first_reply"]["verdict"] == "met" and "1: 1500 ms" in got["fork200_8_first_reply"]["value"]
    assert got["ray_fleet_all_ready"]["verdict"] == "met"
    results["figures"]["ray_fleet_all_ready"]["results"]["ray"]["actors_left"] = ["sandbox-kernel-x"]
    results["figures"]["fork200_1_first_reply"]["results"]["gvisor"] = {"error": "ForkFailed: lost"}
    got = {c["figure"]: c for c in evaluate(results)}
    assert got["ray_fleet_all_ready"]["verdict"] == "missed" and "sandbox-kernel-x" in got["ray_fleet_all_ready"]["detail"]
    assert got["fork200_8_first_reply"]["verdict"] == "missed" and "ForkFailed" in got["fork200_8_first_reply"]["detail"]
    empty = {"mode": "quick", "figures": {}}
    assert not [line for line in explain(empty) if "Fork" in line or "Ray" in line]


def test_a_target_whose_setup_fails_errs_only_in_its_figures(monkeypatch):
    """A target that cannot start (no Ray here, say) is reported in the figures it takes, no others."""
    import dataclasses
    import os

    from bench import run as bench_run

    def fail(bench):
        raise RuntimeError("no cluster")

    monkeypatch.setitem(TARGETS, "ray", dataclasses.replace(TARGETS["ray"], setup=fail, teardown=None))
    monkeypatch.setenv("JUPYTER_PATH", os.environ.get("JUPYTER_PATH", ""))  # the run prepends its prefix
    results = bench_run.run(True, ["ray"], ["memory_idle_rss", "memory_idle_pss", "cold_start"])
    assert results["figures"]["cold_start"]["results"] == {"ray": {"error": "setup: no cluster"}}
    assert results["figures"]["memory_idle_rss"]["results"] == {}
