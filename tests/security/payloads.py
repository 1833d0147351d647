"""A corpus of script and fetch payloads, shared by the message-level and browser tests.

Every payload names itself with an id.  A payload that runs script sets
``window.__sk_<id>``; one that fetches asks for ``/<id>`` from the beacon, a
loopback HTTP server the test starts (``beacon`` below is its
``127.0.0.1:PORT``).  Nothing here points anywhere but that beacon.

* :func:`bundles` — mime bundles (and metadata) a cell displays, for every
  path that carries one: ``display_data``, ``execute_result``,
  ``update_display_data``, page payloads, ``Output`` widgets' outputs.
* :func:`widget_cells` — cell code creating and updating widgets whose state
  would run script or fetch (view swaps, HTML fields, CSS, media addresses,
  ``Output`` widgets, browser-side links).
* :func:`notebook_cells` — all of it as the cells of one notebook: what the
  browser test runs in the sandbox.
"""

from __future__ import annotations

import json


def js(pid: str) -> str:
    """Script that marks payload ``pid`` as executed."""
    return f"window.__sk_{pid}=1"


def bundles(beacon: str) -> list[tuple[str, dict, dict]]:
    """(id, bundle, metadata) for each output-borne payload; ``beacon`` is ``127.0.0.1:PORT``."""
    b = beacon
    out: list[tuple[str, dict, dict]] = [
        # --- script -------------------------------------------------------------------
        ("js1", {"application/javascript": js("js1"), "text/plain": "js"}, {}),
        ("h1", {"text/html": f"<script>{js('h1')}</script>"}, {}),
        ("h2", {"text/html": f'<img src="x" onerror="{js("h2")}">'}, {}),
        ("h3", {"text/html": f'<svg><image href="x" onerror="{js("h3")}"></image></svg>'}, {}),
        ("h4", {"text/html": '<iframe srcdoc="<script>parent.__sk_h4=1</script>"></iframe>'}, {}),
        ("h5", {"text/html": f'<details open ontoggle="{js("h5")}"><summary>d</summary></details>'}, {}),
        ("h6", {"text/html": f'<style onload="{js("h6")}"></style>'}, {}),
        ("h7", {"text/html": f'<img src="x" OnErRoR\x0c="{js("h7")}">'}, {}),
        ("h8", {"text/html": f'<math><mtext><table><mglyph><style><img src=x onerror="{js("h8")}">'}, {}),
        ("h9", {"text/html": f'<noscript><p title="</noscript><img src=x onerror={js("h9")}>"></noscript>'}, {}),
        # namespace confusion around inline MathML (the firewall keeps MathML where stable)
        ("h10", {"text/html": f'<form><math><mtext></form><form><mglyph><style></math>'
                              f'<img src onerror="{js("h10")}">'}, {}),
        ("h11", {"text/html": f'<math><mi><table><mi><mglyph><style><img src=x onerror="{js("h11")}">'}, {}),
        ("h12", {"text/html": f'<math><annotation-xml encoding="text/html"><img src=x onerror="{js("h12")}">'
                              f'</annotation-xml></math>'}, {}),
        ("md1", {"text/markdown": f'hello <img src="x" onerror="{js("md1")}">'}, {}),
        ("md2", {"text/markdown": f"<script>{js('md2')}</script>"}, {}),
        ("sv1", {"image/svg+xml": f'<svg xmlns="http://www.w3.org/2000/svg" onload="{js("sv1")}"><rect/></svg>'},
         {}),
        # --- fetch: HTML ----------------------------------------------------------------
        ("fimg1", {"text/html": f'<img src="http://{b}/fimg1">'}, {}),
        ("fimg2", {"text/html": f'<img src="//{b}/fimg2">'}, {}),
        ("fimg3", {"text/html": f'<img src="/\\{b}/fimg3">'}, {}),
        ("fimg4", {"text/html": f'<img src="&#104;ttp://{b}/fimg4">'}, {}),
        ("fimg5", {"text/html": f'<img srcset="http://{b}/fimg5 1x">'}, {}),
        ("fcss1", {"text/html": f'<div style="background:url(http://{b}/fcss1)">c</div>'}, {}),
        ("fcss2", {"text/html": f"<style>@import url(http://{b}/fcss2);</style>"}, {}),
        ("fcss3", {"text/html": f"<style>.skc3{{background:url(//{b}/fcss3)}}</style><div class=skc3>c</div>"}, {}),
        ("fcss4", {"text/html": f"<div style=\"background-image:image-set('http://{b}/fcss4' 1x)\">c</div>"}, {}),
        ("fcss5", {"text/html": f'<div style="background:u\\72 l(http://{b}/fcss5)">c</div>'}, {}),
        ("flink", {"text/html": f'<link rel="stylesheet" href="http://{b}/flink">'}, {}),
        ("fpost", {"text/html": f'<video poster="http://{b}/fpost"></video>'}, {}),
        ("finput", {"text/html": f'<input type="image" src="http://{b}/finput">'}, {}),
        ("ftbl", {"text/html": f'<table background="http://{b}/ftbl"><tr><td>t</td></tr></table>'}, {}),
        ("fobj", {"text/html": f'<object data="http://{b}/fobj"></object>'}, {}),
        ("fhtex", {"text/html": f"<p>$\\style{{background-image:url(http://{b}/fhtex)}}{{x}}$</p>"}, {}),
        ("fhtex2", {"text/html": f"<p>$$\\bbox[background-image:url(http://{b}/fhtex2)]{{x}}$$</p>"}, {}),
        # --- fetch: markdown ------------------------------------------------------------
        ("fmd1", {"text/markdown": f"![i](http://{b}/fmd1)"}, {}),
        ("fmd2", {"text/markdown": f"![i](\\/\\/{b}/fmd2)"}, {}),
        ("fmd3", {"text/markdown": f"![i](&#47;&#47;{b}/fmd3)"}, {}),
        ("fmd4", {"text/markdown": f"![i][r]\n\n[r]: http://{b}/fmd4"}, {}),
        ("fmd5", {"text/markdown": f"> ![i][q]\n>\n> [q]: <//{b}/fmd5>"}, {}),
        ("fmd6", {"text/markdown": f'<img src="//{b}/fmd6">'}, {}),
        ("fmd7", {"text/markdown": f'<div style="background:url(//{b}/fmd7)">x</div>'}, {}),
        ("fmd8", {"text/markdown": f"$\\style{{background-image:url(http://{b}/fmd8)}}{{x}}$"}, {}),
        ("fmd9", {"text/markdown": f"![i](<http://{b}/fmd9> \"t\")"}, {}),
        ("fmd10", {"text/markdown": f"[![i](http://{b}/fmd10)](http://example.invalid/)"}, {}),
        ("fmd11", {"text/markdown": f'<a:b style="background:url(//{b}/fmd11)">q</a:b>'}, {}),
        # --- fetch: LaTeX ----------------------------------------------------------------
        ("ftex1", {"text/latex": f"$\\style{{background-image:url(http://{b}/ftex1)}}{{x}}$"}, {}),
        ("ftex2", {"text/latex": f"$$\\bbox[background-image:url(//{b}/ftex2)]{{x}}$$"}, {}),
        ("ftex3", {"text/latex": f"$\\unicode[some-font]{{x41}}\\class{{sk}}{{x}}\\href{{//{b}/ftex3}}{{x}}$"},
         {}),
        # --- fetch: SVG ------------------------------------------------------------------
        ("fsvg1", {"image/svg+xml": f'<svg xmlns="http://www.w3.org/2000/svg"><image href="http://{b}/fsvg1"/>'
                                    "</svg>"}, {}),
        ("fsvg2", {"image/svg+xml": f'<svg xmlns="http://www.w3.org/2000/svg"><style>@import url(http://{b}/fsvg2);'
                                    "</style><rect/></svg>"}, {}),
        # --- fetch: charts ---------------------------------------------------------------
        ("fvl1", {"application/vnd.vegalite.v5+json": {
            "data": {"url": f"http://{b}/fvl1"}, "mark": "bar",
            "encoding": {"x": {"field": "a", "type": "nominal"}}}}, {}),
        ("fvl2", {"application/vnd.vegalite.v5+json": {
            "data": {"values": [{"u": f"http://{b}/fvl2"}]}, "mark": {"type": "image", "width": 10, "height": 10},
            "encoding": {"url": {"field": "u", "type": "nominal"}, "x": {"value": 5}, "y": {"value": 5}}}}, {}),
        ("fvl3", {"application/vnd.vegalite.v4+json": {
            "data": {"values": [{"a": 1}]}, "mark": "point",
            "usermeta": {"embedOptions": {"defaultStyle": f"@import url(http://{b}/fvl3);"}}}}, {}),
        ("fvl4", {"application/vnd.vegalite.v5+json": {"data": {"values": [{"a": 1}]}, "mark": "point"}},
         {"application/vnd.vegalite.v5+json": {"embed_options": {"defaultStyle": f"@import url(http://{b}/fvl4);",
                                                                  "renderer": "svg"}}}),
        ("fvg1", {"application/vnd.vega.v5+json": {
            "width": 50, "height": 50, "data": [{"name": "t", "url": f"http://{b}/fvg1"}],
            "marks": [{"type": "rect", "from": {"data": "t"}}]}}, {}),
        ("fvg2", {"application/vnd.vega.v5+json": {
            "width": 50, "height": 50,
            "marks": [{"type": "image", "encode": {"enter": {"url": {"signal": f"'http://{b}/' + 'fvg2'"},
                                                             "width": {"value": 9}, "height": {"value": 9}}}}]}}, {}),
        ("fpl1", {"application/vnd.plotly.v1+json": {
            "data": [], "layout": {"images": [{"source": f"http://{b}/fpl1", "x": 0, "y": 0, "sizex": 1,
                                               "sizey": 1}]}}}, {}),
    ]
    return out


def widget_cells(beacon: str) -> list[tuple[str, str]]:
    """(id, cell code) for payloads carried by widget state, created then updated."""
    b = beacon
    return [
        ("w1", "import ipywidgets as w\n"
               f"w.Text(value='<img src=x onerror=\"{js('w1')}\">', _view_name='HTMLView')"),
        ("w2", f"w.HTML(value='<img src=x onerror=\"{js('w2')}\"><b>bold</b>')"),
        ("fw3", f"w.HTMLMath(value='<img src=\"//{b}/fw3\"> $x^2$')"),
        ("fw4", f"w.Label(value='l', description='<img src=\"//{b}/fw4\">', description_allow_html=True)"),
        ("fw5", f"w.HTML(value='s', style={{'background': 'url(http://{b}/fw5)'}})"),
        ("fw6", f"w.Image(value=b'http://{b}/fw6', format='url')"),
        ("w7", "from IPython.display import HTML, Javascript, display\n"
               "o7 = w.Output()\n"
               f"o7.append_display_data(HTML('<img src=x onerror=\"{js('w7')}\">'))\n"
               f"o7.append_display_data(Javascript('{js('w8')}'))\n"
               "o7"),
        ("w9", "h9 = w.HTML('safe'); display(h9)"),
        ("w9u", f"h9.value = '<img src=x onerror=\"{js('w9')}\">'"),
        ("w10", f"t10 = w.Text('<img src=x onerror=\"{js('w10')}\">'); display(t10)"),
        ("w10u", "t10._view_name = 'HTMLView'; display(t10)"),
        ("w11", f"a11 = w.Text('<img src=x onerror=\"{js('w11')}\">'); b11 = w.HTML('x')\n"
                "l11 = w.jslink((a11, 'value'), (b11, 'value')); display(a11, b11)"),
        ("fw12", f"w.Label(value='$\\\\style{{background-image:url(http://{b}/fw12)}}{{x}}$')"),
        ("fw13", f"w.Label(value='b', style={{'background': 'red url(//{b}/fw13)'}})"),
        ("w14", f"w.Text(value='<img src=x onerror=\"{js('w14')}\">', _view_module='@jupyter-widgets/controls', "
                "_view_name='HTMLView', _model_name='HTMLModel')"),
        ("fw15", f"o15 = w.Output(); display(o15)\n"
                 f"o15.outputs = ({{'output_type': 'display_data', 'metadata': {{}}, 'data': "
                 f"{{'text/html': '<img src=\"http://{b}/fw15\">'}}}},)"),
    ]


def notebook_cells(beacon: str) -> list[str]:
    """Every payload as notebook cells: displays, an execute_result, a display update, a page
    payload, then the widget cells."""
    cells = ["from IPython.display import display, HTML\nimport json"]
    for pid, bundle, metadata in bundles(beacon):
        cells.append(f"display(json.loads({json.dumps(json.dumps(bundle))}), raw=True, "
                     f"metadata=json.loads({json.dumps(json.dumps(metadata))}))  # {pid}")
    cells.append(f"HTML('<img src=x onerror=\"{js('r1')}\"><img src=\"//{beacon}/fr1\">')  # execute_result")
    cells.append("dh = display(HTML('safe'), display_id=True)")
    cells.append(f"dh.update(HTML('<img src=x onerror=\"{js('u1')}\"><img src=\"//{beacon}/fu1\">'))")
    cells.append("from IPython.core import page\n"
                 f"page.page({{'text/html': '<img src=x onerror=\"{js('p1')}\"><img src=\"//{beacon}/fp1\">', "
                 "'text/plain': 'p'})")
    cells += [code for _, code in widget_cells(beacon)]
    return cells
