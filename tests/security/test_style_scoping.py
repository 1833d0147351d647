"""``<style>`` from the sandbox is confined to its own output (issue 32, CSS part).

Message-level, no browser: the firewall is driven directly as in
``tests/test_outputs.py``.  A kept rule is rewritten so that every selector of
its list starts with the random wrapper class the firewall puts around the
output; rules naming the page (``#main``, ``.jp-*``, ``.cm-*``, ``body``,
``:root``), at-rules that load or declare (``@import``, ``@font-face``,
``@namespace``) and anything outside selector syntax are dropped.  The
firewall's notices are plain-text outputs of their own, so no wrapper ever
holds one.
"""

from __future__ import annotations

import re

import pytest
import tinycss2
from hypothesis import given, settings
from hypothesis import strategies as st
from sandbox_kernel.outputs import OutputFirewall
from sandbox_kernel.outputs.html import STYLE_PROPERTIES, clean_stylesheet

FW = OutputFirewall("sanitize")
SCOPE = "sbk-out-0123456789ab"
WRAPPED = re.compile(r'<div class="(sbk-out-[0-9a-f]{12})"><style>(.*?)</style>(.*)</div>', re.S)


def _filter(css: str, body: str = "<b class=t>x</b>") -> tuple[str, list[str]]:
    content, notices = FW.filter("display_data", {"data": {"text/html": f"<style>{css}</style>{body}"},
                                                   "metadata": {}})
    return content["data"]["text/html"], notices


def _selectors(sheet: str) -> list[str]:
    """Every selector alternative of every style rule in ``sheet``, @media/@supports bodies included."""
    found: list[str] = []

    def walk(rules: list) -> None:
        for rule in rules:
            if rule.type == "qualified-rule":
                depth, alt = 0, []
                for tok in rule.prelude:
                    if tok.type == "literal" and tok.value == "," and depth == 0:
                        found.append(tinycss2.serialize(alt).strip())
                        alt = []
                    else:
                        alt.append(tok)
                found.append(tinycss2.serialize(alt).strip())
            elif rule.type == "at-rule" and rule.content is not None:
                walk(tinycss2.parse_rule_list(rule.content, skip_comments=True, skip_whitespace=True))
    walk(tinycss2.parse_stylesheet(sheet, skip_comments=True, skip_whitespace=True))
    return found


def _all_scoped(sheet: str, scope: str) -> bool:
    return all(s.startswith(f".{scope} ") for s in _selectors(sheet))


@pytest.mark.parametrize("css", [
    ".t, #main {color: red}",                         # second selector of the list
    ".t, .jp-Toolbar {background-color: red}",
    ".t .jp-Toolbar {color: red}",                    # a compound part naming the interface
    ".t, .cm-content {color: red}",                   # CodeMirror's editors
    ".t .cm-line {color: red}",
    ".t:is(.jp-Notebook) {color: red}",               # functional pseudo-class arguments
    ".t:where(.lm-Widget) {color: red}",
    ".t:not(.cm-editor) {color: red}",
    ".t:has(.jp-Cell) {color: red}",
    "#main {opacity: 0}", "body {display: none}", ":root {color: red}", "html {color: red}",
    ".t, body {color: red}", ".t, :root {color: red}", ".t, * {color: red}",
    ":is(.t, body) {color: red}", ":where(#main) {color: red}", ":has(.t) {color: red}",
    ":host {color: red}", "::part(x) {color: red}", "& {color: red}", ".t & {color: red}",
    "@media screen { body {display: none} }",         # bodies of grouping at-rules
    "@media screen { .t, .jp-Dialog {display: block} }",
    "@supports (color: red) { #main {opacity: 0} }",
    "@media screen { @supports (color: red) { .cm-editor {color: red} } }",
    "@import url(//127.0.0.1:9/x.css);", "@namespace svg url(http://www.w3.org/2000/svg);",
    "@font-face {font-family: x; src: url(//127.0.0.1:9/f.woff)}",
    "@keyframes k {from {opacity: 0}}", "@layer x {.t {color: red}}", "@unknown x {.t {color: red}}",
    ".t[title=\"a\"] {color: red}", ".t\\:x {color: red}",
])
def test_rules_reaching_outside_the_output_are_dropped_with_a_notice(css):
    clean, notices = _filter(css)
    assert "<style>" not in clean, clean
    assert notices and "sandbox-kernel: removed" in notices[0]


@pytest.mark.parametrize("css, rule", [
    (".t {color: red}", ".t {color: red}"),
    (".t td, .u th {color: red}", ".t td, .{s} .u th {color: red}"),
    (".t ~ .u {color: red}", ".t ~ .u {color: red}"),         # siblings inside the output only
    (".t:not(.u) {color: red}", ".t:not(.u) {color: red}"),
    (".t:nth-child(2n + 1) {color: red}", ".t:nth-child(2n + 1) {color: red}"),
    (".t:is(.u, b) {color: red}", ".t:is(.u, b) {color: red}"),
    (".t:has(> b) {color: red}", ".t:has(> b) {color: red}"),
])
def test_kept_rules_start_with_the_wrapper_in_every_alternative(css, rule):
    clean, _ = _filter(css)
    m = WRAPPED.fullmatch(clean)
    assert m, clean
    scope, sheet, body = m.groups()
    assert sheet == f".{scope} " + rule.replace("{s}", scope)
    assert _all_scoped(sheet, scope)
    assert 'class="t"' in body


def test_media_and_supports_bodies_are_kept_scoped():
    clean, notices = _filter("@media (max-width: 600px) { .t {color: red} body {color: red} }"
                             "@supports (display: grid) { @media print { .t td {color: blue} } }")
    scope, sheet, _ = WRAPPED.fullmatch(clean).groups()
    assert "@media (max-width: 600px)" in sheet and "@supports (display: grid)" in sheet
    assert "body" not in sheet
    assert _all_scoped(sheet, scope) and len(_selectors(sheet)) == 2
    assert notices  # body {...} went


def test_each_output_gets_its_own_wrapper():
    a, _ = _filter(".t {color: red}")
    b, _ = _filter(".t {color: red}")
    assert WRAPPED.fullmatch(a).group(1) != WRAPPED.fullmatch(b).group(1)


def test_the_sandbox_cannot_wear_a_wrapper_class():
    clean, _ = _filter(".t {color: red}", '<b class="sbk-out-0123456789ab t">x</b>')
    assert clean.count("sbk-out-") == 2  # the wrapper and its one selector
    assert "sbk-out-0123456789ab" not in clean


def test_a_rule_aimed_at_the_notice_cannot_reach_it():
    # The notice is a plain-text output of its own (stream or text/plain), never
    # markup, and never inside any output's wrapper; a rule naming JupyterLab's
    # classes for it is dropped, and every other rule is confined to the wrapper.
    css = (".t, .jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr'] {opacity: 0}"
           ".t ~ * {opacity: 0} .jp-RenderedText {opacity: 0}")
    clean, notices = _filter(css)
    assert notices and all("<" not in n for n in notices)
    m = WRAPPED.fullmatch(clean)
    if m:
        assert _all_scoped(m.group(2), m.group(1))
        assert "jp-" not in m.group(2)


def test_pandas_styler_table_styles_are_kept():
    pd = pytest.importorskip("pandas")
    pytest.importorskip("jinja2")
    df = pd.DataFrame([[1, 2], [3, 4]], columns=["x", "y"])
    html = (df.style.set_table_styles([{"selector": "td", "props": "color: red;"}])
            .map(lambda v: "background-color: yellow" if v > 2 else "")._repr_html_())
    clean = FW.filter("display_data", {"data": {"text/html": html}, "metadata": {}})[0]["data"]["text/html"]
    scope, sheet, body = WRAPPED.fullmatch(clean).groups()
    assert "color: red" in sheet and "background-color: yellow" in sheet
    assert _all_scoped(sheet, scope)
    rule = re.search(rf"\.{scope} #({scope}-T_\w+) td \{{color: red\}}", sheet)
    assert rule, sheet  # the table's own id, prefixed with the output's wrapper
    assert f'<table id="{rule.group(1)}"' in body  # and the table carries it: the rule applies


_PIECES = st.sampled_from([
    ".t", "#u", "b", "td", "*", " ", " > ", " + ", " ~ ", ",", ":is(", ":where(", ":not(", ":has(", ")",
    ":root", "body", "html", "#main", ".jp-X", ".cm-y", "&", ":host", "::part(a)", "[a]", "[a=b]",
    ":nth-child(2n+1)", "@media screen {", "@supports (a: b) {", "}", "{color: red}", "\\", "'", "\"",
])


@settings(max_examples=300, deadline=None)
@given(st.lists(_PIECES, max_size=14))
def test_any_kept_selector_starts_with_the_scope(pieces):
    css = "".join(pieces) + " {color: red}"
    sheet, _ = clean_stylesheet(css, SCOPE)
    for sel in _selectors(sheet):
        assert sel.startswith(f".{SCOPE} "), (css, sheet)
        rest = sel[len(SCOPE) + 2:]
        # the page's own names as whole names (``:rootbody`` is no pseudo-class: a browser drops its rule)
        assert not re.search(r"(?<![\w-])(body|html)(?![\w-])|:root(?![\w-])|:host(?![\w])|:host-context|::part|&"
                             r"|#main(?![\w-])|\.jp-|\.cm-", rest), (css, sheet)


def test_allowed_properties_unchanged():
    assert "position" not in STYLE_PROPERTIES and "content" not in STYLE_PROPERTIES
