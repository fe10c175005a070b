"""A durable, byte-bounded FIFO of opaque items: the queue every data-integration sink uses.

One SQLite table, ``durable_queue``, holds the items of every named queue (the webhook
``alerts`` is queue ``webhook:alerts``; later sinks for PostgreSQL, Redis, RabbitMQ or
InfluxDB take their own names). Writes go through a :class:`Committer` (the
:class:`~gateway.store.writer.GroupCommitter`: grouped per event-loop turn, committed on
its writer thread with ``synchronous=FULL``); reads happen once, at :meth:`DurableQueue.load`.
Every item also stays in memory until it is done, so a consumer never waits on the disk;
memory is bounded by the same ``max_bytes`` as the disk.

Life of an item: :meth:`put` (refused when it would take the queue past ``max_bytes``:
``on_overflow(size)`` is called and ``overflowed`` counted, never silent) -> :meth:`take`
(in flight; not handed out again) -> :meth:`done` (row deleted) or :meth:`retry` (back at
the head, ``attempts`` + 1). After a crash every row that was committed is loaded again,
in id order, whatever state its item was in: delivery is at least once.

Invariants:

- ``bytes``/``depth`` are the totals of ready + in-flight items, and ``bytes <= max_bytes``
  after every put (an item larger than ``max_bytes`` alone is refused).
- ids ascend in put order; :meth:`take` hands out the lowest ready id first (a retried
  item goes back to the head, so it is the next one taken).
- ``committed`` counts puts whose INSERT is durable (``after_commit`` fired): an item
  counted there survives ``kill -9``.
- Only the event loop's thread calls these methods.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from gateway.store.db import open_db
from gateway.store.writer import GroupCommitter

__all__ = ["QUEUE_DB_NAME", "SCHEMA", "Committer", "DurableQueue", "QueueDb", "QueueEntry"]

# the file in a node's data directory that holds the queues (and the rules made at run
# time); checked and salvaged at start like gateway.db (gateway.store.startup)
QUEUE_DB_NAME = "rules.db"

SCHEMA = """
CREATE TABLE IF NOT EXISTS durable_queue(
    id INTEGER PRIMARY KEY,
    queue TEXT NOT NULL,
    item BLOB NOT NULL,
    enqueued_at REAL NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS durable_queue_by_queue ON durable_queue(queue, id);
"""


class Committer(Protocol):
    """What the queue needs of :class:`~gateway.store.writer.GroupCommitter`."""

    def add(self, sql: str, params: Sequence[Any] = ()) -> None: ...
    def after_commit(self, callback: Callable[[], None]) -> None: ...


@dataclass(slots=True, eq=False)
class QueueEntry:
    id: int
    item: bytes
    enqueued_at: float
    attempts: int = 0

    @property
    def size(self) -> int:
        return len(self.item)


class QueueDb:
    """The database the queues live in: a reader connection (loop thread), the committer
    its writes go through, and the row ids every queue in it shares.

    :meth:`open` makes a private SQLite file with its own group-commit writer thread;
    a caller that already has the node's store may pass its connection and committer."""

    def __init__(self, conn: sqlite3.Connection, committer: Committer) -> None:
        conn.executescript(SCHEMA)
        self.conn = conn
        self.committer = committer
        row = conn.execute("SELECT MAX(id) FROM durable_queue").fetchone()
        self.next_id = (row[0] or 0) + 1
        self._owned: Any = None

    @classmethod
    def open(cls, path: str | Path, loop: asyncio.AbstractEventLoop) -> QueueDb:
        reader = open_db(path)
        reader.executescript(SCHEMA)
        committer = GroupCommitter(open_db(path, check_same_thread=False), loop)
        db = cls(reader, committer)
        db._owned = committer
        return db

    def take_id(self) -> int:
        n = self.next_id
        self.next_id += 1
        return n

    def queue(
        self,
        name: str,
        max_bytes: int,
        *,
        on_overflow: Callable[[int], None] | None = None,
        now: Callable[[], float] = time.time,
    ) -> DurableQueue:
        return DurableQueue(name, self, max_bytes, on_overflow=on_overflow, now=now)

    def close(self) -> None:
        """Commit what is pending and stop the writer (only one :meth:`open` made)."""
        if self._owned is not None:
            self._owned.close()
            self._owned = None
            self.conn.close()


class DurableQueue:
    """See the module docstring."""

    def __init__(
        self,
        name: str,
        db: QueueDb,
        max_bytes: int,
        *,
        on_overflow: Callable[[int], None] | None = None,
        now: Callable[[], float] = time.time,
    ) -> None:
        self.name = name
        self.max_bytes = max_bytes
        self._db = db
        self._conn = db.conn
        self._committer = db.committer
        self._on_overflow = on_overflow
        self._now = now
        self._ready: deque[QueueEntry] = deque()
        self._inflight: dict[int, QueueEntry] = {}
        self.bytes = 0
        self.overflowed = 0  # puts refused for lack of room
        self.committed = 0  # puts known durable
        self.delivered = 0  # items done
        self.retried = 0
        # called after every successful put (a consumer waiting for work wakes up)
        self.on_put: Callable[[], None] | None = None

    @property
    def depth(self) -> int:
        return len(self._ready) + len(self._inflight)

    @property
    def inflight(self) -> int:
        return len(self._inflight)

    def ready(self) -> int:
        return len(self._ready)

    def load(self) -> int:
        """Take over the committed items of this queue (start-up); their count."""
        rows = self._conn.execute(
            "SELECT id, item, enqueued_at, attempts FROM durable_queue WHERE queue=? ORDER BY id",
            (self.name,),
        ).fetchall()
        for rid, item, at, attempts in rows:
            e = QueueEntry(rid, bytes(item), at, attempts)
            self._ready.append(e)
            self.bytes += e.size
            self._db.next_id = max(self._db.next_id, rid + 1)
        return len(rows)

    def put(self, item: bytes) -> QueueEntry | None:
        """Queue ``item``; None (and ``on_overflow``) when there is no room for it."""
        size = len(item)
        if self.bytes + size > self.max_bytes:
            self.overflowed += 1
            if self._on_overflow is not None:
                self._on_overflow(size)
            return None
        e = QueueEntry(self._db.take_id(), item, self._now())
        self._ready.append(e)
        self.bytes += size
        self._committer.add(
            "INSERT INTO durable_queue(id, queue, item, enqueued_at, attempts) VALUES (?,?,?,?,0)",
            (e.id, self.name, item, e.enqueued_at),
        )
        self._committer.after_commit(self._put_committed)
        if self.on_put is not None:
            self.on_put()
        return e

    def _put_committed(self) -> None:
        self.committed += 1

    def take(self) -> QueueEntry | None:
        """The oldest ready item, now in flight; None when nothing is ready."""
        if not self._ready:
            return None
        e = self._ready.popleft()
        self._inflight[e.id] = e
        return e

    def done(self, e: QueueEntry) -> None:
        """``e`` was delivered (or given up): it leaves the queue and the disk."""
        if self._inflight.pop(e.id, None) is None:
            return
        self.bytes -= e.size
        self.delivered += 1
        self._committer.add("DELETE FROM durable_queue WHERE id=?", (e.id,))

    def retry(self, e: QueueEntry) -> None:
        """``e`` failed this time: back at the head of the queue."""
        if self._inflight.pop(e.id, None) is None:
            return
        e.attempts += 1
        self.retried += 1
        self._ready.appendleft(e)
        self._committer.add("UPDATE durable_queue SET attempts=? WHERE id=?", (e.attempts, e.id))

    def stats(self) -> dict[str, int]:
        return {
            "depth": self.depth,
            "bytes": self.bytes,
            "max_bytes": self.max_bytes,
            "inflight": self.inflight,
            "overflowed": self.overflowed,
            "committed": self.committed,
            "delivered": self.delivered,
            "retried": self.retried,
        }
