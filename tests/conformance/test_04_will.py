"""Will messages: abnormal close, normal DISCONNECT, 0x04, retain, properties, will delay.

Will-delay timing is measured, not slept: the test records when the connection dropped and
when the will arrived, and checks the gap.
"""

from __future__ import annotations

import time

import pytest

from . import raw
from .conftest import UNDER_MOSQUITTO
from .raw import V5, V311, RawClient


@pytest.fixture
def watcher(broker, uid):
    """A v5 client subscribed (QoS 2) to ``<uid>/will/#``."""
    with RawClient(broker, V5) as c:
        c.connect(f"watch-{uid}")
        c.subscribe(f"{uid}/will/#", 2)
        yield c
        c.disconnect()


@pytest.mark.parametrize("proto", [V311, V5], ids=["3.1.1", "5.0"])
@pytest.mark.parametrize("qos", [0, 1, 2])
def test_will_on_abnormal_close(broker, uid, watcher, proto, qos):
    """MQTT-3.1.2-8: the will is published when the connection drops without DISCONNECT."""
    topic = f"{uid}/will/x"
    c = RawClient(broker, proto)
    c.connect(f"c-{uid}", will=raw.Will(topic, b"bye", qos=qos))
    c.close()
    watcher.receive(topic, b"bye", qos=qos, retain=False)


def test_will_on_tcp_reset(broker, uid, watcher):
    topic = f"{uid}/will/rst"
    c = RawClient(broker)
    c.connect(f"c-{uid}", will=raw.Will(topic, b"reset", qos=1))
    c.abort()
    watcher.receive(topic, b"reset", qos=1)


@pytest.mark.parametrize("proto", [V311, V5], ids=["3.1.1", "5.0"])
def test_no_will_on_normal_disconnect(broker, uid, watcher, proto):
    """MQTT-3.1.2-10 / 3.14.4-3: DISCONNECT (0x00) discards the will."""
    c = RawClient(broker, proto)
    c.connect(f"c-{uid}", will=raw.Will(f"{uid}/will/x", b"bye", qos=1))
    c.disconnect()
    watcher.expect_nothing(0.5)


def test_disconnect_with_will_message_0x04_v5(broker, uid, watcher):
    """5.0 3.14.2.1: reason 0x04 asks the server to publish the will."""
    topic = f"{uid}/will/x"
    c = RawClient(broker, V5)
    c.connect(f"c-{uid}", will=raw.Will(topic, b"asked", qos=1))
    c.disconnect(0x04)
    watcher.receive(topic, b"asked", qos=1)


def test_will_retained(broker, uid, watcher):
    """MQTT-3.1.2-17: a will with retain set becomes the retained message."""
    topic = f"{uid}/will/ret"
    c = RawClient(broker)
    c.connect(f"c-{uid}", will=raw.Will(topic, b"last words", qos=1, retain=True))
    c.close()
    watcher.receive(topic, b"last words", qos=1, retain=False)
    with RawClient(broker) as late:
        late.connect(f"late-{uid}")
        late.subscribe(topic, 1)
        late.receive(topic, b"last words", qos=1, retain=True)
        late.publish(topic, b"", qos=1, retain=True)
        late.receive(topic, b"", retain=False)
        late.disconnect()
    watcher.receive(topic, b"")


def test_will_properties_passed_through_v5(broker, uid, watcher):
    topic = f"{uid}/will/p"
    will_props = [
        (raw.CONTENT_TYPE, "text/plain"),
        (raw.PAYLOAD_FORMAT_INDICATOR, 1),
        (raw.RESPONSE_TOPIC, f"{uid}/reply"),
        (raw.CORRELATION_DATA, b"\x00\x01corr"),
        (raw.USER_PROPERTY, ("device", "d-1")),
        (raw.USER_PROPERTY, ("device", "d-2")),
    ]
    c = RawClient(broker, V5)
    c.connect(f"c-{uid}", will=raw.Will(topic, b"bye", qos=1, properties=will_props))
    c.close()
    got = watcher.receive(topic, b"bye", qos=1)
    assert got.props.get(raw.CONTENT_TYPE) == "text/plain"
    assert got.props.get(raw.PAYLOAD_FORMAT_INDICATOR) == 1
    assert got.props.get(raw.RESPONSE_TOPIC) == f"{uid}/reply"
    assert got.props.get(raw.CORRELATION_DATA) == b"\x00\x01corr"
    assert got.props.user == [("device", "d-1"), ("device", "d-2")]


def test_will_delay_interval(broker, uid, watcher):
    """5.0 3.1.3.2.2: the will waits for the will delay (session outlives it)."""
    topic = f"{uid}/will/delay"
    c = RawClient(broker, V5)
    c.connect(
        f"c-{uid}",
        properties=[(raw.SESSION_EXPIRY_INTERVAL, 30)],
        will=raw.Will(topic, b"late", qos=1, properties=[(raw.WILL_DELAY_INTERVAL, 1)]),
    )
    c.close()
    dropped = time.monotonic()
    watcher.receive(topic, b"late", qos=1, timeout=5)
    gap = time.monotonic() - dropped
    assert gap >= 0.8, f"will sent {gap:.2f}s after the drop, before its 1s delay"
    with RawClient(broker, V5) as c:  # clean up the session
        c.connect(f"c-{uid}", clean=True)
        c.disconnect()


def test_will_delay_cancelled_by_reconnect(broker, uid, watcher):
    """5.0 MQTT-3.1.3-9: reconnecting before the delay passes means no will."""
    topic = f"{uid}/will/cancel"
    c = RawClient(broker, V5)
    c.connect(
        f"c-{uid}",
        properties=[(raw.SESSION_EXPIRY_INTERVAL, 30)],
        will=raw.Will(topic, b"never", qos=1, properties=[(raw.WILL_DELAY_INTERVAL, 1)]),
    )
    c.close()
    with RawClient(broker, V5) as again:
        again.connect(f"c-{uid}", clean=False, properties=[(raw.SESSION_EXPIRY_INTERVAL, 30)])
        watcher.expect_nothing(1.6)  # past the will delay
        again.disconnect()
    with RawClient(broker, V5) as c:
        c.connect(f"c-{uid}", clean=True)
        c.disconnect()


def test_will_sent_at_session_end_before_delay(broker, uid, watcher):
    """5.0 3.1.3.2.2: the will goes at the earlier of will delay and session expiry."""
    topic = f"{uid}/will/end"
    c = RawClient(broker, V5)
    c.connect(
        f"c-{uid}",
        properties=[(raw.SESSION_EXPIRY_INTERVAL, 1)],
        will=raw.Will(topic, b"ended", qos=1, properties=[(raw.WILL_DELAY_INTERVAL, 3600)]),
    )
    c.close()
    dropped = time.monotonic()
    # mosquitto 2.0.11 expires sessions on a coarse timer, hence the generous bound.
    watcher.receive(topic, b"ended", qos=1, timeout=8 if UNDER_MOSQUITTO else 4)
    assert time.monotonic() - dropped >= 0.8


def test_will_on_takeover_with_clean_start_v5(broker, uid, watcher):
    """Takeover ending a session (clean start, expiry 0) publishes the old will."""
    topic = f"{uid}/will/takeover"
    old = RawClient(broker, V5)
    old.connect(f"c-{uid}", will=raw.Will(topic, b"taken", qos=1))
    with RawClient(broker, V5) as new:
        new.connect(f"c-{uid}", clean=True)
        old.expect_closed(disconnect_reasons={0x8E})
        old.close()
        watcher.receive(topic, b"taken", qos=1)
        new.disconnect()


def test_new_will_replaces_on_reconnect(broker, uid, watcher):
    """Only the current connection's will counts."""
    c = RawClient(broker)
    c.connect(f"c-{uid}", will=raw.Will(f"{uid}/will/first", b"1", qos=1))
    c.disconnect()
    c = RawClient(broker)
    c.connect(f"c-{uid}", will=raw.Will(f"{uid}/will/second", b"2", qos=1))
    c.close()
    watcher.receive(f"{uid}/will/second", b"2", qos=1)
