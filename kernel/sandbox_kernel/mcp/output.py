"""What the MCP server returns for a cell: a transcript capped for a model's context, images, a summary.

Pure (no I/O, no SDK): :func:`transcript` turns an
:class:`~sandbox_kernel.client.Execution` into one text, :func:`cap` cuts the
middle out of a long one with a ``[... N bytes cut ...]`` marker (the full
text stays with the handle, readable by ``get_result(offset=...)``),
:func:`summary` is the structured part of the tool result.
"""

from __future__ import annotations

import base64
from typing import Any

from ..client.execution import Execution

#: Default cap on the text of one tool result, bytes (UTF-8).
MAX_OUTPUT_BYTES = 20_000

#: Images returned per tool result, at most (more are named in the text only).
MAX_IMAGES = 8

#: Largest image returned as MCP image content, bytes (decoded).
MAX_IMAGE_BYTES = 4 * 1024 * 1024

_IMAGE_TYPES = ("image/png", "image/jpeg")


def transcript(ex: Execution) -> str:
    """The cell's outputs as one text, in this order: stdout, stderr, each result, the error.

    Rich results show their ``text/plain``; images are named (``<image/png: 12345 bytes>``)
    and returned as image content beside the text.

    >>> from sandbox_kernel.client import Execution, ExecutionError
    >>> transcript(Execution(stdout="42\\n", error=ExecutionError("E", "v", ["E: v"])))
    '42\\n[error] E: v\\nE: v\\n'
    """
    parts = [ex.stdout]
    if ex.stderr:
        parts.append(f"[stderr]\n{ex.stderr}")
    for r in ex.results:
        images = [f"<{m}: {len(r.png or b'') if m == 'image/png' else len(r.jpeg or b'')} bytes>"
                  for m in _IMAGE_TYPES if m in r.data]
        text = r.text if r.text is not None and not images else ""
        if not text and not images:
            text = f"<{', '.join(r.formats)}>"
        parts.append(" ".join(filter(None, [*images, text])) + "\n")
    if ex.error is not None:
        parts.append(f"[error] {ex.error.ename}: {ex.error.evalue}\n")
        if ex.error.traceback:
            parts.append("\n".join(ex.error.traceback) + "\n")
    out = ""
    for p in parts:
        if p:
            out += p if not out or out.endswith("\n") else "\n" + p
    return out


def cap(text: str, max_bytes: int = MAX_OUTPUT_BYTES, handle: str | None = None) -> tuple[str, int]:
    """``text`` cut to about ``max_bytes`` (UTF-8): its head and tail kept, the middle replaced
    by a ``[... N bytes cut ...]`` marker.  Returns the text and N (0 if nothing was cut).

    >>> cap("a" * 10 + "b" * 10, 10)
    ('aaaaa\\n[... 10 bytes cut ...]\\nbbbbb', 10)
    >>> cap("short", 10)
    ('short', 0)
    """
    data = text.encode()
    if len(data) <= max_bytes:
        return text, 0
    head, tail = max_bytes // 2, max_bytes - max_bytes // 2
    cut = len(data) - head - tail
    where = f"; get_result(handle={handle!r}, offset={head}) reads from there" if handle else ""
    marker = f"\n[... {cut} bytes cut{where} ...]\n"
    return (data[:head].decode(errors="ignore") + marker + data[len(data) - tail:].decode(errors="ignore"),
            cut)


def window(text: str, offset: int, max_bytes: int) -> tuple[str, int | None]:
    """``max_bytes`` of ``text`` (UTF-8) from byte ``offset``; returns them and the next
    offset (None at the end).

    >>> window("abcdef", 2, 3)
    ('cde', 5)
    >>> window("abcdef", 4, 3)
    ('ef', None)
    """
    data = text.encode()
    chunk = data[max(0, offset):max(0, offset) + max_bytes]
    end = max(0, offset) + len(chunk)
    return chunk.decode(errors="ignore"), (end if end < len(data) else None)


def images(ex: Execution) -> list[tuple[str, str]]:
    """``(mime type, base64 data)`` of the cell's images, at most :data:`MAX_IMAGES`, each at
    most :data:`MAX_IMAGE_BYTES` decoded."""
    found: list[tuple[str, str]] = []
    for r in ex.results:
        for mime in _IMAGE_TYPES:
            raw = r.png if mime == "image/png" else r.jpeg
            if raw and len(raw) <= MAX_IMAGE_BYTES and len(found) < MAX_IMAGES:
                found.append((mime, base64.b64encode(raw).decode()))
    return found


def summary(ex: Execution, handle: str, cut_bytes: int) -> dict[str, Any]:
    """The structured part of a tool result: status, handle, counts, error fields.

    ``status`` is ``"running"`` (ask ``wait``/``get_result`` with ``handle``),
    ``"ok"`` or ``"error"``; ``output_bytes`` is the full transcript's size.
    """
    status = "running" if not ex.done else ("ok" if ex.error is None else "error")
    out: dict[str, Any] = {
        "status": status, "handle": handle, "execution_count": ex.execution_count,
        "duration_s": round(ex.duration_s, 3) if ex.done else None,
        "output_bytes": len(transcript(ex).encode()), "cut_bytes": cut_bytes,
        "results": [{"formats": r.formats, "main": r.is_main_result} for r in ex.results],
        "error": None,
    }
    if ex.error is not None:
        out["error"] = {"ename": ex.error.ename, "evalue": ex.error.evalue, "traceback": ex.error.traceback,
                        "timed_out": ex.error.timed_out}
    return out
