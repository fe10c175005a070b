"""The bridge outbox on disk: table ``bridge_outbox`` of the node's ``gateway.db``.

One row per message waiting to go upstream (every bridge shares the table; ``bridge``
names the owner). Writes go through the node's :class:`GroupCommitter`, the same one that
holds a publisher's PUBACK until the store's pending writes are committed: a QoS 1/2
message forwarded to a bridge is acknowledged to its publisher only once its outbox row
is on disk. Reads (start-up, and reading back the part of a long queue that is kept on
disk only) use the loop thread's reader connection and see committed rows only, so a
reader first waits for :meth:`OutboxStore.after_commit`.

Invariants:
- ``id`` is unique across bridges and grows in the order messages were queued, so
  ``ORDER BY id`` within one bridge is the order they must leave in.
- A row exists from the commit of its INSERT until the commit of its DELETE; operations
  commit in the order they were added (the GroupCommitter's guarantee), so a DELETE
  added after an INSERT never overtakes it.
- ``packet_id`` is set only for a QoS 2 message already sent upstream (so a restart
  re-sends it with the same packet id and the upstream broker does not deliver it
  twice); ``released`` once its PUBREC arrived (a restart then sends PUBREL).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

from gateway.store.sessions import dump_props, load_props
from protocols.mqtt.packets import Properties

SCHEMA = """
CREATE TABLE IF NOT EXISTS bridge_outbox(
    id INTEGER PRIMARY KEY,
    bridge TEXT NOT NULL,
    topic TEXT NOT NULL,
    payload BLOB NOT NULL,
    qos INTEGER NOT NULL,
    retain INTEGER NOT NULL,
    props TEXT,
    enqueued_at REAL NOT NULL,
    expires_at REAL,
    size INTEGER NOT NULL,
    packet_id INTEGER,
    released INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS bridge_outbox_by_bridge ON bridge_outbox(bridge, id);
"""

_INSERT = (
    "INSERT INTO bridge_outbox(id, bridge, topic, payload, qos, retain, props, enqueued_at, "
    "expires_at, size, packet_id, released) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)"
)

Row = tuple[
    int, str, bytes, int, bool, Properties, float, float | None, int, int | None, bool
]
"""(id, topic, payload, qos, retain, properties, enqueued_at, expires_at, size,
packet_id, released)"""


class Committer(Protocol):
    """What the store needs of :class:`~gateway.store.writer.GroupCommitter`."""

    @property
    def dirty(self) -> bool: ...
    def add(self, sql: str, params: Sequence[Any] = ()) -> None: ...
    def after_commit(self, callback: Callable[[], None]) -> None: ...


class OutboxStore:
    """SQLite journal and loader of every bridge's outbox (loop thread only)."""

    def __init__(self, conn: sqlite3.Connection, committer: Committer) -> None:
        self.conn = conn
        self.committer = committer
        conn.executescript(SCHEMA)
        self._next_id = (conn.execute("SELECT MAX(id) FROM bridge_outbox").fetchone()[0] or 0) + 1

    def next_id(self) -> int:
        n = self._next_id
        self._next_id = n + 1
        return n

    @property
    def dirty(self) -> bool:
        return self.committer.dirty

    def after_commit(self, callback: Callable[[], None]) -> None:
        self.committer.after_commit(callback)

    # -- journal ---------------------------------------------------------------------

    def insert(
        self,
        bridge: str,
        entry_id: int,
        topic: str,
        payload: bytes,
        qos: int,
        retain: bool,
        properties: Properties,
        enqueued_at: float,
        expires_at: float | None,
        size: int,
        packet_id: int | None = None,
        released: bool = False,
    ) -> None:
        self.committer.add(
            _INSERT,
            (
                entry_id,
                bridge,
                topic,
                payload,
                qos,
                int(retain),
                dump_props(properties),
                enqueued_at,
                expires_at,
                size,
                packet_id,
                int(released),
            ),
        )

    def delete(self, entry_id: int) -> None:
        self.committer.add("DELETE FROM bridge_outbox WHERE id=?", (entry_id,))

    def assign(self, entry_id: int, packet_id: int) -> None:
        self.committer.add("UPDATE bridge_outbox SET packet_id=? WHERE id=?", (packet_id, entry_id))

    def release(self, entry_id: int) -> None:
        self.committer.add("UPDATE bridge_outbox SET released=1 WHERE id=?", (entry_id,))

    # -- reads (committed rows only) ----------------------------------------------------

    def summary(self, bridge: str) -> tuple[int, int, int, float | None]:
        """``(messages, bytes, last id, oldest enqueued_at)`` of one bridge's rows."""
        row = self.conn.execute(
            "SELECT COUNT(*), COALESCE(SUM(size), 0), COALESCE(MAX(id), 0), MIN(enqueued_at) "
            "FROM bridge_outbox WHERE bridge=?",
            (bridge,),
        ).fetchone()
        return int(row[0]), int(row[1]), int(row[2]), row[3]

    def rows(self, bridge: str, from_id: int, limit: int) -> Iterator[Row]:
        """Rows of ``bridge`` with ``id >= from_id`` in id order, read lazily (stop
        iterating to read no further)."""
        cursor = self.conn.execute(
            "SELECT id, topic, payload, qos, retain, props, enqueued_at, expires_at, size, "
            "packet_id, released FROM bridge_outbox WHERE bridge=? AND id>=? ORDER BY id "
            "LIMIT ?",
            (bridge, from_id, limit),
        )
        try:
            for r in cursor:
                yield (
                    r[0], r[1], r[2], r[3], bool(r[4]), load_props(r[5]), r[6], r[7], r[8],
                    r[9], bool(r[10]),
                )
        finally:
            cursor.close()

    def bridges(self) -> dict[str, int]:
        """Every bridge name with rows, and its row count (orphans included)."""
        return {
            name: int(n)
            for name, n in self.conn.execute(
                "SELECT bridge, COUNT(*) FROM bridge_outbox GROUP BY bridge"
            )
        }
