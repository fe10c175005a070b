"""Retained messages: storage, deletion, replacement, retain handling, retain-as-published.

Absence is shown with a positive control: after subscribing, a non-retained "control"
message is published to the same topic, and it must be the next PUBLISH the client sees.
"""

from __future__ import annotations

import pytest

from . import raw
from .raw import V5, V311, RawClient


@pytest.fixture
def pub(broker, uid):
    with RawClient(broker, V5) as c:
        c.connect(f"pub-{uid}")
        yield c
        c.disconnect()


def _expect_control_next(sub: RawClient, topic: str) -> None:
    got = sub.receive()
    assert (got.topic, got.payload, got.retain) == (topic, b"control", False), (
        f"expected only the control message, got {got!r}"
    )


@pytest.mark.parametrize("proto", [V311, V5], ids=["3.1.1", "5.0"])
@pytest.mark.parametrize(("pub_qos", "sub_qos"), [(0, 1), (1, 1), (2, 1), (2, 2), (1, 0)])
def test_retained_delivered_on_subscribe(broker, uid, pub, proto, pub_qos, sub_qos):
    """MQTT-3.3.1-6/8: a new subscription gets the retained message with retain set."""
    topic = f"{uid}/r"
    pub.publish(topic, b"kept", qos=pub_qos, retain=True)
    with RawClient(broker, proto) as sub:
        sub.connect(f"sub-{uid}")
        sub.subscribe(topic, sub_qos)
        sub.receive(topic, b"kept", qos=min(pub_qos, sub_qos), retain=True)
        sub.disconnect()
    pub.publish(topic, b"", qos=1, retain=True)


def test_live_delivery_clears_retain_flag_v311(broker, uid):
    """MQTT-3.3.1-9: to an existing subscription the retain flag is 0."""
    topic = f"{uid}/live"
    with RawClient(broker) as sub, RawClient(broker) as pub:
        sub.connect(f"sub-{uid}")
        sub.subscribe(topic, 1)
        pub.connect(f"pub-{uid}")
        pub.publish(topic, b"now", qos=1, retain=True)
        sub.receive(topic, b"now", retain=False)
        pub.publish(topic, b"", qos=1, retain=True)
        sub.receive(topic, b"", retain=False)
        sub.disconnect()
        pub.disconnect()


def test_empty_payload_deletes_retained(broker, uid, pub):
    """MQTT-3.3.1-10/11: zero-byte retained payload removes it, and is delivered as normal."""
    topic = f"{uid}/del"
    pub.publish(topic, b"old", qos=1, retain=True)
    with RawClient(broker) as live:
        live.connect(f"live-{uid}")
        live.subscribe(topic, 1)
        live.receive(topic, b"old", retain=True)
        pub.publish(topic, b"", qos=1, retain=True)
        live.receive(topic, b"", retain=False)
        live.disconnect()
    with RawClient(broker) as late:
        late.connect(f"late-{uid}")
        late.subscribe(topic, 1)
        pub.publish(topic, b"control", qos=1)
        _expect_control_next(late, topic)
        late.disconnect()


def test_newer_retained_replaces_older(broker, uid, pub):
    topic = f"{uid}/rep"
    for payload in (b"v1", b"v2", b"v3"):
        pub.publish(topic, payload, qos=1, retain=True)
    with RawClient(broker) as sub:
        sub.connect(f"sub-{uid}")
        sub.subscribe(topic, 1)
        sub.receive(topic, b"v3", retain=True)
        pub.publish(topic, b"control", qos=1)
        _expect_control_next(sub, topic)
        sub.disconnect()
    pub.publish(topic, b"", qos=1, retain=True)


def test_non_retained_publish_keeps_retained(broker, uid, pub):
    topic = f"{uid}/keep"
    pub.publish(topic, b"kept", qos=1, retain=True)
    pub.publish(topic, b"transient", qos=1, retain=False)
    with RawClient(broker) as sub:
        sub.connect(f"sub-{uid}")
        sub.subscribe(topic, 1)
        sub.receive(topic, b"kept", retain=True)
        sub.disconnect()
    pub.publish(topic, b"", qos=1, retain=True)


def test_wildcard_subscription_gets_every_retained(broker, uid, pub):
    topics = [f"{uid}/w/a", f"{uid}/w/b/c", f"{uid}/w"]
    for t in topics:
        pub.publish(t, t.encode(), qos=1, retain=True)
    pub.publish(f"{uid}/other", b"x", qos=1, retain=True)
    with RawClient(broker) as sub:
        sub.connect(f"sub-{uid}")
        sub.subscribe(f"{uid}/w/#", 1)
        got = {sub.receive(retain=True).topic for _ in topics}
        assert got == set(topics)
        pub.publish(f"{uid}/w", b"control", qos=1)
        _expect_control_next(sub, f"{uid}/w")
        sub.disconnect()
    for t in [*topics, f"{uid}/other"]:
        pub.publish(t, b"", qos=1, retain=True)


def test_retained_keeps_v5_properties(broker, uid, pub):
    topic = f"{uid}/props"
    pub.publish(
        topic,
        b"{}",
        qos=1,
        retain=True,
        properties=[
            (raw.CONTENT_TYPE, "application/json"),
            (raw.USER_PROPERTY, ("k", "v")),
        ],
    )
    with RawClient(broker, V5) as sub:
        sub.connect(f"sub-{uid}")
        sub.subscribe(topic, 1)
        got = sub.receive(topic, b"{}", retain=True)
        assert got.props.get(raw.CONTENT_TYPE) == "application/json"
        assert got.props.user == [("k", "v")]
        sub.disconnect()
    pub.publish(topic, b"", qos=1, retain=True)


@pytest.mark.parametrize("rh", [0, 1, 2])
def test_retain_handling(broker, uid, pub, rh):
    """5.0 3.8.3.1: 0 send on every subscribe, 1 only if new, 2 never."""
    topic = f"{uid}/rh"
    pub.publish(topic, b"kept", qos=1, retain=True)
    opts = raw.sub_options(1, rh=rh)
    with RawClient(broker, V5) as sub:
        sub.connect(f"sub-{uid}")
        sub.subscribe([(topic, opts)], codes=[1])
        if rh in (0, 1):
            sub.receive(topic, b"kept", retain=True)
        sub.subscribe([(topic, opts)], codes=[1])  # the subscription exists now
        if rh == 0:
            sub.receive(topic, b"kept", retain=True)
        pub.publish(topic, b"control", qos=1)
        _expect_control_next(sub, topic)
        sub.disconnect()
    pub.publish(topic, b"", qos=1, retain=True)


@pytest.mark.parametrize("rap", [False, True], ids=["rap0", "rap1"])
def test_retain_as_published(broker, uid, pub, rap):
    """5.0 MQTT-3.3.1-12/13: live retain flag is the publisher's only with RAP set."""
    topic = f"{uid}/rap"
    with RawClient(broker, V5) as sub:
        sub.connect(f"sub-{uid}")
        sub.subscribe([(topic, raw.sub_options(1, rap=rap))], codes=[1])
        pub.publish(topic, b"flagged", qos=1, retain=True)
        sub.receive(topic, b"flagged", retain=rap)
        pub.publish(topic, b"plain", qos=1, retain=False)
        sub.receive(topic, b"plain", retain=False)
        sub.disconnect()
    pub.publish(topic, b"", qos=1, retain=True)


def test_retained_on_subscribe_flagged_even_without_rap(broker, uid, pub):
    """5.0 3.3.1.3: retained messages sent because of a new subscription keep retain=1."""
    topic = f"{uid}/rap0"
    pub.publish(topic, b"kept", qos=1, retain=True)
    with RawClient(broker, V5) as sub:
        sub.connect(f"sub-{uid}")
        sub.subscribe([(topic, raw.sub_options(1, rap=False))], codes=[1])
        sub.receive(topic, b"kept", retain=True)
        sub.disconnect()
    pub.publish(topic, b"", qos=1, retain=True)
