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
