"""SVG from the sandbox: parsed as XML and rebuilt from an allowlist.

JupyterLab shows ``image/svg+xml`` as an ``<img>`` with a ``data:`` URL
(``renderSVG`` in ``packages/rendermime/src/renderers.ts``), where the browser
runs no script and loads no sub-resource.  The rebuild below does not rely on
that: it is what keeps a saved notebook safe in other viewers too.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

from .common import is_inline_image

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
_CSS_BAD = re.compile(r"(?i)@import|@font-face|(url|image-set|image|cross-fade|element)\s*\((?!\s*['\"]?#)|"
                      r"expression\s*\(|javascript|behavior|"
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
    DOCTYPE), so what the browser parses is what was checked.  An SVG without
    ``xmlns`` is read as SVG, as JupyterLab's ``renderSVG`` reads it (it adds the
    namespace), and comes out with it.

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
        root = ET.fromstring(source)  # noqa: S314 - entities refused above; expat loads no external ones
    except (ET.ParseError, RecursionError) as err:
        raise SvgError(f"malformed SVG: {err}") from err
    if _local(root.tag)[1] != "svg":
        raise SvgError("root element is not <svg>")
    if root.tag == "svg":  # no xmlns: JupyterLab's renderSVG adds SVG's own, so the elements are SVG
        for el in root.iter():
            if isinstance(el.tag, str) and not el.tag.startswith("{"):
                el.tag = f"{{{SVG_NS}}}{el.tag}"
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
        return v.startswith("#") or (is_inline_image(v) and not v.startswith("data:image/svg"))
    if re.search(r"(url|image-set|image|cross-fade|element)\((?!['\"]?#)", v):
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
            removed.add("event handlers (code run on load or click)" if local.lower().startswith("on")
                        else f"the attribute {local}")
            del el.attrib[name]
    if _local(el.tag)[1] == "style" and el.text and _CSS_BAD.search(el.text):
        removed.add("styles that load from an address")
        el.text = ""
    i = 0
    while i < len(el):
        child = el[i]
        ns, local = _local(child.tag) if isinstance(child.tag, str) else ("", "")
        if ns == SVG_NS and local == "a":  # unwrap: keep the drawing, drop the link
            removed.add("links")
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
