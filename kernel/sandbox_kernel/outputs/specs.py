"""Chart specifications from the sandbox: Vega, Vega-Lite and Plotly, checked for fetches.

A chart library loads what its spec names: Vega's loader fetches ``data.url``
and image marks' ``url`` (directly, through a signal, or from a data field);
vega-embed reads extra options (a loader, page CSS, spec patches) from the
spec's ``usermeta`` and from the output's metadata
(``packages/vega5-extension`` in JupyterLab); Plotly loads
``layout.images[].source``, image traces' ``source``, map styles and layers,
and styles its pseudo-HTML labels.  Such a chart cannot be made to draw without
its data, so it is not rendered (the type is removed, with a notice) unless
every address in it is an inline ``data:image/...``.  Vega's expression
language is trusted to stay inside its own interpreter: it is Vega's sandbox,
not ours.
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterator
from typing import Any

from .common import ADDRESS, CSS_LOADS, is_inline_image, math_active

#: The chart types JupyterLab 4 renders itself; other versions are unknown renderers.
VEGA_TYPES = frozenset({
    "application/vnd.vega.v5+json",
    "application/vnd.vegalite.v3+json", "application/vnd.vegalite.v4+json", "application/vnd.vegalite.v5+json",
})
PLOTLY_TYPE = "application/vnd.plotly.v1+json"

#: Plotly's pseudo-HTML tags in labels (``src/lib/svg_text_utils.js``); any other tag is not its markup.
_PLOTLY_TAG = re.compile(r"<(?!/?(a|b|i|em|sup|sub|br|span|s|u)\b)/?[a-z]", re.I)
_MAX_DEPTH = 200

FETCH_WORDS = "data or images loaded from an address"


def _items(obj: Any, depth: int = 0) -> Iterator[tuple[str | None, Any]]:
    """(key, value) for every value in a JSON document (key None inside lists)."""
    if depth > _MAX_DEPTH:
        raise ValueError("nested too deeply")
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield str(k), v
            yield from _items(v, depth + 1)
    elif isinstance(obj, list):
        for v in obj:
            yield None, v
            yield from _items(v, depth + 1)


def _inline(value: Any) -> bool:
    """A ``url`` value that fetches nothing: an inline image, or ``{"value": <inline image>}``."""
    if isinstance(value, dict) and set(value) == {"value"}:
        value = value["value"]
    return isinstance(value, str) and is_inline_image(value)


def vega_problems(spec: Any) -> list[str]:
    """Why a Vega or Vega-Lite spec may not be rendered (empty if it may).

    Parameters
    ----------
    spec : JSON value
        The value of a :data:`VEGA_TYPES` entry of a mime bundle.

    Returns
    -------
    list of str
        Sorted phrases: any ``url`` (data sources, lookups, image marks and
        their encodings) that is not an inline image, ``href`` links, CSS that
        loads, math commands; or that the spec is not an object.
    """
    if not isinstance(spec, dict):
        return ["a chart that is not a JSON object"]
    problems: set[str] = set()
    try:
        for key, value in _items(spec):
            if key == "url" and not _inline(value):
                problems.add(FETCH_WORDS)
            elif key == "href":
                problems.add("links set by the chart (href)")
            elif isinstance(value, str) and CSS_LOADS.search(value):
                problems.add("styles that load from an address")
    except ValueError:
        return ["a chart nested too deeply"]
    return sorted(problems)


def strip_usermeta(spec: dict) -> tuple[dict, bool]:
    """``spec`` without its top-level ``usermeta`` (vega-embed reads embed options there).

    Returns
    -------
    (dict, bool)
        The spec (the same object when there was none) and whether one was removed.
    """
    if "usermeta" not in spec:
        return spec, False
    return {k: v for k, v in spec.items() if k != "usermeta"}, True


def plotly_problems(figure: Any) -> list[str]:
    """Why a Plotly figure may not be rendered (empty if it may).

    Parameters
    ----------
    figure : JSON value
        The value of an ``application/vnd.plotly.v1+json`` entry
        (``{"data": [...], "layout": {...}, "config": {...}, "frames": [...]}``).

    Returns
    -------
    list of str
        Sorted phrases: any string that is an address (a scheme or ``//``), a
        ``source`` that is not an inline image, a map ``style`` naming a file,
        CSS that loads, math commands.
    """
    if not isinstance(figure, dict):
        return ["a chart that is not a JSON object"]
    problems: set[str] = set()
    try:
        for key, value in _items(figure):
            if key == "source" and isinstance(value, (str, list)):
                sources = value if isinstance(value, list) else [value]
                if not all(isinstance(v, str) and is_inline_image(v) for v in sources):
                    problems.add(FETCH_WORDS)
            elif key == "style" and isinstance(value, str) and re.search(r"[/.:\\]", value):
                problems.add("a map style loaded from an address")
            elif key in ("topojsonURL", "plotlyServerURL") and value:
                problems.add(FETCH_WORDS)
            elif isinstance(value, str):
                if ADDRESS.search(re.sub(r"[\x00-\x1f]", "", html.unescape(value))) and not is_inline_image(value):
                    problems.add("addresses")
                if _PLOTLY_TAG.search(value):
                    problems.add("HTML that is not Plotly's label markup")
                if CSS_LOADS.search(value):
                    problems.add("styles that load from an address")
                if math_active(value):
                    problems.add("math commands that make links or styles")
    except ValueError:
        return ["a chart nested too deeply"]
    return sorted(problems)
