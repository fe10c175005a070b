"""Shared empty containers for per-connection objects, and the empty effect list.

An idle connection should hold no container of its own: an empty dict costs 64 bytes,
an empty deque about 600. Each per-connection object (a session, a channel, a
``ClientInfo``, a topic-trie node) starts with one of these shared, empty instances and
makes its own container on the first write. Reading, ``pop``, ``clear`` and iteration
work as on any empty container; writing is a bug, so it is loud.

They subclass the builtins, so a slot typed ``dict`` or ``deque`` holds them honestly
(and mypyc's run-time type checks accept them). This module is never compiled: mypyc
cannot compile a subclass of ``dict``, ``deque`` or ``list`` (docs/performance.md).

Invariants:
- Every instance here stays empty: each method that would add an item raises.
"""

from __future__ import annotations

from collections import deque
from typing import Any


class EmptyDict(dict[Any, Any]):
    """Writers replace it with a dict of their own first (``Session.subscribed``,
    ``ClientInfo.set_attr`` and the like)."""

    def __setitem__(self, key: Any, value: Any) -> None:
        raise RuntimeError("write to a shared empty dict")

    def setdefault(self, key: Any, default: Any = None) -> Any:
        raise RuntimeError("write to a shared empty dict")

    def update(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError("write to a shared empty dict")


class EmptyDeque(deque[Any]):
    """A session's queue until it first queues (``Session.queue_restored`` and the
    like make a real deque)."""

    def append(self, x: Any) -> None:
        raise RuntimeError("append to the shared empty queue; use Session.queue_restored")

    def appendleft(self, x: Any) -> None:
        raise RuntimeError("append to the shared empty queue")

    def extend(self, xs: object) -> None:
        raise RuntimeError("extend of the shared empty queue")


class NotBusy(list[Any]):
    """A channel's effect list between entry points: no list is held by an idle
    connection, and an effect made outside an entry point is a bug."""

    def append(self, x: Any) -> None:
        raise RuntimeError("an effect outside an entry point")

    def extend(self, xs: object) -> None:
        raise RuntimeError("effects outside an entry point")


EMPTY_DICT: Any = EmptyDict()
EMPTY_DEQUE: Any = EmptyDeque()
NOT_BUSY: Any = NotBusy()
