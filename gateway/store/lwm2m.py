"""LwM2M registrations and their unanswered downlink commands in the node's ``gateway.db``
(tables ``lwm2m_registrations`` and ``lwm2m_downlink``): the journal of
:class:`protocols.lwm2m.registry.Registry`.

Writes go through the node's :class:`~gateway.store.writer.GroupCommitter`, the one the
transport shells' commit gate waits for: a command published at QoS 1/2 is acknowledged
to its publisher only once its row is on disk. Reads happen once, at start-up, before any
listener opens.

Invariants:
- A ``lwm2m_downlink`` row exists from the commit of its INSERT until its command is
  answered or its endpoint forgotten; ``seq`` orders an endpoint's commands.
- Rows whose endpoint has no registration row are garbage, removed at start-up.
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any

from gateway.bridge.store import Committer
from protocols.lwm2m.registry import Registration

SCHEMA = """
CREATE TABLE IF NOT EXISTS lwm2m_registrations(
    ep TEXT PRIMARY KEY,
    data TEXT NOT NULL,
    expires_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS lwm2m_downlink(
    seq INTEGER PRIMARY KEY,
    ep TEXT NOT NULL,
    payload BLOB NOT NULL,
    queued_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS lwm2m_downlink_by_ep ON lwm2m_downlink(ep, seq);
"""


class Lwm2mStore:
    """The registry's journal and its start-up loader (loop thread only)."""

    def __init__(self, conn: sqlite3.Connection, committer: Committer) -> None:
        self.conn = conn
        self.committer = committer
        conn.executescript(SCHEMA)

    def load(self) -> list[Registration]:
        c = self.conn
        c.execute("DELETE FROM lwm2m_downlink WHERE ep NOT IN (SELECT ep FROM lwm2m_registrations)")
        regs: dict[str, Registration] = {}
        for ep, data, expires_at in c.execute(
            "SELECT ep, data, expires_at FROM lwm2m_registrations"
        ):
            try:
                d = json.loads(data)
            except ValueError:
                d = {}
            regs[ep] = Registration(ep, d if isinstance(d, dict) else {}, float(expires_at))
        for seq, ep, payload in c.execute(
            "SELECT seq, ep, payload FROM lwm2m_downlink ORDER BY seq"
        ):
            r = regs.get(ep)
            if r is not None:
                r.commands[int(seq)] = bytes(payload)
        return list(regs.values())

    # -- the journal -----------------------------------------------------------------

    def registered(self, ep: str, data: dict[str, Any], expires_at: float) -> None:
        self.committer.add(
            "INSERT INTO lwm2m_registrations(ep, data, expires_at) VALUES (?,?,?) "
            "ON CONFLICT(ep) DO UPDATE SET data=excluded.data, expires_at=excluded.expires_at",
            (ep, json.dumps(data, separators=(",", ":")), expires_at),
        )

    def forgotten(self, ep: str) -> None:
        self.committer.add("DELETE FROM lwm2m_downlink WHERE ep=?", (ep,))
        self.committer.add("DELETE FROM lwm2m_registrations WHERE ep=?", (ep,))

    def queued(self, ep: str, seq: int, payload: bytes, at: float) -> None:
        self.committer.add(
            "INSERT INTO lwm2m_downlink(seq, ep, payload, queued_at) VALUES (?,?,?,?)",
            (seq, ep, payload, at),
        )

    def done(self, seq: int) -> None:
        self.committer.add("DELETE FROM lwm2m_downlink WHERE seq=?", (seq,))
