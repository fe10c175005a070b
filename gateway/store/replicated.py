"""The small tables the cluster replicates, as rows of JSON values, and the cluster's own
bookkeeping of them (``cluster_tables`` in ``gateway.db``).

Each adapter reads a whole table as ``{key: value}`` (``value`` a JSON-able dict) and
writes one row (``None`` deletes it). It talks SQL to the same tables as the owners
(:mod:`gateway.store.banned`, :mod:`gateway.store.users`, :mod:`gateway.rules.store`)
through its own connection, so the owners notice a replicated write exactly as they notice
one by ``gatewayctl`` (``PRAGMA data_version``), and so does the cluster notice theirs
(it reads the tables every ``cluster.table_poll`` seconds and compares).

Invariants:
- ``fingerprint()`` changes whenever ``read()`` may have (None: unknown, read anyway).
- ``write(key, read()[key])`` changes nothing; after ``write(k, v)``, ``read()[k] == v``
  (values are canonical: bytes as hex, rules in their order).
- Rules never lose a row: a rule deleted anywhere is written as a tombstone
  (``{"spec": None}``), which the rule engine applies as a deletion.
- Every write commits at once (autocommit connection, one transaction per row).
- ``TableMeta`` rows say which version (hybrid logical clock stamp) of each row this node
  holds, and a digest of its value, so a restart neither re-announces an old value as new
  nor forgets a deletion (tombstones are rows with a NULL digest).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

from gateway.store import banned as _banned
from gateway.store import extensions as _ext
from gateway.store import users as _users
from gateway.store.db import ensure_schema, open_db

__all__ = ["AutoSubscribeRows", "BannedRows", "RuleRows", "RowTable", "TableMeta", "UserRows",
           "digest"]

Value = dict[str, Any]


def digest(value: Value | None) -> str | None:
    if value is None:
        return None
    text = json.dumps(value, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


class RowTable(Protocol):
    name: str

    def fingerprint(self) -> object: ...
    def read(self) -> dict[str, Value]: ...
    def write(self, key: str, value: Value | None) -> None: ...
    def check(self, key: str, value: Value | None) -> None: ...


class BannedRows:
    """``banned``: key ``kind/value``."""

    name = "banned"

    def __init__(self, conn: sqlite3.Connection) -> None:
        ensure_schema(conn, _banned.SCHEMA)
        self.conn = conn

    def fingerprint(self) -> object:
        """Moves on every change of the table (its triggers' counter)."""
        return self.conn.execute("SELECT version FROM banned_version WHERE id = 0").fetchone()

    def read(self) -> dict[str, Value]:
        rows = self.conn.execute(
            "SELECT kind, value, reason, created_by, created_at, expires_at FROM banned")
        return {f"{k}/{v}": {"reason": r, "by": by, "at": at, "until": until}
                for k, v, r, by, at, until in rows}

    def check(self, key: str, value: Value | None) -> None:
        kind, _, val = key.partition("/")
        if kind not in _banned.KINDS or not val:
            raise ValueError(f"bad ban key {key!r}")
        if value is not None:
            if not isinstance(value.get("reason"), str) or not isinstance(value.get("by"), str):
                raise ValueError("bad ban row")
            if not isinstance(value.get("at"), (int, float)):
                raise ValueError("bad ban row")
            if value.get("until") is not None and not isinstance(value["until"], (int, float)):
                raise ValueError("bad ban row")

    def write(self, key: str, value: Value | None) -> None:
        kind, _, val = key.partition("/")
        if value is None:
            self.conn.execute("DELETE FROM banned WHERE kind = ? AND value = ?", (kind, val))
            return
        self.conn.execute(
            "INSERT OR REPLACE INTO banned(kind, value, reason, created_by, created_at,"
            " expires_at) VALUES (?, ?, ?, ?, ?, ?)",
            (kind, val, value["reason"], value["by"], value["at"], value["until"]))


_USER_FIELDS = ("algorithm", "salt", "iterations", "stored_key", "server_key",
                "is_superuser", "created_at", "updated_at")
_BLOBS = ("salt", "stored_key", "server_key")


class UserRows:
    """``users`` and ``user_rules``: key the user name; value its credential (or None for a
    user with rules only) and its rules in order."""

    name = "users"

    def __init__(self, conn: sqlite3.Connection) -> None:
        ensure_schema(conn, _users.SCHEMA)
        self.conn = conn

    def fingerprint(self) -> object:
        """Moves on every change through UserStore (which sets ``updated_at``) and on
        every rule added or deleted (ids only grow), so the whole table is read only
        then."""
        return (self.conn.execute(
            "SELECT count(*), total(updated_at), max(updated_at) FROM users").fetchone(),
            self.conn.execute("SELECT count(*), total(id), max(id) FROM user_rules").fetchone())

    def read(self) -> dict[str, Value]:
        out: dict[str, Value] = {}
        for row in self.conn.execute(f"SELECT username, {', '.join(_USER_FIELDS)} FROM users"):
            cred = dict(zip(_USER_FIELDS, row[1:], strict=True))
            for b in _BLOBS:
                cred[b] = bytes(cred[b]).hex()
            out[row[0]] = {"cred": cred, "rules": []}
        for user, perm, action, topic in self.conn.execute(
                "SELECT username, permission, action, topic FROM user_rules ORDER BY id"):
            out.setdefault(user, {"cred": None, "rules": []})["rules"].append(
                [perm, action, topic])
        return out

    def check(self, key: str, value: Value | None) -> None:
        if not key or value is None:
            return
        cred, rules = value.get("cred"), value.get("rules")
        if not isinstance(rules, list) or not all(
                isinstance(r, list) and len(r) == 3 and all(isinstance(x, str) for x in r)
                and r[0] in ("allow", "deny") and r[1] in ("publish", "subscribe", "all")
                for r in rules):
            raise ValueError("bad user rules")
        if cred is not None:
            if not isinstance(cred, dict) or set(cred) != set(_USER_FIELDS):
                raise ValueError("bad user credential")
            for b in _BLOBS:
                bytes.fromhex(cred[b])

    def write(self, key: str, value: Value | None) -> None:
        conn = self.conn
        own = not conn.in_transaction  # else part of the caller's batch
        if own:
            conn.execute("BEGIN IMMEDIATE")
        try:
            conn.execute("DELETE FROM users WHERE username = ?", (key,))
            conn.execute("DELETE FROM user_rules WHERE username = ?", (key,))
            if value is not None:
                cred = value.get("cred")
                if cred is not None:
                    row = [bytes.fromhex(cred[f]) if f in _BLOBS else cred[f]
                           for f in _USER_FIELDS]
                    conn.execute(
                        f"INSERT INTO users(username, {', '.join(_USER_FIELDS)})"
                        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", (key, *row))
                conn.executemany(
                    "INSERT INTO user_rules(username, permission, action, topic)"
                    " VALUES (?, ?, ?, ?)", [(key, *r) for r in value["rules"]])
            if own:
                conn.execute("COMMIT")
        except BaseException:
            if own:
                conn.execute("ROLLBACK")
            raise


_SUB_OPTS = ("qos", "rh", "rap", "nl")
_SUB_MAX = {"qos": 2, "rh": 2, "rap": 1, "nl": 1}


class AutoSubscribeRows:
    """``auto_subscribe`` (the per-client topics of ``gatewayctl auto-subscribe``): key
    the JSON ``[clientid, topic]``, value the subscription options."""

    name = "auto_subscribe"

    def __init__(self, conn: sqlite3.Connection) -> None:
        conn.executescript(_ext.SCHEMA)
        self.conn = conn

    def fingerprint(self) -> object:
        return None  # no change counter: read every time (a small table)

    def read(self) -> dict[str, Value]:
        rows = self.conn.execute("SELECT clientid, topic, qos, rh, rap, nl FROM auto_subscribe")
        return {json.dumps([c, t]): dict(zip(_SUB_OPTS, opts, strict=True))
                for c, t, *opts in rows}

    @staticmethod
    def _key(key: str) -> tuple[str, str]:
        try:
            c, t = json.loads(key)
        except (ValueError, TypeError):
            raise ValueError(f"bad auto-subscribe key {key!r}") from None
        if not isinstance(c, str) or not isinstance(t, str) or not c or not t:
            raise ValueError(f"bad auto-subscribe key {key!r}")
        return c, t

    def check(self, key: str, value: Value | None) -> None:
        self._key(key)
        if value is not None and (set(value) != set(_SUB_OPTS) or not all(
                isinstance(value[o], int) and 0 <= value[o] <= _SUB_MAX[o] for o in _SUB_OPTS)):
            raise ValueError("bad auto-subscribe options")

    def write(self, key: str, value: Value | None) -> None:
        c, t = self._key(key)
        if value is None:
            self.conn.execute("DELETE FROM auto_subscribe WHERE clientid = ? AND topic = ?",
                              (c, t))
            return
        self.conn.execute(
            "INSERT INTO auto_subscribe(clientid, topic, qos, rh, rap, nl) VALUES (?,?,?,?,?,?)"
            " ON CONFLICT(clientid, topic) DO UPDATE SET qos=excluded.qos, rh=excluded.rh,"
            " rap=excluded.rap, nl=excluded.nl", (c, t, *(value[o] for o in _SUB_OPTS)))


_RULES_SCHEMA = "CREATE TABLE IF NOT EXISTS rules(id TEXT PRIMARY KEY, spec TEXT);"


class RuleRows:
    """The run-time rules of ``{data_dir}/rules.db``: key the rule id, value ``{"spec":
    spec}`` (``None``: a deleted rule's tombstone). The file is opened when it exists or a
    peer sends a rule."""

    name = "rules"

    def __init__(self, path: Path) -> None:
        self.path = path
        self.conn: sqlite3.Connection | None = None

    def fingerprint(self) -> object:
        """Other connections' commits to rules.db (ours are known already)."""
        conn = self._open(False)
        return None if conn is None else conn.execute("PRAGMA data_version").fetchone()

    def _open(self, create: bool) -> sqlite3.Connection | None:
        if self.conn is None and (create or self.path.exists()):
            self.conn = open_db(self.path)
            self.conn.executescript(_RULES_SCHEMA)
        return self.conn

    def read(self) -> dict[str, Value]:
        conn = self._open(False)
        if conn is None:
            return {}
        return {rid: {"spec": None if spec is None else json.loads(spec)}
                for rid, spec in conn.execute("SELECT id, spec FROM rules ORDER BY rowid")}

    def check(self, key: str, value: Value | None) -> None:
        if not key:
            raise ValueError("empty rule id")
        if value is not None and value.get("spec") is not None and not isinstance(
                value["spec"], dict):
            raise ValueError("bad rule spec")

    def write(self, key: str, value: Value | None) -> None:
        conn = self._open(True)
        assert conn is not None
        spec = None if value is None else value.get("spec")
        conn.execute(
            "INSERT INTO rules(id, spec) VALUES (?, ?) "
            "ON CONFLICT(id) DO UPDATE SET spec=excluded.spec",
            (key, None if spec is None else json.dumps(spec, separators=(",", ":"))))


META_SCHEMA = """
CREATE TABLE IF NOT EXISTS cluster_tables(
    tbl TEXT NOT NULL,
    key TEXT NOT NULL,
    wall INTEGER NOT NULL,
    logical INTEGER NOT NULL,
    origin TEXT NOT NULL,
    digest TEXT,
    PRIMARY KEY (tbl, key)
) WITHOUT ROWID;
"""

Stamp = tuple[int, int, str]


class TableMeta:
    """The stamp and value digest of every replicated row this node holds."""

    def __init__(self, conn: sqlite3.Connection | None) -> None:
        self.conn = conn
        if conn is not None:
            conn.executescript(META_SCHEMA)

    def load(self, tbl: str) -> dict[str, tuple[Stamp, str | None]]:
        if self.conn is None:
            return {}
        rows = self.conn.execute(
            "SELECT key, wall, logical, origin, digest FROM cluster_tables WHERE tbl = ?",
            (tbl,))
        return {k: ((w, lg, o), d) for k, w, lg, o, d in rows}

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """Many saves in one transaction (a first start stamping a large table)."""
        if self.conn is None or self.conn.in_transaction:
            yield
            return
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise
        self.conn.execute("COMMIT")

    def save(self, tbl: str, key: str, stamp: Stamp, value: Value | None) -> None:
        if self.conn is not None:
            self.conn.execute(
                "INSERT OR REPLACE INTO cluster_tables VALUES (?, ?, ?, ?, ?, ?)",
                (tbl, key, stamp[0], stamp[1], stamp[2], digest(value)))
