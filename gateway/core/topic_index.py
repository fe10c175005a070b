"""Topic filter index: a trie over topic levels, and single-filter matching rules.

Matching rules (MQTT 3.1.1 section 4.7, MQTT 5.0 section 4.7):

- Topic names and filters are split on ``/`` into levels; levels may be empty
  (``"a//b"`` has three levels, ``"/a"`` has two, the first empty).
- ``+`` matches exactly one level, including an empty one.
- ``#`` must be the last level of a filter and matches its parent level and any number
  of further levels: ``"a/#"`` matches ``"a"``, ``"a/"`` and ``"a/b/c"``; ``"#"`` matches
  every topic.
- A topic name whose first character is ``$`` is never matched by a filter whose first
  level is ``+`` or ``#`` (``"+/x"`` and ``"#"`` do not match ``"$SYS/x"``); a filter
  that starts with the literal level (``"$SYS/#"``) does.
- Wildcard characters inside a level (``"a+"``, ``"b#"``) make a filter invalid;
  :meth:`TopicIndex.add` rejects invalid filters with ``ValueError``.

Invariants of :class:`TopicIndex`:

- Every stored filter is valid (:func:`is_valid_filter`) and ends at exactly one trie
  node, whose ``filter`` slot holds the filter string; every other node has
  ``filter is None``.
- Every node except the root has a stored filter at or below it (``remove`` prunes
  nodes left empty), so the trie's size is bounded by the total length of the filters.
- ``match`` walks at most the trie paths the topic can reach (exact level, ``+``,
  ``#``): it never scans all filters. Its result lists each matching filter once.
- The match cache maps a topic name to the tuple of filters it matched; it is emptied
  whenever a filter is added or removed, so it never returns a stale answer, and holds
  at most ``cache_size`` entries (oldest inserted are evicted first).

``match`` does not validate the topic name (the codec already has); a name holding
wildcard characters is matched level by level as if they were plain characters.
Callers strip any ``$share/<group>/`` prefix before calling anything here.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from protocols.empties import EMPTY_DICT

__all__ = [
    "TopicIndex",
    "filter_covers",
    "is_valid_filter",
    "is_valid_topic_name",
    "topic_matches",
]

DEFAULT_CACHE_SIZE = 4096
_NO_CHILDREN: Any = EMPTY_DICT


def is_valid_topic_name(topic: str) -> bool:
    """True for a publishable topic name: non-empty, no wildcards, no U+0000."""
    return bool(topic) and "+" not in topic and "#" not in topic and "\x00" not in topic


def is_valid_filter(topic_filter: str) -> bool:
    """True for a valid topic filter (no ``$share/`` handling: strip it first).

    Non-empty, no U+0000, ``+`` and ``#`` only as whole levels, ``#`` only last.
    """
    if not topic_filter or "\x00" in topic_filter:
        return False
    if "+" not in topic_filter and "#" not in topic_filter:
        return True
    levels = topic_filter.split("/")
    last = len(levels) - 1
    for i, level in enumerate(levels):
        if level == "#":
            if i != last:
                return False
        elif level != "+" and ("+" in level or "#" in level):
            return False
    return True


def topic_matches(topic_filter: str, topic: str) -> bool:
    """True when ``topic_filter`` matches the topic name ``topic`` (one check).

    Use :class:`TopicIndex` to match one topic against many filters.
    """
    if topic_filter == topic:
        # Equal strings match unless a wildcard first level meets a "$" topic,
        # which cannot happen: a "$" topic's first level starts with "$".
        return True
    if topic[:1] == "$" and topic_filter[:1] in ("+", "#"):
        return False
    f_levels = topic_filter.split("/")
    t_levels = topic.split("/")
    n_topic = len(t_levels)
    for i, f in enumerate(f_levels):
        if f == "#":
            return True
        if i >= n_topic:
            return False
        if f != "+" and f != t_levels[i]:
            return False
    return len(f_levels) == n_topic


def filter_covers(outer: str, inner: str) -> bool:
    """True when every topic name matched by ``inner`` is also matched by ``outer``.

    Both must be valid filters. Examples: ``"a/#"`` covers ``"a/+/c"`` and ``"a"``;
    ``"a/+"`` does not cover ``"a/#"`` (which also matches ``"a"`` and ``"a/b/c"``);
    ``"#"`` does not cover ``"$SYS/#"`` (the ``$`` rule); ``"+/#"`` covers ``"#"``.
    """
    if outer == inner:
        return True
    o_levels = outer.split("/")
    i_levels = inner.split("/")
    n_inner = len(i_levels)
    for pos, o in enumerate(o_levels):
        if o == "#":
            # The rest of inner is covered, except a literal "$..." first level,
            # which "#" as the first level of outer does not match.
            return not (pos == 0 and n_inner > 0 and _dollar_literal(i_levels[0]))
        if pos >= n_inner:
            # inner ended here; it matches no topic longer than this, and outer
            # still needs a level unless what is left of it is just "#".
            return False
        i = i_levels[pos]
        if i == "#":
            # inner matches any number (>= 0) of further levels, or >= 1 at the
            # top (a topic has at least one level). Only a trailing "#" covers
            # that, or "+/#" when both sit at the very start.
            return pos == 0 and o == "+" and o_levels[1:] == ["#"]
        if o == "+":
            if pos == 0 and _dollar_literal(i):
                return False
            continue
        if i == "+" or o != i:
            return False
    return len(o_levels) == n_inner


def _dollar_literal(level: str) -> bool:
    return level[:1] == "$"


class _Node:
    """One trie node: children by level string, and the filter ending here, if any."""

    __slots__ = ("children", "filter")

    def __init__(self) -> None:
        # a leaf (most nodes: one per client-specific filter) shares one read-only empty
        # mapping; the first child makes a dict
        self.children: dict[str, _Node] = _NO_CHILDREN
        self.filter: str | None = None


class TopicIndex:
    """A set of topic filters indexed for matching topic names (see module docstring).

    >>> idx = TopicIndex()
    >>> idx.add("a/+"), idx.add("a/#"), idx.add("#")
    (True, True, True)
    >>> sorted(idx.match("a/b"))
    ['#', 'a/#', 'a/+']
    >>> idx.match("$SYS/x")
    []
    """

    __slots__ = ("_cache", "_cache_size", "_count", "_root")

    def __init__(self, cache_size: int = DEFAULT_CACHE_SIZE) -> None:
        """``cache_size`` bounds the match cache; 0 disables it."""
        if cache_size < 0:
            raise ValueError("cache_size must be >= 0")
        self._root = _Node()
        self._count = 0
        self._cache: dict[str, tuple[str, ...]] = {}
        self._cache_size = cache_size

    def __len__(self) -> int:
        return self._count

    def __contains__(self, topic_filter: object) -> bool:
        if not isinstance(topic_filter, str):
            return False
        node: _Node | None = self._root
        for level in topic_filter.split("/"):
            assert node is not None
            node = node.children.get(level)
            if node is None:
                return False
        assert node is not None
        return node.filter is not None

    def __iter__(self) -> Iterator[str]:
        """Every stored filter, in no particular order."""
        stack = [self._root]
        while stack:
            node = stack.pop()
            if node.filter is not None:
                yield node.filter
            stack.extend(node.children.values())

    def add(self, topic_filter: str) -> bool:
        """Store ``topic_filter``; True if it was not stored before.

        Raises ``ValueError`` for an invalid filter.
        """
        if not is_valid_filter(topic_filter):
            raise ValueError(f"invalid topic filter: {topic_filter!r}")
        node = self._root
        for level in topic_filter.split("/"):
            child = node.children.get(level)
            if child is None:
                if node.children is _NO_CHILDREN:
                    node.children = {}
                child = node.children[level] = _Node()
            node = child
        if node.filter is not None:
            return False
        node.filter = topic_filter
        self._count += 1
        if self._cache:
            self._cache.clear()
        return True

    def remove(self, topic_filter: str) -> bool:
        """Forget ``topic_filter``; True if it was stored. Prunes emptied nodes."""
        path: list[tuple[_Node, str]] = []
        node = self._root
        for level in topic_filter.split("/"):
            child = node.children.get(level)
            if child is None:
                return False
            path.append((node, level))
            node = child
        if node.filter is None:
            return False
        node.filter = None
        self._count -= 1
        # Prune from the leaf upwards while nodes hold neither filter nor children.
        for parent, level in reversed(path):
            child = parent.children[level]
            if child.filter is not None or child.children:
                break
            del parent.children[level]
        if self._cache:
            self._cache.clear()
        return True

    def clear(self) -> None:
        """Forget every filter (and the match cache)."""
        self._root = _Node()
        self._count = 0
        self._cache.clear()

    def match(self, topic: str) -> list[str]:
        """Every stored filter that matches the topic name ``topic`` (a new list)."""
        return list(self.lookup(topic))

    def lookup(self, topic: str) -> tuple[str, ...]:
        """Like :meth:`match` but returns the cached tuple itself (no copy).

        The hot-path variant: a repeated topic costs one dict lookup.
        """
        cache = self._cache
        hit = cache.get(topic)
        if hit is not None:
            return hit
        result = tuple(self._collect(topic))
        if self._cache_size:
            if len(cache) >= self._cache_size:
                del cache[next(iter(cache))]
            cache[topic] = result
        return result

    def has_first_level(self, level: str) -> bool:
        """Whether a stored filter starts with the literal level ``level``. For a level
        that starts with ``$`` (which no wildcard matches), False says that no topic
        under it can match: one dict probe, no topic string to build."""
        return level in self._root.children

    def has_match(self, topic: str) -> bool:
        """Whether any stored filter matches ``topic``, without adding it to the match
        cache: for one-off topics (``$SYS`` client events name the client) that would
        only evict the hot ones."""
        hit = self._cache.get(topic)
        if hit is not None:
            return bool(hit)
        return bool(self._collect(topic))

    def _collect(self, topic: str) -> list[str]:
        out: list[str] = []
        levels = topic.split("/")
        n = len(levels)
        root = self._root
        stack: list[tuple[_Node, int]] = []
        # The root level is special only for "$" topics: no "+" / "#" there.
        children = root.children
        if topic[:1] != "$":
            wild = children.get("#")
            if wild is not None and wild.filter is not None:
                out.append(wild.filter)
            wild = children.get("+")
            if wild is not None:
                stack.append((wild, 1))
        first = levels[0]
        if first != "+" and first != "#":
            child = children.get(first)
            if child is not None:
                stack.append((child, 1))
        # Iterative walk: topics may have more levels than Python's recursion limit.
        while stack:
            node, i = stack.pop()
            children = node.children
            if children:
                wild = children.get("#")
                if wild is not None and wild.filter is not None:
                    out.append(wild.filter)
                if i < n:
                    wild = children.get("+")
                    if wild is not None:
                        stack.append((wild, i + 1))
                    level = levels[i]
                    if level != "+" and level != "#":
                        child = children.get(level)
                        if child is not None:
                            stack.append((child, i + 1))
            if i == n and node.filter is not None:
                out.append(node.filter)
        return out
