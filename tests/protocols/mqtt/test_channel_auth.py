"""The channel's authentication states, against the real core with a virtual clock:
authentication that answers later (AUTHENTICATING: input buffered, not parsed), MQTT 5
enhanced authentication with SCRAM-SHA-256 (AUTH exchange, CONNACK with server-final),
unsupported methods and re-authentication."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.auth.builtin import BuiltinAuthenticator, ScramExchange
from gateway.core.authz import Authorizer
from gateway.core.clock import VirtualScheduler
from gateway.core.deferred import Deferred
from gateway.core.hooks import Priority, Stop
from gateway.core.node import CoreSettings, Node
from gateway.security.scram import ScramClient
from gateway.store.db import db_path
from gateway.store.users import UserStore
from protocols.context import ClientInfo
from protocols.mqtt.channel import MqttSettings, State
from protocols.mqtt.packets import (
    MQTT_5,
    Auth,
    ConnAck,
    Connect,
    Disconnect,
    PingReq,
    PingResp,
    Properties,
    Publish,
    SubAck,
    Subscribe,
    Subscription,
)
from tests.protocols.mqtt.test_channel import Wire

SCRAM = "SCRAM-SHA-256"


class Later:
    """A ``client.authenticate`` subscriber whose answers the test gives."""

    def __init__(self) -> None:
        self.waiting: list[tuple[ClientInfo, Deferred[Stop[int] | None]]] = []

    def __call__(self, client: ClientInfo, password: bytes | None, acc: object) -> Deferred:
        d: Deferred[Stop[int] | None] = Deferred()
        self.waiting.append((client, d))
        return d

    def answer(self, value: Stop[int] | None, index: int = 0) -> None:
        self.waiting.pop(index)[1].resolve(value)


@pytest.fixture
def clock() -> VirtualScheduler:
    return VirtualScheduler()


@pytest.fixture
def node(clock: VirtualScheduler) -> Node:
    return Node(CoreSettings(allow_anonymous=False), clock, authorizer=Authorizer([], "allow"))


@pytest.fixture
def later(node: Node) -> Later:
    later = Later()
    node.hooks.add("client.authenticate", later, Priority.AUTHN)
    return later


@pytest.fixture
def store(tmp_path: Path, node: Node) -> UserStore:
    store = UserStore.open(db_path(tmp_path))
    store.add("alice", "wonderland", iterations=4096)
    store.add("root", "toor", iterations=4096, superuser=True)
    node.hooks.add("client.authenticate", BuiltinAuthenticator(store), Priority.AUTHN)
    node.auth_methods[SCRAM] = lambda client: ScramExchange(
        store, client, fake_secret=b"s" * 32, fake_iterations=4096
    )
    return store


def wire(node: Node, clock: VirtualScheduler, level: int = MQTT_5, **settings: object) -> Wire:
    return Wire(node, clock, MqttSettings(**settings), level)  # type: ignore[arg-type]


# ----------------------------------------------------------------- answers that come later


def test_connect_waits_for_a_late_answer_and_buffers_what_follows(
    node: Node, clock: VirtualScheduler, later: Later
) -> None:
    w = wire(node, clock)
    w.send(Connect("c1", protocol_level=MQTT_5, username="u", password=b"p"))
    assert w.channel.state is State.AUTHENTICATING and w.take() == []
    # the client may pipeline packets after CONNECT: buffered, not parsed yet
    w.send(Subscribe(1, (Subscription("t", 1),)))
    w.send(PingReq())
    assert w.take() == [] and "c1" not in node.sessions
    later.answer(Stop(0))
    got = w.take()
    assert isinstance(got[0], ConnAck) and got[0].reason_code == 0
    assert got[1:] == [SubAck(1, (1,)), PingResp()]
    assert w.channel.state is State.CONNECTED
    assert node.metrics.get("authentication.success") == 1


def test_late_refusal_in_v311_and_v5(node: Node, clock: VirtualScheduler, later: Later) -> None:
    v3 = wire(node, clock, level=4)
    v3.send(Connect("a", protocol_level=4, username="u", password=b"bad"))
    v5 = wire(node, clock)
    v5.send(Connect("b", protocol_level=MQTT_5, username="u", password=b"bad"))
    later.answer(Stop(0x86))
    later.answer(Stop(0x86))
    assert v3.take() == [ConnAck(False, 4)] and v3.closed
    ack = v5.take()[0]
    assert isinstance(ack, ConnAck) and ack.reason_code == 0x86 and v5.closed
    assert node.metrics.get("authentication.failure") == 2


def test_late_ignore_falls_back_to_allow_anonymous(
    node: Node, clock: VirtualScheduler, later: Later
) -> None:
    w = wire(node, clock)
    w.send(Connect("c", protocol_level=MQTT_5, username="nobody", password=b"x"))
    later.answer(None)  # "ignore": nobody claimed the client, allow_anonymous is false
    ack = w.take()[0]
    assert isinstance(ack, ConnAck) and ack.reason_code == 0x86


def test_idle_timeout_ends_a_pending_authentication(
    node: Node, clock: VirtualScheduler, later: Later
) -> None:
    w = wire(node, clock, idle_timeout=5)
    w.send(Connect("c", protocol_level=MQTT_5, username="u", password=b"p"))
    w.advance(5)
    assert w.closed and "authentication" in w.closed
    later.answer(Stop(0))  # too late: nothing happens, nothing is opened
    assert w.take() == [] and "c" not in node.sessions


def test_connection_lost_while_authenticating(
    node: Node, clock: VirtualScheduler, later: Later
) -> None:
    w = wire(node, clock)
    w.send(Connect("c", protocol_level=MQTT_5, username="u", password=b"p"))
    w.channel.connection_lost()
    w.closed = "lost"
    later.answer(Stop(0))
    assert w.take() == [] and "c" not in node.sessions


def test_deliveries_before_connack_are_held(
    node: Node, clock: VirtualScheduler, later: Later
) -> None:
    # a persistent session that has a queued message, resumed by a late authentication
    node.hooks.remove("client.authenticate", later)
    first = wire(node, clock)
    node.settings.allow_anonymous = True
    first.send(
        Connect("p", protocol_level=MQTT_5, clean_start=False,
                properties=Properties(session_expiry_interval=60))
    )
    first.send(Subscribe(1, (Subscription("t", 1),)))
    first.send(Disconnect())
    pub = wire(node, clock)
    pub.send(Connect("pub", protocol_level=MQTT_5))
    pub.send(Publish("t", b"queued", qos=1, packet_id=1))
    node.hooks.add("client.authenticate", later, Priority.AUTHN)
    again = wire(node, clock)
    again.send(Connect("p", protocol_level=MQTT_5, clean_start=False, username="u"))
    assert again.take() == []
    later.answer(Stop(0))
    got = again.take()
    assert isinstance(got[0], ConnAck) and got[0].session_present
    assert [p.payload for p in got[1:] if isinstance(p, Publish)] == [b"queued"]


# ----------------------------------------------------------------- enhanced authentication


def scram_connect(
    w: Wire, user: str, password: str, cid: str = "s", **connect: object
) -> tuple[ScramClient, list]:
    client = ScramClient(user, password)
    props = Properties(authentication_method=SCRAM, authentication_data=client.first())
    w.send(Connect(cid, protocol_level=MQTT_5, properties=props, **connect))  # type: ignore[arg-type]
    return client, w.take()


def test_scram_success(node: Node, clock: VirtualScheduler, store: UserStore) -> None:
    w = wire(node, clock)
    client, got = scram_connect(w, "alice", "wonderland")
    assert len(got) == 1 and isinstance(got[0], Auth) and got[0].reason_code == 0x18
    assert got[0].properties.authentication_method == SCRAM
    assert w.channel.state is State.AUTH_EXCHANGE
    final = client.final(got[0].properties.authentication_data or b"")
    w.send(Auth(0x18, Properties(authentication_method=SCRAM, authentication_data=final)))
    ack = w.take()[0]
    assert isinstance(ack, ConnAck) and ack.reason_code == 0
    assert ack.properties.authentication_method == SCRAM
    client.verify(ack.properties.authentication_data or b"")  # the server is genuine
    info = node.sessions["s"].info
    assert info is not None and info.username == "alice"  # taken from SCRAM
    assert info.attrs["authn"] == "builtin_db" and not info.attrs["is_superuser"]


def test_scram_wrong_password_is_0x86(
    node: Node, clock: VirtualScheduler, store: UserStore
) -> None:
    w = wire(node, clock)
    client, got = scram_connect(w, "alice", "wrong")
    final = client.final(got[0].properties.authentication_data)
    w.send(Auth(0x18, Properties(authentication_method=SCRAM, authentication_data=final)))
    ack = w.take()[0]
    assert isinstance(ack, ConnAck) and ack.reason_code == 0x86 and w.closed
    assert ack.properties.authentication_data == b"e=invalid-proof"
    assert node.metrics.get("authentication.failure") == 1


def test_scram_unknown_user_is_0x86_too(
    node: Node, clock: VirtualScheduler, store: UserStore
) -> None:
    w = wire(node, clock)
    client, got = scram_connect(w, "mallory", "x")
    assert isinstance(got[0], Auth)  # indistinguishable from a known user so far
    final = client.final(got[0].properties.authentication_data)
    w.send(Auth(0x18, Properties(authentication_method=SCRAM, authentication_data=final)))
    assert w.take()[0].reason_code == 0x86


def test_scram_user_must_match_connect_user_name(
    node: Node, clock: VirtualScheduler, store: UserStore
) -> None:
    w = wire(node, clock)
    _, got = scram_connect(w, "alice", "wonderland", username="root")
    assert isinstance(got[0], ConnAck) and got[0].reason_code == 0x86


def test_unsupported_method_is_0x8c(node: Node, clock: VirtualScheduler) -> None:
    w = wire(node, clock)
    props = Properties(authentication_method="KERBEROS", authentication_data=b"x")
    w.send(Connect("k", protocol_level=MQTT_5, properties=props))
    ack = w.take()[0]
    assert isinstance(ack, ConnAck) and ack.reason_code == 0x8C and w.closed


def test_other_packets_during_the_exchange_are_a_protocol_error(
    node: Node, clock: VirtualScheduler, store: UserStore
) -> None:
    w = wire(node, clock)
    scram_connect(w, "alice", "wonderland")
    w.send(PingReq())
    ack = w.take()[0]
    assert isinstance(ack, ConnAck) and ack.reason_code == 0x82 and w.closed


def test_exchange_bounded_by_idle_timeout(
    node: Node, clock: VirtualScheduler, store: UserStore
) -> None:
    w = wire(node, clock, idle_timeout=3)
    scram_connect(w, "alice", "wonderland")
    w.advance(3)
    assert w.closed and node.metrics.get("authentication.timeout") == 1


def reauth(w: Wire, user: str, password: str) -> tuple[ScramClient, list]:
    client = ScramClient(user, password)
    w.send(Auth(0x19, Properties(authentication_method=SCRAM, authentication_data=client.first())))
    got = w.take()
    assert isinstance(got[0], Auth) and got[0].reason_code == 0x18
    final = client.final(got[0].properties.authentication_data)
    w.send(Auth(0x18, Properties(authentication_method=SCRAM, authentication_data=final)))
    return client, w.take()


def connected_with_scram(node: Node, clock: VirtualScheduler) -> Wire:
    w = wire(node, clock)
    client, got = scram_connect(w, "alice", "wonderland")
    final = client.final(got[0].properties.authentication_data)
    w.send(Auth(0x18, Properties(authentication_method=SCRAM, authentication_data=final)))
    assert w.take()[0].reason_code == 0
    return w


def test_reauthentication_success(node: Node, clock: VirtualScheduler, store: UserStore) -> None:
    w = connected_with_scram(node, clock)
    client, got = reauth(w, "alice", "wonderland")
    assert isinstance(got[0], Auth) and got[0].reason_code == 0
    client.verify(got[0].properties.authentication_data)
    w.send(PingReq())
    assert w.take() == [PingResp()]  # still connected


def test_reauthentication_failure_disconnects_0x87(
    node: Node, clock: VirtualScheduler, store: UserStore
) -> None:
    w = connected_with_scram(node, clock)
    store.set_password("alice", "changed")  # e.g. the password was changed meanwhile
    _, got = reauth(w, "alice", "wonderland")
    assert isinstance(got[0], Disconnect) and got[0].reason_code == 0x87 and w.closed


def test_reauthentication_as_someone_else_is_refused(
    node: Node, clock: VirtualScheduler, store: UserStore
) -> None:
    w = connected_with_scram(node, clock)
    client = ScramClient("root", "toor")
    w.send(Auth(0x19, Properties(authentication_method=SCRAM, authentication_data=client.first())))
    got = w.take()
    assert isinstance(got[0], Disconnect) and got[0].reason_code == 0x87


def test_auth_without_enhanced_authentication_is_a_protocol_error(
    node: Node, clock: VirtualScheduler
) -> None:
    node.settings.allow_anonymous = True
    w = wire(node, clock)
    w.send(Connect("plain", protocol_level=MQTT_5))
    w.take()
    w.send(Auth(0x19, Properties(authentication_method=SCRAM, authentication_data=b"n,,n=a,r=b")))
    got = w.take()
    assert isinstance(got[0], Disconnect) and got[0].reason_code == 0x82


def test_reauth_with_another_method_is_a_protocol_error(
    node: Node, clock: VirtualScheduler, store: UserStore
) -> None:
    w = connected_with_scram(node, clock)
    w.send(Auth(0x19, Properties(authentication_method="OTHER", authentication_data=b"x")))
    assert w.take()[0].reason_code == 0x82


def test_input_while_authenticating_is_bounded(
    node: Node, clock: VirtualScheduler, later: Later
) -> None:
    w = wire(node, clock, max_packet_size=1024)
    w.send(Connect("c", protocol_level=MQTT_5, username="u", password=b"p"))
    w.send(Publish("t", b"x" * 600, qos=0))
    assert w.take() == [] and w.closed is None  # buffered: within one packet's worth
    w.send(Publish("t", b"x" * 600, qos=0))
    ack = w.take()[0]
    assert isinstance(ack, ConnAck) and ack.reason_code == 0x97 and w.closed
    later.answer(Stop(0))  # the answer finds the connection gone
    assert w.take() == [] and "c" not in node.sessions
