"""The MQTT codec: round trips, known byte vectors, every violation, encoder refusals."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocols.mqtt.codec import (
    decode,
    encode,
    encode_publish,
    encode_publish_with_id,
    publish_packet_id_offset,
    read_fixed_header,
)
from protocols.mqtt.connection import Connection, Role
from protocols.mqtt.errors import (
    LocalProtocolError,
    RemoteProtocolError,
    Violation,
)
from protocols.mqtt.packets import (
    MQTT_3_1,
    MQTT_3_1_1,
    MQTT_5,
    NO_PROPERTIES,
    Auth,
    ConnAck,
    Connect,
    Disconnect,
    Packet,
    PingReq,
    PingResp,
    Properties,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    SubAck,
    Subscribe,
    Subscription,
    UnsubAck,
    Unsubscribe,
    Will,
)
from protocols.mqtt.reason_codes import ReasonCode
from tests.protocols.mqtt.helpers import (
    connect_packet,
    decode_whole,
    drain,
    pkt,
    props,
    s,
    server_after_connect,
)
from tests.protocols.mqtt.strategies import packets

LEVELS = [MQTT_3_1, MQTT_3_1_1, MQTT_5]

# -- round trips -----------------------------------------------------------------------


@pytest.mark.parametrize("level", LEVELS)
@settings(max_examples=250)
@given(data=st.data())
def test_round_trip_every_packet_type(level: int, data: st.DataObject) -> None:
    packet, from_client = data.draw(packets(level))
    raw = encode(packet, level)
    assert decode_whole(raw, level, from_client=from_client) == packet


@pytest.mark.parametrize("level", LEVELS)
@given(data=st.data())
def test_decode_from_a_memoryview_keeps_no_reference(level: int, data: st.DataObject) -> None:
    packet, from_client = data.draw(packets(level))
    raw = encode(packet, level)
    header = read_fixed_header(raw, 0, len(raw))
    assert header is not None
    buffer = bytearray(raw)
    body = memoryview(buffer)[header[2] :]
    decoded = decode(header[0], body, level, from_client=from_client)
    body.release()
    buffer.clear()  # raises BufferError if the packet still referenced the buffer
    assert decoded == packet


# -- known vectors ---------------------------------------------------------------------

# Captured from paho-mqtt 2.2.0 (client id "paho-test", keepalive 30).
PAHO_311 = (
    b"\x102\x00\x04MQTT\x04\xee\x00\x1e\x00\tpaho-test\x00\nwill/topic\x00\x03bye"
    b"\x00\x04user\x00\x04pass"
)
PAHO_5 = (
    b"\x10H\x00\x04MQTT\x05\xce\x00\x1e\x0f\x11\x00\x00\x0e\x10!\x00\x14&\x00\x01k\x00\x01v"
    b"\x00\tpaho-test\x05\x18\x00\x00\x00\x05\x00\nwill/topic\x00\x03bye\x00\x04user\x00\x04pass"
)
PAHO_31 = b"\x10\x17\x00\x06MQIsdp\x03\x02\x00\x1e\x00\tpaho-test"

KNOWN: list[tuple[str, int, bool, bytes, Packet]] = [
    (
        "paho 3.1.1 CONNECT",
        MQTT_3_1_1,
        True,
        PAHO_311,
        Connect(
            "paho-test",
            MQTT_3_1_1,
            True,
            30,
            "user",
            b"pass",
            Will("will/topic", b"bye", 1, True),
        ),
    ),
    (
        "paho 5.0 CONNECT",
        MQTT_5,
        True,
        PAHO_5,
        Connect(
            "paho-test",
            MQTT_5,
            True,
            30,
            "user",
            b"pass",
            Will("will/topic", b"bye", 1, False, Properties(will_delay_interval=5)),
            Properties(
                session_expiry_interval=3600, receive_maximum=20, user_properties=(("k", "v"),)
            ),
        ),
    ),
    ("paho 3.1 CONNECT", MQTT_3_1, True, PAHO_31, Connect("paho-test", MQTT_3_1, True, 30)),
    # MQTT 5.0 section 3.1.2.11 example variable header (flags 0xC2, keepalive 10,
    # session expiry 10) with client id "c", user "u", password "p".
    (
        "spec 5.0 CONNECT",
        MQTT_5,
        True,
        pkt(
            0x10, s("MQTT") + b"\x05\xc2\x00\x0a\x05\x11\x00\x00\x00\x0a" + s("c") + s("u") + s("p")
        ),
        Connect("c", MQTT_5, True, 10, "u", b"p", None, Properties(session_expiry_interval=10)),
    ),
    ("PINGREQ", MQTT_3_1_1, True, b"\xc0\x00", PingReq()),
    ("PINGRESP", MQTT_3_1_1, False, b"\xd0\x00", PingResp()),
    ("DISCONNECT 3.1.1", MQTT_3_1_1, True, b"\xe0\x00", Disconnect()),
    ("DISCONNECT 5.0 normal", MQTT_5, True, b"\xe0\x00", Disconnect()),
    ("DISCONNECT 5.0 with will", MQTT_5, True, b"\xe0\x01\x04", Disconnect(4)),
    ("CONNACK 3.1.1", MQTT_3_1_1, False, b"\x20\x02\x01\x00", ConnAck(True, 0)),
    ("CONNACK 3.1.1 refused", MQTT_3_1_1, False, b"\x20\x02\x00\x05", ConnAck(False, 5)),
    ("CONNACK 5.0", MQTT_5, False, b"\x20\x03\x00\x00\x00", ConnAck()),
    (
        "CONNACK 5.0 with properties",
        MQTT_5,
        False,
        b"\x20\x08\x00\x00\x05\x22\x00\x0a\x24\x01",
        ConnAck(False, 0, Properties(topic_alias_maximum=10, maximum_qos=1)),
    ),
    ("PUBLISH QoS 0", MQTT_3_1_1, True, b"\x30\x07\x00\x03a/bhi", Publish("a/b", b"hi")),
    (
        "PUBLISH QoS 1 retain dup",
        MQTT_3_1_1,
        True,
        b"\x3b\x09\x00\x03a/b\x00\x0ahi",
        Publish("a/b", b"hi", 1, True, True, 10),
    ),
    (
        "PUBLISH 5.0 QoS 2 with alias",
        MQTT_5,
        False,
        pkt(0x34, s("t") + b"\x00\x07" + props(b"\x23\x00\x02", b"\x0b\x05") + b"x"),
        Publish(
            "t", b"x", 2, False, False, 7, Properties(subscription_identifiers=(5,), topic_alias=2)
        ),
    ),
    (
        "PUBLISH 5.0 empty topic with alias",
        MQTT_5,
        True,
        b"\x30\x06\x00\x00\x03\x23\x00\x02",
        Publish("", b"", properties=Properties(topic_alias=2)),
    ),
    ("PUBACK 3.1.1", MQTT_3_1_1, True, b"\x40\x02\x00\x01", PubAck(1)),
    ("PUBACK 5.0 short", MQTT_5, True, b"\x40\x02\x00\x01", PubAck(1)),
    ("PUBACK 5.0 with code", MQTT_5, True, b"\x40\x03\x00\x01\x10", PubAck(1, 0x10)),
    ("PUBACK 5.0 empty props", MQTT_5, True, b"\x40\x04\x00\x01\x10\x00", PubAck(1, 0x10)),
    ("PUBREC", MQTT_3_1_1, False, b"\x50\x02\x00\x02", PubRec(2)),
    ("PUBREL", MQTT_3_1_1, True, b"\x62\x02\x00\x02", PubRel(2)),
    ("PUBREL 3.1 with DUP", MQTT_3_1, True, b"\x6a\x02\x00\x02", PubRel(2)),
    ("PUBCOMP 5.0 not found", MQTT_5, False, b"\x70\x03\x00\x02\x92", PubComp(2, 0x92)),
    (
        "SUBSCRIBE 3.1.1",
        MQTT_3_1_1,
        True,
        b"\x82\x0e\x00\x01\x00\x03a/b\x01\x00\x03c/#\x02",
        Subscribe(1, (Subscription("a/b", 1), Subscription("c/#", 2))),
    ),
    (
        "SUBSCRIBE 5.0 options",
        MQTT_5,
        True,
        pkt(0x82, b"\x00\x01" + props(b"\x0b\x07") + s("a") + b"\x2e"),
        Subscribe(
            1, (Subscription("a", 2, True, True, 2),), Properties(subscription_identifiers=(7,))
        ),
    ),
    ("SUBACK 3.1.1", MQTT_3_1_1, False, b"\x90\x04\x00\x01\x01\x80", SubAck(1, (1, 0x80))),
    ("SUBACK 5.0", MQTT_5, False, b"\x90\x05\x00\x01\x00\x02\x8f", SubAck(1, (2, 0x8F))),
    ("UNSUBSCRIBE", MQTT_3_1_1, True, pkt(0xA2, b"\x00\x05" + s("a/+")), Unsubscribe(5, ("a/+",))),
    ("UNSUBACK 3.1.1", MQTT_3_1_1, False, b"\xb0\x02\x00\x05", UnsubAck(5)),
    ("UNSUBACK 5.0", MQTT_5, False, b"\xb0\x04\x00\x05\x00\x11", UnsubAck(5, (0x11,))),
    ("AUTH empty", MQTT_5, True, b"\xf0\x00", Auth()),
    (
        "AUTH continue",
        MQTT_5,
        False,
        pkt(0xF0, b"\x18" + props(b"\x15" + s("SCRAM"), b"\x16" + s(b"\x01"))),
        Auth(0x18, Properties(authentication_method="SCRAM", authentication_data=b"\x01")),
    ),
]


@pytest.mark.parametrize(
    ("name", "level", "from_client", "raw", "packet"), KNOWN, ids=[k[0] for k in KNOWN]
)
def test_known_vectors_decode(
    name: str, level: int, from_client: bool, raw: bytes, packet: Packet
) -> None:
    assert decode_whole(raw, level, from_client=from_client) == packet


CANONICAL = {"paho 3.1.1 CONNECT", "paho 5.0 CONNECT", "paho 3.1 CONNECT", "PINGREQ"}
CANONICAL |= {"CONNACK 3.1.1", "CONNACK 5.0", "PUBLISH QoS 0", "PUBLISH QoS 1 retain dup"}
CANONICAL |= {"PUBACK 5.0 short", "PUBACK 5.0 with code", "SUBSCRIBE 3.1.1", "AUTH empty"}
CANONICAL |= {"SUBSCRIBE 5.0 options", "UNSUBACK 5.0", "DISCONNECT 5.0 with will"}


@pytest.mark.parametrize(
    ("name", "level", "from_client", "raw", "packet"),
    [k for k in KNOWN if k[0] in CANONICAL],
    ids=[k[0] for k in KNOWN if k[0] in CANONICAL],
)
def test_known_vectors_encode(
    name: str, level: int, from_client: bool, raw: bytes, packet: Packet
) -> None:
    assert encode(packet, level) == raw


def test_empty_packets_have_fixed_bytes() -> None:
    for level in LEVELS:
        assert encode(PingReq(), level) == b"\xc0\x00"
        assert encode(PingResp(), level) == b"\xd0\x00"
        assert encode(Disconnect(), level) == b"\xe0\x00"


def test_long_publish_uses_a_multi_byte_length() -> None:
    packet = Publish("t", b"x" * 200)
    raw = encode(packet, MQTT_3_1_1)
    assert raw[:3] == b"\x30\xcb\x01"  # 203 = 0x4B + 1 * 128
    assert decode_whole(raw, MQTT_3_1_1, from_client=True) == packet


def test_password_without_user_name_is_fine_in_5() -> None:
    raw = connect_packet(5, flags=0x42, tail=s("c") + s(b"secret"))
    packet = decode_whole(raw, MQTT_5, from_client=True)
    assert packet == Connect("c", MQTT_5, password=b"secret")
    assert encode(packet, MQTT_5) == raw


def test_empty_client_id_is_left_to_the_channel() -> None:
    raw = connect_packet(4, flags=0x00, tail=s(""))
    assert decode_whole(raw, MQTT_3_1_1, from_client=True) == Connect("", clean_start=False)


# -- 3.x drops what 3.x cannot carry ---------------------------------------------------

V5_PROPS = Properties(reason_string="why", user_properties=(("a", "b"),))


@pytest.mark.parametrize("level", [MQTT_3_1, MQTT_3_1_1])
@pytest.mark.parametrize(
    ("packet", "from_client", "expected"),
    [
        (PubAck(3, 0x10, V5_PROPS), False, PubAck(3)),
        (PubRec(3, 0x80), False, PubRec(3)),
        (PubRel(3, 0x92), True, PubRel(3)),
        (PubComp(3, 0x92, V5_PROPS), False, PubComp(3)),
        (Disconnect(0x04, V5_PROPS), True, Disconnect()),
        (UnsubAck(3, (0x00, 0x11)), False, UnsubAck(3)),
        (SubAck(3, (0, 0x87, 0xA2, 2)), False, SubAck(3, (0, 0x80, 0x80, 2))),
        (ConnAck(False, ReasonCode.BANNED), False, ConnAck(False, 5)),
        (ConnAck(False, ReasonCode.UNSUPPORTED_PROTOCOL_VERSION), False, ConnAck(False, 1)),
        (ConnAck(False, 0x9F), False, ConnAck(False, 3)),
        (
            Publish("t", b"p", 1, packet_id=9, properties=Properties(message_expiry_interval=5)),
            True,
            Publish("t", b"p", 1, packet_id=9),
        ),
        (
            Subscribe(4, (Subscription("a", 1, True, True, 2),), V5_PROPS),
            True,
            Subscribe(4, (Subscription("a", 1),)),
        ),
    ],
)
def test_v3_drops_v5_only_fields(
    level: int, packet: Packet, from_client: bool, expected: Packet
) -> None:
    assert decode_whole(encode(packet, level), level, from_client=from_client) == expected


# -- the encoder refuses what it cannot say --------------------------------------------


@pytest.mark.parametrize(
    ("packet", "level"),
    [
        (Publish("t", qos=1, packet_id=0), MQTT_3_1_1),
        (Publish("t", qos=1), MQTT_3_1_1),
        (Publish("t", qos=0, packet_id=1), MQTT_3_1_1),
        (Publish("t", qos=0, dup=True), MQTT_3_1_1),
        (Publish("t", qos=3, packet_id=1), MQTT_3_1_1),
        (Publish("a/+"), MQTT_3_1_1),
        (Publish("a/#"), MQTT_5),
        (Publish(""), MQTT_3_1_1),
        (Publish(""), MQTT_5),
        (Publish("", properties=Properties(topic_alias=1)), MQTT_3_1_1),
        (Publish("a\x00b"), MQTT_3_1_1),
        (Publish("\ud800"), MQTT_3_1_1),
        (Publish("x" * 65536), MQTT_3_1_1),
        (Publish("t", properties=Properties(session_expiry_interval=1)), MQTT_5),
        (Publish("t", properties=Properties(topic_alias=0)), MQTT_5),
        (Publish("t", properties=Properties(payload_format_indicator=2)), MQTT_5),
        (Publish("t", properties=Properties(response_topic="a/#")), MQTT_5),
        (Publish("t", properties=Properties(message_expiry_interval=2**32)), MQTT_5),
        (Publish("t", properties=Properties(correlation_data=b"x" * 65536)), MQTT_5),
        (PubAck(0), MQTT_3_1_1),
        (PubAck(70000), MQTT_5),
        (PubAck(1, 0x92), MQTT_5),
        (PubRel(1, 0x10), MQTT_5),
        (UnsubAck(1, (0x80,)), MQTT_3_1_1),
        (UnsubAck(1, ()), MQTT_5),
        (SubAck(1, ()), MQTT_3_1_1),
        (SubAck(1, (3,)), MQTT_3_1_1),
        (SubAck(1, (0x10,)), MQTT_5),
        (Subscribe(1, ()), MQTT_3_1_1),
        (Subscribe(1, (Subscription("a/#/b"),)), MQTT_3_1_1),
        (Subscribe(1, (Subscription("a", qos=3),)), MQTT_3_1_1),
        (Subscribe(1, (Subscription("a", retain_handling=3),)), MQTT_5),
        (Subscribe(1, (Subscription("$share/g/a", no_local=True),)), MQTT_5),
        (
            Subscribe(1, (Subscription("a"),), Properties(subscription_identifiers=(1, 2))),
            MQTT_5,
        ),
        (Subscribe(1, (Subscription("a"),), Properties(subscription_identifiers=(0,))), MQTT_5),
        (Unsubscribe(1, ()), MQTT_5),
        (Unsubscribe(1, ("",)), MQTT_5),
        (ConnAck(True, 0x80), MQTT_5),
        (ConnAck(False, 0x04), MQTT_5),
        (ConnAck(False, 0x10), MQTT_3_1_1),
        (ConnAck(False, 0, Properties(topic_alias=1)), MQTT_5),
        (ConnAck(False, 0, Properties(authentication_data=b"x")), MQTT_5),
        (Connect("c", MQTT_5), MQTT_3_1_1),
        (Connect("c", MQTT_3_1_1, password=b"p"), MQTT_3_1_1),
        (Connect("c", MQTT_3_1_1, keepalive=70000), MQTT_3_1_1),
        (Connect("c", MQTT_3_1_1, will=Will("a/+", b"")), MQTT_3_1_1),
        (Connect("c", MQTT_3_1_1, will=Will("a", b"", qos=3)), MQTT_3_1_1),
        (Connect("c", MQTT_5, properties=Properties(receive_maximum=0)), MQTT_5),
        (Connect("c", MQTT_5, will=Will("a", b"", properties=Properties(topic_alias=1))), MQTT_5),
        (Disconnect(0x01), MQTT_5),
        (Auth(), MQTT_3_1_1),
        (Auth(0x80), MQTT_5),
        (PingReq(), 6),
        (Publish("t"), 2),
    ],
    ids=repr,
)
def test_encode_refuses(packet: Packet, level: int) -> None:
    with pytest.raises(LocalProtocolError):
        encode(packet, level)


def test_encode_refuses_non_packets() -> None:
    with pytest.raises(LocalProtocolError):
        encode(NO_PROPERTIES, MQTT_5)  # type: ignore[arg-type]


# -- shared PUBLISH bytes --------------------------------------------------------------


@pytest.mark.parametrize("level", LEVELS)
@given(
    topic=st.text(
        st.characters(exclude_categories=["Cs"], exclude_characters="\x00+#"), min_size=1
    ),
    payload=st.binary(max_size=300),
    qos=st.integers(1, 2),
    packet_id=st.integers(1, 0xFFFF),
    dup=st.booleans(),
)
def test_publish_packet_id_patching(
    level: int, topic: str, payload: bytes, qos: int, packet_id: int, dup: bool
) -> None:
    props = Properties(user_properties=(("k", "v"),)) if level == MQTT_5 else NO_PROPERTIES
    template = encode(Publish(topic, payload, qos, packet_id=1, properties=props), level)
    offset = publish_packet_id_offset(template)
    patched = encode_publish_with_id(template, offset, packet_id, dup=dup)
    expected = Publish(topic, payload, qos, False, dup, packet_id, props)
    assert patched == encode(expected, level)


@pytest.mark.parametrize("level", LEVELS)
@given(
    topic=st.text(
        st.characters(exclude_categories=["Cs"], exclude_characters="\x00+#"), min_size=1
    ),
    payload=st.binary(max_size=300),
    qos=st.integers(0, 2),
    retain=st.booleans(),
    dup=st.booleans(),
    packet_id=st.integers(1, 0xFFFF),
    user=st.booleans(),
)
def test_encode_publish_is_encode_of_the_packet(
    level: int,
    topic: str,
    payload: bytes,
    qos: int,
    retain: bool,
    dup: bool,
    packet_id: int,
    user: bool,
) -> None:
    props = Properties(user_properties=(("k", "v"),)) if user else NO_PROPERTIES
    props = props if level == MQTT_5 else NO_PROPERTIES
    dup = dup and qos > 0
    pid = packet_id if qos else None
    expected = encode(Publish(topic, payload, qos, retain, dup, pid, props), level)
    assert encode_publish(topic, payload, qos, retain, dup, pid, props, level) == expected


def test_encode_publish_refuses_what_encode_refuses() -> None:
    with pytest.raises(LocalProtocolError):
        encode_publish("a/+", b"", 0, False, False, None, NO_PROPERTIES, MQTT_3_1_1)
    with pytest.raises(LocalProtocolError):
        encode_publish("a", b"", 1, False, False, None, NO_PROPERTIES, MQTT_3_1_1)
    with pytest.raises(LocalProtocolError):
        encode_publish("a", b"", 0, False, True, None, NO_PROPERTIES, MQTT_3_1_1)


def test_publish_packet_id_offset_refuses_qos0_and_others() -> None:
    with pytest.raises(LocalProtocolError):
        publish_packet_id_offset(encode(Publish("t"), MQTT_5))
    with pytest.raises(LocalProtocolError):
        publish_packet_id_offset(b"\xc0\x00")
    with pytest.raises(LocalProtocolError):
        encode_publish_with_id(encode(Publish("t", qos=1, packet_id=1), MQTT_5), 5, 0)


# -- every violation -------------------------------------------------------------------

S3, S4, S5 = (Role.SERVER, 3), (Role.SERVER, 4), (Role.SERVER, 5)
C3, C4, C5 = (Role.CLIENT, 3), (Role.CLIENT, 4), (Role.CLIENT, 5)
NEW = (Role.SERVER, None)  # a fresh server: the bytes start with the CONNECT

V = Violation
_SUB4 = b"\x00\x01"
_SUB5 = b"\x00\x01\x00"

VIOLATIONS: list[tuple[str, tuple[Role, int | None], bytes, Violation]] = [
    ("remaining length of 5 bytes", S4, b"\x30\xff\xff\xff\xff\x01", V.MALFORMED_REMAINING_LENGTH),
    (
        "property length of 5 bytes",
        S5,
        pkt(0x30, s("a") + b"\xff\xff\xff\xff\x01"),
        V.MALFORMED_VARIABLE_INTEGER,
    ),
    (
        "subscription id of 5 bytes",
        S5,
        pkt(0x82, b"\x00\x01\x06\x0b\xff\xff\xff\xff\x01"),
        V.MALFORMED_VARIABLE_INTEGER,
    ),
    ("PUBREL flags 0", S4, pkt(0x60, b"\x00\x01"), V.RESERVED_FLAGS),
    ("PUBREL flags 0b1010 in 3.1.1", S4, pkt(0x6A, b"\x00\x01"), V.RESERVED_FLAGS),
    ("SUBSCRIBE flags 0", S4, pkt(0x80, _SUB4 + s("a") + b"\x00"), V.RESERVED_FLAGS),
    ("UNSUBSCRIBE flags 0", S5, pkt(0xA0, _SUB5 + s("a")), V.RESERVED_FLAGS),
    ("PINGREQ flags 1", S4, b"\xc1\x00", V.RESERVED_FLAGS),
    ("PUBACK flags 2", C4, b"\x42\x02\x00\x01", V.RESERVED_FLAGS),
    ("DUP on QoS 0", S4, pkt(0x38, s("a")), V.RESERVED_FLAGS),
    ("CONNECT flags 1", NEW, b"\x11" + connect_packet(4)[1:], V.RESERVED_FLAGS),
    ("type 0", S4, b"\x00\x00", V.UNKNOWN_PACKET_TYPE),
    ("AUTH in 3.1.1", S4, b"\xf0\x00", V.UNKNOWN_PACKET_TYPE),
    ("AUTH in 3.1 to a client", C3, b"\xf0\x00", V.UNKNOWN_PACKET_TYPE),
    ("short topic", S4, pkt(0x30, b"\x00\x05ab"), V.TRUNCATED),
    ("no topic length", S4, pkt(0x30, b"\x00"), V.TRUNCATED),
    ("no packet id", S4, pkt(0x32, s("a") + b"\x00"), V.TRUNCATED),
    ("short PUBACK", S4, pkt(0x40, b"\x00"), V.TRUNCATED),
    ("property past its section", S5, pkt(0x30, s("a") + b"\x02\x02\x00\x00\x00\x01"), V.TRUNCATED),
    ("section past the packet", S5, pkt(0x30, s("a") + b"\x05\x01\x00"), V.TRUNCATED),
    ("no subscription options", S4, pkt(0x82, _SUB4 + s("a")), V.TRUNCATED),
    ("CONNACK of one byte", C4, b"\x20\x01\x00", V.TRUNCATED),
    ("SUBACK without codes", C4, b"\x90\x02\x00\x01", V.TRUNCATED),
    ("UNSUBACK 5.0 without codes", C5, b"\xb0\x03\x00\x01\x00", V.TRUNCATED),
    ("CONNECT without keep alive", NEW, pkt(0x10, s("MQTT") + b"\x04\x02"), V.TRUNCATED),
    ("CONNECT without level", NEW, pkt(0x10, s("MQTT")), V.TRUNCATED),
    (
        "CONNECT without password",
        NEW,
        connect_packet(4, flags=0xC2, tail=s("c") + s("u")),
        V.TRUNCATED,
    ),
    ("CONNECT short will", NEW, connect_packet(4, flags=0x06, tail=s("c") + s("w")), V.TRUNCATED),
    ("PUBACK 3.1.1 of 3 bytes", S4, pkt(0x40, b"\x00\x01\x00"), V.TRAILING_BYTES),
    ("UNSUBACK 3.1.1 of 3 bytes", C4, pkt(0xB0, b"\x00\x01\x00"), V.TRAILING_BYTES),
    ("PINGREQ with a body", S4, pkt(0xC0, b"\x00"), V.TRAILING_BYTES),
    ("DISCONNECT 3.1.1 with a body", S4, pkt(0xE0, b"\x00"), V.TRAILING_BYTES),
    ("PUBACK 5.0 after properties", S5, pkt(0x40, b"\x00\x01\x00\x00\x00"), V.TRAILING_BYTES),
    ("CONNECT with extra bytes", NEW, connect_packet(4, tail=s("c") + b"\x00"), V.TRAILING_BYTES),
    ("CONNACK 3.1.1 of 3 bytes", C4, b"\x20\x03\x00\x00\x00", V.TRAILING_BYTES),
    ("topic 0xFF", S4, pkt(0x30, s(b"\xff")), V.INVALID_UTF8),
    ("topic with a surrogate", S4, pkt(0x30, s(b"\xed\xa0\x80")), V.INVALID_UTF8),
    ("topic overlong '/'", S4, pkt(0x30, s(b"\xc0\xaf")), V.INVALID_UTF8),
    ("client id not UTF-8", NEW, connect_packet(4, tail=s(b"\xc3")), V.INVALID_UTF8),
    (
        "user property not UTF-8",
        S5,
        pkt(0x30, s("a") + props(b"\x26" + s(b"\xff") + s("v"))),
        V.INVALID_UTF8,
    ),
    ("filter not UTF-8", S4, pkt(0x82, _SUB4 + s(b"\xe2\x82") + b"\x00"), V.INVALID_UTF8),
    ("topic with U+0000", S4, pkt(0x30, s(b"a\x00")), V.NULL_CHARACTER),
    ("client id with U+0000", NEW, connect_packet(4, tail=s(b"\x00")), V.NULL_CHARACTER),
    ("filter with U+0000", S4, pkt(0xA2, _SUB4 + s(b"a\x00")), V.NULL_CHARACTER),
    ("PUBLISH QoS 3", S4, pkt(0x36, s("a") + b"\x00\x01"), V.INVALID_QOS),
    ("subscription QoS 3", S4, pkt(0x82, _SUB4 + s("a") + b"\x03"), V.INVALID_QOS),
    (
        "will QoS 3",
        NEW,
        connect_packet(4, flags=0x1E, tail=s("c") + s("w") + s("x")),
        V.INVALID_QOS,
    ),
    ("PUBLISH id 0", S4, pkt(0x32, s("a") + b"\x00\x00"), V.PACKET_ID_ZERO),
    ("PUBACK id 0", C4, pkt(0x40, b"\x00\x00"), V.PACKET_ID_ZERO),
    ("PUBACK id 0 to a server", S4, pkt(0x40, b"\x00\x00"), V.PACKET_ID_ZERO),
    ("PUBACK flags", S4, pkt(0x41, b"\x00\x01"), V.RESERVED_FLAGS),
    ("SUBSCRIBE id 0", S4, pkt(0x82, b"\x00\x00" + s("a") + b"\x00"), V.PACKET_ID_ZERO),
    ("UNSUBACK id 0", C5, pkt(0xB0, b"\x00\x00\x00\x00"), V.PACKET_ID_ZERO),
    ("topic with +", S4, pkt(0x30, s("a/+")), V.TOPIC_NAME_INVALID),
    ("topic with #", C5, pkt(0x30, s("#") + b"\x00"), V.TOPIC_NAME_INVALID),
    ("empty topic in 3.1.1", S4, pkt(0x30, s("")), V.TOPIC_NAME_INVALID),
    ("empty topic without alias", S5, pkt(0x30, s("") + b"\x00"), V.TOPIC_NAME_INVALID),
    (
        "will topic with #",
        NEW,
        connect_packet(4, flags=0x06, tail=s("c") + s("w/#") + s("x")),
        V.TOPIC_NAME_INVALID,
    ),
    (
        "response topic with +",
        S5,
        pkt(0x30, s("a") + props(b"\x08" + s("r/+"))),
        V.TOPIC_NAME_INVALID,
    ),
    ("'#' not last", S4, pkt(0x82, _SUB4 + s("a/#/b") + b"\x00"), V.TOPIC_FILTER_INVALID),
    ("'#' inside a level", S4, pkt(0x82, _SUB4 + s("a#") + b"\x00"), V.TOPIC_FILTER_INVALID),
    ("'+' inside a level", S4, pkt(0xA2, _SUB4 + s("a/b+")), V.TOPIC_FILTER_INVALID),
    ("empty filter", S5, pkt(0x82, _SUB5 + s("") + b"\x00"), V.TOPIC_FILTER_INVALID),
    (
        "share without filter",
        S5,
        pkt(0x82, _SUB5 + s("$share/g") + b"\x00"),
        V.TOPIC_FILTER_INVALID,
    ),
    (
        "share with empty group",
        S5,
        pkt(0x82, _SUB5 + s("$share//a") + b"\x00"),
        V.TOPIC_FILTER_INVALID,
    ),
    (
        "share group with +",
        S5,
        pkt(0x82, _SUB5 + s("$share/g+/a") + b"\x00"),
        V.TOPIC_FILTER_INVALID,
    ),
    ("share with empty filter", S5, pkt(0xA2, _SUB5 + s("$share/g/")), V.TOPIC_FILTER_INVALID),
    ("SUBSCRIBE without filters", S4, pkt(0x82, _SUB4), V.EMPTY_SUBSCRIBE),
    ("SUBSCRIBE 5.0 without filters", S5, pkt(0x82, _SUB5), V.EMPTY_SUBSCRIBE),
    ("UNSUBSCRIBE without filters", S4, pkt(0xA2, _SUB4), V.EMPTY_SUBSCRIBE),
    (
        "session expiry in PUBLISH",
        S5,
        pkt(0x30, s("a") + props(b"\x11\x00\x00\x00\x01")),
        V.INVALID_PROPERTY,
    ),
    (
        "subscription id from a client",
        S5,
        pkt(0x30, s("a") + props(b"\x0b\x01")),
        V.INVALID_PROPERTY,
    ),
    (
        "session expiry from a server",
        C5,
        pkt(0xE0, b"\x00" + props(b"\x11\x00\x00\x00\x01")),
        V.INVALID_PROPERTY,
    ),
    (
        "reason string in CONNECT",
        NEW,
        pkt(0x10, s("MQTT") + b"\x05\x02\x00\x3c" + props(b"\x1f" + s("x")) + s("c")),
        V.INVALID_PROPERTY,
    ),
    (
        "topic alias in will",
        NEW,
        pkt(
            0x10,
            s("MQTT") + b"\x05\x06\x00\x3c\x00" + s("c") + props(b"\x23\x00\x01") + s("w") + s("x"),
        ),
        V.INVALID_PROPERTY,
    ),
    (
        "server reference in PUBACK",
        S5,
        pkt(0x40, b"\x00\x01\x00" + props(b"\x1c" + s("x"))),
        V.INVALID_PROPERTY,
    ),
    (
        "two payload format indicators",
        S5,
        pkt(0x30, s("a") + props(b"\x01\x00", b"\x01\x01")),
        V.DUPLICATE_PROPERTY,
    ),
    (
        "two reason strings",
        C5,
        pkt(0x40, b"\x00\x01\x00" + props(b"\x1f" + s("x"), b"\x1f" + s("y"))),
        V.DUPLICATE_PROPERTY,
    ),
    (
        "two subscription ids in SUBSCRIBE",
        S5,
        pkt(0x82, b"\x00\x01" + props(b"\x0b\x01", b"\x0b\x02") + s("a") + b"\x00"),
        V.DUPLICATE_PROPERTY,
    ),
    (
        "receive maximum 0",
        NEW,
        pkt(0x10, s("MQTT") + b"\x05\x02\x00\x3c" + props(b"\x21\x00\x00") + s("c")),
        V.INVALID_PROPERTY_VALUE,
    ),
    (
        "maximum packet size 0",
        NEW,
        pkt(0x10, s("MQTT") + b"\x05\x02\x00\x3c" + props(b"\x27\x00\x00\x00\x00") + s("c")),
        V.INVALID_PROPERTY_VALUE,
    ),
    (
        "request problem information 2",
        NEW,
        pkt(0x10, s("MQTT") + b"\x05\x02\x00\x3c" + props(b"\x17\x02") + s("c")),
        V.INVALID_PROPERTY_VALUE,
    ),
    (
        "authentication data without method",
        NEW,
        pkt(0x10, s("MQTT") + b"\x05\x02\x00\x3c" + props(b"\x16" + s(b"x")) + s("c")),
        V.INVALID_PROPERTY_VALUE,
    ),
    ("topic alias 0", S5, pkt(0x30, s("a") + props(b"\x23\x00\x00")), V.TOPIC_ALIAS_INVALID),
    ("payload format 2", S5, pkt(0x30, s("a") + props(b"\x01\x02")), V.INVALID_PROPERTY_VALUE),
    ("maximum QoS 2", C5, pkt(0x20, b"\x00\x00" + props(b"\x24\x02")), V.INVALID_PROPERTY_VALUE),
    (
        "retain available 2",
        C5,
        pkt(0x20, b"\x00\x00" + props(b"\x25\x02")),
        V.INVALID_PROPERTY_VALUE,
    ),
    (
        "subscription id 0",
        S5,
        pkt(0x82, b"\x00\x01" + props(b"\x0b\x00") + s("a") + b"\x00"),
        V.INVALID_PROPERTY_VALUE,
    ),
    (
        "subscription id 0 in PUBLISH",
        C5,
        pkt(0x30, s("a") + props(b"\x0b\x00")),
        V.INVALID_PROPERTY_VALUE,
    ),
    ("property 0x04", S5, pkt(0x30, s("a") + props(b"\x04\x00")), V.UNKNOWN_PROPERTY),
    ("property 0x80", S5, pkt(0x30, s("a") + props(b"\x80\x01")), V.UNKNOWN_PROPERTY),
    ("PUBACK code 0x05", S5, pkt(0x40, b"\x00\x01\x05"), V.INVALID_REASON_CODE),
    ("PUBREL code 0x10", S5, pkt(0x62, b"\x00\x01\x10"), V.INVALID_REASON_CODE),
    ("CONNACK 3.1.1 code 6", C4, b"\x20\x02\x00\x06", V.INVALID_REASON_CODE),
    ("CONNACK 5.0 code 0x01", C5, b"\x20\x03\x00\x01\x00", V.INVALID_REASON_CODE),
    ("SUBACK 3.1.1 code 3", C4, b"\x90\x03\x00\x01\x03", V.INVALID_REASON_CODE),
    ("SUBACK 5.0 code 0x11", C5, b"\x90\x04\x00\x01\x00\x11", V.INVALID_REASON_CODE),
    ("UNSUBACK 5.0 code 0x01", C5, b"\xb0\x04\x00\x01\x00\x01", V.INVALID_REASON_CODE),
    ("DISCONNECT code 0x01", S5, b"\xe0\x01\x01", V.INVALID_REASON_CODE),
    ("AUTH code 0x01", S5, b"\xf0\x01\x01", V.INVALID_REASON_CODE),
    (
        "protocol name MQTX",
        NEW,
        pkt(0x10, s("MQTX") + b"\x04\x02\x00\x3c" + s("c")),
        V.PROTOCOL_NAME,
    ),
    (
        "protocol name not UTF-8",
        NEW,
        pkt(0x10, s(b"\xff") + b"\x04\x02\x00\x3c" + s("c")),
        V.INVALID_UTF8,
    ),
    (
        "MQTT level 6",
        NEW,
        pkt(0x10, s("MQTT") + b"\x06\x02\x00\x3c" + s("c")),
        V.UNSUPPORTED_VERSION,
    ),
    (
        "MQTT level 3",
        NEW,
        pkt(0x10, s("MQTT") + b"\x03\x02\x00\x3c" + s("c")),
        V.UNSUPPORTED_VERSION,
    ),
    (
        "MQIsdp level 4",
        NEW,
        pkt(0x10, s("MQIsdp") + b"\x04\x02\x00\x3c" + s("c")),
        V.UNSUPPORTED_VERSION,
    ),
    ("CONNECT reserved flag", NEW, connect_packet(4, flags=0x03), V.CONNECT_FLAGS),
    ("will QoS without will", NEW, connect_packet(4, flags=0x0A), V.CONNECT_FLAGS),
    ("will retain without will", NEW, connect_packet(5, flags=0x22), V.CONNECT_FLAGS),
    (
        "password without user 3.1.1",
        NEW,
        connect_packet(4, flags=0x42, tail=s("c") + s("p")),
        V.CONNECT_FLAGS,
    ),
    (
        "password without user 3.1",
        NEW,
        connect_packet(3, flags=0x42, tail=s("c") + s("p")),
        V.CONNECT_FLAGS,
    ),
    ("PUBLISH before CONNECT", NEW, pkt(0x30, s("a")), V.FIRST_PACKET_NOT_CONNECT),
    ("PINGREQ before CONNECT", NEW, b"\xc0", V.FIRST_PACKET_NOT_CONNECT),
    ("second CONNECT", S4, connect_packet(4), V.SECOND_CONNECT),
    ("CONNACK from a client", S4, b"\x20\x02\x00\x00", V.UNEXPECTED_PACKET),
    ("SUBACK from a client", S5, b"\x90\x04\x00\x01\x00\x00", V.UNEXPECTED_PACKET),
    ("PINGRESP from a client", S4, b"\xd0\x00", V.UNEXPECTED_PACKET),
    ("CONNECT from a server", C4, connect_packet(4), V.UNEXPECTED_PACKET),
    ("SUBSCRIBE from a server", C5, pkt(0x82, _SUB5 + s("a") + b"\x00"), V.UNEXPECTED_PACKET),
    ("PINGREQ from a server", C4, b"\xc0\x00", V.UNEXPECTED_PACKET),
    ("DISCONNECT from a 3.1.1 server", C4, b"\xe0\x00", V.UNEXPECTED_PACKET),
    (
        "3.1.1 subscription options 0x04",
        S4,
        pkt(0x82, _SUB4 + s("a") + b"\x04"),
        V.SUBSCRIPTION_OPTIONS,
    ),
    (
        "5.0 subscription options 0x40",
        S5,
        pkt(0x82, _SUB5 + s("a") + b"\x40"),
        V.SUBSCRIPTION_OPTIONS,
    ),
    ("CONNACK flags 0x02", C4, b"\x20\x02\x02\x00", V.CONNACK_FLAGS),
    ("session present on refusal", C4, b"\x20\x02\x01\x05", V.CONNACK_FLAGS),
    ("session present on 5.0 refusal", C5, b"\x20\x03\x01\x87\x00", V.CONNACK_FLAGS),
    ("retain handling 3", S5, pkt(0x82, _SUB5 + s("a") + b"\x30"), V.RETAIN_HANDLING),
    ("No Local on $share", S5, pkt(0x82, _SUB5 + s("$share/g/a") + b"\x04"), V.SHARED_NO_LOCAL),
    ("No Local on $queue", S5, pkt(0x82, _SUB5 + s("$queue/a") + b"\x04"), V.SHARED_NO_LOCAL),
]

# Violations the codec and connection never raise (left to the channel).
NOT_RAISED_BY_THE_CODEC = {V.CLIENT_ID_INVALID}


def _feed(where: tuple[Role, int | None], raw: bytes) -> None:
    role, level = where
    if role is Role.CLIENT:
        conn = Connection(role, protocol_level=level)
    elif level is None:
        conn = Connection(role)
    else:
        conn = server_after_connect(level)
    conn.receive_data(raw)
    drain(conn)


@pytest.mark.parametrize(
    ("name", "where", "raw", "violation"), VIOLATIONS, ids=[v[0] for v in VIOLATIONS]
)
def test_violation(
    name: str, where: tuple[Role, int | None], raw: bytes, violation: Violation
) -> None:
    with pytest.raises(RemoteProtocolError) as info:
        _feed(where, raw)
    assert info.value.violation is violation
    assert isinstance(info.value.reason_code, ReasonCode)


def test_every_violation_has_a_vector() -> None:
    covered = {v[3] for v in VIOLATIONS}
    # PACKET_TOO_LARGE needs a size limit: tested in test_connection.py.
    covered.add(V.PACKET_TOO_LARGE)
    assert covered | NOT_RAISED_BY_THE_CODEC == set(Violation)


def test_violation_reason_codes() -> None:
    assert RemoteProtocolError(V.TOPIC_NAME_INVALID).reason_code == ReasonCode.TOPIC_NAME_INVALID
    assert RemoteProtocolError(V.DUPLICATE_PROPERTY).reason_code == ReasonCode.PROTOCOL_ERROR
    assert RemoteProtocolError(V.TRUNCATED).reason_code == ReasonCode.MALFORMED_PACKET
    assert RemoteProtocolError(V.SHARED_NO_LOCAL).reason_code == ReasonCode.PROTOCOL_ERROR


def test_decode_refuses_an_unknown_level() -> None:
    with pytest.raises(LocalProtocolError):
        decode(0xC0, b"", 7, from_client=True)


def test_decode_of_connect_ignores_the_level_argument() -> None:
    raw = connect_packet(5)
    assert decode_whole(raw, MQTT_3_1_1, from_client=True) == Connect("c", MQTT_5)
