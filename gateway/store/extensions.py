"""Durable state of the MQTT extensions, in the node's ``gateway.db``.

- ``delayed_messages``: one row per delayed message (``$delayed/N/topic``) not yet
  published. Written through the node's :class:`~gateway.store.writer.GroupCommitter`,
  the one that holds a publisher's PUBACK until the writes before it are committed: a
  QoS 1/2 delayed message is acknowledged only once its row is on disk, so a ``kill -9``
  loses none that was acknowledged. Deleted (same committer, so after its INSERT) when it
  is published or cancelled; a crash in between publishes it again after the restart
  (at least once, like any QoS 1 delivery).
- ``auto_subscribe``: the per-client auto-subscribe topics managed by the API and
  ``gatewayctl auto-subscribe``; written directly on the caller's own connection (rare
  administrative writes, committed before the API answers).

Invariants:
- ``delayed_messages.id`` grows in the order messages were delayed; equal due times fire
  in id order.
- A row of ``auto_subscribe`` is unique per (clientid, topic).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from gateway.store.sessions import dump_props, load_props
from protocols.context import Message

__all__ = [
    "SCHEMA",
    "AutoSubscribeEntry",
    "AutoSubscribeStore",
    "DelayedRow",
    "DelayedStore",
]

SCHEMA = """
CREATE TABLE IF NOT EXISTS delayed_messages(
    id INTEGER PRIMARY KEY,
    due REAL NOT NULL,
    topic TEXT NOT NULL,
    payload BLOB NOT NULL,
    qos INTEGER NOT NULL,
    retain INTEGER NOT NULL,
    props TEXT,
    publisher TEXT NOT NULL,
    username TEXT,
    published_at REAL NOT NULL,
    expires_at REAL
);
CREATE TABLE IF NOT EXISTS auto_subscribe(
    clientid TEXT NOT NULL,
    topic TEXT NOT NULL,
    qos INTEGER NOT NULL DEFAULT 0,
    rh INTEGER NOT NULL DEFAULT 0,
    rap INTEGER NOT NULL DEFAULT 0,
    nl INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (clientid, topic)
);
"""


class Committer(Protocol):
    """What this store needs of :class:`~gateway.store.writer.GroupCommitter`."""

    @property
    def dirty(self) -> bool: ...
    def add(self, sql: str, params: Sequence[Any] = ()) -> None: ...
    def after_commit(self, callback: Callable[[], None]) -> None: ...


class _Delayed(Protocol):
    @property
    def id(self) -> int: ...
    @property
    def due(self) -> float: ...
    @property
    def message(self) -> Message: ...


@dataclass(slots=True)
class DelayedRow:
    id: int
    due: float
    message: Message


class DelayedStore:
    """Journal and loader of delayed messages (loop thread only)."""

    def __init__(self, conn: sqlite3.Connection, committer: Committer) -> None:
        self.conn = conn
        self.committer = committer
        conn.executescript(SCHEMA)

    def max_id(self) -> int:
        row = self.conn.execute("SELECT MAX(id) FROM delayed_messages").fetchone()
        return int(row[0] or 0)

    def load(self) -> list[DelayedRow]:
        out: list[DelayedRow] = []
        for (id_, due, topic, payload, qos, retain, props, publisher, username, ts,
             expires) in self.conn.execute(
            "SELECT id, due, topic, payload, qos, retain, props, publisher, username, "
            "published_at, expires_at FROM delayed_messages ORDER BY due, id"
        ):
            m = Message(topic, bytes(payload), qos, bool(retain), load_props(props),
                        publisher, username, ts, expires)
            out.append(DelayedRow(id_, due, m))
        return out

    def added(self, row: _Delayed) -> None:
        m = row.message
        self.committer.add(
            "INSERT INTO delayed_messages(id, due, topic, payload, qos, retain, props, "
            "publisher, username, published_at, expires_at) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
            (row.id, row.due, m.topic, m.payload, m.qos, int(m.retain),
             dump_props(m.properties), m.publisher, m.username, m.timestamp, m.expires_at),
        )

    def removed(self, id_: int) -> None:
        self.committer.add("DELETE FROM delayed_messages WHERE id = ?", (id_,))


@dataclass(frozen=True, slots=True)
class AutoSubscribeEntry:
    clientid: str
    topic: str
    qos: int = 0
    rh: int = 0
    rap: int = 0
    nl: int = 0

    def view(self) -> dict[str, Any]:
        return {"clientid": self.clientid, "topic": self.topic, "qos": self.qos,
                "rh": self.rh, "rap": self.rap, "nl": self.nl}


class AutoSubscribeStore:
    """Per-client auto-subscribe topics (its own connection; writes commit at once)."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        conn.executescript(SCHEMA)

    @classmethod
    def open(cls, path: Any) -> AutoSubscribeStore:
        from gateway.store.db import open_db

        return cls(open_db(path))

    def close(self) -> None:
        self.conn.close()

    def for_client(self, clientid: str) -> list[AutoSubscribeEntry]:
        return [AutoSubscribeEntry(clientid, *r) for r in self.conn.execute(
            "SELECT topic, qos, rh, rap, nl FROM auto_subscribe WHERE clientid = ? "
            "ORDER BY topic", (clientid,))]

    def all(self) -> list[AutoSubscribeEntry]:
        return [AutoSubscribeEntry(*r) for r in self.conn.execute(
            "SELECT clientid, topic, qos, rh, rap, nl FROM auto_subscribe "
            "ORDER BY clientid, topic")]

    def put(self, e: AutoSubscribeEntry) -> None:
        self.conn.execute(
            "INSERT INTO auto_subscribe(clientid, topic, qos, rh, rap, nl) VALUES (?,?,?,?,?,?) "
            "ON CONFLICT(clientid, topic) DO UPDATE SET qos=excluded.qos, rh=excluded.rh, "
            "rap=excluded.rap, nl=excluded.nl",
            (e.clientid, e.topic, e.qos, e.rh, e.rap, e.nl),
        )

    def delete(self, clientid: str, topic: str | None = None) -> int:
        if topic is None:
            cur = self.conn.execute("DELETE FROM auto_subscribe WHERE clientid = ?", (clientid,))
        else:
            cur = self.conn.execute(
                "DELETE FROM auto_subscribe WHERE clientid = ? AND topic = ?", (clientid, topic))
        return cur.rowcount
