"""What a core announces to whom (gateway.cluster.relay): after any sequence of changes
by this node, by cores and by attached replicants, the operations queued for each
audience, applied to what it was told before, give exactly its view; and the replicant's
copy of the streamed session table."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.cluster.relay import Announcer, ReplicaLog
from gateway.cluster.routes import RouteTable

NODES = ["self", "core2", "rep1", "rep2"]  # "self" is this core
REPS = ["rep1", "rep2"]
KEYS = ["a", "b/+", "c/#", "$share/g/d"]

change = st.tuples(st.sampled_from(NODES), st.sampled_from(KEYS), st.booleans())


@settings(max_examples=200, deadline=None)
@given(st.lists(change, max_size=40))
def test_queued_operations_reproduce_every_audience_view(changes) -> None:  # type: ignore[no-untyped-def]
    local: set[str] = set()
    table = RouteTable()
    ann = Announcer(lambda: local, lambda: table.by_node, lambda k: table.nodes_of.get(k, ()))
    told_core: set[str] = set()
    told: dict[str, set[str]] = {r: set() for r in REPS}

    def apply(ops: list[list[str]], target: set[str]) -> None:
        for op, key in ops:
            if op == "+":
                assert key not in target
                target.add(key)
            else:
                assert key in target
                target.discard(key)

    for node, key, added in changes:
        if node == "self":
            ann.change(key, REPS, (lambda k=key: local.add(k)) if added
                       else (lambda k=key: local.discard(k)))
        else:
            ann.change(key, REPS, (lambda n=node, k=key: table.add(n, k)) if added
                       else (lambda n=node, k=key: table.remove(n, k)))
        core_ops, rep_ops = ann.take()
        apply(core_ops, told_core)
        for r in REPS:
            apply(rep_ops.get(r, []), told[r])
    assert told_core == ann.core_view(REPS)
    assert told_core == local | table.keys_of("rep1") | table.keys_of("rep2")
    for r in REPS:
        assert told[r] == ann.replica_view(r)
        others = set().union(*(table.keys_of(n) for n in NODES if n not in ("self", r)))
        assert told[r] == local | others


def test_without_replicants_only_local_changes_are_announced() -> None:
    local: set[str] = set()
    table = RouteTable()
    ann = Announcer(lambda: local, lambda: table.by_node, lambda k: table.nodes_of.get(k, ()))
    ann.change("a", [], lambda: table.add("core2", "a"))
    ann.change("b", [], lambda: local.add("b"))
    assert ann.take() == ([["+", "b"]], {})


def test_replica_log_states() -> None:
    log = ReplicaLog()
    assert log.status()["state"] == "bootstrap"
    log.entry(1, "claim", ["c1", "a"])  # before a snapshot: ignored
    assert len(log) == 0
    log.snapshot(5, {"c1": "a", "c2": "b"})
    log.core_seq = 7  # the core reported more than it sent so far
    assert log.status() == {"state": "replay", "lag": 2, "leader": None, "applied": 5,
                            "snapshots": 1}
    log.entry(6, "release", ["c1", "b"])  # not b's claim: kept
    log.entry(7, "forget", ["b"])
    log.entry(7, "claim", ["c9", "x"])  # a repeat: ignored
    assert log.holders == {"c1": "a"}
    assert log.status()["state"] == "normal"
    log.reset()
    assert log.status()["state"] == "bootstrap"


def test_target_and_share_round_trip_in_a_record() -> None:
    from gateway.cluster import frames as F
    from protocols.context import Message

    m = Message("t/x", b"p", 1)
    body = F.encode_message(m, ("g", "t/#"), target="r@127.0.0.1")
    got = F.decode_body(body)
    assert got.target == "r@127.0.0.1" and got.share == ("g", "t/#")
    assert got.message.payload == b"p" and got.message.topic == "t/x"
    again = F.decode_body(F.encode_message(got.message, got.share, target=None))
    assert again.target is None and again.share == ("g", "t/#")
