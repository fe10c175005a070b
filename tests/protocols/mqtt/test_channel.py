"""The MQTT channel against the real core, with no sockets and a virtual clock.

A :class:`Wire` plays the transport shell: it carries out effects, keeps the bytes the
channel wrote, decodes them with a client-role codec, and lets the test fire timers.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from gateway.core.authz import Authorizer, Rule
from gateway.core.clock import VirtualScheduler
from gateway.core.node import CoreSettings, Node
from protocols.context import Delivery
from protocols.effects import CancelTimer, Close, Effect, SetTimer, Unheld
from protocols.mqtt.channel import MqttChannel, MqttSettings
from protocols.mqtt.codec import encode
from protocols.mqtt.connection import Connection, Role
from protocols.mqtt.packets import (
    MQTT_5,
    ConnAck,
    Connect,
    Disconnect,
    Packet,
    PingReq,
    PingResp,
    Properties,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    SubAck,
    Subscribe,
    Subscription,
    Will,
)


class Wire:
    def __init__(self, node: Node, clock: VirtualScheduler, settings: MqttSettings, level: int):
        self.clock = clock
        self.channel = MqttChannel(
            node, settings, self, peer=("127.0.0.1", 5555), monotonic=clock.time
        )
        self.client = Connection(Role.CLIENT, protocol_level=level)
        self.timers: dict[str, float] = {}
        self.closed: str | None = None
        self.received: list[Packet] = []
        self._run(self.channel.connection_made())

    # ConnectionHandle
    def deliver(self, deliveries: list[Delivery]) -> None:
        self._run(self.channel.deliver(deliveries))

    def release(self, packet_id: int) -> None:
        self._run(self.channel.release(packet_id))

    def kick(self, reason_code: int) -> None:
        self._run(self.channel.kick(reason_code))

    def call_channel(self, fn: Callable[[], list[Effect]]) -> None:
        if self.closed is None:
            self._run(fn())

    def _run(self, effects: list[Effect]) -> None:
        for e in effects:
            if isinstance(e, bytes):
                assert self.closed is None, "wrote after close"
                self.client.receive_data(e)
                while (p := self.client.next_event()) is not None:
                    self.received.append(p)
            elif isinstance(e, SetTimer):
                self.timers[e.name] = self.clock.time() + e.seconds
            elif isinstance(e, CancelTimer):
                self.timers.pop(e.name, None)
            elif isinstance(e, Close):
                self.closed = e.reason
                self.channel.connection_lost()

    def send(self, packet: Packet) -> None:
        self._run(self.channel.handle_data(self.client.send(packet)))

    def send_raw(self, data: bytes) -> None:
        self._run(self.channel.handle_data(data))

    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)
        for name, when in sorted(self.timers.items(), key=lambda kv: kv[1]):
            if when <= self.clock.time() and self.timers.get(name) == when:
                del self.timers[name]
                self._run(self.channel.on_timer(name))

    def take(self) -> list[Packet]:
        out, self.received = self.received, []
        return out


@pytest.fixture
def clock() -> VirtualScheduler:
    return VirtualScheduler()


@pytest.fixture
def node(clock: VirtualScheduler) -> Node:
    rules = [Rule("deny", "subscribe", ("test/nosubscribe",))]
    return Node(CoreSettings(), clock, authorizer=Authorizer(rules, "allow"))


def client(
    node: Node,
    clock: VirtualScheduler,
    cid: str,
    level: int = MQTT_5,
    settings: MqttSettings | None = None,
    **connect: object,
) -> Wire:
    w = Wire(node, clock, settings or MqttSettings(), level)
    w.send(Connect(cid, protocol_level=level, **connect))  # type: ignore[arg-type]
    ack = w.take()[0]
    assert isinstance(ack, ConnAck)
    w.connack = ack  # type: ignore[attr-defined]
    return w


def test_a_connack_is_marked_to_leave_before_the_store_commits(
    node: Node, clock: VirtualScheduler
) -> None:
    """The CONNACK and its timers are marked ``Unheld`` (the shell sends them without
    waiting for the store); a SUBACK in the same read is not."""
    w = Wire(node, clock, MqttSettings(), 4)
    data = w.client.send(Connect("c", clean_start=False))
    data += w.client.send(Subscribe(1, (Subscription("t", qos=1),)))
    effects = w.channel.handle_data(data)
    assert effects[0] == Unheld(3)  # CONNACK, the idle timer's end, the keepalive
    assert effects[1] == b"\x20\x02\x00\x00" and type(effects[2]) is CancelTimer
    assert type(effects[3]) is SetTimer and effects[4][:1] == b"\x90"  # type: ignore[index]


def test_connect_publish_subscribe_roundtrip(node: Node, clock: VirtualScheduler) -> None:
    sub = client(node, clock, "sub")
    assert sub.connack.reason_code == 0  # type: ignore[attr-defined]
    sub.send(Subscribe(1, (Subscription("a/#", qos=1),)))
    assert sub.take() == [SubAck(1, (1,))]
    pub = client(node, clock, "pub", level=4)
    pub.send(Publish("a/b", b"hi", qos=1, packet_id=7))
    assert pub.take() == [PubAck(7)]
    got = sub.take()
    assert len(got) == 1 and isinstance(got[0], Publish)
    assert got[0].topic == "a/b" and got[0].payload == b"hi" and got[0].qos == 1


@pytest.mark.parametrize("mountpoint", ["", "m/"])
@pytest.mark.parametrize("pub_level,sub_level", [(4, 4), (4, 5), (5, 4), (5, 5), (3, 4)])
@pytest.mark.parametrize("pub_qos,sub_qos", [(0, 0), (1, 1), (1, 0), (0, 1), (2, 1)])
@pytest.mark.parametrize(
    "retain,dup,user",
    [(False, False, False), (True, False, False), (False, True, False), (True, True, True)],
)
def test_delivered_bytes_are_the_canonical_encoding(
    node: Node,
    clock: VirtualScheduler,
    mountpoint: str,
    pub_level: int,
    sub_level: int,
    pub_qos: int,
    sub_qos: int,
    retain: bool,
    dup: bool,
    user: bool,
) -> None:
    """Whether the subscriber's copy is the publisher's bytes reused (same version, no
    properties) or encoded anew, it is exactly what encoding the delivery gives."""
    settings = MqttSettings(mountpoint=mountpoint)
    sub = client(node, clock, "sub", level=sub_level, settings=settings)
    sub.send(Subscribe(1, (Subscription("a/#", qos=sub_qos),)))
    sub.take()
    pub = client(node, clock, "pub", level=pub_level, settings=settings)
    props = Properties(user_properties=(("k", "v"),)) if user and pub_level == MQTT_5 else None
    for i in range(3):  # the second and third copies come from the message's cache
        pub.send(
            Publish(
                "a/b",
                b"payload %d" % i,
                pub_qos,
                retain,
                dup and pub_qos > 0,
                7 + i if pub_qos else None,
                props or Properties(),
            )
        )
        pub.take()
        got = sub.take()
        assert len(got) == 1 and isinstance(got[0], Publish)
        qos = min(pub_qos, sub_qos)
        expected = Publish(
            "a/b",
            b"payload %d" % i,
            qos,
            False,
            False,
            got[0].packet_id if qos else None,
            props if props is not None and sub_level == MQTT_5 else Properties(),
        )
        assert got[0] == expected
        assert got[0].raw == encode(expected, sub_level)


@pytest.mark.parametrize("pub_level", [4, MQTT_5])
def test_fan_out_copies_carry_each_subscribers_packet_id(
    node: Node, clock: VirtualScheduler, pub_level: int
) -> None:
    """One QoS 1 message to five subscribers of each version: the first copy with
    another packet id is patched, later ones are joined from the split bytes
    (_shared_publish's cache forms); each is exactly the canonical encoding with that
    subscriber's own id."""
    subs = []
    for i in range(10):
        level = 4 if i % 2 else MQTT_5
        w = client(node, clock, f"s{i}", level=level)
        w.send(Subscribe(1, (Subscription("f/#", qos=1),)))
        w.take()
        for _ in range(i):  # a different next packet id at every subscriber
            w.channel.session._allocate_pid()  # type: ignore[union-attr]
        subs.append((w, level))
    pub = client(node, clock, "pub", level=pub_level)
    pub.send(Publish("f/x", b"fan-out payload", 1, False, False, 9, Properties()))
    assert pub.take() == [PubAck(9)]
    for i, (w, level) in enumerate(subs):
        got = w.take()
        assert len(got) == 1 and isinstance(got[0], Publish)
        assert got[0].packet_id == i + 1
        expected = Publish("f/x", b"fan-out payload", 1, False, False, i + 1, Properties())
        assert got[0] == expected
        assert got[0].raw == encode(expected, level)


def test_a_batch_of_pubacks_refills_the_window_in_order(
    node: Node, clock: VirtualScheduler
) -> None:
    sub = client(node, clock, "sub", properties=Properties(receive_maximum=2))
    sub.send(Subscribe(1, (Subscription("a/#", qos=1),)))
    sub.take()
    pub = client(node, clock, "pub", level=4)
    for i in range(7):
        pub.send(Publish("a/b", b"%d" % i, 1, packet_id=i + 1))
    got = sub.take()
    assert [p.payload for p in got] == [b"0", b"1"]  # type: ignore[union-attr]
    payloads: list[bytes] = []
    while got:
        # both PUBACKs in one read, then a PINGREQ: the window refills after the batch
        acks = [sub.client.send(PubAck(p.packet_id)) for p in got]  # type: ignore[union-attr, arg-type]
        sub.send_raw(b"".join(acks) + sub.client.send(PingReq()))
        got = sub.take()
        assert got[0] == PingResp()
        got = got[1:]
        assert len(got) <= 2
        payloads += [p.payload for p in got]  # type: ignore[union-attr]
    assert payloads == [b"%d" % i for i in range(2, 7)]


def test_empty_client_id_assigned_in_v5_refused_in_v311_persistent(
    node: Node, clock: VirtualScheduler
) -> None:
    w = client(node, clock, "")
    assert w.connack.properties.assigned_client_identifier  # type: ignore[attr-defined]
    w2 = client(node, clock, "", level=4, clean_start=False)
    assert w2.connack.reason_code == 2 and w2.closed  # type: ignore[attr-defined]


def test_denied_subscribe_codes(node: Node, clock: VirtualScheduler) -> None:
    v5 = client(node, clock, "a")
    v5.send(Subscribe(1, (Subscription("test/nosubscribe", 2), Subscription("ok", 2))))
    assert v5.take() == [SubAck(1, (0x87, 2))]
    v3 = client(node, clock, "b", level=4)
    v3.send(Subscribe(1, (Subscription("test/nosubscribe", 1),)))
    assert v3.take() == [SubAck(1, (0x80,))]


def test_qos2_inbound_exactly_once(node: Node, clock: VirtualScheduler) -> None:
    sub = client(node, clock, "sub")
    sub.send(Subscribe(1, (Subscription("t", 2),)))
    sub.take()
    pub = client(node, clock, "pub")
    pub.send(Publish("t", b"once", qos=2, packet_id=3))
    pub.send(Publish("t", b"once", qos=2, packet_id=3, dup=True))
    assert pub.take() == [PubRec(3), PubRec(3)]
    pub.send(PubRel(3))
    assert pub.take() == [PubComp(3)]
    assert [p.payload for p in sub.take() if isinstance(p, Publish)] == [b"once"]


def test_receive_maximum_exceeded_disconnects_0x93(node: Node, clock: VirtualScheduler) -> None:
    pub = client(node, clock, "pub", settings=MqttSettings(max_inflight=2))
    for pid in (1, 2, 3):
        pub.send(Publish("t", b"x", qos=2, packet_id=pid))
    got = pub.take()
    assert isinstance(got[-1], Disconnect) and got[-1].reason_code == 0x93
    assert got[-1].properties.reason_string == "receive maximum exceeded"
    assert pub.closed


def test_keepalive_timeout_sends_will(node: Node, clock: VirtualScheduler) -> None:
    watcher = client(node, clock, "w")
    watcher.send(Subscribe(1, (Subscription("will", 0),)))
    watcher.take()
    c = client(node, clock, "c", keepalive=10, will=Will("will", b"gone"))
    c.advance(10)
    c.send(PingReq())
    assert c.take() == [PingResp()]
    c.advance(14)  # 1.5 x 10 after the last packet
    assert c.closed is None
    c.advance(2)
    assert c.closed and "keepalive" in c.closed
    assert [p.reason_code for p in c.take() if isinstance(p, Disconnect)] == [0x8D]
    assert [p.payload for p in watcher.take() if isinstance(p, Publish)] == [b"gone"]


def test_takeover_sends_0x8e_to_old_connection(node: Node, clock: VirtualScheduler) -> None:
    old = client(node, clock, "same")
    client(node, clock, "same")
    assert old.take() == [Disconnect(0x8E)] and old.closed


def test_topic_alias_in_and_out(node: Node, clock: VirtualScheduler) -> None:
    sub = client(node, clock, "sub", properties=Properties(topic_alias_maximum=5))
    sub.send(Subscribe(1, (Subscription("long/topic", 0),)))
    sub.take()
    pub = client(node, clock, "pub")
    pub.send(Publish("long/topic", b"1", properties=Properties(topic_alias=1)))
    pub.send(Publish("", b"2", properties=Properties(topic_alias=1)))
    got = [p for p in sub.take() if isinstance(p, Publish)]
    assert [(p.topic, p.properties.topic_alias, p.payload) for p in got] == [
        ("long/topic", 1, b"1"),
        ("", 1, b"2"),
    ]
    pub.send(Publish("", b"3", properties=Properties(topic_alias=9)))
    assert [p.reason_code for p in pub.take() if isinstance(p, Disconnect)] == [0x82]


def test_topic_aliases_are_shared_and_empty_until_used(
    node: Node, clock: VirtualScheduler
) -> None:
    idle = client(node, clock, "idle", properties=Properties(topic_alias_maximum=5))
    assert idle.channel._aliases_in is idle.channel._aliases_out
    assert idle.channel._rare is None and len(idle.channel._aliases_in) == 0
    sub = client(node, clock, "sub", properties=Properties(topic_alias_maximum=5))
    sub.send(Subscribe(1, (Subscription("a/#", 0),)))
    sub.take()
    pub = client(node, clock, "pub")
    for n, topic in enumerate(["a/1", "a/2", "a/1"]):
        pub.send(Publish(topic, b"%d" % n, properties=Properties(topic_alias=n % 2 + 1)))
    pub.send(Publish("", b"3", properties=Properties(topic_alias=2)))
    assert dict(pub.channel._aliases_in) == {1: "a/1", 2: "a/2"}
    got = [p for p in sub.take() if isinstance(p, Publish)]
    assert [(p.topic, p.properties.topic_alias) for p in got] == [
        ("a/1", 1), ("a/2", 2), ("", 1), ("", 2)
    ]
    assert dict(sub.channel._aliases_out) == {"a/1": 1, "a/2": 2}
    assert len(idle.channel._aliases_in) == 0 and len(idle.channel._aliases_out) == 0


def test_message_too_large_for_client_is_not_sent(node: Node, clock: VirtualScheduler) -> None:
    props = Properties(maximum_packet_size=64, topic_alias_maximum=4)
    sub = client(node, clock, "sub", properties=props)
    sub.send(Subscribe(1, (Subscription("t", 1),)))
    sub.take()
    pub = client(node, clock, "pub")
    pub.send(Publish("t", b"x" * 100, qos=1, packet_id=1))
    pub.send(Publish("t", b"small", qos=1, packet_id=2))
    got = [p for p in sub.take() if isinstance(p, Publish)]
    # the dropped message must not have used up the topic's alias: the first message
    # actually written carries the topic name with its new alias
    assert [(p.topic, p.payload, p.properties.topic_alias) for p in got] == [("t", b"small", 1)]
    assert node.metrics.get("messages.dropped.too_large") == 1
    assert list(node.sessions["sub"].inflight) == [got[0].packet_id]  # only the sent one


def test_malformed_packet_closes_only_that_client(node: Node, clock: VirtualScheduler) -> None:
    bad = client(node, clock, "bad")
    good = client(node, clock, "good")
    bad.send_raw(b"\x30\xff\xff\xff\xff\x01")  # remaining length of 5 bytes
    assert bad.closed
    good.send(PingReq())
    assert good.take() == [PingResp()]


def test_unsupported_version_gets_connack_1(node: Node, clock: VirtualScheduler) -> None:
    w = Wire(node, clock, MqttSettings(), 4)
    # CONNECT with protocol level 9
    w.send_raw(b"\x10\x0d\x00\x04MQTT\x09\x02\x00\x3c\x00\x01x")
    assert w.closed
    assert w.received == [] or isinstance(w.received[0], ConnAck)


def test_idle_timeout_without_connect(node: Node, clock: VirtualScheduler) -> None:
    w = Wire(node, clock, MqttSettings(idle_timeout=5), 4)
    w.advance(6)
    assert w.closed
