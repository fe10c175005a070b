"""Partitions (through a fault-injecting proxy between the nodes) heal by themselves and
lose nothing acknowledged; autoclean forgets a node down too long.

Each node advertises the address of its own :class:`FaultProxy`, so every link another
node dials to it crosses that proxy: cutting a proxy cuts the links towards that node
(one direction of the mesh), cutting both is a full partition.
"""

from __future__ import annotations

import pytest

from tests.gateway.cluster.faultproxy import FaultProxy
from tests.gateway.cluster.harness import Client, free_port, wait_mesh, wait_routes, wait_until

pytestmark = pytest.mark.slow

FAST = {"GATEWAY_CLUSTER__HEARTBEAT_TIMEOUT": "2s"}  # a cut is noticed sooner


def proxied(nodes, short: str, seed=None):  # type: ignore[no-untyped-def]
    port = free_port()
    proxy = FaultProxy(("127.0.0.1", port))
    extra = {"GATEWAY_CLUSTER__BIND": f"127.0.0.1:{port}", **FAST,
             "GATEWAY_CLUSTER__ADVERTISE": proxy.addr}
    if seed is not None:
        extra["GATEWAY_CLUSTER__SEEDS"] = f"{seed[0].name}:{seed[1].port}"
    return nodes(short, extra=extra), proxy


def test_partition_heals_without_losing_acknowledged_messages(nodes) -> None:
    a, pa = proxied(nodes, "a")
    b, pb = proxied(nodes, "b", seed=(a, pa))
    clients: list[Client] = []
    try:
        wait_mesh([a, b])
        sub_b = Client(b, "sub-b", clean=False, session_expiry=600).subscribe("p/#", 1)
        sub_a = Client(a, "sub-a", clean=False, session_expiry=600).subscribe("q/#", 1)
        pub_a, pub_b = Client(a, "pub-a"), Client(b, "pub-b")
        clients += [sub_a, sub_b, pub_a, pub_b]
        wait_routes(a, b, 1)
        wait_routes(b, a, 1)
        sent_p: list[str] = []
        sent_q: list[str] = []

        def publish(tag: str, n: int) -> None:
            for i in range(n):
                pub_a.publish("p/x", f"{tag}{i}", qos=1)
                sent_p.append(f"{tag}{i}")
                pub_b.publish("q/x", f"{tag}{i}", qos=1)
                sent_q.append(f"{tag}{i}")

        publish("before", 5)
        # 1. full partition: both directions black-holed
        pa.cut()
        pb.cut()
        publish("cut", 10)  # acknowledged before either side noticed
        wait_until(lambda: a.state_of(b) == "down" and b.state_of(a) == "down",
                   what="both sides see the other down")
        # routes converge: the other side's routes are gone (parked for QoS >= 1)
        assert a.remote_routes(b) == 0 and b.remote_routes(a) == 0
        assert a.member(b.name)["parked_routes"] == 1
        publish("down", 10)  # acknowledged while each side thinks the other is dead
        pa.restore()
        pb.restore()
        wait_mesh([a, b])
        wait_routes(a, b, 1)  # each node re-asserted its own routes
        wait_routes(b, a, 1)
        wait_until(lambda: a.member(b.name)["outbox"]["len"] == 0
                   and b.member(a.name)["outbox"]["len"] == 0, what="outboxes drained")
        # 2. one direction only: the links a dials to b are cut, b's to a stay
        pb.cut()
        wait_until(lambda: a.state_of(b) != "up", what="a's links to b down")
        publish("half", 10)
        pb.restore()
        wait_mesh([a, b])
        wait_until(lambda: a.member(b.name)["outbox"]["len"] == 0
                   and b.member(a.name)["outbox"]["len"] == 0, what="outboxes drained")
        got_b = [m.payload.decode() for m in sub_b.collect(len(sent_p))]
        got_a = [m.payload.decode() for m in sub_a.collect(len(sent_q))]
        assert sorted(got_b) == sorted(sent_p)  # every acknowledged message, once
        assert sorted(got_a) == sorted(sent_q)
        assert sub_b.drain() == [] and sub_a.drain() == []
    finally:
        for cl in clients:
            cl.close()
        pa.close()
        pb.close()


def test_autoclean_forgets_a_node_down_too_long(nodes) -> None:
    a = nodes("a", extra={"GATEWAY_CLUSTER__AUTOCLEAN": "2s"})
    b = nodes("b", seeds=[a])
    wait_mesh([a, b])
    b.kill()
    wait_until(lambda: a.state_of(b) == "down", what="b down")
    wait_until(lambda: a.member(b.name) is None, what="b forgotten by autoclean")
    assert "autoclean" in a.log()


def test_replicant_cut_off_from_its_core_moves_what_it_acknowledged(nodes) -> None:
    """A replicant whose core is cut off (black hole: the links it dials to its core
    stall) finds out by its heartbeat timeout, attaches to the other core, and the QoS 1
    messages it acknowledged meanwhile (queued for the old core, never applied there)
    reach the subscriber on the other core through the new one, exactly once."""
    a, pa = proxied(nodes, "a")
    b, pb = proxied(nodes, "b", seed=(a, pa))
    r = nodes("e", role="replicant",
              extra={**FAST, "GATEWAY_CLUSTER__SEEDS": f"{a.name}:{pa.port}"})
    clients: list[Client] = []
    try:
        wait_mesh([a, b])
        sub = Client(b, "sub-b", clean=False, session_expiry=600).subscribe("q/#", 1)
        pub = Client(r, "pub-r")
        clients += [sub, pub]
        wait_until(lambda: (r.cluster()["replicant"] or {}).get("core") == a.name
                   and r.remote_routes(a) == 1, what="the replicant on a, b's route through a")
        pub.publish("q/x", "warm", qos=1)
        assert sub.next_message().payload == b"warm"
        # a's acknowledgement of "warm" back on the replicant too (else the replicant
        # rightly moves it to b as well: at least once), then the cut
        wait_until(lambda: r.member(a.name)["outbox"]["len"] == 0, what="warm acknowledged")
        pa.cut()  # every link dialled to a stalls: the replicant's and b's
        for i in range(3):
            pub.publish("q/x", f"cut{i}", qos=1)  # acknowledged by the replicant
        wait_until(lambda: (r.cluster()["replicant"] or {}).get("core") == b.name,
                   what="the replicant attached to b")
        got = sorted(m.payload.decode() for m in sub.collect(3))
        assert got == ["cut0", "cut1", "cut2"]
        pa.restore()
        wait_mesh([a, b])
        pub.publish("q/x", "after", qos=1)
        assert sub.next_message().payload == b"after"
        assert sub.drain() == []  # nothing twice
        assert "unacknowledged forwards for a@127.0.0.1 go through b@127.0.0.1" in r.log()
    finally:
        for cl in clients:
            cl.close()
        pa.close()
        pb.close()


def test_core_hands_over_what_it_queued_for_a_replicant_that_moved(nodes) -> None:
    """A core keeps QoS 1 messages for its replicant that the replicant never got (the
    links towards the replicant and towards the core are cut); the replicant attaches to
    the other core; when the first core hears of it (the other core's member list, once
    their link is back) it sends what it queued there, marked for the replicant, and
    forgets it: the subscriber on the replicant gets each message once."""
    quick = {"GATEWAY_CLUSTER__CONNECT_TIMEOUT": "1s"}
    a, pa = proxied(nodes, "a")
    b, pb = proxied(nodes, "b", seed=(a, pa))
    port = free_port()
    pr = FaultProxy(("127.0.0.1", port))
    r = nodes("e", role="replicant", extra={
        **FAST, **quick, "GATEWAY_CLUSTER__BIND": f"127.0.0.1:{port}",
        "GATEWAY_CLUSTER__ADVERTISE": pr.addr,
        "GATEWAY_CLUSTER__SEEDS": f"{a.name}:{pa.port}"})
    clients: list[Client] = []
    try:
        wait_mesh([a, b])
        sub = Client(r, "sub-r", clean=False, session_expiry=600).subscribe("z/#", 1)
        pub = Client(a, "pub-a")
        clients += [sub, pub]
        wait_until(lambda: (r.cluster()["replicant"] or {}).get("core") == a.name
                   and a.member(r.name)["routes"] == 1, what="the replicant on a, its route")
        pr.cut()  # a's links to the replicant stall; so do its links to a
        pa.cut()
        for i in range(3):
            pub.publish("z/x", f"held{i}", qos=1)  # acknowledged by a, queued for r
        wait_until(lambda: (r.cluster()["replicant"] or {}).get("core") != a.name,
                   what="the replicant detached from a")
        pr.restore()  # a stays unreachable: the replicant can only attach to b
        wait_until(lambda: (r.cluster()["replicant"] or {}).get("core") == b.name
                   and (r.cluster()["replicant"] or {}).get("state") == "normal",
                   what="the replicant attached to b")
        assert a.member(r.name)["outbox"]["len"] == 3
        pa.restore()  # b's links to a come back with its member list
        got = sorted(m.payload.decode() for m in sub.collect(3, 30))
        assert got == ["held0", "held1", "held2"]
        wait_until(lambda: a.member(r.name) is None, what="a forgot the replicant")
        assert "3 unacknowledged forwards for e@127.0.0.1 go through its core" in a.log()
        pub.publish("z/x", "after", qos=1)
        assert sub.next_message().payload == b"after"
        assert sub.drain() == []  # nothing twice
    finally:
        for cl in clients:
            cl.close()
        for p in (pa, pb, pr):
            p.close()
