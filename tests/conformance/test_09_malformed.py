"""Malformed packets and protocol errors: the offender is disconnected, the broker lives on.

Every case connects, sends one bad packet and requires the connection to close. A 5.0
client may first get a DISCONNECT whose reason code must be one of those the spec allows
for the fault. The spec only says SHOULD send it (4.13.1); gatewayd maps every violation
to a reason code, so under gatewayd the DISCONNECT is required, under mosquitto optional.
After each case a second, healthy client must still be served by the same broker.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from . import raw
from .conftest import UNDER_GATEWAY
from .raw import V5, V311, RawClient

MALFORMED = {0x81, 0x82}
TOPIC_INVALID = {0x81, 0x82, 0x90}


def _publish_body(topic: bytes, proto: int, *, mid: bytes = b"", props: bytes = b"\x00") -> bytes:
    return raw.utf8(topic) + mid + (props if proto == V5 else b"")


def _sub_body(mid: int, filt: bytes, opts: int, proto: int) -> bytes:
    return raw.u16(mid) + (b"\x00" if proto == V5 else b"") + raw.utf8(filt) + bytes([opts])


# name -> (builder(proto) -> bytes, allowed 5.0 DISCONNECT reasons)
CASES = {
    "remaining-length-5-bytes": (lambda p: b"\x30\xff\xff\xff\xff\x01", MALFORMED),
    "reserved-type-0": (lambda p: b"\x00\x00", MALFORMED),
    "subscribe-flags-0": (
        lambda p: raw.packet(raw.SUBSCRIBE, 0, _sub_body(1, b"a/b", 0, p)),
        MALFORMED,
    ),
    "unsubscribe-flags-0": (
        lambda p: raw.packet(
            raw.UNSUBSCRIBE, 0, raw.u16(1) + (b"\x00" if p == V5 else b"") + raw.utf8("a")
        ),
        MALFORMED,
    ),
    "pubrel-flags-0": (lambda p: raw.packet(raw.PUBREL, 0, raw.u16(1)), MALFORMED),
    "pingreq-flags-1": (lambda p: b"\xc1\x00", MALFORMED),
    "publish-qos3": (
        lambda p: raw.packet(raw.PUBLISH, 0x06, _publish_body(b"a/b", p, mid=raw.u16(1)) + b"x"),
        MALFORMED,
    ),
    "publish-packet-id-0": (
        lambda p: raw.packet(raw.PUBLISH, 0x02, _publish_body(b"a/b", p, mid=raw.u16(0)) + b"x"),
        MALFORMED,
    ),
    "subscribe-packet-id-0": (
        lambda p: raw.packet(raw.SUBSCRIBE, 2, _sub_body(0, b"a/b", 0, p)),
        MALFORMED,
    ),
    "unsubscribe-packet-id-0": (
        lambda p: raw.packet(
            raw.UNSUBSCRIBE, 2, raw.u16(0) + (b"\x00" if p == V5 else b"") + raw.utf8("a")
        ),
        MALFORMED,
    ),
    "topic-invalid-utf8": (
        lambda p: raw.packet(raw.PUBLISH, 0, _publish_body(b"a/\xc3\x28", p) + b"x"),
        TOPIC_INVALID,
    ),
    "topic-overlong-utf8": (
        lambda p: raw.packet(raw.PUBLISH, 0, _publish_body(b"a/\xc0\xaf", p) + b"x"),
        TOPIC_INVALID,
    ),
    "topic-utf16-surrogate": (
        lambda p: raw.packet(raw.PUBLISH, 0, _publish_body(b"a/\xed\xa0\x80", p) + b"x"),
        TOPIC_INVALID,
    ),
    "topic-null-char": (
        lambda p: raw.packet(raw.PUBLISH, 0, _publish_body(b"a/\x00b", p) + b"x"),
        TOPIC_INVALID,
    ),
    "topic-plus-wildcard": (
        lambda p: raw.packet(raw.PUBLISH, 0, _publish_body(b"a/+/c", p) + b"x"),
        TOPIC_INVALID,
    ),
    "topic-hash-wildcard": (
        lambda p: raw.packet(raw.PUBLISH, 0, _publish_body(b"a/#", p) + b"x"),
        TOPIC_INVALID,
    ),
    "topic-empty": (
        lambda p: raw.packet(raw.PUBLISH, 0, _publish_body(b"", p) + b"x"),
        TOPIC_INVALID,
    ),
    "topic-length-past-end": (
        lambda p: raw.packet(raw.PUBLISH, 0, raw.u16(200) + b"a/b"),
        MALFORMED,
    ),
    "subscribe-no-filters": (
        lambda p: raw.packet(raw.SUBSCRIBE, 2, raw.u16(1) + (b"\x00" if p == V5 else b"")),
        MALFORMED,
    ),
    "unsubscribe-no-filters": (
        lambda p: raw.packet(raw.UNSUBSCRIBE, 2, raw.u16(1) + (b"\x00" if p == V5 else b"")),
        MALFORMED,
    ),
    "subscribe-qos3": (
        lambda p: raw.packet(raw.SUBSCRIBE, 2, _sub_body(1, b"a/b", 3, p)),
        MALFORMED,
    ),
    "subscribe-reserved-option-bits": (
        lambda p: raw.packet(raw.SUBSCRIBE, 2, _sub_body(1, b"a/b", 0xC1, p)),
        MALFORMED,
    ),
    "subscribe-filter-invalid-utf8": (
        lambda p: raw.packet(raw.SUBSCRIBE, 2, _sub_body(1, b"a/\xff", 0, p)),
        MALFORMED | {0x8F},
    ),
}

V5_CASES = {
    "property-duplicated": (
        raw.packet(raw.PUBLISH, 0, raw.utf8("a/b") + raw.props([(1, 0), (1, 0)]) + b"x"),
        MALFORMED,
    ),
    "property-unknown-id": (
        raw.packet(raw.PUBLISH, 0, raw.utf8("a/b") + b"\x02\x7f\x00" + b"x"),
        MALFORMED,
    ),
    "property-length-past-end": (
        raw.packet(raw.PUBLISH, 0, raw.utf8("a/b") + b"\x20\x01\x00"),
        MALFORMED,
    ),
    "publish-with-subscription-identifier": (
        raw.packet(
            raw.PUBLISH, 0, raw.utf8("a/b") + raw.props([(raw.SUBSCRIPTION_IDENTIFIER, 1)]) + b"x"
        ),
        MALFORMED,
    ),
    "retain-handling-3": (
        raw.packet(raw.SUBSCRIBE, 2, _sub_body(1, b"a/b", 0x30, V5)),
        MALFORMED,
    ),
    "subscription-identifier-0": (
        raw.packet(
            raw.SUBSCRIBE,
            2,
            raw.u16(1) + raw.props([(raw.SUBSCRIPTION_IDENTIFIER, 0)]) + raw.utf8("a/b") + b"\x00",
        ),
        MALFORMED,
    ),
    "auth-without-method": (raw.packet(raw.AUTH, 0, b"\x18\x00"), MALFORMED),
}


# Cases mosquitto 2.0.11 accepts although the spec says close:
# - PINGREQ with reserved flag bits set is answered (MQTT-2.2.2-2 says close);
# - a client PUBLISH carrying a Subscription Identifier is forwarded (MQTT-3.3.4-6).
MOSQUITTO_ACCEPTS = {"pingreq-flags-1", "publish-with-subscription-identifier"}


def _params(names):
    return [
        pytest.param(n, marks=pytest.mark.gateway_only) if n in MOSQUITTO_ACCEPTS else n
        for n in names
    ]


def _expect_dropped(c: RawClient, reasons: set[int]) -> None:
    seen = c.expect_closed(
        disconnect_reasons=reasons, require_disconnect=UNDER_GATEWAY and c.proto == V5
    )
    if c.proto != V5:
        assert seen is None, f"a 3.1.1 server sends no DISCONNECT: {seen!r}"


@pytest.mark.parametrize("proto", [V311, V5], ids=["3.1.1", "5.0"])
@pytest.mark.parametrize("case", _params(CASES))
def test_malformed_packet_closes(broker, uid, case, proto):
    build, reasons = CASES[case]
    with RawClient(broker, proto) as c:
        c.connect(f"c-{uid}")
        c.send(build(proto))
        _expect_dropped(c, reasons)
    raw.assert_broker_healthy(broker, proto)


@pytest.mark.parametrize("case", _params(V5_CASES))
def test_malformed_v5_packet_closes(broker, uid, case):
    data, reasons = V5_CASES[case]
    with RawClient(broker, V5) as c:
        c.connect(f"c-{uid}")
        c.send(data)
        _expect_dropped(c, reasons)
    raw.assert_broker_healthy(broker, V5)


@pytest.mark.parametrize("proto", [V311, V5], ids=["3.1.1", "5.0"])
@pytest.mark.parametrize("filt", ["a/#/b", "a/b#", "a+/b", "#/a", ""])
def test_invalid_topic_filter_refused(broker, uid, proto, filt):
    """4.7.1: a bad filter gets SUBACK 0x80 (3.1.1) / 0x8F (5.0), or the connection closes."""
    with RawClient(broker, proto) as c:
        c.connect(f"c-{uid}")
        c.send(raw.subscribe(1, [(filt, 0), ("ok/filter", 1)], proto=proto))
        try:
            pkt = c.read()
        except raw.ConnectionClosed:
            pkt = None
        if pkt is not None and pkt.name == "SUBACK":
            bad = 0x8F if proto == V5 else 0x80
            assert pkt.codes[0] in (bad, 0x80) and pkt.codes[1] == 1, pkt
            c.disconnect()
        elif pkt is not None:
            assert pkt.name == "DISCONNECT" and pkt.reason in MALFORMED | {0x8F}, pkt
            c.expect_closed()
    raw.assert_broker_healthy(broker, proto)


@pytest.mark.parametrize("proto", [V311, V5], ids=["3.1.1", "5.0"])
def test_oversize_packet_closes_with_0x95(make_broker, uid, proto):
    """Packets above max_packet_size: DISCONNECT 0x95 (5.0) then close."""
    addr = make_broker(GATEWAY_MQTT__MAX_PACKET_SIZE=1024)
    with RawClient(addr, proto) as c:
        c.connect(f"c-{uid}")
        c.send(raw.publish(f"{uid}/big", b"x" * 2000, qos=0, proto=proto))
        _expect_dropped(c, {0x95})
    raw.assert_broker_healthy(addr, proto)


def test_oversize_announced_length_closes_before_body(make_broker, uid):
    """A remaining length above the limit is refused without waiting for the body."""
    addr = make_broker(GATEWAY_MQTT__MAX_PACKET_SIZE=1024)
    with RawClient(addr, V5) as c:
        c.connect(f"c-{uid}")
        c.send(b"\x30" + raw.varint(100_000) + raw.utf8("a/b") + b"\x00")
        _expect_dropped(c, {0x95})
    raw.assert_broker_healthy(addr, V5)


@pytest.mark.parametrize(
    "data",
    [
        b"\x10",
        b"\x10\xff",
        raw.connect("x")[:5],
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",
    ],
    ids=["header-only", "partial-length", "partial-connect", "http", "tls-hello"],
)
def test_garbage_before_connect_does_not_hurt(broker, data):
    with RawClient(broker) as c:
        c.send(data)
    raw.assert_broker_healthy(broker)


def test_connect_with_invalid_utf8_client_id_refused(broker):
    with RawClient(broker) as c:
        c.send(raw.connect(b"bad\xff\xfe"))
        seen = c.expect_closed()
        if seen is not None:
            assert seen.name == "CONNACK" and seen.reason != 0, seen
    raw.assert_broker_healthy(broker)


def test_will_topic_with_wildcard_refused(broker, uid):
    """MQTT-3.1.3-11: the will topic must be a valid topic name."""
    with RawClient(broker) as c:
        c.send(raw.connect(f"c-{uid}", will=raw.Will("will/#", b"x")))
        seen = c.expect_closed()
        if seen is not None:
            assert seen.name == "CONNACK" and seen.reason != 0, seen
    raw.assert_broker_healthy(broker)


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
    derandomize=True,
)
@given(data=st.binary(min_size=1, max_size=64))
def test_fuzz_after_connect_never_kills_broker(broker, data):
    """Random bytes after a good CONNECT: the broker may answer or close, never die."""
    with RawClient(broker, V5) as c:
        c.connect("")
        c.send(data)
        try:
            while True:
                c.read(0.05)
        except (raw.Timeout, raw.ConnectionClosed):
            pass
    raw.assert_broker_healthy(broker, V5)
