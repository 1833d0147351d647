"""bench/run.py's statistics on a fixed list (no timing assertions)."""

import importlib.util
import sys
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location(
    "bench_run", Path(__file__).resolve().parent.parent / "bench" / "run.py")
bench = importlib.util.module_from_spec(_spec)
sys.modules["bench_run"] = bench  # dataclasses look their module up here
_spec.loader.exec_module(bench)


def test_summarize_fixed_list():
    s = bench.summarize([5.0, 1.0, 4.0, 2.0, 3.0, 10.0, 6.0, 7.0, 8.0, 9.0])
    assert s == {"n": 10, "median": 5.5, "p90": pytest.approx(9.1), "min": 1.0, "max": 10.0}


def test_percentile_matches_numpy_linear():
    xs = [3.0, 1.0, 2.0]
    assert bench.percentile(xs, 0) == 1.0
    assert bench.percentile(xs, 50) == 2.0
    assert bench.percentile(xs, 90) == pytest.approx(2.8)
    assert bench.percentile([7.0], 90) == 7.0
    with pytest.raises(ValueError):
        bench.summarize([])


def test_tables_are_consistent():
    for name, fig in bench.FIGURES.items():
        assert fig.fn is not None or fig.produced_by in bench.FIGURES, name
    assert {"stock", "bubblewrap", "gvisor"} <= set(bench.TARGETS)
