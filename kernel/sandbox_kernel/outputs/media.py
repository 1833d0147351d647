"""Media bytes from the sandbox that the browser turns into a same-origin URL.

ipywidgets 8's ``ImageView``, ``VideoView`` and ``AudioView``
(``packages/controls/src/widget_image.ts``, ``widget_video.ts``,
``widget_audio.ts``) draw ``value`` as ``URL.createObjectURL(new Blob([value],
{type: `image/${format}`}))`` (``video/``, ``audio/`` for the others).  A
``blob:`` URL has the page's origin: opened in a new tab ("Open image in new
tab"), a blob whose type is a document type (``image/svg+xml``, ``text/html``,
XML...) runs its script *as JupyterLab*, which can drive the Jupyter server.

So the firewall judges the pair by what the bytes *are*, never by the name
the widget gives: the bytes are sniffed (:func:`sniff`) and must be a raster
image, video or audio type the view's element plays; ``format`` is then
forced to that type's name, so the blob's type always agrees with the bytes
and is never a document type.  Anything else (SVG, HTML, XML, unknown bytes,
a value that is not bytes) is dropped with a notice.  SVG is not kept even
sanitised: as an ``image/svg+xml`` blob it would be a document at the Jupyter
origin, and a rasterising step is not the firewall's job (``display_data``'s
``image/svg+xml`` is shown from a ``data:`` URL, an opaque origin).
"""

from __future__ import annotations

from typing import Any

#: Model name -> (the blob's type prefix, the widget's default ``format``).
MEDIA_KIND = {"ImageModel": ("image", "png"), "VideoModel": ("video", "mp4"), "AudioModel": ("audio", "mp3")}

#: What each element may show: sniffed type -> the ``format`` names kept as given (the
#: first is sent when the widget names another).
ALLOWED: dict[str, dict[str, tuple[str, ...]]] = {
    "image": {"png": ("png",), "jpeg": ("jpeg", "jpg"), "gif": ("gif",), "webp": ("webp",), "bmp": ("bmp",),
              "ico": ("x-icon", "vnd.microsoft.icon"), "avif": ("avif",)},
    "video": {"mp4": ("mp4",), "webm": ("webm",), "ogg": ("ogg",)},
    "audio": {"mp3": ("mp3", "mpeg"), "wav": ("wav", "x-wav", "wave"), "flac": ("flac", "x-flac"),
              "ogg": ("ogg",), "mp4": ("mp4", "x-m4a"), "webm": ("webm",)},
}


def sniff(data: bytes) -> str | None:
    """The media type of ``data`` by its leading bytes, or None if it is none of ours.

    Parameters
    ----------
    data : bytes
        The value's bytes.

    Returns
    -------
    str or None
        One of ``png``, ``jpeg``, ``gif``, ``webp``, ``bmp``, ``ico``, ``avif``,
        ``mp4``, ``webm``, ``ogg``, ``mp3``, ``wav``, ``flac``; None for
        anything else, documents (SVG, HTML, XML) included.  Signatures as in
        the WHATWG MIME Sniffing standard, sections 6.1 (images) and 6.2
        (audio and video).
    """
    head = bytes(data[:32])
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return "png"
    if head.startswith(b"\xff\xd8\xff"):
        return "jpeg"
    if head.startswith((b"GIF87a", b"GIF89a")):
        return "gif"
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "webp"
    if head[:4] == b"RIFF" and head[8:12] == b"WAVE":
        return "wav"
    if head.startswith(b"BM") and len(head) >= 14:
        return "bmp"
    if head.startswith(b"\x00\x00\x01\x00"):
        return "ico"
    if head[4:8] == b"ftyp":
        return "avif" if head[8:12] in (b"avif", b"avis") else "mp4"
    if head.startswith(b"\x1a\x45\xdf\xa3"):
        return "webm"
    if head.startswith(b"OggS\x00"):
        return "ogg"
    if head.startswith(b"fLaC"):
        return "flac"
    if head.startswith(b"ID3") or _mpeg_frame(head):
        return "mp3"
    return None


def _mpeg_frame(head: bytes) -> bool:
    """An MPEG audio frame header: sync, a valid version, layer, bitrate and sample rate
    (so a UTF-16 BOM, ``FF FE``, followed by text is not one)."""
    if len(head) < 4 or head[0] != 0xFF or head[1] & 0xE0 != 0xE0:
        return False
    version, layer = (head[1] >> 3) & 3, (head[1] >> 1) & 3
    bitrate, rate = head[2] >> 4, (head[2] >> 2) & 3
    return version != 1 and layer != 0 and bitrate not in (0, 15) and rate != 3


def judge_media(model_name: str, fmt: Any, value: Any) -> tuple[Any, Any, list[str]]:
    """The ``format`` and ``value`` a media widget may send, judged by the bytes.

    Called by :meth:`sandbox_kernel.outputs.widgets.WidgetRegistry.apply`
    whenever a state from the sandbox sets either field (creation, update,
    ``update_states`` after a reload), with the pair as the browser would
    then hold it.

    Parameters
    ----------
    model_name : str
        ``ImageModel``, ``VideoModel`` or ``AudioModel``.
    fmt : object
        The ``format`` the widget names.
    value : object
        Its ``value``: bytes (a comm buffer), or anything else a state may carry.

    Returns
    -------
    (object, object, list of str)
        The format and value to send, and what was removed in words.  With
        ``format='url'`` both pass (the address itself is emptied by the
        widget filter); otherwise ``value`` is bytes of an allowed type and
        ``format`` that type's name, or ``b""`` with the element's default
        format.
    """
    element, default = MEDIA_KIND[model_name]
    if fmt == "url":
        return fmt, value, []
    if isinstance(value, str):
        value = value.encode("utf-8", "surrogatepass")  # Blob([string]) is the text's UTF-8
    if not isinstance(value, (bytes, bytearray, memoryview)):
        return default, b"", ([] if value is None else [f"{element} data that is not bytes"])
    value = bytes(value)
    if not value:
        return default, b"", []
    kind = sniff(value)
    if kind is None or kind not in ALLOWED[element]:
        return default, b"", [f"{element} bytes that are not a raster {element} type (SVG, HTML, XML or unknown: "
                              "opened in a new tab they could run as this page)"]
    names = ALLOWED[element][kind]
    return (fmt if fmt in names else names[0]), value, []
