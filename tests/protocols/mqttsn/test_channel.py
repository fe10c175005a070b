"""The MQTT-SN channel against the real core, with no sockets and a virtual clock.

:class:`SnWire` plays the datagram shell for one peer (carries out effects, is the
ConnectionHandle); the client side decodes with the codec in client role. MQTT clients
of the same node (``tests.protocols.mqtt.test_channel.client``) check that messages
cross between the protocols.
"""

from __future__ import annotations

import pytest

from gateway.core.authz import Authorizer, Rule
from gateway.core.clock import VirtualScheduler
from gateway.core.deferred import Deferred
from gateway.core.node import CoreSettings, Node
from protocols.effects import Unheld
from protocols.mqtt.packets import Publish as MqttPublish
from protocols.mqtt.packets import SubAck as MqttSubAck
from protocols.mqtt.packets import Subscribe as MqttSubscribe
from protocols.mqtt.packets import Subscription
from protocols.mqttsn.channel import MqttSnChannel, MqttSnSettings, State
from protocols.mqttsn.codec import Codec, Role
from protocols.mqttsn.packets import (
    NORMAL,
    PREDEFINED,
    SHORT,
    ConnAck,
    Connect,
    Disconnect,
    GwInfo,
    Packet,
    PingReq,
    PingResp,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    RegAck,
    Register,
    ReturnCode,
    SearchGw,
    SubAck,
    Subscribe,
    UnsubAck,
    Unsubscribe,
    WillMsg,
    WillMsgReq,
    WillMsgResp,
    WillMsgUpd,
    WillTopic,
    WillTopicReq,
    WillTopicResp,
    WillTopicUpd,
)
from tests.protocols.mqtt.test_channel import client as mqtt_client
from tests.protocols.wire import DatagramWire

RC = ReturnCode
PREDEF = {1: "pre/one", 2: "pre/two"}


class SnWire(DatagramWire[MqttSnChannel, Packet]):
    def __init__(
        self,
        node: Node,
        clock: VirtualScheduler,
        settings: MqttSnSettings | None = None,
        peer: tuple[str, int] = ("127.0.0.1", 20000),
    ) -> None:
        self.channel = MqttSnChannel(
            node, settings or MqttSnSettings(predefined=PREDEF), self, peer=peer,
            monotonic=clock.time,
        )
        self.codec = Codec(Role.CLIENT)
        super().__init__(clock)

    def decode_out(self, data: bytes) -> Packet:
        return self.codec.decode(data)

    def send(self, packet: Packet) -> None:
        self.send_raw(self.codec.encode(packet))


@pytest.fixture
def clock() -> VirtualScheduler:
    return VirtualScheduler()


@pytest.fixture
def node(clock: VirtualScheduler) -> Node:
    rules = [
        Rule("deny", "publish", ("forbidden/#",)),
        Rule("deny", "subscribe", ("secret/#",)),
    ]
    return Node(CoreSettings(), clock, authorizer=Authorizer(rules, "allow"))


def sn(
    node: Node, clock: VirtualScheduler, cid: str, settings: MqttSnSettings | None = None,
    port: int = 20000, **connect: object,
) -> SnWire:
    w = SnWire(node, clock, settings, peer=("127.0.0.1", port))
    w.send(Connect(cid, **connect))  # type: ignore[arg-type]
    assert w.take() == [ConnAck(0)]
    return w


def one_publish(w: SnWire) -> Publish:
    got = [p for p in w.take() if isinstance(p, Publish)]
    assert len(got) == 1, got
    return got[0]


# ------------------------------------------------------------------ connection


def test_searchgw_answered_without_connection(node: Node, clock: VirtualScheduler):
    w = SnWire(node, clock, MqttSnSettings(gateway_id=7))
    w.send(SearchGw(1))
    assert w.take() == [GwInfo(7)]


def test_connect_and_disconnect(node: Node, clock: VirtualScheduler):
    w = sn(node, clock, "c1", duration=30)
    assert node.sessions["c1"].info.protocol == "mqttsn"
    assert "keepalive" in w.timers and "idle" not in w.timers
    w.send(PingReq())
    assert w.take() == [PingResp()]
    w.send(Disconnect())
    assert w.take() == [Disconnect()]
    assert w.closed == "client disconnected" and "c1" not in node.sessions


def test_a_connack_is_marked_to_leave_before_the_store_commits(
    node: Node, clock: VirtualScheduler
):
    w = SnWire(node, clock)
    effects = w.channel.handle_datagram(w.codec.encode(Connect("c1", duration=30)))
    assert effects[0] == Unheld(3)  # the CONNACK, the idle timer's end, the keepalive
    assert w.codec.decode(effects[1]) == ConnAck(0)  # type: ignore[arg-type]


def test_bad_protocol_id_and_empty_client_id_refused(node: Node, clock: VirtualScheduler):
    w = SnWire(node, clock)
    w.send(Connect("x", protocol_id=2))
    assert w.take() == [ConnAck(RC.NOT_SUPPORTED)]
    w.send(Connect(""))
    assert w.take() == [ConnAck(RC.NOT_SUPPORTED)]
    assert not node.sessions


def test_no_connect_within_idle_timeout_forgets_the_peer(node: Node, clock: VirtualScheduler):
    w = SnWire(node, clock, MqttSnSettings(idle_timeout=10))
    w.advance(9)
    assert not w.closed
    w.advance(2)
    assert w.closed


def test_will_dialogue_and_will_on_keepalive_loss(node: Node, clock: VirtualScheduler):
    watcher = mqtt_client(node, clock, "watch")
    watcher.send(MqttSubscribe(1, (Subscription("will/#", qos=1),)))
    watcher.take()
    w = SnWire(node, clock)
    w.send(Connect("dev", duration=10, will=True))
    assert w.take() == [WillTopicReq()]
    w.send(WillTopic("will/dev", qos=1, retain=False))
    assert w.take() == [WillMsgReq()]
    w.send(WillTopic("will/dev", qos=1))  # repeated: our WILLMSGREQ was lost
    assert w.take() == [WillMsgReq()]
    w.send(WillMsg(b"gone"))
    assert w.take() == [ConnAck(0)]
    w.advance(14)
    assert not w.closed
    w.advance(2)  # 10 s x 1.5 without a message
    assert w.closed == "keepalive timeout"
    got = watcher.take()
    assert [(p.topic, p.payload) for p in got if isinstance(p, MqttPublish)] == [
        ("will/dev", b"gone")
    ]


def test_no_will_after_disconnect_and_will_updates(node: Node, clock: VirtualScheduler):
    watcher = mqtt_client(node, clock, "watch")
    watcher.send(MqttSubscribe(1, (Subscription("w/#", qos=0),)))
    watcher.take()
    w = SnWire(node, clock)
    w.send(Connect("dev", will=True))
    w.send(WillTopic("w/a"))
    w.send(WillMsg(b"1"))
    w.take()
    w.send(WillTopicUpd("w/b", qos=0, retain=True))
    assert w.take() == [WillTopicResp(0)]
    w.send(WillMsgUpd(b"2"))
    assert w.take() == [WillMsgResp(0)]
    w.send(Disconnect())
    assert not [p for p in watcher.take() if isinstance(p, MqttPublish)]
    # the updated will goes when the client is lost
    w2 = SnWire(node, clock, peer=("127.0.0.1", 20001))
    w2.send(Connect("dev2", duration=5, will=True))
    w2.send(WillTopic("w/a"))
    w2.send(WillMsg(b"1"))
    w2.send(WillTopicUpd("w/c"))
    w2.send(WillMsgUpd(b"3"))
    w2.advance(10)
    got = [p for p in watcher.take() if isinstance(p, MqttPublish)]
    assert [(p.topic, p.payload) for p in got] == [("w/c", b"3")]
    # an empty WILLTOPICUPD deletes the will
    w3 = SnWire(node, clock, peer=("127.0.0.1", 20002))
    w3.send(Connect("dev3", duration=5, will=True))
    w3.send(WillTopic("w/a"))
    w3.send(WillMsg(b"1"))
    w3.send(WillTopicUpd())
    w3.advance(10)
    assert w3.closed and not [p for p in watcher.take() if isinstance(p, MqttPublish)]


def test_takeover_by_an_mqtt_client_sends_the_will(node: Node, clock: VirtualScheduler):
    watcher = mqtt_client(node, clock, "watch")
    watcher.send(MqttSubscribe(1, (Subscription("w/#", qos=0),)))
    watcher.take()
    w = SnWire(node, clock)
    w.send(Connect("same", will=True))
    w.send(WillTopic("w/x"))
    w.send(WillMsg(b"bye"))
    w.take()
    mqtt_client(node, clock, "same", level=4)
    assert w.take() == [Disconnect()] and w.closed
    assert [p.payload for p in watcher.take() if isinstance(p, MqttPublish)] == [b"bye"]


def test_pending_authentication_answers_later(node: Node, clock: VirtualScheduler):
    pending: list[Deferred[int]] = []

    def authn(client: object, password: object, acc: object) -> Deferred[int]:
        d: Deferred[int] = Deferred()
        pending.append(d)
        return d

    node.hooks.add("client.authenticate", authn)
    w = SnWire(node, clock)
    w.send(Connect("slow"))
    assert w.take() == [] and w.channel.state is State.AUTHENTICATING
    pending[0].resolve(0)
    assert w.take() == [ConnAck(0)] and "slow" in node.sessions
    w2 = SnWire(node, clock, peer=("127.0.0.1", 20001))
    w2.send(Connect("denied"))
    pending[1].resolve(0x86)
    assert w2.take() == [ConnAck(RC.NOT_SUPPORTED)] and "denied" not in node.sessions


# ------------------------------------------------------------------ publish in


def test_register_then_publish_qos0_1_2(node: Node, clock: VirtualScheduler):
    sub = mqtt_client(node, clock, "m")
    sub.send(MqttSubscribe(1, (Subscription("s/#", qos=2),)))
    sub.take()
    w = sn(node, clock, "d")
    w.send(Register(0, 5, "s/t"))
    ack = w.take()[0]
    assert isinstance(ack, RegAck) and ack.msg_id == 5 and ack.return_code == 0
    tid = ack.topic_id
    assert tid >= 1025
    w.send(Register(0, 6, "s/t"))  # the same name keeps its id
    assert w.take() == [RegAck(tid, 6, 0)]
    w.send(Publish(tid, b"q0", qos=0))
    assert w.take() == []
    w.send(Publish(tid, b"q1", qos=1, msg_id=7))
    assert w.take() == [PubAck(tid, 7, 0)]
    w.send(Publish(tid, b"q2", qos=2, msg_id=8))
    assert w.take() == [PubRec(8)]
    w.send(Publish(tid, b"q2", qos=2, msg_id=8, dup=True))  # repeated before PUBREL
    assert w.take() == [PubRec(8)]
    w.send(PubRel(8))
    assert w.take() == [PubComp(8)]
    got = [(p.topic, p.payload, p.qos) for p in sub.take() if isinstance(p, MqttPublish)]
    assert got == [("s/t", b"q0", 0), ("s/t", b"q1", 1), ("s/t", b"q2", 2)]


def test_wildcard_register_refused_and_unknown_topic_id(node: Node, clock: VirtualScheduler):
    w = sn(node, clock, "d")
    w.send(Register(0, 1, "a/+"))
    assert w.take() == [RegAck(0, 1, RC.NOT_SUPPORTED)]
    w.send(Publish(4242, b"x", qos=1, msg_id=2))
    assert w.take() == [PubAck(4242, 2, RC.INVALID_TOPIC_ID)]
    w.send(Publish(99, b"x", qos=0, topic_id_type=PREDEFINED))
    assert w.take() == [PubAck(99, 0, RC.INVALID_TOPIC_ID)]


def test_predefined_and_short_topics(node: Node, clock: VirtualScheduler):
    sub = mqtt_client(node, clock, "m")
    sub.send(MqttSubscribe(1, (Subscription("#", qos=1),)))
    sub.take()
    w = sn(node, clock, "d")
    w.send(Publish(1, b"p", qos=1, msg_id=1, topic_id_type=PREDEFINED))
    assert w.take() == [PubAck(1, 1, 0)]
    w.send(Publish("ab", b"s", qos=1, msg_id=2, topic_id_type=SHORT))
    assert w.take() == [PubAck(int.from_bytes(b"ab", "big"), 2, 0)]
    got = [(p.topic, p.payload) for p in sub.take() if isinstance(p, MqttPublish)]
    assert got == [("pre/one", b"p"), ("ab", b"s")]


def test_qos_minus_one_without_connection(node: Node, clock: VirtualScheduler):
    sub = mqtt_client(node, clock, "m")
    sub.send(MqttSubscribe(1, (Subscription("#", qos=1),)))
    sub.take()
    w = SnWire(node, clock)
    w.send(Publish(2, b"a", qos=-1, topic_id_type=PREDEFINED))
    w.send(Publish("zz", b"b", qos=-1, topic_id_type=SHORT))
    w.send(Publish(5000, b"c", qos=-1, topic_id_type=NORMAL))  # meaningless: dropped
    w.send(Publish("fo", b"d", qos=-1, topic_id_type=SHORT, retain=True))
    assert w.take() == []
    got = [(p.topic, p.payload, p.qos) for p in sub.take() if isinstance(p, MqttPublish)]
    assert got == [("pre/two", b"a", 0), ("zz", b"b", 0), ("fo", b"d", 0)]
    assert node.retainer.match("fo")[0].payload == b"d"
    off = SnWire(node, clock, MqttSnSettings(enable_qos3=False), peer=("127.0.0.1", 9))
    off.send(Publish("zz", b"e", qos=-1, topic_id_type=SHORT))
    assert not [p for p in sub.take() if isinstance(p, MqttPublish)]


def test_publish_without_connection_gets_disconnect(node: Node, clock: VirtualScheduler):
    w = SnWire(node, clock)
    w.send(Publish(1025, b"x", qos=1, msg_id=1))
    assert w.take() == [Disconnect()]
    w.send(Subscribe(1, "a"))
    assert w.take() == [Disconnect()]


def test_publish_denied(node: Node, clock: VirtualScheduler):
    w = sn(node, clock, "d")
    w.send(Register(0, 1, "forbidden/x"))
    tid = w.take()[0].topic_id  # type: ignore[union-attr]
    w.send(Publish(tid, b"x", qos=1, msg_id=2))
    assert w.take() == [PubAck(tid, 2, RC.NOT_SUPPORTED)]


# ------------------------------------------------------------------ subscribe, deliveries


def test_subscribe_by_name_gets_its_id_and_deliveries_use_it(node: Node, clock: VirtualScheduler):
    w = sn(node, clock, "d")
    w.send(Subscribe(1, "x/y", qos=1))
    ack = w.take()[0]
    assert isinstance(ack, SubAck) and ack.return_code == 0 and ack.qos == 1
    pub = mqtt_client(node, clock, "p")
    pub.send(MqttPublish("x/y", b"hello", qos=1, packet_id=1))
    p = one_publish(w)
    assert (p.topic, p.topic_id_type, p.data, p.qos) == (ack.topic_id, NORMAL, b"hello", 1)
    w.send(PubAck(int(p.topic), p.msg_id, 0))
    assert node.sessions["d"].inflight == {}


def test_wildcard_subscription_registers_before_delivering(node: Node, clock: VirtualScheduler):
    w = sn(node, clock, "d")
    w.send(Subscribe(1, "x/#", qos=0))
    assert w.take() == [SubAck(1, 0, 0, 0)]
    pub = mqtt_client(node, clock, "p")
    pub.send(MqttPublish("x/long/topic", b"1"))
    pub.send(MqttPublish("x/long/topic", b"2"))
    reg = w.take()
    assert len(reg) == 1 and isinstance(reg[0], Register) and reg[0].topic_name == "x/long/topic"
    w.send(RegAck(reg[0].topic_id, reg[0].msg_id, 0))
    got = w.take()
    assert [(p.topic, p.data) for p in got if isinstance(p, Publish)] == [
        (reg[0].topic_id, b"1"),
        (reg[0].topic_id, b"2"),
    ]
    pub.send(MqttPublish("x/long/topic", b"3"))  # known now: no REGISTER
    assert one_publish(w).data == b"3"


def test_register_is_retransmitted_and_refusal_drops(node: Node, clock: VirtualScheduler):
    s = MqttSnSettings(retry_interval=5, max_retries=3)
    w = sn(node, clock, "d", s)
    w.send(Subscribe(1, "x/#", qos=1))
    w.take()
    pub = mqtt_client(node, clock, "p")
    pub.send(MqttPublish("x/q", b"1", qos=1, packet_id=1))
    reg = w.take()[0]
    assert isinstance(reg, Register)
    w.advance(5)
    assert w.take() == [reg]
    w.send(RegAck(reg.topic_id, reg.msg_id, RC.NOT_SUPPORTED))
    assert w.take() == []
    assert node.sessions["d"].inflight == {}
    assert node.metrics.get("messages.dropped.topic_refused") == 1


def test_subscribe_short_predefined_and_denied(node: Node, clock: VirtualScheduler):
    w = sn(node, clock, "d")
    w.send(Subscribe(1, "ab", qos=2, topic_id_type=SHORT))
    assert w.take() == [SubAck(1, 0, 2, 0)]
    w.send(Subscribe(2, 2, qos=1, topic_id_type=PREDEFINED))
    assert w.take() == [SubAck(2, 2, 1, 0)]
    w.send(Subscribe(3, 77, qos=1, topic_id_type=PREDEFINED))
    assert w.take() == [SubAck(3, 0, 1, RC.INVALID_TOPIC_ID)]
    w.send(Subscribe(4, "secret/x", qos=0))
    assert w.take() == [SubAck(4, 0, 0, RC.NOT_SUPPORTED)]
    w.send(Subscribe(5, "a/#/b", qos=0))
    assert w.take() == [SubAck(5, 0, 0, RC.NOT_SUPPORTED)]
    pub = mqtt_client(node, clock, "p")
    pub.send(MqttPublish("ab", b"s", qos=2, packet_id=1))
    p = one_publish(w)
    assert (p.topic, p.topic_id_type, p.qos) == ("ab", SHORT, 2)
    w.send(PubRec(p.msg_id))
    assert w.take() == [PubRel(p.msg_id)]
    w.send(PubComp(p.msg_id))
    assert node.sessions["d"].inflight == {}
    pub.send(MqttPublish("pre/two", b"t", qos=1, packet_id=2))
    p = one_publish(w)
    assert (p.topic, p.topic_id_type) == (2, PREDEFINED)
    w.send(Unsubscribe(6, 2, topic_id_type=PREDEFINED))
    assert w.take() == [UnsubAck(6)]
    assert "pre/two" not in node.sessions["d"].subscriptions


def test_retained_message_after_suback(node: Node, clock: VirtualScheduler):
    pub = mqtt_client(node, clock, "p")
    pub.send(MqttPublish("r/t", b"kept", qos=1, retain=True, packet_id=1))
    w = sn(node, clock, "d")
    w.send(Subscribe(1, "r/t", qos=1))
    got = w.take()
    assert isinstance(got[0], SubAck)
    assert isinstance(got[1], Publish) and got[1].retain and got[1].data == b"kept"


def test_qos1_delivery_retransmitted_then_client_lost(node: Node, clock: VirtualScheduler):
    s = MqttSnSettings(retry_interval=10, max_retries=2)
    w = sn(node, clock, "d", s)
    w.send(Subscribe(1, "t/1", qos=1))
    w.take()
    mqtt_client(node, clock, "p").send(MqttPublish("t/1", b"x", qos=1, packet_id=1))
    first = one_publish(w)
    assert not first.dup
    w.advance(10)
    again = one_publish(w)
    assert again.dup and again.msg_id == first.msg_id
    w.advance(10)
    assert one_publish(w).dup
    w.advance(10)
    assert w.closed and "retransmissions" in w.closed


def test_mqttsn_to_mqttsn_qos2(node: Node, clock: VirtualScheduler):
    a = sn(node, clock, "a", port=1)
    b = sn(node, clock, "b", port=2)
    b.send(Subscribe(1, "q/2", qos=2))
    b.take()
    a.send(Register(0, 1, "q/2"))
    tid = a.take()[0].topic_id  # type: ignore[union-attr]
    a.send(Publish(tid, b"exactly once", qos=2, msg_id=9))
    assert a.take() == [PubRec(9)]
    p = one_publish(b)
    assert p.qos == 2 and p.data == b"exactly once"
    b.send(PubRec(p.msg_id))
    assert b.take() == [PubRel(p.msg_id)]
    b.send(PubComp(p.msg_id))
    a.send(PubRel(9))
    assert a.take() == [PubComp(9)]


# ------------------------------------------------------------------ sleeping clients


def test_sleeping_client_gets_buffered_messages_on_wake(node: Node, clock: VirtualScheduler):
    w = sn(node, clock, "sleepy", duration=30)
    w.send(Subscribe(1, "s/+", qos=1))
    w.take()
    w.send(Disconnect(60))
    assert w.take() == [Disconnect()]
    assert w.channel.state is State.ASLEEP and "keepalive" not in w.timers
    pub = mqtt_client(node, clock, "p")
    pub.send(MqttPublish("s/a", b"1", qos=1, packet_id=1))
    pub.send(MqttPublish("s/b", b"2", qos=0))
    pub.send(MqttPublish("s/a", b"3", qos=1, packet_id=2))
    assert w.take() == []
    w.advance(50)  # retransmission timers do not fire while asleep
    assert w.take() == [] and not w.closed
    w.send(PingReq("sleepy"))
    got = w.take()
    regs = [p for p in got if isinstance(p, Register)]
    assert len(regs) == 1 and regs[0].topic_name == "s/a"
    w.send(RegAck(regs[0].topic_id, regs[0].msg_id, 0))
    got = w.take()
    reg2 = got[-1]
    assert isinstance(reg2, Register) and reg2.topic_name == "s/b"
    w.send(RegAck(reg2.topic_id, reg2.msg_id, 0))
    got += w.take()
    pubs = [p for p in got if isinstance(p, Publish)]
    assert [p.data for p in pubs] == [b"1", b"2", b"3"]
    assert isinstance(got[-1], PingResp) and w.channel.state is State.ASLEEP
    for p in pubs:
        if p.qos:
            w.send(PubAck(int(p.topic), p.msg_id, 0))  # acks may come after the PINGRESP
    assert node.sessions["sleepy"].inflight == {}
    # asleep again: the next wake with nothing buffered is just a PINGRESP
    w.send(PingReq("sleepy"))
    assert w.take() == [PingResp()]


def test_sleep_overrun_loses_the_client(node: Node, clock: VirtualScheduler):
    w = sn(node, clock, "s", duration=10)
    w.send(Disconnect(20))
    w.take()
    w.advance(29)
    assert not w.closed
    w.advance(2)
    assert w.closed == "did not wake up within its sleep duration"


def test_connect_from_sleep_reactivates(node: Node, clock: VirtualScheduler):
    w = sn(node, clock, "s", duration=10, clean_session=False)
    w.send(Subscribe(1, "ab", qos=0, topic_id_type=SHORT))
    w.take()
    w.send(Disconnect(100))
    w.take()
    mqtt_client(node, clock, "p").send(MqttPublish("ab", b"while asleep"))
    w.send(Connect("s", duration=10, clean_session=False))
    got = w.take()
    assert got[0] == ConnAck(0)
    assert isinstance(got[1], Publish) and got[1].data == b"while asleep"
    assert w.channel.state is State.ACTIVE


def test_sleep_buffer_bounded(node: Node, clock: VirtualScheduler):
    w = sn(node, clock, "s", MqttSnSettings(max_sleep_buffer=2))
    w.send(Subscribe(1, "ab", qos=0, topic_id_type=SHORT))
    w.take()
    w.send(Disconnect(100))
    w.take()
    pub = mqtt_client(node, clock, "p")
    for i in range(4):
        pub.send(MqttPublish("ab", bytes([48 + i])))
    w.send(PingReq("s"))
    assert [p.data for p in w.take() if isinstance(p, Publish)] == [b"2", b"3"]
    assert node.metrics.get("messages.dropped.sleep_buffer_full") == 2


# ------------------------------------------------------------------ robustness


@pytest.mark.parametrize(
    "raw",
    [b"", b"\x00", b"\x05\x0c\x00", b"\x03\x99\x00", b"\x01\x00\x02\x0c", b"\x04\x13\x00\x00"],
)
def test_malformed_datagrams_are_dropped(node: Node, clock: VirtualScheduler, raw: bytes):
    w = sn(node, clock, "d")
    w.send_raw(raw)
    assert w.take() == [] and not w.closed
    assert node.metrics.get("packets.malformed") == 1
    w.send(PingReq())
    assert w.take() == [PingResp()]


def test_crossing_mqtt_to_mqttsn_and_back(node: Node, clock: VirtualScheduler):
    m = mqtt_client(node, clock, "m")
    m.send(MqttSubscribe(1, (Subscription("from/sn", qos=2),)))
    assert m.take() == [MqttSubAck(1, (2,))]
    w = sn(node, clock, "d")
    w.send(Subscribe(1, "from/mqtt", qos=2))
    w.take()
    for qos in (0, 1, 2):
        m.send(MqttPublish("from/mqtt", b"m%d" % qos, qos=qos, packet_id=qos or None))
        m.take()
        p = one_publish(w)
        assert p.qos == qos and p.data == b"m%d" % qos
        if qos == 1:
            w.send(PubAck(int(p.topic), p.msg_id, 0))
        elif qos == 2:
            w.send(PubRec(p.msg_id))
            w.send(PubComp(p.msg_id))
        w.take()
    w.send(Register(0, 50, "from/sn"))
    tid = w.take()[0].topic_id  # type: ignore[union-attr]
    for qos in (0, 1, 2):
        w.send(Publish(tid, b"s%d" % qos, qos=qos, msg_id=qos))
        if qos == 2:
            w.send(PubRel(2))
        got = [p for p in m.take() if isinstance(p, MqttPublish)]
        assert [(p.payload, p.qos) for p in got] == [(b"s%d" % qos, qos)]


def test_puback_goes_before_the_echo_of_the_same_publish(node: Node, clock: VirtualScheduler):
    """Paho's pub0sub1 sample subscribes to a topic, publishes QoS 1 to it and reads the
    next datagram expecting the PUBACK."""
    w = sn(node, clock, "echo")
    w.send(Subscribe(1, "a long topic name", qos=2))
    tid = w.take()[0].topic_id  # type: ignore[union-attr]
    w.send(Publish(tid, b"mypayload", qos=1, msg_id=2))
    got = w.take()
    assert got[0] == PubAck(tid, 2, 0)
    assert isinstance(got[1], Publish) and got[1].data == b"mypayload"


def test_publish_refused_while_the_store_cannot_write(node: Node, clock: VirtualScheduler):
    """Node.store_refusal (disk full, a write error): QoS 1 gets PUBACK "rejected:
    congestion" (0x01) instead of accepted, QoS 2 gets no PUBREC (the client re-sends);
    nothing is delivered; QoS 0 flows."""
    sub = mqtt_client(node, clock, "m")
    sub.send(MqttSubscribe(1, (Subscription("s/#", qos=2),)))
    sub.take()
    w = sn(node, clock, "d")
    w.send(Register(0, 5, "s/t"))
    tid = w.take()[0].topic_id  # type: ignore[attr-defined]
    node.store_refusal = 0x97
    w.send(Publish(tid, b"q1", qos=1, msg_id=7))
    assert w.take() == [PubAck(tid, 7, 0x01)]
    w.send(Publish(tid, b"q2", qos=2, msg_id=8))
    assert w.take() == []
    w.send(Publish(tid, b"q0", qos=0))
    got = [(p.topic, p.payload) for p in sub.take() if isinstance(p, MqttPublish)]
    assert got == [("s/t", b"q0")]
    node.store_refusal = 0
    w.send(Publish(tid, b"q2", qos=2, msg_id=8, dup=True))  # re-sent: accepted now
    assert w.take() == [PubRec(8)]
