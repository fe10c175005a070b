"""The sans-IO Connection: streaming, limits, roles, errors, sending."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocols.mqtt import connection
from protocols.mqtt.codec import encode
from protocols.mqtt.connection import Connection, Role
from protocols.mqtt.errors import (
    LocalProtocolError,
    OutgoingPacketTooLarge,
    RemoteProtocolError,
    Violation,
)
from protocols.mqtt.packets import (
    MQTT_3_1,
    MQTT_3_1_1,
    MQTT_5,
    Auth,
    ConnAck,
    Connect,
    Disconnect,
    Packet,
    PingReq,
    PingResp,
    Properties,
    PubAck,
    Publish,
    SubAck,
    Subscribe,
    Subscription,
)
from protocols.mqtt.reason_codes import ReasonCode
from tests.protocols.mqtt.helpers import (
    connect_packet,
    drain,
    pkt,
    props,
    s,
    server_after_connect,
)
from tests.protocols.mqtt.strategies import client_packets, connects, server_packets

LEVELS = [MQTT_3_1, MQTT_3_1_1, MQTT_5]

SESSION_5: list[Packet] = [
    Connect("dev-1", MQTT_5, properties=Properties(receive_maximum=5)),
    Subscribe(1, (Subscription("a/#", 1),)),
    Publish("a/b", b"hello", 1, packet_id=2),
    Publish("a/c", b"x" * 300, 0, properties=Properties(user_properties=(("k", "v"),))),
    PubAck(7),
    PingReq(),
    Disconnect(),
]


def _stream(packets: list[Packet], level: int) -> bytes:
    return b"".join(encode(p, level) for p in packets)


def test_several_packets_in_one_chunk() -> None:
    conn = Connection(Role.SERVER)
    conn.receive_data(_stream(SESSION_5, MQTT_5))
    assert drain(conn) == SESSION_5
    assert conn.protocol_level == MQTT_5
    assert conn.buffered == 0


def test_split_at_every_byte_boundary() -> None:
    data = _stream(SESSION_5, MQTT_5)
    for cut in range(len(data) + 1):
        conn = Connection(Role.SERVER)
        conn.receive_data(data[:cut])
        got = drain(conn)
        conn.receive_data(data[cut:])
        got += drain(conn)
        assert got == SESSION_5, cut


def test_one_byte_at_a_time() -> None:
    data = _stream(SESSION_5, MQTT_5)
    conn = Connection(Role.SERVER)
    got: list[Packet] = []
    for index in range(len(data)):
        conn.receive_data(data[index : index + 1])
        got += drain(conn)
    assert got == SESSION_5


@pytest.mark.parametrize("level", LEVELS)
@settings(max_examples=60)
@given(data=st.data())
def test_server_stream_in_random_chunks(level: int, data: st.DataObject) -> None:
    first = data.draw(connects(level))
    rest = data.draw(
        st.lists(client_packets(level).filter(lambda p: type(p) is not Connect), max_size=8)
    )
    stream = _stream([first, *rest], level)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=10)))
    conn = Connection(Role.SERVER)
    got: list[Packet] = []
    start = 0
    for cut in [*cuts, len(stream)]:
        conn.receive_data(stream[start:cut])
        got += drain(conn)
        start = cut
    assert got == [first, *rest]
    assert conn.protocol_level == level


@pytest.mark.parametrize("level", LEVELS)
@settings(max_examples=60)
@given(data=st.data())
def test_client_stream_in_random_chunks(level: int, data: st.DataObject) -> None:
    expected = data.draw(st.lists(server_packets(level), max_size=8))
    stream = _stream(expected, level)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=10)))
    conn = Connection(Role.CLIENT, protocol_level=level)
    got: list[Packet] = []
    start = 0
    for cut in [*cuts, len(stream)]:
        conn.receive_data(stream[start:cut])
        got += drain(conn)
        start = cut
    assert got == expected


def test_buffer_is_compacted() -> None:
    conn = server_after_connect(MQTT_3_1_1)
    packet = Publish("t", b"p" * 100)
    data = encode(packet, MQTT_3_1_1) * 50
    for start in range(0, len(data), 37):  # chunks that never align with packets
        conn.receive_data(data[start : start + 37])
        for got in drain(conn):
            assert got == packet
        assert len(conn._buffer) < 4 * len(encode(packet, MQTT_3_1_1))
    assert conn.buffered == 0


def test_large_packet_streams_in_pieces() -> None:
    conn = server_after_connect(MQTT_5)
    packet = Publish("big", bytes(range(256)) * 4096, 1, packet_id=9)
    data = encode(packet, MQTT_5)
    chunks = [data[i : i + 4096] for i in range(0, len(data), 4096)]
    for chunk in chunks[:-1]:
        conn.receive_data(chunk)
        assert conn.next_event() is None
    conn.receive_data(chunks[-1])
    assert drain(conn) == [packet]


# -- limits -------------------------------------------------------------------------


def test_packet_too_large_is_seen_from_the_header_alone() -> None:
    conn = Connection(Role.SERVER, max_incoming_packet_size=64)
    conn.receive_data(connect_packet(MQTT_3_1_1))
    assert isinstance(conn.next_event(), Connect)
    conn.receive_data(b"\x30\x80\x01")  # remaining length 128: 131 bytes in all
    with pytest.raises(RemoteProtocolError) as info:
        conn.next_event()
    assert info.value.violation is Violation.PACKET_TOO_LARGE
    assert info.value.reason_code == ReasonCode.PACKET_TOO_LARGE


def test_packet_at_the_limit_is_accepted() -> None:
    packet = Publish("t", b"x" * 30)
    raw = encode(packet, MQTT_3_1_1)
    conn = Connection(Role.SERVER, max_incoming_packet_size=len(raw))
    conn.receive_data(connect_packet(MQTT_3_1_1) + raw)
    assert drain(conn)[1] == packet
    conn = Connection(Role.CLIENT, protocol_level=MQTT_3_1_1, max_incoming_packet_size=len(raw) - 1)
    conn.receive_data(raw)
    with pytest.raises(RemoteProtocolError, match="exceeds"):
        conn.next_event()


def test_malformed_remaining_length_without_waiting() -> None:
    conn = server_after_connect(MQTT_3_1_1)
    conn.receive_data(b"\x30\xff\xff\xff\xff")  # the fifth length byte never needs to come
    with pytest.raises(RemoteProtocolError) as info:
        conn.next_event()
    assert info.value.violation is Violation.MALFORMED_REMAINING_LENGTH


def test_four_byte_remaining_length_is_fine() -> None:
    conn = server_after_connect(MQTT_3_1_1)
    conn.receive_data(b"\x30\xff\xff\xff\x7f")  # 268,435,455: legal, waits for the body
    assert conn.next_event() is None


# -- a received PUBLISH keeps its bytes ---------------------------------------------


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("payload_size", [0, 10, 200, 20_000])
def test_received_publish_carries_its_bytes(level: int, payload_size: int) -> None:
    packet = Publish("a/b", b"p" * payload_size, 1, True, False, 9)
    data = encode(packet, level)
    conn = server_after_connect(level)
    conn.receive_data(data + encode(PingReq(), level))
    got = conn.next_event()
    assert got == packet
    assert isinstance(got, Publish)
    assert got.raw == data
    assert conn.next_event() == PingReq()


def test_publish_with_a_long_remaining_length_form_has_no_bytes() -> None:
    # 0x85 0x00: 5 in two bytes, legal to decode, but not what an encoder writes
    conn = server_after_connect(MQTT_3_1_1)
    conn.receive_data(b"\x30\x85\x00\x00\x01tx\x00")
    got = conn.next_event()
    assert got == Publish("t", b"x\x00")
    assert isinstance(got, Publish)
    assert got.raw is None


def test_raw_is_not_part_of_the_packet_value() -> None:
    a, b = Publish("t", b"x"), Publish("t", b"x")
    a.raw = b"\x30\x04\x00\x01tx"
    assert a == b
    assert hash(a) == hash(b)
    assert "raw" not in repr(a)


# -- errors kill the receiving side -------------------------------------------------


def test_after_an_error_the_connection_is_dead() -> None:
    conn = Connection(Role.SERVER)
    conn.receive_data(b"\x30\x00")
    with pytest.raises(RemoteProtocolError) as first:
        conn.next_event()
    assert first.value.violation is Violation.FIRST_PACKET_NOT_CONNECT
    with pytest.raises(RemoteProtocolError) as again:
        conn.next_event()
    assert again.value.violation is Violation.FIRST_PACKET_NOT_CONNECT
    with pytest.raises(RemoteProtocolError):
        conn.receive_data(connect_packet(MQTT_3_1_1))
    # The answer can still be sent.
    assert conn.send(ConnAck(False, ReasonCode.PROTOCOL_ERROR)) == b"\x20\x02\x00\x03"


def test_bad_packet_after_good_ones_in_one_chunk() -> None:
    conn = Connection(Role.SERVER)
    conn.receive_data(connect_packet(MQTT_3_1_1) + b"\xc0\x00" + b"\xc1\x00" + b"\xc0\x00")
    assert isinstance(conn.next_event(), Connect)
    assert conn.next_event() == PingReq()
    with pytest.raises(RemoteProtocolError):
        conn.next_event()
    with pytest.raises(RemoteProtocolError):
        conn.next_event()


# -- server role --------------------------------------------------------------------


@pytest.mark.parametrize("level", LEVELS)
def test_server_learns_the_level_from_connect(level: int) -> None:
    conn = Connection(Role.SERVER)
    assert conn.protocol_level is None
    conn.receive_data(connect_packet(level))
    assert conn.next_event() == Connect("c", level, keepalive=60)
    assert conn.protocol_level == level


def test_malformed_v5_connect_still_sets_the_level() -> None:
    bad = pkt(0x10, s("MQTT") + b"\x05\x02\x00\x3c" + props(b"\x21\x00\x00") + s("c"))
    conn = Connection(Role.SERVER)
    conn.receive_data(bad)
    with pytest.raises(RemoteProtocolError) as info:
        conn.next_event()
    assert info.value.violation is Violation.INVALID_PROPERTY_VALUE
    assert conn.protocol_level == MQTT_5
    assert conn.send(ConnAck(False, info.value.reason_code)) == b"\x20\x03\x00\x82\x00"


@pytest.mark.parametrize(
    "raw",
    [
        pkt(0x10, s("MQTT") + b"\x06\x02\x00\x3c" + s("c")),
        pkt(0x10, s("MQTX") + b"\x04\x02\x00\x3c" + s("c")),
    ],
)
def test_unsupported_version_is_answered_in_3_1_1(raw: bytes) -> None:
    conn = Connection(Role.SERVER)
    conn.receive_data(raw)
    with pytest.raises(RemoteProtocolError) as info:
        conn.next_event()
    assert info.value.reason_code == ReasonCode.UNSUPPORTED_PROTOCOL_VERSION
    assert conn.protocol_level is None
    answer = ConnAck(False, ReasonCode.UNSUPPORTED_PROTOCOL_VERSION)
    assert conn.send(answer) == b"\x20\x02\x00\x01"


def test_second_connect() -> None:
    conn = server_after_connect(MQTT_5)
    conn.receive_data(connect_packet(MQTT_5))
    with pytest.raises(RemoteProtocolError) as info:
        conn.next_event()
    assert info.value.violation is Violation.SECOND_CONNECT


def test_server_send_rules() -> None:
    conn = server_after_connect(MQTT_3_1_1)
    assert conn.send(ConnAck(True)) == b"\x20\x02\x01\x00"
    assert conn.send(PingResp()) == b"\xd0\x00"
    for packet in (Connect("x"), PingReq(), Subscribe(1, (Subscription("a"),)), Disconnect()):
        with pytest.raises(LocalProtocolError):
            conn.send(packet)
    conn5 = server_after_connect(MQTT_5)
    assert conn5.send(Disconnect(ReasonCode.SERVER_SHUTTING_DOWN)) == b"\xe0\x01\x8b"
    with pytest.raises(LocalProtocolError):
        Connection(Role.SERVER).send(PingResp())  # level unknown before CONNECT


def test_outgoing_packet_size_limit() -> None:
    conn = server_after_connect(MQTT_5)
    conn.max_outgoing_packet_size = 20
    assert len(conn.send(Publish("t", b"x" * 10))) <= 20
    with pytest.raises(OutgoingPacketTooLarge):
        conn.send(Publish("t", b"x" * 20))
    assert issubclass(OutgoingPacketTooLarge, LocalProtocolError)


# -- client role --------------------------------------------------------------------


def test_client_learns_the_level_by_sending_connect() -> None:
    conn = Connection(Role.CLIENT)
    conn.receive_data(b"\x20\x03\x00\x00\x00")
    with pytest.raises(LocalProtocolError):
        conn.next_event()  # no level yet; not fatal
    assert conn.send(Connect("c", MQTT_5)) == encode(Connect("c", MQTT_5), MQTT_5)
    assert conn.protocol_level == MQTT_5
    assert conn.next_event() == ConnAck()


def test_client_send_rules() -> None:
    conn = Connection(Role.CLIENT, protocol_level=MQTT_5)
    assert conn.send(PingReq()) == b"\xc0\x00"
    assert conn.send(Auth(0x19)) == b"\xf0\x01\x19"
    for packet in (ConnAck(), PingResp(), SubAck(1, (0,))):
        with pytest.raises(LocalProtocolError):
            conn.send(packet)
    with pytest.raises(LocalProtocolError):
        conn.send(Publish("t", properties=Properties(subscription_identifiers=(1,))))
    with pytest.raises(LocalProtocolError):
        conn.send(Connect("c", 6))
    with pytest.raises(LocalProtocolError):
        conn.send("PINGREQ")  # type: ignore[arg-type]
    with pytest.raises(LocalProtocolError):
        Connection(Role.CLIENT, protocol_level=2)


def test_client_rejects_server_only_mistakes() -> None:
    conn = Connection(Role.CLIENT, protocol_level=MQTT_3_1_1)
    conn.receive_data(b"\x20\x02\x00\x00\x90\x03\x00\x01\x01\xd0\x00")
    assert drain(conn) == [ConnAck(), SubAck(1, (1,)), PingResp()]
    conn.receive_data(b"\xc0\x00")
    with pytest.raises(RemoteProtocolError) as info:
        conn.next_event()
    assert info.value.violation is Violation.UNEXPECTED_PACKET


def test_module_re_exports_for_shared_publish_bytes() -> None:
    template = connection.encode(Publish("t", b"p", 1, packet_id=1), MQTT_3_1_1)
    offset = connection.publish_packet_id_offset(template)
    assert connection.encode_publish_with_id(template, offset, 0x1234) == (
        b"\x32\x06\x00\x01t\x12\x34p"
    )


# -- the drained receive buffer is one shared empty bytes object ------------------------


def test_drained_connections_share_one_empty_buffer() -> None:
    a, b = Connection(Role.SERVER), Connection(Role.SERVER)
    assert a._buffer is connection._EMPTY and b._buffer is connection._EMPTY
    for conn in (a, b):
        conn.receive_data(_stream(SESSION_5[:3], MQTT_5))
        assert drain(conn) == SESSION_5[:3]
        assert conn._buffer is connection._EMPTY
    assert connection._EMPTY == b"" and type(connection._EMPTY) is bytes


def test_partial_input_never_mutates_the_shared_empty_buffer() -> None:
    data = _stream(SESSION_5, MQTT_5)
    conns = [Connection(Role.SERVER) for _ in range(3)]
    # a bytearray and a memoryview from the caller are copied, bytes kept as they are
    for cut, kind in ((5, bytes), (1, bytearray), (len(data) - 1, memoryview)):
        conn = conns.pop()
        head = kind(data[:cut])
        conn.receive_data(head)
        got = drain(conn)
        if isinstance(head, bytearray):
            head[:] = b"\x00" * len(head)  # the caller reuses its buffer: we hold a copy
        conn.receive_data(data[cut:])
        got += drain(conn)
        assert got == SESSION_5, kind
        assert conn._buffer is connection._EMPTY
        assert connection._EMPTY == b""


def test_first_chunk_is_kept_without_a_copy_until_more_arrives() -> None:
    conn = Connection(Role.SERVER)
    data = _stream(SESSION_5[:1], MQTT_5)
    conn.receive_data(data[:4])
    assert conn.buffered == 4
    conn.receive_data(data[4:])
    assert type(conn._buffer) is bytearray
    assert drain(conn) == SESSION_5[:1]
    assert conn._buffer is connection._EMPTY


def test_protocol_error_leaves_the_buffer_shared_and_empty() -> None:
    conn = Connection(Role.SERVER)
    conn.receive_data(b"\x30\x02\x00\x00")  # PUBLISH before CONNECT
    with pytest.raises(RemoteProtocolError):
        conn.next_event()
    assert conn._buffer is connection._EMPTY
    assert connection._EMPTY == b""
