"""CONNECT and CONNACK: protocol versions, client identifiers, sessions, keepalive, takeover.

MQTT 3.1.1 section 3.1/3.2 and MQTT 5.0 section 3.1/3.2 (statement ids in test names).
"""

from __future__ import annotations

import time

import pytest

from . import raw
from .conftest import UNDER_MOSQUITTO
from .raw import V5, V31, V311, RawClient

# MQTT-3.1.2-24 wants the close within 1.5 x keepalive. mosquitto 2.0.11 checks keepalives
# only every few seconds (keepalive 1 s is enforced after ~5 s), so it gets more slack.
KEEPALIVE_SLACK = 5.0 if UNDER_MOSQUITTO else 1.0


@pytest.mark.parametrize(
    ("proto", "name"), [(V31, b"MQIsdp"), (V311, b"MQTT")], ids=["3.1", "3.1.1"]
)
def test_connect_v3_accepted(broker, uid, proto, name):
    with RawClient(broker, proto) as c:
        c.send(raw.connect(f"c-{uid}", proto=proto, proto_name=name))
        c.expect_bytes("CONNACK", raw.connack(0))
        c.ping()
        c.disconnect()


def test_connect_v5_accepted(broker, uid):
    with RawClient(broker, V5) as c:
        ack = c.connect(f"c-{uid}")
        assert not ack.session_present
        c.ping()
        c.disconnect()


def test_v5_connack_properties_are_sane(broker, uid):
    """CONNACK carries only CONNACK properties (checked in connect()) with legal values."""
    with RawClient(broker, V5) as c:
        ack = c.connect(f"c-{uid}")
        p = ack.props
        assert p.get(raw.MAXIMUM_QOS, 2) in (0, 1, 2)
        assert p.get(raw.RETAIN_AVAILABLE, 1) in (0, 1)
        assert p.get(raw.WILDCARD_SUBSCRIPTION_AVAILABLE, 1) in (0, 1)
        assert p.get(raw.SHARED_SUBSCRIPTION_AVAILABLE, 1) in (0, 1)
        assert p.get(raw.SUBSCRIPTION_IDENTIFIER_AVAILABLE, 1) in (0, 1)
        assert p.get(raw.RECEIVE_MAXIMUM, 65535) > 0
        assert p.get(raw.MAXIMUM_PACKET_SIZE, 1) > 0
        for pid in (
            raw.RECEIVE_MAXIMUM,
            raw.MAXIMUM_QOS,
            raw.RETAIN_AVAILABLE,
            raw.MAXIMUM_PACKET_SIZE,
            raw.TOPIC_ALIAS_MAXIMUM,
        ):
            assert len(p.all(pid)) <= 1, f"property 0x{pid:02x} repeated"
        c.disconnect()


def test_clean_session_and_session_present_v311(broker, uid):
    cid = f"c-{uid}"
    with RawClient(broker) as c:
        c.send(raw.connect(cid, clean=False))
        c.expect_bytes("CONNACK", raw.connack(0, session_present=False))
        c.disconnect()
    with RawClient(broker) as c:
        c.send(raw.connect(cid, clean=False))
        c.expect_bytes("CONNACK", raw.connack(0, session_present=True))
        c.disconnect()
    with RawClient(broker) as c:  # MQTT-3.2.2-1: clean session -> session present 0
        c.send(raw.connect(cid, clean=True))
        c.expect_bytes("CONNACK", raw.connack(0, session_present=False))
        c.disconnect()
    with RawClient(broker) as c:  # the clean session discarded the old state
        c.send(raw.connect(cid, clean=False))
        c.expect_bytes("CONNACK", raw.connack(0, session_present=False))
        c.disconnect()
    with RawClient(broker) as c:  # leave nothing behind
        c.connect(cid, clean=True)
        c.disconnect()


def test_empty_client_id_accepted_with_clean_session_v311(broker):
    with RawClient(broker) as c:
        c.send(raw.connect("", clean=True))
        c.expect_bytes("CONNACK", raw.connack(0))
        c.ping()
        c.disconnect()


def test_empty_client_id_rejected_without_clean_session_v311(broker):
    """MQTT-3.1.3-8: CONNACK return code 2 (identifier rejected), then close."""
    with RawClient(broker) as c:
        c.send(raw.connect("", clean=False))
        c.expect_bytes("CONNACK", raw.connack(2))
        c.expect_closed()


def test_empty_client_id_assigned_v5(broker):
    """MQTT-3.1.3-7 / 3.2.2.3.7: the server assigns an id and returns it in CONNACK."""
    ids = []
    for _ in range(2):
        with RawClient(broker, V5) as c:
            ack = c.connect("")
            assigned = ack.props.get(raw.ASSIGNED_CLIENT_IDENTIFIER)
            assert isinstance(assigned, str) and assigned, f"no assigned id in {ack!r}"
            ids.append(assigned)
            c.disconnect()
    assert ids[0] != ids[1]


@pytest.mark.parametrize("level", [0, 2, 6, 255])
def test_unsupported_protocol_level_refused(broker, uid, level):
    """MQTT-3.1.2-2: return code 1 (3.1.1 form) or reason 0x84 (5.0 form), then close."""
    with RawClient(broker) as c:
        c.send(raw.connect(f"c-{uid}", proto=level, proto_name=b"MQTT"))
        try:
            pkt = c.read()
        except raw.ConnectionClosed:
            raise AssertionError("closed without CONNACK") from None
        assert pkt.name == "CONNACK", pkt
        assert pkt.body[:2] in (b"\x00\x01", b"\x00\x84"), f"want 0x01 or 0x84: {pkt!r}"
        c.expect_closed()


def test_bad_protocol_name_closes(broker, uid):
    """MQTT-3.1.2-1: a wrong protocol name may get a refusing CONNACK, then the close."""
    with RawClient(broker) as c:
        c.send(raw.connect(f"c-{uid}", proto=V311, proto_name=b"MQTX"))
        seen = c.expect_closed()
        if seen is not None:
            assert seen.name == "CONNACK" and seen.reason != 0, seen


@pytest.mark.parametrize("proto", [V311, V5], ids=["3.1.1", "5.0"])
def test_second_connect_closes(broker, uid, proto):
    """MQTT-3.1.0-2: a second CONNECT is a protocol violation."""
    with RawClient(broker, proto) as c:
        c.connect(f"c-{uid}")
        c.send(raw.connect(f"c-{uid}", proto=proto))
        c.expect_closed(disconnect_reasons={0x82})


def test_takeover_closes_old_connection_v311(broker, uid):
    """MQTT-3.1.4-2: the existing client with the same id is disconnected."""
    with RawClient(broker) as old, RawClient(broker) as new:
        old.connect(f"c-{uid}")
        new.connect(f"c-{uid}")
        old.expect_closed()
        new.ping()
        new.disconnect()


@pytest.mark.gateway_only  # mosquitto 2.0.11 closes the old connection without DISCONNECT
def test_takeover_sends_disconnect_0x8e_v5(broker, uid):
    """MQTT 5 3.1.4-3: DISCONNECT 0x8E (session taken over) to the old connection."""
    with RawClient(broker, V5) as old, RawClient(broker, V5) as new:
        old.connect(f"c-{uid}")
        new.connect(f"c-{uid}")
        old.expect_closed(disconnect_reasons={0x8E}, require_disconnect=True)
        new.ping()
        new.disconnect()


def test_takeover_across_versions(broker, uid):
    with RawClient(broker, V5) as old, RawClient(broker, V311) as new:
        old.connect(f"c-{uid}")
        new.connect(f"c-{uid}")
        old.expect_closed(disconnect_reasons={0x8E})
        new.ping()
        new.disconnect()


def test_keepalive_timeout_closes_and_fires_will(broker, uid):
    """MQTT-3.1.2-24: no packet within 1.5 x keepalive -> close, and the will is published."""
    will_topic = f"{uid}/will"
    with RawClient(broker) as watcher, RawClient(broker) as idle:
        watcher.connect(f"w-{uid}")
        watcher.subscribe(will_topic, 1)
        idle.connect(f"i-{uid}", keepalive=1, will=raw.Will(will_topic, b"gone", qos=1))
        start = time.monotonic()
        idle.expect_closed(timeout=1.5 + KEEPALIVE_SLACK + 1, disconnect_reasons={0x8D})
        elapsed = time.monotonic() - start
        assert elapsed >= 0.9, f"closed after {elapsed:.2f}s, before the keepalive expired"
        assert elapsed <= 1.5 + KEEPALIVE_SLACK, f"closed {elapsed:.2f}s after 1.5 x keepalive"
        watcher.receive(will_topic, b"gone", qos=1)
        watcher.disconnect()


def test_keepalive_respected_while_pinging(broker, uid):
    """A client that pings within its keepalive stays connected past 1.5 x keepalive."""
    with RawClient(broker) as c:
        c.connect(f"c-{uid}", keepalive=1)
        start = time.monotonic()
        while time.monotonic() - start < 2.2:
            c.expect_nothing(0.5)  # nothing unsolicited, and paces the pings
            c.ping()
        c.disconnect()


def test_server_keepalive_announced_v5(make_broker, uid):
    """3.2.2.3.14: a configured server keepalive is sent in CONNACK; the client uses it."""
    addr = make_broker(GATEWAY_MQTT__SERVER_KEEPALIVE=30)
    with RawClient(addr, V5) as c:
        ack = c.connect(f"c-{uid}", keepalive=120)
        assert ack.props.get(raw.SERVER_KEEP_ALIVE) == 30, ack
        c.ping()
        c.disconnect()


@pytest.mark.parametrize(
    "first",
    [
        raw.pingreq(),
        raw.subscribe(1, "a/b", 0),
        raw.publish("a/b", b"x"),
        raw.disconnect(),
        raw.connack(0),
    ],
    ids=["PINGREQ", "SUBSCRIBE", "PUBLISH", "DISCONNECT", "CONNACK"],
)
def test_first_packet_not_connect_closes(broker, first):
    """MQTT-3.1.0-1: the first packet from the client must be CONNECT."""
    with RawClient(broker) as c:
        c.send(first)
        c.expect_closed()
    raw.assert_broker_healthy(broker)


@pytest.mark.parametrize("proto", [V311, V5], ids=["3.1.1", "5.0"])
def test_connect_reserved_flag_closes(broker, uid, proto):
    """MQTT-3.1.2-3: the reserved connect flag must be 0."""
    with RawClient(broker, proto) as c:
        c.send(raw.connect(f"c-{uid}", proto=proto, reserved_flag=True))
        seen = c.expect_closed()
        if seen is not None:
            assert seen.reason != 0, seen


def _connect_body_with_flags(client_id: str, flags: int) -> bytes:
    body = raw.utf8(b"MQTT") + bytes([V311, flags]) + raw.u16(60) + raw.utf8(client_id)
    return raw.packet(raw.CONNECT, 0, body)


@pytest.mark.parametrize(
    "flags",
    [0x02 | 0x18, 0x02 | 0x08, 0x02 | 0x20],
    ids=["will-qos3", "will-qos-without-will", "will-retain-without-will"],
)
def test_connect_bad_will_flags_close(broker, uid, flags):
    """MQTT-3.1.2-11/13/14/15: will QoS/retain must be 0 without a will; QoS 3 invalid."""
    with RawClient(broker) as c:
        c.send(_connect_body_with_flags(f"c-{uid}", flags))
        seen = c.expect_closed()
        if seen is not None:
            assert seen.reason != 0, seen
    raw.assert_broker_healthy(broker)


def test_password_without_username_v311_closes(broker, uid):
    """MQTT-3.1.2-22: in 3.1.1 the password flag requires the username flag."""
    with RawClient(broker) as c:
        c.send(raw.connect(f"c-{uid}", password=b"secret"))
        seen = c.expect_closed()
        if seen is not None:
            assert seen.reason != 0, seen


def test_username_and_password_accepted_anonymous_broker(broker, uid):
    with RawClient(broker) as c:
        c.send(raw.connect(f"c-{uid}", username="user", password=b"pw"))
        c.expect_bytes("CONNACK", raw.connack(0))
        c.disconnect()


def test_partial_connect_then_eof(broker, uid):
    """A half-sent CONNECT followed by EOF must not disturb the broker."""
    data = raw.connect(f"c-{uid}")
    with RawClient(broker) as c:
        c.send(data[: len(data) // 2])
    raw.assert_broker_healthy(broker)
