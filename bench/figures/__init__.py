"""``FIGURES``: what is measured on each target, one module per group of figures.

Each module registers its figures when imported (``register(name, Figure(...))``).
The groups below are imported in this order, which is the order of the run, the
JSON, the tables and the plot; any other module in this folder is picked up after
them, in name order, so **a new figure is a new module here**.
"""

from __future__ import annotations

import importlib
import pkgutil

from bench.figures._registry import FIGURES, Figure, companions, register

ORDER = ("start", "latency", "pool", "cloud", "lifecycle", "fleet")


def _load() -> None:
    found = sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_"))
    for name in [*ORDER, *(n for n in found if n not in ORDER)]:
        importlib.import_module(f"{__name__}.{name}")


_load()

__all__ = ["FIGURES", "Figure", "companions", "register"]
