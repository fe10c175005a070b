"""MQTT 5 properties: pass-through, request/response, message expiry, topic aliases,
maximum packet size, subscription identifiers, no-local, reason strings.

Expiry tests let time pass on the broker's own clock (``raw.wait_broker_seconds``: a
delayed will acts as the timer) instead of sleeping.
"""

from __future__ import annotations

import pytest
from paho.mqtt.packettypes import PacketTypes

from . import raw
from .clients import MQTTv5, PahoClient, v5_properties
from .raw import V5, RawClient


@pytest.fixture
def pub(broker, uid):
    with RawClient(broker, V5) as c:
        c.connect(f"pub-{uid}")
        yield c
        c.disconnect()


@pytest.fixture
def sub(broker, uid):
    """A v5 subscriber to ``<uid>/#`` at QoS 1."""
    with RawClient(broker, V5) as c:
        c.connect(f"sub-{uid}")
        c.subscribe(f"{uid}/#", 1)
        yield c
        c.disconnect()


def test_application_properties_passed_through(uid, pub, sub):
    """MQTT-3.3.2-17/18: user properties forwarded unaltered and in order; others too."""
    topic = f"{uid}/props"
    sent = [
        (raw.USER_PROPERTY, ("b", "2")),
        (raw.USER_PROPERTY, ("a", "1")),
        (raw.USER_PROPERTY, ("a", "1")),
        (raw.USER_PROPERTY, ("ünï", "cødé")),
        (raw.CONTENT_TYPE, "application/json; charset=utf-8"),
        (raw.PAYLOAD_FORMAT_INDICATOR, 1),
        (raw.RESPONSE_TOPIC, f"{uid}/reply"),
        (raw.CORRELATION_DATA, b"\x00\xffcorr"),
    ]
    pub.publish(topic, b'{"t": 21.5}', qos=1, properties=sent)
    got = sub.receive(topic, b'{"t": 21.5}', qos=1)
    assert got.props.user == [("b", "2"), ("a", "1"), ("a", "1"), ("ünï", "cødé")]
    assert got.props.get(raw.CONTENT_TYPE) == "application/json; charset=utf-8"
    assert got.props.get(raw.PAYLOAD_FORMAT_INDICATOR) == 1
    assert got.props.get(raw.RESPONSE_TOPIC) == f"{uid}/reply"
    assert got.props.get(raw.CORRELATION_DATA) == b"\x00\xffcorr"
    assert not (got.props.ids() - raw.PUBLISH_PROPS)


def test_request_response_with_paho(broker, uid):
    """A paho requester and a raw responder exchange a request/response pair."""
    req_topic, resp_topic = f"{uid}/req", f"{uid}/resp"
    with (
        RawClient(broker, V5) as responder,
        PahoClient(broker, protocol=MQTTv5, client_id=f"req-{uid}") as requester,
    ):
        responder.connect(f"resp-{uid}")
        responder.subscribe(req_topic, 1)
        requester.connect()
        requester.subscribe(resp_topic, 1)
        props = v5_properties(
            PacketTypes.PUBLISH, ResponseTopic=resp_topic, CorrelationData=b"id-42"
        )
        requester.publish(req_topic, b"ping?", qos=1, properties=props)
        req = responder.receive(req_topic, b"ping?", qos=1)
        reply_to = req.props.get(raw.RESPONSE_TOPIC)
        corr = req.props.get(raw.CORRELATION_DATA)
        assert (reply_to, corr) == (resp_topic, b"id-42")
        responder.publish(reply_to, b"pong!", qos=1, properties=[(raw.CORRELATION_DATA, corr)])
        msg = requester.get()
        assert (msg.topic, msg.payload) == (resp_topic, b"pong!")
        assert getattr(msg.properties, "CorrelationData", None) == b"id-42"
        responder.disconnect()


def test_message_expiry_interval_forwarded_and_not_increased(uid, pub, sub):
    topic = f"{uid}/exp"
    pub.publish(topic, b"x", qos=1, properties=[(raw.MESSAGE_EXPIRY_INTERVAL, 120)])
    got = sub.receive(topic, b"x")
    remaining = got.props.get(raw.MESSAGE_EXPIRY_INTERVAL)
    assert isinstance(remaining, int) and 0 < remaining <= 120, got


def test_expired_messages_not_delivered(broker, uid, pub):
    """MQTT-3.3.2-5: once expired, a queued or retained message is not delivered; the
    others are, with their remaining expiry (MQTT-3.3.2-6). One wait serves both cases."""
    cid, topic, retained = f"c-{uid}", f"{uid}/offline", f"{uid}/retexp"
    with RawClient(broker, V5) as c:
        c.connect(cid, properties=[(raw.SESSION_EXPIRY_INTERVAL, 300)])
        c.subscribe(topic, 1)
        c.disconnect()
    pub.publish(topic, b"short", qos=1, properties=[(raw.MESSAGE_EXPIRY_INTERVAL, 1)])
    pub.publish(topic, b"long", qos=1, properties=[(raw.MESSAGE_EXPIRY_INTERVAL, 60)])
    pub.publish(topic, b"forever", qos=1)
    pub.publish(
        retained, b"brief", qos=1, retain=True, properties=[(raw.MESSAGE_EXPIRY_INTERVAL, 1)]
    )
    raw.wait_broker_seconds(broker, 2)
    with RawClient(broker, V5) as c:
        assert c.connect(cid, clean=False).session_present
        got = c.receive(topic, qos=1)
        assert got.payload == b"long", f"expired message delivered: {got!r}"
        remaining = got.props.get(raw.MESSAGE_EXPIRY_INTERVAL)
        assert isinstance(remaining, int) and 0 < remaining < 60, f"not decremented: {got!r}"
        forever = c.receive(topic, b"forever", qos=1)
        assert raw.MESSAGE_EXPIRY_INTERVAL not in forever.props
        c.subscribe(retained, 1)
        pub.publish(retained, b"control", qos=1)
        got = c.receive(retained)
        assert got.payload == b"control" and not got.retain, f"expired retained sent: {got!r}"
        c.disconnect()


def test_topic_alias_from_client(uid, pub, sub):
    """3.3.2.3.4: an alias set with a topic may replace the topic (empty) later."""
    t1, t2 = f"{uid}/alias/one", f"{uid}/alias/two"
    pub.publish(t1, b"a", qos=1, properties=[(raw.TOPIC_ALIAS, 1)])
    pub.publish("", b"b", qos=1, properties=[(raw.TOPIC_ALIAS, 1)])
    pub.publish(t2, b"c", qos=1, properties=[(raw.TOPIC_ALIAS, 1)])  # remapped
    pub.publish("", b"d", qos=1, properties=[(raw.TOPIC_ALIAS, 1)])
    for topic, payload in ((t1, b"a"), (t1, b"b"), (t2, b"c"), (t2, b"d")):
        got = sub.receive(topic, payload)
        assert raw.TOPIC_ALIAS not in got.props, "subscriber allowed no aliases (max 0)"


def test_topic_alias_zero_is_invalid(broker, uid):
    """MQTT-3.3.2-8: alias 0 is a protocol error (DISCONNECT 0x94)."""
    with RawClient(broker, V5) as c:
        c.connect(f"c-{uid}")
        c.send(raw.publish(f"{uid}/t", b"x", qos=0, proto=V5, properties=[(raw.TOPIC_ALIAS, 0)]))
        c.expect_closed(disconnect_reasons={0x94, 0x82, 0x81})
    raw.assert_broker_healthy(broker, V5)


def test_topic_alias_above_maximum_is_invalid(make_broker, uid):
    """MQTT-3.3.2-9: an alias above the server's Topic Alias Maximum -> 0x94."""
    addr = make_broker(GATEWAY_MQTT__MAX_TOPIC_ALIAS=2)
    with RawClient(addr, V5) as c:
        ack = c.connect(f"c-{uid}")
        assert ack.props.get(raw.TOPIC_ALIAS_MAXIMUM) == 2, ack
        c.send(raw.publish(f"{uid}/t", b"x", qos=0, proto=V5, properties=[(raw.TOPIC_ALIAS, 3)]))
        c.expect_closed(disconnect_reasons={0x94, 0x82})


def test_unknown_topic_alias_is_protocol_error(broker, uid):
    """3.3.2.3.4: an empty topic with an alias the server has no mapping for."""
    with RawClient(broker, V5) as c:
        c.connect(f"c-{uid}")
        c.send(raw.publish("", b"x", qos=0, proto=V5, properties=[(raw.TOPIC_ALIAS, 1)]))
        c.expect_closed(disconnect_reasons={0x82, 0x94})


def test_topic_alias_to_client_within_its_maximum(broker, uid, pub):
    """MQTT-3.3.2-10/11: server aliases (if used) never exceed the client's maximum and
    always resolve; the client sees every message on its real topic."""
    topics = [f"{uid}/ta/{i}" for i in range(5)]
    with RawClient(broker, V5) as c:
        c.connect(f"c-{uid}", properties=[(raw.TOPIC_ALIAS_MAXIMUM, 2)])
        c.subscribe(f"{uid}/ta/#", 1)
        sequence = [topics[i % 5] for i in range(15)] + [topics[0]] * 3
        for n, topic in enumerate(sequence):
            pub.publish(topic, str(n).encode(), qos=1)
        aliases: dict[int, str] = {}
        for n, topic in enumerate(sequence):
            got = c.receive(payload=str(n).encode())
            alias = got.props.get(raw.TOPIC_ALIAS)
            if alias is not None:
                assert isinstance(alias, int) and 1 <= alias <= 2, got
                if got.topic:
                    aliases[alias] = got.topic
                assert alias in aliases, f"alias {alias} used before being set: {got!r}"
                resolved = aliases[alias]
            else:
                resolved = got.topic
            assert resolved == topic, f"message {n} resolved to {resolved!r}, want {topic!r}"
        c.disconnect()


def test_maximum_packet_size_of_client_respected(broker, uid, pub):
    """MQTT-3.1.2-25: a message bigger than the client's maximum is not sent to it."""
    topic = f"{uid}/big"
    with RawClient(broker, V5) as c:
        c.connect(f"c-{uid}", properties=[(raw.MAXIMUM_PACKET_SIZE, 256)])
        c.subscribe(topic, 1)
        pub.publish(topic, b"x" * 1000, qos=1)
        pub.publish(topic, b"small", qos=1)
        got = c.receive(topic)
        assert got.payload == b"small", f"oversize message delivered: {len(got.raw)} bytes"
        c.ping()
        c.disconnect()


def test_server_advertises_configured_maximum_packet_size(make_broker, uid):
    addr = make_broker(GATEWAY_MQTT__MAX_PACKET_SIZE=2048)
    with RawClient(addr, V5) as c:
        ack = c.connect(f"c-{uid}")
        assert ack.props.get(raw.MAXIMUM_PACKET_SIZE) == 2048, ack
        c.disconnect()


def test_subscription_identifier_delivered(broker, uid, pub):
    """MQTT-3.3.4-3: the PUBLISH carries the matching subscription's identifier."""
    with RawClient(broker, V5) as c:
        c.connect(f"c-{uid}")
        c.subscribe(f"{uid}/sid/+", 1, properties=[(raw.SUBSCRIPTION_IDENTIFIER, 268435455)])
        c.subscribe(f"{uid}/plain", 1)
        pub.publish(f"{uid}/sid/x", b"with", qos=1)
        pub.publish(f"{uid}/plain", b"without", qos=1)
        got = c.receive(f"{uid}/sid/x", b"with")
        assert got.props.all(raw.SUBSCRIPTION_IDENTIFIER) == [268435455]
        got = c.receive(f"{uid}/plain", b"without")
        assert raw.SUBSCRIPTION_IDENTIFIER not in got.props
        c.disconnect()


def test_subscription_identifier_on_retained(broker, uid, pub):
    topic = f"{uid}/sidret"
    pub.publish(topic, b"kept", qos=1, retain=True)
    with RawClient(broker, V5) as c:
        c.connect(f"c-{uid}")
        c.subscribe(topic, 1, properties=[(raw.SUBSCRIPTION_IDENTIFIER, 7)])
        got = c.receive(topic, b"kept", retain=True)
        assert got.props.all(raw.SUBSCRIPTION_IDENTIFIER) == [7]
        c.disconnect()
    pub.publish(topic, b"", qos=1, retain=True)


def test_resubscribe_replaces_subscription_identifier(broker, uid, pub):
    topic = f"{uid}/sidre"
    with RawClient(broker, V5) as c:
        c.connect(f"c-{uid}")
        c.subscribe(topic, 1, properties=[(raw.SUBSCRIPTION_IDENTIFIER, 1)])
        c.subscribe(topic, 1, properties=[(raw.SUBSCRIPTION_IDENTIFIER, 2)])
        pub.publish(topic, b"x", qos=1)
        assert c.receive(topic, b"x").props.all(raw.SUBSCRIPTION_IDENTIFIER) == [2]
        c.disconnect()


def test_no_local(broker, uid):
    """MQTT-3.8.3-3: with No Local the client's own messages are not sent back to it."""
    topic, control = f"{uid}/nl", f"{uid}/control"
    with RawClient(broker, V5) as c, RawClient(broker, V5) as other:
        c.connect(f"c-{uid}")
        c.subscribe([(topic, raw.sub_options(1, no_local=True))], codes=[1])
        c.subscribe(control, 1)
        c.publish(topic, b"mine", qos=1)
        c.publish(control, b"control", qos=1)
        got = c.receive()
        assert (got.topic, got.payload) == (control, b"control"), f"own message: {got!r}"
        other.connect(f"o-{uid}")
        other.publish(topic, b"theirs", qos=1)
        c.receive(topic, b"theirs")
        c.disconnect()
        other.disconnect()


def test_no_reason_string_when_problem_information_not_requested(broker, uid):
    """MQTT-3.1.2-29: Request Problem Information 0 -> no Reason String or User Property
    on anything but PUBLISH, CONNACK and DISCONNECT."""
    with RawClient(broker, V5) as c:
        c.connect(f"c-{uid}", properties=[(raw.REQUEST_PROBLEM_INFORMATION, 0)])
        acks = [
            c.subscribe(f"{uid}/t", 1),
            c.subscribe(f"{uid}/x", 2),
            c.unsubscribe([f"{uid}/never-subscribed"]),
        ]
        mid = c.publish(f"{uid}/nobody", b"x", qos=1)
        assert mid
        c.send(raw.publish(f"{uid}/nobody", b"x", qos=2, mid=500, proto=V5))
        acks.append(c.expect("PUBREC"))
        c.send(raw.pubrel(500, proto=V5))
        acks.append(c.expect("PUBCOMP"))
        c.send(raw.pubrel(501, proto=V5))  # unknown id: PUBCOMP, maybe 0x92
        acks.append(c.expect("PUBCOMP"))
        for ack in acks:
            assert raw.REASON_STRING not in ack.props, ack
            assert raw.USER_PROPERTY not in ack.props, ack
        c.disconnect()


@pytest.mark.gateway_only  # mosquitto sends no reason strings at all
def test_protocol_error_disconnect_has_reason_string(broker, uid):
    """3.14.2.2.3: the gateway explains its DISCONNECTs with a reason string."""
    with RawClient(broker, V5) as c:
        c.connect(f"c-{uid}")
        c.send(raw.publish(f"{uid}/t", b"x", qos=0, proto=V5, properties=[(raw.TOPIC_ALIAS, 0)]))
        seen = c.expect_closed(require_disconnect=True)
        assert seen is not None
        reason = seen.props.get(raw.REASON_STRING)
        assert isinstance(reason, str) and reason, seen
