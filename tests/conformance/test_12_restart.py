"""Durability across a broker restart: what was acknowledged is not lost.

DESIGN.md: "a restart or a kill -9 loses nothing that was acknowledged". The graceful
case (SIGTERM) runs on both brokers (mosquitto saves its persistence file on shutdown);
the SIGKILL case is gateway_only, since mosquitto only saves on shutdown or autosave.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from . import raw
from .raw import V5, V311, RawClient

KILL = [False, pytest.param(True, marks=pytest.mark.gateway_only)]
KILL_IDS = ["sigterm", "sigkill"]


@pytest.mark.parametrize("kill", KILL, ids=KILL_IDS)
def test_retained_message_survives_restart(make_broker, uid, kill):
    addr = make_broker()
    topic = f"{uid}/kept"
    with RawClient(addr, V5) as pub:
        pub.connect(f"p-{uid}")
        props = [(raw.USER_PROPERTY, ("k", "v"))]
        pub.publish(topic, b"durable", qos=1, retain=True, properties=props)
        pub.disconnect()
    make_broker.restart(addr, kill=kill)
    with RawClient(addr, V5) as sub:
        sub.connect(f"s-{uid}")
        sub.subscribe(topic, 1)
        got = sub.receive(topic, b"durable", qos=1, retain=True)
        assert got.props.user == [("k", "v")]
        sub.disconnect()


@pytest.mark.parametrize("kill", KILL, ids=KILL_IDS)
@pytest.mark.parametrize("proto", [V311, V5], ids=["3.1.1", "5.0"])
def test_persistent_session_and_queue_survive_restart(make_broker, uid, kill, proto):
    addr = make_broker()
    cid, topic = f"c-{uid}", f"{uid}/queued"
    kw: dict[str, Any] = {"clean": False}
    if proto == V5:
        kw["properties"] = [(raw.SESSION_EXPIRY_INTERVAL, 3600)]
    with RawClient(addr, proto) as c:
        c.connect(cid, **kw)
        c.subscribe(topic, 2)
        c.disconnect()
    with RawClient(addr) as pub:
        pub.connect(f"p-{uid}")
        pub.publish(topic, b"q1", qos=1)
        pub.publish(topic, b"q2", qos=2)
        pub.disconnect()
    make_broker.restart(addr, kill=kill)
    with RawClient(addr, proto) as c:
        assert c.connect(cid, **kw).session_present
        c.receive(topic, b"q1", qos=1)
        c.receive(topic, b"q2", qos=2)
        with RawClient(addr) as pub:  # the subscription itself survived
            pub.connect(f"p-{uid}")
            pub.publish(topic, b"live", qos=1)
            pub.disconnect()
        c.receive(topic, b"live", qos=1)
        c.disconnect()


@pytest.mark.parametrize("kill", KILL, ids=KILL_IDS)
def test_unacknowledged_deliveries_survive_while_another_subscriber_acks(make_broker, uid, kill):
    """Two persistent subscribers online: a acknowledges every delivery at once (its
    queue rows may never reach the disk), b acknowledges none. Every message whose
    PUBACK the publisher got is b's after the restart."""
    addr = make_broker()
    topic = f"{uid}/both"
    kw: dict[str, Any] = {"clean": False, "properties": [(raw.SESSION_EXPIRY_INTERVAL, 3600)]}
    sent = [b"m%d" % i for i in range(20)]
    with RawClient(addr, V5) as a, RawClient(addr, V5) as b:
        a.connect(f"a-{uid}", **kw)
        a.subscribe(topic, 1)
        b.connect(f"b-{uid}", **kw)
        b.subscribe(topic, 1)
        with RawClient(addr) as pub:
            pub.connect(f"p-{uid}")
            for payload in sent:
                pub.publish(topic, payload, qos=1)  # returns once PUBACKed
                a.receive(topic, payload, qos=1)
            got_b = [b.expect_publish(topic, qos=1).payload for _ in sent]
            assert got_b == sent  # delivered, never acknowledged
            make_broker.restart(addr, kill=kill)
    with RawClient(addr, V5) as b:
        assert b.connect(f"b-{uid}", **kw).session_present
        again = [b.receive(topic, qos=1) for _ in sent]
        assert [p.payload for p in again] == sent
        assert all(p.dup for p in again)
        b.disconnect()


@pytest.mark.slow
@pytest.mark.gateway_only
def test_kill_during_traffic_loses_no_acknowledged_message(make_broker, uid):
    """A kill -9 in the middle of a QoS 1 stream to a persistent subscriber that
    acknowledges most deliveries at once (their rows are often cancelled before they
    are written) and leaves a few unacknowledged: every message the publisher got a
    PUBACK for reaches the subscriber, before the kill or after the restart."""
    addr = make_broker()
    topic = f"{uid}/stream"
    kw: dict[str, Any] = {"clean": False, "properties": [(raw.SESSION_EXPIRY_INTERVAL, 3600)]}
    n, window, kill_at = 2000, 64, 1000
    acked: set[bytes] = set()  # PUBACKed to the publisher
    taken: set[bytes] = set()  # received and PUBACKed by the subscriber before the kill
    after: set[bytes] = set()  # received after the restart
    sub = RawClient(addr, V5)
    sub.connect(f"s-{uid}", **kw)
    sub.subscribe(topic, 1)

    def subscriber() -> None:
        try:
            while True:
                pkt = sub.read(10.0)
                if pkt.type == raw.PUBLISH and int(pkt.payload) >= 10:  # ten stay unacked
                    sub.ack(pkt)
                    taken.add(pkt.payload)
        except (raw.ConnectionClosed, raw.Timeout, OSError):
            return

    reader = threading.Thread(target=subscriber, daemon=True)
    reader.start()
    with RawClient(addr) as pub:
        pub.connect(f"p-{uid}")
        outstanding: dict[int, bytes] = {}
        sent = 0
        while len(acked) < kill_at:
            while sent < n and len(outstanding) < window:
                mid = pub.mid()
                payload = b"%d" % sent
                pub.send(raw.publish(topic, payload, qos=1, mid=mid))
                outstanding[mid] = payload
                sent += 1
            ack = pub.expect("PUBACK")
            acked.add(outstanding.pop(ack.mid))
        make_broker.restart(addr, kill=True)  # with PUBLISHes and PUBACKs in flight
    reader.join(timeout=15)
    assert not reader.is_alive()
    sub.close()
    with RawClient(addr, V5) as again:
        assert again.connect(f"s-{uid}", **kw).session_present
        try:
            while True:
                pkt = again.expect_publish(topic, qos=1, timeout=2.0)
                after.add(pkt.payload)
                again.ack(pkt)
        except raw.Timeout:
            pass
        again.disconnect()
    assert {b"%d" % i for i in range(10)} <= after  # delivered, never acknowledged
    missing = sorted(acked - taken - after, key=int)
    assert not missing, f"{len(missing)} acknowledged messages lost, e.g. {missing[:10]}"
