"""The bench package without kernels: statistics on fixed lists, its tables."""

import pytest

from bench.run import FIGURES, TARGETS
from bench.stats import percentile, summarize


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
