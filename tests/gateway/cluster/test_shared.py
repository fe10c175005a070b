"""Shared subscriptions across nodes: each message reaches exactly one member of a group
cluster-wide, and a message whose chosen node goes away goes to another member.

Three real gatewayd nodes; the publisher is on ``a``, group members on every node.
"""

from __future__ import annotations

import queue
import time

import pytest

from gateway.cluster import frames as F
from protocols.context import Message
from tests.gateway.cluster.harness import WAIT, Client, wait_mesh, wait_routes, wait_until


def test_shared_target_round_trips_in_a_data_record() -> None:
    m = Message("work/x", b"p", 1)
    plain, shared = F.encode_message(m), F.encode_message(m, ("g", "work/#"))
    (got,) = F.decode_batch(F.encode_batch([F.record(7, shared)])[5:])
    assert got.share == ("g", "work/#") and got.message.payload == b"p" and got.seq == 7
    assert F.decode_batch(F.encode_batch([F.record(1, plain)])[5:])[0].share is None


def gather(clients: list[Client], n: int, timeout: float = WAIT) -> dict[str, list[str]]:
    """Poll every client until ``n`` messages arrived between them (bounded)."""
    got: dict[str, list[str]] = {cl.c._client_id.decode(): [] for cl in clients}
    deadline = time.monotonic() + timeout
    while sum(map(len, got.values())) < n:
        if time.monotonic() > deadline:
            raise AssertionError(f"got {sum(map(len, got.values()))} of {n}: {got}")
        for cl in clients:
            try:
                m = cl.messages.get(timeout=0.02)
            except queue.Empty:
                continue
            got[cl.c._client_id.decode()].append(m.payload.decode())
    return got


@pytest.mark.slow
def test_each_message_to_one_member_cluster_wide_and_failover(nodes) -> None:
    fast = {"GATEWAY_CLUSTER__HEARTBEAT_TIMEOUT": "2s"}  # c's death is noticed sooner
    a = nodes("a", extra=fast)
    b = nodes("b", seeds=[a], extra=fast)
    c = nodes("c", seeds=[a], extra=fast)
    wait_mesh([a, b, c])
    s0 = Client(a, "s0").subscribe("$share/g/work/#", 1)
    s1 = Client(b, "s1").subscribe("$share/g/work/#", 1)
    s2 = Client(b, "s2").subscribe("$share/g/work/#", 1)
    s3 = Client(c, "s3").subscribe("$share/g/work/#", 1)
    plain = Client(b, "plain").subscribe("work/#", 1)
    wait_routes(a, b, 2)
    wait_routes(a, c, 1)
    pub = Client(a, "pub")
    members = [s0, s1, s2, s3]
    try:
        for i in range(30):
            pub.publish("work/x", f"m{i}", qos=1)
        got = gather(members, 30)
        everything = sorted(p for ps in got.values() for p in ps)
        assert everything == sorted(f"m{i}" for i in range(30))  # each exactly once
        assert got["s0"] and (got["s1"] or got["s2"]) and got["s3"]  # every node chosen
        assert sorted(m.payload.decode() for m in plain.collect(30)) == sorted(
            f"m{i}" for i in range(30))  # plain subscribers still get every message
        assert all(cl.drain() == [] for cl in members)

        # c freezes, then dies: what a queued for c's member goes to the others
        assert c.proc is not None
        c.proc.send_signal(19)  # SIGSTOP
        for i in range(30):
            pub.publish("work/y", f"n{i}", qos=1)  # acknowledged by a
        c.kill()
        wait_until(lambda: a.state_of(c) == "down", what="c down")
        got = gather([s0, s1, s2], 30)
        assert sorted(p for ps in got.values() for p in ps) == sorted(
            f"n{i}" for i in range(30))
        # the group on b shrinks to one member, then none: b's routes follow
        s2.close()
        s1.close()
        wait_routes(a, b, 1)
        for i in range(5):
            pub.publish("work/z", f"z{i}", qos=1)
        assert sorted(m.payload.decode() for m in s0.collect(5)) == [f"z{i}" for i in range(5)]
    finally:
        for cl in (*members, plain, pub):
            cl.close()
