"""While the node's store cannot make anything durable (``Node.store_refusal``, set by
gateway.store.space on disk full / write errors / the size cap): QoS 1/2 publishes are
answered at once with 0x97 (MQTT 5) or the connection is closed without an
acknowledgement (3.1.1), new persistent sessions are refused, everything else flows."""

from __future__ import annotations

import pytest

from gateway.core.clock import VirtualScheduler
from gateway.core.node import CoreSettings, Node
from protocols.mqtt.packets import (
    MQTT_5,
    ConnAck,
    Properties,
    PubAck,
    Publish,
    PubRec,
    SubAck,
    Subscribe,
    Subscription,
)
from tests.protocols.mqtt.test_channel import client

QUOTA = 0x97


@pytest.fixture
def clock() -> VirtualScheduler:
    return VirtualScheduler()


@pytest.fixture
def node(clock: VirtualScheduler) -> Node:
    return Node(CoreSettings(), clock)


def test_qos12_refused_at_once_qos0_flows(node: Node, clock: VirtualScheduler) -> None:
    sub = client(node, clock, "sub")
    sub.send(Subscribe(1, (Subscription("a/#", qos=1),)))
    assert sub.take() == [SubAck(1, (1,))]
    pub = client(node, clock, "pub")
    node.store_refusal = QUOTA
    pub.send(Publish("a/1", b"x", qos=1, packet_id=7))
    pub.send(Publish("a/2", b"x", qos=2, packet_id=8))
    assert pub.take() == [PubAck(7, QUOTA), PubRec(8, QUOTA)]
    assert sub.take() == []  # not routed
    pub.send(Publish("a/0", b"x"))
    assert [p.topic for p in sub.take() if isinstance(p, Publish)] == ["a/0"]
    # an empty retained message deletes one: it goes through
    pub.send(Publish("a/r", b"", qos=1, retain=True, packet_id=9))
    assert pub.take() == [PubAck(9)]
    node.store_refusal = 0
    pub.send(Publish("a/3", b"x", qos=1, packet_id=10))
    assert pub.take() == [PubAck(10)]


def test_v311_publish_closes_without_puback(node: Node, clock: VirtualScheduler) -> None:
    pub = client(node, clock, "pub311", level=4)
    node.store_refusal = QUOTA
    pub.send(Publish("a/1", b"x", qos=1, packet_id=7))
    assert pub.take() == [] and pub.closed is not None


def test_new_persistent_session_refused_existing_resumes(
    node: Node, clock: VirtualScheduler
) -> None:
    keep = client(node, clock, "keep", properties=Properties(session_expiry_interval=60))
    assert keep.connack.reason_code == 0  # type: ignore[attr-defined]
    keep.channel.connection_lost()
    node.store_refusal = QUOTA
    fresh = client(node, clock, "fresh", properties=Properties(session_expiry_interval=60))
    assert fresh.connack.reason_code == QUOTA  # type: ignore[attr-defined]
    old = client(node, clock, "fresh311", level=4, clean_start=False)
    assert old.connack.reason_code == 3  # type: ignore[attr-defined]  # server unavailable
    back = client(node, clock, "keep", clean_start=False,
                  properties=Properties(session_expiry_interval=60))
    ack = back.connack  # type: ignore[attr-defined]
    assert isinstance(ack, ConnAck) and ack.reason_code == 0 and ack.session_present
    clean = client(node, clock, "clean", level=MQTT_5)
    assert clean.connack.reason_code == 0  # type: ignore[attr-defined]
