"""The engine as a hook subscriber, with the core's real Hooks and a stand-in for the node's
publish (which feeds republished messages back through the hook, as Node.publish does)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from gateway.core.hooks import Hooks
from gateway.rules.engine import RuleEngine
from protocols.context import ClientInfo, Message, SubOptions


class Loop:
    def __init__(self) -> None:
        self.soon: list[Callable[[], None]] = []

    def call_soon(self, fn: Callable[[], None]) -> None:
        self.soon.append(fn)

    def run(self) -> int:
        turns = 0
        while self.soon and turns < 100:
            fns, self.soon = self.soon, []
            for fn in fns:
                fn()
            turns += 1
        return turns


def make(max_pending: int = 1000) -> tuple[RuleEngine, Hooks, Loop, list[Message]]:
    hooks, loop, published = Hooks(), Loop(), []

    def publish(client: ClientInfo, m: Message) -> None:
        published.append(m)
        hooks.run_fold("message.publish", (), m)

    eng = RuleEngine(node_name="n1", publish=publish, call_soon=loop.call_soon,
                     max_pending=max_pending)
    eng.attach(hooks)
    return eng, hooks, loop, published


def add(eng: RuleEngine, rid: str, sql: str, *actions: dict[str, Any]) -> None:
    eng.put(eng.build(rid, {"sql": sql, "actions": list(actions)}))


def pub(hooks: Hooks, topic: str, payload: bytes = b"{}", publisher: str = "dev") -> Message:
    m = Message(topic, payload, 1, publisher=publisher, timestamp=1.0)
    assert hooks.run_fold("message.publish", (), m) is m  # unchanged, at once
    return m


def test_rules_run_after_the_hook_returns_and_count() -> None:
    eng, hooks, loop, published = make()
    add(eng, "r", 'SELECT payload.x AS x FROM "a/#" WHERE payload.x > 1',
        {"function": "republish", "args": {"topic": "out/${x}"}})
    pub(hooks, "a/1", b'{"x": 2}')
    pub(hooks, "a/1", b'{"x": 0}')
    pub(hooks, "b/1", b'{"x": 5}')  # no rule for it: not even queued
    assert eng.waiting == 2 and published == []
    loop.run()
    assert [(m.topic, m.payload, m.publisher) for m in published] == [
        ("out/2", b'{"x":2}', "r")]
    m = eng.rules["r"].metrics.as_dict()
    assert (m["matched"], m["passed"], m["failed.no_result"], m["actions.success"]) == (2, 1, 1, 1)


def test_a_rule_does_not_see_its_own_republish_but_others_do() -> None:
    eng, hooks, loop, published = make()
    add(eng, "self", 'SELECT * FROM "loop/#"',
        {"function": "republish", "args": {"topic": "loop/again", "payload": "x"}})
    add(eng, "other", 'SELECT topic FROM "loop/again"')
    pub(hooks, "loop/1")
    assert loop.run() < 10
    assert [m.topic for m in published] == ["loop/again"]
    assert eng.rules["self"].metrics.matched == 1
    assert eng.rules["other"].metrics.matched == 1


def test_failures_are_counted_per_rule_and_action() -> None:
    eng, hooks, loop, _ = make()
    add(eng, "div", 'SELECT 1 / payload.x AS v FROM "d"')
    add(eng, "bad_topic", 'SELECT payload.t AS t FROM "d"',
        {"function": "republish", "args": {"topic": "${t}"}})
    pub(hooks, "d", b'{"x": 0, "t": "a/#"}')
    loop.run()
    assert eng.rules["div"].metrics.failed == 1
    assert "division by zero" in (eng.rules["div"].metrics.last_error or "")
    assert eng.rules["bad_topic"].actions[0].failed == 1


def test_hooks_are_registered_only_while_a_rule_needs_them() -> None:
    eng, hooks, _, _ = make()
    assert not hooks.has("message.publish") and not hooks.has("message.delivered")
    add(eng, "d", 'SELECT * FROM "$events/message_delivered"')
    assert hooks.has("message.delivered") and not hooks.has("message.publish")
    eng.put(eng.build("d", {"sql": 'SELECT * FROM "$events/message_delivered"',
                            "enable": False}))
    assert not hooks.has("message.delivered")
    add(eng, "p", 'SELECT * FROM "t"')
    assert hooks.has("message.publish")
    eng.delete("p")
    assert not hooks.has("message.publish")
    eng.detach()


def test_event_sources() -> None:
    eng, hooks, _, _ = make()
    outputs: list[dict[str, Any]] = []
    for ev in ("client_connected", "session_subscribed", "message_dropped"):
        add(eng, ev, f'SELECT * FROM "$events/{ev}"')
    client = ClientInfo("c1", username="u", peer_host="10.0.0.1", peer_port=5, keepalive=30)
    hooks.run("client.connected", client)
    hooks.run("session.subscribed", client, "a/#", SubOptions(qos=2))
    hooks.run("message.dropped", Message("x", b"p", 0, publisher="c1"), "queue_full")
    hooks.run("message.dropped", Message("$SYS/x", b"p", 0), "no_subscribers")  # ignored
    from gateway.rules.compiler import Columns
    from gateway.rules.events import GETTERS

    for plan, batch in list(eng.pending):
        for event in batch:
            outputs.append(plan.rules[0].program.run(Columns(GETTERS[event.kind], event))[0])
    assert len(outputs) == 3
    c, s, d = outputs
    assert (c["event"], c["clientid"], c["peername"], c["keepalive"]) == (
        "client.connected", "c1", "10.0.0.1:5", 30)
    assert (s["topic"], s["qos"], s["event"]) == ("a/#", 2, "session.subscribed")
    assert (d["reason"], d["clientid"], d["topic"], d["payload"]) == ("queue_full", "c1", "x",
                                                                      "p")


def test_overload_is_counted_never_silent(caplog: pytest.LogCaptureFixture) -> None:
    eng, hooks, loop, _ = make(max_pending=3)
    add(eng, "r", 'SELECT * FROM "t"')
    for _ in range(5):
        pub(hooks, "t")
    assert eng.waiting == 3 and eng.dropped == 2
    assert eng.metrics.snapshot().get("rules.dropped") == 2
    assert "rule engine overloaded" in caplog.text
    loop.run()
    assert eng.rules["r"].metrics.matched == 3


def test_a_rule_change_is_validated_before_anything_changes() -> None:
    eng, _, _, _ = make()
    add(eng, "r", 'SELECT * FROM "t"')
    with pytest.raises(ValueError, match="unknown function"):
        eng.build("r", {"sql": 'SELECT nope() FROM "t"'})
    with pytest.raises(ValueError, match=r"actions\[0\]: unknown action function 'mail'"):
        eng.build("r", {"sql": 'SELECT * FROM "t"', "actions": [{"function": "mail"}]})
    with pytest.raises(ValueError, match=r"no \[webhooks.w\] configured"):
        eng.build("r", {"sql": 'SELECT * FROM "t"', "actions": ["webhook:w"]})
    assert eng.rules["r"].sql == 'SELECT * FROM "t"'


def test_republish_templates_for_qos_retain_and_properties() -> None:
    eng, hooks, loop, published = make()
    add(eng, "r", 'SELECT payload.q AS q, payload.keep AS keep, clientid FROM "p"',
        {"function": "republish", "args": {
            "topic": "o/${clientid}", "payload": "", "qos": "${q}", "retain": "${keep}",
            "user_properties": "${pub_props.User-Property}",
            "mqtt_properties": {"Content-Type": "application/json",
                                "Message-Expiry-Interval": "60",
                                "Correlation-Data": "${clientid}"}}})
    m = Message("p", b'{"q": 2, "keep": true}', 1, publisher="d9", timestamp=1.0)
    from protocols.mqtt.packets import Properties

    m.properties = Properties(user_properties=(("k", "v"),))
    assert hooks.run_fold("message.publish", (), m) is m
    loop.run()
    (out,) = published
    assert (out.topic, out.qos, out.retain) == ("o/d9", 2, True)
    assert out.payload == b'{"q":2,"keep":true,"clientid":"d9"}'
    p = out.properties
    assert (p.content_type, p.message_expiry_interval, p.correlation_data) == (
        "application/json", 60, b"d9")
    assert p.user_properties == (("k", "v"),) and out.expires_at == out.timestamp + 60
