"""Delayed messages cluster-wide (gateway.cluster.delayed) with real gatewayd nodes over
mutual TLS: a ``$delayed/N/t`` message taken on a node that is killed -9 before its due
time is published by one other core (once); the restarted node does not publish it
again; in the normal case every subscriber gets exactly one copy.

Every wait is a bounded poll of a visible outcome (a message, the API's table state, a
log line), never a fixed sleep.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.gateway.cluster.harness import WAIT, Client, Node, wait_mesh, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.ext]

# grace = 2 x heartbeat_timeout: another node takes a message over 3 s after its due time
FAST = {"GATEWAY_CLUSTER__HEARTBEAT_TIMEOUT": "1.5s"}


def delayed(node: Node) -> dict[str, int]:
    t = node.cluster()["tables"]["delayed"]
    return {"rows": t["rows"], "tombstones": t["tombstones"]}


def test_a_delayed_message_survives_its_node_killed_and_is_not_published_twice(
    nodes: Callable[..., Node],
) -> None:
    """Three cores: a takes the message and is killed -9 before its due time; b (first
    by name of the cores left) publishes it, c does not: c's subscriber gets one copy."""
    a = nodes("a", extra=FAST)
    b = nodes("b", seeds=[a], extra=FAST)
    c = nodes("c", seeds=[a, b], extra=FAST)
    wait_mesh([a, b, c])
    subs = [Client(n, f"sub-{n.short}").subscribe("later/t", 1) for n in (b, c)]
    pub = Client(a, "pub-a")
    try:
        pub.publish("$delayed/3/later/t", b"once", qos=1)
        wait_until(lambda: delayed(b)["rows"] == delayed(c)["rows"] == 1, WAIT,
                   "b and c to hold a's delayed row")
        pub.close()
        a.kill()
        for sub in subs:
            m = sub.next_message(timeout=WAIT + 10)
            assert (m.topic, m.payload) == ("later/t", b"once")
        wait_until(lambda: delayed(b) == delayed(c) == {"rows": 0, "tombstones": 1}, WAIT,
                   "the tombstone on b and c")
        assert "(unreachable) published here" in b.log()
        assert [n.cluster()["tables"]["delayed"]["taken_over"] for n in (b, c)] == [1, 0]
        # a comes back with the message in its journal: b's tombstone cancels it there
        a.start()
        wait_mesh([a, b, c])
        wait_until(lambda: "not published again" in a.log(), WAIT,
                   "a to learn that b published it")
        assert delayed(a) == {"rows": 0, "tombstones": 1}
        assert [sub.drain() for sub in subs] == [[], []]
    finally:
        pub.close()
        for sub in subs:
            sub.close()


def test_in_the_normal_case_each_subscriber_gets_one_copy(nodes: Callable[..., Node]) -> None:
    a = nodes("a", extra=FAST)
    b = nodes("b", seeds=[a], extra=FAST)
    wait_mesh([a, b])
    sa = Client(a, "sub-a").subscribe("soon/t", 1)
    sb = Client(b, "sub-b").subscribe("soon/t", 1)
    pub = Client(b, "pub-b")
    try:
        wait_until(lambda: a.remote_routes(b) >= 1, WAIT, "b's route on a")
        pub.publish("$delayed/1/soon/t", b"one", qos=1)
        for s in (sa, sb):
            m = s.next_message(timeout=WAIT)
            assert (m.topic, m.payload) == ("soon/t", b"one")
        # the origin's tombstone reached the other node: nobody can take it over now
        wait_until(lambda: delayed(a) == delayed(b) == {"rows": 0, "tombstones": 1}, WAIT,
                   "the tombstone on both nodes")
        assert sa.drain() == [] and sb.drain() == []
        assert "published here" not in a.log() + b.log()
        assert [n.cluster()["tables"]["delayed"]["taken_over"] for n in (a, b)] == [0, 0]
    finally:
        pub.close()
        sa.close()
        sb.close()
