"""Banned clients in the node's SQLite file (``{data_dir}/gateway.db``, table ``banned``).

A ban names a client by one of four kinds (EMQX's banned table, with a CIDR kind):

- ``clientid``: the client identifier, exactly;
- ``username``: the user name, exactly;
- ``peerhost``: the peer's IP address (stored normalised: ``10.0.0.1``, ``::1``);
- ``cidr``: a network (stored normalised: ``10.0.0.0/8``).

It has a reason, who made it (``created_by``: ``"gatewayctl"``, ``"flapping"``, ...),
when, and when it ends (``expires_at``, wall-clock seconds; None: never). ``gatewayctl
ban ...`` writes here while ``gatewayd`` runs; ``gatewayd`` notices within a poll interval
(see :mod:`gateway.protect.banned`) through :meth:`BannedStore.changed`.

Invariants:
- One row per (kind, value): adding an existing ban replaces it (new reason, expiry).
- ``banned_version.version`` grows on every insert, update or delete of ``banned``
  (triggers), so a reader tells a change of the bans from the other writes to the same
  file (sessions, retained messages) with one cheap query, and only after
  ``PRAGMA data_version`` said that someone else committed something.
- Expired bans are never reported by :meth:`BannedStore.active`; they stay in the table
  until :meth:`BannedStore.purge_expired` deletes them.
- One thread per :class:`BannedStore`.
"""

from __future__ import annotations

import ipaddress
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, get_args

from gateway.store.db import ensure_schema, open_db

__all__ = ["KINDS", "SCHEMA", "Ban", "BanError", "BannedStore", "Kind", "normalise"]

Kind = Literal["clientid", "username", "peerhost", "cidr"]
KINDS: tuple[str, ...] = get_args(Kind)

SCHEMA = """
CREATE TABLE IF NOT EXISTS banned(
    kind TEXT NOT NULL CHECK (kind IN ('clientid', 'username', 'peerhost', 'cidr')),
    value TEXT NOT NULL,
    reason TEXT NOT NULL DEFAULT '',
    created_by TEXT NOT NULL DEFAULT '',
    created_at REAL NOT NULL,
    expires_at REAL,
    PRIMARY KEY (kind, value)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS banned_version(
    id INTEGER PRIMARY KEY CHECK (id = 0),
    version INTEGER NOT NULL
);
INSERT OR IGNORE INTO banned_version(id, version) VALUES (0, 0);
CREATE TRIGGER IF NOT EXISTS banned_inserted AFTER INSERT ON banned
    BEGIN UPDATE banned_version SET version = version + 1; END;
CREATE TRIGGER IF NOT EXISTS banned_updated AFTER UPDATE ON banned
    BEGIN UPDATE banned_version SET version = version + 1; END;
CREATE TRIGGER IF NOT EXISTS banned_deleted AFTER DELETE ON banned
    BEGIN UPDATE banned_version SET version = version + 1; END;
"""


class BanError(ValueError):
    """An invalid ban (unknown kind, bad address, empty value): one line for humans."""


@dataclass(frozen=True, slots=True)
class Ban:
    kind: Kind
    value: str
    reason: str = ""
    created_by: str = ""
    created_at: float = 0.0
    expires_at: float | None = None  # wall-clock seconds; None: never

    def expired(self, now: float) -> bool:
        return self.expires_at is not None and self.expires_at <= now


def normalise(kind: str, value: str) -> tuple[Kind, str]:
    """Check a kind and value; addresses and networks come back in canonical form."""
    if kind not in KINDS:
        raise BanError(f"unknown kind {kind!r} (expected one of {', '.join(KINDS)})")
    if not value:
        raise BanError(f"empty {kind}")
    if kind == "peerhost":
        try:
            value = str(ipaddress.ip_address(value.strip().split("%", 1)[0]))
        except ValueError:
            raise BanError(f"not an IP address: {value!r}") from None
    elif kind == "cidr":
        try:
            value = str(ipaddress.ip_network(value.strip(), strict=False))
        except ValueError:
            raise BanError(f'not an address or CIDR such as "10.0.0.0/8": {value!r}') from None
    return kind, value  # type: ignore[return-value]


_COLUMNS = "kind, value, reason, created_by, created_at, expires_at"


def _row(row: tuple[str, str, str, str, float, float | None]) -> Ban:
    kind, value, reason, created_by, created_at, expires_at = row
    return Ban(kind, value, reason, created_by, created_at, expires_at)  # type: ignore[arg-type]


class BannedStore:
    """The ``banned`` table through one SQLite connection (module docstring)."""

    def __init__(
        self, conn: sqlite3.Connection, *, now: Callable[[], float] = time.time
    ) -> None:
        ensure_schema(conn, SCHEMA)
        self.conn = conn
        self._now = now
        self._dirty = False  # written through this connection (data_version misses it)
        self._data_version = self._read_data_version()
        self._version = self.version()

    @classmethod
    def open(cls, path: str | Path, *, now: Callable[[], float] = time.time) -> BannedStore:
        """Open (creating if needed) the table in the database file at ``path``."""
        return cls(open_db(path), now=now)

    def close(self) -> None:
        self.conn.close()

    # -- changes -----------------------------------------------------------------

    def _read_data_version(self) -> int:
        return int(self.conn.execute("PRAGMA data_version").fetchone()[0])

    def version(self) -> int:
        """The change counter of the ``banned`` table."""
        row = self.conn.execute("SELECT version FROM banned_version WHERE id = 0").fetchone()
        return int(row[0]) if row else 0

    def changed(self) -> bool:
        """True once after the bans changed, by this or another connection. Cheap when
        nothing changed: one ``PRAGMA data_version``."""
        data_version = self._read_data_version()
        if data_version == self._data_version and not self._dirty:
            return False
        self._data_version = data_version
        self._dirty = False
        version = self.version()
        if version == self._version:
            return False
        self._version = version
        return True

    # -- reads -------------------------------------------------------------------

    def all(self) -> list[Ban]:
        """Every ban, expired ones included, in (kind, value) order."""
        rows = self.conn.execute(f"SELECT {_COLUMNS} FROM banned ORDER BY kind, value")
        return [_row(r) for r in rows]

    def active(self, now: float | None = None) -> list[Ban]:
        """The bans in force at ``now`` (default: the store's clock)."""
        t = self._now() if now is None else now
        rows = self.conn.execute(
            f"SELECT {_COLUMNS} FROM banned WHERE expires_at IS NULL OR expires_at > ? "
            "ORDER BY kind, value",
            (t,),
        )
        return [_row(r) for r in rows]

    def get(self, kind: str, value: str) -> Ban | None:
        kind, value = normalise(kind, value)
        row = self.conn.execute(
            f"SELECT {_COLUMNS} FROM banned WHERE kind = ? AND value = ?", (kind, value)
        ).fetchone()
        return None if row is None else _row(row)

    # -- writes ------------------------------------------------------------------

    def add(
        self,
        kind: str,
        value: str,
        *,
        reason: str = "",
        created_by: str = "",
        expires_at: float | None = None,
        duration: float | None = None,
    ) -> Ban:
        """Add (or replace) a ban; ``duration`` seconds from now sets ``expires_at``."""
        kind, value = normalise(kind, value)
        now = self._now()
        if duration is not None:
            if duration <= 0:
                raise BanError("the duration must be positive")
            expires_at = now + duration
        ban = Ban(kind, value, reason, created_by, now, expires_at)
        self.conn.execute(
            f"INSERT OR REPLACE INTO banned({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?)",
            (kind, value, reason, created_by, now, expires_at),
        )
        self._dirty = True
        return ban

    def delete(self, kind: str, value: str) -> bool:
        """Lift a ban; False when there was none."""
        kind, value = normalise(kind, value)
        cur = self.conn.execute("DELETE FROM banned WHERE kind = ? AND value = ?", (kind, value))
        self._dirty = True
        return cur.rowcount > 0

    def purge_expired(self, now: float | None = None) -> int:
        """Delete the bans that ended; how many."""
        t = self._now() if now is None else now
        cur = self.conn.execute(
            "DELETE FROM banned WHERE expires_at IS NOT NULL AND expires_at <= ?", (t,)
        )
        if cur.rowcount:
            self._dirty = True
        return cur.rowcount
