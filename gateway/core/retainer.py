"""Retained messages: one per topic, found by topic filter through a trie of topic names.

The retainer is a ``message.publish`` hook subscriber: a retained publish with a payload
replaces the topic's message, an empty payload deletes it. ``match(filter)`` walks the
trie with the filter (never a scan of every topic) and skips expired messages.

Invariants:
- ``_messages`` and the trie hold exactly the same set of topics.
- Topics starting with ``$`` are not returned for filters whose first level is ``+``/``#``.
- ``on_change`` (the cluster's replicated table) hears of every message stored or deleted
  through the journal path, never of a restore (``store(..., journal=False)``); while
  ``paused``, :meth:`on_publish` keeps nothing (the cluster applies retained messages
  forwarded by peers through its table, in stamp order).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Protocol

from protocols.context import Message


class RetainedJournal(Protocol):
    def retained_saved(self, m: Message) -> None: ...
    def retained_deleted(self, topic: str) -> None: ...


class _Node:
    __slots__ = ("children", "topic")

    def __init__(self) -> None:
        self.children: dict[str, _Node] = {}
        self.topic: str | None = None


class Retainer:
    def __init__(
        self,
        *,
        max_messages: int = 0,
        max_payload_size: int = 0,
        now: Callable[[], float],
        on_refused: Callable[[str, Message], None] | None = None,
    ) -> None:
        self._messages: dict[str, Message] = {}
        self._root = _Node()
        self._max_messages = max_messages
        self._max_payload = max_payload_size
        self._now = now
        self._on_refused = on_refused
        self.journal: RetainedJournal | None = None
        self.on_change: Callable[[str, Message | None], None] | None = None
        self.paused = False

    def __len__(self) -> int:
        return len(self._messages)

    def get(self, topic: str) -> Message | None:
        return self._messages.get(topic)

    def on_publish(self, message: Message) -> None:
        """Hook entry: remember or forget the retained message of a topic."""
        if not message.retain or self.paused:
            return
        if not message.payload:
            self.delete(message.topic)
            return
        if self._max_payload and len(message.payload) > self._max_payload:
            if self._on_refused:
                self._on_refused("retained_too_large", message)
            return
        if (
            self._max_messages
            and message.topic not in self._messages
            and len(self._messages) >= self._max_messages
        ):
            if self._on_refused:
                self._on_refused("retained_full", message)
            return
        self.store(message)

    def store(self, message: Message, *, journal: bool = True) -> None:
        if journal and self.journal is not None:
            self.journal.retained_saved(message)
        topic = message.topic
        if topic not in self._messages:
            node = self._root
            for level in topic.split("/"):
                nxt = node.children.get(level)
                if nxt is None:
                    nxt = node.children[level] = _Node()
                node = nxt
            node.topic = topic
        self._messages[topic] = message
        if journal and self.on_change is not None:
            self.on_change(topic, message)

    def delete(self, topic: str) -> bool:
        if self._messages.pop(topic, None) is None:
            return False
        if self.journal is not None:
            self.journal.retained_deleted(topic)
        if self.on_change is not None:
            self.on_change(topic, None)
        path: list[tuple[_Node, str]] = []
        node: _Node = self._root
        for level in topic.split("/"):
            path.append((node, level))
            node = node.children[level]
        node.topic = None
        for parent, level in reversed(path):
            child = parent.children[level]
            if child.children or child.topic is not None:
                break
            del parent.children[level]
        return True

    def match(self, topic_filter: str) -> list[Message]:
        now = self._now()
        out: list[Message] = []
        for topic in self._walk(self._root, topic_filter.split("/"), 0):
            msg = self._messages[topic]
            if msg.expires_at is not None and msg.expires_at <= now:
                self.delete(topic)
                continue
            out.append(msg)
        return out

    def _walk(self, node: _Node, levels: list[str], i: int) -> Iterator[str]:
        if i == len(levels):
            if node.topic is not None:
                yield node.topic
            return
        level = levels[i]
        if level == "#":
            yield from self._all_below(node, skip_dollar=i == 0)
            return
        if level == "+":
            for name, child in list(node.children.items()):
                if i == 0 and name.startswith("$"):
                    continue
                yield from self._walk(child, levels, i + 1)
            return
        exact = node.children.get(level)
        if exact is not None:
            yield from self._walk(exact, levels, i + 1)

    def _all_below(self, node: _Node, *, skip_dollar: bool) -> Iterator[str]:
        # "a/#" also matches "a" itself (the parent level).
        if node.topic is not None and not skip_dollar:
            yield node.topic
        stack = [
            child
            for name, child in node.children.items()
            if not (skip_dollar and name.startswith("$"))
        ]
        while stack:
            n = stack.pop()
            if n.topic is not None:
                yield n.topic
            stack.extend(n.children.values())

    def topics(self) -> list[str]:
        return list(self._messages)
