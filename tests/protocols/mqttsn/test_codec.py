"""The MQTT-SN codec: round trips (hypothesis), vectors written by hand from the
specification, every kind of malformed datagram, and the role table."""

from __future__ import annotations

import pytest
from hypothesis import given

from protocols.mqttsn.codec import (
    Codec,
    LocalProtocolError,
    RemoteProtocolError,
    Role,
    decode,
    encode,
)
from protocols.mqttsn.packets import (
    PREDEFINED,
    SHORT,
    Advertise,
    ConnAck,
    Connect,
    Disconnect,
    Encapsulated,
    GwInfo,
    Packet,
    PingReq,
    Publish,
    RegAck,
    Register,
    SearchGw,
    SubAck,
    Subscribe,
    WillTopic,
    WillTopicUpd,
)
from tests.protocols.mqttsn.strategies import packets


@given(packets)
def test_round_trip(p: Packet) -> None:
    raw = encode(p)
    assert decode(raw) == p
    if not isinstance(p, Encapsulated):
        length = int.from_bytes(raw[1:3], "big") if raw[0] == 1 else raw[0]
        assert length == len(raw)


VECTORS: list[tuple[Packet, bytes]] = [
    (Advertise(1, 900), bytes([5, 0x00, 1, 0x03, 0x84])),
    (SearchGw(0), bytes([3, 0x01, 0])),
    (GwInfo(1), bytes([3, 0x02, 1])),
    # CONNECT: flags CleanSession (0x04), protocol id 1, duration 60, "abc"
    (Connect("abc", 60), bytes([9, 0x04, 0x04, 0x01, 0, 60]) + b"abc"),
    (Connect("w", 10, clean_session=False, will=True), bytes([7, 0x04, 0x08, 1, 0, 10]) + b"w"),
    (ConnAck(0), bytes([3, 0x05, 0])),
    (WillTopic("t", qos=1, retain=True), bytes([4, 0x07, 0x30]) + b"t"),
    (WillTopic(), bytes([2, 0x07])),
    (Register(0, 1, "a/b"), bytes([9, 0x0A, 0, 0, 0, 1]) + b"a/b"),
    (RegAck(1025, 1, 0), bytes([7, 0x0B, 0x04, 0x01, 0, 1, 0])),
    # PUBLISH QoS 1, normal id 1025, msg id 7, "hi"
    (Publish(1025, b"hi", 1, 7), bytes([9, 0x0C, 0x20, 0x04, 0x01, 0, 7]) + b"hi"),
    # PUBLISH QoS -1, predefined id 1, retain
    (Publish(1, b"", -1, 0, True, False, PREDEFINED), bytes([7, 0x0C, 0x71, 0, 1, 0, 0])),
    (Publish("ab", b"x", 0, 0, False, True, SHORT), bytes([8, 0x0C, 0x82]) + b"ab\x00\x00x"),
    (Subscribe(2, "a/#", 1), bytes([8, 0x12, 0x20, 0, 2]) + b"a/#"),
    (Subscribe(3, 5, 2, topic_id_type=PREDEFINED), bytes([7, 0x12, 0x41, 0, 3, 0, 5])),
    (SubAck(2, 0, 1, 0), bytes([8, 0x13, 0x20, 0, 0, 0, 2, 0])),
    (PingReq("c"), bytes([3, 0x16]) + b"c"),
    (PingReq(), bytes([2, 0x16])),
    (Disconnect(), bytes([2, 0x18])),
    (Disconnect(60), bytes([4, 0x18, 0, 60])),
    (WillTopicUpd(), bytes([2, 0x1A])),
    (Encapsulated(1, b"\x0a\x0b", bytes([2, 0x16])), bytes([5, 0xFE, 1, 0x0A, 0x0B, 2, 0x16])),
]


@pytest.mark.parametrize(("packet", "raw"), VECTORS)
def test_known_vectors(packet: Packet, raw: bytes) -> None:
    assert encode(packet) == raw
    assert decode(raw) == packet


def test_three_byte_length() -> None:
    p = Publish(1, b"x" * 300, 0, 0)
    raw = encode(p)
    assert raw[0] == 0x01 and int.from_bytes(raw[1:3], "big") == len(raw) == 309
    assert decode(raw) == p


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        (b"", "shorter"),
        (b"\x05", "shorter"),
        (b"\x00\x16", "length 0"),
        (b"\x03\x16", "length field"),  # says 3, is 2
        (b"\x02\x03", "unknown message type"),
        (b"\x01\x00\x05\x16", "three-byte"),  # long header for a short message
        (b"\x01\x01", "cut short"),
        (bytes([6, 0x0C, 0x00, 0, 1, 0]), "at least"),  # PUBLISH without msg id
        (bytes([7, 0x0C, 0x03, 0, 1, 0, 0]), "reserved topic id type"),
        (bytes([3, 0x05, 0, 0][:3]) + b"\x00", "length field"),
        (bytes([4, 0x0A, 0, 1]), "at least"),
        (bytes([6, 0x0A, 0, 1, 0, 1]) + b"", "at least"),
        (bytes([7, 0x0A, 0, 1, 0, 1, 0xFF]), "UTF-8"),
        (bytes([6, 0x12, 0x02, 0, 1, 0x61]), "short topic"),  # one byte of short name
        (bytes([3, 0x18, 0]), "DISCONNECT"),
        (bytes([3, 0x07, 0x20]), "no topic"),
        (bytes([2, 0x00]), "ADVERTISE"),
        (bytes([2, 0xFE]), "ENCAPSULATED"),
        (bytes([3, 0xFE, 0]), "without a message"),
    ],
)
def test_malformed(raw: bytes, why: str) -> None:
    with pytest.raises(RemoteProtocolError, match=why):
        decode(raw)


def test_local_errors() -> None:
    with pytest.raises(LocalProtocolError):
        encode(Publish("abc", b"", topic_id_type=SHORT))
    with pytest.raises(LocalProtocolError):
        encode(Publish(70000, b""))
    with pytest.raises(LocalProtocolError):
        encode(Publish(1, b"", qos=3))
    with pytest.raises(LocalProtocolError):
        encode(Subscribe(1, 5))  # NORMAL subscribe carries a name
    with pytest.raises(LocalProtocolError):
        encode(Publish(1, b"x" * 70000))


def test_roles() -> None:
    gw, cl = Codec(Role.GATEWAY), Codec(Role.CLIENT)
    sub = Subscribe(1, "a")
    with pytest.raises(LocalProtocolError):
        gw.encode(sub)
    assert gw.decode(cl.encode(sub)) == sub
    with pytest.raises(RemoteProtocolError, match="gateway does not send"):
        cl.decode(encode(sub))
    with pytest.raises(RemoteProtocolError, match="client does not send"):
        gw.decode(encode(ConnAck(0)))
    # broadcasts meant for others are received by both roles
    assert gw.decode(encode(Advertise(2, 60))) == Advertise(2, 60)
    assert cl.decode(encode(GwInfo(2))) == GwInfo(2)
