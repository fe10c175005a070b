"""BanGuard against the real core and channel, with a virtual clock: CONNACK 0x8A / 5,
kicks of connected clients, polling of the store, expiry."""

from __future__ import annotations

import pytest

from gateway.core.clock import VirtualScheduler
from gateway.core.hooks import Priority
from gateway.core.node import CoreSettings, Node
from gateway.protect.banned import BanGuard, BanIndex
from gateway.store.banned import Ban, BannedStore
from gateway.store.db import db_path
from protocols.context import AuthStep
from protocols.mqtt.channel import MqttSettings
from protocols.mqtt.packets import (
    MQTT_5,
    ConnAck,
    Connect,
    Disconnect,
    Properties,
    Publish,
    Subscribe,
    Subscription,
    Will,
)
from tests.protocols.mqtt.test_channel_protection import Wire

V311 = 4
T0 = 1_700_000_000.0


@pytest.fixture
def clock() -> VirtualScheduler:
    return VirtualScheduler(T0)


@pytest.fixture
def node(clock: VirtualScheduler) -> Node:
    return Node(CoreSettings(), clock)


@pytest.fixture
def store(tmp_path, clock: VirtualScheduler):
    s = BannedStore.open(db_path(tmp_path), now=clock.time)
    yield s
    s.close()


@pytest.fixture
def guard(node: Node, store: BannedStore):
    g = BanGuard(node, store, poll_interval=1.0)
    g.attach()
    yield g
    g.detach()


def attempt(
    node: Node,
    clock: VirtualScheduler,
    cid: str,
    level: int = MQTT_5,
    *,
    peer: str = "127.0.0.1",
    **kw: object,
) -> tuple[Wire, ConnAck]:
    w = Wire(node, clock, MqttSettings(), level)
    w.channel.peer = (peer, 40000)
    w.send(Connect(cid, protocol_level=level, **kw))  # type: ignore[arg-type]
    ack = w.take()[0]
    assert isinstance(ack, ConnAck)
    return w, ack


def test_index_matches_every_kind_and_ignores_expired() -> None:
    idx = BanIndex(
        [
            Ban("clientid", "c1"),
            Ban("username", "bob", expires_at=T0 + 10),
            Ban("peerhost", "10.0.0.7"),
            Ban("cidr", "192.168.0.0/16"),
            Ban("cidr", "fd00::/8"),
        ]
    )
    assert len(idx) == 5
    m = idx.match
    assert m("c1", None, None, T0) is not None
    assert m("c2", "bob", None, T0) is not None
    assert m("c2", "bob", None, T0 + 10) is None  # expired
    assert m("c2", None, "10.0.0.7", T0) is not None
    assert m("c2", None, "::ffff:10.0.0.7", T0) is not None  # v4 on a dual-stack listener
    assert m("c2", None, "192.168.44.1", T0) is not None
    assert m("c2", None, "fd12::1%eth0", T0) is not None
    assert m("c2", None, "10.0.0.8", T0) is None
    assert m("c2", None, "not-an-ip", T0) is None
    assert idx.drop_expired(T0 + 10) == 1 and len(idx) == 4
    assert idx.remove("cidr", "192.168.1.1/16") and not idx.remove("cidr", "192.168.0.0/16")


@pytest.mark.parametrize(("level", "code"), [(MQTT_5, 0x8A), (V311, 5)])
def test_banned_connect_is_refused(node, clock, guard, level, code) -> None:
    guard.ban("clientid", "bad", reason="test")
    w, ack = attempt(node, clock, "bad", level)
    assert ack.reason_code == code and w.closed
    assert "bad" not in node.sessions
    assert node.metrics.get("client.banned") == 1
    _, ok = attempt(node, clock, "good", level)
    assert ok.reason_code == 0


def test_every_kind_refuses(node, clock, guard) -> None:
    guard.ban("username", "mallory")
    guard.ban("peerhost", "10.9.9.9")
    guard.ban("cidr", "172.16.0.0/12")
    assert attempt(node, clock, "a", username="mallory")[1].reason_code == 0x8A
    assert attempt(node, clock, "b", peer="10.9.9.9")[1].reason_code == 0x8A
    assert attempt(node, clock, "c", peer="172.20.1.1")[1].reason_code == 0x8A
    assert attempt(node, clock, "d", peer="172.32.0.1")[1].reason_code == 0


def test_the_ban_runs_before_authentication_backends(node, clock, guard) -> None:
    called = []

    def backend(client, password, acc):
        called.append(client.client_id)
        return 0  # would accept

    node.hooks.add("client.authenticate", backend, Priority.AUTHN)
    guard.ban("clientid", "x")
    assert attempt(node, clock, "x")[1].reason_code == 0x8A
    assert called == []
    assert attempt(node, clock, "y")[1].reason_code == 0
    assert called == ["y"]


def test_banning_kicks_connected_clients_without_their_will(node, clock, guard) -> None:
    watcher, _ = attempt(node, clock, "watcher")
    watcher.send(Subscribe(1, (Subscription("wills/#", 0),)))
    watcher.take()
    v5, _ = attempt(node, clock, "v5", will=Will("wills/v5", b"bye"), peer="10.1.2.3")
    v3, _ = attempt(node, clock, "v3", V311, peer="10.1.2.4")
    other, _ = attempt(node, clock, "other", peer="10.2.0.1")
    guard.ban("cidr", "10.1.0.0/16", reason="lab")
    assert v5.take() == [Disconnect(0x98)] and v5.closed
    assert v3.take() == [] and v3.closed
    assert other.closed is None
    assert node.metrics.get("client.kicked.banned") == 2
    assert [p for p in watcher.take() if isinstance(p, Publish)] == []  # no will
    assert node.connections == 2


def test_a_ban_added_elsewhere_is_picked_up_by_polling(node, clock, guard, tmp_path) -> None:
    c, _ = attempt(node, clock, "victim")
    cli = BannedStore.open(db_path(tmp_path), now=clock.time)  # gatewayctl's connection
    cli.add("clientid", "victim", reason="from the CLI")
    assert c.closed is None  # not yet: the next poll
    clock.advance(1.0)
    assert c.closed and c.take() == [Disconnect(0x98)]
    assert attempt(node, clock, "victim")[1].reason_code == 0x8A
    cli.delete("clientid", "victim")
    clock.advance(1.0)
    assert attempt(node, clock, "victim")[1].reason_code == 0
    cli.close()


def test_bans_expire(node, clock, guard) -> None:
    guard.ban("clientid", "t", duration=30)
    assert attempt(node, clock, "t")[1].reason_code == 0x8A
    clock.advance(30)
    assert attempt(node, clock, "t")[1].reason_code == 0


def test_expired_bans_are_purged(node, clock, guard, store) -> None:
    guard.ban("clientid", "t", duration=30)
    guard.ban("clientid", "keep")
    clock.advance(61)
    assert [b.value for b in store.all()] == ["keep"]
    assert len(guard.index) == 1


def test_bans_load_at_start_and_unban(node, clock, store) -> None:
    store.add("clientid", "old")
    g = BanGuard(node, store)
    g.attach()
    assert attempt(node, clock, "old")[1].reason_code == 0x8A
    assert g.unban("clientid", "old")
    assert not g.unban("clientid", "old")
    assert attempt(node, clock, "old")[1].reason_code == 0
    assert store.all() == []
    g.detach()
    assert node.hooks.callbacks("client.authenticate") == ()
    assert clock.pending() == 0


def test_memory_only_guard(node, clock) -> None:
    g = BanGuard(node, None)
    g.attach()
    g.ban("clientid", "m", duration=5)
    assert attempt(node, clock, "m")[1].reason_code == 0x8A
    clock.advance(5)
    assert attempt(node, clock, "m")[1].reason_code == 0
    g.detach()


class _Accept:
    def step(self, data):
        return AuthStep(0)


def test_enhanced_authentication_is_checked_too(node, clock, guard) -> None:
    """MQTT 5 enhanced authentication (SCRAM) does not run the client.authenticate
    chain: a banned client is refused at the exchange's first step."""
    node.auth_methods["TEST"] = lambda client: _Accept()
    props = Properties(authentication_method="TEST")
    assert attempt(node, clock, "scram-user", properties=props)[1].reason_code == 0
    guard.ban("username", "mallory")
    w, ack = attempt(node, clock, "x", username="mallory", properties=props)
    assert ack.reason_code == 0x8A and w.closed
    assert node.metrics.get("client.banned") == 1
    assert attempt(node, clock, "y", username="alice", properties=props)[1].reason_code == 0
    # methods registered after the guard was attached are checked as well
    node.auth_methods["LATER"] = lambda client: _Accept()
    later = Properties(authentication_method="LATER")
    assert attempt(node, clock, "z", username="mallory", properties=later)[1].reason_code == 0x8A
    guard.detach()
    assert type(node.auth_methods) is dict and set(node.auth_methods) == {"TEST", "LATER"}
    assert attempt(node, clock, "z", username="mallory", properties=later)[1].reason_code == 0
