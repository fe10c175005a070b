"""The per-client auto-subscribe topics held in memory (gateway.ext.client_topics): no SQL
per CONNECT, a write through the API seen by the next CONNECT, a write by another
connection (another worker, the cluster's table replication) seen within ``max_age``.
A real SQLite file; time is a counter the test moves."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.core.clock import VirtualScheduler
from gateway.core.node import CoreSettings, Node
from gateway.ext.auto_subscribe import AutoSubscribe, TopicTemplate
from gateway.ext.client_topics import MAX_AGE, ClientTopics
from gateway.store.db import db_path
from gateway.store.extensions import AutoSubscribeEntry, AutoSubscribeStore
from tests.gateway.core.test_node import connect
from tests.harness.clock import Clock

AFTER = MAX_AGE * 1.001  # (time is a float: 100.1 - 100.0 < 0.1)



@pytest.fixture
def path(tmp_path: Path) -> Path:
    return db_path(tmp_path)


@pytest.fixture
def store(path: Path) -> Iterator[AutoSubscribeStore]:
    s = AutoSubscribeStore.open(path)
    yield s
    s.close()


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def cache(store: AutoSubscribeStore, clock: Clock) -> ClientTopics:
    return ClientTopics(store, monotonic=clock)


def other_connection(path: Path, sql: str, *params: object) -> None:
    """A write by another connection to the file (another process does the same)."""
    conn = sqlite3.connect(path)
    try:
        with conn:
            conn.execute(sql, params)
    finally:
        conn.close()


def statements(store: AutoSubscribeStore) -> list[str]:
    seen: list[str] = []
    store.conn.set_trace_callback(seen.append)
    return seen


def test_connects_run_no_sql_while_nothing_changed(
        cache: ClientTopics, store: AutoSubscribeStore, clock: Clock) -> None:
    cache.put(AutoSubscribeEntry("d1", "cmd/d1", 1))
    assert cache.for_client("d1") == (TopicTemplate("cmd/d1", 1),)
    seen = statements(store)
    for i in range(100):
        assert cache.for_client(f"other{i}") == ()
        assert cache.for_client("d1") == (TopicTemplate("cmd/d1", 1),)
    assert seen == []
    clock.t += AFTER  # then one PRAGMA per max_age, no reload when nothing changed
    cache.for_client("d1")
    cache.for_client("d2")
    assert seen == ["PRAGMA data_version"]
    assert cache.loads == 1  # the first CONNECT (after the put)


def test_a_write_through_the_api_is_seen_by_the_next_connect(
        cache: ClientTopics, clock: Clock) -> None:
    assert cache.for_client("d1") == ()
    cache.put(AutoSubscribeEntry("d1", "b/${clientid}", 2, rh=1, rap=1, nl=1))
    cache.put(AutoSubscribeEntry("d1", "a/x"))
    assert cache.for_client("d1") == (
        TopicTemplate("a/x"), TopicTemplate("b/${clientid}", 2, 1, 1, 1))  # topic order
    assert cache.delete("d1", "a/x") == 1
    assert cache.for_client("d1") == (TopicTemplate("b/${clientid}", 2, 1, 1, 1),)
    assert cache.delete("d1") == 1
    assert cache.for_client("d1") == ()
    assert cache.delete("d1") == 0


def test_a_write_by_another_connection_is_seen_within_max_age(
        cache: ClientTopics, path: Path, clock: Clock) -> None:
    assert cache.for_client("d1") == ()
    other_connection(path, "INSERT INTO auto_subscribe(clientid, topic, qos) VALUES (?,?,?)",
                     "d1", "ota/d1", 1)
    clock.t += MAX_AGE / 2
    assert cache.for_client("d1") == ()  # the stated staleness: not yet looked
    clock.t += AFTER / 2
    assert cache.for_client("d1") == (TopicTemplate("ota/d1", 1),)
    other_connection(path, "DELETE FROM auto_subscribe WHERE clientid = ?", "d1")
    clock.t += AFTER
    assert cache.for_client("d1") == ()
    clock.t -= 3600  # the monotonic clock never goes back; if it did: look again
    other_connection(path, "INSERT INTO auto_subscribe(clientid, topic) VALUES (?,?)",
                     "d2", "x")
    assert cache.for_client("d2") == (TopicTemplate("x"),)


def test_a_slow_reload_stretches_the_interval(store: AutoSubscribeStore, path: Path) -> None:
    times = iter([0.0, 10.0, 10.5])  # the check at 0, a reload from 10 to 10.5 s

    def slow() -> float:
        return next(times)

    cache = ClientTopics(store, monotonic=slow)
    assert cache.for_client("d1") == ()
    assert cache._interval == 50 * 0.5  # at most 2 % of the time reading the table


def test_a_failed_read_keeps_the_copy_and_is_retried(
        cache: ClientTopics, store: AutoSubscribeStore, path: Path, clock: Clock,
        caplog: pytest.LogCaptureFixture) -> None:
    cache.put(AutoSubscribeEntry("d1", "cmd/d1"))
    assert cache.for_client("d1") == (TopicTemplate("cmd/d1"),)
    other_connection(path, "INSERT INTO auto_subscribe(clientid, topic) VALUES (?,?)",
                     "d1", "new")
    broken = sqlite3.connect(":memory:")  # a read that fails: no such table
    real, store.conn = store.conn, broken
    try:
        clock.t += AFTER
        assert cache.for_client("d1") == (TopicTemplate("cmd/d1"),)
        assert cache.for_client("d1") == (TopicTemplate("cmd/d1"),)  # not again at once
        assert caplog.text.count("cannot read the per-client auto-subscribe topics") == 1
    finally:
        store.conn = real
        broken.close()
    clock.t += AFTER
    assert cache.for_client("d1") == (TopicTemplate("cmd/d1"), TopicTemplate("new"))


def test_auto_subscribe_on_the_node_sees_the_change(store: AutoSubscribeStore, path: Path,
                                                      clock: Clock) -> None:
    node = Node(CoreSettings(), VirtualScheduler())
    cache = ClientTopics(store, monotonic=clock)
    AutoSubscribe(node, [TopicTemplate("all/${clientid}")], cache.for_client).attach()
    connect(node, "d1")
    assert set(node.sessions["d1"].subscriptions) == {"all/d1"}
    cache.put(AutoSubscribeEntry("d1", "own/${clientid}", 1))
    connect(node, "d1")  # the next CONNECT, no time passed
    assert set(node.sessions["d1"].subscriptions) == {"all/d1", "own/d1"}
    other_connection(path, "DELETE FROM auto_subscribe")
    clock.t += AFTER
    connect(node, "d1")
    assert set(node.sessions["d1"].subscriptions) == {"all/d1"}
