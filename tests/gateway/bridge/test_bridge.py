"""A bridge on a real core (Node) with a virtual clock and a fake upstream: forward rules
and templates, upstream subscriptions into the local broker, loop prevention, drops that
are counted and logged, and the view the management API shows."""

from __future__ import annotations

import logging
import random
from pathlib import Path
from typing import Any

import pytest

from gateway.bridge import HEADER, Bridge
from gateway.bridge.client import State
from gateway.bridge.settings import (
    BridgeSettings,
    ForwardRule,
    OutboxLimits,
    SubscriptionRule,
)
from gateway.bridge.store import OutboxStore
from gateway.core.clock import VirtualScheduler
from gateway.core.hooks import Priority
from gateway.core.node import CoreSettings, Node
from protocols.context import ClientInfo, Message
from protocols.mqtt import MQTT_3_1_1, MQTT_5, ConnAck, Properties, Publish

from .fakes import FakeDialer, FakeUpstream, ManualCommitter, make_store

PUBLISHER = ClientInfo(client_id="dev1")


class World:
    def __init__(self, tmp_path: Path | None = None, **overrides: Any) -> None:
        self.clock = VirtualScheduler()
        self.node = Node(CoreSettings(), self.clock, rng=random.Random(1))
        self.dialer = FakeDialer()
        self.store: OutboxStore | None = None
        self.committer: ManualCommitter | None = None
        if tmp_path is not None:
            self.store, self.committer = make_store(tmp_path)
        overrides.setdefault("protocol_level", MQTT_5)
        overrides.setdefault("forwards", (ForwardRule("tele/#", "fleet/e1/${topic}"),))
        overrides.setdefault("subscriptions", (SubscriptionRule("cmd/e1/#", "cmd/${topic}"),))
        self.settings = BridgeSettings(name="cloud", host="up", port=1883, client_id="e1",
                                       **overrides)
        self.bridge = Bridge(self.settings, self.node, self.store, self.dialer,
                             scheduler=self.clock)
        self.local: list[Message] = []  # everything routed locally, as the hook saw it
        self.node.hooks.add("message.publish", self._seen, Priority.NORMAL)
        self.up: FakeUpstream | None = None

    def _seen(self, message: Message) -> Message:
        self.local.append(message)
        return message

    def connect(self) -> list[Any]:
        """Start, connect; what the client sent after CONNACK (SUBSCRIBE, the queue)."""
        self.bridge.start()
        link = self.dialer.last
        self.bridge.client.link_up(link)
        self.up = up = FakeUpstream(self.bridge.client, link)
        up.received()
        up.send(ConnAck(False, 0))
        return up.received()

    def publish(self, topic: str, payload: bytes = b"x", qos: int = 1, retain: bool = False
                ) -> Message:
        m = Message(topic, payload, qos, retain, publisher="dev1", timestamp=self.clock.time())
        self.node.publish(PUBLISHER, m)
        return m

    def upstream_publishes(self) -> list[Publish]:
        self.clock.advance(0)
        assert self.up is not None
        return [p for p in self.up.received() if isinstance(p, Publish)]


def test_forward_rules_map_topics_qos_and_retain() -> None:
    w = World(forwards=(
        ForwardRule("tele/#", "fleet/e1/${topic}"),
        ForwardRule("alarm/+", "alarms", qos=2, retain=True),
    ))
    w.bridge.start()  # upstream unreachable for now: everything queues
    w.publish("tele/t1", b"21.5", qos=0)
    w.publish("alarm/fire", b"!", qos=0)
    w.publish("other/x")
    queued = [(e.topic, e.payload, e.qos, e.retain) for e in w.bridge.outbox.queue]
    assert queued == [("fleet/e1/tele/t1", b"21.5", 0, False), ("alarms", b"!", 2, True)]
    assert w.bridge.queued == 2


def test_the_forwarder_returns_the_message_unchanged() -> None:
    w = World()
    w.bridge.start()
    m = w.publish("tele/t1", b"v")
    assert w.local == [m] and m.topic == "tele/t1" and m.headers is None


def test_forwarded_upstream_in_order_and_acknowledged() -> None:
    w = World()
    w.bridge.start()
    for i in range(3):
        w.publish(f"tele/{i % 2}", str(i).encode())
    sent = [p for p in w.connect() if isinstance(p, Publish)]
    sent += w.upstream_publishes()
    assert [(p.topic, p.payload) for p in sent] == [
        ("fleet/e1/tele/0", b"0"), ("fleet/e1/tele/1", b"1"), ("fleet/e1/tele/0", b"2")]


def test_upstream_subscriptions_publish_locally_with_a_loop_marker() -> None:
    w = World(forwards=(ForwardRule("#"),))  # forwards everything, even what comes down
    w.connect()
    up = w.up
    assert up is not None
    up.send(Publish("cmd/e1/reboot", b"now", 1, packet_id=3,
                    properties=Properties(subscription_identifiers=(1,),
                                          message_expiry_interval=30,
                                          user_properties=(("a", "b"),))))
    [m] = w.local
    assert (m.topic, m.payload, m.qos) == ("cmd/cmd/e1/reboot", b"now", 1)
    assert m.headers == {HEADER: "cloud"}
    assert m.publisher == "$bridge:cloud"
    assert m.properties.subscription_identifiers == ()
    assert m.properties.user_properties == (("a", "b"),)
    assert m.expires_at == w.clock.time() + 30
    assert w.upstream_publishes() == []  # not sent back where it came from
    assert w.bridge.loops_prevented == 1 and w.bridge.outbox.count == 0


def test_another_bridge_still_forwards_what_one_brought_down() -> None:
    w = World(forwards=(ForwardRule("#"),))
    m = Message("x", b"1")
    m.headers = {HEADER: "elsewhere"}
    w.bridge.start()
    w.node.publish(PUBLISHER, m)
    assert w.bridge.outbox.count == 1


def test_v311_matches_subscriptions_by_topic() -> None:
    w = World(protocol_level=MQTT_3_1_1, subscriptions=(
        SubscriptionRule("cmd/e1/#", "local/${topic}"), SubscriptionRule("cfg/#", "cfg")))
    w.connect()
    up = w.up
    assert up is not None
    up.send(Publish("cfg/a", b"1", 0))
    up.send(Publish("nothing/here", b"2", 0))
    assert [(m.topic, m.payload) for m in w.local] == [("cfg", b"1")]
    assert w.bridge.unmatched == 1
    assert w.node.metrics.get("messages.dropped.bridge_no_subscription") == 1


def test_qos0_forward_skips_the_disk_when_the_link_is_up(tmp_path: Path) -> None:
    w = World(tmp_path)
    w.connect()
    assert w.committer is not None and w.store is not None
    w.committer.commit()
    w.publish("tele/a", b"q0", qos=0)
    assert len(w.committer.ops) == 0  # nothing to write: it leaves this turn
    w.publish("tele/a", b"q1", qos=1)
    assert len(w.committer.ops) == 1  # a QoS 1 forward is on disk before its PUBACK goes
    assert [p.payload for p in w.upstream_publishes()] == [b"q0", b"q1"]


def test_qos0_forward_is_durable_while_upstream_is_down(tmp_path: Path) -> None:
    w = World(tmp_path)
    w.bridge.start()
    w.publish("tele/a", b"q0", qos=0)
    assert w.committer is not None and w.store is not None
    w.committer.commit()
    assert w.store.summary("cloud")[0] == 1


def test_drops_are_counted_and_logged_in_summaries(caplog: pytest.LogCaptureFixture) -> None:
    w = World(outbox=OutboxLimits(max_messages=2))
    w.bridge.start()
    caplog.set_level(logging.WARNING, "gateway.bridge")
    for i in range(5):
        w.publish("tele/a", str(i).encode())
    assert w.bridge.drops == {"outbox_full": 3}
    assert w.node.metrics.get("messages.dropped.bridge_outbox_full") == 3
    first = [r.getMessage() for r in caplog.records if "dropped" in r.getMessage()]
    assert len(first) == 1 and "1 outbox full" in first[0]  # the first at once
    w.clock.advance(10)  # the rest in one summary, not one line each
    lines = [r.getMessage() for r in caplog.records if "dropped" in r.getMessage()]
    assert len(lines) == 2 and "2 outbox full" in lines[1] and "drop_oldest" in lines[1]
    assert [e.payload for e in w.bridge.outbox.queue] == [b"3", b"4"]


def test_max_age_sweep_drops_old_messages_while_offline() -> None:
    w = World(outbox=OutboxLimits(max_age=60.0))
    w.bridge.start()
    w.publish("tele/a")
    w.clock.advance(200)
    assert w.bridge.outbox.count == 0 and w.bridge.drops == {"expired": 1}


def test_view_reports_state_queue_age_and_rates() -> None:
    w = World()
    w.bridge.start()
    w.publish("tele/a", b"12345")
    w.clock.advance(3)
    v = w.bridge.view()
    assert v["status"] == "connecting" and v["connected"] is False
    size = len("fleet/e1/tele/a") + 5
    assert (v["queue_len"], v["queue_bytes"], v["oldest_age"]) == (1, size, 3.0)
    assert v["upstream"] == "mqtt://up:1883" and v["proto_ver"] == "v5"
    w.bridge.client.link_failed(w.dialer.last, "connection refused")
    v = w.bridge.view()
    assert v["status"] == "disconnected" and v["last_error"] == "connection refused"
    at = w.bridge.client.next_attempt_at
    assert v["next_attempt_in"] is not None and at is not None
    w.clock.advance(at - w.clock.time())  # the reconnect timer fires
    link = w.dialer.last
    w.bridge.client.link_up(link)
    up = FakeUpstream(w.bridge.client, link)
    up.received()
    up.send(ConnAck(True, 0))
    w.clock.advance(5)
    v = w.bridge.view()
    assert v["status"] == "connected" and v["session_present"] is True
    assert v["forwarded"] == 1 and v["rates"]["forwarded"] > 0
    assert v["last_error"] is None


def test_stop_detaches_the_forwarder() -> None:
    w = World()
    w.connect()
    w.bridge.stop()
    assert w.bridge.client.state is State.STOPPED
    w.publish("tele/a")
    assert w.bridge.outbox.count == 0


def test_subscription_ids_are_checked_against_the_topic_and_shares_match() -> None:
    w = World(subscriptions=(SubscriptionRule("cfg/#", "cfg-local/${topic}"),
                             SubscriptionRule("$share/edges/cmd/#", "c/${topic}")))
    w.connect()
    assert w.up is not None
    # identifier 1 from an older configuration, on a topic rule 1 does not match
    w.up.send(Publish("cmd/x", b"1", 0, properties=Properties(subscription_identifiers=(1,))))
    w.up.send(Publish("cfg/y", b"2", 0, properties=Properties(subscription_identifiers=(1,))))
    assert [(m.topic, m.payload) for m in w.local] == [("c/cmd/x", b"1"),
                                                      ("cfg-local/cfg/y", b"2")]
