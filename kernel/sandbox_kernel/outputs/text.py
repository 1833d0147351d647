"""Markdown and LaTeX from the sandbox: rendered only when nothing in them is active.

JupyterLab renders ``text/markdown`` with ``marked`` (GFM, raw HTML kept,
fenced ``mermaid`` blocks drawn as diagrams), puts the math back, inserts the
result as trusted HTML and typesets it with MathJax; ``text/latex`` is typeset
directly (``packages/rendermime/src/renderers.ts``).  Rewriting markdown would
break code spans, so a source with anything active is not rendered at all: the
firewall shows it as plain text instead, with a notice.  The checks read the
source as ``marked`` will: after backslash escapes and character references.
"""

from __future__ import annotations

import html
import re

from .common import flat, is_inline_image, math_active
from .html import _HTML_TAGS, describe_html_removals, sanitize_html

_TAG = re.compile(r"<[A-Za-z!/?][^>]*>?")
#: Autolinks (``<https://x>``, ``<a@b.c>``): links, not raw HTML; their scheme is checked with the others.
_AUTOLINK = re.compile(r"<([A-Za-z][A-Za-z0-9+.\-]{1,31}:[^\s<>]*|[\w.+\-]+@[\w\-]+(\.[\w\-]+)*)>")
_SCRIPT_SCHEME = re.compile(r"(javascript|vbscript|livescript):", re.I)
_DATA_URL = re.compile(r"data:(?!image/(png|jpe?g|gif|webp)[;,])", re.I)
_MERMAID = re.compile(r"(?im)^[ \t]{0,3}(`{3,}|~{3,})[ \t]*mermaid")
#: Link reference definitions, also inside block quotes and list items (so: anywhere).
_REF_DEF = re.compile(r"\[(?:[^\]\\]|\\.)+\]:[ \t]*\n?[ \t>]*(<[^>\n]*>|\S+)")
_ESCAPE = re.compile(r"\\([!-/:-@\[-`{-~])")

MATH_WORDS = "math commands that make links or styles"
IMAGE_WORDS = "images loaded from an address"


def _destination(raw: str) -> str:
    """A link destination as ``marked`` resolves it: escapes and references decoded."""
    raw = raw.strip()
    if raw.startswith("<") and raw.endswith(">"):
        raw = raw[1:-1]
    return html.unescape(_ESCAPE.sub(r"\1", raw))


def _inline_image_destinations(source: str) -> list[str]:
    """Destinations of ``![alt](dest)`` images (nested brackets and parentheses allowed)."""
    out = []
    for m in re.finditer(r"!\[", source):
        i, depth = m.end(), 1
        while i < len(source) and depth:
            c = source[i]
            i += 2 if c == "\\" else 1
            depth += (c == "[") - (c == "]")
        if depth or i >= len(source) or source[i] != "(":
            continue
        j, parens = i + 1, 1
        while j < len(source) and parens:
            c = source[j]
            j += 2 if c == "\\" else 1
            parens += (c == "(") - (c == ")")
        inner = source[i + 1:j - 1].strip()
        dest = inner[:inner.index(">") + 1] if inner.startswith("<") and ">" in inner else \
            (inner.split(None, 1) or [""])[0]
        out.append(_destination(dest))
    return out


def _images_fetch(source: str) -> bool:
    if "![" not in source:
        return False  # no image syntax: entities and escapes cannot make one
    dests = _inline_image_destinations(source) + [_destination(m.group(1)) for m in _REF_DEF.finditer(source)]
    return any(not is_inline_image(d) for d in dests)


def markdown_problems(source: str) -> list[str]:
    """Why ``source`` may not be rendered as trusted markdown (empty if it may).

    Parameters
    ----------
    source : str
        A ``text/markdown`` value.

    Returns
    -------
    list of str
        Sorted phrases for the notice: raw HTML the sanitiser would change (so
        ``<b>`` or ``<br>`` pass), script or ``data:`` addresses, images that are
        not inline (inline, reference-style, escaped or entity-spelt
        addresses), active MathJax commands, Mermaid diagrams.
    """
    problems: set[str] = set()
    for m in _TAG.finditer(source):
        tag = m.group(0)
        if _AUTOLINK.fullmatch(tag):
            continue
        if tag.startswith(("<!", "<?")):
            problems.add("raw HTML declarations or comments")
            continue
        if not tag.endswith(">"):
            tag += ">"
        if tag.startswith("</"):
            name = re.match(r"</\s*([A-Za-z][\w:-]*)", tag)
            if name and name.group(1).lower() not in _HTML_TAGS:
                problems.add(f"<{name.group(1).lower()}> elements")
            continue
        clean = sanitize_html(tag)
        if clean != tag and sanitize_html(tag + "</x>")[: len(tag)] != tag:
            problems.update(describe_html_removals(tag, clean) or ["raw HTML"])
    decoded = html.unescape(source)
    flattened = flat(_ESCAPE.sub(r"\1", source))
    if _SCRIPT_SCHEME.search(flattened):
        problems.add("script addresses")
    if _DATA_URL.search(flattened):
        problems.add("data: addresses")
    if math_active(source) or math_active(decoded):
        problems.add(MATH_WORDS)
    if _images_fetch(source):
        problems.add(IMAGE_WORDS)
    if _MERMAID.search(source):
        problems.add("a Mermaid diagram (its renderer is not known to be safe)")
    return sorted(problems)


def latex_problems(source: str) -> list[str]:
    """Why ``source`` may not be typeset as ``text/latex`` (empty if it may).

    Parameters
    ----------
    source : str
        A ``text/latex`` value (set as text, then typeset by MathJax).

    Returns
    -------
    list of str
        ``[MATH_WORDS]`` if it holds an active MathJax command, else empty.
    """
    return [MATH_WORDS] if math_active(source) else []


#: reStructuredText directives that embed markup, read a file or fetch an address when a
#: document is built from the output (nbsphinx, nbconvert's rst): ``raw``, ``include``, and
#: any directive given a ``:file:`` or ``:url:`` option (``csv-table``, ``raw``).
_RST_DIRECTIVE = re.compile(r"(?im)^[ \t]*\.\.[ \t]+(raw|include)[ \t]*::")
_RST_SOURCE_OPTION = re.compile(r"(?im)^[ \t]+:(file|url):")


def rst_problems(source: str) -> list[str]:
    """Why ``source`` may not pass as ``text/x-rst`` (empty if it may).

    JupyterLab shows reStructuredText as text; documentation tools (nbsphinx,
    nbconvert) build it into pages, where these parts of it are active.

    Parameters
    ----------
    source : str
        A ``text/x-rst`` value.

    Returns
    -------
    list of str
        Sorted phrases for the notice: ``raw`` or ``include`` directives, directive
        options that read a file or an address, script or ``data:`` addresses.
    """
    problems: set[str] = set()
    for m in _RST_DIRECTIVE.finditer(source):
        problems.add({"raw": "a raw directive", "include": "an include directive"}[m.group(1).lower()])
    if _RST_SOURCE_OPTION.search(source):
        problems.add("directive options that read a file or an address")
    flattened = flat(source)
    if _SCRIPT_SCHEME.search(flattened):
        problems.add("script addresses")
    if _DATA_URL.search(flattened):
        problems.add("data: addresses")
    return sorted(problems)
