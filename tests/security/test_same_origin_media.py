"""Sandbox bytes never become a same-origin document (issue 32), at message level.

ipywidgets 8's Image, Video and Audio views turn ``value`` into a ``blob:`` URL
of type ``image/<format>`` (``video/``, ``audio/``) at JupyterLab's origin;
opened in a new tab, an SVG or HTML blob runs script as JupyterLab.  These
tests drive :class:`OutputFirewall` directly (no sandbox, no browser) on every
path such a widget's ``format`` and ``value`` take: creation, later updates
(either field alone, in either order), the ``update_states`` reply after a
reload, values carried as comm buffers or as JSON, formats lying about the
bytes; and real PNG, JPEG, MP4 and MP3 bytes pass unchanged.
"""

from __future__ import annotations

import struct
import zlib

import pytest
from sandbox_kernel.outputs import OutputFirewall
from sandbox_kernel.outputs.media import ALLOWED, sniff
from sandbox_kernel.outputs.widgets import put_buffers, remove_buffers

CONTROLS = "@jupyter-widgets/controls"
SVG = (b'<svg xmlns="http://www.w3.org/2000/svg" onload="fetch(\'/api/terminals\',{method:\'POST\'})">'
       b"<script>document.title='ran'</script></svg>")
DOCUMENTS = {
    "svg": SVG,
    "svg-prolog": b'<?xml version="1.0"?>\n' + SVG,
    "svg-bom": b"\xef\xbb\xbf" + SVG,
    "html": b"<!doctype html><script>fetch('/api/terminals',{method:'POST'})</script>",
    "html-space": b"  \n<html><body onload=alert(1)>",
    "xhtml": b'<html xmlns="http://www.w3.org/1999/xhtml"><script>alert(1)</script></html>',
    "xml-stylesheet": b'<?xml-stylesheet type="text/xsl" href="x.xsl"?><a/>',
    "text": b"alert(1)",
    "svg-utf16": b"\xff\xfe" + SVG.decode().encode("utf-16-le"),
    # a PNG signature later in the value does not make it a PNG
    "html-then-png": b"<script>alert(1)</script>\x89PNG\r\n\x1a\n",
}
SCRIPTABLE_FORMATS = ["svg+xml", "html", "xml", "xhtml+xml", "svg", "png;charset=utf-8", "PNG", "",
                      "x-unknown", "../../text/html"]


def _png() -> bytes:
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    raw = b"\x00\xff\x00\x00"
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


PNG = _png()
JPEG = b"\xff\xd8\xff\xe0\x00\x10JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00\xff\xd9"
GIF = b"GIF89a\x01\x00\x01\x00\x00\x00\x00;"
WEBP = b"RIFF\x1a\x00\x00\x00WEBPVP8L\x0d\x00\x00\x00/\x00\x00\x00\x10\x07\x10\x11\x11\x88\x88\xfe\x07\x00"
MP4 = b"\x00\x00\x00\x18ftypmp42\x00\x00\x00\x00mp42isom" + b"\x00\x00\x00\x08free"
WEBM = b"\x1a\x45\xdf\xa3\x9f\x42\x86\x81\x01" + b"\x00" * 16
MP3 = b"ID3\x04\x00\x00\x00\x00\x00\x00" + b"\xff\xfb\x90\x00" + b"\x00" * 16
WAV = b"RIFF\x24\x00\x00\x00WAVEfmt " + b"\x00" * 16

MEDIA = {"Image": ("ImageModel", "png"), "Video": ("VideoModel", "mp4"), "Audio": ("AudioModel", "mp3")}
RASTER = [("Image", "png", PNG), ("Image", "jpeg", JPEG), ("Image", "jpg", JPEG), ("Image", "gif", GIF),
          ("Image", "webp", WEBP), ("Video", "mp4", MP4), ("Video", "webm", WEBM), ("Audio", "mp3", MP3),
          ("Audio", "wav", WAV)]


def _state(widget: str, **fields) -> dict:
    model, _ = MEDIA[widget]
    return {"_model_module": CONTROLS, "_model_name": model, "_model_module_version": "2.0.0",
            "_view_module": CONTROLS, "_view_name": f"{widget}View", "_view_module_version": "2.0.0",
            **fields}


def _send(fw: OutputFirewall, msg_type: str, comm_id: str, state: dict, method: str = "update"):
    """Relay ``state`` the way ipykernel sends it (bytes as comm buffers); return the browser's view."""
    clean, paths, bufs = remove_buffers(state)
    data = {"state": clean, "buffer_paths": paths}
    if msg_type == "comm_open":
        content = {"comm_id": comm_id, "target_name": "jupyter.widget", "data": data}
    else:
        content = {"comm_id": comm_id, "data": {"method": method, **data}}
    out, out_bufs, notices = fw.filter_comm(msg_type, content, bufs)
    if out is None:
        return None, notices
    got = out["data"]
    return put_buffers(got["state"], got["buffer_paths"], out_bufs), notices


def _reload(fw: OutputFirewall, states: dict) -> tuple[dict, list[str]]:
    """The ``update_states`` reply to the frontend's ``request_states``, as the browser reads it."""
    fw.observe_frontend("comm_open", {"comm_id": "ctl", "target_name": "jupyter.widget.control", "data": {}})
    entries = {mid: {"model_name": s["_model_name"], "model_module": CONTROLS, "model_module_version": "2.0.0",
                     "state": s} for mid, s in states.items()}
    clean, paths, bufs = remove_buffers(entries)
    paths = [[p[0], *p[1:]] for p in paths]  # [model_id, "state", field]
    content = {"comm_id": "ctl", "data": {"method": "update_states", "states": clean, "buffer_paths": paths}}
    out, out_bufs, notices = fw.filter_comm("comm_msg", content, bufs)
    assert out is not None
    got = put_buffers(out["data"]["states"], out["data"]["buffer_paths"], out_bufs)
    return {mid: e["state"] for mid, e in got.items()}, notices


def _safe(widget: str, held: dict) -> list[str]:
    """What is wrong with the (format, value) the browser holds for a media widget."""
    fmt, value = held.get("format"), held.get("value")
    if fmt == "url":
        return [] if value in (b"", "", None) else ["an address"]
    element = {"Image": "image", "Video": "video", "Audio": "audio"}[widget]
    problems = []
    if isinstance(value, str) and value:
        problems.append("a text value (Blob([string]) would be the document)")
    if value and (sniff(bytes(value)) or "") not in ALLOWED[element]:
        problems.append(f"bytes that are not {element}: {bytes(value)[:20]!r}")
    names = {n for ns in ALLOWED[element].values() for n in ns}
    if fmt not in names:
        problems.append(f"format {fmt!r}")
    elif value and fmt not in ALLOWED[element][sniff(bytes(value)) or ""]:
        problems.append(f"format {fmt!r} disagrees with the bytes")
    return problems


def _browser() -> tuple[OutputFirewall, dict]:
    return OutputFirewall("sanitize"), {}


@pytest.mark.parametrize("widget", list(MEDIA))
@pytest.mark.parametrize("doc", list(DOCUMENTS), ids=list(DOCUMENTS))
@pytest.mark.parametrize("fmt", ["svg+xml", "png", "html"])
def test_creation_with_document_bytes_is_dropped_with_notice(widget, doc, fmt):
    fw = OutputFirewall("sanitize")
    held, notices = _send(fw, "comm_open", "w", _state(widget, format=fmt, value=DOCUMENTS[doc]))
    assert held is not None and _safe(widget, held) == []
    assert held["value"] == b""
    assert len(notices) == 1 and notices[0].startswith("sandbox-kernel: removed ")


@pytest.mark.parametrize("widget", list(MEDIA))
def test_json_string_value_is_judged_like_bytes(widget):
    fw = OutputFirewall("sanitize")
    held, notices = _send(fw, "comm_open", "w", _state(widget, format="svg+xml", value=SVG.decode()))
    assert held["value"] == b"" and _safe(widget, held) == [] and notices


@pytest.mark.parametrize("widget,fmt,data", RASTER, ids=[f"{w}-{f}" for w, f, _ in RASTER])
def test_real_media_pass_unchanged(widget, fmt, data):
    fw = OutputFirewall("sanitize")
    state = _state(widget, format=fmt, value=data, width="", height="")
    held, notices = _send(fw, "comm_open", "w", state)
    assert held == state and notices == []
    again, notices = _reload(fw, {"w": state})
    assert again["w"] == state and notices == []


@pytest.mark.parametrize("fmt", SCRIPTABLE_FORMATS)
def test_lying_format_with_real_png_is_forced_to_png(fmt):
    fw = OutputFirewall("sanitize")
    held, _ = _send(fw, "comm_open", "w", _state("Image", format=fmt, value=PNG))
    assert held["format"] == "png" and held["value"] == PNG


@pytest.mark.parametrize("widget", list(MEDIA))
def test_update_format_then_value(widget):
    fw = OutputFirewall("sanitize")
    _, fmt = MEDIA[widget]
    good = {"Image": PNG, "Video": MP4, "Audio": MP3}[widget]
    held, _ = _send(fw, "comm_open", "w", _state(widget, format=fmt, value=good))
    browser = dict(held)
    upd, _ = _send(fw, "comm_msg", "w", {"format": "svg+xml"})
    browser.update(upd)
    assert _safe(widget, browser) == [] and browser["value"] == good
    upd, notices = _send(fw, "comm_msg", "w", {"value": SVG})
    browser.update(upd)
    assert _safe(widget, browser) == [] and browser["value"] == b"" and notices
    states, _ = _reload(fw, {"w": {**_state(widget), "format": "svg+xml", "value": SVG}})
    assert _safe(widget, states["w"]) == []


@pytest.mark.parametrize("widget", list(MEDIA))
def test_update_value_then_format(widget):
    fw = OutputFirewall("sanitize")
    _, fmt = MEDIA[widget]
    held, _ = _send(fw, "comm_open", "w", _state(widget, format=fmt, value=b""))
    browser = dict(held)
    for upd_state in ({"value": SVG}, {"format": "svg+xml"}, {"value": DOCUMENTS["html"], "format": "html"}):
        upd, _ = _send(fw, "comm_msg", "w", upd_state)
        browser.update(upd)
        assert _safe(widget, browser) == [], upd_state


def test_format_url_then_back_keeps_nothing_loadable():
    fw = OutputFirewall("sanitize")
    held, _ = _send(fw, "comm_open", "w", _state("Image", format="url", value=b"http://127.0.0.1:9/x"))
    browser = dict(held)
    assert browser["value"] == b""
    upd, _ = _send(fw, "comm_msg", "w", {"format": "svg+xml"})
    browser.update(upd)
    assert _safe("Image", browser) == []


def test_request_states_reply_judges_every_media_widget():
    fw = OutputFirewall("sanitize")
    for mid, widget in (("i", "Image"), ("v", "Video"), ("a", "Audio")):
        _send(fw, "comm_open", mid, _state(widget, format=MEDIA[widget][1], value=b""))
    states, notices = _reload(fw, {"i": _state("Image", format="svg+xml", value=SVG),
                                   "v": _state("Video", format="mp4", value=DOCUMENTS["html"]),
                                   "a": _state("Audio", format="mp3", value=MP3)})
    assert _safe("Image", states["i"]) == [] and states["i"]["value"] == b""
    assert _safe("Video", states["v"]) == [] and states["v"]["value"] == b""
    assert states["a"]["value"] == MP3 and states["a"]["format"] == "mp3"
    assert len(notices) == 1


def test_unknown_widget_reload_as_image_model_is_judged():
    """A reload entry names its model: an ImageModel the kernel never opened is judged as one."""
    fw = OutputFirewall("sanitize")
    states, _ = _reload(fw, {"n": _state("Image", format="svg+xml", value=SVG)})
    assert _safe("Image", states["n"]) == []


def test_link_cannot_write_media_fields():
    """jslink copies values in the browser: it may not write an Image's format or value."""
    fw = OutputFirewall("sanitize")
    _send(fw, "comm_open", "img", _state("Image", format="png", value=PNG))
    text = {"_model_module": CONTROLS, "_model_name": "TextModel", "_view_module": CONTROLS,
            "_view_name": "TextView", "value": SVG.decode()}
    _send(fw, "comm_open", "t", text)
    for attr in ("value", "format"):
        link = {"_model_module": CONTROLS, "_model_name": "DirectionalLinkModel", "_view_module": None,
                "_view_name": None, "source": ["IPY_MODEL_t", "value"], "target": ["IPY_MODEL_img", attr]}
        held, notices = _send(fw, "comm_open", f"l-{attr}", link)
        assert held is None and notices


def test_trust_policy_relays_media_as_produced():
    fw = OutputFirewall("trust")
    state = _state("Image", format="svg+xml", value=SVG)
    held, notices = _send(fw, "comm_open", "w", state)
    assert held == state and notices == []


@pytest.mark.parametrize("mime", ["image/png", "image/jpeg", "image/gif", "image/webp"])
def test_display_data_rasters_pass(mime):
    """display_data images are shown from ``data:`` URLs (an opaque origin), not blobs."""
    import base64
    fw = OutputFirewall("sanitize")
    content = {"data": {mime: base64.b64encode(PNG).decode(), "text/plain": "x"}, "metadata": {}}
    assert fw.filter("display_data", content) == (content, [])


@pytest.mark.parametrize("mime", ["application/pdf", "image/svg", "text/xml", "application/xhtml+xml",
                                  "image/bmp", "video/mp4", "audio/mpeg"])
def test_display_data_object_url_types_are_removed(mime):
    """No MIME type JupyterLab would show through an object URL reaches it."""
    fw = OutputFirewall("sanitize")
    out, notices = fw.filter("display_data", {"data": {mime: "PHN2Zz4=", "text/plain": "x"}, "metadata": {}})
    assert mime not in out["data"] and notices


def test_sniff_signatures():
    assert [sniff(b) for b in (PNG, JPEG, GIF, WEBP, MP4, WEBM, MP3, WAV)] == \
        ["png", "jpeg", "gif", "webp", "mp4", "webm", "mp3", "wav"]
    for doc in DOCUMENTS.values():
        assert sniff(doc) is None


def test_widget_swapped_to_an_image_model_has_its_value_judged():
    """A state that renames a Text widget's model to ImageModel re-sends ``value``: judged as media."""
    fw = OutputFirewall("sanitize")
    text = {"_model_module": CONTROLS, "_model_name": "TextModel", "_view_module": CONTROLS,
            "_view_name": "TextView", "value": SVG.decode()}
    _send(fw, "comm_open", "t", text)
    states, _ = _reload(fw, {"t": {**text, "_model_name": "ImageModel", "_view_name": "ImageView",
                                   "format": "svg+xml"}})
    if "t" in states:
        assert _safe("Image", states["t"]) == []
    upd, _ = _send(fw, "comm_msg", "t", {"_model_name": "ImageModel", "_view_name": "ImageView"})
    if upd is not None and "value" in upd:
        assert upd["value"] in (b"", "") or sniff(bytes(upd["value"]))
