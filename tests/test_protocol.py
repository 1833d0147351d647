"""The host-side parser of sandbox bytes: hostile input is dropped, never fatal."""

import json

from hypothesis import given, settings
from hypothesis import strategies as st
from sandbox_kernel import protocol


def _frame(seq=1, **kw):
    base = {"seq": seq, "op": "msg", "channel": "iopub",
            "msg": {"header": {"msg_type": "stream", "msg_id": "a"}, "parent_header": {"msg_id": "p"},
                    "metadata": {}, "content": {"name": "stdout", "text": "café☕"}},
            "buffers": []}
    base.update(kw)
    return protocol.encode_frame(base)


def test_frames_are_ascii_lines():
    data = _frame()
    assert data.endswith(b"\n") and data.count(b"\n") == 1
    data.decode("ascii")


def test_any_chunking_gives_the_same_frames():
    stream = b"".join(_frame(i) for i in range(1, 30))
    for size in (1, 2, 7, 64, 1000):
        dec = protocol.FrameDecoder()
        got = [f for i in range(0, len(stream), size) for f in dec.feed(stream[i:i + size])]
        assert [f["seq"] for f in got] == list(range(1, 30))
        assert got[0]["msg"]["content"]["text"] == "café☕"


def test_replacement_decoding_of_ascii_frames_is_harmless():
    """E2B decodes stdout chunks as UTF-8 with replacement; ASCII frames survive."""
    stream = _frame(1) + _frame(2)
    chunks = [stream[:17], stream[17:]]
    dec = protocol.FrameDecoder()
    frames = [f for c in chunks for f in dec.feed(c.decode("utf-8", "replace").encode())]
    assert [f["seq"] for f in frames] == [1, 2]


def test_oversized_frame_is_dropped_and_the_next_one_kept():
    drops: list[str] = []
    dec = protocol.FrameDecoder(max_frame_bytes=1000, on_drop=drops.append)
    huge = b'{"seq":1,' + b"x" * 5000
    frames = list(dec.feed(huge[:3000])) + list(dec.feed(huge[3000:] + b"\n" + _frame(2)))
    assert [f["seq"] for f in frames] == [2]
    assert drops == ["frame over 1000 bytes"]


def test_garbage_lines_are_dropped():
    drops: list[str] = []
    dec = protocol.FrameDecoder(on_drop=drops.append)
    frames = list(dec.feed(b"not json\n[1,2]\n\x00\xff\xfe\n" + _frame(5)))
    assert [f["seq"] for f in frames] == [5]
    assert len(drops) == 3, drops


def test_schema_violations_raise_protocol_error():
    bad = [
        {"seq": 0, "op": "msg"},
        {"seq": True, "op": "ready"},
        {"seq": 1, "op": "exec"},
        {"seq": 1, "op": "msg", "channel": "hb", "msg": {}},
        {"seq": 1, "op": "msg", "channel": "iopub", "msg": {"header": []}},
        {"seq": 1, "op": "msg", "channel": "iopub", "msg": {"header": {"msg_type": 5}}},
        {"seq": 1, "op": "msg", "channel": "iopub", "msg": {"header": {"msg_type": "x" * 5000}}},
        {"seq": 1, "op": "msg", "channel": "iopub", "msg": {"header": {"msg_type": "s"}, "content": []}},
        {"seq": 1, "op": "msg", "channel": "iopub", "msg": {"header": {"msg_type": "s"}}, "buffers": ["!!"]},
    ]
    for obj in bad:
        try:
            protocol.validate_agent_frame(obj)
        except protocol.ProtocolError:
            continue
        raise AssertionError(f"accepted {obj}")


def test_buffers_round_trip():
    f = protocol.validate_agent_frame(json.loads(_frame(buffers=protocol.b64encode_buffers([b"\x00\x01"]))))
    assert f.buffers == [b"\x00\x01"] and f.msg_type == "stream" and f.parent_msg_id == "p"


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=300), max_size=20))
def test_fuzz_decoder_never_raises(chunks):
    dec = protocol.FrameDecoder(max_frame_bytes=512)
    for c in chunks:
        for obj in dec.feed(c):
            try:
                protocol.validate_agent_frame(obj)
            except protocol.ProtocolError:
                pass


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(["seq", "op", "channel", "msg", "buffers", "x"]), json_values))
def test_fuzz_validator_only_raises_protocol_error(obj):
    try:
        protocol.validate_agent_frame(obj)
    except protocol.ProtocolError:
        pass
