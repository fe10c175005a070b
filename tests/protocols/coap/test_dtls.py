"""CoAP and LwM2M over DTLS: ``gateway.net.dtls.DtlsChannel`` around the real channels on
a real core, against python-mbedtls client buffers; no sockets, a virtual clock.

Pre-shared keys, certificates from our own PKI (``gateway.security.pki``: the listener's
CA, and a second CA whose client certificates must be refused), both on one listener,
the identity rules (``peer_cert_as_*``, ``psk_identity_as_*``) and reloading.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mbedtls import pk, tls
from mbedtls import x509 as mx509
from mbedtls.exceptions import TLSError

from gateway.config.schema import DtlsListener
from gateway.core.clock import VirtualScheduler
from gateway.core.node import CoreSettings, Node
from gateway.frontends.coap import coap_dtls_channel
from gateway.frontends.lwm2m import lwm2m_channel
from gateway.net.dtls import (
    DtlsChannel,
    DtlsContext,
    DtlsError,
    DtlsServer,
    bind_identity,
    build_dtls_context,
    load_psk_file,
    server_context,
)
from gateway.security import pki
from protocols.coap.channel import CoapSettings
from protocols.coap.codec import CON, Code, Message, decode, encode, make
from protocols.context import Delivery
from protocols.effects import Close, Effect
from protocols.lwm2m.channel import Lwm2mSettings
from protocols.mqtt.packets import Publish as MqttPublish
from protocols.mqtt.packets import Subscribe as MqttSubscribe
from protocols.mqtt.packets import Subscription
from tests.protocols.mqtt.test_channel import client as mqtt_client

ADDR = ("127.0.0.1", 40000)
PSK_CIPHERS = [
    c for c in tls.ciphers_available() if c.startswith("TLS-PSK-WITH-")
]  # what a PSK-only device offers


class Pki(NamedTuple):
    dir: Path  # the listener's CA: ca.crt, server, dev1 (client), dev3 (client, DNS SAN)
    other: Path  # another CA and its client "intruder"

    @property
    def ca(self) -> Path:
        return self.dir / "ca.crt"

    def crt(self, name: str) -> Path:
        return self.dir / f"{name}.crt"

    def key(self, name: str) -> Path:
        return self.dir / f"{name}.key"


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    root = tmp_path_factory.mktemp("dtls-pki")
    main, other = root / "ca", root / "other"
    pki.init_ca(main)
    pki.issue(main, "server")
    pki.issue(main, "dev1", server=False, client=True)
    pki.issue(main, "dev3", server=False, client=True, sans=["dev3.plant.local"])
    pki.init_ca(other, common_name="someone else's CA")
    pki.issue(other, "intruder", server=False, client=True)
    return Pki(main, other)


def client_conf(
    certs: Pki | None = None,
    name: str | None = None,
    *,
    directory: Path | None = None,
    psk: tuple[str, bytes] | None = None,
) -> Any:
    """A device's DTLS configuration: a client certificate ``name`` (from ``directory``,
    the main CA's by default), or a PSK with PSK cipher suites only."""
    if psk is not None:
        return tls.DTLSConfiguration(
            pre_shared_key=psk, ciphers=PSK_CIPHERS, validate_certificates=False
        )
    assert certs is not None
    kwargs: dict[str, Any] = {
        "trust_store": tls.TrustStore([mx509.CRT.from_file(certs.ca)]),
        "validate_certificates": True,
    }
    if name is not None:
        d = directory or certs.dir
        kwargs["certificate_chain"] = (
            (mx509.CRT.from_file(d / f"{name}.crt"),),
            pk.ECC.from_file(d / f"{name}.key"),
        )
    return tls.DTLSConfiguration(**kwargs)


def cert_listener(certs: Pki, **kw: Any) -> DtlsListener:
    keys: dict[str, Any] = {"certfile": certs.crt("server"), "keyfile": certs.key("server")}
    if kw.get("verify", "verify_peer") == "verify_peer":
        keys.update(verify="verify_peer", cacertfile=certs.ca)
    keys.update(kw)
    return DtlsListener(**keys)


class Pipe:
    """The datagram shell for one DTLS peer, and the client's side of the wire."""

    def __init__(
        self,
        node: Node,
        clock: VirtualScheduler,
        conf: Any,
        *,
        server: DtlsServer | DtlsContext | None = None,
        listener: DtlsListener | None = None,
        lwm2m: bool = False,
        addr: tuple[str, int] = ADDR,
    ) -> None:
        if server is None:
            server = (
                server_context({"dev1": b"secret"}) if listener is None
                else DtlsServer.from_listener("test", listener)
            )
        dl = listener or DtlsListener(psk_file=Path("unused"))
        self.closed: str | None = None
        self.to_client: list[bytes] = []
        inner: Callable[..., Any]
        if lwm2m:
            inner = lwm2m_channel(node, Lwm2mSettings(), clock.time, dl)
        else:
            inner = coap_dtls_channel(node, CoapSettings(), clock.time, dl)
        self.channel = DtlsChannel(server, self, addr, inner)
        self._run(self.channel.connection_made())
        self.client = tls.ClientContext(conf).wrap_buffers(server_hostname="localhost")

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
                self._client_in()  # what the server said last (an alert, say)
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

    def exchange(self, m: Message) -> Message:
        self.request(m)
        [r] = self.received()
        return r


def post(mid: int, path: str, payload: bytes = b"x", query: tuple[str, ...] = ()) -> Message:
    m = make(CON, Code.POST, mid, b"t%d" % mid, payload)
    m.opt.uri_path = tuple(path.split("/"))
    m.opt.uri_query = query
    return m


def register(mid: int, ep: str) -> Message:
    reg = make(CON, Code.POST, mid, b"r", b"</3/0>")
    reg.opt.uri_path = ("rd",)
    reg.opt.uri_query = (f"ep={ep}", "lt=60")
    return reg


def serial(path: Path) -> int:
    return mx509.CRT.from_file(path).serial_number


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
    p = Pipe(node, clock, client_conf(psk=("dev1", b"secret")))
    p.handshake()
    assert p.closed is None and p.channel.inner is not None
    assert p.channel.identity == {"psk_identity": "dev1"}
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
    bad = Pipe(node, clock, client_conf(psk=("dev1", b"wrong")))
    with pytest.raises(Exception):  # noqa: B017 - the client sees the alert as an mbedtls error
        bad.handshake()
        bad.received()
    assert bad.closed is not None and bad.channel.inner is None
    good = Pipe(node, clock, client_conf(psk=("dev1", b"secret")))
    good.handshake()
    assert good.closed is None


def test_garbage_before_handshake(node: Node, clock: VirtualScheduler) -> None:
    p = Pipe(node, clock, client_conf(psk=("dev1", b"secret")))
    p._run(p.channel.handle_datagram(b"\x16\xfe\xfd garbage"))
    p._run(p.channel.handle_datagram(b""))
    p.handshake()
    assert p.closed is None or p.closed.startswith("dtls")


def test_handshake_timeout(node: Node, clock: VirtualScheduler) -> None:
    p = Pipe(node, clock, client_conf(psk=("dev1", b"secret")))
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
    p = Pipe(node, clock, client_conf(psk=("dev1", b"secret")), lwm2m=True)
    p.handshake()
    reg = make(CON, Code.POST, 7, b"r", b"</3/0>")
    reg.opt.uri_path = ("rd",)
    reg.opt.uri_query = ("ep=secure-dev", "lt=60")
    p.request(reg)
    [r] = p.received()
    assert r.code == Code.CREATED and r.opt.location_path == ("rd", "secure-dev")
    assert "secure-dev" in node.sessions


# ------------------------------------------------------------------ certificates


def test_certificate_handshake_publish_and_observe(
    node: Node, clock: VirtualScheduler, certs: Pki
) -> None:
    sub = mqtt_client(node, clock, "watcher")
    sub.send(MqttSubscribe(1, (Subscription("c/#", qos=1),)))
    sub.take()
    listener = cert_listener(certs, fail_if_no_peer_cert=True)
    p = Pipe(node, clock, client_conf(certs, "dev1"), listener=listener)
    p.handshake()
    assert p.closed is None and p.channel.inner is not None
    assert p.channel.identity["cn"] == "dev1" and p.channel.identity["dn"] == "CN=dev1"
    # the server's certificate chains to the CA the client trusts
    assert serial(certs.crt("server")) == mx509.CRT.from_DER(
        p.client.getpeercert(binary_form=True)
    ).serial_number
    r = p.exchange(post(1, "ps/c/x", b"certified", ("clientid=free-choice",)))
    assert r.code == Code.CHANGED
    got = [x for x in sub.take() if isinstance(x, MqttPublish)]
    assert [(x.topic, x.payload) for x in got] == [("c/x", b"certified")]
    assert "free-choice" in node.sessions  # no identity rule: the query names the client
    obs = make(CON, Code.GET, 2, b"o")
    obs.opt.uri_path = ("ps", "c", "down")
    obs.opt.observe = 0
    assert p.exchange(obs).opt.observe is not None
    pub = mqtt_client(node, clock, "pub", level=4)
    pub.send(MqttPublish("c/down", b"to a certified device", qos=0))
    [n] = p.received()
    assert n.payload == b"to a certified device" and n.token == b"o"


def test_verify_none_serves_a_certificate_and_asks_for_none(
    node: Node, clock: VirtualScheduler, certs: Pki
) -> None:
    listener = cert_listener(certs, verify="verify_none")
    for conf in (client_conf(certs), client_conf(certs, "intruder", directory=certs.other)):
        p = Pipe(node, clock, conf, listener=listener)
        p.handshake()
        assert p.closed is None and p.channel.inner is not None
        assert p.channel.identity == {}  # an unchecked certificate names nobody
        assert p.exchange(post(1, "ps/n/x")).code == Code.CHANGED


@pytest.mark.parametrize("required", [True, False])
def test_verify_peer_refuses_a_certificate_of_another_ca(
    node: Node, clock: VirtualScheduler, certs: Pki, required: bool
) -> None:
    listener = cert_listener(certs, fail_if_no_peer_cert=required)
    bad = Pipe(
        node, clock, client_conf(certs, "intruder", directory=certs.other), listener=listener
    )
    with contextlib.suppress(TLSError):  # the client may see the alert
        bad.handshake()
    assert bad.closed is not None and bad.channel.inner is None
    if not required:  # the handshake ended, the peer was closed at once
        assert bad.closed == "dtls: client certificate does not verify against cacertfile"
    good = Pipe(node, clock, client_conf(certs, "dev1"), listener=listener, addr=("127.0.0.1", 2))
    good.handshake()
    assert good.closed is None and good.exchange(post(1, "ps/ok")).code == Code.CHANGED


def test_fail_if_no_peer_cert(node: Node, clock: VirtualScheduler, certs: Pki) -> None:
    required = Pipe(
        node, clock, client_conf(certs), listener=cert_listener(certs, fail_if_no_peer_cert=True)
    )
    with contextlib.suppress(TLSError):
        required.handshake()
    assert required.closed is not None and required.channel.inner is None
    optional = Pipe(node, clock, client_conf(certs), listener=cert_listener(certs))
    optional.handshake()
    assert optional.closed is None and optional.channel.identity == {}


def test_garbage_does_not_disturb_other_peers(
    node: Node, clock: VirtualScheduler, certs: Pki
) -> None:
    server = DtlsServer.from_listener("test", cert_listener(certs, fail_if_no_peer_cert=True))
    a = Pipe(node, clock, client_conf(certs, "dev1"), server=server)
    a.handshake()
    assert a.exchange(post(1, "ps/g/1")).code == Code.CHANGED
    # a stranger's garbage: its own channel, which closes or stays mute
    b = Pipe(node, clock, client_conf(certs, "dev3"), server=server, addr=("127.0.0.1", 3))
    for junk in (b"\x16\xfe\xfd" + bytes(range(60)), b"\x17\xfe\xfd\x00\x01" + b"\xff" * 40,
                 b"", b"\x00"):
        b._run(b.channel.handle_datagram(junk))
    assert b.channel.inner is None
    # garbage inside a's session (a record that does not decrypt) is dropped
    a._run(a.channel.handle_datagram(b"\x17\xfe\xfd\x00\x01" + bytes(6) + b"\x00\x20" + bytes(32)))
    assert a.closed is None
    assert a.exchange(post(2, "ps/g/2")).code == Code.CHANGED


def test_psk_and_certificates_on_one_listener(
    node: Node, clock: VirtualScheduler, certs: Pki, tmp_path: Path
) -> None:
    (tmp_path / "psk").write_text("dev-psk:s3cret\n")
    listener = cert_listener(
        certs, psk_file=tmp_path / "psk", fail_if_no_peer_cert=True,
        peer_cert_as_clientid="cn", psk_identity_as_clientid=True,
    )
    server = DtlsServer.from_listener("test", listener)
    assert "PSK (1 keys)" in server.current.description
    psk = Pipe(node, clock, client_conf(psk=("dev-psk", b"s3cret")), server=server,
               listener=listener)
    psk.handshake()
    assert psk.channel.identity == {"psk_identity": "dev-psk"}
    assert psk.exchange(post(1, "ps/m/1")).code == Code.CHANGED
    assert "dev-psk" in node.sessions
    cert = Pipe(node, clock, client_conf(certs, "dev1"), server=server, listener=listener,
                addr=("127.0.0.1", 4))
    cert.handshake()
    assert cert.exchange(post(1, "ps/m/2")).code == Code.CHANGED
    assert "dev1" in node.sessions


# ------------------------------------------------------------------ identity


def test_certificate_cn_as_client_id_and_username(
    node: Node, clock: VirtualScheduler, certs: Pki
) -> None:
    seen: list[tuple[str, str | None]] = []
    node.hooks.add(
        "client.connack",
        lambda c, code: seen.append((c.client_id, c.username)),  # type: ignore[arg-type]
    )
    listener = cert_listener(certs, peer_cert_as_clientid="cn", peer_cert_as_username="dn")
    p = Pipe(node, clock, client_conf(certs, "dev1"), listener=listener)
    p.handshake()
    r = p.exchange(post(1, "ps/i/1", query=("clientid=dev2",)))
    assert r.code == Code.FORBIDDEN
    assert r.payload == b"client id 'dev2' does not match the certificate cn 'dev1'"
    r = p.exchange(post(2, "ps/i/1", query=("username=root",)))
    assert r.code == Code.FORBIDDEN and b"username 'root'" in r.payload
    assert p.exchange(post(3, "ps/i/1")).code == Code.CHANGED  # named by the certificate
    assert seen == [("dev1", "CN=dev1")] and "dev1" in node.sessions
    # a client id equal to the identity is fine; connection mode works with the identity
    q = Pipe(node, clock, client_conf(certs, "dev3"), listener=listener, addr=("127.0.0.1", 5))
    q.handshake()
    conn = post(1, "mqtt/connection")
    r = q.exchange(conn)
    assert r.code == Code.CREATED
    token = r.payload.decode()
    r = q.exchange(post(2, "ps/i/3", query=("clientid=dev3", f"token={token}")))
    assert r.code == Code.CHANGED
    r = q.exchange(post(3, "ps/i/3", query=(f"token={token}",)))  # clientid may go too
    assert r.code == Code.CHANGED
    r = q.exchange(post(4, "ps/i/3", query=("clientid=dev1", f"token={token}")))
    assert r.code == Code.UNAUTHORIZED  # not this connection's client id


def test_certificate_without_the_field_is_unauthorized(
    node: Node, clock: VirtualScheduler, certs: Pki
) -> None:
    listener = cert_listener(certs, peer_cert_as_clientid="san")
    p = Pipe(node, clock, client_conf(certs, "dev1"), listener=listener)  # dev1: no SAN
    p.handshake()
    r = p.exchange(post(1, "ps/i/1", query=("clientid=dev1",)))
    assert r.code == Code.UNAUTHORIZED
    assert r.payload == b"client certificate has no san for the client id"
    q = Pipe(node, clock, client_conf(certs, "dev3"), listener=listener, addr=("127.0.0.1", 6))
    q.handshake()
    assert q.exchange(post(1, "ps/i/1")).code == Code.CHANGED
    assert "dev3.plant.local" in node.sessions


def test_psk_identity_as_client_id(
    node: Node, clock: VirtualScheduler, tmp_path: Path
) -> None:
    (tmp_path / "psk").write_text("dev-a:ka\ndev-b:kb\n")
    listener = DtlsListener(psk_file=tmp_path / "psk", psk_identity_as_clientid=True,
                            psk_identity_as_username=True)
    p = Pipe(node, clock, client_conf(psk=("dev-a", b"ka")), listener=listener)
    p.handshake()
    r = p.exchange(post(1, "ps/p/1", query=("clientid=dev-b",)))
    assert r.code == Code.FORBIDDEN
    assert r.payload == b"client id 'dev-b' does not match the PSK identity 'dev-a'"
    assert p.exchange(post(2, "ps/p/1", query=("clientid=dev-a",))).code == Code.CHANGED
    assert node.sessions["dev-a"] is not None


def test_lwm2m_endpoint_must_match_the_psk_identity(
    node: Node, clock: VirtualScheduler, tmp_path: Path
) -> None:
    (tmp_path / "psk").write_text("ep-1:k1\n")
    listener = DtlsListener(psk_file=tmp_path / "psk", psk_identity_as_clientid=True)
    p = Pipe(node, clock, client_conf(psk=("ep-1", b"k1")), listener=listener, lwm2m=True)
    p.handshake()
    r = p.exchange(register(1, "someone-else"))
    assert r.code == Code.FORBIDDEN and "someone-else" not in node.sessions
    r = p.exchange(register(2, "ep-1"))
    assert r.code == Code.CREATED and r.opt.location_path == ("rd", "ep-1")
    assert "ep-1" in node.sessions


def test_lwm2m_endpoint_must_match_the_certificate_cn(
    node: Node, clock: VirtualScheduler, certs: Pki
) -> None:
    listener = cert_listener(certs, fail_if_no_peer_cert=True, peer_cert_as_clientid="cn")
    p = Pipe(node, clock, client_conf(certs, "dev1"), listener=listener, lwm2m=True)
    p.handshake()
    assert p.exchange(register(1, "dev3")).code == Code.FORBIDDEN
    assert p.exchange(register(2, "dev1")).code == Code.CREATED


def test_bind_identity_rules(tmp_path: Path, certs: Pki) -> None:
    cert = {"cn": "dev1", "dn": "CN=dev1"}
    psk = DtlsListener(psk_file=tmp_path / "psk")
    assert bind_identity(psk, {"psk_identity": "a"}) is None
    assert bind_identity(psk, {}) is None
    both = cert_listener(certs, psk_file=tmp_path / "psk", peer_cert_as_username="cn",
                         psk_identity_as_clientid=True)
    b = bind_identity(both, {"psk_identity": "a"})
    assert b is not None and (b.client_id, b.username) == ("a", None)
    b = bind_identity(both, cert)
    assert b is not None and (b.client_id, b.username) == (None, "dev1")
    assert bind_identity(both, {}) is None  # no certificate sent (optional): not bound
    b = bind_identity(cert_listener(certs, peer_cert_as_clientid="san"), cert)
    assert b is not None and b.missing == "client certificate has no san for the client id"


# ------------------------------------------------------------------ configuration, reload


def test_listener_settings_are_checked(tmp_path: Path, certs: Pki) -> None:
    with pytest.raises(ValueError, match="needs psk_file, or certfile and keyfile"):
        DtlsListener()
    with pytest.raises(ValueError, match="certfile and keyfile go together"):
        DtlsListener(certfile=certs.crt("server"))
    with pytest.raises(ValueError, match="needs cacertfile"):
        DtlsListener(certfile=certs.crt("server"), keyfile=certs.key("server"),
                     verify="verify_peer")
    with pytest.raises(ValueError, match='peer_cert_as_clientid needs verify = "verify_peer"'):
        DtlsListener(certfile=certs.crt("server"), keyfile=certs.key("server"),
                     peer_cert_as_clientid="cn")
    with pytest.raises(ValueError, match="psk_identity_as_username needs psk_file"):
        DtlsListener(certfile=certs.crt("server"), keyfile=certs.key("server"),
                     psk_identity_as_username=True)
    assert DtlsListener(enable=False).psk_file is None  # a disabled listener may be empty
    with pytest.raises(DtlsError, match=r"keyfile: .* does not match certfile"):
        build_dtls_context(DtlsListener(certfile=certs.crt("server"), keyfile=certs.key("dev1")))
    with pytest.raises(DtlsError, match="cacertfile: no such file"):
        build_dtls_context(cert_listener(certs, cacertfile=tmp_path / "missing.crt"))
    (tmp_path / "empty").write_text("# nobody\n")
    with pytest.raises(DtlsError, match="psk_file: no identity:secret line"):
        build_dtls_context(DtlsListener(psk_file=tmp_path / "empty"))


def test_loader_resolves_and_checks_dtls_files(tmp_path: Path, certs: Pki) -> None:
    from gateway.config import ConfigError, load_config

    for f in ("server.crt", "server.key", "ca.crt", "dev1.key"):
        shutil.copy(certs.dir / f, tmp_path / f)
    (tmp_path / "psk.txt").write_text("a:b\n")
    conf = tmp_path / "gateway.toml"
    conf.write_text(
        "[gateway.coap.listeners.dtls.default]\n"
        'certfile = "server.crt"\nkeyfile = "server.key"\ncacertfile = "ca.crt"\n'
        'verify = "verify_peer"\npsk_file = "psk.txt"\n'
        "[gateway.lwm2m.listeners.dtls.default]\n"
        'bind = "0.0.0.0:5784"\ncertfile = "server.crt"\nkeyfile = "dev1.key"\n'
    )
    with pytest.raises(ConfigError) as err:
        load_config(conf, environ={})
    assert str(err.value).startswith("gateway.lwm2m.listeners.dtls.default.keyfile: ")
    conf.write_text(conf.read_text().replace('"dev1.key"', '"server.key"'))
    config = load_config(conf, environ={})
    assert config.gateway.coap is not None
    dl = config.gateway.coap.listeners.dtls["default"]
    assert dl.certfile == tmp_path / "server.crt" and dl.psk_file == tmp_path / "psk.txt"


def test_reload_swaps_keys_for_new_handshakes_only(
    node: Node, clock: VirtualScheduler, certs: Pki, tmp_path: Path
) -> None:
    d = tmp_path / "pki"
    shutil.copytree(certs.dir, d)
    listener = DtlsListener(certfile=d / "server.crt", keyfile=d / "server.key")
    server = DtlsServer.from_listener("coap:dtls:test", listener)
    old = serial(d / "server.crt")
    established = Pipe(node, clock, client_conf(certs), server=server)
    established.handshake()
    assert established.exchange(post(1, "ps/r/1")).code == Code.CHANGED

    pki.issue(d, "server", force=True)
    assert serial(d / "server.crt") != old
    assert server.reload()
    fresh = Pipe(node, clock, client_conf(certs), server=server, addr=("127.0.0.1", 7))
    fresh.handshake()
    assert mx509.CRT.from_DER(fresh.client.getpeercert(True)).serial_number == serial(
        d / "server.crt"
    )
    assert established.exchange(post(2, "ps/r/2")).code == Code.CHANGED  # untouched

    (d / "server.key").write_text("half-copied")
    assert not server.reload()  # logged; the previous keys stay
    again = Pipe(node, clock, client_conf(certs), server=server, addr=("127.0.0.1", 8))
    again.handshake()
    assert again.closed is None
    assert again.exchange(post(1, "ps/r/3")).code == Code.CHANGED


# ------------------------------------------------------------------ property: garbage

RECORD_TYPES = st.sampled_from([20, 21, 22, 23, 0, 255])
DTLS_LIKE = st.builds(
    lambda t, rest: bytes([t, 0xFE, 0xFD]) + rest, RECORD_TYPES, st.binary(max_size=120)
)
GARBAGE = st.lists(st.one_of(st.binary(max_size=200), DTLS_LIKE), min_size=1, max_size=6)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(junk=GARBAGE)
def test_garbage_never_raises_nor_opens_a_session(junk: list[bytes]) -> None:
    """Any datagrams from a stranger: the DTLS channel answers, closes or stays mute;
    it never raises and never creates the inner channel."""
    clock = VirtualScheduler()
    node = Node(CoreSettings(), clock)
    p = Pipe(node, clock, client_conf(psk=("dev1", b"secret")), server=_PSK_SERVER)
    for d in junk:
        p._run(p.channel.handle_datagram(d))
    assert p.channel.inner is None


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(junk=GARBAGE)
def test_garbage_inside_a_session_is_dropped(junk: list[bytes]) -> None:
    """Datagrams that are not records of the session (forged or corrupted) are dropped or
    end that session; an answer is never sent in the clear, and a session that survives
    still works."""
    clock = VirtualScheduler()
    node = Node(CoreSettings(), clock)
    p = Pipe(node, clock, client_conf(psk=("dev1", b"secret")), server=_PSK_SERVER)
    p.handshake()
    assert p.channel.inner is not None
    for d in junk:
        p._run(p.channel.handle_datagram(d))
    assert all(d[:1] in (b"\x15", b"\x16", b"\x17") for d in p.to_client)  # DTLS records
    if p.closed is None:
        assert p.exchange(post(1, "ps/fuzz")).code == Code.CHANGED


_PSK_SERVER = server_context({"dev1": b"secret"})
