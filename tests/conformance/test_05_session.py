"""Sessions: persistence, offline queueing, session present, expiry, redelivery with DUP.

Session expiry is observed through an event, not a sleep: the expiring client carries a
will with a long delay, and the will is published when the session ends (5.0 3.1.3.2.2).
"""

from __future__ import annotations

from typing import Any

import pytest

from . import raw
from .raw import V5, V311, RawClient

SEI = raw.SESSION_EXPIRY_INTERVAL


def _persistent_kw(proto: int, expiry: int = 300) -> dict[str, Any]:
    """Connect arguments for a session that outlives the connection."""
    if proto == V5:
        return {"clean": False, "properties": [(SEI, expiry)]}
    return {"clean": False}


def _discard(addr, cid: str, proto: int = V311) -> None:
    with RawClient(addr, proto) as c:
        c.connect(cid, clean=True)
        c.disconnect()


@pytest.fixture
def pub(broker, uid):
    with RawClient(broker) as c:
        c.connect(f"pub-{uid}")
        yield c
        c.disconnect()


@pytest.mark.parametrize("proto", [V311, V5], ids=["3.1.1", "5.0"])
def test_persistent_session_keeps_subscription_and_queues(broker, uid, pub, proto):
    """MQTT-3.1.2-4/5: subscriptions kept; QoS 1 and 2 messages queued while offline."""
    cid, topic = f"c-{uid}", f"{uid}/offline"
    with RawClient(broker, proto) as c:
        assert not c.connect(cid, **_persistent_kw(proto)).session_present
        c.subscribe(topic, 2)
        c.disconnect()
    pub.publish(topic, b"q1", qos=1)
    pub.publish(topic, b"q2", qos=2)
    with RawClient(broker, proto) as c:
        ack = c.connect(cid, **_persistent_kw(proto))
        assert ack.session_present, "MQTT-3.2.2-2: session present must be 1"
        c.receive(topic, b"q1", qos=1)
        c.receive(topic, b"q2", qos=2)
        pub.publish(topic, b"live", qos=1)  # the subscription survived too
        c.receive(topic, b"live", qos=1)
        c.disconnect()
    _discard(broker, cid, proto)


def test_offline_queue_keeps_order(broker, uid, pub):
    cid, topic = f"c-{uid}", f"{uid}/order"
    with RawClient(broker) as c:
        c.connect(cid, clean=False)
        c.subscribe(topic, 1)
        c.disconnect()
    for i in range(20):
        pub.publish(topic, str(i).encode(), qos=1)
    with RawClient(broker) as c:
        assert c.connect(cid, clean=False).session_present
        for i in range(20):
            c.receive(topic, str(i).encode(), qos=1)
        c.disconnect()
    _discard(broker, cid)


@pytest.mark.gateway_only  # optional in the spec; mosquitto's queue_qos0_messages is off
def test_offline_queue_stores_qos0_by_default(broker, uid, pub):
    cid, topic = f"c-{uid}", f"{uid}/q0"
    with RawClient(broker) as c:
        c.connect(cid, clean=False)
        c.subscribe(topic, 1)
        c.disconnect()
    pub.publish(topic, b"zero", qos=0)
    pub.publish(topic, b"one", qos=1)
    with RawClient(broker) as c:
        c.connect(cid, clean=False)
        c.receive(topic, b"zero", qos=0)
        c.receive(topic, b"one", qos=1)
        c.disconnect()
    _discard(broker, cid)


def test_clean_session_discards_queue_v311(broker, uid, pub):
    cid, topic = f"c-{uid}", f"{uid}/gone"
    with RawClient(broker) as c:
        c.connect(cid, clean=False)
        c.subscribe(topic, 1)
        c.disconnect()
    pub.publish(topic, b"lost", qos=1)
    with RawClient(broker) as c:
        assert not c.connect(cid, clean=True).session_present
        c.subscribe(f"{uid}/control", 1)
        pub.publish(topic, b"after", qos=1)  # no subscription any more
        pub.publish(f"{uid}/control", b"control", qos=1)
        c.receive(f"{uid}/control", b"control")
        c.disconnect()


def test_session_expiry_zero_ends_with_connection_v5(broker, uid, pub):
    """5.0 3.1.2.11.2: expiry 0 (the default) ends the session when the connection closes."""
    cid, topic = f"c-{uid}", f"{uid}/sei0"
    with RawClient(broker, V5) as c:
        c.connect(cid, clean=False)
        c.subscribe(topic, 1)
        c.disconnect()
    pub.publish(topic, b"lost", qos=1)
    with RawClient(broker, V5) as c:
        assert not c.connect(cid, clean=False).session_present
        c.subscribe(f"{uid}/control", 1)
        pub.publish(topic, b"after", qos=1)
        pub.publish(f"{uid}/control", b"control", qos=1)
        c.receive(f"{uid}/control", b"control")
        c.disconnect()


def test_session_expiry_positive_keeps_session_v5(broker, uid):
    cid = f"c-{uid}"
    with RawClient(broker, V5) as c:
        c.connect(cid, clean=True, properties=[(SEI, 300)])
        c.disconnect()
    with RawClient(broker, V5) as c:
        assert c.connect(cid, clean=False, properties=[(SEI, 300)]).session_present
        c.disconnect()
    with RawClient(broker, V5) as c:  # clean start discards it
        assert not c.connect(cid, clean=True).session_present
        c.disconnect()


def test_session_expires_after_interval_v5(broker, uid):
    """The session (and its will, delayed past the expiry) ends after the interval."""
    cid, will_topic = f"c-{uid}", f"{uid}/expired"
    with RawClient(broker, V5) as watcher:
        watcher.connect(f"w-{uid}")
        watcher.subscribe(will_topic, 1)
        c = RawClient(broker, V5)
        c.connect(
            cid,
            clean=True,
            properties=[(SEI, 1)],
            will=raw.Will(will_topic, b"x", qos=1, properties=[(raw.WILL_DELAY_INTERVAL, 3600)]),
        )
        c.subscribe(f"{uid}/t", 1)
        c.close()
        watcher.receive(will_topic, b"x", timeout=8)  # the session has ended
        watcher.disconnect()
    with RawClient(broker, V5) as c:
        assert not c.connect(cid, clean=False).session_present
        c.disconnect()


def test_disconnect_can_shorten_session_expiry_v5(broker, uid):
    """5.0 3.14.2.2.2: session expiry in DISCONNECT replaces the CONNECT value."""
    cid = f"c-{uid}"
    with RawClient(broker, V5) as c:
        c.connect(cid, clean=True, properties=[(SEI, 300)])
        c.disconnect(0, properties=[(SEI, 0)])
    with RawClient(broker, V5) as c:
        assert not c.connect(cid, clean=False).session_present
        c.disconnect()


def test_disconnect_cannot_set_expiry_after_zero_v5(broker, uid):
    """MQTT-3.14.2-2: expiry 0 at CONNECT then non-zero in DISCONNECT is a protocol error."""
    with RawClient(broker, V5) as c:
        c.connect(f"c-{uid}", clean=True)
        c.send(raw.disconnect(0, proto=V5, properties=[(SEI, 60)]))
        c.expect_closed(disconnect_reasons={0x82})


@pytest.mark.parametrize("proto", [V311, V5], ids=["3.1.1", "5.0"])
def test_unacked_qos1_redelivered_with_dup(broker, uid, pub, proto):
    """MQTT-4.4.0-1 / 3.3.1-1: unacknowledged PUBLISH re-sent with DUP=1 on reconnect."""
    cid, topic = f"c-{uid}", f"{uid}/dup1"
    with RawClient(broker, proto) as c:
        c.connect(cid, **_persistent_kw(proto))
        c.subscribe(topic, 1)
        pub.publish(topic, b"unacked", qos=1)
        first = c.expect_publish(topic, b"unacked", qos=1)
        assert not first.dup
        c.close()  # no PUBACK
    with RawClient(broker, proto) as c:
        assert c.connect(cid, **_persistent_kw(proto)).session_present
        again = c.expect_publish(topic, b"unacked", qos=1)
        assert again.dup, f"redelivery must set DUP: {again!r}"
        assert again.mid == first.mid, "re-sent with its original packet identifier"
        c.ack(again)
        c.disconnect()
    _discard(broker, cid, proto)


@pytest.mark.parametrize("proto", [V311, V5], ids=["3.1.1", "5.0"])
def test_takeover_keeps_inflight_and_queue(broker, uid, pub, proto):
    """A takeover of a persistent session moves its unacknowledged and queued messages to
    the new connection (re-sent with DUP, original ids)."""
    cid, topic = f"c-{uid}", f"{uid}/takeover"
    kw = _persistent_kw(proto)
    old = RawClient(broker, proto)
    old.connect(cid, **kw)
    old.subscribe(topic, 1)
    pub.publish(topic, b"inflight", qos=1)
    first = old.expect_publish(topic, b"inflight", qos=1)  # never acknowledged
    with RawClient(broker, proto) as new:
        assert new.connect(cid, **kw).session_present
        old.expect_closed(disconnect_reasons={0x8E})
        old.close()
        again = new.expect_publish(topic, b"inflight", qos=1)
        assert again.dup and again.mid == first.mid, again
        new.ack(again)
        pub.publish(topic, b"after", qos=1)
        new.receive(topic, b"after", qos=1)
        new.disconnect()
    _discard(broker, cid, proto)


def test_unacked_qos2_publish_redelivered_with_dup(broker, uid, pub):
    cid, topic = f"c-{uid}", f"{uid}/dup2"
    with RawClient(broker) as c:
        c.connect(cid, clean=False)
        c.subscribe(topic, 2)
        pub.publish(topic, b"unrec", qos=2)
        first = c.expect_publish(topic, b"unrec", qos=2)
        c.close()  # no PUBREC
    with RawClient(broker) as c:
        assert c.connect(cid, clean=False).session_present
        again = c.expect_publish(topic, b"unrec", qos=2)
        assert again.dup and again.mid == first.mid, again
        c.ack(again)
        c.disconnect()
    _discard(broker, cid)


def test_pubrel_resent_after_reconnect(broker, uid, pub):
    """MQTT-4.4.0-1: after PUBREC, the server re-sends PUBREL (not PUBLISH) on reconnect."""
    cid, topic = f"c-{uid}", f"{uid}/rel"
    with RawClient(broker) as c:
        c.connect(cid, clean=False)
        c.subscribe(topic, 2)
        pub.publish(topic, b"half", qos=2)
        got = c.expect_publish(topic, b"half", qos=2)
        c.send(raw.pubrec(got.mid))
        c.expect_bytes("PUBREL", raw.pubrel(got.mid))
        c.close()  # no PUBCOMP
    with RawClient(broker) as c:
        assert c.connect(cid, clean=False).session_present
        c.expect_bytes("PUBREL", raw.pubrel(got.mid))
        c.send(raw.pubcomp(got.mid))
        pub.publish(topic, b"next", qos=2)
        c.receive(topic, b"next", qos=2)  # and "half" is not delivered again
        c.disconnect()
    _discard(broker, cid)


def test_inbound_qos2_completes_across_reconnect(broker, uid):
    """The client may send PUBREL for its QoS 2 publish after reconnecting; once only."""
    cid, topic = f"c-{uid}", f"{uid}/in2"
    with RawClient(broker) as sub:
        sub.connect(f"sub-{uid}")
        sub.subscribe(topic, 2)
        with RawClient(broker) as c:
            c.connect(cid, clean=False)
            c.send(raw.publish(topic, b"once", qos=2, mid=42))
            c.expect_bytes("PUBREC", raw.pubrec(42))
            c.close()
        with RawClient(broker) as c:
            assert c.connect(cid, clean=False).session_present
            c.send(raw.publish(topic, b"once", qos=2, mid=42, dup=True))
            c.expect_bytes("PUBREC", raw.pubrec(42))
            c.send(raw.pubrel(42))
            c.expect_bytes("PUBCOMP", raw.pubcomp(42))
            c.publish(topic, b"end", qos=2)
            c.disconnect()
        sub.receive(topic, b"once", qos=2)
        sub.receive(topic, b"end", qos=2)
        sub.disconnect()
    _discard(broker, cid)


@pytest.mark.gateway_only  # mosquitto counts its inflight window outside the queue limit
def test_offline_queue_bounded_drop_oldest(make_broker, uid):
    """max_mqueue_len bounds the offline queue; the default overflow policy drops oldest."""
    addr = make_broker(GATEWAY_MQTT__MAX_MQUEUE_LEN=5)
    cid, topic = f"c-{uid}", f"{uid}/bounded"
    with RawClient(addr) as c:
        c.connect(cid, clean=False)
        c.subscribe(topic, 1)
        c.disconnect()
    with RawClient(addr) as p:
        p.connect(f"pub-{uid}")
        for i in range(10):
            p.publish(topic, str(i).encode(), qos=1)
        p.disconnect()
    with RawClient(addr) as c:
        c.connect(cid, clean=False)
        for i in range(5, 10):
            c.receive(topic, str(i).encode(), qos=1)
        c.expect_nothing(0.5)
        c.disconnect()
