"""The built-in user database: credentials and per-user authorization rules in the node's
SQLite file (``{data_dir}/gateway.db``, tables ``users`` and ``user_rules``).

A user's password is never stored: only its SCRAM credential (salt, iteration count,
StoredKey, ServerKey; see :mod:`gateway.security.scram`), which serves both a plain
password check (recomputed and compared in constant time) and MQTT 5 SCRAM
authentication. ``gatewayctl users ...`` writes here while ``gatewayd`` reads.

Invariants:
- Reads are served from a small in-memory cache. The cache is dropped whenever another
  connection has committed a change (``PRAGMA data_version`` moved) and on every write
  through this object, so a user added by ``gatewayctl`` counts at the next
  authentication, without a restart. :meth:`UserStore.get` checks on every call; the
  per-publish authorization path (:meth:`UserStore.authorizer_for`) checks at most once
  per ``recheck_interval`` seconds.
- A user's rules keep their insertion order (``id``); the first that applies decides.
- Rules may name a user without local credentials (one who authenticates over HTTP);
  deleting a user deletes its rules.
- One thread per :class:`UserStore` (the event loop's in ``gatewayd``).
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway.core.authz import Authorizer, Rule
from gateway.security.scram import Credential, make_credential
from gateway.store.db import ensure_schema, open_db

__all__ = [
    "DEFAULT_ITERATIONS",
    "SCHEMA",
    "User",
    "UserError",
    "UserRule",
    "UserStore",
]

DEFAULT_ITERATIONS = 100_000
MIN_ITERATIONS = 4096  # RFC 7677
CACHE_LIMIT = 10_000  # entries; beyond it the cache starts over

SCHEMA = """
CREATE TABLE IF NOT EXISTS users(
    username TEXT PRIMARY KEY,
    algorithm TEXT NOT NULL,
    salt BLOB NOT NULL,
    iterations INTEGER NOT NULL,
    stored_key BLOB NOT NULL,
    server_key BLOB NOT NULL,
    is_superuser INTEGER NOT NULL DEFAULT 0,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS user_rules(
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    username TEXT NOT NULL,
    permission TEXT NOT NULL CHECK (permission IN ('allow', 'deny')),
    action TEXT NOT NULL CHECK (action IN ('publish', 'subscribe', 'all')),
    topic TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS user_rules_by_user ON user_rules(username, id);
"""


class UserError(Exception):
    """A refused change (unknown user, duplicate, invalid value): one line for humans."""


@dataclass(frozen=True, slots=True)
class User:
    username: str
    credential: Credential
    is_superuser: bool = False
    created_at: float = 0.0
    updated_at: float = 0.0


@dataclass(frozen=True, slots=True)
class UserRule:
    id: int
    username: str
    permission: str
    action: str
    topic: str

    def as_rule(self) -> Rule:
        return Rule(self.permission, self.action, (self.topic,))  # type: ignore[arg-type]


def _check_username(username: str) -> None:
    if not username:
        raise UserError("the user name is empty")
    if len(username.encode("utf-8", "surrogatepass")) > 65535:
        raise UserError("the user name is longer than MQTT allows (65535 bytes)")
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in username):
        raise UserError("the user name contains control characters")


class UserStore:
    """Users and their rules in one SQLite connection (module docstring)."""

    def __init__(
        self,
        conn: sqlite3.Connection,
        *,
        now: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        recheck_interval: float = 1.0,
    ) -> None:
        ensure_schema(conn, SCHEMA)
        self.conn = conn
        self._now = now
        self._monotonic = monotonic
        self.recheck_interval = recheck_interval
        self._version = self._data_version()
        self._checked_at = monotonic()
        self._users: dict[str, User | None] = {}
        self._authz: dict[str, Authorizer | None] = {}
        self._has_rules: bool | None = None

    @classmethod
    def open(cls, path: str | Path, **kwargs: object) -> UserStore:
        """Open (creating if needed) the store in the database file at ``path``."""
        return cls(open_db(path), **kwargs)  # type: ignore[arg-type]

    def close(self) -> None:
        self.conn.close()

    # -- cache -------------------------------------------------------------------

    def _data_version(self) -> int:
        row = self.conn.execute("PRAGMA data_version").fetchone()
        return int(row[0])

    def _invalidate(self) -> None:
        self._users.clear()
        self._authz.clear()
        self._has_rules = None

    def refresh(self) -> None:
        """Drop the cache if another connection changed the database."""
        self._checked_at = self._monotonic()
        version = self._data_version()
        if version != self._version:
            self._version = version
            self._invalidate()

    # -- reads (cached) ----------------------------------------------------------

    def get(self, username: str) -> User | None:
        """The user, or None; always sees changes committed before the call."""
        self.refresh()
        try:
            return self._users[username]
        except KeyError:
            pass
        row = self.conn.execute(
            "SELECT username, algorithm, salt, iterations, stored_key, server_key,"
            " is_superuser, created_at, updated_at FROM users WHERE username = ?",
            (username,),
        ).fetchone()
        user = _user(row) if row is not None else None
        if len(self._users) >= CACHE_LIMIT:
            self._users.clear()
        self._users[username] = user
        return user

    def authorizer_for(self, username: str) -> Authorizer | None:
        """The user's rules compiled (first match wins), or None when the user has none.
        May be up to ``recheck_interval`` seconds stale."""
        if self._monotonic() - self._checked_at >= self.recheck_interval:
            self.refresh()
        if self._has_rules is None:
            row = self.conn.execute("SELECT 1 FROM user_rules LIMIT 1").fetchone()
            self._has_rules = row is not None
        if not self._has_rules:
            return None
        try:
            return self._authz[username]
        except KeyError:
            pass
        rules = [r.as_rule() for r in self.rules(username)]
        authz = Authorizer(rules, "deny") if rules else None
        if len(self._authz) >= CACHE_LIMIT:
            self._authz.clear()
        self._authz[username] = authz
        return authz

    # -- reads (uncached, for gatewayctl) --------------------------------------------

    def users(self) -> list[User]:
        rows = self.conn.execute(
            "SELECT username, algorithm, salt, iterations, stored_key, server_key,"
            " is_superuser, created_at, updated_at FROM users ORDER BY username"
        ).fetchall()
        return [_user(r) for r in rows]

    def rules(self, username: str) -> list[UserRule]:
        rows = self.conn.execute(
            "SELECT id, username, permission, action, topic FROM user_rules"
            " WHERE username = ? ORDER BY id",
            (username,),
        ).fetchall()
        return [UserRule(*r) for r in rows]

    def rule_counts(self) -> dict[str, int]:
        rows = self.conn.execute(
            "SELECT username, count(*) FROM user_rules GROUP BY username"
        ).fetchall()
        return {u: int(n) for u, n in rows}

    # -- writes ------------------------------------------------------------------

    def add(
        self,
        username: str,
        password: str | bytes,
        *,
        superuser: bool = False,
        iterations: int = DEFAULT_ITERATIONS,
    ) -> User:
        """Add a user; :class:`UserError` if the name is taken or invalid."""
        _check_username(username)
        cred = _credential(password, iterations)
        now = self._now()
        try:
            self.conn.execute(
                "INSERT INTO users(username, algorithm, salt, iterations, stored_key,"
                " server_key, is_superuser, created_at, updated_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    username,
                    cred.hash_name,
                    cred.salt,
                    cred.iterations,
                    cred.stored_key,
                    cred.server_key,
                    int(superuser),
                    now,
                    now,
                ),
            )
        except sqlite3.IntegrityError:
            raise UserError(f"user {username!r} already exists") from None
        finally:
            self._invalidate()
        return User(username, cred, superuser, now, now)

    def set_password(
        self, username: str, password: str | bytes, *, iterations: int | None = None
    ) -> None:
        user = self._require(username)
        cred = _credential(password, iterations or user.credential.iterations)
        self.conn.execute(
            "UPDATE users SET algorithm = ?, salt = ?, iterations = ?, stored_key = ?,"
            " server_key = ?, updated_at = ? WHERE username = ?",
            (
                cred.hash_name,
                cred.salt,
                cred.iterations,
                cred.stored_key,
                cred.server_key,
                self._now(),
                username,
            ),
        )
        self._invalidate()

    def set_superuser(self, username: str, superuser: bool) -> None:
        self._require(username)
        self.conn.execute(
            "UPDATE users SET is_superuser = ?, updated_at = ? WHERE username = ?",
            (int(superuser), self._now(), username),
        )
        self._invalidate()

    def delete(self, username: str) -> bool:
        """Delete the user and its rules; False if there was no such user."""
        conn = self.conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            n = conn.execute("DELETE FROM users WHERE username = ?", (username,)).rowcount
            conn.execute("DELETE FROM user_rules WHERE username = ?", (username,))
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        finally:
            self._invalidate()
        return bool(n)

    def add_rule(self, username: str, permission: str, action: str, topic: str) -> UserRule:
        """Append a rule for ``username`` (validated like a rules-file rule)."""
        _check_username(username)
        try:
            Rule(permission, action, (topic,))  # type: ignore[arg-type]
        except (ValueError, TypeError) as exc:
            raise UserError(str(exc)) from None
        cur = self.conn.execute(
            "INSERT INTO user_rules(username, permission, action, topic) VALUES (?, ?, ?, ?)",
            (username, permission, action, topic),
        )
        self._invalidate()
        assert cur.lastrowid is not None
        return UserRule(cur.lastrowid, username, permission, action, topic)

    def delete_rule(self, username: str, rule_id: int) -> bool:
        n = self.conn.execute(
            "DELETE FROM user_rules WHERE username = ? AND id = ?", (username, rule_id)
        ).rowcount
        self._invalidate()
        return bool(n)

    def _require(self, username: str) -> User:
        user = self.get(username)
        if user is None:
            raise UserError(f"no user {username!r}")
        return user


def _credential(password: str | bytes, iterations: int) -> Credential:
    if iterations < MIN_ITERATIONS:
        raise UserError(f"iterations must be at least {MIN_ITERATIONS} (RFC 7677)")
    if not password:
        raise UserError("the password is empty")
    return make_credential(password, iterations=iterations)


def _user(row: tuple[Any, ...]) -> User:
    username, algorithm, salt, iterations, stored, server, superuser, created, updated = row
    cred = Credential(
        salt=bytes(salt),
        iterations=int(iterations),
        stored_key=bytes(stored),
        server_key=bytes(server),
        hash_name=str(algorithm),
    )
    return User(str(username), cred, bool(superuser), float(created), float(updated))
