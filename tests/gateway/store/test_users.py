"""The built-in user database: credentials, rules, and a cache that sees other
connections' writes without a restart."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from gateway.security.scram import verify_password
from gateway.store.db import db_path, open_db
from gateway.store.users import UserError, UserStore
from tests.harness.clock import Clock

FAST = 4096  # the minimum iteration count keeps the tests quick



@pytest.fixture
def path(tmp_path: Path) -> Path:
    return db_path(tmp_path)


@pytest.fixture
def store(path: Path) -> UserStore:
    return UserStore.open(path)


def test_add_get_verify(store: UserStore) -> None:
    store.add("alice", "wonderland", iterations=FAST)
    user = store.get("alice")
    assert user is not None and not user.is_superuser
    assert user.credential.iterations == FAST and len(user.credential.salt) == 16
    assert verify_password(user.credential, b"wonderland")
    assert not verify_password(user.credential, b"Wonderland")
    assert store.get("bob") is None


def test_password_is_never_stored(store: UserStore, path: Path) -> None:
    store.add("alice", "wonderland-1234", iterations=FAST)
    raw = path.read_bytes() + (path.parent / (path.name + "-wal")).read_bytes()
    assert b"wonderland-1234" not in raw


def test_salts_differ_per_user(store: UserStore) -> None:
    store.add("a", "same", iterations=FAST)
    store.add("b", "same", iterations=FAST)
    a, b = store.get("a"), store.get("b")
    assert a and b and a.credential.salt != b.credential.salt
    assert a.credential.stored_key != b.credential.stored_key


def test_refusals(store: UserStore) -> None:
    store.add("alice", "x", iterations=FAST)
    with pytest.raises(UserError, match="already exists"):
        store.add("alice", "y", iterations=FAST)
    with pytest.raises(UserError, match="at least 4096"):
        store.add("bob", "y", iterations=1000)
    with pytest.raises(UserError, match="empty"):
        store.add("", "y", iterations=FAST)
    with pytest.raises(UserError, match="password is empty"):
        store.add("bob", "", iterations=FAST)
    with pytest.raises(UserError, match="no user"):
        store.set_password("nobody", "x")
    with pytest.raises(UserError):
        store.add_rule("alice", "allow", "publish", "a/#/b")
    with pytest.raises(UserError):
        store.add_rule("alice", "maybe", "publish", "a")


def test_passwd_superuser_delete(store: UserStore) -> None:
    store.add("alice", "old", iterations=FAST)
    store.set_password("alice", "new")
    user = store.get("alice")
    assert user and verify_password(user.credential, "new")
    assert user.credential.iterations == FAST  # kept unless asked otherwise
    store.set_superuser("alice", True)
    assert store.get("alice").is_superuser  # type: ignore[union-attr]
    store.add_rule("alice", "deny", "all", "#")
    assert store.delete("alice")
    assert store.get("alice") is None and store.rules("alice") == []
    assert not store.delete("alice")


def test_other_connection_changes_are_seen_at_once(path: Path) -> None:
    gatewayd = UserStore.open(path)
    ctl = UserStore.open(path)
    assert gatewayd.get("alice") is None  # cached as absent...
    ctl.add("alice", "pw", iterations=FAST)
    assert gatewayd.get("alice") is not None  # ...but data_version moved
    ctl.set_password("alice", "pw2")
    user = gatewayd.get("alice")
    assert user and verify_password(user.credential, "pw2")
    ctl.delete("alice")
    assert gatewayd.get("alice") is None


def test_rules_in_order_and_authorizer(store: UserStore) -> None:
    assert store.authorizer_for("alice") is None  # nobody has rules
    r1 = store.add_rule("alice", "deny", "publish", "a/secret")
    store.add_rule("alice", "allow", "all", "a/#")
    store.add_rule("alice", "allow", "subscribe", "u/${username}/#")
    assert next(r.id for r in store.rules("alice")) == r1.id
    authz = store.authorizer_for("alice")
    assert authz is not None
    kw = {"clientid": "c", "username": "alice", "peer_ip": None}
    assert authz.decide("publish", "a/secret", **kw) is False  # first match wins
    assert authz.decide("publish", "a/other", **kw) is True
    assert authz.decide("subscribe", "u/alice/x", **kw) is True
    assert authz.decide("publish", "b", **kw) is None  # no rule: the rules file decides
    assert store.authorizer_for("bob") is None
    assert store.delete_rule("alice", r1.id)
    assert store.authorizer_for("alice").decide("publish", "a/secret", **kw) is True  # type: ignore[union-attr]
    assert store.rule_counts() == {"alice": 2}


def test_authorizer_rechecks_other_writers_at_most_every_interval(path: Path) -> None:
    clock = Clock()
    gatewayd = UserStore.open(path, monotonic=clock, recheck_interval=1.0)
    ctl = UserStore.open(path)
    assert gatewayd.authorizer_for("alice") is None
    ctl.add_rule("alice", "deny", "all", "#")
    assert gatewayd.authorizer_for("alice") is None  # still within the interval
    clock.t += 1.0
    assert gatewayd.authorizer_for("alice") is not None


def test_schema_coexists_with_other_tables(path: Path) -> None:
    conn = open_db(path)
    conn.execute("CREATE TABLE IF NOT EXISTS other(x)")
    store = UserStore(conn)
    store.add("a", "b", iterations=FAST)
    assert isinstance(conn, sqlite3.Connection)
    assert UserStore.open(path).get("a") is not None
