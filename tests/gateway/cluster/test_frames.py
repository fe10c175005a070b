"""The cluster wire format: frames split anywhere, messages round-trip."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.cluster import frames as F
from protocols.context import Message
from protocols.mqtt.packets import Properties

topics = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00+#"),
                 min_size=1, max_size=40)


@given(
    topic=topics,
    payload=st.binary(max_size=300),
    qos=st.integers(0, 2),
    retain=st.booleans(),
    publisher=st.text(max_size=20).filter(lambda s: "\x00" not in s),
    username=st.none() | st.text(max_size=20),
    expires=st.none() | st.floats(0, 2e9),
    seq=st.integers(0, 2**63),
    user_props=st.lists(st.tuples(st.text(max_size=5), st.text(max_size=5)), max_size=3),
)
def test_message_round_trip(topic, payload, qos, retain, publisher, username, expires, seq,
                            user_props) -> None:
    props = Properties(content_type="text/plain", user_properties=tuple(user_props))
    m = Message(topic, payload, qos, retain, props, publisher, username, 12.5, expires)
    frame = F.encode_batch([F.record(seq, F.encode_message(m))])
    [(kind, body)] = F.FrameReader().feed(frame)
    assert kind == F.DATA
    [fwd] = F.decode_batch(body)
    got = fwd.message
    assert fwd.seq == seq
    assert (got.topic, got.payload, got.qos, got.retain, got.publisher, got.username,
            got.timestamp, got.expires_at) == (topic, payload, qos, retain, publisher,
                                               username, 12.5, expires)
    assert got.properties.content_type == "text/plain"
    assert got.properties.user_properties == tuple(user_props)


@given(st.lists(st.integers(1, 50), min_size=1, max_size=10))
def test_frames_split_anywhere(cuts) -> None:
    stream = b"".join(F.control(F.PING, {"t": i}) for i in range(5))
    stream += F.encode_batch([F.record(1, F.encode_message(Message("a/b", b"x" * 100)))])
    reader = F.FrameReader()
    got = []
    pos = 0
    for cut in cuts * 100:
        if pos >= len(stream):
            break
        got.extend(reader.feed(stream[pos:pos + cut]))
        pos += cut
    got.extend(reader.feed(stream[pos:]))
    assert [k for k, _ in got] == [F.PING] * 5 + [F.DATA]
    assert [F.parse_control(b)["t"] for _, b in got[:5]] == list(range(5))


def test_oversized_and_malformed_frames_are_refused() -> None:
    with pytest.raises(F.FrameError):
        F.FrameReader(max_frame=10).feed(F.frame(F.DATA, b"x" * 20))
    with pytest.raises(F.FrameError):
        F.decode_batch(b"\x00\x00\x00\x05garbage")
    with pytest.raises(F.FrameError):
        F.parse_control(b"[1, 2]")
