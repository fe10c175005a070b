"""The WebSocket layer around an unchanged MqttChannel, sans-IO and on a virtual clock.

A :class:`WsWire` plays the stream shell (it carries out effects and is the
ConnectionHandle); the client side is the ``websockets`` library's own sans-IO
``ClientProtocol`` plus our MQTT codec in client role, so every byte the server writes
is parsed by independent code.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable

import pytest
from websockets.client import ClientProtocol
from websockets.frames import Frame, Opcode
from websockets.http11 import Response
from websockets.typing import Origin, Subprotocol
from websockets.uri import parse_uri

from gateway.core.clock import VirtualScheduler
from gateway.core.node import CoreSettings, Node
from gateway.net.websocket import WebSocketChannel, WebSocketSettings, forwarded_peer
from protocols.context import ConnectionHandle, Delivery
from protocols.effects import CancelTimer, Close, Effect, SetTimer, Unheld
from protocols.mqtt.channel import MqttChannel, MqttSettings
from protocols.mqtt.connection import Connection, Role
from protocols.mqtt.packets import (
    MQTT_5,
    ConnAck,
    Connect,
    Packet,
    PingReq,
    PingResp,
    Publish,
    SubAck,
    Subscribe,
    Subscription,
)

TRUSTED = [ipaddress.ip_network("127.0.0.0/8"), ipaddress.ip_network("::1/128")]


class WsWire:
    """The stream shell for one WebSocket connection, plus a client at the other end."""

    def __init__(
        self,
        node: Node,
        clock: VirtualScheduler,
        settings: WebSocketSettings | None = None,
        *,
        peer: tuple[str, int] = ("127.0.0.1", 40000),
        subprotocols: list[str] | None = None,
        origin: str | None = None,
        path: str = "/mqtt",
        headers: dict[str, str] | None = None,
        level: int = 4,
    ) -> None:
        self.clock = clock
        self.node = node
        self.timers: dict[str, float] = {}
        self.closed: str | None = None
        self.wire: list[bytes] = []
        self.inner: MqttChannel | None = None

        def make_inner(handle: ConnectionHandle, peer: tuple[str, int] | None) -> MqttChannel:
            self.inner = MqttChannel(
                node, MqttSettings(listener="ws:default"), handle, peer=peer,
                monotonic=clock.time,
            )
            return self.inner

        self.channel = WebSocketChannel(settings or WebSocketSettings(), self, peer, make_inner)
        self.ws = ClientProtocol(
            parse_uri(f"ws://gateway{path}"),
            origin=Origin(origin) if origin else None,
            subprotocols=[Subprotocol(p) for p in (subprotocols or [])] or None,
        )
        self.request = self.ws.connect()
        for k, v in (headers or {}).items():
            self.request.headers[k] = v
        self.mqtt = Connection(Role.CLIENT, protocol_level=level)
        self.response: Response | None = None
        self.frames: list[Frame] = []
        self.packets: list[Packet] = []
        self._run(self.channel.connection_made())

    # ConnectionHandle (what the core and later results use)
    def deliver(self, deliveries: list[Delivery]) -> None:
        self._run(self.channel.deliver(deliveries))

    def release(self, packet_id: int) -> None:
        self._run(self.channel.release(packet_id))

    def kick(self, reason_code: int) -> None:
        self._run(self.channel.kick(reason_code))

    def call_channel(self, fn: Callable[[], list[Effect]]) -> None:
        self._run(fn())

    def _run(self, effects: list[Effect]) -> None:
        for e in effects:
            if isinstance(e, bytes):
                assert self.closed is None, "wrote after close"
                self.wire.append(e)
                self.ws.receive_data(e)
                for ev in self.ws.events_received():
                    if isinstance(ev, Response):
                        self.response = ev
                    else:
                        assert isinstance(ev, Frame)
                        self.frames.append(ev)
                        if ev.opcode in (Opcode.BINARY, Opcode.CONT):
                            self.mqtt.receive_data(bytes(ev.data))
                            while (p := self.mqtt.next_event()) is not None:
                                self.packets.append(p)
            elif isinstance(e, SetTimer):
                self.timers[e.name] = self.clock.time() + e.seconds
            elif isinstance(e, CancelTimer):
                self.timers.pop(e.name, None)
            elif isinstance(e, Close):
                self.closed = e.reason
                self.channel.connection_lost()

    # client actions
    def handshake(self) -> Response:
        self.ws.send_request(self.request)
        self.send_client_data()
        assert self.response is not None
        return self.response

    def send_client_data(self) -> None:
        for data in self.ws.data_to_send():
            if data:
                self._run(self.channel.handle_data(data))

    def send_frames(self, *payloads: bytes, opcode: Opcode = Opcode.BINARY) -> None:
        for p in payloads:
            if opcode is Opcode.TEXT:
                self.ws.send_text(p)
            else:
                self.ws.send_binary(p)
        self.send_client_data()

    def send(self, *packets: Packet) -> None:
        self.send_frames(b"".join(self.mqtt.send(p) for p in packets))

    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)
        for name, when in sorted(self.timers.items(), key=lambda kv: kv[1]):
            if when <= self.clock.time() and self.timers.get(name) == when:
                del self.timers[name]
                self._run(self.channel.on_timer(name))

    def take(self) -> list[Packet]:
        out, self.packets = self.packets, []
        return out


@pytest.fixture
def clock() -> VirtualScheduler:
    return VirtualScheduler()


@pytest.fixture
def node(clock: VirtualScheduler) -> Node:
    return Node(CoreSettings(), clock)


@pytest.mark.parametrize("proto", ["mqtt", "mqtt-v3.1.1", "mqtt-v3", "mqtt-v5"])
def test_each_mqtt_subprotocol_is_accepted(node: Node, clock: VirtualScheduler, proto: str):
    w = WsWire(node, clock, subprotocols=["chat", proto])
    r = w.handshake()
    assert r.status_code == 101
    assert r.headers["Sec-WebSocket-Protocol"] == proto
    assert "ws:handshake" not in w.timers and "idle" in w.timers  # MQTT's CONNECT wait
    w.send(Connect("c1"))
    assert w.take() == [ConnAck(False, 0)]
    assert w.frames[-1].opcode is Opcode.BINARY


def test_no_subprotocol_is_400_unless_configured(node: Node, clock: VirtualScheduler):
    w = WsWire(node, clock)
    assert w.handshake().status_code == 400
    assert w.closed and w.inner is None
    lax = WebSocketSettings(fail_if_no_subprotocol=False)
    w2 = WsWire(node, clock, lax)
    r = w2.handshake()
    assert r.status_code == 101 and "Sec-WebSocket-Protocol" not in r.headers
    w2.send(Connect("c2"))
    assert w2.take() == [ConnAck(False, 0)]


def test_unknown_subprotocol_only_is_400(node: Node, clock: VirtualScheduler):
    w = WsWire(node, clock, subprotocols=["chat"])
    assert w.handshake().status_code == 400 and w.closed


def test_wrong_path_is_404_and_query_is_ignored(node: Node, clock: VirtualScheduler):
    w = WsWire(node, clock, subprotocols=["mqtt"], path="/other")
    assert w.handshake().status_code == 404 and w.closed
    w2 = WsWire(node, clock, subprotocols=["mqtt"], path="/mqtt?token=x")
    assert w2.handshake().status_code == 101
    custom = WsWire(node, clock, WebSocketSettings(path="/ws"), subprotocols=["mqtt"], path="/ws")
    assert custom.handshake().status_code == 101


def test_text_frame_closes_with_1003(node: Node, clock: VirtualScheduler):
    w = WsWire(node, clock, subprotocols=["mqtt"])
    w.handshake()
    w.send(Connect("t1"))
    assert w.take() == [ConnAck(False, 0)]
    w.send_frames(b"hello", opcode=Opcode.TEXT)
    assert w.closed
    close = [f for f in w.frames if f.opcode is Opcode.CLOSE]
    assert close and int.from_bytes(close[0].data[:2], "big") == 1003
    assert "t1" not in node.sessions or node.sessions["t1"].handle is None


def test_packet_spanning_frames_and_packets_sharing_a_frame(
    node: Node, clock: VirtualScheduler
) -> None:
    w = WsWire(node, clock, subprotocols=["mqtt"])
    w.handshake()
    raw = w.mqtt.send(Connect("span", keepalive=30))
    for i in range(len(raw)):  # one byte per frame
        w.send_frames(raw[i : i + 1])
    assert w.take() == [ConnAck(False, 0)]
    # SUBSCRIBE + PUBLISH + PINGREQ in one frame, then a packet cut across a fragmented message
    w.send(Subscribe(1, (Subscription("a/#", qos=1),)), Publish("a/b", b"x"), PingReq())
    got = w.take()
    assert got[0] == SubAck(1, (1,))
    assert isinstance(got[1], Publish) and got[1].payload == b"x"
    assert got[2] == PingResp()
    data = w.mqtt.send(Publish("a/c", b"y" * 300))
    w.ws.send_binary(data[:10], fin=False)
    w.ws.send_continuation(data[10:200], fin=False)
    w.ws.send_continuation(data[200:], fin=True)
    w.send_client_data()
    got = w.take()
    assert len(got) == 1 and isinstance(got[0], Publish) and got[0].payload == b"y" * 300


def test_an_unheld_connack_is_recounted_in_frames(node: Node, clock: VirtualScheduler):
    w = WsWire(node, clock, subprotocols=["mqtt"])
    w.handshake()
    w.ws.send_binary(w.mqtt.send(Connect("c1", clean_start=False))
                     + w.mqtt.send(Subscribe(1, (Subscription("t", 1),))))
    data = b"".join(d for d in w.ws.data_to_send() if d)
    effects = w.channel.handle_data(data)
    assert type(effects[0]) is Unheld
    n = effects[0].count
    covered, rest = effects[1:n + 1], effects[n + 1:]
    w._run(covered)
    assert w.take() == [ConnAck(False, 0)]  # the CONNACK's frame, and its timers
    assert [type(e) for e in covered if type(e) is not bytes] == [CancelTimer, SetTimer]
    w._run(rest)
    assert w.take() == [SubAck(1, (1,))]  # not covered: a shell holds it for the store


def test_mqtt5_over_websocket(node: Node, clock: VirtualScheduler):
    w = WsWire(node, clock, subprotocols=["mqtt-v5"], level=MQTT_5)
    w.handshake()
    w.send(Connect("v5", protocol_level=MQTT_5))
    ack = w.take()[0]
    assert isinstance(ack, ConnAck) and ack.reason_code == 0


def test_client_close_frame_ends_the_session_with_will(node: Node, clock: VirtualScheduler):
    w = WsWire(node, clock, subprotocols=["mqtt"])
    w.handshake()
    w.send(Connect("bye"))
    w.take()
    assert node.sessions["bye"].handle is w.channel.handle
    w.ws.send_close(1000)
    w.send_client_data()
    assert w.closed
    assert "bye" not in node.sessions  # clean session ended


def test_mqtt_disconnect_sends_a_close_frame(node: Node, clock: VirtualScheduler):
    from protocols.mqtt.packets import Disconnect

    w = WsWire(node, clock, subprotocols=["mqtt"])
    w.handshake()
    w.send(Connect("d"))
    w.send(Disconnect())
    assert w.closed == "client disconnected"
    assert w.frames[-1].opcode is Opcode.CLOSE


def test_handshake_timeout(node: Node, clock: VirtualScheduler):
    w = WsWire(node, clock, WebSocketSettings(handshake_timeout=5))
    w.advance(4.9)
    assert not w.closed
    w.advance(0.2)
    assert w.closed == "websocket handshake timeout"


def test_origin_check(node: Node, clock: VirtualScheduler):
    s = WebSocketSettings(check_origin=True, origins=("https://app.example",))
    ok = WsWire(node, clock, s, subprotocols=["mqtt"], origin="https://app.example")
    assert ok.handshake().status_code == 101
    bad = WsWire(node, clock, s, subprotocols=["mqtt"], origin="https://evil.example")
    assert bad.handshake().status_code == 403 and bad.closed
    absent = WsWire(node, clock, s, subprotocols=["mqtt"])
    assert absent.handshake().status_code == 101
    strict = WebSocketSettings(
        check_origin=True, allow_origin_absence=False, origins=("https://app.example",)
    )
    assert WsWire(node, clock, strict, subprotocols=["mqtt"]).handshake().status_code == 403


def test_x_forwarded_for_from_a_trusted_proxy(node: Node, clock: VirtualScheduler):
    headers = {"X-Forwarded-For": "198.51.100.7, 127.0.0.2", "X-Forwarded-Port": "5123"}
    w = WsWire(node, clock, subprotocols=["mqtt"], headers=headers)
    w.handshake()
    w.send(Connect("fwd"))
    info = node.sessions["fwd"].info
    assert (info.peer_host, info.peer_port) == ("198.51.100.7", 5123)
    # the same headers from an untrusted peer are ignored
    w2 = WsWire(node, clock, subprotocols=["mqtt"], headers=headers, peer=("203.0.113.5", 7))
    w2.handshake()
    w2.send(Connect("direct"))
    info2 = node.sessions["direct"].info
    assert (info2.peer_host, info2.peer_port) == ("203.0.113.5", 7)
    # disabled
    off = WebSocketSettings(proxy_address_header="")
    w3 = WsWire(node, clock, off, subprotocols=["mqtt"], headers=headers)
    w3.handshake()
    w3.send(Connect("off"))
    assert node.sessions["off"].info.peer_host == "127.0.0.1"


@pytest.mark.parametrize(
    ("xff", "port", "expected"),
    [
        ("198.51.100.7", None, ("198.51.100.7", 40000)),
        ("198.51.100.7, 10.0.0.1", "80", ("10.0.0.1", 80)),
        ("198.51.100.7, 127.0.0.5", "1,2", ("198.51.100.7", 2)),
        ("127.0.0.9", None, ("127.0.0.9", 40000)),  # only proxies: the left-most
        ("unknown", None, ("127.0.0.1", 40000)),
        ("[2001:db8::1]:443", "x", ("2001:db8::1", 40000)),
        ("", None, ("127.0.0.1", 40000)),
    ],
)
def test_forwarded_peer(xff: str, port: str | None, expected: tuple[str, int]) -> None:
    assert forwarded_peer(("127.0.0.1", 40000), xff, port, TRUSTED) == expected


def test_deliveries_are_framed(node: Node, clock: VirtualScheduler):
    sub = WsWire(node, clock, subprotocols=["mqtt"])
    sub.handshake()
    sub.send(Connect("s"), Subscribe(1, (Subscription("t", qos=1),)))
    sub.take()
    pub = WsWire(node, clock, subprotocols=["mqtt"])
    pub.handshake()
    pub.send(Connect("p"), Publish("t", b"1", qos=1, packet_id=3), Publish("t", b"2"))
    got = sub.take()
    assert [p.payload for p in got if isinstance(p, Publish)] == [b"1", b"2"]


def test_keepalive_timer_reaches_inner_channel(node: Node, clock: VirtualScheduler):
    w = WsWire(node, clock, subprotocols=["mqtt"])
    w.handshake()
    w.send(Connect("k", keepalive=10))
    w.advance(16)
    assert w.closed == "keepalive timeout"
    assert w.frames[-1].opcode is Opcode.CLOSE


def test_frames_before_a_close_in_the_same_read_all_count(node: Node, clock: VirtualScheduler):
    """MQTT.js writes each piece of a packet as its own frame and closes at once: the
    PUBLISH, the DISCONNECT and the close frame may arrive in one read."""
    from protocols.mqtt.packets import Disconnect

    sub = WsWire(node, clock, subprotocols=["mqtt"])
    sub.handshake()
    sub.send(Connect("s"), Subscribe(1, (Subscription("t", qos=0),)))
    sub.take()
    w = WsWire(node, clock, subprotocols=["mqtt"])
    w.handshake()
    w.send(Connect("p"))
    raw = w.mqtt.send(Publish("t", b"last words")) + w.mqtt.send(Disconnect())
    for i in range(len(raw)):
        w.ws.send_binary(raw[i : i + 1])
    w.ws.send_close(1000)
    w._run(w.channel.handle_data(b"".join(w.ws.data_to_send())))
    assert w.closed
    got = sub.take()
    assert len(got) == 1 and isinstance(got[0], Publish) and got[0].payload == b"last words"


def test_malformed_frames_close_only_that_connection(node: Node, clock: VirtualScheduler):
    other = WsWire(node, clock, subprotocols=["mqtt"])
    other.handshake()
    other.send(Connect("other"), Subscribe(1, (Subscription("t", qos=0),)))
    other.take()
    bad = WsWire(node, clock, subprotocols=["mqtt"])
    bad.handshake()
    bad.send(Connect("bad"))
    # an unmasked frame from a client, with a reserved opcode: a protocol error (1002)
    bad._run(bad.channel.handle_data(b"\x83\x02ab"))
    assert bad.closed
    # garbage MQTT inside a well-formed frame: the MQTT channel refuses it
    bad2 = WsWire(node, clock, subprotocols=["mqtt"])
    bad2.handshake()
    bad2.send(Connect("bad2"))
    bad2.send_frames(b"\xf0\x00")  # reserved MQTT packet type 15 in 3.1.1
    assert bad2.closed
    pub = WsWire(node, clock, subprotocols=["mqtt"])
    pub.handshake()
    pub.send(Connect("p"), Publish("t", b"fine"))
    assert [p.payload for p in other.take() if isinstance(p, Publish)] == [b"fine"]
