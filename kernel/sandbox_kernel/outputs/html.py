"""HTML from the sandbox: sanitised with ``nh3`` (ammonia), every removal named.

JupyterLab inserts a trusted ``text/html`` output with ``innerHTML``, runs its
``<script>`` elements, typesets the math in it with MathJax and lets the
browser fetch whatever its images and styles point at
(``packages/rendermime/src/renderers.ts``, ``renderHTML``).  What survives
:func:`clean_html`: formatting and table markup, links (followed only on a
click), ``style`` attributes limited to colour, text and box properties with no
``url()``, ``<style>`` blocks reduced to rules that select by the output's own
classes or ids with those same properties, every selector confined to a
wrapper the firewall puts around the output (:func:`clean_stylesheet`: pandas'
table styling survives, ``body {...}``, ``#main`` or ``.jp-...`` rules do not), and
``<img>`` whose picture travels inline (``data:image/...``).
"""

from __future__ import annotations

import collections
import html
import re
from html.parser import HTMLParser

import nh3

from .common import css_loads, is_inline_image, link_ok, math_active, neutralize_math
from .css import new_scope, scope_stylesheet

_HTML_TAGS = (set(nh3.ALLOWED_TAGS) | {"tfoot", "font", "progress", "meter"}) - {"area", "map"}
_HTML_ATTRS: dict[str, set[str]] = {k: set(v) for k, v in nh3.ALLOWED_ATTRIBUTES.items()}
_HTML_ATTRS["*"] = {"class", "style", "title", "dir", "lang", "align", "valign", "width", "height"}
_HTML_ATTRS.setdefault("details", set()).add("open")  # shown expanded, as written
_HTML_ATTRS.setdefault("a", set()).add("target")  # _blank only (_attribute_filter)
_HTML_ATTRS["progress"] = {"value", "max"}
_HTML_ATTRS["meter"] = {"value", "min", "max", "low", "high", "optimum"}
for _t in ("table", "td", "th"):
    _HTML_ATTRS.setdefault(_t, set()).update({"border", "cellpadding", "cellspacing", "bgcolor", "nowrap"})
_HTML_ATTRS.setdefault("font", set()).update({"color", "size", "face"})
#: CSS properties kept in ``style`` attributes: colour, text and box layout.
#: Not ``position``/``z-index`` (overlays on JupyterLab's UI), nor
#: ``background``/``background-image``/``content``/``cursor`` (may load URLs).
STYLE_PROPERTIES = frozenset({
    "color", "background-color", "opacity",
    "font", "font-family", "font-size", "font-style", "font-weight", "font-variant",
    "text-align", "text-decoration", "text-indent", "text-transform", "letter-spacing",
    "line-height", "white-space", "word-break", "word-wrap", "overflow-wrap", "vertical-align",
    "direction", "unicode-bidi",
    "width", "min-width", "max-width", "height", "min-height", "max-height",
    "margin", "margin-top", "margin-right", "margin-bottom", "margin-left",
    "padding", "padding-top", "padding-right", "padding-bottom", "padding-left",
    "border", "border-top", "border-right", "border-bottom", "border-left", "border-color",
    "border-style", "border-width", "border-collapse", "border-spacing", "border-radius",
    "border-top-color", "border-right-color", "border-bottom-color", "border-left-color",
    "border-top-style", "border-right-style", "border-bottom-style", "border-left-style",
    "border-top-width", "border-right-width", "border-bottom-width", "border-left-width",
    "display", "float", "clear", "overflow", "overflow-x", "overflow-y", "table-layout",
    "text-overflow", "list-style-type", "caption-side", "empty-cells",
})
#: Class names that belong to JupyterLab's own interface (a dialog, a menu):
#: an output wearing them could pose as the interface.
_UI_CLASS = re.compile(r"^(jp-|lm-|p-|mod-|cm-|sbk-|MathJax|widget-|jupyter-)", re.I)


_STYLE_BLOCK = re.compile(r"<style\b[^>]*>(.*?)</style\s*>", re.I | re.S)


def clean_stylesheet(css: str, scope: str) -> tuple[str, bool]:
    """Keep the rules of a ``<style>`` block that only style this output.

    A rule is kept when every selector of its list starts with a class or id
    (not one of JupyterLab's, CodeMirror's or the widgets' classes) and uses
    selector syntax only; each is then prefixed with ``.scope`` so that it can
    match nothing outside the output's wrapper (see :mod:`.css`).  Of its
    declarations only properties of :data:`STYLE_PROPERTIES` whose value loads
    nothing are kept.  ``@media``/``@supports`` bodies are judged the same way;
    other at-rules (``@import``, ``@font-face``, ``@namespace``...) are dropped.

    Parameters
    ----------
    css : str
        The text of one ``<style>`` element.
    scope : str
        The wrapper class of this output (:func:`.css.new_scope`).

    Returns
    -------
    (str, bool)
        The rebuilt stylesheet (empty if nothing is left) and whether anything
        was dropped.
    """
    return scope_stylesheet(css, scope, STYLE_PROPERTIES)


#: An id the output may keep (prefixed with its wrapper's class: :func:`sanitize_html`).
_ID = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,127}")


def scoped_id(scope: str, value: str) -> str:
    """The id an output's element ``value`` becomes: ``<scope>-<value>``, unique to the output, so
    it can neither clobber the page's own ids (``document.getElementById``, named window
    properties) nor another output's.  :func:`.css.scope_stylesheet` rewrites ``#value``
    selectors the same way."""
    return f"{scope}-{value}"


def _attribute_filter(tag: str, attr: str, value: str, scope: str | None = None) -> str | None:
    if attr == "id":
        return scoped_id(scope, value) if scope and _ID.fullmatch(value) and not _UI_CLASS.match(value) else None
    if attr == "src" and tag == "img":
        return value if is_inline_image(value) else None
    if attr == "target":  # a link that opens a new tab (nh3 adds rel="noopener noreferrer")
        return value if tag == "a" and value == "_blank" else None
    if attr in ("href", "cite", "longdesc"):
        return value if link_ok(value) else None
    if attr == "style":
        return None if css_loads(value) or "/*" in value else value
    if attr == "class":
        kept = " ".join(c for c in value.split() if not _UI_CLASS.match(c))
        return kept or None
    return value


#: Elements removed with everything inside them.
_CLEAN_CONTENT = frozenset({"script", "style", "template", "noscript", "svg", "math", "textarea", "select",
                            "iframe", "object", "title", "xmp"})
_MATH_TAG = re.compile(r"<math[\s/>]", re.I)


def sanitize_html(source: str, scope: str | None = None, math: bool = False) -> str:
    """Return ``source`` with everything that can run script or load content removed.

    Parameters
    ----------
    source : str
        An HTML fragment from the sandbox.
    scope : str, optional
        The output's wrapper class (:func:`.css.new_scope`): ids are kept, prefixed with
        it (:func:`scoped_id`; pandas' ``Styler`` colours cells by id).  None: ids dropped.
    math : bool
        Keep inline MathML presentation markup (:data:`MATHML_TAGS`,
        :data:`MATHML_ATTRS`); False: each ``<math>`` goes with its content.
        :func:`clean_html` asks for it only where the result is stable
        (:func:`_math_stable`).

    Returns
    -------
    str
        The sanitised fragment (``nh3`` with this module's allowlists).  MathJax
        commands are not touched here; see :func:`clean_html`.
    """
    attributes = {**_HTML_ATTRS, "*": _HTML_ATTRS["*"] | {"id"}} if scope else dict(_HTML_ATTRS)
    if math:
        attributes.update({tag: set(MATHML_ATTRS) for tag in MATHML_TAGS})
    return nh3.clean(
        source,
        tags=_HTML_TAGS | MATHML_TAGS if math else _HTML_TAGS,
        clean_content_tags=set(_CLEAN_CONTENT - {"math"} if math else _CLEAN_CONTENT),
        attributes=attributes,
        attribute_filter=lambda tag, attr, value: _attribute_filter(tag, attr, value, scope),
        url_schemes={"http", "https", "mailto", "data"},
        strip_comments=True,
        link_rel="noopener noreferrer nofollow",
        filter_style_properties=set(STYLE_PROPERTIES),
    )


#: The most HTML, in characters, the firewall sanitises in one value (nh3 takes about 0.1 s
#: per MB, and its notice reads both forms once more; a 23 MB table took 5 s in all).
#: Over it the value is removed with its size named; a bundle keeps its ``text/plain``.
HTML_MAX_CHARS = 8_000_000
#: The deepest element nesting the firewall sanitises: the HTML parser's time grows
#: with the square of the depth (10,000 nested ``<div>`` 0.8 s, 100,000 49 s).
HTML_MAX_DEPTH = 10_000
_TAG_EDGE = re.compile(r"<(/?[a-zA-Z][^\t\n\r\f />\x00]*)")
#: Elements that take no end tag, or whose end tag may be left out (the parser closes
#: them itself): they add no depth.
_NO_DEPTH = frozenset({
    "area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "param", "source",
    "track", "wbr", "p", "li", "dt", "dd", "tr", "td", "th", "thead", "tbody", "tfoot", "option",
    "optgroup", "colgroup", "rb", "rt", "rp", "rtc", "caption",
})


def _max_depth(source: str) -> int:
    """The deepest element nesting of ``source``, counting start and end tags (an upper
    bound where end tags are missing); linear time, in C but for the names' lookup."""
    depth = best = 0
    for edge in _TAG_EDGE.findall(source):
        if edge[0] == "/":
            depth = max(0, depth - (edge[1:].lower() not in _NO_DEPTH))
        elif edge.lower() not in _NO_DEPTH:
            depth += 1
            best = max(best, depth)
    return best


def html_too_costly(source: str) -> str | None:
    """Why ``source`` is not sanitised, in words for the notice, or None.

    Returns
    -------
    str or None
        ``"the HTML rendering (23.2 MB, over the 8.0 MB the output firewall sanitises)"``
        when it has more than :data:`HTML_MAX_CHARS` characters, the same naming the
        depth when its elements nest deeper than :data:`HTML_MAX_DEPTH`; None otherwise.
    """
    if len(source) > HTML_MAX_CHARS:
        return (f"the HTML rendering ({len(source) / 1e6:.1f} MB, over the "
                f"{HTML_MAX_CHARS / 1e6:.1f} MB the output firewall sanitises)")
    if source.count("<") > HTML_MAX_DEPTH:
        depth = _max_depth(source)
        if depth > HTML_MAX_DEPTH:
            return (f"the HTML rendering (elements nested {depth:,} deep, over the "
                    f"{HTML_MAX_DEPTH:,} the output firewall sanitises)")
    return None


def clean_html(source: str) -> tuple[str | None, list[str]]:
    """Sanitise HTML that JupyterLab will also typeset, and name what was removed.

    Parameters
    ----------
    source : str
        An HTML fragment (a ``text/html`` output, a widget's HTML value).

    Returns
    -------
    (str or None, list of str)
        The clean fragment (:func:`sanitize_html`, then active MathJax commands
        shown as text) and what was removed, in words for a notebook user;
        empty when only the serialisation changed.  HTML the firewall does not
        sanitise (:func:`html_too_costly`) gives None and why: the caller removes it.
    """
    if (why := html_too_costly(source)) is not None:
        return None, [why]
    scope = new_scope()
    clean = sanitize_html(source, scope, math=_MATH_TAG.search(source) is not None and _math_stable(source))
    sheets = [clean_stylesheet(m.group(1), scope) for m in _STYLE_BLOCK.finditer(source)]
    kept = "\n".join(css for css, _ in sheets if css)
    if kept:  # the output's own styling, rebuilt from what was checked, confined to its wrapper
        clean = f'<div class="{scope}"><style>{kept}</style>{clean}</div>'
    removed = describe_html_removals(source, clean)
    if any(dropped for _, dropped in sheets) and "page-wide styles (<style>)" not in removed:
        removed.append("style rules for the whole page or that load from an address")
    if math_active(clean):
        clean = neutralize_math(clean)
        removed.append("math commands that make links or styles")
    return clean, removed


def _math_stable(source: str) -> bool:
    """Whether ``source`` sanitised with inline MathML kept reads the same when parsed again.

    MathML inside HTML is where the parser switches namespaces, and the known
    mutation-XSS tricks (``<math><mtext><table><mglyph><style>...``) are markup
    that a second parse reads differently from the first: a fragment that is not
    a fixed point of the sanitiser keeps no MathML at all.
    """
    once = sanitize_html(source, None, math=True)
    return sanitize_html(once, None, math=True) == once


# ----------------------------------------------------------------------------
# Naming the removals: what the source had that the clean fragment lacks
# ----------------------------------------------------------------------------

_TAG_WORDS = {
    "script": "scripts", "style": "page-wide styles (<style>)", "link": "page-wide styles (<link>)",
    "iframe": "embedded pages (<iframe>)", "frame": "embedded pages (<frame>)",
    "object": "plugins (<object>)", "embed": "plugins (<embed>)", "applet": "plugins (<applet>)",
    "svg": "inline SVG (<svg>)", "math": "inline MathML (<math>)",
    "form": "forms", "input": "form fields", "button": "buttons", "textarea": "form fields",
    "select": "form fields", "base": "a base address (<base>)", "meta": "page settings (<meta>)",
    "audio": "media loaded from an address", "video": "media loaded from an address",
    "source": "media loaded from an address", "picture": "images loaded from an address",
}


#: What the inventory skips: comments (the sanitiser strips them) and the text of raw-text
#: elements (what is inside a ``<script>`` is not markup), keeping their start tags.
_COMMENT = re.compile(r"<!--.*?(?:-->|\Z)", re.S)
_RAW_TEXT = re.compile(r"(<(script|style|xmp|textarea|title)\b[^>]*>).*?(?:</\2\s*>|\Z)", re.S | re.I)
#: A start tag: its name and the text of its attributes (html.parser's tag name).
_START_TAG = re.compile(r"<([a-zA-Z][^\t\n\r\f />\x00]*)([^>]*)>")
#: One attribute in a start tag's attribute text (html.parser's ``attrfind_tolerant``).
_ATTR = re.compile(r"((?<=[\'\"\s/])[^\s/>][^\s/=>]*)"
                   r"(\s*=+\s*(\'[^\']*\'|\"[^\"]*\"|(?![\'\"])[^>\s]*))?(?:\s|/(?!>))*")


def _inventory(fragment: str) -> collections.Counter:
    """Counts of start tags, attributes and inline-style properties in a fragment.

    Regular expressions over the whole fragment, then each distinct start tag read
    once: a 23 MB table has two million start tags and a few dozen distinct ones
    (html.parser took 15 s over it; this about a second).  Used only to name what
    the sanitiser removed, never to decide what is kept.
    """
    items: collections.Counter[tuple[str, ...]] = collections.Counter()
    text = _RAW_TEXT.sub(r"\1", _COMMENT.sub("", fragment))
    for (tag, attr_text), n in collections.Counter(_START_TAG.findall(text)).items():
        tag = tag.lower()
        items[("tag", tag)] += n
        if tag == "style" or not attr_text.strip(" /"):
            continue  # a <style>'s rules are judged by clean_stylesheet; `scoped` is obsolete
        for m in _ATTR.finditer(" " + attr_text):
            name, value = m.group(1).lower(), m.group(3)
            if value is not None:
                if value[:1] in ("'", '"') and value[:1] == value[-1:] and len(value) > 1:
                    value = value[1:-1]
                value = html.unescape(value) if "&" in value else value
            if name == "rel" and tag == "a":
                continue  # added by the sanitiser
            if name == "style" and value:
                for decl in value.split(";"):
                    prop, _, val = decl.partition(":")
                    if prop.strip():
                        items[("css", tag, prop.strip().lower(), "url" if css_loads(val) else "")] += n
            elif name == "class" and value:
                for c in value.split():
                    items[("class", tag, c)] += n
            else:
                items[("attr", tag, name, value or "")] += n
    return items


def _words(item: tuple[str, ...]) -> str:
    kind, tag = item[0], item[1]
    if kind == "tag":
        return _TAG_WORDS.get(tag, f"<{tag}> elements")
    if kind == "css":
        return "styles that load from an address" if item[3] else f"the style property {item[2]}"
    if kind == "class":
        return "JupyterLab's own style classes"
    name, value = item[2], item[3]
    if name.startswith("on"):
        return "event handlers (code run on load or click)"
    if tag == "img" and name == "src":
        return "images loaded from an address" if link_ok(value) else "script addresses"
    if name in ("href", "src", "action", "formaction", "data", "xlink:href", "srcdoc"):
        return "script addresses" if not link_ok(value) or name == "srcdoc" else "links"
    if name in ("id", "name"):
        return "id and name attributes"
    return f"the attribute {name}"


def describe_html_removals(source: str, clean: str | None = None) -> list[str]:
    """What ``source`` had that its sanitised form ``clean`` lacks, in words.

    Parameters
    ----------
    source : str
        HTML from the sandbox.
    clean : str, optional
        Its sanitised form; computed with :func:`sanitize_html` if omitted.

    Returns
    -------
    list of str
        Sorted, distinct phrases such as ``"scripts"`` or ``"page-wide styles
        (<style>)"``; empty when nothing visible was removed.
    """
    if clean is None:
        clean = sanitize_html(source)
    if clean == source:
        return []
    before, after = _inventory(source), _inventory(clean)
    gone = before - after
    # An attribute whose value only changed spelling (entities, quoting) is not a removal.
    after_names = collections.Counter(k[:3] for k in after.elements() if k[0] == "attr")
    removed_tags = {k[1] for k in gone if k[0] == "tag"}
    for k in list(gone):
        if k[0] != "tag" and k[1] in removed_tags:
            del gone[k]  # went with its element
        elif k[0] == "attr" and after_names[k[:3]] >= before[k]:
            del gone[k]
    return sorted({_words(k) for k in gone})


#: MathML presentation markup (MathML Core): layout and token elements only; not
#: ``maction`` (interaction), ``annotation-xml`` (may embed HTML) or ``semantics``'
#: annotations, which carry other languages.
MATHML_TAGS = frozenset({
    "math", "mrow", "mi", "mn", "mo", "ms", "mtext", "mspace", "msup", "msub", "msubsup", "mfrac",
    "msqrt", "mroot", "mstyle", "merror", "mpadded", "mphantom", "menclose", "munder", "mover",
    "munderover", "mmultiscripts", "mprescripts", "none", "mtable", "mtr", "mtd", "mlabeledtr",
})
#: Attributes of layout and typography; no ``href`` (MathML 3 makes any element a
#: link), ``style``, ``class``, ``id`` or event handlers.
MATHML_ATTRS = frozenset({
    "display", "xmlns", "mathvariant", "mathsize", "mathcolor", "mathbackground", "dir", "scriptlevel",
    "displaystyle", "fence", "separator", "stretchy", "symmetric", "largeop", "movablelimits",
    "accent", "accentunder", "form", "lspace", "rspace", "minsize", "maxsize", "linethickness",
    "numalign", "denomalign", "bevelled", "notation", "width", "height", "depth", "voffset",
    "rowspan", "columnspan", "rowalign", "columnalign", "rowlines", "columnlines", "frame",
    "rowspacing", "columnspacing", "align", "alttext",
})


def clean_mathml(value: str) -> tuple[str, list[str]]:
    """Sanitise an ``application/mathml+xml`` value through an allowlist of MathML
    presentation elements and attributes (:data:`MATHML_TAGS`, :data:`MATHML_ATTRS`),
    with ``nh3``.

    Returns
    -------
    (str, list of str)
        The markup to relay and what was removed, in words (empty when nothing was).
    """
    clean = nh3.clean(value, tags=set(MATHML_TAGS), attributes={"*": set(MATHML_ATTRS)},
                      url_schemes=set(), link_rel=None, strip_comments=True)
    if _markup_signature(clean) == _markup_signature(value):
        return value, []
    return clean, ["MathML markup outside the presentation allowlist (links, styles, script, embedded HTML)"]


def _markup_signature(markup: str) -> list[tuple[str, tuple[tuple[str, str | None], ...]]]:
    """The start tags and attributes of ``markup``, in order: equal signatures mean the
    sanitiser removed nothing (it may still have re-serialised whitespace or quotes)."""
    found: list[tuple[str, tuple[tuple[str, str | None], ...]]] = []

    class _P(HTMLParser):
        def handle_starttag(self, tag, attrs):
            found.append((tag, tuple(sorted(attrs))))

        def handle_comment(self, data):
            found.append(("!--", ()))

    p = _P()
    p.feed(markup)
    p.close()
    return found

