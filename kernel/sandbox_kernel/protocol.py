"""Framing between the host proxy and the in-sandbox agent.  Pure: no I/O.

This is the only module that parses bytes coming from a sandbox, and it treats
them as hostile.

Wire format
-----------
One frame is one line: a JSON object encoded with ``ensure_ascii=True`` and
terminated by ``\\n``.  ASCII-only lines survive transports that decode bytes as
UTF-8 with replacement and split them at arbitrary points (E2B's command
stdout), and ``\\n`` re-splits them.  Binary message buffers travel as base64.

Host to agent (``op``): ``msg`` (a Jupyter message for the inner kernel's
``shell``, ``control`` or ``stdin`` channel), ``interrupt``, ``ack``,
``replay``, ``restart``, ``ping``, ``shutdown``, ``file`` (one of
:data:`FILE_ACTIONS`, never through the inner kernel), ``reseed`` (to a sandbox
restored from a start template, before any request: the interpreter redraws its
entropy-drawn state and the agent warms its completer again; a ``ping`` after it
is answered once both are done).

Agent to host: every frame carries ``seq``, a counter that increases by one per
frame, so the host can acknowledge, deduplicate and ask for a ``replay`` after
a detach.  ``op`` is ``msg`` (a message from the inner kernel, with
``channel`` one of ``iopub``, ``shell``, ``stdin``, ``control``), ``ready``
(the inner kernel answers; carries its ``kernel_info_reply`` content and the
channel ``guard`` in force), ``died`` (the inner kernel ended; carries
``returncode`` and a stderr tail), ``log``, ``pong`` (the answer to ``ping``)
or ``replayed`` (the end of a ``replay``), ``file`` (the answer to a host's
``file`` op: ``id``, ``ok``, then ``result`` or ``ename`` and ``error``) and
``file_data`` (one chunk of a download: ``id``, ``offset``, base64 ``data``);
see :mod:`sandbox_kernel.files`.

Numbers are strict: the host accepts frame ``n + 1`` after frame ``n`` and
nothing else, except while a replay is under way (repeats, and frames the agent
wrote before it read the request, which the replay sends again in turn); any other number,
any line that is not a valid frame, a reply for no request and a second reply
for one request mean the channel is corrupted, and the host replaces the
sandbox with a notice (:class:`sandbox_kernel.relay.Relay`).

Jupyter messages keep the shape of the messaging spec ("General message
format"): ``header``, ``parent_header``, ``metadata``, ``content``.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("sandbox_kernel.protocol")

#: Channels an agent may send messages on.
AGENT_CHANNELS = frozenset({"iopub", "shell", "stdin", "control"})
#: Channels the host may address in the inner kernel.
HOST_CHANNELS = frozenset({"shell", "control", "stdin"})
AGENT_OPS = frozenset({"msg", "ready", "died", "log", "pong", "replayed", "file", "file_data"})
#: Host ops of the file transfer (``op: "file"``, field ``action``), answered by the agent's
#: ``file`` frame (and ``file_data`` frames for ``get``).
FILE_ACTIONS = frozenset({"stat", "list", "remove", "mkdir", "get", "put_open", "put_data",
                          "put_close", "put_abort"})
#: Longest error text accepted in a ``file`` frame, characters.
MAX_FILE_ERROR = 2048

#: Longest string field accepted in a header, characters.
MAX_HEADER_STR = 1024


class ProtocolError(ValueError):
    """A frame from the sandbox is malformed (the relay treats it as a corrupted channel)."""


class ChannelCorrupted(ProtocolError):
    """Frames from the sandbox broke the channel's rules (see :class:`FrameSequence`)."""


def encode_frame(obj: dict[str, Any]) -> bytes:
    """Serialise one frame.

    Parameters
    ----------
    obj : dict
        JSON-serialisable frame.

    Returns
    -------
    bytes
        ASCII JSON followed by ``b"\\n"``.
    """
    return json.dumps(obj, ensure_ascii=True, separators=(",", ":"), allow_nan=False).encode("ascii") + b"\n"


def b64encode_buffers(buffers: list[bytes] | None) -> list[str]:
    """Encode binary message buffers for a frame."""
    return [base64.b64encode(bytes(b)).decode("ascii") for b in buffers or ()]


@dataclass
class FrameDecoder:
    """Re-split a byte stream into frames, whatever the chunking.

    A line longer than ``max_frame_bytes`` is discarded up to its newline, and so
    are lines that are not JSON objects; each drop is logged and reported to
    ``on_drop`` (the channel decides whether it is fatal).

    Parameters
    ----------
    max_frame_bytes : int
        Largest accepted line, bytes.
    on_drop : callable, optional
        Called with a one-line reason for every dropped line.
    """

    max_frame_bytes: int = 64 * 1024 * 1024
    on_drop: Callable[[str], None] | None = None
    _buf: bytearray = field(default_factory=bytearray)
    _skipping: bool = False

    def feed(self, data: bytes) -> Iterator[dict[str, Any]]:
        """Consume ``data``; yield each complete, well-formed frame (a dict).

        Never raises on bad input: malformed lines are logged and dropped.
        """
        start = 0
        while True:
            nl = data.find(b"\n", start)
            if nl < 0:
                break
            piece = data[start:nl]
            start = nl + 1
            if self._skipping:
                self._skipping = False
                self._buf.clear()
                continue
            if len(self._buf) + len(piece) > self.max_frame_bytes:
                self._drop(f"frame over {self.max_frame_bytes} bytes")
                self._buf.clear()
                continue
            if self._buf:
                self._buf += piece
                line = bytes(self._buf)
                self._buf.clear()
            else:
                line = piece
            frame = self._parse(line)
            if frame is not None:
                yield frame
        rest = data[start:]
        if rest and not self._skipping:
            if len(self._buf) + len(rest) > self.max_frame_bytes:
                self._drop(f"frame over {self.max_frame_bytes} bytes")
                self._buf.clear()
                self._skipping = True
            else:
                self._buf += rest

    def _drop(self, why: str) -> None:
        log.warning("dropped a frame from the sandbox: %s", why)
        if self.on_drop is not None:
            self.on_drop(why)

    def _parse(self, line: bytes) -> dict[str, Any] | None:
        if not line.strip():
            return None
        try:
            obj = json.loads(line)
        except (ValueError, RecursionError) as err:
            self._drop(f"not JSON ({type(err).__name__}: {str(err)[:80]})")
            return None
        if not isinstance(obj, dict):
            self._drop("not a JSON object")
            return None
        return obj


@dataclass(frozen=True)
class AgentFrame:
    """A validated frame from the agent.

    Attributes
    ----------
    seq : int
        Sequence number (>= 1).
    op : str
        One of :data:`AGENT_OPS`.
    channel : str or None
        For ``msg``: one of :data:`AGENT_CHANNELS`.
    msg : dict or None
        For ``msg``: ``header``, ``parent_header``, ``metadata``, ``content``.
    buffers : list of bytes
        Decoded binary buffers.
    body : dict
        The raw frame, for ``ready``/``died``/``log`` fields.
    """

    seq: int
    op: str
    channel: str | None = None
    msg: dict[str, Any] | None = None
    buffers: list[bytes] = field(default_factory=list)
    body: dict[str, Any] = field(default_factory=dict)

    @property
    def msg_type(self) -> str | None:
        return self.msg["header"]["msg_type"] if self.msg else None

    @property
    def content(self) -> dict[str, Any]:
        """The message's ``content`` (empty for a frame that carries no message)."""
        return self.msg["content"] if self.msg else {}

    @property
    def metadata(self) -> dict[str, Any]:
        """The message's ``metadata`` (empty for a frame that carries no message)."""
        return self.msg["metadata"] if self.msg else {}

    @property
    def parent_msg_id(self) -> str | None:
        if not self.msg:
            return None
        pid = self.msg["parent_header"].get("msg_id")
        return pid if isinstance(pid, str) else None


@dataclass
class FrameSequence:
    """The host's rule for frame numbers: ``n + 1`` after ``n``, and nothing else,
    except while a replay the host asked for is under way.

    During a replay (:meth:`begin_replay` until the agent's ``replayed``
    frame for it, :meth:`end_replay`) two kinds of frame out of turn are dropped:
    frames already seen, which the replay sends again, and frames ahead of the
    one due, which the agent wrote to the new stream before it read the
    ``replay`` request (a cell still running through a cut connection); they
    are in its replay buffer, so the replay sends them again in turn.  The
    replay's own ``replayed`` frame must arrive in turn: ahead, frames were
    lost.  A new agent (a sandbox restored from a snapshot) may number from 1.

    Attributes
    ----------
    last : int
        Number of the last frame admitted (0: none yet).
    replaying : bool
    replay_after : int
        The ``after`` of the last ``replay`` asked for (the agent's ``replayed``
        frame repeats it).
    rebase : bool
        A sandbox restored from a snapshot of a kernel that ran (a rewind): its agent
        goes on numbering where it was when the snapshot was taken (and may have had
        frames in flight then), so the first frame's number, whatever it is, becomes
        the base; from it on, ``n + 1`` as always.
    """

    last: int = 0
    replaying: bool = False
    replay_after: int = 0
    rebase: bool = False

    def reset(self, rebase: bool = False) -> None:
        """A new sandbox: numbering starts again at 1, or (``rebase``: restored from a
        snapshot) at whatever number its first frame has."""
        self.last, self.replaying, self.replay_after, self.rebase = 0, False, 0, rebase

    def begin_replay(self) -> int:
        """Expect repeats from now on; return the number to replay after."""
        self.replaying, self.replay_after = True, self.last
        return self.last

    def end_replay(self) -> None:
        self.replaying = False

    def ends_replay(self, op: str, after: object) -> bool:
        """Whether a frame ``op`` (with its field ``after``) is the end of the replay
        under way: ``replayed`` for the last ``replay`` asked for, not a repeat of an
        earlier one's."""
        return self.replaying and op == "replayed" and after == self.replay_after

    def admit(self, seq: int, ends_replay: bool = False) -> bool:
        """Decide on frame number ``seq``.

        Parameters
        ----------
        seq : int
            The frame's number.
        ends_replay : bool
            The frame is the end of the replay under way (:meth:`ends_replay`).

        Returns
        -------
        bool
            True: handle the frame.  False: during a replay, a frame the replay
            sends (again) in turn; drop it.

        Raises
        ------
        ChannelCorrupted
            For any other number: frames were lost, repeated or forged.
        """
        if self.rebase:  # the first frame of an agent restored from a snapshot
            self.rebase, self.last = False, seq
            return True
        due = self.last + 1
        if seq == due or (self.replaying and seq == 1 and self.last > 0):
            self.last = seq
            return True
        if self.replaying and (seq < due or not ends_replay):
            return False
        raise ChannelCorrupted(f"frame {seq} arrived when {due} was due "
                               + ("(a repeated or forged frame)" if seq < due else "(frames lost or forged)"))


def _check_str(v: Any, what: str) -> str:
    if not isinstance(v, str) or len(v) > MAX_HEADER_STR:
        raise ProtocolError(f"{what} must be a string of at most {MAX_HEADER_STR} chars")
    return v


def validate_agent_frame(obj: dict[str, Any]) -> AgentFrame:
    """Check a decoded frame's schema.

    Parameters
    ----------
    obj : dict
        Output of :meth:`FrameDecoder.feed`.

    Returns
    -------
    AgentFrame

    Raises
    ------
    ProtocolError
        When a field is missing or of the wrong type.
    """
    seq = obj.get("seq")
    if not isinstance(seq, int) or isinstance(seq, bool) or seq < 1:
        raise ProtocolError("seq must be a positive integer")
    op = obj.get("op")
    if not isinstance(op, str) or op not in AGENT_OPS:
        raise ProtocolError(f"unknown op {str(op)[:40]!r}")
    if op in ("file", "file_data"):
        return _validate_file_frame(seq, op, obj)
    if op != "msg":
        return AgentFrame(seq=seq, op=op, body=obj)
    channel = obj.get("channel")
    if not isinstance(channel, str) or channel not in AGENT_CHANNELS:
        raise ProtocolError(f"unknown channel {str(channel)[:40]!r}")
    msg = obj.get("msg")
    if not isinstance(msg, dict):
        raise ProtocolError("msg must be an object")
    header = msg.get("header")
    if not isinstance(header, dict):
        raise ProtocolError("header must be an object")
    _check_str(header.get("msg_type"), "header.msg_type")
    parent = msg.get("parent_header", {})
    if not isinstance(parent, dict):
        raise ProtocolError("parent_header must be an object")
    if "msg_id" in parent:
        _check_str(parent["msg_id"], "parent_header.msg_id")
    content = msg.get("content", {})
    metadata = msg.get("metadata", {})
    if not isinstance(content, dict) or not isinstance(metadata, dict):
        raise ProtocolError("content and metadata must be objects")
    raw_buffers = obj.get("buffers", [])
    if not isinstance(raw_buffers, list) or not all(isinstance(b, str) for b in raw_buffers):
        raise ProtocolError("buffers must be a list of base64 strings")
    try:
        buffers = [base64.b64decode(b, validate=True) for b in raw_buffers]
    except (binascii.Error, ValueError) as err:
        raise ProtocolError(f"bad base64 buffer: {err}") from err
    clean = {"header": header, "parent_header": parent, "metadata": metadata, "content": content}
    return AgentFrame(seq=seq, op=op, channel=channel, msg=clean, buffers=buffers, body=obj)


def _validate_file_frame(seq: int, op: str, obj: dict[str, Any]) -> AgentFrame:
    """Check a ``file`` or ``file_data`` frame; a ``file_data`` chunk's bytes become
    :attr:`AgentFrame.buffers` ``[data]``.  Whether the sizes and checksums add up is
    the transfer's business (:mod:`sandbox_kernel.files`)."""
    _check_str(obj.get("id"), "file id")
    if op == "file_data":
        offset, data = obj.get("offset"), obj.get("data")
        if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
            raise ProtocolError("file_data offset must be a non-negative integer")
        if not isinstance(data, str):
            raise ProtocolError("file_data data must be a base64 string")
        try:
            chunk = base64.b64decode(data, validate=True)
        except (binascii.Error, ValueError) as err:
            raise ProtocolError(f"bad base64 file data: {err}") from err
        body = {"id": obj["id"], "offset": offset}
        return AgentFrame(seq=seq, op=op, buffers=[chunk], body=body)
    ok = obj.get("ok")
    if not isinstance(ok, bool):
        raise ProtocolError("file ok must be a boolean")
    if ok:
        result = obj.get("result")
        if not isinstance(result, dict):
            raise ProtocolError("file result must be an object")
        return AgentFrame(seq=seq, op=op, body={"id": obj["id"], "ok": True, "result": result})
    ename, error = obj.get("ename"), obj.get("error")
    if not isinstance(ename, str) or not ename.isidentifier() or len(ename) > 64:
        raise ProtocolError("file ename must be an identifier")
    if not isinstance(error, str) or len(error) > MAX_FILE_ERROR:
        raise ProtocolError(f"file error must be a string of at most {MAX_FILE_ERROR} chars")
    return AgentFrame(seq=seq, op=op, body={"id": obj["id"], "ok": False, "ename": ename, "error": error})


def host_msg_frame(channel: str, msg: dict[str, Any], buffers: list[bytes] | None = None) -> bytes:
    """Frame a Jupyter message for the inner kernel.

    Parameters
    ----------
    channel : {"shell", "control", "stdin"}
    msg : dict
        ``header``, ``parent_header``, ``metadata``, ``content``; ``datetime``
        values in headers must already be ISO 8601 strings.
    buffers : list of bytes, optional
    """
    if channel not in HOST_CHANNELS:
        raise ValueError(f"channel {channel!r} is not one of {sorted(HOST_CHANNELS)}")
    return encode_frame({"op": "msg", "channel": channel, "msg": msg, "buffers": b64encode_buffers(buffers)})


def host_op_frame(op: str, **fields: Any) -> bytes:
    """Frame a control operation for the agent (``interrupt``, ``ack``, ``replay``...)."""
    return encode_frame({"op": op, **fields})
