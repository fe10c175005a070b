"""BannedStore: the banned table, normalisation, expiry, and change detection across
connections (gatewayctl writing while gatewayd reads)."""

from __future__ import annotations

import pytest

from gateway.store.banned import BanError, BannedStore
from gateway.store.db import db_path, open_db
from tests.harness.clock import Clock


@pytest.fixture
def clock() -> Clock:
    return Clock(1_700_000_000.0)


@pytest.fixture
def path(tmp_path):
    return db_path(tmp_path / "data")


def test_add_list_delete(path, clock):
    store = BannedStore.open(path, now=clock)
    store.add("clientid", "c1", reason="spam", created_by="test")
    store.add("username", "bob", duration=60)
    store.add("peerhost", "10.0.0.1")
    store.add("cidr", "192.168.7.9/16")
    bans = store.active()
    assert [(b.kind, b.value) for b in bans] == [
        ("cidr", "192.168.0.0/16"),
        ("clientid", "c1"),
        ("peerhost", "10.0.0.1"),
        ("username", "bob"),
    ]
    c1 = store.get("clientid", "c1")
    assert c1 is not None and c1.reason == "spam" and c1.created_by == "test"
    assert c1.expires_at is None and c1.created_at == clock.t
    assert store.get("username", "bob").expires_at == clock.t + 60  # type: ignore[union-attr]
    assert store.delete("clientid", "c1")
    assert not store.delete("clientid", "c1")
    assert store.get("clientid", "c1") is None


def test_adding_again_replaces(path, clock):
    store = BannedStore.open(path, now=clock)
    store.add("clientid", "c", reason="first", duration=10)
    store.add("clientid", "c", reason="second")
    (ban,) = store.all()
    assert ban.reason == "second" and ban.expires_at is None


def test_normalisation_and_errors(path, clock):
    store = BannedStore.open(path, now=clock)
    assert store.add("peerhost", " ::FFFF:0:1 ").value == "::ffff:0:1"
    assert store.add("cidr", "10.1.2.3/8").value == "10.0.0.0/8"
    assert store.add("cidr", "10.9.9.9").value == "10.9.9.9/32"
    for kind, value in [
        ("peerhost", "nope"),
        ("cidr", "10.0.0.0/33"),
        ("clientid", ""),
        ("address", "x"),
    ]:
        with pytest.raises(BanError):
            store.add(kind, value)
    with pytest.raises(BanError):
        store.add("clientid", "c", duration=0)


def test_expiry_and_purge(path, clock):
    store = BannedStore.open(path, now=clock)
    store.add("clientid", "short", duration=5)
    store.add("clientid", "forever")
    clock.t += 5
    assert [b.value for b in store.active()] == ["forever"]
    assert len(store.all()) == 2
    assert store.purge_expired() == 1
    assert [b.value for b in store.all()] == ["forever"]


def test_changed_sees_other_connections_but_not_other_tables(path, clock):
    reader = BannedStore.open(path, now=clock)
    writer = BannedStore.open(path, now=clock)
    assert not reader.changed()
    writer.add("clientid", "x")
    assert reader.changed()
    assert not reader.changed()  # once
    # a write to another table of the same file is not a change of the bans
    other = open_db(path)
    other.execute("CREATE TABLE IF NOT EXISTS unrelated(x)")
    other.execute("INSERT INTO unrelated VALUES (1)")
    assert not reader.changed()
    writer.delete("clientid", "x")
    assert reader.changed()
    # the reader's own writes count too
    reader.add("username", "u")
    assert reader.changed()
    for c in (reader, writer):
        c.close()
    other.close()


def test_survives_reopen(path, clock):
    store = BannedStore.open(path, now=clock)
    store.add("cidr", "10.0.0.0/8", reason="lab")
    store.close()
    again = BannedStore.open(path, now=clock)
    assert [(b.kind, b.value, b.reason) for b in again.active()] == [("cidr", "10.0.0.0/8", "lab")]
