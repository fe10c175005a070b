"""SUBSCRIBE, PUBLISH, UNSUBSCRIBE: QoS in both directions, topic matching, overlaps, order.

"Nothing arrives" is asserted with a positive control where possible: after the message
that must not arrive, the same publisher sends one that must, and the subscriber's next
PUBLISH has to be that one (a broker delivers one publisher's messages in order).
"""

from __future__ import annotations

import pytest

from . import raw
from .clients import MQTTv5, MQTTv311, PahoClient
from .raw import V5, V311, RawClient


@pytest.fixture
def pub(broker, uid):
    with RawClient(broker) as c:
        c.connect(f"pub-{uid}")
        yield c


@pytest.mark.parametrize("sub_qos", [0, 1, 2])
@pytest.mark.parametrize("pub_qos", [0, 1, 2])
def test_qos_delivery_matrix(broker, uid, pub, pub_qos, sub_qos):
    """MQTT-3.8.4-6 / 4.3: delivered at min(publish QoS, granted QoS), full handshakes."""
    topic = f"{uid}/qos"
    with RawClient(broker) as sub:
        sub.connect(f"sub-{uid}")
        sub.subscribe(topic, sub_qos)
        pub.publish(topic, b"payload", qos=pub_qos)
        got = sub.receive(topic, b"payload", qos=min(pub_qos, sub_qos), retain=False)
        assert not got.dup
        sub.disconnect()


def test_qos2_exact_flow_both_directions_v311(broker, uid):
    topic = f"{uid}/q2"
    with RawClient(broker) as sub, RawClient(broker) as pub:
        sub.connect(f"sub-{uid}")
        sub.send(raw.subscribe(3, topic, 2))
        sub.expect_bytes("SUBACK", raw.suback(3, 2))
        pub.connect(f"pub-{uid}")
        pub.send(raw.publish(topic, b"exact", qos=2, mid=77))
        pub.expect_bytes("PUBREC", raw.pubrec(77))
        pub.send(raw.pubrel(77))
        pub.expect_bytes("PUBCOMP", raw.pubcomp(77))
        got = sub.expect_publish(topic, b"exact", qos=2)
        assert got.raw == raw.publish(topic, b"exact", qos=2, mid=got.mid)
        sub.send(raw.pubrec(got.mid))
        sub.expect_bytes("PUBREL", raw.pubrel(got.mid))
        sub.send(raw.pubcomp(got.mid))
        sub.expect_nothing(0.3)
        sub.disconnect()
        pub.disconnect()


def test_qos1_exact_flow_v5(broker, uid):
    topic = f"{uid}/q1"
    with RawClient(broker, V5) as sub, RawClient(broker, V5) as pub:
        sub.connect(f"sub-{uid}")
        sub.send(raw.subscribe(9, topic, 1, proto=V5))
        sub.expect_bytes("SUBACK", raw.suback(9, 1, proto=V5))
        pub.connect(f"pub-{uid}")
        pub.send(raw.publish(topic, b"v5", qos=1, mid=300, proto=V5))
        ack = pub.expect("PUBACK")
        assert ack.mid == 300 and ack.reason in (0x00, 0x10), ack
        got = sub.expect_publish(topic, b"v5", qos=1)
        sub.send(raw.puback(got.mid, proto=V5))
        sub.disconnect()
        pub.disconnect()


def test_publish_without_subscribers_v5_acked(broker, uid):
    """PUBACK/PUBREC reason 0x00 or 0x10 (no matching subscribers) - both are success."""
    with RawClient(broker, V5) as c:
        c.connect(f"c-{uid}")
        c.send(raw.publish(f"{uid}/nobody", b"x", qos=1, mid=5, proto=V5))
        assert c.expect("PUBACK").reason in (0x00, 0x10)
        c.send(raw.publish(f"{uid}/nobody", b"x", qos=2, mid=6, proto=V5))
        assert c.expect("PUBREC").reason in (0x00, 0x10)
        c.send(raw.pubrel(6, proto=V5))
        comp = c.expect("PUBCOMP")
        assert comp.mid == 6 and comp.reason == 0
        c.disconnect()


# (filter, topic, matches, control topic that does match when the topic must not)
MATCHING = [
    ("{p}/a/b", "{p}/a/b", True, None),
    ("{p}/a/b", "{p}/a/B", False, "{p}/a/b"),
    ("{p}/+/b", "{p}/x/b", True, None),
    ("{p}/+/b", "{p}/x/c", False, "{p}/y/b"),
    ("{p}/+/b", "{p}/x/y/b", False, "{p}/y/b"),
    ("{p}/+", "{p}/", True, None),
    ("{p}/+/+", "{p}/x/y", True, None),
    ("{p}/#", "{p}", True, None),
    ("{p}/#", "{p}/x/y/z", True, None),
    ("{p}/a/#", "{p}/b", False, "{p}/a/z"),
    ("{p}//b", "{p}//b", True, None),
    ("{p}/+/+", "{p}//", True, None),
    ("+/{p}", "/{p}", True, None),
    ("#", "{p}/any/depth", True, None),
    ("+/+", "{p}/one", True, None),
    ("+", "{p}/two", False, "{p}"),
    ("#", "${p}/x", False, "{p}/x"),
    ("+/x", "${p}/x", False, "{p}/x"),
    ("+/#", "$SYS{p}/x", False, "{p}/x"),
    ("#", "$SYS/{p}", False, "{p}/x"),
    ("${p}/#", "${p}/x", True, None),
    ("${p}/+", "${p}/x", True, None),
]


@pytest.mark.parametrize(
    ("filt", "topic", "matches", "control"),
    MATCHING,
    ids=[f"{f}~{t}" for f, t, _, _ in MATCHING],
)
def test_topic_matching(broker, uid, pub, filt, topic, matches, control):
    """4.7: + and # semantics; MQTT-4.7.2-1: leading wildcards never match $-topics."""
    filt, topic = filt.format(p=uid), topic.format(p=uid)
    with RawClient(broker) as sub:
        sub.connect(f"sub-{uid}")
        sub.subscribe(filt, 1)
        pub.publish(topic, b"probe", qos=1)
        if matches:
            sub.receive(topic, b"probe")
        else:
            control = control.format(p=uid)
            pub.publish(control, b"control", qos=1)
            got = sub.receive()
            assert (got.topic, got.payload) == (control, b"control"), (
                f"{filt!r} matched {got.topic!r}"
            )
        sub.disconnect()


def test_hash_subscriber_never_sees_sys(broker, uid, pub):
    """MQTT-4.7.2-1: '#' does not match $SYS/... even while the broker publishes them
    (client connect/disconnect events are typical $SYS traffic, so cause some)."""
    with RawClient(broker) as sub:
        sub.connect(f"sub-{uid}")
        sub.subscribe("#", 0)
        for i in range(3):
            with RawClient(broker, V5) as churn:
                churn.connect(f"churn{i}-{uid}")
                churn.disconnect()
            pub.publish(f"{uid}/tick", str(i).encode(), qos=1)
            got = sub.receive(f"{uid}/tick")
            assert not got.topic.startswith("$")
        sub.disconnect()


@pytest.mark.gateway_only  # mosquitto sends one copy per matching subscription
@pytest.mark.parametrize("proto", [V311, V5], ids=["3.1.1", "5.0"])
def test_overlapping_subscriptions_one_copy_highest_qos(broker, uid, proto):
    """MQTT-3.3.5-1 (and 5.0 3.3.4): one copy at the maximum QoS of the matching subs."""
    topic = f"{uid}/a/b"
    with RawClient(broker, proto) as sub, RawClient(broker) as pub:
        sub.connect(f"sub-{uid}")
        sub.subscribe(f"{uid}/a/+", 1)
        sub.subscribe(f"{uid}/#", 2)
        sub.subscribe(f"{uid}/a/b", 0)
        pub.connect(f"pub-{uid}")
        pub.publish(topic, b"one", qos=2)
        pub.publish(topic, b"end", qos=2)
        sub.receive(topic, b"one", qos=2)
        sub.receive(topic, b"end", qos=2)  # not a second copy of "one"
        sub.disconnect()
        pub.disconnect()


@pytest.mark.gateway_only  # mosquitto sends one copy per matching subscription
def test_overlapping_subscriptions_carry_every_subscription_identifier(broker, uid):
    """5.0 3.3.4: the single copy carries the identifiers of all matching subscriptions."""
    topic = f"{uid}/a/b"
    with RawClient(broker, V5) as sub, RawClient(broker, V5) as pub:
        sub.connect(f"sub-{uid}")
        sub.subscribe(f"{uid}/a/+", 1, properties=[(raw.SUBSCRIPTION_IDENTIFIER, 11)])
        sub.subscribe(f"{uid}/#", 2, properties=[(raw.SUBSCRIPTION_IDENTIFIER, 222)])
        sub.subscribe(f"{uid}/+/b", 0)  # no identifier
        pub.connect(f"pub-{uid}")
        pub.publish(topic, b"one", qos=2)
        pub.publish(topic, b"end", qos=1)
        got = sub.receive(topic, b"one", qos=2)
        assert sorted(got.props.all(raw.SUBSCRIPTION_IDENTIFIER)) == [11, 222], got
        sub.receive(topic, b"end", qos=1)
        sub.disconnect()
        pub.disconnect()


def test_resubscribe_replaces_subscription(broker, uid, pub):
    """MQTT-3.8.4-3: the same filter again replaces the subscription (new QoS, one copy)."""
    topic = f"{uid}/re"
    with RawClient(broker) as sub:
        sub.connect(f"sub-{uid}")
        sub.subscribe(topic, 0)
        sub.subscribe(topic, 2)
        pub.publish(topic, b"one", qos=2)
        pub.publish(topic, b"end", qos=2)
        sub.receive(topic, b"one", qos=2)
        sub.receive(topic, b"end", qos=2)
        sub.disconnect()


@pytest.mark.parametrize("proto", [V311, V5], ids=["3.1.1", "5.0"])
def test_subscribe_many_filters_one_suback(broker, uid, proto):
    """MQTT-3.8.4-4/5: one SUBACK, one return code per filter, in order."""
    with RawClient(broker, proto) as c:
        c.connect(f"c-{uid}")
        c.subscribe([(f"{uid}/0", 0), (f"{uid}/1", 1), (f"{uid}/2", 2)], codes=[0, 1, 2])
        c.disconnect()


@pytest.mark.parametrize("proto", [V311, V5], ids=["3.1.1", "5.0"])
def test_unsubscribe_stops_delivery(broker, uid, pub, proto):
    topic = f"{uid}/u"
    with RawClient(broker, proto) as sub:
        sub.connect(f"sub-{uid}")
        sub.subscribe(topic, 1)
        sub.subscribe(f"{uid}/control", 1)
        pub.publish(topic, b"before", qos=1)
        sub.receive(topic, b"before")
        ack = sub.unsubscribe(topic)
        if proto == V5:
            assert ack.codes == [0x00], ack
        else:
            assert ack.raw == raw.unsuback(ack.mid)
        pub.publish(topic, b"after", qos=1)
        pub.publish(f"{uid}/control", b"control", qos=1)
        sub.receive(f"{uid}/control", b"control")
        sub.disconnect()


def test_unsubscribe_unknown_filter_v5(broker, uid):
    """5.0 3.11.3: UNSUBACK 0x11 (no subscription existed) or 0x00, one code per filter."""
    with RawClient(broker, V5) as c:
        c.connect(f"c-{uid}")
        c.subscribe(f"{uid}/known", 0)
        ack = c.unsubscribe([f"{uid}/unknown", f"{uid}/known"])
        assert len(ack.codes) == 2 and ack.codes[0] in (0x00, 0x11) and ack.codes[1] == 0, ack
        c.disconnect()


def test_order_preserved_qos1(broker, uid, pub):
    """MQTT-4.6.0-5: messages from one publisher reach a subscriber in order."""
    topic = f"{uid}/order"
    with RawClient(broker) as sub:
        sub.connect(f"sub-{uid}")
        sub.subscribe(topic, 1)
        for i in range(30):
            pub.send(raw.publish(topic, str(i).encode(), qos=1, mid=i + 1))
        for i in range(30):
            assert pub.expect("PUBACK").mid == i + 1
        for i in range(30):
            sub.receive(topic, str(i).encode())
        sub.disconnect()


def test_own_messages_delivered_back(broker, uid):
    with RawClient(broker) as c:
        c.connect(f"c-{uid}")
        c.subscribe(f"{uid}/self", 2)
        c.publish(f"{uid}/self", b"echo", qos=2)
        c.receive(f"{uid}/self", b"echo", qos=2)
        c.disconnect()


@pytest.mark.parametrize(
    "payload", [b"", bytes(range(256)) * 4, b"\xab" * 300_000], ids=["empty", "binary", "300k"]
)
def test_payload_delivered_intact(broker, uid, pub, payload):
    topic = f"{uid}/payload"
    with RawClient(broker) as sub:
        sub.connect(f"sub-{uid}")
        sub.subscribe(topic, 1)
        pub.publish(topic, payload, qos=1)
        sub.receive(topic, payload, timeout=10)
        sub.disconnect()


def test_unicode_topic(broker, uid, pub):
    topic = f"{uid}/température/水/🙂"
    with RawClient(broker) as sub:
        sub.connect(f"sub-{uid}")
        sub.subscribe(f"{uid}/+/水/#", 1)
        pub.publish(topic, b"u", qos=1)
        sub.receive(topic, b"u")
        sub.disconnect()


@pytest.mark.parametrize("protocol", [MQTTv311, MQTTv5], ids=["3.1.1", "5.0"])
@pytest.mark.parametrize("qos", [0, 1, 2])
def test_paho_roundtrip(broker, uid, protocol, qos):
    topic = f"{uid}/paho"
    with (
        PahoClient(broker, protocol=protocol, client_id=f"s-{uid}") as sub,
        PahoClient(broker, protocol=protocol, client_id=f"p-{uid}") as pub,
    ):
        sub.connect()
        pub.connect()
        sub.subscribe(topic, qos)
        pub.publish(topic, b"hello paho", qos=qos)
        msg = sub.get()
        assert (msg.topic, msg.payload, msg.qos, msg.retain) == (topic, b"hello paho", qos, False)
