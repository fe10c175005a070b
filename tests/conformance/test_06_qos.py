"""QoS flows in depth: exactly-once QoS 2, packet identifiers, receive maximum both ways.

Each "must not be delivered twice" check ends with an "end" message on the same topic from
the same publisher: the subscriber's next PUBLISH must be "end", not a second copy.
"""

from __future__ import annotations

import pytest

from . import raw
from .raw import V5, V311, RawClient


@pytest.fixture
def sub(broker, uid):
    """A subscriber to ``<uid>/#`` at QoS 2."""
    with RawClient(broker) as c:
        c.connect(f"sub-{uid}")
        c.subscribe(f"{uid}/#", 2)
        yield c
        c.disconnect()


@pytest.mark.parametrize("proto", [V311, V5], ids=["3.1.1", "5.0"])
def test_qos2_duplicate_publish_before_pubrel_delivered_once(broker, uid, sub, proto):
    """MQTT-4.3.3-2 / 4.3.3-10: a re-sent PUBLISH (same id) before PUBREL is not re-delivered."""
    topic = f"{uid}/once"
    with RawClient(broker, proto) as pub:
        pub.connect(f"pub-{uid}")
        pub.send(raw.publish(topic, b"once", qos=2, mid=10, proto=proto))
        assert pub.expect("PUBREC").mid == 10
        pub.send(raw.publish(topic, b"once", qos=2, mid=10, dup=True, proto=proto))
        assert pub.expect("PUBREC").mid == 10
        pub.send(raw.pubrel(10, proto=proto))
        comp = pub.expect("PUBCOMP")
        assert comp.mid == 10 and comp.reason == 0
        pub.publish(topic, b"end", qos=2)
        pub.disconnect()
    sub.receive(topic, b"once", qos=2)
    sub.receive(topic, b"end", qos=2)


def test_qos2_packet_id_reusable_after_pubcomp(broker, uid, sub):
    """After PUBCOMP the id is free: a new PUBLISH with it is a new message."""
    topic = f"{uid}/reuse"
    with RawClient(broker) as pub:
        pub.connect(f"pub-{uid}")
        for payload in (b"first", b"second"):
            pub.send(raw.publish(topic, payload, qos=2, mid=7))
            pub.expect_bytes("PUBREC", raw.pubrec(7))
            pub.send(raw.pubrel(7))
            pub.expect_bytes("PUBCOMP", raw.pubcomp(7))
        pub.disconnect()
    sub.receive(topic, b"first", qos=2)
    sub.receive(topic, b"second", qos=2)


def test_pubrel_for_unknown_id_gets_pubcomp_v311(broker, uid):
    """MQTT-4.3.3-11: PUBREL is always answered by PUBCOMP with the same id."""
    with RawClient(broker) as c:
        c.connect(f"c-{uid}")
        c.send(raw.pubrel(4242))
        c.expect_bytes("PUBCOMP", raw.pubcomp(4242))
        c.ping()
        c.disconnect()


def test_pubrel_for_unknown_id_v5(broker, uid):
    """5.0: PUBCOMP 0x92 (packet identifier not found) or 0x00."""
    with RawClient(broker, V5) as c:
        c.connect(f"c-{uid}")
        c.send(raw.pubrel(4242, proto=V5))
        comp = c.expect("PUBCOMP")
        assert comp.mid == 4242 and comp.reason in (0x00, 0x92), comp
        c.disconnect()


def test_duplicate_pubrel_answered_again(broker, uid, sub):
    topic = f"{uid}/dup-rel"
    with RawClient(broker) as pub:
        pub.connect(f"pub-{uid}")
        pub.send(raw.publish(topic, b"x", qos=2, mid=9))
        pub.expect_bytes("PUBREC", raw.pubrec(9))
        pub.send(raw.pubrel(9))
        pub.expect_bytes("PUBCOMP", raw.pubcomp(9))
        pub.send(raw.pubrel(9))
        pub.expect_bytes("PUBCOMP", raw.pubcomp(9))
        pub.publish(topic, b"end", qos=2)
        pub.disconnect()
    sub.receive(topic, b"x", qos=2)
    sub.receive(topic, b"end", qos=2)


def test_outgoing_packet_ids_unique_while_inflight(broker, uid):
    """MQTT-2.3.1-2: concurrently unacknowledged deliveries use distinct non-zero ids."""
    topic = f"{uid}/ids"
    with RawClient(broker, V5) as slow, RawClient(broker) as pub:
        slow.connect(f"slow-{uid}", properties=[(raw.RECEIVE_MAXIMUM, 10)])
        slow.subscribe(topic, 2)
        pub.connect(f"pub-{uid}")
        for i in range(10):
            pub.publish(topic, str(i).encode(), qos=1 + i % 2)
        got = [slow.expect_publish(topic, str(i).encode()) for i in range(10)]
        mids = [p.mid for p in got]
        assert 0 not in mids and len(set(mids)) == 10, mids
        for p in got:
            slow.ack(p)
        slow.disconnect()
        pub.disconnect()


@pytest.mark.parametrize("qos", [1, 2])
def test_inflight_honours_client_receive_maximum_v5(broker, uid, qos):
    """5.0 MQTT-3.3.4-9: at most Receive Maximum unacknowledged QoS>0 PUBLISHes."""
    topic = f"{uid}/window"
    with RawClient(broker, V5) as slow, RawClient(broker) as pub:
        slow.connect(f"slow-{uid}", properties=[(raw.RECEIVE_MAXIMUM, 2)])
        slow.subscribe(topic, qos)
        pub.connect(f"pub-{uid}")
        for i in range(5):
            pub.publish(topic, str(i).encode(), qos=qos)
        held = [slow.expect_publish(topic, str(i).encode(), qos=qos) for i in range(2)]
        slow.expect_nothing(0.5)  # window full
        for p in held:
            slow.ack(p)
        for i in range(2, 5):
            slow.receive(topic, str(i).encode(), qos=qos)
        slow.disconnect()
        pub.disconnect()


# mosquitto 2.0.11 releases two queued messages for one PUBACK, overfilling the window
# (also reported in emqx/emqx#12922: "after the first PUBACK it continues to send more").
@pytest.mark.gateway_only
@pytest.mark.parametrize("qos", [1, 2])
def test_inflight_window_slides_one_per_ack_v5(broker, uid, qos):
    """5.0 4.9: each PUBACK / PUBCOMP returns exactly one unit of send quota."""
    topic = f"{uid}/slide"
    with RawClient(broker, V5) as slow, RawClient(broker) as pub:
        slow.connect(f"slow-{uid}", properties=[(raw.RECEIVE_MAXIMUM, 2)])
        slow.subscribe(topic, qos)
        pub.connect(f"pub-{uid}")
        for i in range(5):
            pub.publish(topic, str(i).encode(), qos=qos)
        first = slow.expect_publish(topic, b"0", qos=qos)
        second = slow.expect_publish(topic, b"1", qos=qos)
        slow.expect_nothing(0.3)
        slow.ack(first)
        third = slow.expect_publish(topic, b"2", qos=qos)
        slow.expect_nothing(0.3)  # second and third in flight: the window is full again
        for p in (second, third):
            slow.ack(p)
        slow.receive(topic, b"3", qos=qos)
        slow.receive(topic, b"4", qos=qos)
        slow.disconnect()
        pub.disconnect()


def test_max_inflight_config_limits_window_v311(make_broker, uid):
    """The broker's own inflight limit (max_inflight) applies to 3.1.1 clients."""
    addr = make_broker(GATEWAY_MQTT__MAX_INFLIGHT=2)
    topic = f"{uid}/inflight"
    with RawClient(addr) as slow, RawClient(addr) as pub:
        slow.connect(f"slow-{uid}")
        slow.subscribe(topic, 1)
        pub.connect(f"pub-{uid}")
        for i in range(4):
            pub.publish(topic, str(i).encode(), qos=1)
        held = [slow.expect_publish(topic, str(i).encode()) for i in range(2)]
        slow.expect_nothing(0.5)
        for p in held:
            slow.ack(p)
        slow.receive(topic, b"2")
        slow.receive(topic, b"3")
        slow.disconnect()
        pub.disconnect()


# mosquitto never sends DISCONNECT 0x93 (eclipse-mosquitto/mosquitto#3611).
@pytest.mark.gateway_only
def test_client_exceeding_server_receive_maximum_gets_0x93(make_broker, uid):
    """5.0 MQTT-3.3.4-8 / 4.9: more unacknowledged QoS 2 than our Receive Maximum -> 0x93."""
    addr = make_broker(GATEWAY_MQTT__MAX_INFLIGHT=3)
    with RawClient(addr, V5) as c:
        ack = c.connect(f"c-{uid}")
        limit = ack.props.get(raw.RECEIVE_MAXIMUM, 65535)
        assert isinstance(limit, int) and limit <= 3, f"receive maximum not advertised: {ack!r}"
        for mid in range(1, limit + 1):
            c.send(raw.publish(f"{uid}/flood", b"x", qos=2, mid=mid, proto=V5))
            assert c.expect("PUBREC").mid == mid
        c.send(raw.publish(f"{uid}/flood", b"x", qos=2, mid=limit + 1, proto=V5))
        c.expect_closed(disconnect_reasons={0x93}, require_disconnect=True)
    raw.assert_broker_healthy(addr, V5)


def test_qos1_publisher_acked_even_with_slow_subscriber(broker, uid):
    """A full subscriber window does not stall the publisher's acknowledgements."""
    topic = f"{uid}/decoupled"
    with RawClient(broker, V5) as slow, RawClient(broker) as pub:
        slow.connect(f"slow-{uid}", properties=[(raw.RECEIVE_MAXIMUM, 1)])
        slow.subscribe(topic, 1)
        pub.connect(f"pub-{uid}")
        for i in range(10):
            pub.publish(topic, str(i).encode(), qos=1)  # each waits for its PUBACK
        for i in range(10):
            slow.receive(topic, str(i).encode(), qos=1)
        slow.disconnect()
        pub.disconnect()
