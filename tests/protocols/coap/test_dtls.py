"""CoAP over DTLS (PSK): ``gateway.net.dtls.DtlsChannel`` around a CoAP channel on a real
core, against a python-mbedtls client buffer; no sockets, a virtual clock."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path

import pytest

from gateway.core.clock import VirtualScheduler
from gateway.core.node import CoreSettings, Node
from protocols.coap.channel import CoapChannel, CoapSettings
from protocols.coap.codec import CON, Code, Message, decode, encode, make
from protocols.context import ConnectionHandle, Delivery
from protocols.effects import Close, Effect
from protocols.lwm2m.channel import Lwm2mChannel, Lwm2mSettings
from protocols.mqtt.packets import Publish as MqttPublish
from protocols.mqtt.packets import Subscribe as MqttSubscribe
from protocols.mqtt.packets import Subscription
from tests.protocols.mqtt.test_channel import client as mqtt_client

tls = pytest.importorskip("mbedtls.tls")
from gateway.net.dtls import DtlsChannel, DtlsError, load_psk_file, server_context  # noqa: E402

ADDR = ("127.0.0.1", 40000)


class Pipe:
    """The datagram shell for one DTLS peer, and the client's side of the wire."""

    def __init__(
        self, node: Node, clock: VirtualScheduler, psk: tuple[str, bytes], lwm2m: bool = False
    ) -> None:
        ctx = server_context({"dev1": b"secret"})
        self.closed: str | None = None
        self.to_client: list[bytes] = []

        def inner(handle: ConnectionHandle, addr: tuple[str, int]) -> object:
            if lwm2m:
                return Lwm2mChannel(node, Lwm2mSettings(), handle, peer=addr,
                                    monotonic=clock.time)
            return CoapChannel(node, CoapSettings(), handle, peer=addr, monotonic=clock.time)

        self.channel = DtlsChannel(ctx, self, ADDR, inner)
        self._run(self.channel.connection_made())
        conf = tls.DTLSConfiguration(pre_shared_key=psk, validate_certificates=False)
        self.client = tls.ClientContext(conf).wrap_buffers(server_hostname=None)

    # ConnectionHandle (the shell's peer)
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
                self.to_client.append(e)
            elif isinstance(e, Close):
                self.closed = e.reason
                self.channel.connection_lost()

    def _client_out(self) -> None:
        while data := self.client.peek_outgoing(65536):
            self.client.consume_outgoing(len(data))
            self._run(self.channel.handle_datagram(bytes(data)))

    def _client_in(self) -> None:
        pending, self.to_client = self.to_client, []
        for d in pending:
            self.client.receive_from_network(d)

    def handshake(self) -> None:
        over = tls.HandshakeStep.HANDSHAKE_OVER
        for _ in range(50):
            if self.client._handshake_state is over or self.closed:
                return
            with contextlib.suppress(tls.WantReadError, tls.WantWriteError):
                self.client.do_handshake()
            self._client_out()
            self._client_in()
        raise AssertionError("handshake did not finish")

    def request(self, m: Message) -> None:
        self.client.write(encode(m))
        self._client_out()

    def received(self) -> list[Message]:
        self._client_in()
        out = []
        while True:
            try:
                data = self.client.read(65536)
            except tls.WantReadError:
                break
            if not data:
                break
            out.append(decode(bytes(data)))
        return out


@pytest.fixture
def clock() -> VirtualScheduler:
    return VirtualScheduler()


@pytest.fixture
def node(clock: VirtualScheduler) -> Node:
    return Node(CoreSettings(), clock)


def test_psk_publish_and_observe(node: Node, clock: VirtualScheduler) -> None:
    sub = mqtt_client(node, clock, "watcher")
    sub.send(MqttSubscribe(1, (Subscription("d/#", qos=1),)))
    sub.take()
    p = Pipe(node, clock, ("dev1", b"secret"))
    p.handshake()
    assert p.closed is None and p.channel.inner is not None
    post = make(CON, Code.POST, 1, b"t", b"sealed")
    post.opt.uri_path = ("ps", "d", "x")
    p.request(post)
    [r] = p.received()
    assert r.code == Code.CHANGED and r.mid == 1
    got = [x for x in sub.take() if isinstance(x, MqttPublish)]
    assert [(x.topic, x.payload) for x in got] == [("d/x", b"sealed")]
    obs = make(CON, Code.GET, 2, b"o")
    obs.opt.uri_path = ("ps", "down")
    obs.opt.observe = 0
    p.request(obs)
    assert p.received()[0].opt.observe is not None
    pub = mqtt_client(node, clock, "pub", level=4)
    pub.send(MqttPublish("down", b"to device", qos=0))
    [n] = p.received()
    assert n.payload == b"to device" and n.token == b"o"


def test_wrong_key_closes_only_that_peer(node: Node, clock: VirtualScheduler) -> None:
    bad = Pipe(node, clock, ("dev1", b"wrong"))
    with pytest.raises(Exception):  # noqa: B017 - the client sees the alert as an mbedtls error
        bad.handshake()
        bad.received()
    assert bad.closed is not None and bad.channel.inner is None
    good = Pipe(node, clock, ("dev1", b"secret"))
    good.handshake()
    assert good.closed is None


def test_garbage_before_handshake(node: Node, clock: VirtualScheduler) -> None:
    p = Pipe(node, clock, ("dev1", b"secret"))
    p._run(p.channel.handle_datagram(b"\x16\xfe\xfd garbage"))
    p._run(p.channel.handle_datagram(b""))
    p.handshake()
    assert p.closed is None or p.closed.startswith("dtls")


def test_handshake_timeout(node: Node, clock: VirtualScheduler) -> None:
    p = Pipe(node, clock, ("dev1", b"secret"))
    p._run(p.channel.on_timer("dtls:handshake"))
    assert p.closed == "dtls: handshake timeout"


def test_psk_file(tmp_path: Path) -> None:
    f = tmp_path / "psk"
    f.write_text("# comment\n\ndev1:secret\ndev2:a:b\n")
    assert load_psk_file(f) == {"dev1": b"secret", "dev2": b"a:b"}
    f.write_text("nocolon\n")
    with pytest.raises(DtlsError):
        load_psk_file(f)


def test_lwm2m_register_over_dtls(node: Node, clock: VirtualScheduler) -> None:
    p = Pipe(node, clock, ("dev1", b"secret"), lwm2m=True)
    p.handshake()
    reg = make(CON, Code.POST, 7, b"r", b"</3/0>")
    reg.opt.uri_path = ("rd",)
    reg.opt.uri_query = ("ep=secure-dev", "lt=60")
    p.request(reg)
    [r] = p.received()
    assert r.code == Code.CREATED and r.opt.location_path == ("rd", "secure-dev")
    assert "secure-dev" in node.sessions
