"""Flapping detection: max_count CONNACKs within window_time ban the client id for
ban_time; memory stays bounded."""

from __future__ import annotations

import pytest

from gateway.core.clock import VirtualScheduler
from gateway.core.hooks import Priority, Stop
from gateway.core.node import CoreSettings, Node
from gateway.protect.banned import BanGuard
from gateway.protect.flapping import FlappingDetector, FlappingSettings
from gateway.store.banned import BannedStore
from gateway.store.db import db_path
from protocols.mqtt.packets import Disconnect
from tests.gateway.protect.test_banned import attempt

T0 = 1_700_000_000.0


@pytest.fixture
def clock() -> VirtualScheduler:
    return VirtualScheduler(T0)


@pytest.fixture
def node(clock: VirtualScheduler) -> Node:
    return Node(CoreSettings(allow_anonymous=True), clock)


@pytest.fixture
def store(tmp_path, clock):
    s = BannedStore.open(db_path(tmp_path), now=clock.time)
    yield s
    s.close()


@pytest.fixture
def guard(node, store):
    g = BanGuard(node, store)
    g.attach()
    yield g
    g.detach()


def detector(node, guard, **kw) -> FlappingDetector:
    d = FlappingDetector(node, guard, FlappingSettings(**kw))
    d.attach()
    return d


def test_fifteen_connects_in_a_minute_ban_for_five_minutes(node, clock, guard, store) -> None:
    detector(node, guard)
    wires = []
    for _ in range(14):
        w, ack = attempt(node, clock, "flappy")
        assert ack.reason_code == 0
        wires.append(w)
        clock.advance(4)  # 14 connects in 56 s
    last, ack = attempt(node, clock, "flappy")  # the 15th within 60 s
    assert ack.reason_code == 0
    assert node.metrics.get("flapping.detected") == 1
    clock.advance(0)  # the ban is applied right after the CONNECT
    assert last.closed and last.take() == [Disconnect(0x98)]
    (ban,) = store.active()
    assert (ban.kind, ban.value, ban.created_by) == ("clientid", "flappy", "flapping")
    assert ban.expires_at == pytest.approx(clock.time() + 300)
    assert attempt(node, clock, "flappy")[1].reason_code == 0x8A
    clock.advance(300)
    assert attempt(node, clock, "flappy")[1].reason_code == 0


def test_slower_reconnects_are_not_flapping(node, clock, guard) -> None:
    detector(node, guard, max_count=5, window_time=10)
    for _ in range(50):
        assert attempt(node, clock, "steady")[1].reason_code == 0
        clock.advance(2.6)  # 5 connects take 10.4 s > window
    assert node.metrics.get("flapping.detected") == 0


def test_refused_connects_count_but_banned_ones_do_not(node, clock, guard) -> None:
    detector(node, guard, max_count=3, window_time=10)

    def backend(client, password, acc):
        return Stop(0x86) if password != b"right" else None

    node.hooks.add("client.authenticate", backend, Priority.AUTHN)
    for _ in range(3):  # a password guesser is flapping too
        assert attempt(node, clock, "guess", password=b"x")[1].reason_code == 0x86
    clock.advance(0)
    assert node.metrics.get("flapping.detected") == 1
    assert attempt(node, clock, "guess", password=b"right")[1].reason_code == 0x8A
    guard.ban("clientid", "c")
    for _ in range(10):  # already banned: refused, and not counted again
        assert attempt(node, clock, "c")[1].reason_code == 0x8A
    assert node.metrics.get("flapping.detected") == 1


def test_memory_is_bounded(node, clock, guard) -> None:
    d = detector(node, guard, max_count=15, window_time=60, max_tracked=100)
    for i in range(1000):
        attempt(node, clock, f"one-shot-{i}")
        assert len(d) <= 100
    clock.advance(120)  # two sweeps
    assert len(d) == 0


def test_detach_stops_everything(node, clock, guard) -> None:
    d = detector(node, guard, max_count=2, window_time=10)
    d.detach()
    for _ in range(5):
        assert attempt(node, clock, "x")[1].reason_code == 0
    assert node.metrics.get("flapping.detected") == 0
