"""Statistics over samples: pure functions, no I/O."""

from __future__ import annotations

import statistics


def percentile(samples: list[float], q: float) -> float:
    """The ``q``-th percentile (0..100), linear interpolation between closest ranks.

    Same definition as numpy's default (``method="linear"``).

    >>> percentile([3.0, 1.0, 2.0], 90)
    2.8
    """
    if not samples:
        raise ValueError("percentile of no samples")
    xs = sorted(samples)
    rank = (len(xs) - 1) * q / 100.0
    lo = int(rank)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (rank - lo)


def summarize(samples: list[float]) -> dict[str, float | int]:
    """median, p90, min, max and n of a list of samples."""
    if not samples:
        raise ValueError("summary of no samples")
    return {"n": len(samples), "median": statistics.median(samples), "p90": percentile(samples, 90),
            "min": min(samples), "max": max(samples)}
