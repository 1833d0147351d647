"""Mime bundles (``{mime type: value}``) and their metadata, one output at a time.

Used for IOPub ``display_data``/``update_display_data``/``execute_result``,
``execute_reply`` page payloads, ``inspect_reply`` data and the outputs an
``Output`` widget holds.  Pure functions; the caller words the notice.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection
from typing import Any

from .html import clean_html, clean_mathml
from .specs import PLOTLY_TYPE, VEGA_TYPES, plotly_problems, strip_usermeta, vega_problems
from .svg import SvgError, sanitize_svg
from .text import latex_problems, markdown_problems, rst_problems

#: Types relayed as produced: their JupyterLab renderers show text or an inline image.
SAFE_TYPES = frozenset({
    "text/plain",
    "image/png", "image/jpeg", "image/gif", "image/webp",
    "application/json",
    "application/vnd.jupyter.widget-view+json",
    "application/vnd.jupyter.stdout", "application/vnd.jupyter.stderr",
    "text/csv", "text/tab-separated-values",
    # source code and configuration as text: no JupyterLab renderer runs or fetches them
    # (they are kept in the notebook and exported, as stock keeps them)
    "text/x-python", "text/x-ipython", "text/x-sh", "text/x-shellscript", "text/x-sql", "text/x-r",
    "text/x-julia", "text/x-c", "text/x-c++src", "text/x-java", "text/x-yaml", "text/yaml",
    "application/x-yaml", "text/x-toml", "application/toml", "text/x-diff", "text/x-patch",
})
#: Markup rendered by its own tool, checked for what could run, fetch or read files
#: (:mod:`.text`); refused, its source is shown as text instead.
_CHECKED_TEXT = {"text/markdown": markdown_problems, "text/latex": latex_problems,
                 "text/x-rst": rst_problems, "text/restructuredtext": rst_problems}
#: Types that are code for the browser; always removed.
SCRIPT_TYPES = frozenset({
    "application/javascript", "text/javascript", "application/x-javascript",
    "application/ecmascript", "text/ecmascript",
})
WIDGET_VIEW_TYPE = "application/vnd.jupyter.widget-view+json"
MATHML_TYPE = "application/mathml+xml"
#: The ``text/plain`` IPython gives an object with no text form of its own
#: (``<IPython.core.display.Javascript object>``): once the rich entry it stood
#: beside is removed it says nothing to the reader, so the notice takes its place.
_DEFAULT_REPR = re.compile(r"<[\w.]+ object(?: at 0x[0-9a-fA-F]+)?>")
#: Metadata a renderer may read for a type it shows (``renderImage``, the JSON
#: viewer, output isolation); anything else, e.g. vega-embed's
#: ``embed_options`` (which can inject page CSS and patch the spec), is removed.
SAFE_METADATA_KEYS = frozenset({"width", "height", "unconfined", "needs_background", "isolated",
                                "expanded", "root"})


def _default_repr(plain: Any) -> bool:
    return isinstance(plain, str) and _DEFAULT_REPR.fullmatch(plain.strip()) is not None


def base_type(mime: str) -> str:
    """``mime`` in lower case without parameters (``; charset=...``)."""
    return mime.split(";", 1)[0].strip().lower()


def is_safe_type(mime: str) -> bool:
    """True for MIME types relayed unchanged (:data:`SAFE_TYPES`)."""
    return base_type(mime) in SAFE_TYPES


def _shown_as_text(t: str, problems: list[str]) -> str:
    return f"the {t} rendering (shown as plain text instead: it had {', '.join(problems)})"


def filter_value(mime: str, value: Any, refused_widget: Callable[[str], bool]) -> tuple[Any, list[str]]:
    """Filter one entry of a bundle.

    Parameters
    ----------
    mime : str
        The entry's MIME type (any case, parameters allowed).
    value : JSON value
        Its value.
    refused_widget : callable
        ``refused_widget(model_id)`` is true for widgets the firewall refused.

    Returns
    -------
    (value or None, list of str)
        The value to keep (the same object when unchanged; None to remove the
        entry) and what was removed, in words.
    """
    t = base_type(mime)
    if t == WIDGET_VIEW_TYPE:
        model_id = value.get("model_id") if isinstance(value, dict) else None
        return (None, ["a widget drawn by unknown code"]) if refused_widget(str(model_id)) else (value, [])
    if t in SAFE_TYPES:
        return value, []
    if t in SCRIPT_TYPES:
        return None, ["JavaScript"]
    if t == "text/html":
        if not isinstance(value, str):
            return None, ["an HTML rendering that is not text"]
        clean, removed = clean_html(value)
        if clean is None:  # too big or too deep to sanitise: the bundle's text/plain stays
            return None, removed
        return (value if clean == value else clean), removed
    if t == MATHML_TYPE:
        if not isinstance(value, str):
            return None, ["a MathML rendering that is not text"]
        clean, removed = clean_mathml(value)
        return (value if clean == value else clean), removed
    if t == "image/svg+xml":
        if not isinstance(value, str):
            return None, ["an SVG rendering that is not text"]
        try:
            clean, removed = sanitize_svg(value)
        except SvgError as err:
            return None, [f"the SVG image ({err})"]
        return clean, ([f"{', '.join(removed)} (in the SVG image)"] if removed else [])
    if t in _CHECKED_TEXT:
        if not isinstance(value, str):
            return None, [f"the {t} rendering (not text)"]
        problems = _CHECKED_TEXT[t](value)
        return (None, [_shown_as_text(t, problems)]) if problems else (value, [])
    if t in VEGA_TYPES or t == PLOTLY_TYPE:
        problems = plotly_problems(value) if t == PLOTLY_TYPE else vega_problems(value)
        if problems:
            return None, [f"the {t} chart ({', '.join(problems)})"]
        if t in VEGA_TYPES:
            value, stripped = strip_usermeta(value)
            return value, (["the chart's embedding options (usermeta)"] if stripped else [])
        return value, []
    return None, [f"the {t} rendering (a type not known to be safe)"]


def filter_bundle(data: dict[str, Any], refused_widget: Callable[[str], bool] = lambda _id: False
                  ) -> tuple[dict[str, Any], list[str]]:
    """Filter one mime bundle.

    Parameters
    ----------
    data : dict
        ``{mime type: value}``; never modified in place.
    refused_widget : callable, optional
        See :func:`filter_value`.

    Returns
    -------
    (dict, list of str)
        The bundle (the same object when nothing changed) and what was removed,
        in words.  A ``text/markdown``, ``text/latex`` or ``text/x-rst`` entry that
        is not rendered leaves its source as ``text/plain`` when the bundle had none
        or only IPython's default object repr (``<IPython.core.display.Markdown object>``);
        a bundle left empty, or left with only IPython's default object repr
        (``<... object>``), gets an empty ``text/plain`` for the caller to fill.
    """
    out: dict[str, Any] = {}
    removed: list[str] = []
    changed = False
    plain_fallback: str | None = None
    for mime, value in data.items():
        new, what = filter_value(str(mime), value, refused_widget)
        removed += what
        if new is None:
            changed = True
            if isinstance(value, str) and base_type(str(mime)) in _CHECKED_TEXT:
                plain_fallback = value
            continue
        changed = changed or new is not value
        out[mime] = new
    if not changed:
        return data, []
    if plain_fallback is not None and ("text/plain" not in out or _default_repr(out["text/plain"])):
        out["text/plain"] = plain_fallback  # the source, shown as text (its notice says so)
    if not out or (set(out) == {"text/plain"} and len(data) > 1 and _default_repr(out["text/plain"])):
        out = {"text/plain": ""}
    return out, removed


def filter_metadata(metadata: Any, data: dict[str, Any], original: Collection[str]) -> tuple[Any, list[str]]:
    """Filter an output's metadata to what the renderers of the kept types may read.

    Parameters
    ----------
    metadata : dict
        The output's ``metadata``: per-type entries keyed by MIME type, and
        output-wide keys (``isolated``...), which pass.
    data : dict
        The filtered bundle.
    original : collection of str
        The MIME types of the bundle before filtering.

    Returns
    -------
    (dict, list of str)
        The metadata (the same object when unchanged) and what was removed.
    """
    if not isinstance(metadata, dict):
        return metadata, []
    out: dict[str, Any] = {}
    removed: list[str] = []
    for key, value in metadata.items():
        if key in original and key not in data:
            continue  # its entry was removed: already reported
        if "/" in key and isinstance(value, dict):
            kept = {k: v for k, v in value.items() if k in SAFE_METADATA_KEYS}
            if len(kept) != len(value):
                removed.append(f"display options for {key} ({', '.join(sorted(set(value) - set(kept)))})")
            value = kept if len(kept) != len(value) else value
        elif "/" in key:
            removed.append(f"display options for {key}")
            continue
        out[key] = value
    return (metadata if out == metadata else out), removed
