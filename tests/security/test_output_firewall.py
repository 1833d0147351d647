"""Script-capable output from the sandbox never reaches the browser (default policy)."""

from sandbox_kernel.outputs import OutputFirewall


def _widget_open(comm_id, model, **state):
    return {"comm_id": comm_id, "target_name": "jupyter.widget",
            "data": {"state": {"_model_name": model, **state}, "buffer_paths": []}}


def test_html_widget_value_is_sanitised_on_open_and_update():
    fw = OutputFirewall("sanitize")
    c, notes = fw.filter_comm("comm_open", _widget_open("w1", "HTMLModel", value="<b>hi</b><img src=x onerror=alert(1)>"))
    assert "onerror" not in c["data"]["state"]["value"] and "<b>hi</b>" in c["data"]["state"]["value"]
    assert notes and "widget value" in notes[0]
    upd = {"comm_id": "w1", "data": {"method": "update", "state": {"value": "<script>alert(1)</script>ok"}}}
    c, _ = fw.filter_comm("comm_msg", upd)
    assert "<script" not in c["data"]["state"]["value"]
    assert fw.filter_comm("comm_close", {"comm_id": "w1", "data": {}})[0] == {"comm_id": "w1", "data": {}}
    # after close the id is forgotten: an update for an unknown comm is not a widget we track
    assert "w1" not in fw._widgets


def test_plain_widgets_and_other_comms_pass_unchanged():
    fw = OutputFirewall("sanitize")
    text = _widget_open("t", "TextareaModel", value="a < b and <b>literal</b>", description="x<y")
    assert fw.filter_comm("comm_open", text) == (text, [])
    other = {"comm_id": "c", "target_name": "my_target", "data": {"state": {"value": "<script>"}}}
    assert fw.filter_comm("comm_open", other) == (other, [])  # not a widget state we render


def test_description_is_markup_only_when_allowed():
    fw = OutputFirewall("sanitize")
    c, _ = fw.filter_comm("comm_open", _widget_open("s", "IntSliderModel", description="<i>n</i><script>x</script>",
                                                     description_allow_html=True))
    assert c["data"]["state"]["description"] == "<i>n</i>"


def test_output_widget_outputs_are_filtered():
    fw = OutputFirewall("sanitize")
    outs = [{"output_type": "display_data", "data": {"application/javascript": "alert(1)", "text/plain": "t"},
             "metadata": {}}, {"output_type": "stream", "name": "stdout", "text": "ok\n"}]
    c, notes = fw.filter_comm("comm_open", _widget_open("o", "OutputModel", outputs=outs))
    assert c["data"]["state"]["outputs"][0]["data"] == {"text/plain": "t"}
    assert c["data"]["state"]["outputs"][1] == outs[1]
    assert notes


def test_trust_policy_passes_widget_markup():
    fw = OutputFirewall("trust")
    msg = _widget_open("w", "HTMLModel", value="<img src=x onerror=alert(1)>")
    assert fw.filter_comm("comm_open", msg) == (msg, [])


def test_kernel_strips_scripts_from_outputs_and_widgets(kernel):
    r = kernel.execute(
        "from IPython.display import display, HTML, Javascript\n"
        "display(Javascript('alert(1)'))\n"
        "display(HTML('<b>bold</b><script>alert(2)</script>'))\n"
    )
    displays = r.of_type("display_data")
    assert all("application/javascript" not in d["content"]["data"] for d in displays)
    html = [d["content"]["data"]["text/html"] for d in displays if "text/html" in d["content"]["data"]]
    assert html == ["<b>bold</b>"]
    assert "removed application/javascript output" in r.stderr
    assert "output_policy=trust" in r.stderr
    w = kernel.execute("import ipywidgets as w\nh = w.HTML('<i>x</i><img src=q onerror=alert(3)>')\nh")
    assert w.status == "ok"
    html_models = [m for m in w.of_type("comm_open")
                   if m["content"]["data"]["state"].get("_model_name") == "HTMLModel"]
    assert len(html_models) == 1
    assert html_models[0]["content"]["data"]["state"]["value"] == "<i>x</i><img src=\"q\">"
    assert "sanitised widget value" in w.stderr
