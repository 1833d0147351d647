"""The agent's half of the wire: framing constants and JSON helpers (the host's half is
``sandbox_kernel/protocol.py``, which describes the frames).

Runs in the agent process only.
"""

from __future__ import annotations

import base64
import json

#: Bytes of already-sent frames kept for replay after a detach.
REPLAY_BUFFER_BYTES = 64 * 1024 * 1024
#: Frames queued in one loop pass are written together; a pass that drains a flood
#: of messages writes every this many bytes.
WRITE_BATCH_BYTES = 256 * 1024
#: ZMQ's delimiter between routing identities and a Jupyter message.
DELIM = b"<IDS|MSG>"


def json_default(obj):
    """``json.dumps``' ``default``: datetimes as ISO 8601, bytes as base64."""
    if hasattr(obj, "isoformat"):
        return obj.isoformat()
    if isinstance(obj, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(obj)).decode("ascii")
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def ascii_json(part: bytes) -> bytes:
    """A JSON object from the inner kernel as ASCII JSON on one line: ``part`` itself
    when it already is (the usual case), else decoded and re-encoded."""
    if part.isascii() and part[:1] == b"{" and b"\n" not in part and b"\r" not in part:
        return part
    obj = json.loads(part.decode("utf-8", "replace"))
    if not isinstance(obj, dict):
        raise ValueError("a message part is not a JSON object")
    return json.dumps(obj, ensure_ascii=True, separators=(",", ":"),
                      default=json_default).encode("ascii")
