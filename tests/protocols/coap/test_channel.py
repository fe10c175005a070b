"""The CoAP channel against the real core, with no sockets and a virtual clock.

:class:`CoapWire` plays the datagram shell for one peer; MQTT clients of the same node
(``tests.protocols.mqtt.test_channel.client``) check that messages cross protocols.
"""

from __future__ import annotations

import pytest

from gateway.core.authz import Authorizer, Rule
from gateway.core.clock import VirtualScheduler
from gateway.core.deferred import Deferred
from gateway.core.node import CoreSettings, Node
from protocols.coap.channel import CoapChannel, CoapSettings, State, topic_matches
from protocols.coap.codec import ACK, CON, NON, RST, Block, Code, Message, decode, encode, make
from protocols.mqtt.packets import Publish as MqttPublish
from protocols.mqtt.packets import Subscribe as MqttSubscribe
from protocols.mqtt.packets import Subscription
from tests.protocols.mqtt.test_channel import client as mqtt_client
from tests.protocols.wire import DatagramWire


class CoapWire(DatagramWire[CoapChannel, Message]):
    def __init__(
        self,
        node: Node,
        clock: VirtualScheduler,
        settings: CoapSettings | None = None,
        peer: tuple[str, int] = ("127.0.0.1", 30000),
    ) -> None:
        self.channel = CoapChannel(
            node, settings or CoapSettings(), self, peer=peer, monotonic=clock.time,
            token_factory=lambda: "tok123",
        )
        self.mid = 100
        super().__init__(clock)

    def decode_out(self, data: bytes) -> Message:
        return decode(data)

    def request(
        self,
        code: int,
        path: str,
        payload: bytes = b"",
        *,
        mtype: object = CON,
        query: tuple[str, ...] = (),
        token: bytes = b"t1",
        observe: int | None = None,
        block1: Block | None = None,
        block2: Block | None = None,
        mid: int | None = None,
    ) -> Message:
        if mid is None:
            self.mid += 1
            mid = self.mid
        m = make(mtype, code, mid, token, payload)  # type: ignore[arg-type]
        m.opt.uri_path = tuple(p for p in path.split("/") if p)
        m.opt.uri_query = query
        if observe is not None:
            m.opt.observe = observe
        if block1 is not None:
            m.opt.block1 = block1
        if block2 is not None:
            m.opt.block2 = block2
        self.send_raw(encode(m))
        return m

    def ack(self, mid: int, reset: bool = False) -> None:
        self.send_raw(encode(make(RST if reset else ACK, Code.EMPTY, mid)))


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


def mqtt_sub(node: Node, clock: VirtualScheduler, f: str, qos: int = 1):  # type: ignore[no-untyped-def]
    sub = mqtt_client(node, clock, "watcher")
    sub.send(MqttSubscribe(1, (Subscription(f, qos=qos),)))
    sub.take()
    return sub


def publishes(w) -> list[MqttPublish]:  # type: ignore[no-untyped-def]
    return [p for p in w.take() if isinstance(p, MqttPublish)]


# ------------------------------------------------------------------ publish


def test_post_publishes_con_qos1_non_qos0(node: Node, clock: VirtualScheduler) -> None:
    sub = mqtt_sub(node, clock, "t/#", qos=2)
    w = CoapWire(node, clock)
    req = w.request(Code.POST, "/ps/t/a", b"hello", query=("clientid=c1",))
    [resp] = w.take()
    assert resp.mtype == ACK and resp.mid == req.mid and resp.code == Code.CHANGED
    assert resp.token == b"t1"
    w.request(Code.POST, "/ps/t/b", b"non", mtype=NON)
    [resp2] = w.take()
    assert resp2.mtype == NON and resp2.code == Code.CHANGED
    got = publishes(sub)
    assert [(p.topic, p.payload, p.qos) for p in got] == [("t/a", b"hello", 1), ("t/b", b"non", 0)]
    assert "c1" in node.sessions


def test_publish_query_qos_retain_expiry(node: Node, clock: VirtualScheduler) -> None:
    w = CoapWire(node, clock)
    w.request(Code.POST, "/ps/r/x", b"kept", query=("qos=2", "retain=true", "expiry=60"))
    assert w.take()[0].code == Code.CHANGED
    sub = mqtt_client(node, clock, "late")
    sub.send(MqttSubscribe(1, (Subscription("r/#", qos=2),)))
    [p] = publishes(sub)
    assert p.retain and p.payload == b"kept" and p.qos == 2
    assert p.properties.message_expiry_interval == 60
    for bad in (("qos=3",), ("qos=x",), ("expiry=-1",)):
        w.request(Code.POST, "/ps/r/x", b"", query=bad)
        assert w.take()[0].code == Code.BAD_REQUEST


def test_duplicate_con_answered_again_published_once(node: Node, clock: VirtualScheduler) -> None:
    sub = mqtt_sub(node, clock, "d")
    w = CoapWire(node, clock)
    w.request(Code.POST, "/ps/d", b"1", mid=7)
    first = w.take()
    w.request(Code.POST, "/ps/d", b"1", mid=7)
    again = w.take()
    assert [(m.code, m.mid) for m in again] == [(m.code, m.mid) for m in first]
    assert first[0].code == Code.CHANGED
    assert len(publishes(sub)) == 1


def test_forbidden_and_bad_topics(node: Node, clock: VirtualScheduler) -> None:
    w = CoapWire(node, clock)
    w.request(Code.POST, "/ps/forbidden/x", b"")
    assert w.take()[0].code == Code.FORBIDDEN
    w.request(Code.POST, "/ps/a/+", b"")
    assert w.take()[0].code == Code.BAD_REQUEST
    w.request(Code.GET, "/ps/secret/x", observe=0)
    assert w.take()[0].code == Code.FORBIDDEN
    w.request(Code.POST, "/nothing/here", b"")
    assert w.take()[0].code == Code.NOT_FOUND
    w.request(Code.DELETE, "/ps/a")
    assert w.take()[0].code == Code.METHOD_NOT_ALLOWED


def test_mountpoint(node: Node, clock: VirtualScheduler) -> None:
    sub = mqtt_sub(node, clock, "coap/#")
    w = CoapWire(node, clock, CoapSettings(mountpoint="coap/"))
    w.request(Code.POST, "/ps/x", b"m")
    w.take()
    assert [p.topic for p in publishes(sub)] == ["coap/x"]
    w.request(Code.GET, "/ps/y", observe=0, token=b"ob")
    w.take()
    pub = mqtt_client(node, clock, "p", level=4)
    pub.send(MqttPublish("coap/y", b"down", qos=0))
    pub.send(MqttPublish("y", b"not mine", qos=0))
    notes = w.take()
    assert [n.payload for n in notes] == [b"down"]


# ------------------------------------------------------------------ observe


def test_observe_notifications_increasing_non_qos0_con_qos1(
    node: Node, clock: VirtualScheduler
) -> None:
    w = CoapWire(node, clock)
    w.request(Code.GET, "/ps/o/+", observe=0, token=b"ob0", query=("qos=0",))
    [first] = w.take()
    assert first.code == Code.CONTENT and first.opt.observe is not None and first.payload == b""
    w.request(Code.GET, "/ps/q1", observe=0, token=b"ob1", query=("qos=1",))
    w.take()
    pub = mqtt_client(node, clock, "p", level=4)
    pub.send(MqttPublish("o/a", b"zero", qos=0))
    pub.send(MqttPublish("o/b", b"one", qos=1, packet_id=3))
    pub.send(MqttPublish("q1", b"con", qos=1, packet_id=4))
    notes = w.take()
    assert [(n.payload, n.mtype, n.token) for n in notes] == [
        (b"zero", NON, b"ob0"), (b"one", NON, b"ob0"), (b"con", CON, b"ob1")
    ]
    seqs = [first.opt.observe] + [n.opt.observe for n in notes]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    # the CON is retransmitted until acknowledged, then the session's inflight is free
    w.advance(2.5)
    [again] = w.take()
    assert again.mid == notes[2].mid and again.payload == b"con"
    w.ack(notes[2].mid)
    w.advance(100)
    assert w.take() == []
    session = node.sessions[w.channel.info.client_id]  # type: ignore[union-attr]
    assert not session.inflight  # type: ignore[attr-defined]


def test_unacknowledged_con_cancels_observation(node: Node, clock: VirtualScheduler) -> None:
    w = CoapWire(node, clock)
    w.request(Code.GET, "/ps/z", observe=0, query=("qos=1",))
    w.take()
    pub = mqtt_client(node, clock, "p", level=4)
    pub.send(MqttPublish("z", b"1", qos=1, packet_id=1))
    w.advance(2 + 4 + 8 + 16 + 32 + 1)
    sent = w.take()
    assert len(sent) == 5 and len({m.mid for m in sent}) == 1
    assert w.channel.observations == {}
    cid = w.channel.info.client_id  # type: ignore[union-attr]
    assert not node.sessions[cid].subscriptions


def test_unsubscribe_with_observe_1_and_rst(node: Node, clock: VirtualScheduler) -> None:
    w = CoapWire(node, clock)
    w.request(Code.GET, "/ps/u", observe=0, token=b"a")
    w.request(Code.GET, "/ps/v", observe=0, token=b"b")
    w.take()
    w.request(Code.GET, "/ps/u", observe=1, token=b"a")
    [r] = w.take()
    assert r.code == Code.CONTENT and r.opt.observe is None
    pub = mqtt_client(node, clock, "p", level=4)
    pub.send(MqttPublish("u", b"no", qos=0))
    pub.send(MqttPublish("v", b"yes", qos=0))
    [n] = w.take()
    assert n.payload == b"yes"
    w.ack(n.mid, reset=True)
    pub.send(MqttPublish("v", b"gone", qos=0))
    assert w.take() == []


def test_retained_after_the_observe_answer(node: Node, clock: VirtualScheduler) -> None:
    pub = mqtt_client(node, clock, "p", level=4)
    pub.send(MqttPublish("ret", b"old", qos=0, retain=True))
    w = CoapWire(node, clock)
    w.request(Code.GET, "/ps/ret", observe=0)
    first, note = w.take()
    assert first.opt.observe is not None and first.payload == b""
    assert note.payload == b"old" and note.opt.observe > first.opt.observe


def test_coap_to_coap(node: Node, clock: VirtualScheduler) -> None:
    a = CoapWire(node, clock, peer=("127.0.0.1", 1))
    b = CoapWire(node, clock, peer=("127.0.0.1", 2))
    b.request(Code.GET, "/ps/x", observe=0)
    b.take()
    a.request(Code.POST, "/ps/x", b"hi", mtype=NON)
    assert [m.payload for m in b.take()] == [b"hi"]


# ------------------------------------------------------------------ connection mode


def test_connection_mode(node: Node, clock: VirtualScheduler) -> None:
    w = CoapWire(node, clock, CoapSettings(connection_required=True, heartbeat=30))
    w.request(Code.POST, "/ps/a", b"x")
    assert w.take()[0].code == Code.BAD_REQUEST  # no clientid/token
    w.request(Code.POST, "/mqtt/connection", query=("clientid=dev1", "username=u"))
    [r] = w.take()
    assert r.code == Code.CREATED and r.payload == b"tok123"
    assert "dev1" in node.sessions
    w.request(Code.POST, "/ps/a", b"x", query=("clientid=dev1",))
    assert w.take()[0].code == Code.BAD_REQUEST
    w.request(Code.POST, "/ps/a", b"x", query=("clientid=dev1", "token=bad"))
    assert w.take()[0].code == Code.UNAUTHORIZED
    w.request(Code.POST, "/ps/a", b"x", query=("clientid=dev1", "token=tok123"))
    assert w.take()[0].code == Code.CHANGED
    w.advance(40)
    w.request(Code.PUT, "/mqtt/connection", query=("clientid=dev1", "token=tok123"))
    assert w.take()[0].code == Code.CHANGED
    w.advance(40)
    assert w.closed is None
    w.request(Code.DELETE, "/mqtt/connection", query=("clientid=dev1", "token=tok123"))
    assert w.take()[0].code == Code.DELETED and w.closed and "dev1" not in node.sessions


def test_connection_heartbeat_lapses(node: Node, clock: VirtualScheduler) -> None:
    w = CoapWire(node, clock, CoapSettings(heartbeat=10))
    w.request(Code.POST, "/mqtt/connection", query=("clientid=hb",))
    w.take()
    w.advance(16)
    assert w.closed and "hb" not in node.sessions


def test_authentication_refused_and_pending(node: Node, clock: VirtualScheduler) -> None:
    pending: list[Deferred[int]] = []

    def authn(client: object, password: object, acc: object) -> Deferred[int]:
        d: Deferred[int] = Deferred()
        pending.append(d)
        return d

    node.hooks.add("client.authenticate", authn)
    w = CoapWire(node, clock)
    w.request(Code.POST, "/ps/a", b"1", query=("clientid=slow", "password=pw"))
    w.request(Code.POST, "/ps/a", b"2", query=("clientid=slow",))
    assert w.take() == [] and w.channel.state is State.AUTHENTICATING
    pending[0].resolve(0)
    assert [m.code for m in w.take()] == [Code.CHANGED, Code.CHANGED]
    w2 = CoapWire(node, clock, peer=("127.0.0.1", 2))
    w2.request(Code.POST, "/mqtt/connection", query=("clientid=no", "password=x"))
    pending[1].resolve(0x86)
    assert [m.code for m in w2.take()] == [Code.UNAUTHORIZED]
    assert "no" not in node.sessions


def test_idle_connectionless_peer_forgotten(node: Node, clock: VirtualScheduler) -> None:
    w = CoapWire(node, clock, CoapSettings(idle_timeout=20))
    w.request(Code.POST, "/ps/a", b"1", query=("clientid=idle",))
    w.advance(25)
    assert w.closed and "idle" not in node.sessions


def test_observer_kept_past_idle_probe_goes_con(node: Node, clock: VirtualScheduler) -> None:
    w = CoapWire(node, clock, CoapSettings(idle_timeout=20))
    w.request(Code.GET, "/ps/p", observe=0)
    w.take()
    w.advance(25)
    assert w.closed is None
    pub = mqtt_client(node, clock, "p", level=4)
    pub.send(MqttPublish("p", b"probe", qos=0))
    [n] = w.take()
    assert n.mtype == CON


def test_takeover_kicks(node: Node, clock: VirtualScheduler) -> None:
    w = CoapWire(node, clock)
    w.request(Code.POST, "/ps/a", b"1", query=("clientid=same",))
    mqtt_client(node, clock, "same", level=4)
    assert w.closed


# ------------------------------------------------------------------ blockwise


def test_block1_upload_reassembled(node: Node, clock: VirtualScheduler) -> None:
    sub = mqtt_sub(node, clock, "big")
    w = CoapWire(node, clock)
    body = bytes(range(256)) * 12  # 3072 bytes, three 1024 blocks
    for i in range(3):
        more = i < 2
        w.request(Code.POST, "/ps/big", body[i * 1024 : (i + 1) * 1024],
                  block1=Block(i, more, 6))
        [r] = w.take()
        assert r.code == (Code.CONTINUE if more else Code.CHANGED)
        if more:
            assert r.opt.block1 == Block(i, True, 6)
    [p] = publishes(sub)
    assert p.payload == body


def test_block1_larger_blocks_negotiated_down_and_out_of_order(
    node: Node, clock: VirtualScheduler
) -> None:
    w = CoapWire(node, clock, CoapSettings(block_size=512))
    w.request(Code.POST, "/ps/b", b"a" * 1024, block1=Block(0, True, 6))
    [r] = w.take()
    assert r.code == Code.CONTINUE and r.opt.block1.size_exponent == 5
    w.request(Code.POST, "/ps/b", b"b" * 512, block1=Block(2, True, 5))
    [r] = w.take()
    assert r.code == Code.CONTINUE
    w.request(Code.POST, "/ps/b", b"c" * 512, block1=Block(5, False, 5))
    assert w.take()[0].code == Code.REQUEST_ENTITY_INCOMPLETE


def test_block1_too_large(node: Node, clock: VirtualScheduler) -> None:
    w = CoapWire(node, clock, CoapSettings(max_body=2048))
    for i in range(3):
        w.request(Code.POST, "/ps/b", b"x" * 1024, block1=Block(i, True, 6))
    assert [m.code for m in w.take()] == [
        Code.CONTINUE, Code.CONTINUE, Code.REQUEST_ENTITY_TOO_LARGE
    ]


def test_block2_large_notification(node: Node, clock: VirtualScheduler) -> None:
    w = CoapWire(node, clock)
    w.request(Code.GET, "/ps/large", observe=0, token=b"L")
    w.take()
    body = b"0123456789" * 300
    pub = mqtt_client(node, clock, "p", level=4)
    pub.send(MqttPublish("large", body, qos=0))
    [n] = w.take()
    assert n.opt.block2 == Block(0, True, 6) and n.opt.size2 == 3000 and len(n.payload) == 1024
    got = bytearray(n.payload)
    num = 1
    while True:
        w.request(Code.GET, "/ps/large", token=b"L2", block2=Block(num, False, 6))
        [r] = w.take()
        got += r.payload
        if not r.opt.block2.more:
            break
        num += 1
    assert bytes(got) == body


# ------------------------------------------------------------------ malformed


def test_malformed_gets_4_00_and_changes_nothing(node: Node, clock: VirtualScheduler) -> None:
    w = CoapWire(node, clock)
    w.request(Code.GET, "/ps/m", observe=0)
    w.take()
    w.send_raw(b"\x41\x02\x12\x34T" + b"\xd0")  # option delta 13 without its extension byte
    [r] = w.take()
    assert r.code == Code.BAD_REQUEST and r.mid == 0x1234 and r.token == b"T" and r.mtype == ACK
    w.send_raw(b"\x01")
    w.send_raw(b"\x80\x01\x00\x00")  # version 2
    assert w.take() == []
    assert w.closed is None and w.channel.observations
    assert node.metrics.get("packets.malformed") >= 2  # type: ignore[attr-defined]


def test_ping_and_unknown_critical_option(node: Node, clock: VirtualScheduler) -> None:
    w = CoapWire(node, clock)
    w.send_raw(encode(make(CON, Code.EMPTY, 9)))
    [r] = w.take()
    assert r.mtype == RST and r.mid == 9
    m = make(CON, Code.POST, 10, b"k")
    m.opt.uri_path = ("ps", "a")
    raw = bytearray(encode(m))
    # append an unknown critical option 2049 (delta from 11 is 2038: 14 -> 2 bytes)
    raw += bytes([0xE0]) + (2049 - 11 - 269).to_bytes(2, "big")
    w.send_raw(bytes(raw))
    [r] = w.take()
    assert r.code == Code.BAD_OPTION


@pytest.mark.parametrize(
    ("f", "t", "ok"),
    [("a/+", "a/b", True), ("a/#", "a", True), ("#", "$SYS/x", False), ("a/b", "a/b/c", False),
     ("+/+", "a/b", True), ("a", "a", True), ("a/+/c", "a/b/d", False)],
)
def test_topic_matches(f: str, t: str, ok: bool) -> None:
    assert topic_matches(f, t) is ok
