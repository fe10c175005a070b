"""The upstream client state machine, on a virtual clock with a fake dialer; the other
end is our own codec in server role, so every packet the client writes is decoded."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from gateway.bridge.client import TRANSITIONS, Backoff, State, UpstreamClient
from gateway.bridge.outbox import Outbox
from gateway.bridge.settings import (
    BackoffSettings,
    BridgeSettings,
    OutboxLimits,
    SubscriptionRule,
)
from gateway.core.clock import VirtualScheduler
from protocols.mqtt import (
    MQTT_3_1_1,
    MQTT_5,
    ConnAck,
    Connect,
    Connection,
    Disconnect,
    PingReq,
    PingResp,
    Properties,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    Role,
    SubAck,
    Subscribe,
)
from protocols.mqtt.packets import NO_PROPERTIES

from .fakes import FakeDialer, FakeUpstream, make_store


class Rig:
    def __init__(self, *, gate: Any = None, outbox_store: Any = None, **overrides: Any) -> None:
        self.clock = VirtualScheduler()
        self.dialer = FakeDialer()
        self.drops: Counter[str] = Counter()
        limits = overrides.pop("limits", OutboxLimits())
        overrides.setdefault("protocol_level", MQTT_5)
        settings = BridgeSettings(
            name="b", host="upstream", port=1883, client_id="edge-1",
            backoff=BackoffSettings(1.0, 8.0, 0.5), **overrides,
        )
        self.outbox = Outbox(
            "b", limits, outbox_store, self.clock.time,
            lambda reason, n: self.drops.update({reason: n}),
        )
        self.messages: list[Publish] = []
        self.client = UpstreamClient(
            settings, self.outbox, self.clock, self.dialer,
            on_message=self.messages.append, gate=gate, rng=random.Random(7),
        )
        self.up: FakeUpstream | None = None

    def connect(self, *, session_present: bool = False, props: Properties = NO_PROPERTIES
                ) -> list[Any]:
        """Start (or let the backoff fire), complete the link, answer CONNACK; the packets
        the client wrote after the CONNECT."""
        if self.client.state is State.STOPPED:
            self.client.start()
        link = self.dialer.last
        self.client.link_up(link)
        self.up = FakeUpstream(self.client, link)
        connect = self.up.received()
        assert len(connect) == 1 and isinstance(connect[0], Connect)
        self.up.send(ConnAck(session_present, 0, props))
        assert self.client.state is State.CONNECTED
        return self.up.received()

    def put(self, i: int, qos: int = 1, topic: str = "t", **kw: Any) -> None:
        self.outbox.put(topic, str(i).encode(), qos, False, NO_PROPERTIES, **kw)
        self.client.wake()

    def publishes(self) -> list[Publish]:
        self.clock.advance(0)
        assert self.up is not None
        return [p for p in self.up.received() if isinstance(p, Publish)]


def state(rig: Rig) -> State:
    """The client's state, unnarrowed (it changes behind mypy's back)."""
    return rig.client.state


def test_transition_table_is_closed() -> None:
    assert set(TRANSITIONS) == set(State)
    for targets in TRANSITIONS.values():
        assert targets <= set(State)


def test_connect_v5_persistent_session_and_subscriptions() -> None:
    rig = Rig(subscriptions=(SubscriptionRule("cmd/#", "c/${topic}", 1),
                             SubscriptionRule("cfg/+", qos=2)))
    rig.client.start()
    assert state(rig) is State.CONNECTING
    link = rig.dialer.last
    rig.client.link_up(link)
    up = FakeUpstream(rig.client, link)
    [connect] = up.received()
    assert isinstance(connect, Connect)
    assert connect.client_id == "edge-1" and connect.clean_start is False
    assert connect.protocol_level == MQTT_5
    assert connect.properties.session_expiry_interval == 7 * 86400
    assert state(rig) is State.AWAITING_CONNACK
    up.send(ConnAck(False, 0))
    assert state(rig) is State.CONNECTED
    subs = up.received()
    assert all(isinstance(s, Subscribe) for s in subs) and len(subs) == 2
    first, second = subs
    assert isinstance(first, Subscribe) and isinstance(second, Subscribe)
    assert first.properties.subscription_identifiers == (1,)
    assert second.properties.subscription_identifiers == (2,)
    s = first.subscriptions[0]
    assert (s.topic_filter, s.qos, s.no_local, s.retain_as_published, s.retain_handling) == (
        "cmd/#", 1, True, True, 1)
    assert second.subscriptions[0].qos == 2
    up.send(SubAck(first.packet_id, (1,)), SubAck(second.packet_id, (0x87,)))
    assert rig.client.last_error is not None and "cfg/+" in rig.client.last_error


def test_v311_bridge_mode_sets_the_bridge_bit() -> None:
    rig = Rig(protocol_level=MQTT_3_1_1, bridge_mode=True, username="u", password=b"p")
    rig.client.start()
    link = rig.dialer.last
    rig.client.link_up(link)
    data = bytearray(link.written[0])
    level_at = data.index(b"\x00\x04MQTT") + 6
    assert data[level_at] == 0x84
    data[level_at] = 4  # without the bit it is a plain 3.1.1 CONNECT
    server = Connection(Role.SERVER)
    server.receive_data(bytes(data))
    connect = server.next_event()
    assert isinstance(connect, Connect)
    assert (connect.client_id, connect.username, connect.password) == ("edge-1", "u", b"p")
    assert connect.clean_start is False


def test_drains_in_order_within_the_inflight_window() -> None:
    rig = Rig(max_inflight=2)
    rig.connect()
    for i in range(5):
        rig.put(i)
    sent = rig.publishes()
    assert [p.payload for p in sent] == [b"0", b"1"]
    assert all(p.qos == 1 and not p.dup for p in sent)
    assert rig.up is not None
    rig.up.send(PubAck(sent[0].packet_id))  # type: ignore[arg-type]
    more = rig.publishes()
    assert [p.payload for p in more] == [b"2"]
    for p in [*sent[1:], *more]:
        rig.up.send(PubAck(p.packet_id))  # type: ignore[arg-type]
    rest = rig.publishes()
    assert [p.payload for p in rest] == [b"3", b"4"]
    for p in rest:
        rig.up.send(PubAck(p.packet_id))  # type: ignore[arg-type]
    assert rig.outbox.count == 0 and rig.client.acked == 5 and rig.client.forwarded == 5


def test_qos0_leaves_when_written_and_ignores_the_window() -> None:
    rig = Rig(max_inflight=1)
    rig.connect()
    rig.put(0, qos=1)
    rig.put(1, qos=1)
    for i in range(2, 4):
        rig.put(i, qos=0)
    sent = rig.publishes()
    # 1 waits for the window, and the QoS 0 messages behind it must not overtake it
    assert [p.payload for p in sent] == [b"0"]
    assert rig.up is not None
    rig.up.send(PubAck(sent[0].packet_id))  # type: ignore[arg-type]
    more = rig.publishes()
    assert [(p.payload, p.qos) for p in more] == [(b"1", 1), (b"2", 0), (b"3", 0)]
    assert rig.outbox.count == 1  # 1 awaits its PUBACK; the QoS 0 ones left when written
    rig.up.send(PubAck(more[0].packet_id))  # type: ignore[arg-type]
    assert rig.outbox.count == 0


def test_backoff_grows_with_jitter_and_resets_on_connack() -> None:
    rig = Rig()
    rig.client.start()
    delays = []
    for _ in range(6):
        rig.client.link_failed(rig.dialer.last, "connection refused")
        assert state(rig) is State.BACKOFF
        assert rig.client.last_error == "connection refused"
        assert rig.dialer.last.closed
        at = rig.client.next_attempt_at
        assert at is not None
        delays.append(at - rig.clock.time())
        dials = len(rig.dialer.links)
        rig.clock.advance(at - rig.clock.time())
        assert len(rig.dialer.links) == dials + 1 and rig.client.state is State.CONNECTING
    for n, d in enumerate(delays):
        base = min(8.0, 2.0 ** n)
        assert base * 0.5 <= d <= min(8.0, base * 1.5)
    assert len(set(delays)) > 1
    rig.connect()
    assert rig.client.backoff.attempts == 0
    assert rig.client.last_error is None


def test_backoff_never_exceeds_max() -> None:
    b = Backoff(BackoffSettings(0.5, 3.0, 1.0), random.Random(1))
    assert all(0.0 <= b.next_delay() <= 3.0 for _ in range(200))


def test_reconnect_resends_inflight_in_order_with_dup_and_same_ids() -> None:
    rig = Rig()
    rig.connect()
    for i in range(3):
        rig.put(i)
    first = rig.publishes()
    assert rig.up is not None
    rig.up.send(PubAck(first[0].packet_id))  # type: ignore[arg-type]
    rig.client.link_lost(rig.dialer.last, "connection reset")
    assert rig.client.state is State.BACKOFF and rig.outbox.count == 2
    rig.put(3)
    rig.clock.advance(10)
    again = [p for p in rig.connect(session_present=True) if isinstance(p, Publish)]
    assert [(p.payload, p.packet_id, p.dup) for p in again[:2]] == [
        (b"1", first[1].packet_id, True), (b"2", first[2].packet_id, True)]
    assert [(p.payload, p.dup) for p in again[2:]] == [(b"3", False)]  # then the queue


def test_qos2_flow_pubrel_after_pubrec_and_after_reconnect() -> None:
    rig = Rig()
    rig.connect()
    rig.put(0, qos=2)
    [p] = rig.publishes()
    assert p.qos == 2 and p.packet_id is not None
    assert rig.up is not None
    rig.up.send(PubRec(p.packet_id))
    assert rig.up.received() == [PubRel(p.packet_id)]
    rig.client.link_lost(rig.dialer.last, None)
    assert rig.client.last_error == "connection closed by upstream"
    rig.clock.advance(10)
    assert rig.connect(session_present=True) == [PubRel(p.packet_id)]
    rig.up.send(PubComp(p.packet_id, 0x92))  # a new session upstream: still delivered
    assert rig.outbox.count == 0 and not rig.drops


def test_connect_timeout_goes_to_backoff() -> None:
    rig = Rig(connect_timeout=5.0)
    rig.client.start()
    rig.clock.advance(5.0)
    assert rig.client.state is State.BACKOFF
    assert rig.client.last_error == "connect timeout"
    assert rig.dialer.links[0].closed
    rig.client.link_up(rig.dialer.links[0])  # too late: ignored
    assert rig.client.state is State.BACKOFF


def test_refused_connack_is_the_last_error() -> None:
    rig = Rig()
    rig.client.start()
    link = rig.dialer.last
    rig.client.link_up(link)
    up = FakeUpstream(rig.client, link)
    up.received()
    up.send(ConnAck(False, 0x86, Properties(reason_string="who are you")))
    assert rig.client.state is State.BACKOFF
    assert rig.client.last_error == (
        "connection refused: 0x86 bad user name or password (who are you)")


def test_refused_connack_v311_return_code() -> None:
    rig = Rig(protocol_level=MQTT_3_1_1)
    rig.client.start()
    link = rig.dialer.last
    rig.client.link_up(link)
    up = FakeUpstream(rig.client, link)
    up.received()
    up.send(ConnAck(False, 5))
    assert rig.client.last_error == "connection refused: not authorized"


def test_keepalive_pings_then_gives_up() -> None:
    rig = Rig(keepalive=10)
    rig.connect()
    rig.clock.advance(5)
    assert rig.up is not None
    assert rig.up.received() == [PingReq()]
    rig.up.send(PingResp())
    rig.clock.advance(5)
    assert rig.up.received() == [PingReq()]  # no answer this time
    rig.clock.advance(15)
    assert rig.client.state is State.BACKOFF
    assert rig.client.last_error == "keepalive timeout: nothing from upstream"


def test_drain_rate_paces_the_outbox() -> None:
    rig = Rig(drain_rate=10.0)
    rig.connect()
    for i in range(30):
        rig.put(i, qos=0)
    assert len(rig.publishes()) == 1  # a bucket of one token: 10/s, burst 1
    assert rig.client.can_send_now is False  # paced: new QoS 0 messages go to disk
    rig.clock.advance(1.0)
    assert rig.up is not None
    n = 1 + len([p for p in rig.up.received() if isinstance(p, Publish)])
    assert 10 <= n <= 12
    rig.clock.advance(10.0)
    assert rig.outbox.count == 0


def test_incoming_messages_acknowledged_after_the_local_commit(tmp_path: Path) -> None:
    _, committer = make_store(tmp_path)
    rig = Rig(gate=committer)
    rig.client.on_message = lambda p: (rig.messages.append(p), committer.add("SELECT 1"))  # type: ignore[assignment,func-returns-value]
    rig.connect()
    assert rig.up is not None
    rig.up.send(Publish("cmd/x", b"go", 1, packet_id=9))
    assert [m.payload for m in rig.messages] == [b"go"]
    assert rig.up.received() == []  # held until the local side is durable
    committer.commit()
    assert rig.up.received() == [PubAck(9)]


def test_incoming_message_the_node_refuses_is_not_acknowledged() -> None:
    """The node's store cannot write (disk full): the message is not acknowledged
    upstream, so upstream keeps it; once the node takes messages again they are."""
    rig = Rig()
    taken = [False]
    rig.client.on_message = lambda p: taken[0]
    rig.connect()
    assert rig.up is not None
    rig.up.send(Publish("cmd/x", b"go", 1, packet_id=9))
    rig.up.send(Publish("cmd/y", b"go", 2, packet_id=10))
    assert rig.up.received() == [] and rig.client.refused == 2
    taken[0] = True
    rig.up.send(Publish("cmd/y", b"go", 2, packet_id=10, dup=True))
    assert rig.up.received() == [PubRec(10)]


def test_incoming_qos2_is_published_once() -> None:
    rig = Rig()
    rig.connect()
    assert rig.up is not None
    rig.up.send(Publish("cmd/x", b"once", 2, packet_id=5))
    rig.up.send(Publish("cmd/x", b"once", 2, dup=True, packet_id=5))
    assert rig.up.received() == [PubRec(5), PubRec(5)]
    assert len(rig.messages) == 1
    rig.up.send(PubRel(5))
    assert rig.up.received() == [PubComp(5)]
    rig.up.send(PubRel(5))  # unknown now
    assert rig.up.received() == [PubComp(5, 0x92)]
    assert rig.client.received == 1


def test_server_limits_lower_qos_clear_retain_and_drop_too_large() -> None:
    rig = Rig()
    rig.connect(props=Properties(receive_maximum=1, maximum_qos=1, retain_available=0,
                                 maximum_packet_size=64))
    rig.outbox.put("t", b"x" * 100, 1, False, NO_PROPERTIES)
    rig.outbox.put("t", b"a", 2, True, NO_PROPERTIES)
    rig.outbox.put("t", b"b", 1, False, NO_PROPERTIES)
    rig.client.wake()
    [p] = rig.publishes()
    assert (p.payload, p.qos, p.retain) == (b"a", 1, False)
    assert rig.drops == {"too_large": 1}
    assert rig.up is not None
    rig.up.send(PubAck(p.packet_id, 0x97))  # type: ignore[arg-type]
    assert rig.drops == {"too_large": 1, "rejected": 1}
    assert [q.payload for q in rig.publishes()] == [b"b"]


def test_message_expiry_is_forwarded_as_time_left() -> None:
    rig = Rig()
    rig.put(0, expires_at=rig.clock.time() + 100)  # queued while offline
    rig.clock.advance(40)
    [p] = rig.connect()  # drained as soon as connected
    assert isinstance(p, Publish)
    assert p.properties.message_expiry_interval == 60


def test_server_disconnect_and_protocol_errors_are_reported() -> None:
    rig = Rig()
    rig.connect()
    assert rig.up is not None
    rig.up.send(Disconnect(0x8B, Properties(reason_string="maintenance")))
    assert rig.client.last_error == (
        "upstream disconnected: 0x8B server shutting down (maintenance)")
    rig.clock.advance(10)
    rig.connect()
    rig.client.data_received(rig.dialer.last, b"\xf0\x00")  # reserved packet type
    assert rig.client.state is State.BACKOFF
    assert rig.client.last_error is not None
    assert rig.client.last_error.startswith("protocol error")


def test_stale_link_events_are_ignored() -> None:
    rig = Rig()
    rig.connect()
    old = rig.dialer.last
    rig.client.link_lost(old, "reset")
    rig.clock.advance(10)
    rig.client.data_received(old, b"\x20\x02\x00\x00")
    rig.client.link_lost(old, "again")
    assert rig.client.last_error == "reset" and rig.client.state is State.CONNECTING


def test_stop_sends_disconnect_and_stays_down() -> None:
    rig = Rig()
    rig.connect()
    rig.put(0)
    rig.publishes()
    rig.client.stop()
    assert rig.up is not None
    assert rig.up.received() == [Disconnect()]
    assert rig.dialer.last.closed and rig.client.state is State.STOPPED
    rig.clock.advance(3600)
    assert len(rig.dialer.links) == 1 and rig.clock.pending() == 0
    assert rig.outbox.count == 1  # unacknowledged: stays for the next start


def test_pause_writing_stops_the_drain_and_persists_volatile(tmp_path: Path) -> None:
    store, committer = make_store(tmp_path)
    rig = Rig(outbox_store=store)
    rig.connect()
    rig.client.pause_writing(rig.dialer.last)
    assert not rig.client.can_send_now
    rig.outbox.put("t", b"v", 0, False, NO_PROPERTIES, volatile=True)  # as if by mistake
    rig.client.wake()
    assert rig.publishes() == []
    committer.commit()
    assert store.summary("b")[0] == 1  # left behind: written to disk
    rig.client.resume_writing(rig.dialer.last)
    assert [p.payload for p in rig.publishes()] == [b"v"]


@pytest.mark.parametrize("level", [MQTT_3_1_1, MQTT_5])
def test_packet_ids_skip_reserved_and_inflight(level: int) -> None:
    rig = Rig(protocol_level=level)
    rig.connect()
    rig.outbox.reserved.add(1)
    rig.put(0)
    rig.put(1)
    ids = [p.packet_id for p in rig.publishes()]
    assert 1 not in ids and len(set(ids)) == 2
