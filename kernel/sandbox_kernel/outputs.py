"""The output firewall: what a sandbox's rich outputs may carry to the browser.

JupyterLab treats outputs produced in the current session as trusted: it runs
``<script>`` in ``text/html``, renders ``application/javascript``, and passes
raw HTML in ``text/markdown`` straight to the page.  Script in the user's
browser can drive their Jupyter server, which can open an unsandboxed
terminal, so under the default policy (``sanitize``) sandbox output is
neutralised here before it is re-signed for the frontend.  Pure functions,
no I/O; called by the proxy for every IOPub ``display_data``,
``update_display_data`` and ``execute_result`` and for ``execute_reply``
``payload`` entries of source ``page`` (messaging spec, "Display Data" and
"Payloads (DEPRECATED)").

What each MIME type gets under ``sanitize`` (the type is compared in lower
case, without parameters such as ``; charset=``):

* **pass unchanged** (:data:`SAFE_TYPES`, plus the versioned vega and
  vega-lite types): plain text, images (PNG, JPEG, GIF, WebP), JSON,
  plotly, vega, vega-lite, widget views, CSV.  Their renderers never
  evaluate script.
* **checked, passed unchanged or dropped**: ``text/markdown`` and
  ``text/latex``.  Rewriting markdown would break code spans, so markdown
  passes unchanged unless it holds raw HTML that the HTML sanitiser would
  alter, a ``javascript:``/``vbscript:``/non-image ``data:`` URL (entities,
  whitespace and case normalised first) or a MathJax command that makes links
  or styles (``\\href``, ``\\style``...); then it is dropped and its source
  kept as ``text/plain``.
* **sanitised**: ``text/html`` with ``nh3`` (:func:`sanitize_html`):
  formatting and table markup, ``style`` attributes limited to layout and
  colour properties, ``<img>`` with ``http(s)`` or ``data:image/`` sources;
  no ``<script>``, ``<style>`` blocks (they restyle the whole JupyterLab
  page), inline ``<svg>``, ``<iframe>``, ``<object>``, ``<embed>``,
  ``<form>``, ``<base>``, ``<meta>``, ``<link>``, event handlers, ``id`` or
  ``name`` (DOM clobbering).  ``image/svg+xml`` is parsed as XML and rebuilt
  from an allowlist (:func:`sanitize_svg`).
* **dropped**: ``application/javascript``, ``text/javascript``,
  ``application/x-javascript``, ``application/ecmascript``, and every type
  not listed above (e.g. ``application/vnd.bokehjs_exec.v0+json``, which a
  JupyterLab extension executes, or ``application/pdf``).  Unknown types are
  dropped because any installed extension may render one with script.

A notice (one line) names what was removed; if nothing renderable is left,
the bundle gets a ``text/plain`` notice so the cell still shows something.
Under ``trust`` everything passes unchanged.
"""

from __future__ import annotations

import html
import re
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from typing import Any

import nh3

#: Types relayed as produced.
SAFE_TYPES = frozenset({
    "text/plain",
    "image/png", "image/jpeg", "image/gif", "image/webp",
    "application/json",
    "application/vnd.plotly.v1+json",
    "application/vnd.jupyter.widget-view+json",
    "application/vnd.jupyter.stdout", "application/vnd.jupyter.stderr",
    "text/csv", "text/tab-separated-values",
})
_VEGA = re.compile(r"application/vnd\.vega(lite)?\.v\d+(\.\d+)*\+json")
#: Types that are code for the browser; always dropped under ``sanitize``.
SCRIPT_TYPES = frozenset({
    "application/javascript", "text/javascript", "application/x-javascript",
    "application/ecmascript", "text/ecmascript",
})
#: IOPub message types whose ``content["data"]`` is a mime bundle.
BUNDLE_MSG_TYPES = frozenset({"display_data", "update_display_data", "execute_result"})

_HINT = "untrusted sandbox output; set --SandboxKernel.output_policy=trust to allow"

# ----------------------------------------------------------------------------
# HTML
# ----------------------------------------------------------------------------

_HTML_TAGS = (set(nh3.ALLOWED_TAGS) | {"tfoot", "font"}) - {"area", "map"}
_HTML_ATTRS: dict[str, set[str]] = {k: set(v) for k, v in nh3.ALLOWED_ATTRIBUTES.items()}
_HTML_ATTRS["*"] = {"class", "style", "title", "dir", "lang", "align", "valign", "width", "height"}
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
_DATA_IMAGE = re.compile(r"data:image/(png|jpe?g|gif|webp|svg\+xml)[;,]", re.I)
#: Elements whose presence in input HTML is reported as removed active content.
#: ``<style>`` blocks are removed silently: pandas emits one with every table.
_ACTIVE_TAGS = frozenset({
    "script", "iframe", "frame", "frameset", "object", "embed", "applet", "base", "meta", "link",
    "form", "input", "button", "textarea", "select", "svg", "math", "template",
    "portal", "noscript", "audio", "video", "source",
})


def _url_ok(value: str, *, image: bool) -> bool:
    """Links may go to http(s), mailto, fragments and relative paths.  Images
    may only be ``data:image/...`` or same-origin paths: a remote image would
    let a sandbox with no network exfiltrate data through the user's browser."""
    v = re.sub(r"[\x00-\x20]+", "", html.unescape(value)).lower().replace("\\", "/")
    if image:
        if _DATA_IMAGE.match(v):
            return True
        return not v.startswith("//") and ":" not in v.split("/", 1)[0]
    if v.startswith(("http://", "https://", "mailto:", "#")):
        return True
    return ":" not in v.split("/", 1)[0].split("?", 1)[0].split("#", 1)[0]  # relative


def _attribute_filter(tag: str, attr: str, value: str) -> str | None:
    if attr in ("href", "src", "cite", "longdesc"):
        return value if _url_ok(value, image=(tag == "img" and attr == "src")) else None
    if attr == "style" and re.search(r"(?i)url\s*\(|expression\s*\(|\\|/\*", value):
        return None
    return value


def sanitize_html(source: str) -> str:
    """Return ``source`` with everything that can run script or load active content removed.

    Uses ``nh3`` (ammonia) with the allowlists in this module; see the module
    docstring for what survives.

    Parameters
    ----------
    source : str
        An HTML fragment from the sandbox.

    Returns
    -------
    str
        Sanitised HTML fragment.
    """
    return nh3.clean(
        source,
        tags=_HTML_TAGS,
        clean_content_tags={"script", "style", "template", "noscript", "svg", "math",
                            "textarea", "select", "iframe", "object", "title", "xmp"},
        attributes=_HTML_ATTRS,
        attribute_filter=_attribute_filter,
        url_schemes={"http", "https", "mailto", "data"},
        strip_comments=True,
        link_rel="noopener noreferrer nofollow",
        filter_style_properties=set(STYLE_PROPERTIES),
    )


class _Inventory(HTMLParser):
    """Names of active elements, event-handler attributes and script URLs in HTML."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.found: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in _ACTIVE_TAGS:
            self.found.add(f"<{tag}>")
        for name, value in attrs:
            if name.startswith("on"):
                self.found.add("event handlers")
            elif value and name in ("href", "src", "action", "formaction", "data", "xlink:href") \
                    and not _url_ok(value, image=(tag == "img")):
                self.found.add("script URLs")


def describe_html_removals(source: str) -> list[str]:
    """Best-effort names of the active content in ``source``, for notices only.

    Security does not depend on this (``nh3`` does); it words the notice.
    """
    inv = _Inventory()
    try:
        inv.feed(source)
        inv.close()
    except Exception:  # HTMLParser is lenient; never let a notice fail the relay
        pass
    return sorted(inv.found)


# ----------------------------------------------------------------------------
# SVG
# ----------------------------------------------------------------------------

SVG_NS = "http://www.w3.org/2000/svg"
XLINK_NS = "http://www.w3.org/1999/xlink"
#: SVG elements kept (local names); others are removed with their content.
SVG_ELEMENTS = frozenset({
    "svg", "g", "defs", "symbol", "use", "path", "rect", "circle", "ellipse", "line",
    "polyline", "polygon", "text", "tspan", "textPath", "title", "desc", "clipPath", "mask",
    "pattern", "marker", "linearGradient", "radialGradient", "stop", "image", "style",
    "filter", "feGaussianBlur", "feOffset", "feBlend", "feFlood", "feComposite", "feMerge",
    "feMergeNode", "feColorMatrix", "switch",
})
_CSS_BAD = re.compile(r"(?i)@import|url\s*\((?!\s*['\"]?#)|expression\s*\(|javascript|behavior|"
                      r"-moz-binding|\\|<|position\s*:\s*fixed")


def _local(tag: str) -> tuple[str, str]:
    if tag.startswith("{"):
        ns, _, name = tag[1:].partition("}")
        return ns, name
    return "", tag


class SvgError(ValueError):
    """The SVG could not be parsed safely (malformed, or declares entities)."""


def sanitize_svg(source: str) -> tuple[str, list[str]]:
    """Rebuild an SVG document from an allowlist of elements and attributes.

    Removed: ``<script>``, ``<foreignObject>``, animation elements, ``<a>``
    (its children are kept), every ``on*`` attribute, ``href``s other than
    local ``#id`` references and ``data:image/`` rasters, ``url(...)`` other
    than ``url(#id)``, and ``<style>`` text that imports or loads anything.
    The result is re-serialised from the parse tree (no prolog, comments or
    DOCTYPE), so what the browser parses is what was checked.

    Parameters
    ----------
    source : str
        An ``image/svg+xml`` value.

    Returns
    -------
    (str, list of str)
        The clean SVG and the names of what was removed.

    Raises
    ------
    SvgError
        If the document declares entities, is not well-formed, or its root is
        not ``<svg>``; callers drop the output.
    """
    if re.search(r"<!ENTITY", source, re.I):
        raise SvgError("SVG declares XML entities")
    try:
        root = ET.fromstring(source)
    except (ET.ParseError, RecursionError) as err:
        raise SvgError(f"malformed SVG: {err}") from err
    if _local(root.tag)[1] != "svg":
        raise SvgError("root element is not <svg>")
    removed: set[str] = set()
    ET.register_namespace("", SVG_NS)
    ET.register_namespace("xlink", XLINK_NS)
    try:
        _clean_svg_element(root, removed)
        return ET.tostring(root, encoding="unicode"), sorted(removed)
    except RecursionError as err:
        raise SvgError("SVG nested too deeply") from err


def _svg_value_ok(name: str, value: str) -> bool:
    v = re.sub(r"[\x00-\x20]+", "", value).lower()
    if name == "href":
        return v.startswith("#") or bool(_DATA_IMAGE.match(v)) and not v.startswith("data:image/svg")
    if "url(" in v and re.search(r"url\((?!['\"]?#)", v):
        return False
    return "javascript:" not in v and "expression(" not in v


def _clean_svg_element(el: ET.Element, removed: set[str]) -> None:
    for name in list(el.attrib):
        ns, local = _local(name)
        keep = not local.lower().startswith("on") and ns in ("", XLINK_NS, "http://www.w3.org/XML/1998/namespace")
        if keep and ns == "http://www.w3.org/XML/1998/namespace" and local == "base":
            keep = False
        if keep and not _svg_value_ok(local, el.attrib[name]):
            keep = False
        if not keep:
            removed.add("event handlers" if local.lower().startswith("on") else f"attribute {local}")
            del el.attrib[name]
    if _local(el.tag)[1] == "style" and el.text and _CSS_BAD.search(el.text):
        removed.add("<style> that loads content")
        el.text = ""
    i = 0
    while i < len(el):
        child = el[i]
        ns, local = _local(child.tag) if isinstance(child.tag, str) else ("", "")
        if ns == SVG_NS and local == "a":  # unwrap: keep the drawing, drop the link
            removed.add("<a>")
            el.remove(child)
            for j, grandchild in enumerate(list(child)):
                el.insert(i + j, grandchild)
            continue
        if ns != SVG_NS or local not in SVG_ELEMENTS:
            if local != "metadata":
                removed.add(f"<{local or 'node'}>")
            el.remove(child)
            continue
        _clean_svg_element(child, removed)
        i += 1


# ----------------------------------------------------------------------------
# Markdown and LaTeX
# ----------------------------------------------------------------------------

_MATHJAX_ACTIVE = re.compile(r"\\(href|url|style|class|cssId|unicode|require|html|data)\b", re.I)
_TAG = re.compile(r"<[A-Za-z!/?][^>]*>?")
_SCHEME = re.compile(r"(javascript|vbscript|livescript):", re.I)
_REMOTE = re.compile(r"(?i)(https?:|ftp:)?//[^/\s)]")
_DATA_URL = re.compile(r"data:(?!image/(png|jpe?g|gif|webp)[;,])", re.I)


def markdown_problems(source: str) -> list[str]:
    """What makes ``source`` unsafe to render as trusted markdown (empty if safe).

    Raw HTML counts only if :func:`sanitize_html` would change it, so
    ``<b>``, ``<br>`` or ``<sub>`` in markdown pass.
    """
    problems: set[str] = set()
    for m in _TAG.finditer(source):
        tag = m.group(0)
        if tag.startswith(("<!", "<?")):
            problems.add("raw HTML declarations")
            continue
        if not tag.endswith(">"):
            tag += ">"
        if tag.startswith("</"):
            name = re.match(r"</\s*([A-Za-z][\w:-]*)", tag)
            if name and name.group(1).lower() not in _HTML_TAGS:
                problems.add(f"<{name.group(1).lower()}>")
            continue
        if sanitize_html(tag) != tag and sanitize_html(tag + "</x>")[: len(tag)] != tag:
            problems.update(describe_html_removals(tag) or ["raw HTML"])
    flat = re.sub(r"[\x00-\x20]+", "", html.unescape(source))
    if _SCHEME.search(flat):
        problems.add("script URLs")
    if _DATA_URL.search(flat):
        problems.add("data: URLs")
    if _MATHJAX_ACTIVE.search(source):
        problems.add("MathJax link/style commands")
    if "![" in source and _REMOTE.search(flat):
        problems.add("remote images")
    return sorted(problems)


# ----------------------------------------------------------------------------
# The firewall
# ----------------------------------------------------------------------------


def _base_type(mime: str) -> str:
    return mime.split(";", 1)[0].strip().lower()


def is_safe_type(mime: str) -> bool:
    """True for MIME types relayed unchanged under ``sanitize``."""
    t = _base_type(mime)
    return t in SAFE_TYPES or bool(_VEGA.fullmatch(t))


class OutputFirewall:
    """Applies the policy's ``output_policy`` to rich outputs from the sandbox.

    Parameters
    ----------
    output_policy : {"sanitize", "trust"}
        :attr:`sandbox_kernel.policy.Policy.output_policy`.

    Raises
    ------
    ValueError
        For any other policy name.

    Examples
    --------
    >>> fw = OutputFirewall("sanitize")
    >>> content, notices = fw.filter("display_data", {"data": {
    ...     "application/javascript": "alert(1)", "text/plain": "x"}, "metadata": {}})
    >>> content["data"]
    {'text/plain': 'x'}
    """

    def __init__(self, output_policy: str = "sanitize"):
        if output_policy not in ("sanitize", "trust"):
            raise ValueError(f"output_policy must be 'sanitize' or 'trust', not {output_policy!r}")
        self.trust = output_policy == "trust"
        #: comm_id -> widget state seen so far that decides what is markup
        #: (``_model_name``, ``description_allow_html``).
        self._widgets: dict[str, dict[str, Any]] = {}

    def filter_comm(self, msg_type: str, content: dict) -> tuple[dict, list[str]]:
        """Filter a ``comm_open``/``comm_msg`` from the sandbox (ipywidgets state).

        Widget state can carry markup the frontend renders as HTML: the
        ``value`` of ``HTMLModel``/``HTMLMathModel``, a ``description`` with
        ``description_allow_html``, and the ``outputs`` of an ``OutputModel``
        (mime bundles).  These are sanitised like display data; everything
        else, and comms of other targets, pass unchanged.  ``comm_close``
        forgets the comm.

        Returns
        -------
        (dict, list of str)
            The content to relay (the same object when nothing changed) and notices.
        """
        comm_id = content.get("comm_id") if isinstance(content, dict) else None
        if not isinstance(comm_id, str):
            return content, []
        if msg_type == "comm_close":
            self._widgets.pop(comm_id, None)
            return content, []
        data = content.get("data")
        state = data.get("state") if isinstance(data, dict) else None
        if not isinstance(state, dict):
            return content, []
        known = self._widgets.setdefault(comm_id, {}) if msg_type == "comm_open" or comm_id in self._widgets \
            else None
        if known is None:
            return content, []
        for key in ("_model_name", "description_allow_html"):
            if key in state:
                known[key] = state[key]
        if self.trust:
            return content, []
        new_state, notices = dict(state), []
        html_keys = ["value"] if known.get("_model_name") in ("HTMLModel", "HTMLMathModel") else []
        if known.get("description_allow_html"):
            html_keys.append("description")
        for key in html_keys:
            if isinstance(state.get(key), str):
                clean = sanitize_html(state[key])
                if clean != state[key]:
                    new_state[key] = clean
                    what = describe_html_removals(state[key])
                    notices.append(f"sandbox-kernel: sanitised widget {key}"
                                   + (", removed " + ", ".join(what) if what else "") + f" ({_HINT})")
        if known.get("_model_name") == "OutputModel" and isinstance(state.get("outputs"), list):
            outs, changed = [], False
            for o in state["outputs"]:
                if isinstance(o, dict) and isinstance(o.get("data"), dict):
                    nd, n = self.filter_bundle(o["data"])
                    if nd is not o["data"]:
                        o, changed = {**o, "data": nd}, True
                    notices += n
                outs.append(o)
            if changed:
                new_state["outputs"] = outs
        if new_state == state:
            return content, []
        return {**content, "data": {**data, "state": new_state}}, notices

    def filter(self, msg_type: str, content: dict) -> tuple[dict, list[str]]:
        """Filter one IOPub message's content.

        Called by the proxy for every IOPub message from the sandbox before it
        is re-signed; only ``display_data``, ``update_display_data`` and
        ``execute_result`` are examined, other types return unchanged.

        Parameters
        ----------
        msg_type : str
            ``header.msg_type`` of the message.
        content : dict
            Its ``content``; never modified in place.

        Returns
        -------
        (dict, list of str)
            The content to relay (the same object when nothing changed) and
            one-line notices, e.g. ``"sandbox-kernel: removed
            application/javascript output (...)"``.
        """
        if self.trust or msg_type not in BUNDLE_MSG_TYPES or not isinstance(content, dict):
            return content, []
        data = content.get("data")
        if not isinstance(data, dict):
            return content, []
        new_data, notices = self.filter_bundle(data)
        if new_data is data:
            return content, []
        out = dict(content)
        out["data"] = new_data
        meta = content.get("metadata")
        if isinstance(meta, dict) and any(k not in new_data for k in meta if k in data):
            out["metadata"] = {k: v for k, v in meta.items() if k in new_data or k not in data}
        return out, notices

    def filter_payload(self, payload: list) -> tuple[list, list[str]]:
        """Filter ``execute_reply`` ``payload`` entries.

        Entries with ``source == "page"`` carry a mime bundle in ``data``
        (shown by ``?`` / ``%page`` in the pager) and are filtered like
        display data; other entries (``set_next_input``, ``edit_magic``,
        ``ask_exit``) carry no markup and pass unchanged.

        Returns
        -------
        (list, list of str)
            The payload to relay (the same object when nothing changed) and notices.
        """
        if self.trust or not isinstance(payload, list):
            return payload, []
        out, notices, changed = [], [], False
        for entry in payload:
            if isinstance(entry, dict) and entry.get("source") == "page" and isinstance(entry.get("data"), dict):
                new_data, n = self.filter_bundle(entry["data"])
                if new_data is not entry["data"]:
                    entry = {**entry, "data": new_data}
                    changed = True
                notices += n
            out.append(entry)
        return (out if changed else payload), notices

    def filter_bundle(self, data: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
        """Filter one mime bundle (``{mime type: value}``).

        Returns
        -------
        (dict, list of str)
            The bundle (the same object when nothing changed) and notices.
        """
        if self.trust:
            return data, []
        out: dict[str, Any] = {}
        notices: list[str] = []
        changed = False
        plain_fallback: str | None = None
        for mime, value in data.items():
            new, note = self._filter_one(str(mime), value)
            if note:
                notices.append(f"sandbox-kernel: {note} ({_HINT})")
            if new is None:
                changed = True
                if isinstance(value, str) and _base_type(str(mime)) in ("text/markdown", "text/latex"):
                    plain_fallback = value
                continue
            if new is not value:
                changed = True
            out[mime] = new
        if not changed:
            return data, []
        if plain_fallback is not None and "text/plain" not in out:
            out["text/plain"] = plain_fallback  # the source, shown as text
        if not out:
            out["text/plain"] = "\n".join(notices) or "sandbox-kernel: output removed"
        return out, notices

    def _filter_one(self, mime: str, value: Any) -> tuple[Any, str | None]:
        t = _base_type(mime)
        if is_safe_type(t):
            return value, None
        if t in SCRIPT_TYPES:
            return None, f"removed {t} output"
        if t == "text/html":
            if not isinstance(value, str):
                return None, "removed text/html output that is not a string"
            clean = sanitize_html(value)
            if clean == value:
                return value, None
            what = describe_html_removals(value)
            return clean, ("sanitised text/html output, removed " + ", ".join(what)) if what else None
        if t == "image/svg+xml":
            if not isinstance(value, str):
                return None, "removed image/svg+xml output that is not a string"
            try:
                clean, what = sanitize_svg(value)
            except SvgError as err:
                return None, f"removed image/svg+xml output: {err}"
            return clean, ("sanitised image/svg+xml output, removed " + ", ".join(what)) if what else None
        if t in ("text/markdown", "text/latex"):
            if not isinstance(value, str):
                return None, f"removed {t} output that is not a string"
            problems = markdown_problems(value) if t == "text/markdown" else \
                (["MathJax link/style commands"] if _MATHJAX_ACTIVE.search(value) else [])
            if not problems:
                return value, None
            return None, f"removed {t} rendering (shown as plain text): it contained " + ", ".join(problems)
        return None, f"removed {t} output (type not on the safe list)"
