"""Checks shared by every output path: addresses, CSS that loads, MathJax commands, notices.

Pure functions on strings, no state.  Each answers one question the browser
would otherwise answer for us: "would this value make the page fetch
something?", "would MathJax turn this into a link or a style?".
"""

from __future__ import annotations

import html
import re

#: Raster (and SVG) images a ``data:`` URL may carry.  An image loaded from a
#: ``data:`` URL fetches nothing, and an SVG shown as an image runs no script
#: and loads no sub-resources.
_DATA_IMAGE = re.compile(r"data:image/(png|jpe?g|gif|webp|svg\+xml)[;,]", re.I)
_CONTROL = re.compile(r"[\x00-\x20\x7f]+")
_SCHEME = re.compile(r"^([a-z][a-z0-9+.\-]*):", re.I)

#: CSS functions and rules that make the browser load a resource.
CSS_LOADS = re.compile(r"(?i)(?:url|image-set|-webkit-image-set|image|cross-fade|element|src|expression)"
                       r"\s*\(|@import|@font-face|behavior\s*:|-moz-binding")

#: MathJax control sequences that make links, styles, classes or ids, load code
#: or fonts, or set attributes.  JupyterLab typesets math in markdown, LaTeX and
#: HTML outputs and in widget labels; its MathJax has every TeX package plus
#: ``require`` (``packages/mathjax-extension``).
MATH_ACTIVE_COMMANDS = ("href", "url", "style", "class", "cssId", "unicode", "require", "html", "data",
                        "mmlToken", "bbox", "toggle", "texttip", "mathtip", "fontfamily", "attr")
_MATH_ACTIVE = re.compile(r"\\(" + "|".join(MATH_ACTIVE_COMMANDS) + r")(?![A-Za-z])")

#: The reason given with every notice: what a notebook user needs to know.
REASON = "output from the sandbox may not run code in your browser or make it load anything"


def flat(value: str) -> str:
    """``value`` as a URL parser sees it: entities decoded, control characters and
    whitespace removed, lower case, backslashes as slashes (browsers treat ``\\`` as
    ``/`` in http(s) URLs)."""
    return _CONTROL.sub("", html.unescape(value)).lower().replace("\\", "/")


def is_inline_image(url: str) -> bool:
    """True if ``url`` is a ``data:image/...`` URL (the picture travels with the output).

    Parameters
    ----------
    url : str
        A URL as written in an attribute or spec (entities and whitespace allowed).
    """
    return bool(_DATA_IMAGE.match(flat(url)))


def link_ok(url: str) -> bool:
    """True if ``url`` may be a link target (followed only when the user clicks).

    http(s), mailto, ``#fragment`` and relative links; never ``javascript:``,
    ``data:``, ``vbscript:`` or any other scheme.
    """
    v = flat(url)
    if v.startswith(("http://", "https://", "mailto:", "#", "//")):
        return True
    return not _SCHEME.match(v)


def css_loads(value: str) -> bool:
    """True if the CSS text ``value`` could load a resource or run code.

    Backslashes count as a load (CSS escapes spell ``url(`` as ``u\\72 l(``), so do
    ``url(``, ``image-set(``, ``@import``, ``expression(`` and the like, in any case.
    """
    return "\\" in value or bool(CSS_LOADS.search(_CONTROL.sub("", html.unescape(value))))


def math_active(text: str) -> bool:
    """True if MathJax, typesetting ``text``, could make a link, style, class or id,
    load code or fonts, or set attributes (:data:`MATH_ACTIVE_COMMANDS`)."""
    return bool(_MATH_ACTIVE.search(text))


def neutralize_math(text: str) -> str:
    """``text`` with the backslash of every active MathJax command replaced by U+29F5
    (``⧵``), so the command shows as text instead of being typeset."""
    return _MATH_ACTIVE.sub(lambda m: "\u29f5" + m.group(1), text)


_MARKUP = re.compile(r"<[a-z!/?]", re.I)
#: An address a renderer could load: protocol-relative, absolute, or a script/data/file scheme.
ADDRESS = re.compile(r"^\s*[/\\]{2}|://|(?<![a-z0-9+.\-])((javascript|vbscript|livescript):|(data|file|blob|ftp):(?!\s))",
                     re.I)


def inert_text(value: str) -> bool:
    """True if no renderer could make ``value`` run, load or link anything: it has no
    markup, no address, no CSS that loads and no active MathJax command."""
    return not (_MARKUP.search(value) or ADDRESS.search(re.sub(r"[\x00-\x1f]", "", html.unescape(value)))
                or CSS_LOADS.search(value) or math_active(value))


def notice(removed: list[str] | set[str], where: str = "this output") -> str:
    """The one line a notebook user reads when something was removed.

    Parameters
    ----------
    removed : collection of str
        What was removed, in words (e.g. ``"JavaScript"``, ``"page-wide styles
        (<style>)"``); duplicates are dropped and the order kept.
    where : str
        What it was removed from.

    Returns
    -------
    str
        ``"sandbox-kernel: removed A, B from this output (<reason>)"``.
    """
    items = list(dict.fromkeys(removed))
    return f"sandbox-kernel: removed {', '.join(items)} from {where} ({REASON})"
