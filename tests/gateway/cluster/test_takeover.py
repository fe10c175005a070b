"""Session takeover across nodes: a client that reconnects to another node finds its
persistent session there (subscriptions and queued messages moved), and its old
connection is closed with 0x8E."""

from __future__ import annotations

import pytest

from tests.gateway.cluster.harness import Client, wait_mesh, wait_routes, wait_until

pytestmark = pytest.mark.slow


def test_takeover_moves_subscriptions_and_queue(nodes) -> None:
    a = nodes("a")
    b = nodes("b", seeds=[a])
    c = nodes("c", seeds=[a])
    wait_mesh([a, b, c])
    first = Client(a, "roamer", clean=False, session_expiry=3600).subscribe("roam/#", 1)
    first.close()  # offline on a: messages queue there
    wait_routes(c, a, 1)
    pub = Client(c, "pub")
    try:
        for i in range(5):
            pub.publish("roam/x", f"q{i}", qos=1)
        wait_until(lambda: b.member(a.name) is not None, what="b knows a")
        moved = Client(b, "roamer", clean=False, session_expiry=3600)
        try:
            assert moved.session_present
            got = moved.collect(5)
            assert [m.payload.decode() for m in got] == [f"q{i}" for i in range(5)]
            # the subscription moved with it: routes now lead to b, not a
            wait_routes(c, b, 1)
            wait_routes(c, a, 0)
            pub.publish("roam/y", "after", qos=1)
            assert moved.collect(1)[0].payload == b"after"
        finally:
            moved.close()
    finally:
        pub.close()


def test_online_takeover_closes_the_old_connection_with_0x8e(nodes) -> None:
    a = nodes("a")
    b = nodes("b", seeds=[a])
    wait_mesh([a, b])
    old = Client(a, "twin", clean=False, session_expiry=600).subscribe("twin/#", 1)
    wait_routes(b, a, 1)
    wait_until(lambda: b.cluster()["members"], what="registry")
    new = Client(b, "twin", clean=False, session_expiry=600)
    try:
        assert old.disconnected.wait(20), "the old connection was not closed"
        assert getattr(old.disconnect_reason, "value", old.disconnect_reason) == 0x8E
        assert new.session_present
        wait_routes(a, b, 1)
    finally:
        old.close()
        new.close()
