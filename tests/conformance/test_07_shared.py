"""Shared subscriptions ($share/<group>/<filter>, $queue/<filter>): distribution, no loss.

Deliveries across group members are read with ``raw.collect`` (whichever socket is
readable), so the tests do not depend on which member the strategy picks.
"""

from __future__ import annotations

from collections import Counter

import pytest

from . import raw
from .raw import V5, V311, RawClient, collect


@pytest.fixture
def pub(broker, uid):
    with RawClient(broker) as c:
        c.connect(f"pub-{uid}")
        yield c
        c.disconnect()


def _members(addr, uid: str, filt: str, n: int = 2, proto: int = V311, qos: int = 1):
    members = []
    for i in range(n):
        c = RawClient(addr, proto)
        c.connect(f"m{i}-{uid}")
        c.subscribe(filt, qos)
        members.append(c)
    return members


@pytest.mark.parametrize("proto", [V311, V5], ids=["3.1.1", "5.0"])
def test_share_round_robin_between_two_members(make_broker, uid, proto):
    addr = make_broker(GATEWAY_MQTT__SHARED_SUBSCRIPTION_STRATEGY="round_robin")
    topic = f"{uid}/rr"
    a, b = _members(addr, uid, f"$share/g/{topic}", proto=proto)
    with RawClient(addr) as pub:
        pub.connect(f"pub-{uid}")
        for i in range(10):
            pub.publish(topic, str(i).encode(), qos=1)
        got = collect([a, b], 10)
        pub.disconnect()
    payloads = [p.payload for _, p in got]
    assert sorted(payloads) == sorted(str(i).encode() for i in range(10)), payloads
    per_member = Counter(id(c) for c, _ in got)
    assert sorted(per_member.values()) == [5, 5], f"not round robin: {per_member}"
    for c in (a, b):
        c.disconnect()


def test_share_each_message_once_per_group(broker, uid, pub):
    """Every group gets each message once; a plain subscription gets its own copy."""
    topic = f"{uid}/groups"
    g1 = _members(broker, uid + "g1", f"$share/g1/{topic}")
    g2 = _members(broker, uid + "g2", f"$share/g2/{uid}/+")
    with RawClient(broker) as plain:
        plain.connect(f"plain-{uid}")
        plain.subscribe(topic, 1)
        for i in range(6):
            pub.publish(topic, str(i).encode(), qos=1)
        expected = sorted(str(i).encode() for i in range(6))
        assert sorted(p.payload for _, p in collect(g1, 6)) == expected
        assert sorted(p.payload for _, p in collect(g2, 6)) == expected
        for i in range(6):
            plain.receive(topic, str(i).encode())
        # Nothing extra for anyone: a final message is the next thing each group sees.
        pub.publish(topic, b"end", qos=1)
        assert [p.payload for _, p in collect(g1, 1)] == [b"end"]
        assert [p.payload for _, p in collect(g2, 1)] == [b"end"]
        plain.receive(topic, b"end")
        plain.disconnect()
    for c in g1 + g2:
        c.disconnect()


def test_share_qos_is_min_of_publish_and_granted(broker, uid, pub):
    topic = f"{uid}/qos"
    (member,) = _members(broker, uid, f"$share/g/{topic}", n=1, qos=1)
    pub.publish(topic, b"two", qos=2)
    member.receive(topic, b"two", qos=1)
    member.disconnect()


def test_member_leaving_loses_nothing(broker, uid, pub):
    """After a member disconnects, every message goes to the remaining member."""
    topic = f"{uid}/leave"
    a, b = _members(broker, uid, f"$share/g/{topic}")
    for i in range(4):
        pub.publish(topic, f"before{i}".encode(), qos=1)
    collect([a, b], 4)
    a.disconnect()
    for i in range(6):
        pub.publish(topic, f"after{i}".encode(), qos=1)
    for i in range(6):
        b.receive(topic, f"after{i}".encode(), qos=1)
    b.disconnect()


def test_member_unsubscribing_loses_nothing(broker, uid, pub):
    topic = f"{uid}/unsub"
    a, b = _members(broker, uid, f"$share/g/{topic}")
    a.unsubscribe(f"$share/g/{topic}")
    for i in range(4):
        pub.publish(topic, str(i).encode(), qos=1)
    for i in range(4):
        b.receive(topic, str(i).encode(), qos=1)
    a.ping()  # and nothing was sent to a
    a.expect_nothing(0.2)
    for c in (a, b):
        c.disconnect()


# mosquitto drops what was in flight to a member that goes away; the gateway re-dispatches
# it to another member (REFERENCE.md: "shared subscriptions losing messages when a member
# leaves" is a common complaint to do better on).
@pytest.mark.gateway_only
def test_unacked_messages_of_a_dead_member_go_to_another(broker, uid, pub):
    topic = f"{uid}/dead"
    a, b = _members(broker, uid, f"$share/g/{topic}")
    for i in range(6):
        pub.publish(topic, str(i).encode(), qos=1)
    got = collect([a, b], 6, ack=False)
    for c, p in got:
        if c is b:
            b.ack(p)
    stranded = {p.payload for c, p in got if c is a}
    assert stranded, "round robin gave member a nothing"
    a.abort()  # never acknowledged; session expiry 0
    redelivered = {b.receive(topic, qos=1).payload for _ in stranded}
    assert redelivered == stranded
    b.disconnect()


@pytest.mark.gateway_only  # $queue/ is an EMQX extension mosquitto does not have
def test_queue_prefix_shares_between_members(broker, uid, pub):
    topic = f"{uid}/q"
    a, b = _members(broker, uid, f"$queue/{topic}")
    for i in range(10):
        pub.publish(topic, str(i).encode(), qos=1)
    got = collect([a, b], 10)
    assert sorted(p.payload for _, p in got) == sorted(str(i).encode() for i in range(10))
    assert len({id(c) for c, _ in got}) == 2, "both members should get messages"
    for c in (a, b):
        c.disconnect()


def test_shared_wildcard_filter(broker, uid, pub):
    (member,) = _members(broker, uid, f"$share/g/{uid}/#", n=1)
    pub.publish(f"{uid}/x/y", b"deep", qos=1)
    member.receive(f"{uid}/x/y", b"deep")
    member.disconnect()


@pytest.mark.gateway_only  # mosquitto 2.0.11 grants it (SUBACK 0x01)
def test_no_local_on_shared_subscription_is_protocol_error_v5(broker, uid):
    """MQTT-3.8.3-4: No Local on a shared subscription is a protocol error."""
    with RawClient(broker, V5) as c:
        c.connect(f"c-{uid}")
        c.send(
            raw.subscribe(1, [(f"$share/g/{uid}/t", raw.sub_options(1, no_local=True))], proto=V5)
        )
        c.expect_closed(disconnect_reasons={0x82})


# mosquitto 2.0.11 grants "$share/g" and "$share//t" (empty share name) as plain filters.
@pytest.mark.parametrize(
    "filt",
    [
        pytest.param("$share/g", marks=pytest.mark.gateway_only),
        pytest.param("$share//t", marks=pytest.mark.gateway_only),
        "$share/g+/t",
        "$share/g#/t",
    ],
)
def test_invalid_shared_filter_refused(broker, uid, filt):
    """MQTT-4.8.2-1/2: a non-empty share name without wildcards, then "/" and a filter."""
    with RawClient(broker, V5) as c:
        c.connect(f"c-{uid}")
        c.send(raw.subscribe(1, filt, 1, proto=V5))
        try:
            pkt = c.read()
        except raw.ConnectionClosed:
            pkt = None
        if pkt is not None and pkt.name == "SUBACK":
            assert pkt.codes == [0x8F] or pkt.codes[0] >= 0x80, pkt
        elif pkt is not None:
            assert pkt.name == "DISCONNECT" and pkt.reason >= 0x80, pkt
    raw.assert_broker_healthy(broker)
