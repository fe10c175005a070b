"""Dashboard accounts, the one-time setup token, login sessions and the login rate limit.

No I/O but the accounts file; every clock is given (``now``), so expiry and lockouts are
tested with a virtual clock.

Invariants:

- There are no default credentials. While no administrator exists, :class:`SetupToken`
  can issue a token (random, 32 bytes, kept only as its SHA-256, valid ``ttl`` seconds);
  issuing a new one replaces the previous; a token is consumed by its first successful
  use and refused once an administrator exists.
- Passwords are stored as scrypt hashes (``scrypt$n$r$p$salt$hash``, hex), never in clear;
  :func:`check_password` compares in constant time. Passwords are at least
  :data:`MIN_PASSWORD` characters.
- The accounts file (``{data_dir}/dashboard.json``) is written whole to a temporary file
  with mode 0600, fsynced and renamed over the old one, and read again whenever its
  modification time changed (the workers of a node share it).
- A session ends ``idle`` seconds after its last use or ``max_age`` seconds after the
  login, whichever comes first; an expired session is forgotten when next seen. Each
  session has its own random CSRF token that every state-changing request must echo.
- :class:`LoginLimiter` counts failures per key (the peer address, the user name) in a
  sliding window; at ``attempts`` failures the key is refused until the oldest failure
  leaves the window. A success clears the key.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import secrets
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

Role = Literal["administrator", "viewer"]
ROLES: tuple[Role, ...] = ("administrator", "viewer")
MIN_PASSWORD = 8
USERNAME = re.compile(r"^[A-Za-z0-9_.@-]{1,64}$")
FILE_NAME = "dashboard.json"
_SCRYPT = (1 << 14, 8, 1)


class AccountError(ValueError):
    """A refused account change; the message is one line for the user."""


def hash_password(password: str, *, salt: bytes | None = None) -> str:
    n, r, p = _SCRYPT
    salt = salt or secrets.token_bytes(16)
    digest = hashlib.scrypt(password.encode(), salt=salt, n=n, r=r, p=p, dklen=32)
    return f"scrypt${n}${r}${p}${salt.hex()}${digest.hex()}"


def check_password(password: str, stored: str) -> bool:
    try:
        kind, n, r, p, salt, digest = stored.split("$")
        if kind != "scrypt":
            return False
        got = hashlib.scrypt(password.encode(), salt=bytes.fromhex(salt), n=int(n),
                             r=int(r), p=int(p), dklen=len(bytes.fromhex(digest)))
    except (ValueError, TypeError):
        return False
    return hmac.compare_digest(got.hex(), digest)


def check_new_password(password: object) -> str:
    if not isinstance(password, str) or len(password) < MIN_PASSWORD:
        raise AccountError(f"the password needs at least {MIN_PASSWORD} characters")
    return password


@dataclass(slots=True)
class Account:
    username: str
    role: Role
    password_hash: str


class Accounts:
    """The dashboard's users, in one small JSON file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._accounts: dict[str, Account] = {}
        self._stamp: int | None = None
        self._load()

    @classmethod
    def in_dir(cls, data_dir: Path) -> Accounts:
        return cls(Path(data_dir) / FILE_NAME)

    def _load(self) -> None:
        """(Re)read the file when it changed since the last read (another worker of the
        node, or an edit, wrote it); a missing file is no accounts."""
        try:
            stamp = self.path.stat().st_mtime_ns
        except FileNotFoundError:
            self._accounts, self._stamp = {}, None
            return
        if stamp == self._stamp:
            return
        raw = json.loads(self.path.read_text())
        self._accounts, self._stamp = {}, stamp
        for name, entry in raw.get("users", {}).items():
            role = entry.get("role")
            if role in ROLES:
                self._accounts[name] = Account(name, role, str(entry.get("hash", "")))

    def _save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        body = {"users": {a.username: {"role": a.role, "hash": a.password_hash}
                          for a in self._accounts.values()}}
        tmp = self.path.with_name(self.path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(body, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        self._stamp = self.path.stat().st_mtime_ns

    def has_administrator(self) -> bool:
        self._load()
        return any(a.role == "administrator" for a in self._accounts.values())

    def get(self, username: str) -> Account | None:
        self._load()
        return self._accounts.get(username)

    def list(self) -> list[dict[str, str]]:
        self._load()
        return [{"username": a.username, "role": a.role}
                for a in sorted(self._accounts.values(), key=lambda a: a.username)]

    def add(self, username: object, password_hash: str, role: object) -> Account:
        """Add (or replace) an account; the hash comes from :func:`hash_password`."""
        self._load()
        if not isinstance(username, str) or not USERNAME.match(username):
            raise AccountError("the user name: 1-64 letters, digits, '_', '.', '@' or '-'")
        if role not in ROLES:
            raise AccountError(f"the role must be one of {', '.join(ROLES)}")
        account = Account(username, role, password_hash)
        self._accounts[username] = account
        self._save()
        return account

    def delete(self, username: str) -> bool:
        self._load()
        account = self._accounts.get(username)
        if account is None:
            return False
        others = [a for a in self._accounts.values()
                  if a.role == "administrator" and a.username != username]
        if account.role == "administrator" and not others:
            raise AccountError("the last administrator cannot be deleted")
        del self._accounts[username]
        self._save()
        return True


class SetupToken:
    """The one-time token that lets the first administrator be made."""

    def __init__(self, now: Callable[[], float], ttl: float) -> None:
        self._now = now
        self.ttl = ttl
        self._digest: bytes | None = None
        self._expires = 0.0

    def issue(self) -> str:
        token = secrets.token_urlsafe(32)
        self._digest = hashlib.sha256(token.encode()).digest()
        self._expires = self._now() + self.ttl
        return token

    @property
    def pending(self) -> bool:
        return self._digest is not None and self._now() < self._expires

    def consume(self, token: object) -> bool:
        """True (once) for the current, unexpired token; it is then spent."""
        if not isinstance(token, str) or self._digest is None or self._now() >= self._expires:
            return False
        if not hmac.compare_digest(hashlib.sha256(token.encode()).digest(), self._digest):
            return False
        self._digest = None
        return True


@dataclass(slots=True)
class Session:
    id: str
    username: str
    role: Role
    csrf: str
    created: float
    last_seen: float


@dataclass(slots=True)
class Sessions:
    now: Callable[[], float]
    idle: float
    max_age: float
    _sessions: dict[str, Session] = field(default_factory=dict)

    def create(self, username: str, role: Role) -> Session:
        t = self.now()
        session = Session(secrets.token_urlsafe(32), username, role,
                          secrets.token_urlsafe(32), t, t)
        self._sessions[session.id] = session
        self._sweep(t)
        return session

    def get(self, session_id: str | None) -> Session | None:
        """The live session (its idle time restarts), or None."""
        if not session_id:
            return None
        session = self._sessions.get(session_id)
        if session is None:
            return None
        t = self.now()
        if t - session.last_seen >= self.idle or t - session.created >= self.max_age:
            del self._sessions[session_id]
            return None
        session.last_seen = t
        return session

    def end(self, session_id: str | None) -> None:
        if session_id:
            self._sessions.pop(session_id, None)

    def end_user(self, username: str) -> None:
        for sid in [s.id for s in self._sessions.values() if s.username == username]:
            del self._sessions[sid]

    def _sweep(self, t: float) -> None:
        for sid in [s.id for s in self._sessions.values()
                    if t - s.last_seen >= self.idle or t - s.created >= self.max_age]:
            del self._sessions[sid]

    def __len__(self) -> int:
        return len(self._sessions)


@dataclass(slots=True)
class LoginLimiter:
    now: Callable[[], float]
    attempts: int
    window: float
    _failures: dict[str, deque[float]] = field(default_factory=dict)

    def retry_after(self, *keys: str) -> float:
        """Seconds until a login for ``keys`` is allowed again (0: allowed now)."""
        t = self.now()
        wait = 0.0
        for key in keys:
            seen = self._failures.get(key)
            if seen is None:
                continue
            while seen and t - seen[0] >= self.window:
                seen.popleft()
            if not seen:
                del self._failures[key]
            elif len(seen) >= self.attempts:
                wait = max(wait, self.window - (t - seen[0]))
        return wait

    def failed(self, *keys: str) -> None:
        t = self.now()
        for key in keys:
            self._failures.setdefault(key, deque()).append(t)

    def succeeded(self, *keys: str) -> None:
        for key in keys:
            self._failures.pop(key, None)
