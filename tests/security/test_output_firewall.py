"""Script-capable or fetching output from the sandbox never reaches the browser (default policy).

Message level, no browser: every payload of ``payloads.py`` on every path a
message can take (display, execute result, display update, page payload,
``Output`` widgets, widget creation and updates, ``update_states`` after a
page reload, comms the frontend opened), checked with ``inert.py``, which reads
values as JupyterLab's renderers would.  The last tests run the widget
payloads in a real sandboxed kernel.
"""

from __future__ import annotations

import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kernels import kernel_name_for
from sandbox_kernel.outputs import OutputFirewall
from sandbox_kernel.outputs.widgets import remove_buffers

from .inert import bundle_problems, html_problems, widget_state_problems
from .payloads import bundles, widget_cells

BEACON = "127.0.0.1:9"  # never contacted: these tests only read messages
CORPUS = bundles(BEACON)
CONTROLS, BASE, OUTPUT = "@jupyter-widgets/controls", "@jupyter-widgets/base", "@jupyter-widgets/output"


# ---------------------------------------------------------------------------
# Mime bundles on every path
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("msg_type", ["display_data", "execute_result", "update_display_data"])
@pytest.mark.parametrize("pid,bundle,metadata", CORPUS, ids=[c[0] for c in CORPUS])
def test_corpus_bundle_is_inert_with_one_notice(msg_type, pid, bundle, metadata):
    fw = OutputFirewall("sanitize")
    content = {"data": bundle, "metadata": metadata, "transient": {}}
    out, notices = fw.filter(msg_type, content)
    assert bundle_problems(out["data"], BEACON) == []
    assert len(notices) == 1 and notices[0].startswith("sandbox-kernel: removed "), notices
    for mime, meta in (out.get("metadata") or {}).items():
        assert "embed_options" not in (meta or {}), mime


@pytest.mark.parametrize("pid,bundle,metadata", CORPUS, ids=[c[0] for c in CORPUS])
def test_corpus_in_page_payload_and_output_widget(pid, bundle, metadata):
    fw = OutputFirewall("sanitize")
    payload, notices = fw.filter_payload([{"source": "page", "data": bundle, "start": 0}])
    # fvl4 carries its payload in output metadata, which a page payload does not have
    assert bundle_problems(payload[0]["data"], BEACON) == [] and len(notices) == (pid != "fvl4")
    out = [{"output_type": "display_data", "data": bundle, "metadata": metadata}]
    c, _, notices = fw.filter_comm("comm_open", _open(f"o-{pid}", "OutputModel", OUTPUT, "OutputView", outputs=out,
                                                       _model_module=OUTPUT))
    assert bundle_problems(c["data"]["state"]["outputs"][0]["data"], BEACON) == [] and len(notices) == 1


def test_trust_passes_everything():
    fw = OutputFirewall("trust")
    for _, bundle, metadata in CORPUS:
        content = {"data": bundle, "metadata": metadata}
        assert fw.filter("display_data", content) == (content, [])
    msg = _open("w", "HTMLModel", CONTROLS, "HTMLView", value="<img src=x onerror=alert(1)>")
    assert fw.filter_comm("comm_open", msg, []) == (msg, [], [])


def test_inspect_reply_data_is_filtered():
    fw = OutputFirewall("sanitize")
    content = {"status": "ok", "found": True, "data": {"text/html": f'<img src="//{BEACON}/x">', "text/plain": "d"}}
    out, notices = fw.filter_reply("inspect_reply", content)
    assert html_problems(out["data"]["text/html"]) == [] and notices


def test_user_expressions_are_filtered():
    fw = OutputFirewall("sanitize")
    content = {"status": "ok", "payload": [], "user_expressions": {
        "a": {"status": "ok", "data": {"text/html": "<img src=x onerror=a()>", "text/plain": "a"}, "metadata": {}},
        "b": {"status": "error", "ename": "NameError", "evalue": "b", "traceback": []}}}
    out, notices = fw.filter_reply("execute_reply", content)
    assert html_problems(out["user_expressions"]["a"]["data"]["text/html"]) == [] and len(notices) == 1
    assert out["user_expressions"]["b"] == content["user_expressions"]["b"]


def test_faithful_outputs_pass_unchanged():
    fw = OutputFirewall("sanitize")
    fine = {
        "text/markdown": "# T\n\n![dot](data:image/png;base64,iVBORw0KGgo=) `<b>` **b** [link](https://jupyter.org)"
                         "\n\n$\\frac{a}{b} + \\color{red}{x}$",
        "text/latex": r"$$\int_0^1 x\,dx = \tfrac12$$",
        "text/html": '<table class="dataframe"><tr><td style="text-align: right;">1</td></tr></table>',
        "application/vnd.vegalite.v5+json": {"data": {"values": [{"a": 1, "u": "http://x.test/"}]}, "mark": "bar",
                                             "encoding": {"x": {"field": "a", "type": "quantitative"}}},
        "application/vnd.plotly.v1+json": {"data": [{"type": "bar", "y": [1, 2], "name": "Value: 3"}],
                                           "layout": {"title": {"text": "<b>T</b> x<sup>2</sup>"}}},
    }
    content = {"data": fine, "metadata": {"image/png": {"width": 10}}}
    out, notices = fw.filter("display_data", content)
    assert notices == [] and out["metadata"] == content["metadata"]
    assert {k: v for k, v in out["data"].items() if k != "text/html"} == \
        {k: v for k, v in fine.items() if k != "text/html"}
    assert out["data"]["text/html"] == \
        '<table class="dataframe"><tbody><tr><td style="text-align:right">1</td></tr></tbody></table>'  # re-serialised


# ---------------------------------------------------------------------------
# Widgets: a browser simulated at message level
# ---------------------------------------------------------------------------


def _open(comm_id, model, view_module, view, buffers_state=None, **state):
    state = {"_model_module": state.pop("_model_module", CONTROLS), "_model_name": model,
             "_view_module": view_module, "_view_name": view, **state}
    return {"comm_id": comm_id, "target_name": "jupyter.widget", "data": {"state": state, "buffer_paths": []}}


def _update(comm_id, **state):
    return {"comm_id": comm_id, "data": {"method": "update", "state": state, "buffer_paths": []}}


class Browser:
    """What the frontend's widget manager holds, fed with relayed messages (ipywidgets 8.1)."""

    def __init__(self):
        self.models: dict[str, dict] = {}

    def receive(self, msg_type, content, buffers):
        if content is None:
            return
        data = content["data"]
        if data.get("method") == "update_states":
            for mid, entry in data["states"].items():
                self.models[mid] = {**entry["state"], "_model_name": entry["model_name"]}
            for path, buf in zip(data["buffer_paths"], buffers):
                self.models[path[0]][path[2]] = buf
            return
        state = dict(data.get("state") or {})
        for path, buf in zip(data.get("buffer_paths") or [], buffers):
            state[path[0]] = buf
        self.models.setdefault(content["comm_id"], {}).update(state)

    def problems(self):
        models = {k: dict(v) for k, v in self.models.items()}
        for m in models.values():  # browser-side links copy source values into targets
            if m.get("_model_name") in ("LinkModel", "DirectionalLinkModel"):
                src, dst = m["source"], m["target"]
                if src[0][10:] in models and dst[0][10:] in models:
                    models[dst[0][10:]][dst[1]] = models[src[0][10:]].get(src[1])
        return {k: p for k, m in models.items()
                if (p := widget_state_problems(m, m.get("_view_name"), m.get("_model_name"), BEACON))}


def _relay(fw, browser, msg_type, content, buffers=()):
    out, bufs, notices = fw.filter_comm(msg_type, content, list(buffers))
    browser.receive(msg_type, out, bufs)
    return out, notices


def test_view_swap_at_creation_is_refused_and_its_display_removed():
    fw, br = OutputFirewall("sanitize"), Browser()
    out, notices = _relay(fw, br, "comm_open", _open("t", "TextModel", CONTROLS, "HTMLView",
                                                     value="<img src=x onerror=alert(1)>"))
    assert out is None and notices and "widget" in notices[0]
    shown, n2 = fw.filter("display_data", {"data": {"application/vnd.jupyter.widget-view+json": {"model_id": "t"},
                                                    "text/plain": "Text()"}, "metadata": {}})
    assert shown["data"] == {"text/plain": "Text()"} and n2
    assert _relay(fw, br, "comm_msg", _update("t", value="x"))[0] is None
    assert br.problems() == {}


def test_later_view_swap_resends_the_value_sanitised():
    fw, br = OutputFirewall("sanitize"), Browser()
    _relay(fw, br, "comm_open", _open("t", "TextModel", CONTROLS, "TextView", value="<img src=x onerror=alert(1)>"))
    assert br.models["t"]["value"] == "<img src=x onerror=alert(1)>"  # plain text in a TextView: harmless
    out, notices = _relay(fw, br, "comm_msg", _update("t", _model_name="HTMLModel", _view_name="HTMLView"))
    assert br.problems() == {} and notices
    out, notices = _relay(fw, br, "comm_msg", _update("t", _view_name="EvilView", _view_module="evil-widgets"))
    assert "_view_name" not in out["data"]["state"] and notices and br.models["t"]["_view_name"] == "HTMLView"


def test_description_allow_html_flip_resends_description():
    fw, br = OutputFirewall("sanitize"), Browser()
    _relay(fw, br, "comm_open", _open("s", "IntSliderModel", CONTROLS, "IntSliderView",
                                      description=f'<img src="//{BEACON}/d">'))
    _relay(fw, br, "comm_msg", _update("s", description_allow_html=True))
    assert br.problems() == {}


def test_page_reload_update_states_is_filtered_with_buffers():
    fw, br = OutputFirewall("sanitize"), Browser()
    _relay(fw, br, "comm_open", _open("h", "HTMLModel", CONTROLS, "HTMLView", value="<b>ok</b>"))
    _relay(fw, br, "comm_open", _open("t", "TextModel", CONTROLS, "HTMLView", value="<img src=x onerror=a()>"))
    fw.observe_frontend("comm_open", {"comm_id": "ctl", "target_name": "jupyter.widget.control", "data": {}})
    image = {"_model_module": CONTROLS, "_model_name": "ImageModel", "_view_module": CONTROLS,
             "_view_name": "ImageView", "format": "url", "value": f"http://{BEACON}/img".encode()}
    states = {
        "h": {"model_name": "HTMLModel", "model_module": CONTROLS, "model_module_version": "2.0.0",
              "state": {"_model_module": CONTROLS, "_model_name": "HTMLModel", "_view_module": CONTROLS,
                        "_view_name": "HTMLView", "value": "<img src=x onerror=a()><b>bold</b>"}},
        "t": {"model_name": "TextModel", "model_module": CONTROLS, "model_module_version": "2.0.0",
              "state": {"_model_name": "TextModel", "_view_name": "HTMLView", "value": "<script>a()</script>"}},
        "i": {"model_name": "ImageModel", "model_module": CONTROLS, "model_module_version": "2.0.0", "state": image},
    }
    clean, paths, bufs = remove_buffers(states)
    reply = {"comm_id": "ctl", "data": {"method": "update_states", "states": clean, "buffer_paths": paths}}
    br.models.clear()  # the reloaded page starts empty
    out, notices = _relay(fw, br, "comm_msg", reply, bufs)
    assert set(out["data"]["states"]) == {"h", "i"}  # the refused widget stays refused
    assert "<b>bold</b>" in br.models["h"]["value"] and br.problems() == {} and notices


def test_links_may_write_only_plain_fields():
    fw, br = OutputFirewall("sanitize"), Browser()
    _relay(fw, br, "comm_open", _open("a", "TextModel", CONTROLS, "TextView", value="<img src=x onerror=a()>"))
    _relay(fw, br, "comm_open", _open("b", "HTMLModel", CONTROLS, "HTMLView", value="x"))
    _relay(fw, br, "comm_open", _open("c", "IntSliderModel", CONTROLS, "IntSliderView", value=1))
    out, notices = _relay(fw, br, "comm_open", _open("l1", "LinkModel", CONTROLS, None, source=["IPY_MODEL_a", "value"],
                                                     target=["IPY_MODEL_b", "value"]))
    assert out is None and notices
    out, _ = _relay(fw, br, "comm_open", _open("l2", "LinkModel", CONTROLS, None, source=["IPY_MODEL_c", "value"],
                                               target=["IPY_MODEL_a", "value"]))
    assert out is not None  # slider <-> text: both plain
    out, notices = _relay(fw, br, "comm_msg", _update("a", _model_name="HTMLModel", _view_name="HTMLView"))
    assert "_view_name" not in out["data"]["state"] and notices  # a linked field stays plain
    assert br.problems() == {}


def test_style_media_and_unknown_targets():
    fw, br = OutputFirewall("sanitize"), Browser()
    _relay(fw, br, "comm_open", _open("st", "HTMLStyleModel", BASE, "StyleView", background=f"url(//{BEACON}/s)"))
    _relay(fw, br, "comm_open", _open("im", "ImageModel", CONTROLS, "ImageView", format="png"))
    _relay(fw, br, "comm_msg", {"comm_id": "im", "data": {"method": "update", "state": {}, "buffer_paths": [["value"]]}},
           [f"http://{BEACON}/i".encode()])
    _relay(fw, br, "comm_msg", _update("im", format="url"))
    assert br.problems() == {}
    plain = {"comm_id": "c1", "target_name": "this-comm-tests-a-missing-handler", "data": {"id": "foo"}}
    assert fw.filter_comm("comm_open", plain, []) == (plain, [], [])
    assert fw.filter_comm("comm_msg", {"comm_id": "c1", "data": {"id": "bar"}}, [])[0] is not None
    markup = {"comm_id": "c1", "data": {"html": "<img src=x onerror=a()>"}}
    assert fw.filter_comm("comm_msg", markup, [])[0] is None
    loader = {"comm_id": "c2", "target_name": "t", "target_module": f"http://{BEACON}/m.js", "data": {}}
    out, _, notices = fw.filter_comm("comm_open", loader, [])
    assert out["target_module"] is None and notices
    unseen = {"comm_id": "never-opened", "data": {"method": "update", "state": {"value": "<script>"}}}
    assert fw.filter_comm("comm_msg", unseen, [])[0] is None


def test_operator_trusted_widget_module_passes():
    fw = OutputFirewall("sanitize", trusted_widget_modules=["jupyter-matplotlib"])
    msg = _open("m", "MPLCanvasModel", "jupyter-matplotlib", "MPLCanvasView", _model_module="jupyter-matplotlib",
                _figure_label="<b>Figure</b>")
    assert fw.filter_comm("comm_open", msg, []) == (msg, [], [])
    other = _open("n", "XModel", "other", "XView", _model_module="other")
    assert fw.filter_comm("comm_open", other, [])[0] is None


_strings = st.lists(st.sampled_from(["<", ">", "/", '"', "'", "=", " ", "img", "src", "x", "onerror", "javascript:",
                                     "\\", "href", "style", "url(", ")", "{", "}", "$", "&#47;", "<script>", "//h/"]),
                    max_size=25).map("".join)


@settings(max_examples=150, deadline=None)
@given(view=st.sampled_from(["HTMLView", "HTMLMathView", "LabelView", "TextView", "EvilView"]),
       value=_strings, description=_strings, allow=st.booleans(), swap=st.sampled_from(["HTMLView", "LabelView"]))
def test_property_browser_state_stays_inert(view, value, description, allow, swap):
    fw, br = OutputFirewall("sanitize"), Browser()
    model = {"HTMLView": "HTMLModel", "HTMLMathView": "HTMLMathModel", "LabelView": "LabelModel"}.get(view, "TextModel")
    _relay(fw, br, "comm_open", _open("x", model, CONTROLS, view, value=value, description=description))
    _relay(fw, br, "comm_msg", _update("x", description_allow_html=allow, _view_name=swap))
    _relay(fw, br, "comm_msg", _update("x", value=value + "<img src=//h/a>"))
    assert br.problems() == {}


# ---------------------------------------------------------------------------
# The widget payloads, run in a real sandboxed kernel
# ---------------------------------------------------------------------------


def test_widget_payloads_in_the_sandbox_and_after_reload(start_kernel):
    k = start_kernel(kernel_name_for("bubblewrap"))
    br = Browser()
    stderr = []
    for pid, code in widget_cells(BEACON):
        r = k.execute(code)
        assert r.status == "ok", (pid, r.reply["content"])
        stderr.append(r.stderr)
        for m in r.outputs:
            if m["msg_type"] in ("comm_open", "comm_msg"):
                br.receive(m["msg_type"], m["content"], m.get("buffers") or [])
            if m["msg_type"] in ("display_data", "execute_result"):
                assert bundle_problems(m["content"]["data"], BEACON) == []
    assert br.problems() == {}
    assert "sandbox-kernel: removed" in "".join(stderr)
    # A page reload: the frontend opens the control comm and asks for every widget's state.
    comm_id = uuid.uuid4().hex
    kc = k.kc
    kc.shell_channel.send(kc.session.msg("comm_open", {"comm_id": comm_id, "target_name": "jupyter.widget.control",
                                                        "data": {}}, metadata={"version": "1.0.0"}))
    kc.shell_channel.send(kc.session.msg("comm_msg", {"comm_id": comm_id, "data": {"method": "request_states"}}))
    reply = None
    while reply is None:
        m = kc.get_iopub_msg(timeout=60)
        if m["msg_type"] == "comm_msg" and m["content"]["comm_id"] == comm_id:
            reply = m
    states = reply["content"]["data"]["states"]
    assert len(states) >= 10
    fresh = Browser()
    fresh.receive("comm_msg", reply["content"], reply.get("buffers") or [])
    assert fresh.problems() == {}
    html_states = [s["state"]["value"] for s in states.values() if s["state"].get("_view_name") == "HTMLView"]
    assert any("<b>bold</b>" in v for v in html_states)  # faithful: the markup stays, the script goes


def test_kernel_removes_scripts_from_displays(start_kernel):
    k = start_kernel(kernel_name_for("bubblewrap"))
    r = k.execute("from IPython.display import display, HTML, Javascript\n"
                  "display(Javascript('alert(1)'))\n"
                  "display(HTML('<b>bold</b><script>alert(2)</script>'))\n")
    displays = r.of_type("display_data")
    # the JavaScript display had nothing else to show (stock shows nothing either): no output
    # at all, no stray "<IPython.core.display.Javascript object>", the one notice on stderr
    assert [d["content"]["data"] for d in displays] == [{"text/html": "<b>bold</b>", "text/plain":
                                                         "<IPython.core.display.HTML object>"}]
    assert r.stderr.count("sandbox-kernel: removed") == 2 and "removed JavaScript from this output" in r.stderr


def test_kernel_filters_inspect_replies_and_page_payloads(start_kernel):
    k = start_kernel(kernel_name_for("bubblewrap"))
    r = k.execute("k = get_ipython().kernel\n"
                  "def di(code, cursor_pos, detail_level=0, omit_sections=()):\n"
                  f"    return {{'status': 'ok', 'found': True, 'metadata': {{}}, 'data': {{\n"
                  f"        'text/html': '<b>doc</b><img src=\"//{BEACON}/i\">', 'text/plain': 'doc'}}}}\n"
                  "k.do_inspect = di\n"
                  "from IPython.core import page\n"
                  f"page.page({{'text/html': '<img src=x onerror=a()><i>p</i>', 'text/plain': 'p'}})")
    payload = r.reply["content"]["payload"]
    assert payload and payload[0]["data"]["text/html"] == "<img><i>p</i>" and "sandbox-kernel: removed" in r.stderr
    reply = k.kc.inspect("x", 1, reply=True, timeout=60)
    assert reply["content"]["data"] == {"text/html": "<b>doc</b><img>", "text/plain": "doc"}
