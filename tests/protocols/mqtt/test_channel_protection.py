"""Protection in the MQTT channel, with a virtual clock and no sockets: message and byte
rates (Pause effects), stalled packets (packet_timeout), max subscriptions, max topic
levels.

The :class:`Wire` plays the transport shell like the one in ``test_channel.py`` and also
records Pause effects; it never reads input while a pause runs (as the real shell).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from gateway.core.clock import VirtualScheduler
from gateway.core.node import CoreSettings, Node
from protocols.context import Delivery
from protocols.effects import CancelTimer, Close, Effect, Pause, SetTimer
from protocols.mqtt.channel import MqttChannel, MqttSettings
from protocols.mqtt.connection import Connection, Role
from protocols.mqtt.packets import (
    MQTT_5,
    ConnAck,
    Connect,
    Disconnect,
    Packet,
    PingReq,
    PingResp,
    Publish,
    SubAck,
    Subscribe,
    Subscription,
)

V311 = 4


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
        self.pauses: list[float] = []
        self.paused_until = 0.0
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
            elif isinstance(e, Pause):
                self.pauses.append(e.seconds)
                self.paused_until = max(self.paused_until, self.clock.time() + e.seconds)
            elif isinstance(e, Close):
                self.closed = e.reason
                self.channel.connection_lost()
                return

    @property
    def paused(self) -> bool:
        return self.clock.time() < self.paused_until

    def send(self, *packets: Packet) -> None:
        self.send_raw(b"".join(self.client.send(p) for p in packets))

    def send_raw(self, data: bytes) -> None:
        assert not self.paused, "the shell reads nothing while paused"
        self._run(self.channel.handle_data(data))

    def advance(self, seconds: float) -> None:
        """Move the clock, firing due timers in order (each at its own time)."""
        end = self.clock.time() + seconds
        while True:
            due = [(when, name) for name, when in self.timers.items() if when <= end]
            if not due or self.closed:
                break
            when, name = min(due)
            self.clock.advance(max(0.0, when - self.clock.time()))
            del self.timers[name]
            self._run(self.channel.on_timer(name))
        self.clock.advance(max(0.0, end - self.clock.time()))

    def take(self) -> list[Packet]:
        out, self.received = self.received, []
        return out


@pytest.fixture
def clock() -> VirtualScheduler:
    return VirtualScheduler()


@pytest.fixture
def node(clock: VirtualScheduler) -> Node:
    return Node(CoreSettings(), clock)


def connect(
    node: Node, clock: VirtualScheduler, settings: MqttSettings, level: int = MQTT_5, **kw: object
) -> Wire:
    w = Wire(node, clock, settings, level)
    w.send(Connect("c", protocol_level=level, **kw))  # type: ignore[arg-type]
    ack = w.take()
    assert isinstance(ack[0], ConnAck) and ack[0].reason_code == 0
    return w


def publishes(n: int, topic: str = "t") -> list[Packet]:
    return [Publish(topic, b"x") for _ in range(n)]


# -- message rate --------------------------------------------------------------------


def test_message_rate_pauses_reading_for_the_debt(node: Node, clock: VirtualScheduler) -> None:
    w = connect(node, clock, MqttSettings(messages_rate=10))
    w.send(*publishes(10))
    assert w.pauses == []  # one second's burst
    w.send(*publishes(15))
    assert w.pauses == [pytest.approx(1.5)]  # 15 owed at 10/s
    assert w.closed is None
    assert node.metrics.get("client.rate_limited") == 1
    w.advance(1.5)
    w.send(*publishes(5))  # the bucket is at zero: 5 more cost half a second
    assert w.pauses[-1] == pytest.approx(0.5)
    assert node.metrics.get("messages.received") == 30  # nothing was dropped


def test_message_rate_counts_only_publish(node: Node, clock: VirtualScheduler) -> None:
    w = connect(node, clock, MqttSettings(messages_rate=1))
    w.send(*[PingReq() for _ in range(20)])
    assert w.pauses == []
    assert w.take() == [PingResp()] * 20


def test_long_run_message_rate_is_respected(node: Node, clock: VirtualScheduler) -> None:
    """A client that sends as fast as the shell reads gets ~rate messages per second."""
    rate = 50.0
    w = connect(node, clock, MqttSettings(messages_rate=rate))
    start = clock.time()
    sent = 0
    while clock.time() - start < 60:
        w.send(*publishes(37))  # a read of 37 packets whenever reading is allowed
        sent += 37
        w.advance(max(w.paused_until - clock.time(), 0.001))
    elapsed = clock.time() - start
    assert sent <= rate * elapsed + rate + 37
    assert sent >= rate * elapsed * 0.9


# -- byte rate -------------------------------------------------------------------------


def test_byte_rate_pauses_and_keepalive_does_not_count_the_pause(
    node: Node, clock: VirtualScheduler
) -> None:
    w = connect(node, clock, MqttSettings(bytes_rate=100), keepalive=2)
    w.send(Publish("t", b"x" * 1000))
    (pause,) = w.pauses
    assert pause > 9  # ~1000 bytes owed at 100 B/s
    w.advance(pause)  # keepalive 2 x 1.5 = 3 s passed three times while paused ...
    assert w.closed is None  # ... but the client could not be heard meanwhile
    w.send(PingReq())
    assert w.take() == [PingResp()]
    w.advance(3.1)  # and keepalive works again afterwards
    assert w.closed is not None and "keepalive" in w.closed


def test_byte_rate_covers_bytes_before_connect(node: Node, clock: VirtualScheduler) -> None:
    w = Wire(node, clock, MqttSettings(bytes_rate=10), MQTT_5)
    w.send(Connect("c" * 200, protocol_level=MQTT_5))
    assert w.pauses and w.pauses[0] > 15  # ~215 bytes at 10 B/s


def test_no_limits_no_pause(node: Node, clock: VirtualScheduler) -> None:
    w = connect(node, clock, MqttSettings())
    w.send(*publishes(10_000))
    assert w.pauses == []


# -- packet_timeout (slowloris) ----------------------------------------------------------


def _partial_publish(w: Wire) -> bytes:
    data = w.client.send(Publish("a/b", b"p" * 100))
    return data


def test_stalled_packet_is_dropped_with_0x8d(node: Node, clock: VirtualScheduler) -> None:
    w = connect(node, clock, MqttSettings(packet_timeout=5), keepalive=0)
    data = _partial_publish(w)
    w.send_raw(data[:10])
    assert "packet" in w.timers
    w.advance(4.9)
    assert w.closed is None
    w.advance(0.2)
    assert w.closed == "packet not completed in time"
    got = w.take()
    assert isinstance(got[-1], Disconnect) and got[-1].reason_code == 0x8D
    assert node.metrics.get("client.packet_timeout") == 1


def test_trickling_bytes_do_not_extend_the_packet_deadline(
    node: Node, clock: VirtualScheduler
) -> None:
    w = connect(node, clock, MqttSettings(packet_timeout=5), keepalive=2)
    data = _partial_publish(w)
    for i in range(4):  # one byte a second keeps keepalive happy ...
        w.send_raw(data[i : i + 1])
        w.advance(1)
    assert w.closed is None
    w.send_raw(data[4:5])
    w.advance(1.01)  # ... but the packet started 5 s ago
    assert w.closed == "packet not completed in time"


def test_slow_but_complete_packets_are_fine(node: Node, clock: VirtualScheduler) -> None:
    w = connect(node, clock, MqttSettings(packet_timeout=5), keepalive=0)
    for _ in range(5):
        data = _partial_publish(w)
        half = len(data) // 2
        w.send_raw(data[:half])
        w.advance(4)
        w.send_raw(data[half:] + data[:3])  # completes, and the next one begins
        w.advance(4)
        w.send_raw(data[3:])
    w.advance(60)
    assert w.closed is None
    assert node.metrics.get("messages.received") == 10


def test_packet_timeout_does_not_count_a_rate_pause(node: Node, clock: VirtualScheduler) -> None:
    w = connect(node, clock, MqttSettings(packet_timeout=5, bytes_rate=10))
    w.advance(w.paused_until - clock.time())  # the CONNECT itself cost half a second
    data = _partial_publish(w)
    w.send_raw(data[:60])  # 60 bytes at 10 B/s: a pause of ~5 s
    pause = w.pauses[-1]
    assert pause > 4
    w.advance(pause)
    w.advance(4.5)  # 4.5 s of the packet's own time since reading resumed
    assert w.closed is None
    w.send_raw(data[60:])
    assert w.closed is None


def test_packet_timeout_off_by_default(node: Node, clock: VirtualScheduler) -> None:
    w = connect(node, clock, MqttSettings(), keepalive=0)
    w.send_raw(_partial_publish(w)[:5])
    assert "packet" not in w.timers
    w.advance(3600)
    assert w.closed is None


def test_stalled_packet_before_connect_is_bounded_by_idle_timeout(
    node: Node, clock: VirtualScheduler
) -> None:
    w = Wire(node, clock, MqttSettings(idle_timeout=3, packet_timeout=60), MQTT_5)
    w.send_raw(Connection(Role.CLIENT, protocol_level=MQTT_5).send(Connect("c", MQTT_5))[:7])
    w.advance(3)
    assert w.closed is not None and "idle" in w.closed


# -- max subscriptions, max topic levels -------------------------------------------------


@pytest.mark.parametrize(("level", "refused"), [(MQTT_5, 0x97), (V311, 0x80)])
def test_max_subscriptions(node: Node, clock: VirtualScheduler, level: int, refused: int) -> None:
    w = connect(node, clock, MqttSettings(max_subscriptions=3), level=level)
    subs = tuple(Subscription(f"f/{i}", 1) for i in range(5))
    w.send(Subscribe(1, subs))
    assert w.take() == [SubAck(1, (1, 1, 1, refused, refused))]
    # re-subscribing to a filter it has is no new subscription
    w.send(Subscribe(2, (Subscription("f/0", 0), Subscription("g", 0))))
    assert w.take() == [SubAck(2, (0, refused))]
    assert len(node.sessions["c"].subscriptions) == 3
    assert w.closed is None


def test_max_topic_levels_publish(node: Node, clock: VirtualScheduler) -> None:
    w = connect(node, clock, MqttSettings(max_topic_levels=3))
    w.send(Publish("a/b/c", b"ok"))
    assert w.closed is None
    w.send(Publish("a/b/c/d", b"deep"))
    got = w.take()
    assert isinstance(got[-1], Disconnect) and got[-1].reason_code == 0x90
    assert w.closed


@pytest.mark.parametrize(("level", "refused"), [(MQTT_5, 0x8F), (V311, 0x80)])
def test_max_topic_levels_subscribe(
    node: Node, clock: VirtualScheduler, level: int, refused: int
) -> None:
    w = connect(node, clock, MqttSettings(max_topic_levels=3), level=level)
    w.send(Subscribe(1, (Subscription("a/+/c", 0), Subscription("a/b/c/#", 0))))
    assert w.take() == [SubAck(1, (0, refused))]


# -- the protection state (_Guard) exists only while it is needed ------------------------


def test_idle_channel_without_rates_holds_no_guard(node: Node, clock: VirtualScheduler) -> None:
    w = connect(node, clock, MqttSettings(packet_timeout=5), keepalive=0)
    assert w.channel._guard is None
    w.send(*publishes(3))
    assert w.channel._guard is None
    data = _partial_publish(w)
    w.send_raw(data[:10])  # a partial packet: timed, by a guard
    guard = w.channel._guard
    assert guard is not None and guard.partial_since == clock.time()
    w.send_raw(data[10:])  # drained: dropped
    assert w.channel._guard is None
    w.advance(10)  # the packet timer set for it fires into nothing
    assert w.closed is None
    w.send_raw(data[:10])  # a new partial packet: a new guard, a new deadline
    assert w.channel._guard is not None
    w.advance(5.1)
    assert w.closed == "packet not completed in time"


def test_rates_keep_their_guard(node: Node, clock: VirtualScheduler) -> None:
    w = connect(node, clock, MqttSettings(messages_rate=1000, packet_timeout=5))
    guard = w.channel._guard
    assert guard is not None and guard.messages is not None and guard.bytes is None
    w.send(*publishes(3))
    assert w.channel._guard is guard and guard.published == 0
