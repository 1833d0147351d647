"""The figure record and the registry every figure module adds itself to."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bench.harness import Context

#: Warm-up requests before the timed ones (the session figures, the E2B SDK figures).
WARMUP = 5
#: Idle seconds after a cell before memory is read (idle memory, the lifecycle's running state).
IDLE_BEFORE_MEMORY_S = 2.0


@dataclass
class Figure:
    """One measured quantity."""

    title: str
    unit: str
    #: fn(ctx, n) -> list of samples, or {figure_name: samples} to also fill companions
    #: (plus "_extra": {figure_name: {key: value}} for values that are not samples,
    #: stored next to the summary)
    fn: Callable[[Context, int], Any] | None
    n: int
    n_quick: int
    kind: str = "session"          # "session" (shared kernel) or "fresh" (own kernels)
    higher_is_better: bool = False
    note: str = ""
    #: filled by another figure's function (e.g. PSS alongside RSS)
    produced_by: str = ""
    #: targets it applies to (None = all)
    targets: tuple[str, ...] | None = None
    #: the n samples are taken in this many rounds, the targets taking turns (rotated
    #: each round), so a change in machine load is spread over all targets
    rounds: int = 4
    #: drawn in docs/benchmarks.png (the tables list every figure)
    plot: bool = True


#: Every figure by name, in registration order: the order of the run, the JSON, the
#: tables and the plot.
FIGURES: dict[str, Figure] = {}


def register(name: str, figure: Figure) -> Figure:
    """Add ``figure`` under ``name`` (called at import by each module of ``bench.figures``)."""
    if name in FIGURES:
        raise ValueError(f"figure {name!r} is registered twice")
    FIGURES[name] = figure
    return figure


def companions(name: str) -> list[str]:
    """``name`` and the figures its function also fills (``produced_by=name``)."""
    return [name] + [g for g, v in FIGURES.items() if v.produced_by == name]
