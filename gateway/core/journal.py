"""What the core needs from durable storage, stated here so the core imports no storage.

:class:`gateway.store.sessions.SessionStore` is the implementation (SQLite, group commit);
the core only calls these methods, on the event loop, and never waits for a commit: the
transport shell holds a connection's acknowledgements until the writes before them are
committed. A node without durability has no journal at all (``Node.store is None``).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Protocol

from gateway.core.retainer import RetainedJournal
from gateway.core.session import Journal
from protocols.context import Delivery, SubOptions


class NodeJournal(Journal, RetainedJournal, Protocol):
    """A node's durable journal: persistent sessions (their life and subscriptions, on
    top of their queues: :class:`Journal`) and retained messages."""

    def session_saved(
        self, client_id: str, expiry: int, created_at: float, disconnected_at: float | None
    ) -> None: ...
    def session_deleted(self, client_id: str) -> None: ...
    def subscribed(self, client_id: str, topic_filter: str, o: SubOptions) -> None: ...
    def unsubscribed(self, client_id: str, topic_filter: str) -> None: ...


class StoredSession(Protocol):
    """One session as it was journaled, for ``Node.restore`` at start-up."""

    @property
    def client_id(self) -> str: ...
    @property
    def expiry_interval(self) -> int: ...
    @property
    def disconnected_at(self) -> float | None: ...
    @property
    def created_at(self) -> float: ...
    @property
    def subscriptions(self) -> Mapping[str, SubOptions]: ...
    @property
    def deliveries(self) -> Sequence[Delivery]: ...  # in queue order
    @property
    def released(self) -> Collection[int]: ...
    @property
    def awaiting_rel(self) -> Collection[int]: ...
