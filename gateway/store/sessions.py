"""Durable sessions and retained messages in the node's SQLite file.

:class:`SessionStore` is the journal the core writes through (``Session``, ``Node`` and
``Retainer`` call it for persistent sessions only) and the loader that rebuilds the
core's state at start-up. Writes go through a :class:`GroupCommitter`, so the transport
shell can hold acknowledgements until they are durable.

What is persisted, and when:
- a session whose expiry interval is > 0: its row, its subscriptions, every QoS 1/2
  delivery queued or inflight for it (with its packet id once assigned, and whether its
  PUBREC arrived), and the packet ids of incoming QoS 2 messages awaiting PUBREL;
- every retained message;
- message bodies once (table ``messages``), referenced by the queue rows that need them.
QoS 0 deliveries and sessions with expiry 0 live in memory only.

Invariants:
- A queue row exists exactly while its delivery is in a persistent session's
  ``inflight`` or ``mqueue``; ``ref`` orders a session's rows as they were queued.
- ``messages`` rows unreferenced by any queue row are garbage, removed at start-up.
"""

from __future__ import annotations

import json
import logging
import sqlite3
from dataclasses import dataclass, field
from typing import Any

from gateway.store.writer import GroupCommitter
from protocols.context import Delivery, Message, SubOptions
from protocols.mqtt.packets import NO_PROPERTIES, Properties

log = logging.getLogger("gateway.store")

SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions(
    client_id TEXT PRIMARY KEY,
    expiry_interval INTEGER NOT NULL,
    disconnected_at REAL,
    created_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS subscriptions(
    client_id TEXT NOT NULL,
    filter TEXT NOT NULL,
    qos INTEGER NOT NULL,
    no_local INTEGER NOT NULL,
    rap INTEGER NOT NULL,
    rh INTEGER NOT NULL,
    sid INTEGER,
    PRIMARY KEY (client_id, filter)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS messages(
    id INTEGER PRIMARY KEY,
    topic TEXT NOT NULL,
    payload BLOB NOT NULL,
    qos INTEGER NOT NULL,
    retain INTEGER NOT NULL,
    props TEXT,
    publisher TEXT,
    username TEXT,
    ts REAL,
    expires_at REAL
);
CREATE TABLE IF NOT EXISTS queue(
    ref INTEGER PRIMARY KEY,
    client_id TEXT NOT NULL,
    msg_id INTEGER NOT NULL,
    qos INTEGER NOT NULL,
    retain INTEGER NOT NULL,
    sub_ids TEXT,
    packet_id INTEGER,
    released INTEGER NOT NULL DEFAULT 0,
    share TEXT
);
CREATE INDEX IF NOT EXISTS queue_by_client ON queue(client_id, ref);
CREATE TABLE IF NOT EXISTS awaiting_rel(
    client_id TEXT NOT NULL,
    packet_id INTEGER NOT NULL,
    PRIMARY KEY (client_id, packet_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS retained(
    topic TEXT PRIMARY KEY,
    payload BLOB NOT NULL,
    qos INTEGER NOT NULL,
    props TEXT,
    publisher TEXT,
    username TEXT,
    ts REAL,
    expires_at REAL
);
"""

_PROP_FIELDS = (
    "payload_format_indicator",
    "message_expiry_interval",
    "content_type",
    "response_topic",
    "correlation_data",
    "user_properties",
)


def dump_props(p: Properties) -> str | None:
    if p is NO_PROPERTIES:
        return None
    d: dict[str, Any] = {}
    for name in _PROP_FIELDS:
        v = getattr(p, name)
        if v is None or v == ():
            continue
        if name == "correlation_data":
            v = v.hex()
        d[name] = v
    return json.dumps(d, separators=(",", ":")) if d else None


def load_props(s: str | None) -> Properties:
    if not s:
        return NO_PROPERTIES
    d = json.loads(s)
    if "correlation_data" in d:
        d["correlation_data"] = bytes.fromhex(d["correlation_data"])
    if "user_properties" in d:
        d["user_properties"] = tuple((k, v) for k, v in d["user_properties"])
    return Properties(**d)


@dataclass
class StoredSession:
    client_id: str
    expiry_interval: int
    disconnected_at: float | None
    created_at: float
    subscriptions: dict[str, SubOptions] = field(default_factory=dict)
    deliveries: list[Delivery] = field(default_factory=list)  # in queue order
    released: set[int] = field(default_factory=set)
    awaiting_rel: set[int] = field(default_factory=set)


class SessionStore:
    def __init__(self, conn: sqlite3.Connection, committer: GroupCommitter) -> None:
        self.conn = conn  # used on the loop thread for start-up reads only
        self.committer = committer
        self._next_msg = 1
        self._next_ref = 1

    # -- start-up ------------------------------------------------------------------

    def load(self) -> tuple[list[StoredSession], list[Message]]:
        """Everything persisted, as the core needs it; also collects garbage."""
        c = self.conn
        c.execute("DELETE FROM messages WHERE id NOT IN (SELECT msg_id FROM queue)")
        self._next_msg = (c.execute("SELECT MAX(id) FROM messages").fetchone()[0] or 0) + 1
        self._next_ref = (c.execute("SELECT MAX(ref) FROM queue").fetchone()[0] or 0) + 1
        sessions: dict[str, StoredSession] = {}
        for cid, expiry, disc, created in c.execute(
            "SELECT client_id, expiry_interval, disconnected_at, created_at FROM sessions"
        ):
            sessions[cid] = StoredSession(cid, expiry, disc, created)
        for cid, f, qos, nl, rap, rh, sid in c.execute(
            "SELECT client_id, filter, qos, no_local, rap, rh, sid FROM subscriptions"
        ):
            s = sessions.get(cid)
            if s is not None:
                s.subscriptions[f] = SubOptions(qos, bool(nl), bool(rap), rh, sid)
        messages: dict[int, Message] = {}
        for row in c.execute(
            "SELECT id, topic, payload, qos, retain, props, publisher, username, ts, "
            "expires_at FROM messages"
        ):
            m = Message(
                row[1], row[2], row[3], bool(row[4]), load_props(row[5]), row[6] or "",
                row[7], row[8] or 0.0, row[9],
            )
            m.store_id = row[0]
            messages[row[0]] = m
        for ref, cid, msg_id, qos, retain, sub_ids, pid, released, share in c.execute(
            "SELECT ref, client_id, msg_id, qos, retain, sub_ids, packet_id, released, share "
            "FROM queue ORDER BY ref"
        ):
            s = sessions.get(cid)
            body = messages.get(msg_id)
            if s is None or body is None:
                continue
            ids = tuple(int(x) for x in sub_ids.split(",")) if sub_ids else ()
            share_t = tuple(json.loads(share)) if share else None
            d = Delivery(body, qos, bool(retain), ids, pid, pid is not None, share_t)
            d.ref = ref
            s.deliveries.append(d)
            if released and pid is not None:
                s.released.add(pid)
        for cid, pid in c.execute("SELECT client_id, packet_id FROM awaiting_rel"):
            s = sessions.get(cid)
            if s is not None:
                s.awaiting_rel.add(pid)
        retained = []
        for topic, payload, qos, props, pub, user, ts, exp in c.execute(
            "SELECT topic, payload, qos, props, publisher, username, ts, expires_at FROM retained"
        ):
            retained.append(
                Message(topic, payload, qos, True, load_props(props), pub or "", user, ts, exp)
            )
        return list(sessions.values()), retained

    # -- the journal (called on the loop thread) ---------------------------------------

    def session_saved(
        self, client_id: str, expiry: int, created_at: float, disconnected_at: float | None
    ) -> None:
        self.committer.add(
            "INSERT INTO sessions(client_id, expiry_interval, disconnected_at, created_at) "
            "VALUES (?,?,?,?) ON CONFLICT(client_id) DO UPDATE SET "
            "expiry_interval=excluded.expiry_interval, disconnected_at=excluded.disconnected_at",
            (client_id, expiry, disconnected_at, created_at),
        )

    def session_deleted(self, client_id: str) -> None:
        add = self.committer.add
        add("DELETE FROM sessions WHERE client_id=?", (client_id,))
        add("DELETE FROM subscriptions WHERE client_id=?", (client_id,))
        add("DELETE FROM queue WHERE client_id=?", (client_id,))
        add("DELETE FROM awaiting_rel WHERE client_id=?", (client_id,))

    def subscribed(self, client_id: str, topic_filter: str, o: SubOptions) -> None:
        self.committer.add(
            "INSERT OR REPLACE INTO subscriptions VALUES (?,?,?,?,?,?,?)",
            (
                client_id,
                topic_filter,
                o.qos,
                int(o.no_local),
                int(o.retain_as_published),
                o.retain_handling,
                o.subscription_id,
            ),
        )

    def unsubscribed(self, client_id: str, topic_filter: str) -> None:
        self.committer.add(
            "DELETE FROM subscriptions WHERE client_id=? AND filter=?", (client_id, topic_filter)
        )

    def queued(self, client_id: str, d: Delivery) -> None:
        m = d.message
        add = self.committer.add
        if m.store_id is None:
            m.store_id = self._next_msg
            self._next_msg += 1
            add(
                "INSERT INTO messages VALUES (?,?,?,?,?,?,?,?,?,?)",
                (
                    m.store_id,
                    m.topic,
                    m.payload,
                    m.qos,
                    int(m.retain),
                    dump_props(m.properties),
                    m.publisher,
                    m.username,
                    m.timestamp,
                    m.expires_at,
                ),
            )
        d.ref = ref = self._next_ref
        self._next_ref += 1
        add(
            "INSERT INTO queue(ref, client_id, msg_id, qos, retain, sub_ids, packet_id, share) "
            "VALUES (?,?,?,?,?,?,?,?)",
            (
                ref,
                client_id,
                m.store_id,
                d.qos,
                int(d.retain),
                ",".join(map(str, d.subscription_ids)) or None,
                d.packet_id,
                json.dumps(d.share) if d.share else None,
            ),
        )

    def assigned(self, d: Delivery) -> None:
        self.committer.add("UPDATE queue SET packet_id=? WHERE ref=?", (d.packet_id, d.ref))

    def released(self, d: Delivery) -> None:
        self.committer.add("UPDATE queue SET released=1 WHERE ref=?", (d.ref,))

    def removed(self, d: Delivery) -> None:
        if d.ref is not None:
            self.committer.add("DELETE FROM queue WHERE ref=?", (d.ref,))
            d.ref = None

    def awaiting_rel_added(self, client_id: str, packet_id: int) -> None:
        self.committer.add(
            "INSERT OR IGNORE INTO awaiting_rel VALUES (?,?)", (client_id, packet_id)
        )

    def awaiting_rel_removed(self, client_id: str, packet_id: int) -> None:
        self.committer.add(
            "DELETE FROM awaiting_rel WHERE client_id=? AND packet_id=?", (client_id, packet_id)
        )

    def retained_saved(self, m: Message) -> None:
        self.committer.add(
            "INSERT OR REPLACE INTO retained VALUES (?,?,?,?,?,?,?,?)",
            (
                m.topic,
                m.payload,
                m.qos,
                dump_props(m.properties),
                m.publisher,
                m.username,
                m.timestamp,
                m.expires_at,
            ),
        )

    def retained_deleted(self, topic: str) -> None:
        self.committer.add("DELETE FROM retained WHERE topic=?", (topic,))
