"""The route table: each node's routes as it announced them, matched through an index."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gateway.cluster.routes import RouteTable
from gateway.core.topic_index import topic_matches


def test_match_unions_nodes_of_every_matching_filter() -> None:
    t = RouteTable()
    t.add("b", "a/+")
    t.add("c", "a/#")
    t.add("c", "x/y")
    assert t.match("a/1") == {"b", "c"}
    assert t.match("x/y") == {"c"}
    assert t.match("q") == set()
    assert t.drop_node("c") == 2
    assert t.match("a/1") == {"b"}
    assert t.match("x/y") == set()


def test_snapshot_replaces_and_shared_keys_are_apart() -> None:
    t = RouteTable()
    t.replace("b", ["a", "$share/g/s/#", "$queue/q"])
    assert t.match("a") == {"b"}
    assert t.match("s/1") == set()  # shared groups are not plain routes
    assert t.match_groups("s/1") == [("g", "s/#", {"b"})]
    assert t.match_groups("q") == [("$queue", "q", {"b"})]
    t.replace("b", ["z"])
    assert t.match("a") == set() and t.match_groups("s/1") == [] and t.match("z") == {"b"}
    assert len(t) == 1


ops = st.lists(st.tuples(st.sampled_from("bcd"), st.sampled_from(["a", "a/+", "#", "a/b", "+/b"]),
                         st.booleans()), max_size=40)


@given(ops)
def test_table_agrees_with_a_plain_model(operations) -> None:
    t = RouteTable()
    model: dict[str, set[str]] = {}
    for node, key, add in operations:
        if add:
            t.add(node, key)
            model.setdefault(node, set()).add(key)
        else:
            t.remove(node, key)
            model.get(node, set()).discard(key)
    for topic in ["a", "a/b", "x/b", "q"]:
        want = {n for n, keys in model.items() if any(topic_matches(k, topic) for k in keys)}
        assert t.match(topic) == want
    assert len(t) == sum(len(k) for k in model.values())
