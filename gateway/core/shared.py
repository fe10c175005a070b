"""Shared subscriptions: which member of a group gets a message.

A :class:`SharedGroup` holds the members (client ids, or any hashable key) of one
``$share/<group>/<filter>`` group on this node, in the order they joined.
:meth:`SharedGroup.candidates` yields them in the order a dispatcher should try them:
first the strategy's choice, then every other member, each exactly once. A dispatcher
that finds its first choice offline (or unable to take the message) falls through to
the next, so a message is lost only when no member can take it.

Strategies (the EMQX names, :data:`STRATEGIES`):

- ``random``: uniform choice with the caller's ``rng``. ``local`` is the same on a single
  node (the cluster layer prefers local members before it gets here).
- ``round_robin``: a per-group cursor advances once per call; over ``k * len(group)``
  calls with a fixed membership every member is chosen exactly ``k`` times.
  ``round_robin_per_group`` is the same within one node.
- ``sticky``: the first choice is random, then the same member every time until it is
  removed or :meth:`SharedGroup.unstick` (or :meth:`SharedGroup.stick`) is called.
- ``hash_clientid``: ``zlib.crc32`` of the publisher's client id (UTF-8) modulo the group
  size; ``hash_topic``: the same of the topic name. ``crc32``, not ``hash()``, so the choice
  is the same in every process and after a restart (for the same membership).

Invariants:

- ``_members`` is a tuple of distinct members in join order; ``_index`` maps each member to
  its position in it. Both are rebuilt on ``add``/``remove`` (rare), so ``candidates``
  (per message) allocates no copy of the membership, and a caller may ``remove`` members
  while iterating: the iteration keeps going over the membership it started with.
- The fall-through order after the first choice at position ``k`` is ``k+1, ..., n-1,
  0, ..., k-1`` (a rotation), for every strategy.
- ``candidates`` applies the strategy (and advances the round-robin cursor, picks the
  sticky member) when it is called, not when the iterator is first advanced.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Hashable, Iterator, Sequence
from typing import Generic

from typing_extensions import TypeVar

__all__ = ["STRATEGIES", "SharedGroup"]

STRATEGIES: frozenset[str] = frozenset(
    {
        "random",
        "round_robin",
        "round_robin_per_group",
        "sticky",
        "local",
        "hash_clientid",
        "hash_topic",
    }
)

M = TypeVar("M", bound=Hashable, default=str)


class SharedGroup(Generic[M]):
    """The members of one shared-subscription group (see module docstring)."""

    __slots__ = ("_cursor", "_index", "_members", "_sticky")

    def __init__(self) -> None:
        self._members: tuple[M, ...] = ()
        self._index: dict[M, int] = {}
        self._cursor = 0
        self._sticky: tuple[M] | None = None  # (member,) while stuck

    def __len__(self) -> int:
        return len(self._members)

    def __iter__(self) -> Iterator[M]:
        """Members in join order."""
        return iter(self._members)

    def __contains__(self, member: object) -> bool:
        return member in self._index

    def __repr__(self) -> str:
        return f"SharedGroup({list(self._members)!r})"

    def add(self, member: M) -> None:
        """Add ``member`` at the end; a member already present keeps its place."""
        if member in self._index:
            return
        self._index[member] = len(self._members)
        self._members = (*self._members, member)

    def remove(self, member: M) -> None:
        """Remove ``member`` if present (absent: nothing happens).

        Keeps the round-robin rotation fair (members after the cursor are not skipped)
        and unsticks a removed sticky member.
        """
        pos = self._index.pop(member, None)
        if pos is None:
            return
        members = self._members
        self._members = members[:pos] + members[pos + 1 :]
        for i in range(pos, len(self._members)):
            self._index[self._members[i]] = i
        if pos < self._cursor:
            self._cursor -= 1
        if self._sticky is not None and self._sticky[0] == member:
            self._sticky = None

    @property
    def sticky(self) -> M | None:
        """The member the ``sticky`` strategy currently chooses, if any."""
        return None if self._sticky is None else self._sticky[0]

    def stick(self, member: M) -> None:
        """Make ``member`` (which must be present) the ``sticky`` strategy's choice."""
        if member not in self._index:
            raise KeyError(member)
        self._sticky = (member,)

    def unstick(self) -> None:
        """Let the ``sticky`` strategy choose afresh on its next call."""
        self._sticky = None

    def candidates(
        self, strategy: str, *, topic: str, publisher: str, rng: random.Random
    ) -> Iterator[M]:
        """Members in the order to try: the strategy's choice, then all the others.

        ``topic`` and ``publisher`` (the publisher's client id) feed the hash strategies;
        ``rng`` feeds ``random``, ``local`` and the first ``sticky`` choice. Empty group:
        an empty iterator. Unknown strategy: ``ValueError``.
        """
        members = self._members
        n = len(members)
        if n == 0:
            if strategy not in STRATEGIES:
                raise ValueError(f"unknown shared subscription strategy: {strategy!r}")
            return iter(())
        k = self._first(strategy, n, topic, publisher, rng)
        if k == 0:
            return iter(members)
        return _rotation(members, k)

    def choose(self, strategy: str, *, topic: str, publisher: str, rng: random.Random) -> M | None:
        """Just the strategy's first choice (None for an empty group).

        Has the same side effects as :meth:`candidates` (cursor, sticky).
        """
        members = self._members
        if not members:
            if strategy not in STRATEGIES:
                raise ValueError(f"unknown shared subscription strategy: {strategy!r}")
            return None
        return members[self._first(strategy, len(members), topic, publisher, rng)]

    def _first(self, strategy: str, n: int, topic: str, publisher: str, rng: random.Random) -> int:
        if strategy == "round_robin" or strategy == "round_robin_per_group":
            k = self._cursor % n
            self._cursor = k + 1
            return k
        if strategy == "random" or strategy == "local":
            return rng.randrange(n) if n > 1 else 0
        if strategy == "sticky":
            if self._sticky is not None:
                return self._index[self._sticky[0]]
            k = rng.randrange(n) if n > 1 else 0
            self._sticky = (self._members[k],)
            return k
        if strategy == "hash_clientid":
            return zlib.crc32(publisher.encode("utf-8")) % n
        if strategy == "hash_topic":
            return zlib.crc32(topic.encode("utf-8")) % n
        raise ValueError(f"unknown shared subscription strategy: {strategy!r}")


def _rotation(members: Sequence[M], k: int) -> Iterator[M]:
    """``members[k:]`` then ``members[:k]``, without copying."""
    n = len(members)
    for i in range(k, n):
        yield members[i]
    for i in range(k):
        yield members[i]
