"""Route replication and cross-node delivery between real gatewayd processes.

Publisher on one node, subscriber on another, at QoS 0, 1 and 2; routes follow
subscriptions and die with their node; QoS 1 messages acknowledged while the
subscriber's node was frozen and then killed (-9) reach the subscriber after it returns.
"""

from __future__ import annotations

import pytest

from tests.gateway.cluster.harness import Client, wait_mesh, wait_routes, wait_until

pytestmark = pytest.mark.slow


def test_cross_node_delivery_at_every_qos(nodes) -> None:
    a = nodes("a")
    b = nodes("b", seeds=[a])
    c = nodes("c", seeds=[a])
    wait_mesh([a, b, c])
    subs = {}
    for q in (0, 1, 2):
        subs[q] = Client(b, f"sub{q}").subscribe(f"q{q}/#", q)
    far = Client(c, "far").subscribe("q2/only", 2)
    wait_routes(a, b, 3)
    wait_routes(a, c, 1)
    pub = Client(a, "pub")
    try:
        for q in (0, 1, 2):
            for i in range(20):
                pub.publish(f"q{q}/x", f"{q}-{i}", qos=q)
        pub.publish("q2/only", "both", qos=2)
        for q in (0, 1, 2):
            got = subs[q].collect(20)
            assert [m.payload.decode() for m in got] == [f"{q}-{i}" for i in range(20)]
            assert {m.qos for m in got} == {q}
        assert subs[2].collect(1)[0].payload == b"both"
        assert far.collect(1)[0].payload == b"both"
        assert subs[2].drain() == [] and far.drain() == []  # exactly once
        # c got nothing but q2/only: forwarding follows routes
        assert a.member(c.name)["forwarded"] == 1
        # routes follow subscriptions
        subs[0].c.unsubscribe("q0/#")
        wait_routes(a, b, 2)
    finally:
        for cl in (*subs.values(), far, pub):
            cl.close()


def test_routes_of_a_dead_node_go_and_queued_qos1_survives_kill_9(nodes) -> None:
    a = nodes("a")
    b = nodes("b", seeds=[a])
    wait_mesh([a, b])
    sub = Client(b, "keeper", clean=False, session_expiry=3600).subscribe("keep/#", 1)
    sub.close()  # offline: b queues for it in its durable session
    wait_routes(a, b, 1)
    pub = Client(a, "pub")
    try:
        assert b.proc is not None
        b.proc.send_signal(19)  # SIGSTOP: b is unreachable but its links stay open
        for i in range(10):
            pub.publish("keep/x", f"m{i}", qos=1)  # acknowledged by a (a's outbox)
        wait_until(lambda: a.member(b.name)["outbox"]["len"] == 10, what="10 in a's outbox")
        b.kill()  # -9 while frozen
        wait_until(lambda: a.state_of(b) == "down", what="b down")
        assert a.remote_routes(b) == 0
        b.start()
        wait_mesh([a, b])
        wait_until(lambda: a.member(b.name)["outbox"]["len"] == 0, what="outbox drained")
        back = Client(b, "keeper", clean=False, session_expiry=3600)
        try:
            got = back.collect(10)
            assert sorted(m.payload.decode() for m in got) == [f"m{i}" for i in range(10)]
        finally:
            back.close()
    finally:
        pub.close()
