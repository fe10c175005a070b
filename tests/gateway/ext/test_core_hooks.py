"""The extensions as hook subscribers of a core on a virtual clock (no sockets), and
property tests of their parsers (``$delayed/``, rewrite rules, topic matching)."""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.config.extensions import AutoSubscribeTopic, RewriteRule
from gateway.core.authz import Authorizer, from_config
from gateway.core.clock import VirtualScheduler
from gateway.core.deferred import Deferred
from gateway.core.hooks import Priority, Stop
from gateway.core.node import CoreSettings, Node
from gateway.core.topic_index import topic_matches
from gateway.ext.auto_subscribe import AutoSubscribe, TopicTemplate, fill
from gateway.ext.delayed import MAX_INTERVAL, DelayedPublisher, Pending, parse_delayed
from gateway.ext.exclusive import ExclusiveSubscriptions
from gateway.ext.rewrite import Rewriter, compile_rules, filter_matches
from protocols.context import (
    PUBLISH_REFUSED,
    RESUBSCRIBED,
    SUBSCRIBED,
    ClientInfo,
    Message,
    SubOptions,
)
from tests.gateway.core.test_node import connect

NOW = 1_700_000_000.0

# -- $delayed/ parser ------------------------------------------------------------------------

words = st.text(alphabet="abcxyz019_-", min_size=1, max_size=6)
topics = st.lists(words, min_size=1, max_size=5).map("/".join)


@given(st.integers(min_value=0, max_value=MAX_INTERVAL), topics)
def test_interval_is_seconds_from_now(n: int, topic: str) -> None:
    assert parse_delayed(f"$delayed/{n}/{topic}", NOW) == (NOW + n, topic)


@given(st.integers(min_value=MAX_INTERVAL + 1, max_value=10**12), topics)
def test_a_large_number_is_a_unix_time_within_range(n: int, topic: str) -> None:
    got = parse_delayed(f"$delayed/{n}/{topic}", NOW)
    if abs(n - NOW) <= MAX_INTERVAL:
        assert got == (max(float(n), NOW), topic)
    else:
        assert got is None


@given(st.text(max_size=30))
def test_parser_never_raises_and_only_accepts_digits(rest: str) -> None:
    got = parse_delayed("$delayed/" + rest, NOW)
    if got is not None:
        number, _, final = rest.partition("/")
        assert number.isdigit() and number.isascii() and final == got[1]
        assert "+" not in final and "#" not in final and final


@pytest.mark.parametrize("topic", [
    "$delayed/", "$delayed/10", "$delayed/10/", "$delayed/-1/a", "$delayed/+5/a",
    "$delayed/1.5/a", "$delayed/ 5/a", "$delayed/\uff15/a", "$delayed/10/a/#", "$delayed/10/+",
    f"$delayed/{int(NOW) + MAX_INTERVAL + 1}/a",
])
def test_invalid_delayed_topics(topic: str) -> None:
    assert parse_delayed(topic, NOW) is None


# -- rewrite rules -----------------------------------------------------------------------------


filters = st.lists(st.one_of(words, st.just("+")), min_size=1, max_size=4).flatmap(
    lambda ws: st.sampled_from(["/".join(ws), "/".join([*ws, "#"])]))


@given(filters, topics)
def test_filter_matching_agrees_with_the_protocol_library(f: str, topic: str) -> None:
    assert filter_matches(tuple(f.split("/")), topic) == topic_matches(f, topic)


def rule(action: str, source: str, dest: str, regex: str) -> RewriteRule:
    return RewriteRule(action=action, source_topic=source, dest_topic=dest, re=regex)  # type: ignore[arg-type]


CLIENT = ClientInfo(client_id="c1", username="u1")


@given(topics)
def test_rewrite_is_pure_and_first_matching_rule_decides(topic: str) -> None:
    rw = Rewriter(compile_rules([
        rule("all", "a/#", "b/$1", "^a/(.+)$"),
        rule("all", "a/x/#", "never", "^a/x/(.+)$"),
        rule("publish", "#", "all/$1", "^(z.*)$"),
    ]))
    t = "a/" + topic
    once = rw.rewrite(CLIENT, "publish", t)
    assert once == "b/" + topic == rw.rewrite(CLIENT, "publish", t)
    assert rw.rewrite(CLIENT, "subscribe", "a/x/" + topic) == "b/x/" + topic


def test_regex_that_does_not_match_leaves_the_topic_and_stops() -> None:
    rw = Rewriter(compile_rules([
        rule("all", "a/#", "b/$1", "^a/(only)$"),
        rule("all", "a/#", "c/$1", "^a/(.+)$"),
    ]))
    assert rw.rewrite(CLIENT, "publish", "a/other") == "a/other"
    assert rw.rewrite(CLIENT, "publish", "a/only") == "b/only"


def test_placeholders_groups_shares_and_actions() -> None:
    rw = Rewriter(compile_rules([
        rule("subscribe", "s/+/+", "t/${clientid}/${username}/$2/$1/$9", r"^s/(\w+)/(\w+)$"),
        rule("publish", "p/#", "q/$1", "^p/(.*)$"),
    ]))
    assert rw.rewrite(CLIENT, "subscribe", "s/a/b") == "t/c1/u1/b/a/"
    assert rw.rewrite(CLIENT, "publish", "s/a/b") == "s/a/b"  # a subscribe-only rule
    assert rw.rewrite(CLIENT, "subscribe", "p/x") == "p/x"  # a publish-only rule
    assert rw.rewrite(CLIENT, "subscribe", "$share/g/s/a/b") == "$share/g/t/c1/u1/b/a/"
    assert rw.rewrite(CLIENT, "subscribe", "$queue/s/a/b") == "$queue/t/c1/u1/b/a/"
    anon = ClientInfo(client_id="c2")
    assert rw.rewrite(anon, "subscribe", "s/a/b") == "t/c2//b/a/"


def test_bad_regex_is_a_config_error_naming_the_rule() -> None:
    with pytest.raises(ValueError, match=re.escape("rule with source_topic 'x/#'")):
        rule("all", "x/#", "y", "(")
    with pytest.raises(ValueError):
        rule("all", "x/#/y", "y", ".")  # a bad source filter
    with pytest.raises(ValueError, match="unknown placeholder"):
        AutoSubscribeTopic(topic="a/${nope}")


# -- the extensions on a core ----------------------------------------------------------------


@pytest.fixture
def clock() -> VirtualScheduler:
    return VirtualScheduler(NOW)


@pytest.fixture
def node(clock: VirtualScheduler) -> Node:
    rules = from_config([
        {"permission": "deny", "action": "publish", "topics": ["secret/#"]},
        {"permission": "deny", "action": "subscribe", "topics": ["private/#"]},
    ])
    return Node(CoreSettings(), clock, authorizer=Authorizer(rules, "allow"))


def test_delayed_fires_in_due_order_cancel_and_limit(node: Node, clock: VirtualScheduler) -> None:
    d = DelayedPublisher(node, max_messages=3)
    d.attach()
    sub, h, _ = connect(node, "sub")
    node.subscribe(sub, "t/#", SubOptions(qos=1))
    pub, _, _ = connect(node, "pub")
    assert node.publish(pub, Message("$delayed/5/t/b", b"b", 1, publisher="pub")) == 0
    assert node.publish(pub, Message("$delayed/2/t/a", b"a", 1, publisher="pub")) == 0
    assert node.publish(pub, Message("$delayed/9/t/c", b"c", 1, publisher="pub")) == 0
    assert node.publish(pub, Message("$delayed/1/t/full", b"x", 1)) == PUBLISH_REFUSED
    assert node.publish(pub, Message("$delayed/1/t/full", b"x", 0)) == 0  # QoS 0: dropped
    assert node.metrics.get("messages.delayed.refused") == 2
    assert d.cancel(3) and not d.cancel(3)
    clock.advance(1.9)
    assert h.topics() == []
    clock.advance(0.2)
    assert h.topics() == ["t/a"]
    clock.advance(10)
    assert h.topics() == ["t/a", "t/b"]  # t/c was cancelled
    assert d.pending == {} and clock.pending() == 0
    assert node.retainer.match("#") == []  # nothing kept under $delayed


def test_delayed_expiry_interval_counts_from_publication(
    node: Node, clock: VirtualScheduler,
) -> None:
    DelayedPublisher(node).attach()
    sub, h, _ = connect(node, "s")
    node.subscribe(sub, "e", SubOptions(qos=1))
    m = Message("$delayed/100/e", b"x", 1, publisher="p", timestamp=NOW, expires_at=NOW + 10)
    node.publish(ClientInfo(client_id="p"), m)
    clock.advance(100)
    (d,) = h.delivered
    assert d.message.topic == "e" and d.message.timestamp == NOW + 100
    assert d.message.expires_at == NOW + 110 and d.message.publisher == "p"


def test_delayed_restore_fires_what_is_due(node: Node, clock: VirtualScheduler) -> None:
    sub, h, _ = connect(node, "s")
    node.subscribe(sub, "r/#", SubOptions(qos=0))
    d = DelayedPublisher(node)
    d.restore([Pending(7, NOW - 5, Message("r/past", b"1", 0, timestamp=NOW - 60)),
               Pending(3, NOW + 5, Message("r/future", b"2", 0, timestamp=NOW - 60))])
    d.attach()
    clock.advance(0)
    assert h.topics() == ["r/past"]
    assert d.add(NOW + 1, Message("r/new", b"3")).id == 8  # ids continue after the stored
    clock.advance(6)
    assert h.topics() == ["r/past", "r/new", "r/future"]


def test_authorization_checks_the_final_topic_rewritten(node: Node) -> None:
    DelayedPublisher(node).attach()
    Rewriter(compile_rules([rule("all", "alias/#", "secret/$1", "^alias/(.+)$")])).attach(
        node.hooks)
    c = ClientInfo(client_id="c")
    assert not node.authorize(c, "publish", "$delayed/5/secret/x")
    assert not node.authorize(c, "publish", "alias/x")  # rewritten before authorization
    assert not node.authorize(c, "publish", "$delayed/5/alias/x")
    assert node.authorize(c, "publish", "$delayed/5/open/x")


def test_exclusive_refuses_second_holder_releases_on_unsubscribe_and_end(node: Node) -> None:
    ex = ExclusiveSubscriptions(node)
    ex.attach()
    a, _, _ = connect(node, "a")
    b, _, _ = connect(node, "b")
    assert node.subscribe(a, "$exclusive/x", SubOptions()) == SUBSCRIBED
    assert node.subscribe(b, "$exclusive/x", SubOptions()) == 0x97
    assert node.subscribe(a, "$exclusive/x", SubOptions(qos=1)) == RESUBSCRIBED  # the holder again
    assert set(node.sessions["a"].subscriptions) == {"x"}
    assert "x" not in node.sessions["b"].subscriptions
    assert node.subscribe(b, "$exclusive/", SubOptions()) == 0x8F
    assert node.unsubscribe(a, "$exclusive/x")
    assert node.subscribe(b, "$exclusive/x", SubOptions()) == SUBSCRIBED
    hb = node.sessions["b"].handle
    assert hb is not None
    node.close(b, hb, send_will=False)  # expiry 0: the session ends
    assert node.subscribe(a, "$exclusive/x", SubOptions()) == SUBSCRIBED
    assert ex.holders == {"x": "a"} and ex.held == {"a": {"x"}}
    assert not node.authorize(a, "subscribe", "$exclusive/private/y")


def test_auto_subscribe_on_connect_and_resume(node: Node, clock: VirtualScheduler) -> None:
    node.retainer.on_publish(Message("cmd/d1", b"kept", 1, True))
    auto = AutoSubscribe(node, [TopicTemplate("cmd/${clientid}", 1),
                                TopicTemplate("u/${username}", 0),
                                TopicTemplate("private/${clientid}", 0)],
                         lambda cid: [TopicTemplate("own/" + cid, 2, nl=1)])
    auto.attach()
    info, h, _ = connect(node, "d1", expiry=300)
    subs = node.sessions["d1"].subscriptions
    assert subs == {"cmd/d1": SubOptions(1), "own/d1": SubOptions(2, no_local=True)}
    assert node.metrics.get("auto_subscribe.skipped") == 1  # no username
    assert node.metrics.get("auto_subscribe.denied") == 1  # private/# is denied
    assert h.topics() == []  # retained messages come on the next loop turn
    clock.advance(0)
    assert h.topics() == ["cmd/d1"]
    handle = node.sessions["d1"].handle
    assert handle is not None
    node.close(info, handle, send_will=False)
    _, _, present = connect(node, "d1", clean=False, expiry=300)
    assert present and len(node.sessions["d1"].subscriptions) == 2
    assert node.broker.subscription_count() == 2


def test_auto_subscribe_waits_for_an_authorization_that_answers_later(
        node: Node, clock: VirtualScheduler) -> None:
    asked: list[tuple[str, Deferred[Any]]] = []

    def ask(client: ClientInfo, action: str, topic: str, acc: bool) -> Any:
        d: Deferred[Any] = Deferred()  # an HTTP authorization service, asked
        asked.append((topic, d))
        return d

    node.hooks.add("client.authorize", ask, Priority.AUTHZ)
    node.retainer.on_publish(Message("cmd/d1", b"kept", 1, True))
    AutoSubscribe(node, [TopicTemplate("cmd/${clientid}", 1),
                         TopicTemplate("no/${clientid}", 0)]).attach()
    info, h, _ = connect(node, "d1", expiry=300)
    assert [t for t, _ in asked] == ["cmd/d1", "no/d1"]
    assert node.sessions["d1"].subscriptions == {}  # nothing before the answers
    asked[0][1].resolve(Stop(True))
    asked[1][1].resolve(Stop(False))
    assert node.sessions["d1"].subscriptions == {"cmd/d1": SubOptions(1)}
    assert h.topics() == ["cmd/d1"]  # the retained message, once allowed
    assert node.metrics.get("auto_subscribe.denied") == 1
    # an answer for a connection that has gone subscribes nothing
    handle = node.sessions["d1"].handle
    assert handle is not None
    node.close(info, handle, send_will=False)
    connect(node, "d1", expiry=300)
    stale = asked[2][1]
    connect(node, "d1", expiry=300)  # taken over before the first answer came
    stale.resolve(Stop(True))
    assert node.metrics.get("auto_subscribe.subscribed") == 1


def test_fill_placeholders() -> None:
    c = ClientInfo(client_id="id", username="u", peer_host="10.0.0.1", peer_port=5)
    assert fill("a/${clientid}/${username}/${host}/${port}", c) == "a/id/u/10.0.0.1/5"
    assert fill("a/${username}", ClientInfo(client_id="x")) is None


def test_detach_leaves_the_core_plain(node: Node) -> None:
    parts: list[DelayedPublisher | ExclusiveSubscriptions] = [
        DelayedPublisher(node), ExclusiveSubscriptions(node)]
    for p in parts:
        p.attach()
    rw = Rewriter(compile_rules([rule("all", "#", "z", ".*")]))
    rw.attach(node.hooks)
    for p in parts:
        p.detach()
    rw.detach()
    for name in ("topic.rewrite", "topic.authorize", "client.subscribe", "client.unsubscribe"):
        assert not node.hooks.has(name)
