"""Authorization that answers later, in every channel, against the real core (no sockets,
a virtual clock): a ``client.authorize`` subscriber returns a
:class:`~gateway.core.deferred.Deferred` for topics under ``ask/`` (as the HTTP source
does on a cache miss) and the test resolves it. While one client's decision is pending,
its later packets wait behind it, in order, and other clients are served."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.core.authz import Authorizer
from gateway.core.clock import VirtualScheduler
from gateway.core.deferred import Deferred
from gateway.core.hooks import Priority, Stop
from gateway.core.node import CoreSettings, Node
from protocols.coap.codec import Code
from protocols.mqtt.packets import PingReq, PingResp, PubAck, Publish, SubAck, Subscribe
from protocols.mqtt.packets import Subscription as Sub
from protocols.mqttsn import packets as sn
from tests.protocols.coap.test_channel import CoapWire
from tests.protocols.mqtt.test_channel import client
from tests.protocols.mqttsn.test_channel import SnWire
from tests.protocols.mqttsn.test_channel import sn as sn_client


class Asker:
    """The ``client.authorize`` subscriber: ``ask/...`` waits for the test."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, str, str, Deferred[Any]]] = []

    def __call__(self, client: Any, action: str, topic: str, acc: bool) -> Any:
        if not topic.startswith("ask/"):
            return None
        d: Deferred[Any] = Deferred()
        self.asked.append((client.client_id, action, topic, d))
        return d

    def answer(self, allowed: bool) -> None:
        """Answer the oldest open question."""
        for *_, d in self.asked:
            if not d.done:
                d.resolve(Stop(allowed))
                return
        raise AssertionError("no open question")

    def open(self) -> list[tuple[str, str, str]]:
        return [(c, a, t) for c, a, t, d in self.asked if not d.done]


@pytest.fixture
def clock() -> VirtualScheduler:
    return VirtualScheduler()


@pytest.fixture
def asker() -> Asker:
    return Asker()


@pytest.fixture
def node(clock: VirtualScheduler, asker: Asker) -> Node:
    n = Node(CoreSettings(), clock, authorizer=Authorizer([], "allow"))
    n.hooks.add("client.authorize", asker, Priority.AUTHZ)
    return n


def pubs(w: Any) -> list[tuple[str, bytes]]:
    return [(p.topic, p.payload) for p in w.take() if isinstance(p, Publish)]


# ------------------------------------------------------------------ MQTT


def test_mqtt_publishes_wait_in_order_and_others_are_served(node: Node, clock, asker):
    watcher = client(node, clock, "watcher")
    watcher.send(Subscribe(1, (Sub("#", qos=1),)))
    assert watcher.take() == [SubAck(1, (1,))]
    a = client(node, clock, "a")
    a.send(Publish("ask/1", b"first", qos=1, packet_id=1))
    a.send(Publish("free/2", b"second", qos=1, packet_id=2))
    a.send(PingReq())
    assert a.take() == [] and asker.open() == [("a", "publish", "ask/1")]
    # another client meanwhile: served at once
    b = client(node, clock, "b")
    for i in range(1, 4):
        b.send(Publish("free/b", b"%d" % i, qos=1, packet_id=i))
        assert b.take() == [PubAck(i)]
    assert pubs(watcher) == [("free/b", b"1"), ("free/b", b"2"), ("free/b", b"3")]
    asker.answer(True)
    assert a.take() == [PubAck(1), PubAck(2), PingResp()]
    assert pubs(watcher) == [("ask/1", b"first"), ("free/2", b"second")]
    # a denial that came later: 0x87, and the next packet is handled
    a.send(Publish("ask/3", b"no", qos=1, packet_id=3))
    a.send(Publish("free/4", b"yes", qos=1, packet_id=4))
    asker.answer(False)
    assert a.take() == [PubAck(3, 0x87), PubAck(4)]
    assert pubs(watcher) == [("free/4", b"yes")]


def test_mqtt_later_decision_is_cached(node: Node, clock, asker):
    a = client(node, clock, "a")
    a.send(Publish("ask/c", b"1", qos=1, packet_id=1))
    asker.answer(True)
    a.send(Publish("ask/c", b"2", qos=1, packet_id=2))
    assert a.take() == [PubAck(1, 0x10), PubAck(2, 0x10)]
    assert len(asker.asked) == 1


def test_mqtt_subscribe_resumes_at_the_filter_that_waited(node: Node, clock, asker):
    a = client(node, clock, "a")
    a.send(Subscribe(1, (Sub("x/1", qos=1), Sub("ask/2", qos=1), Sub("ask/3", qos=0),
                         Sub("x/4", qos=2))))
    a.send(PingReq())
    assert a.take() == []
    asker.answer(True)
    assert a.take() == [] and asker.open() == [("a", "subscribe", "ask/3")]
    asker.answer(False)
    assert a.take() == [SubAck(1, (1, 1, 0x87, 2)), PingResp()]
    assert set(node.sessions["a"].subscriptions) == {"x/1", "ask/2", "x/4"}


def test_mqtt_answer_after_the_client_left_is_dropped(node: Node, clock, asker):
    a = client(node, clock, "a")
    a.send(Publish("ask/gone", b"x", qos=1, packet_id=1))
    a.channel.connection_lost()
    a.closed = "gone"
    asker.answer(True)  # nothing is written, nothing raises
    assert "a" not in node.sessions


def test_mqtt_one_shot_publisher_gone_before_the_answer(node: Node, clock, asker):
    """PUBLISH, DISCONNECT, then the socket closes (mosquitto_pub -q 0) while the
    decision is pending: the message still goes out once allowed, and no will."""
    from protocols.mqtt.packets import Disconnect, Will

    watcher = client(node, clock, "watcher")
    watcher.send(Subscribe(1, (Sub("#", qos=0),)))
    watcher.take()
    a = client(node, clock, "a", will=Will("will/a", b"gone"))
    a.send(Publish("ask/once", b"last words", qos=0))
    a.send(Disconnect())
    a.closed = "socket closed"  # the peer is gone: nothing more is written to it
    a.channel.connection_lost()
    assert "a" in node.sessions  # its input waits for the answer
    asker.answer(True)
    assert pubs(watcher) == [("ask/once", b"last words")]
    assert "a" not in node.sessions


def test_mqtt_deny_disconnect_on_a_later_denial(clock, asker):
    from protocols.mqtt.settings import MqttSettings

    n = Node(CoreSettings(), clock, authorizer=Authorizer([], "allow"))
    n.hooks.add("client.authorize", asker, Priority.AUTHZ)
    a = client(n, clock, "a", settings=MqttSettings(deny_action_disconnect=True))
    a.send(Publish("ask/x", b"x", qos=1, packet_id=1))
    asker.answer(False)
    assert a.closed is not None and "denied" in a.closed


# ------------------------------------------------------------------ MQTT-SN


def test_mqttsn_datagrams_wait_behind_a_pending_publish(node: Node, clock, asker):
    watcher = client(node, clock, "watcher")
    watcher.send(Subscribe(1, (Sub("#", qos=1),)))
    watcher.take()
    w = sn_client(node, clock, "s1")
    w.send(sn.Register(0, 1, "ask/t"))
    [regack] = w.take()
    tid = regack.topic_id
    w.send(sn.Publish(tid, b"one", msg_id=2, qos=1))
    w.send(sn.Publish("ab", b"ab", topic_id_type=sn.SHORT, msg_id=3, qos=1))
    w.send(sn.PingReq())
    assert w.take() == []
    other = sn_client(node, clock, "s2", port=20001)
    other.send(sn.PingReq())
    assert other.take() == [sn.PingResp()]
    asker.answer(True)
    assert w.take() == [sn.PubAck(tid, 2, sn.ReturnCode.ACCEPTED),
                        sn.PubAck(0x6162, 3, sn.ReturnCode.ACCEPTED), sn.PingResp()]
    assert pubs(watcher) == [("ask/t", b"one"), ("ab", b"ab")]


def test_mqttsn_subscribe_decided_later(node: Node, clock, asker):
    w = sn_client(node, clock, "s1")
    w.send(sn.Subscribe(5, "ask/f", qos=1))
    assert w.take() == []
    asker.answer(False)
    [ack] = w.take()
    assert isinstance(ack, sn.SubAck) and ack.return_code == sn.ReturnCode.NOT_SUPPORTED


# ------------------------------------------------------------------ CoAP


def test_coap_requests_wait_behind_a_pending_publish(node: Node, clock, asker):
    watcher = client(node, clock, "watcher")
    watcher.send(Subscribe(1, (Sub("#", qos=1),)))
    watcher.take()
    w = CoapWire(node, clock)
    w.request(Code.POST, "/ps/ask/a", b"1", query=("clientid=c1",))
    w.request(Code.POST, "/ps/free/b", b"2", query=("clientid=c1",))
    assert w.take() == []
    other = CoapWire(node, clock, peer=("127.0.0.1", 30001))
    other.request(Code.POST, "/ps/free/o", b"o", query=("clientid=c2",))
    assert [r.code for r in other.take()] == [Code.CHANGED]
    asker.answer(True)
    assert [r.code for r in w.take()] == [Code.CHANGED, Code.CHANGED]
    assert pubs(watcher) == [("free/o", b"o"), ("ask/a", b"1"), ("free/b", b"2")]
    w.request(Code.GET, "/ps/ask/s", query=("clientid=c1",), observe=0)
    asker.answer(False)
    assert [r.code for r in w.take()] == [Code.FORBIDDEN]


def test_held_datagrams_are_bounded(node: Node, clock, asker):
    from protocols.channel_base import MAX_HELD

    w = SnWire(node, clock, peer=("127.0.0.1", 20002))
    w.send(sn.Connect("s3"))
    w.take()
    w.send(sn.Subscribe(1, "ask/f", qos=0))
    for _ in range(MAX_HELD + 5):
        w.send(sn.PingReq())
    assert node.metrics.get("packets.dropped.authz_pending") == 5
    asker.answer(True)
    got = w.take()
    assert isinstance(got[0], sn.SubAck) and got[1:] == [sn.PingResp()] * MAX_HELD
