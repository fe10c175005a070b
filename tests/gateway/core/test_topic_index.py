"""Tests for gateway.core.topic_index: the trie, single matching, and filter coverage."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.core.topic_index import (
    TopicIndex,
    filter_covers,
    is_valid_filter,
    is_valid_topic_name,
    topic_matches,
)

# ---------------------------------------------------------------- topic_matches

MATCHES = [
    ("a/b/c", "a/b/c"),
    ("a/+/c", "a/b/c"),
    ("a/+/c", "a//c"),
    ("+", "a"),
    ("+", ""),
    ("+/+", "/a"),
    ("+/+", "a/"),
    ("/+", "/a"),
    ("a/#", "a"),
    ("a/#", "a/"),
    ("a/#", "a/b/c"),
    ("#", "a"),
    ("#", "/"),
    ("#", "a/b/c"),
    ("+/#", "a"),
    ("a/+/#", "a/b"),
    ("$SYS/#", "$SYS"),
    ("$SYS/#", "$SYS/broker/load"),
    ("$SYS/+", "$SYS/x"),
    ("a/$SYS/#", "a/$SYS/x"),
    ("+/$x", "a/$x"),
    ("//", "//"),
]

NON_MATCHES = [
    ("a/b", "a/b/c"),
    ("a/b/c", "a/b"),
    ("a/+", "a"),
    ("a/+", "a/b/c"),
    ("+", "a/b"),
    ("+", "/a"),
    ("a/+/#", "a"),
    ("b/#", "a"),
    ("#", "$SYS"),
    ("#", "$SYS/x"),
    ("+/x", "$SYS/x"),
    ("+/#", "$x"),
    ("+", "$"),
    ("a", "A"),
    ("a/", "a"),
]


@pytest.mark.parametrize(("topic_filter", "topic"), MATCHES)
def test_topic_matches(topic_filter: str, topic: str) -> None:
    assert topic_matches(topic_filter, topic)
    idx = TopicIndex()
    idx.add(topic_filter)
    assert idx.match(topic) == [topic_filter]


@pytest.mark.parametrize(("topic_filter", "topic"), NON_MATCHES)
def test_topic_does_not_match(topic_filter: str, topic: str) -> None:
    assert not topic_matches(topic_filter, topic)
    idx = TopicIndex()
    idx.add(topic_filter)
    assert idx.match(topic) == []


# ---------------------------------------------------------------- validation


@pytest.mark.parametrize(
    "topic_filter", ["a", "#", "+", "a/#", "+/+/#", "/", "//", "a//b", "$SYS/#", "$share"]
)
def test_valid_filters(topic_filter: str) -> None:
    assert is_valid_filter(topic_filter)


@pytest.mark.parametrize("topic_filter", ["", "a/#/b", "#/a", "a+", "a/b#", "+a/b", "##", "a\x00"])
def test_invalid_filters(topic_filter: str) -> None:
    assert not is_valid_filter(topic_filter)
    with pytest.raises(ValueError):
        TopicIndex().add(topic_filter)


def test_valid_topic_names() -> None:
    assert is_valid_topic_name("a/b")
    assert is_valid_topic_name("/")
    assert not is_valid_topic_name("")
    assert not is_valid_topic_name("a/+")
    assert not is_valid_topic_name("a/#")
    assert not is_valid_topic_name("a\x00")


# ---------------------------------------------------------------- TopicIndex API


def test_add_remove_contains_len() -> None:
    idx = TopicIndex()
    assert len(idx) == 0
    assert idx.add("a/b")
    assert not idx.add("a/b")
    assert idx.add("a/#")
    assert idx.add("a")
    assert len(idx) == 3
    assert "a/b" in idx
    assert "a" in idx
    assert "a/+" not in idx
    assert "a/b/c" not in idx
    assert 42 not in idx
    assert sorted(idx) == ["a", "a/#", "a/b"]
    assert idx.remove("a/b")
    assert not idx.remove("a/b")
    assert not idx.remove("x/y")
    assert not idx.remove("a/b/c")
    assert "a/b" not in idx
    assert "a" in idx
    assert len(idx) == 2
    idx.clear()
    assert len(idx) == 0
    assert idx.match("a") == []


def test_remove_prunes_empty_nodes() -> None:
    idx = TopicIndex()
    idx.add("a/b/c/d")
    idx.add("a/b")
    idx.remove("a/b/c/d")
    root = idx._root
    assert list(root.children) == ["a"]
    node_b = root.children["a"].children["b"]
    assert node_b.children == {}
    idx.remove("a/b")
    assert root.children == {}


def test_remove_of_prefix_keeps_longer_filter() -> None:
    idx = TopicIndex()
    idx.add("a/b")
    idx.add("a/b/c")
    idx.remove("a/b")
    assert idx.match("a/b/c") == ["a/b/c"]
    assert idx.match("a/b") == []


def test_match_returns_each_filter_once() -> None:
    idx = TopicIndex()
    for f in ["#", "+", "a", "a/#", "+/#", "+/+", "a/+", "a/b", "a/b/#", "+/b"]:
        idx.add(f)
    assert sorted(idx.match("a/b")) == sorted(
        ["#", "+/#", "+/+", "a/#", "a/+", "a/b", "a/b/#", "+/b"]
    )
    assert sorted(idx.match("a")) == sorted(["#", "+", "a", "a/#", "+/#"])
    assert sorted(idx.match("$SYS/b")) == []


def test_match_cache_is_invalidated_on_add_and_remove() -> None:
    idx = TopicIndex()
    idx.add("a/+")
    assert idx.match("a/b") == ["a/+"]
    assert "a/b" in idx._cache
    idx.add("a/#")
    assert "a/b" not in idx._cache
    assert sorted(idx.match("a/b")) == ["a/#", "a/+"]
    idx.remove("a/+")
    assert idx.match("a/b") == ["a/#"]
    idx.clear()
    assert idx.match("a/b") == []


def test_failed_add_or_remove_keeps_cache() -> None:
    idx = TopicIndex()
    idx.add("a/+")
    idx.match("a/b")
    assert not idx.add("a/+")
    assert not idx.remove("zz")
    assert "a/b" in idx._cache


def test_match_cache_is_bounded() -> None:
    idx = TopicIndex(cache_size=3)
    idx.add("#")
    for i in range(10):
        assert idx.match(f"t/{i}") == ["#"]
        assert len(idx._cache) <= 3
    assert list(idx._cache) == ["t/7", "t/8", "t/9"]


def test_cache_can_be_disabled() -> None:
    idx = TopicIndex(cache_size=0)
    idx.add("a")
    assert idx.match("a") == ["a"]
    assert idx._cache == {}
    with pytest.raises(ValueError):
        TopicIndex(cache_size=-1)


def test_match_returns_fresh_list_lookup_returns_cached_tuple() -> None:
    idx = TopicIndex()
    idx.add("a")
    first = idx.match("a")
    first.append("junk")
    assert idx.match("a") == ["a"]
    assert idx.lookup("a") is idx.lookup("a")


def test_deep_topic_does_not_recurse() -> None:
    idx = TopicIndex()
    deep = "/".join(["x"] * 5000)
    idx.add(deep)
    idx.add("x/#")
    idx.add("+/" * 4999 + "#")
    assert sorted(idx.match(deep)) == sorted([deep, "x/#", "+/" * 4999 + "#"])


def test_wildcard_characters_in_topic_are_not_double_counted() -> None:
    # Topic names with wildcards are invalid; the index must still not duplicate.
    idx = TopicIndex()
    idx.add("a/+")
    idx.add("a/#")
    assert sorted(idx.match("a/+")) == ["a/#", "a/+"]
    assert sorted(idx.match("a/#")) == ["a/#", "a/+"]


# ---------------------------------------------------------------- properties

LEVELS = ["a", "b", "", "$SYS"]
FILTER_LEVELS = [*LEVELS, "+"]


@st.composite
def filters(draw: st.DrawFn) -> str:
    levels = draw(st.lists(st.sampled_from(FILTER_LEVELS), min_size=0, max_size=4))
    if draw(st.booleans()) or levels in ([], [""]):
        levels.append("#")  # a lone empty level would be the invalid filter ""
    return "/".join(levels)


topics = st.lists(st.sampled_from(LEVELS), min_size=1, max_size=5).map("/".join).filter(bool)


@settings(max_examples=400, deadline=None)
@given(st.lists(filters(), max_size=30), st.lists(topics, min_size=1, max_size=10))
def test_index_agrees_with_naive_scan(fs: list[str], ts: list[str]) -> None:
    idx = TopicIndex(cache_size=4)
    for f in fs:
        idx.add(f)
    stored = set(fs)
    assert len(idx) == len(stored)
    for t in ts + ts:  # second pass goes through the cache
        got = idx.match(t)
        assert len(got) == len(set(got))
        assert set(got) == {f for f in stored if topic_matches(f, t)}


@settings(max_examples=200, deadline=None)
@given(st.lists(filters(), max_size=20), st.data())
def test_index_after_removals_agrees_with_naive_scan(fs: list[str], data: st.DataObject) -> None:
    idx = TopicIndex()
    for f in fs:
        idx.add(f)
    gone = data.draw(st.lists(st.sampled_from(fs))) if fs else []
    for f in gone:
        idx.remove(f)
    left = set(fs) - set(gone)
    assert len(idx) == len(left)
    assert set(idx) == left
    for t in data.draw(st.lists(topics, min_size=1, max_size=10)):
        assert set(idx.match(t)) == {f for f in left if topic_matches(f, t)}
        first = t.split("/")[0]
        # the $SYS-event shortcut: no filter starting with a "$" level, no match under it
        assert idx.has_first_level(first) == any(f.split("/")[0] == first for f in left)
        if first.startswith("$") and not idx.has_first_level(first):
            assert not idx.has_match(t)
    for f in list(left):
        idx.remove(f)
    assert idx._root.children == {}


# Every topic over the filter alphabet plus one fresh level, one level longer than
# the longest filter: enough to exhibit a counterexample whenever coverage fails.
UNIVERSE = [
    "/".join(p)
    for n in range(1, 6)
    for p in itertools.product(["a", "b", "", "$SYS", "z"], repeat=n)
]


@settings(max_examples=300, deadline=None)
@given(filters(), filters())
def test_filter_covers_agrees_with_enumeration(outer: str, inner: str) -> None:
    expected = all(topic_matches(outer, t) for t in UNIVERSE if topic_matches(inner, t))
    assert filter_covers(outer, inner) == expected


@pytest.mark.parametrize(
    ("outer", "inner", "covers"),
    [
        ("a/#", "a/+/c", True),
        ("a/#", "a", True),
        ("a/#", "a/#", True),
        ("a/+", "a/#", False),
        ("a/+", "a/b", True),
        ("a/b", "a/+", False),
        ("#", "a/b/#", True),
        ("#", "$SYS/#", False),
        ("+/#", "$SYS/a", False),
        ("$SYS/#", "$SYS/+", True),
        ("+/#", "#", True),
        ("+/+/#", "#", False),
        ("a/+/#", "a/#", False),
        ("a", "a/#", False),
        ("+", "+", True),
        ("+", "#", False),
        ("a/+/c", "a/+/c", True),
    ],
)
def test_filter_covers_examples(outer: str, inner: str, covers: bool) -> None:
    assert filter_covers(outer, inner) is covers


def test_has_match_leaves_the_cache_alone() -> None:
    idx = TopicIndex()
    idx.add("$SYS/brokers/+/clients/#")
    assert idx.has_match("$SYS/brokers/n/clients/c1/connected")
    assert not idx.has_match("$SYS/brokers/n/other")
    assert not idx._cache
    assert idx.lookup("$SYS/brokers/n/clients/c1/connected")  # now cached
    assert idx.has_match("$SYS/brokers/n/clients/c1/connected")


def test_leaves_share_an_empty_children_mapping() -> None:
    idx = TopicIndex()
    idx.add("dev/1/cmd")
    idx.add("dev/2/cmd")
    one = idx._root.children["dev"].children["1"].children["cmd"]
    two = idx._root.children["dev"].children["2"].children["cmd"]
    assert one.children is two.children and not one.children
    idx.add("dev/1/cmd/x")
    assert idx.match("dev/1/cmd/x") == ["dev/1/cmd/x"] and not two.children
    assert idx.remove("dev/1/cmd/x") and idx.match("dev/1/cmd") == ["dev/1/cmd"]
