"""What the browser would do with a message, checked independently of the firewall's code.

Each check reads a value the way JupyterLab's renderer would (HTML inserted
as trusted ``innerHTML`` then typeset, markdown, widget fields by view) and
fails on anything that would run script or fetch.
"""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser

#: MathJax commands that link, style or load (written here, not imported: an independent reading).
_MATH = re.compile(r"\\(href|url|style|class|cssId|unicode|require|html|data|mmlToken|bbox)(?![A-Za-z])")


def math_active(text: str) -> bool:
    return bool(_MATH.search(text))

_ACTIVE_TAGS = {"script", "style", "link", "iframe", "frame", "object", "embed", "svg", "base", "meta",
                "input", "video", "audio", "source", "picture", "form", "button", "template", "noscript",
                # MathML's interactive or foreign parts (its presentation markup is inert: MathML Core)
                "maction", "annotation-xml", "semantics", "mglyph", "malignmark"}
_FETCH_ATTRS = {"srcset", "background", "poster", "data", "action", "formaction", "srcdoc", "ping", "lowsrc"}


class _Check(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.problems: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag in _ACTIVE_TAGS:
            self.problems.append(f"<{tag}>")
        for name, value in attrs:
            value = value or ""
            if name.startswith("on") or name in _FETCH_ATTRS:
                self.problems.append(f"{tag} {name}")
            if name == "src" and not value.strip().lower().startswith("data:image/"):
                self.problems.append(f"{tag} src={value}")
            if name == "href" and re.match(r"\s*(javascript|vbscript|data):", value, re.I):
                self.problems.append(f"{tag} href={value}")
            if name == "style" and re.search(r"(?i)url\s*\(|image-set|@import|\\", value):
                self.problems.append(f"{tag} style={value}")

    def handle_data(self, data):
        self.text.append(data)


def html_problems(source: str) -> list[str]:
    """What in ``source`` would run or fetch when JupyterLab inserts and typesets it."""
    c = _Check()
    c.feed(source)
    c.close()
    if math_active("".join(c.text)):
        c.problems.append("active math")
    return c.problems


def bundle_problems(data: dict, beacon: str) -> list[str]:
    """What in a mime bundle would run script or fetch (empty if nothing)."""
    problems = []
    for mime, value in data.items():
        t = mime.split(";")[0].strip().lower()
        if t in ("text/plain", "application/vnd.jupyter.stdout", "application/vnd.jupyter.stderr"):
            continue
        if t == "text/html":
            problems += html_problems(value)
        elif t in ("text/markdown", "text/latex"):
            if beacon in value or "__sk_" in value or math_active(value) or re.search(r"<[a-z!]", value, re.I):
                problems.append(f"{t} rendered with a payload")
        elif t in ("image/png", "image/jpeg", "image/gif", "image/webp", "application/json",
                   "application/vnd.jupyter.widget-view+json"):
            continue
        elif t == "image/svg+xml" or "vega" in t or "plotly" in t:
            if beacon in json.dumps(value) or "__sk_" in json.dumps(value) or "url(" in json.dumps(value):
                problems.append(f"{t} keeps a payload")
        else:
            problems.append(f"kept unknown type {t}")
    return problems


def widget_state_problems(state: dict, view: str | None, model: str | None, beacon: str) -> list[str]:
    """What in a widget state would run or fetch once ``view`` draws it (ipywidgets 8.1)."""
    problems = []
    if view in ("HTMLView", "HTMLMathView") and isinstance(state.get("value"), str):
        problems += html_problems(state["value"])
    if isinstance(state.get("description"), str):
        problems += html_problems(state["description"]) if state.get("description_allow_html") else \
            (["active math"] if math_active(state["description"]) else [])
    if view == "LabelView" and isinstance(state.get("value"), str) and math_active(state["value"]):
        problems.append("active math in a label")
    if (model and model.endswith("StyleModel")) or model == "LayoutModel":
        for k, v in state.items():
            if isinstance(v, str) and not k.startswith("_") and re.search(r"(?i)url\s*\(|@import", v):
                problems.append(f"style {k}")
    if model in ("ImageModel", "VideoModel", "AudioModel") and state.get("format") == "url" \
            and state.get("value") not in (None, b"", ""):
        problems.append("media address")
    if model == "OutputModel":
        for o in state.get("outputs") or []:
            problems += bundle_problems(o.get("data") or {}, beacon)
    if view not in (None, "HTMLView", "HTMLMathView") and view is not None and \
            not view.endswith("View"):
        problems.append(f"unknown view {view}")
    return problems
